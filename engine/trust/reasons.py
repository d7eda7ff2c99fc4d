"""Reason codes: short plain-language facts about why a transaction was flagged.

Rules (each is tested against numbers recomputed from the data):

1. **What may be cited.** The earlier context transactions are ranked by one attribution method
   (default: the first available of SHAP, occlusion, Integrated Gradients). An earlier
   transaction is *citable* only when its attribution is **positive beyond its error**: value
   ``> z * standard error`` (``z = 2``) when the method reports standard errors (SHAP), value
   ``> 0`` otherwise. At most ``top_k`` are citable, highest value first.
2. **Every count and ratio is computed over the data window it describes, never over the cited
   set.** A history reason describes the span from the earliest cited transaction that shows its
   pattern up to the query: "9 transactions in 38 minutes" counts *every* transaction of the
   entity in those 38 minutes; "3 of the 9 transactions in the 38 minutes before this one were at
   merchants the card had not used before" counts new merchants among all 9 ("new" = no earlier
   transaction of the history has the value). The reason cites only the citable transactions.
   Facts that matter only: that reason (``new_values``, one for all columns) needs at least half
   of the span's transactions at new values (:data:`NOVELTY_MIN_SHARE`) and a higher share than
   over the transactions before the span that have at least :data:`NOVELTY_MIN_BEFORE` earlier rows
   in the history shown; with fewer than :data:`NOVELTY_MIN_COMPARED` of those (a short history:
   its first transactions are at new values by construction) there is no comparison and no
   reason. An amount ratio needs a median over at least :data:`MEDIAN_MIN_PURCHASES` earlier
   purchases (one purchase is no habit).
3. **The query's own fields are reasons too** (facts about the flagged transaction alone):
   its amount against the entity's median purchase, its authorisation errors, the merchant / MCC /
   city / state values the entity never used (one reason, ``query_new_values``: they share the
   ``first_seen`` field, whose attribution is counted once; a value whose own field pushed towards
   legitimate is not named), an online purchase on a card that rarely buys online, a night-time
   purchase, and the delayed label history of its terminal (Handbook aggregates).
4. **Ranked by signed contribution towards fraud.** A history reason weighs the sum of the
   attributions of the transactions it cites (logit, all positive by rule 1). A query reason
   weighs the field attribution of the query on the fields it rests on, from the explanation
   with per-field values of the query (``field_values[-1]``; field-level Shapley values when
   present, else Integrated Gradients); one whose field pushed towards legitimate (weight <= 0)
   is dropped. Without per-field values a query reason has no measured weight (``weight`` NaN,
   ``numbers['weight_known'] = 0``) and is listed after the weighed reasons.
5. **Named patterns** (:mod:`engine.trust.patterns`): a small test charge at a new merchant before
   a large card-not-present / new-merchant query (``test_then_purchase``, weighed by the measured
   deletion effect of the charges plus the query's field attribution; it replaces the query and
   small-charge reasons it restates), and a common point of compromise from other entities'
   labels (``common_point``, with ``links``; weighed by the log rate ratio). They cite the
   transactions of the pattern even when rule 1 would not: their evidence is the deletion effect
   or the other entities, not the ranking method's value.

Each :class:`Reason` lists the transaction ids it cites and a ``numbers`` dict with every number
of its text unrounded. Amounts are in the spec's currency.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np
import pandas as pd

from engine.explain.base import Explanation

RANKING_METHODS = ("shap", "occlusion", "integrated_gradients")
#: methods whose per-field values of the query can weigh query reasons, in order of preference
FIELD_METHODS = ("field_shapley", "integrated_gradients")
NIGHT_HOURS = (0, 6)  # [start, end) hours counted as night
#: an amount this many times the median earlier purchase (or more) is a reason
AMOUNT_RATIO = 2.0
#: a "small charge" is a positive amount at most this share of the median earlier purchase
SMALL_CHARGE_RATIO = 0.1
#: an amount ratio (amount reasons, small charges, the test-then-purchase pattern) needs a median over
#: at least this many earlier purchases: "4.3x the card's earlier median (8.37 USD over 1 purchase)"
#: compares with one transaction, not with a habit (a setting, not a fitted value)
MEDIAN_MIN_PURCHASES = 5
#: citable when value > Z_CITE * standard error
Z_CITE = 2.0


@dataclass
class Reason:
    """One reason code.

    Attributes:
        kind: ``"burst"``, ``"small_charges"``, ``"new_values"``, ``"query_amount"``, ... (module doc).
        text: the plain-language sentence.
        transaction_ids: the transactions it cites (citable earlier ones and/or the query).
        fields: the model fields it rests on.
        numbers: every number in ``text``, unrounded (counts, minutes, ratios, amounts, shares).
        weight: signed contribution towards fraud in logits (module doc rule 4); NaN = not measured.
        about: ``"history"`` (earlier transactions), ``"query"`` (the flagged transaction itself) or
            ``"pattern"`` (a named fraud pattern over both, :mod:`engine.trust.patterns`).
    """

    kind: str
    text: str
    transaction_ids: list[str]
    fields: list[str]
    numbers: dict[str, Any] = field(default_factory=dict)
    weight: float = 0.0
    about: str = "history"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["weight"] = None if not math.isfinite(self.weight) else self.weight
        return d


def _listing(parts: list[str]) -> str:
    """``"a"``, ``"a and b"``, ``"a, b and c"``."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _plural(n: int, one: str, many: str | None = None) -> str:
    return one if n == 1 else (many or one + "s")


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _fmt_num(x: float) -> str:
    return f"{x:,.0f}" if abs(x - round(x)) < 1e-9 else f"{x:,.2f}"


def _entity_noun(spec) -> str:
    cols = [str(c).lower() for c in (getattr(getattr(spec, "entity", None), "columns", []) or [])]
    words = {w for c in cols for w in re.split(r"[^a-z]+", c) if w}
    if any("card" in c for c in cols) or words & {"cc", "pan", "ccnum"} or any(c.startswith(("cc_", "ccnum")) for c in cols):
        return "card"  # TabFormer's User + Card, Sparkov's cc_num
    return "customer" if any(k in c for c in cols for k in ("customer", "cust", "client")) else "account"


def span_text(minutes: float) -> str:
    """``"38 minutes"``, ``"5.2 hours"``, ``"3.1 days"``."""
    if minutes < 120:
        return f"{minutes:.0f} {_plural(round(minutes), 'minute')}"
    if minutes < 48 * 60:
        return f"{minutes / 60:.1f} hours"
    return f"{minutes / 1440:.1f} days"


def _is_online(rows: pd.DataFrame) -> np.ndarray:
    if "use_chip" in rows:
        return rows["use_chip"].astype(str).str.contains("online", case=False).to_numpy()
    if "merchant_city" in rows:
        return (rows["merchant_city"].astype(str).str.upper() == "ONLINE").to_numpy()
    return np.zeros(len(rows), dtype=bool)


#: the ``new_values`` history reason needs at least this share of the span's transactions at a value
#: new to the entity, and a higher share than over the transactions before the span that have at least
#: ``NOVELTY_MIN_BEFORE`` earlier rows; with fewer than ``NOVELTY_MIN_COMPARED`` of those there is no
#: comparison and no reason (the first transactions of any history are at new values) (settings, not
#: fitted values)
NOVELTY_MIN_SHARE = 0.5
NOVELTY_MIN_BEFORE = 10
NOVELTY_MIN_COMPARED = 5


def first_seen(values: np.ndarray, missing: str) -> np.ndarray:
    """``[T]`` bool: the value appears in no earlier row (and is not the missing marker); row 0,
    having no history, is never "new"."""
    seen: set = set()
    out = np.zeros(len(values), dtype=bool)
    for i, v in enumerate(values):
        out[i] = i > 0 and v not in seen and v != missing
        seen.add(v)
    return out


def citable_positions(e: Explanation, top_k: int, z: float = Z_CITE) -> np.ndarray:
    """Earlier positions (query excluded) whose value is positive beyond its error (module doc
    rule 1), at most ``top_k``, highest value first. ``[k]`` int64."""
    v = np.asarray(e.values, dtype=np.float64)
    q = len(v) - 1
    se = getattr(e, "standard_errors", None)
    if se is None:
        se = e.extras.get("standard_errors")
    se = np.zeros_like(v) if se is None else np.nan_to_num(np.asarray(se, dtype=np.float64), nan=np.inf)
    earlier = np.arange(q)
    ok = earlier[v[:q] > z * se[:q]]
    return ok[np.lexsort((-ok, -v[ok]))][:top_k].astype(np.int64)


class _Facts:
    """Shared state of one reason computation: rows, times, cited set, weights, output list."""

    def __init__(self, ctx, e: Explanation, fe: Explanation | None, cited: np.ndarray):
        self.rows = ctx.rows.reset_index(drop=True)
        self.T = ctx.T
        self.q = self.T - 1
        self.ts = pd.to_datetime(self.rows["timestamp"])
        self.ids = [str(t) for t in self.rows["transaction_id"]]
        self.v = np.asarray(e.values, dtype=np.float64)
        self.cited = cited
        spec = ctx.bundle.spec
        self.noun = _entity_noun(spec)
        # the entity's transactions before the context: "new" in the context means new among the rows shown
        self.older = int(getattr(ctx, "n_before_context", 0) or 0)
        cur = (getattr(getattr(spec, "amount", None), "currency", "") or "").strip()
        self.cur = f" {cur}" if cur else ""
        self.missing = {f.name: f.missing for f in getattr(spec, "fields", [])}
        self.spec = spec
        self.fnames = list(fe.field_names or []) if fe is not None else []
        self.fq = np.asarray(fe.field_values[-1], dtype=np.float64) if fe is not None else None
        self.out: list[Reason] = []

    def money(self, x: float) -> str:
        return f"{x:,.2f}{self.cur}"

    def minutes_before_query(self, p: int) -> float:
        return float((self.ts.iloc[self.q] - self.ts.iloc[p]).total_seconds() / 60.0)

    def window(self, start: int) -> np.ndarray:
        """Earlier positions (query excluded) at or after the time of position ``start``."""
        t0 = self.ts.iloc[start]
        return np.flatnonzero((self.ts >= t0).to_numpy()[: self.q])

    def history(self, kind, text, pos, fields, numbers) -> None:
        pos = np.asarray(sorted({int(p) for p in pos}), dtype=np.int64)
        self.out.append(Reason(kind, text, [self.ids[p] for p in pos], list(fields), dict(numbers),
                               float(self.v[pos].sum()), "history"))

    def query(self, kind, text, fields, numbers) -> None:
        idx = [self.fnames.index(f) for f in fields if f in self.fnames]
        if self.fq is None or not idx:
            w, known = float("nan"), 0
        else:
            w, known = float(self.fq[idx].sum()), 1
            if w <= 0:  # this field of the query pushed towards legitimate: not a reason for the flag
                return
        self.out.append(Reason(kind, text, [self.ids[self.q]], list(fields),
                               {**numbers, "weight_known": known}, w, "query"))

    def pattern(self, kind, text, pos, fields, numbers, weight: float) -> None:
        """A pattern reason (:mod:`engine.trust.patterns`): cites ``pos`` (the query may be one),
        weighed by the pattern's own measured contribution ``weight``."""
        pos = sorted({int(p) for p in pos})
        self.out.append(Reason(kind, text, [self.ids[p] for p in pos], list(dict.fromkeys(fields)), dict(numbers),
                               float(weight), "pattern"))


def reason_codes(
    ctx,
    explanations: Mapping[str, Explanation],
    *,
    method: str | None = None,
    top_k: int = 6,
    max_reasons: int = 4,
    burst_hours: float = 24.0,
    z: float = Z_CITE,
    links: list[dict[str, Any]] | None = None,
) -> list[Reason]:
    """Reason codes for the query of ``ctx`` (rules in the module docstring).

    Args:
        ctx: the query context (:class:`engine.explain.context.QueryContext`; uses ``ctx.rows``,
            ``ctx.T``, ``ctx.bundle.spec``).
        explanations: ``{method: Explanation}`` of this context.
        method: the method ranking the earlier transactions (default: first of
            :data:`RANKING_METHODS` present).
        top_k: citable earlier transactions at most. max_reasons: reasons returned at most.
        burst_hours: how far before the query the ``burst`` reason looks.
        z: citable when value > ``z`` standard errors (methods with standard errors).
        links: visit facts of the query's entity (:func:`engine.trust.common_point.visit_facts`,
            plain dicts from other entities' labels) for the ``common_point`` reason; ``None``:
            no link data.
    Returns:
        list of :class:`Reason`, weighed ones by descending weight, then unweighed query facts.
    Raises:
        ValueError: no usable method in ``explanations``, or explanations of another context.
    """
    if method is None:
        method = next((m for m in RANKING_METHODS if m in explanations), None)
    if method is None or method not in explanations:
        raise ValueError(f"method: expected one of {list(explanations)} with attributions "
                         f"(default order {RANKING_METHODS}), got {method!r}")
    e = explanations[method]
    if list(e.transaction_ids) != list(ctx.transaction_ids):
        raise ValueError(f"explanations[{method!r}]: explains another context")
    fe = next((explanations[m] for m in FIELD_METHODS if m in explanations
               and explanations[m].field_values is not None
               and list(explanations[m].transaction_ids) == list(ctx.transaction_ids)), None)
    f = _Facts(ctx, e, fe, citable_positions(e, top_k, z))
    if f.q >= 1:
        _history_reasons(f, burst_hours)
    _query_reasons(f)
    from engine.trust.patterns import common_point, test_then_purchase

    test_then_purchase(f, ctx)
    common_point(f, links)
    weighed = sorted([r for r in f.out if math.isfinite(r.weight) and r.weight > 0], key=lambda r: -r.weight)
    unweighed = [r for r in f.out if not math.isfinite(r.weight)]
    return (weighed + unweighed)[:max_reasons]


def _history_reasons(f: _Facts, burst_hours: float) -> None:
    """Patterns in the earlier transactions, cited from the citable set (module doc rule 2)."""
    rows, S = f.rows, f.cited
    if not len(S):
        return
    other = f"the {f.noun}"
    # burst: every transaction from the earliest citable one within burst_hours up to the query
    near = S[np.array([f.minutes_before_query(p) <= burst_hours * 60 for p in S])]
    if len(near):
        start = int(near.min())
        n_all = len(f.window(start)) + 1  # + the query
        if n_all >= 3:
            span = f.minutes_before_query(start)
            f.history("burst", f"{n_all} transactions in {span_text(span)} up to this one", near,
                      ["time_since_prev", "recent_activity"], {"n_transactions": n_all, "span_minutes": span,
                                                               "n_cited": int(len(near))})
    amt = rows["amount"].to_numpy(np.float64)
    # small test charges at new merchants
    if "merchant" in rows:
        new_m = first_seen(rows["merchant"].astype(str).to_numpy(), f.missing.get("merchant", "<empty>"))
        small = []
        for p in S:
            before = amt[:p][amt[:p] > 0]
            if len(before) >= MEDIAN_MIN_PURCHASES and 0 < amt[p] <= SMALL_CHARGE_RATIO * float(np.median(before)) \
                    and new_m[p]:
                small.append(int(p))
        if small:
            first = min(small)
            med = float(np.median(amt[:first][amt[:first] > 0]))
            span = f.minutes_before_query(first)
            amounts = ", ".join(f.money(amt[p]) for p in sorted(small))
            f.history("small_charges", f"{len(small)} small {_plural(len(small), 'charge')} ({amounts}) at "
                                       f"{_plural(len(small), 'a merchant', 'merchants')} new to {other}, "
                                       f"{span_text(span)} before this transaction", small,
                      ["amount", "merchant", "first_seen"],
                      {"n_small": len(small), "span_minutes": span, "median_before": med,
                       "max_share_of_median": SMALL_CHARGE_RATIO})
    # new categorical values among the transactions of the span: one reason for all columns (a
    # transaction at a new merchant is usually also at a new MCC / city: one reason per column would
    # cite it, and count its attribution, once per column)
    labels = {"merchant": "merchants", "terminal": "terminals", "mcc": "merchant categories",
              "merchant_city": "cities", "merchant_state": "states"}
    online = _is_online(rows)
    news, hits = {}, set()
    for col in labels:
        if col not in rows:
            continue
        new = first_seen(rows[col].astype(str).to_numpy(), f.missing.get(col, "<empty>"))
        if col in ("merchant_city", "merchant_state"):
            new &= ~online
        h = [int(p) for p in S if new[p]]
        if h:
            news[col] = new
            hits.update(h)
    if hits:
        win = f.window(min(hits))
        n = len(win)
        span = f.minutes_before_query(min(hits))
        any_new = np.zeros(len(rows), dtype=bool)
        parts, numbers = [], {"n_window": n, "span_minutes": span}
        for col, new in news.items():
            k = int(new[win].sum())
            any_new |= new
            numbers[f"n_new_{col}"] = k
            verb = ("was " if k == 1 else "were ") if not parts else ""  # "5 were at merchants and 2 at ..."
            part = f"{k} {verb}at {labels[col]}"
            if col in ("mcc", "merchant_state"):
                vals = sorted(set(rows[col].astype(str).to_numpy()[win][new[win]]))
                numbers[f"values_{col}"] = ", ".join(vals)
                part += f" ({', '.join(vals)})"
            parts.append(part)
        numbers["n_new"] = int(any_new[win].sum())
        # a fact that matters: most of the span's transactions at new values (NOVELTY_MIN_SHARE), and more
        # often than before the span (a card that keeps trying new merchants makes "k of n were new" no
        # reason; nor does "11 of the 56 transactions in 240 days"; nor a short history, whose first
        # transactions are all at new values)
        # positions with at least NOVELTY_MIN_BEFORE earlier rows in the history shown ("new" there means
        # "not in those rows": the first rows of a history cut at the context start all look new)
        earlier = np.arange(NOVELTY_MIN_BEFORE, int(win.min()))  # win holds min(hits): never empty
        share_before = float(any_new[earlier].mean()) if len(earlier) >= NOVELTY_MIN_COMPARED else None
        numbers["new_share_before"] = share_before
        share = numbers["n_new"] / n
        if share_before is not None and share >= NOVELTY_MIN_SHARE and share > share_before:
            text = (f"of the {n} {_plural(n, 'transaction')} in the {span_text(span)} before this one, {_listing(parts)} "
                    f"{other} had not used before" + (" in the history shown" if f.older else ""))
            text += (f" (against {_pct(share_before)} of its transactions {NOVELTY_MIN_BEFORE + 1}-"
                     f"{int(win.min())} of the history shown)")
            f.history("new_values", text, sorted(hits), [*news, "first_seen"], numbers)
    # authorisation errors in the span
    if "errors" in rows:
        err = rows["errors"].fillna("").astype(str).to_numpy()
        has = np.array([e.strip() not in ("", f.missing.get("errors", "<empty>")) for e in err])
        hits = [int(p) for p in S if has[p]]
        if hits:
            win = f.window(min(hits))
            k, n = int(has[win].sum()), len(win)
            kinds = sorted({x for p in win[has[win]] for x in err[p].split("|") if x})
            span = f.minutes_before_query(min(hits))
            f.history("errors", f"{k} of the {n} {_plural(n, 'transaction')} in the {span_text(span)} before this one "
                                f"had authorisation errors ({', '.join(kinds)})", hits, ["errors"],
                      {"n_errors": k, "n_window": n, "span_minutes": span, "errors": ", ".join(kinds)})
    # amounts of the span against the entity's earlier purchases
    pos_span = [int(p) for p in S if amt[p] > 0]
    if pos_span:
        start = min(pos_span)
        win = f.window(start)
        cs, bs = win[amt[win] > 0], np.flatnonzero(amt[:start] > 0)
        if len(cs) and len(bs) >= MEDIAN_MIN_PURCHASES:
            mc, mb = float(np.median(amt[cs])), float(np.median(amt[bs]))
            ratio = mc / mb if mb > 0 else float("inf")
            if ratio >= AMOUNT_RATIO:
                span = f.minutes_before_query(start)
                f.history("amount", f"the {len(cs)} {_plural(len(cs), 'purchase')} in the {span_text(span)} before "
                                    f"this one had a median of {f.money(mc)}, {ratio:.1f}x {other}'s earlier median "
                                    f"({f.money(mb)} over {len(bs)} {_plural(len(bs), 'purchase')})", pos_span,
                          ["amount", "amount_vs_history"], {"ratio": ratio, "median_window": mc, "median_before": mb,
                                                            "n_window": int(len(cs)), "n_before": int(len(bs)),
                                                            "span_minutes": span})


def _query_reasons(f: _Facts) -> None:
    """Facts about the flagged transaction's own fields (module doc rule 3)."""
    rows, q = f.rows, f.q
    amt = rows["amount"].to_numpy(np.float64)
    before = amt[:q][amt[:q] > 0]
    noun = f.noun
    if len(before) >= MEDIAN_MIN_PURCHASES and amt[q] > 0:
        med = float(np.median(before))
        ratio = amt[q] / med if med > 0 else float("inf")
        if ratio >= AMOUNT_RATIO:
            f.query("query_amount", f"this transaction's amount, {f.money(amt[q])}, is {ratio:.1f}x the {noun}'s median "
                                    f"purchase ({f.money(med)} over {len(before)} earlier "
                                    f"{_plural(len(before), 'purchase')})",
                    ["amount", "amount_vs_history", "recent_activity"],
                    {"ratio": ratio, "amount": float(amt[q]), "median_before": med, "n_before": int(len(before))})
    if "errors" in rows:
        err = str(rows["errors"].fillna("").iloc[q]).strip()
        if err and err != f.missing.get("errors", "<empty>"):
            kinds = sorted(x for x in err.split("|") if x)
            f.query("query_errors", f"this transaction had an authorisation error ({', '.join(kinds)})", ["errors"],
                    {"errors": ", ".join(kinds)})
    if q >= 1:
        online = _is_online(rows)
        new_values_reason(f, online=online)
        if online[q] and ("use_chip" in rows or "merchant_city" in rows):
            share = float(online[:q].mean())
            if share <= 0.25:
                f.query("query_online", f"an online purchase, where {_pct(share)} of the {noun}'s {q} earlier "
                                        f"{_plural(q, 'transaction')} were online", ["use_chip"],
                        {"online_share_before": share, "n_before": q})
        h = f.ts.dt.hour.to_numpy()
        night = (h >= NIGHT_HOURS[0]) & (h < NIGHT_HOURS[1])
        if night[q]:
            share = float(night[:q].mean())
            if share <= 0.1:
                f.query("query_night", f"at {f.ts.iloc[q]:%H:%M}, when {_pct(share)} of the {noun}'s {q} earlier "
                                       f"{_plural(q, 'transaction')} took place ({NIGHT_HOURS[0]:02d}:00-"
                                       f"{NIGHT_HOURS[1] - 1:02d}:59)", ["hour"],
                        {"night_share_before": share, "n_before": q})
    _terminal_reasons(f)


def new_values_reason(f: "_Facts", skip: frozenset = frozenset(), weigh_first_seen: bool = True,
                      online: np.ndarray | None = None) -> None:
    """Add the ``query_new_values`` reason: every merchant / MCC / city / state value of the query
    that no earlier transaction of the history has (columns in ``skip`` excepted: a pattern that
    already states them). One reason, as they share the ``first_seen`` field, whose attribution
    would otherwise be counted once per value; a value whose own field pushed towards legitimate
    is not named. ``weigh_first_seen=False``: the weight leaves ``first_seen`` out (a pattern
    reason already weighs it), so the reason stands only on its values' own fields. ``online``:
    :func:`_is_online` of the rows when the caller has it."""
    rows, q = f.rows, f.q
    if q < 1:
        return
    online = _is_online(rows) if online is None else online
    labels = {"merchant": "merchant", "terminal": "terminal", "mcc": "merchant category",
              "merchant_city": "city", "merchant_state": "state"}
    new, parts, shown = [], [], {}
    for col, label in labels.items():
        if col in skip or col not in rows or (col in ("merchant_city", "merchant_state") and online[q]):
            continue
        vals = rows[col].astype(str).to_numpy()
        if vals[q] != f.missing.get(col, "<empty>") and vals[q] not in set(vals[:q]):
            if f.fq is not None and col in f.fnames and f.fq[f.fnames.index(col)] < 0:
                continue  # this value's own field pushed towards legitimate: not cited
            show = f" {vals[q]}" if col in ("mcc", "merchant_state") else ""
            new.append(col)
            parts.append(f"{label}{show}")
            if show:
                shown[f"value_{col}"] = vals[q]
    if new:
        text = f"the {f.noun}'s first transaction at this {_listing(parts)} in {q} earlier {_plural(q, 'transaction')}"
        if f.older:  # the model's window starts later: the value may be in the older history
            text = (f"the {f.noun}'s first transaction at this {_listing(parts)} in its last {q} "
                    f"{_plural(q, 'transaction')} (the {f.older:,} older ones are not in the history shown)")
        f.query("query_new_values", text, [*new, *(["first_seen"] if weigh_first_seen else [])],
                {"n_before": q, "new_fields": ", ".join(new), "n_older": f.older, **shown})


def _terminal_reasons(f: _Facts) -> None:
    """The delayed label history of the query's terminal (spec aggregates, e.g. the Handbook's)."""
    rows, q = f.rows, f.q
    for agg in getattr(f.spec, "aggregates", []) or []:
        best = None
        for w in agg.windows_days:
            rc, cc = f"{agg.name}_fraud_rate_{w}d", f"{agg.name}_count_{w}d"
            if rc in rows and cc in rows:
                r, c = float(rows[rc].iloc[q]), float(rows[cc].iloc[q])
                if c > 0 and r > 0 and (best is None or r > best[0]):
                    best = (r, c, w)
        if best is not None:
            r, c, w = best
            f.query(agg.name, f"this transaction's {agg.key} had a fraud rate of {_pct(r)} ({_fmt_num(r * c)} of "
                              f"{_fmt_num(c)} {_plural(int(round(c)), 'transaction')}) in the "
                              f"{_plural(int(w), 'day', f'{w} days')} ending {agg.delay_days} days before it",
                    [agg.name], {"fraud_rate": r, "count": c, "n_fraud": r * c, "window_days": int(w),
                                 "delay_days": int(agg.delay_days)})
        lc, dc = f"{agg.name}_fraud_run_length", f"{agg.name}_fraud_run_days"
        if agg.fraud_run and lc in rows and dc in rows and float(rows[lc].iloc[q]) > 0:
            length, days = float(rows[lc].iloc[q]), float(rows[dc].iloc[q])
            what = (f"its last {_fmt_num(length)} known transactions were all frauds, a run that began "
                    f"{_fmt_num(days)} days before it" if length > 1 else
                    f"its last known transaction, {_fmt_num(days)} days before it, was a fraud")
            f.query(f"{agg.name}_run", f"this transaction's {agg.key}: {what} (labels known {agg.delay_days} days "
                                       "late)", [agg.name],
                    {"run_length": length, "run_days": days, "delay_days": int(agg.delay_days)})


def summary_text(reasons: list[Reason]) -> str:
    """The reasons joined into one sentence ("" if none)."""
    if not reasons:
        return ""
    s = "; ".join(r.text for r in reasons)
    return s[0].upper() + s[1:] + "."


__all__ = ["RANKING_METHODS", "Reason", "citable_positions", "first_seen", "reason_codes", "span_text",
           "summary_text"]
