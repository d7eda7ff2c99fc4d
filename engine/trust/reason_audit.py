"""Reason-code accuracy: every number of every reason recomputed from the data, independently.

:func:`engine.trust.reasons.reason_codes` states facts ("9 transactions in 38 minutes up to this
one", "3.1x the card's median purchase"). :func:`audit_reasons` recomputes each fact's numbers
from the query context's rows (and, for ``common_point``, from the whole frame's other entities)
with its own pandas code, not the reason module's helpers, and checks the rules the reasons
promise:

* **numbers**: each recomputed number equals the reason's ``numbers`` entry (counts exactly,
  floats to 1e-9 relative; numbers re-measured with the model, the test-then-purchase deletion
  effect and scores, to :data:`MODEL_TOL` = 1e-5: float32 forward passes of other batch shapes);
  counts are over the data window the reason describes (every transaction from the earliest
  cited one up to the query), never over the cited set; every weight recomputed;
* **text**: the stated numbers, formatted from the recomputed values, appear in the text;
* **conditions**: each reason's firing condition holds (ratio, share, count, p-value, top_k);
* **citations** (history reasons): every cited earlier transaction is positive beyond its error
  under the ranking method (value ``> z x`` standard error; ``> 0`` without standard errors);
* **ranking**: weighed reasons come first, by descending weight, every weight ``> 0``.

Kinds without a recomputation here (the terminal aggregates, copied from the row's own
columns) are counted as ``not recomputed``, never as passed. :func:`audit_markdown` is the
``bench explanations`` section. A reason whose number is altered fails (tested).
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

import numpy as np
import pandas as pd
import torch

from engine.trust.reasons import _entity_noun  # the entity's word (card / customer), not a fact audited

#: a float is equal when within this relative (and absolute) tolerance
REL_TOL = 1e-9
#: numbers the audit re-measures with the model (a forward pass in float32 of another batch shape than the
#: reason's: the same logit differs by ~1e-7 relative) are equal within this relative tolerance
MODEL_TOL = 1e-5

_NEW_COLS = ("merchant", "terminal", "mcc", "merchant_city", "merchant_state")


def _online(rows: pd.DataFrame) -> np.ndarray:
    if "use_chip" in rows:
        return rows["use_chip"].astype(str).str.lower().str.contains("online").to_numpy()
    if "merchant_city" in rows:
        return rows["merchant_city"].astype(str).str.upper().eq("ONLINE").to_numpy()
    return np.zeros(len(rows), dtype=bool)


def _new_flags(rows: pd.DataFrame, col: str, missing: str, online: np.ndarray) -> np.ndarray:
    """``[T]`` bool: the row's value occurs in no earlier row (row 0 never; the missing marker never;
    city / state of an online row never)."""
    vals = rows[col].astype(str)
    new = (~vals.duplicated(keep="first")).to_numpy() & (vals != missing).to_numpy()
    new[0] = False
    if col in ("merchant_city", "merchant_state"):
        new &= ~online
    return new


class _Checker:
    def __init__(self, kind: str):
        self.kind, self.rows = kind, []

    def num(self, name: str, expected: Any, got: Any, tol: float = REL_TOL) -> None:
        if isinstance(expected, str) or isinstance(got, str):
            ok = str(expected) == str(got)
        elif expected is None or got is None:
            ok = expected is None and got is None
        else:
            e, g = float(expected), float(got)
            ok = (math.isnan(e) and math.isnan(g)) or math.isclose(e, g, rel_tol=tol, abs_tol=tol)
        self.rows.append({"kind": self.kind, "check": f"number {name}", "expected": expected, "got": got, "ok": ok})

    def rule(self, name: str, ok: bool, detail: str = "") -> None:
        self.rows.append({"kind": self.kind, "check": name, "expected": detail, "got": "", "ok": bool(ok)})


def _frag(c: _Checker, text: str, name: str, fragment: str) -> None:
    """The text contains ``fragment``, formatted here from the *recomputed* value."""
    c.rule(f"text states {name}", fragment in text, fragment)


def _span(minutes: float) -> str:  # the reasons' span wording, written out again
    if minutes < 120:
        return f"{minutes:.0f} minute" + ("" if round(minutes) == 1 else "s")
    return f"{minutes / 60:.1f} hours" if minutes < 2880 else f"{minutes / 1440:.1f} days"


def audit_reasons(ctx, reasons, explanations: Mapping[str, Any], *, frame: pd.DataFrame | None = None,
                  method: str | None = None, z: float | None = None, top_k: int = 6, burst_hours: float = 24.0,
                  onsets: pd.Series | None = None) -> pd.DataFrame:
    """Recompute and check the reasons of one query context (module docstring).

    Args:
        ctx: the :class:`engine.explain.context.QueryContext` the reasons were computed on.
        reasons: its :class:`engine.trust.reasons.Reason` list (as returned, in order).
        explanations: the explanations the reasons were computed from (the ranking method's values
            and standard errors are checked against the history citations and weights; the first
            explanation with per-field values, field Shapley before IG, against the query weights).
        frame: the whole canonical frame (needed to recompute ``common_point``; without it that
            kind is ``not recomputed``).
        method / z / top_k / burst_hours: as given to :func:`engine.trust.reasons.reason_codes`
            (defaults: its defaults).
        onsets: the other entities' fraud onsets the ``common_point`` facts used
            (:func:`engine.trust.common_point.fraud_onsets`; default: from ``frame``'s labels).
    Returns:
        one row per check: ``kind``, ``check``, ``expected`` (recomputed), ``got`` (stated), ``ok``
        (bool), ``reason_index`` (position in ``reasons``; -1 for the ranking check of the list); a
        kind with no recomputation gives one row with check ``"not recomputed"`` and ``ok`` NaN; a
        reason the audit cannot read (a missing number, a cited id outside the context) gives a
        failed ``"audit error"`` row, never an exception.
    """
    from engine.trust.reasons import FIELD_METHODS, RANKING_METHODS, Z_CITE

    z = Z_CITE if z is None else z
    method = method or next((m for m in RANKING_METHODS if m in explanations), None)
    if method is None:
        return pd.DataFrame([{"kind": "(all)", "check": "audit error", "expected": "no ranking method",
                              "got": ", ".join(explanations), "ok": False, "reason_index": -1}])
    e = explanations[method]
    v = np.asarray(e.values, dtype=np.float64)
    se = getattr(e, "standard_errors", None)
    if se is None:
        se = (e.extras or {}).get("standard_errors")
    se = np.zeros_like(v) if se is None else np.nan_to_num(np.asarray(se, dtype=np.float64), nan=np.inf)
    fe = next((explanations[m] for m in FIELD_METHODS if m in explanations
               and getattr(explanations[m], "field_values", None) is not None), None)
    fnames = list(fe.field_names or []) if fe is not None else []
    fq = np.asarray(fe.field_values[-1], dtype=np.float64) if fe is not None else None
    rows = ctx.rows.reset_index(drop=True)
    out: list[dict[str, Any]] = []
    for ri, r in enumerate(reasons):
        c = _Checker(r.kind)
        try:
            _audit_one(c, r, ctx, rows, v, se, z, fnames, fq, frame, top_k, burst_hours, onsets)
        except Exception as err:  # noqa: BLE001 - a reason the audit cannot read is a failed check, not a crash
            c.rows.append({"kind": r.kind, "check": "audit error", "expected": "", "got": f"{type(err).__name__}: {err}",
                           "ok": False})
        out += [{**x, "reason_index": ri} for x in c.rows]
    weighed = [r.weight for r in reasons if math.isfinite(r.weight)]
    k = len(weighed)
    order_ok = all(math.isfinite(r.weight) for r in reasons[:k]) and all(w > 0 for w in weighed) and \
        all(a >= b for a, b in zip(weighed, weighed[1:]))
    out.append({"kind": "(all)", "check": "ranked by signed contribution towards fraud", "expected": "",
                "got": ", ".join(f"{w:.3f}" for w in weighed), "ok": order_ok, "reason_index": -1})
    return pd.DataFrame(out, columns=["kind", "check", "expected", "got", "ok", "reason_index"])


def _audit_one(c: _Checker, r, ctx, rows: pd.DataFrame, v: np.ndarray, se: np.ndarray, z: float, fnames: list,
               fq, frame, top_k: int, burst_hours: float, onsets) -> None:
    """The checks of one reason (module docstring), appended to ``c``."""
    from engine.trust.patterns import COMMON_POINT_P, TEST_MAX_BETWEEN
    from engine.trust.reasons import (AMOUNT_RATIO, MEDIAN_MIN_PURCHASES, NIGHT_HOURS, NOVELTY_MIN_BEFORE,
                                      NOVELTY_MIN_COMPARED, NOVELTY_MIN_SHARE, SMALL_CHARGE_RATIO)

    q = len(rows) - 1
    ts = pd.to_datetime(rows["timestamp"])
    ids = [str(t) for t in rows["transaction_id"]]
    unknown = [t for t in r.transaction_ids if t not in ids]
    if unknown:
        raise KeyError(f"cites transactions outside the context: {unknown}")
    pos = {t: i for i, t in enumerate(ids)}
    cited = sorted(pos[t] for t in r.transaction_ids)
    earlier_cited = [p for p in cited if p < q]
    amt = rows["amount"].to_numpy(np.float64)
    spec = ctx.bundle.spec
    missing = {f.name: f.missing for f in getattr(spec, "fields", [])}
    online = _online(rows)
    noun = _entity_noun(spec)
    cur = (getattr(getattr(spec, "amount", None), "currency", "") or "").strip()
    nb = r.numbers

    def money(x: float) -> str:
        return f"{x:,.2f}" + (f" {cur}" if cur else "")

    def minutes(p: int) -> float:
        return (ts.iloc[q] - ts.iloc[p]).total_seconds() / 60.0

    def window() -> tuple[int, np.ndarray]:
        """(first cited earlier position, earlier positions at or after its time): the reason's window."""
        if not earlier_cited:
            raise ValueError("a history reason that cites no earlier transaction")
        first = earlier_cited[0]
        return first, np.flatnonzero((ts >= ts.iloc[first]).to_numpy()[:q])

    def positive(x: np.ndarray) -> np.ndarray:
        return x[x > 0]

    def query_weight(fields) -> float:
        idx = [fnames.index(f) for f in fields if f in fnames]
        return float(fq[idx].sum()) if fq is not None and idx else float("nan")

    if r.about == "history":
        bad = [ids[p] for p in cited if not (p < q and v[p] > z * se[p])]
        c.rule("cites only values positive beyond their error", not bad, ", ".join(bad))
        c.rule(f"cites at most top_k ({top_k})", len(cited) <= top_k, str(len(cited)))
        c.num("weight (sum of the cited values)", float(v[cited].sum()), r.weight)
    elif r.about == "query":
        c.rule("cites the query only", cited == [q])
        w = query_weight(r.fields)
        c.num("weight (query field attribution)", w, r.weight)
        c.num("weight_known", int(math.isfinite(w)), nb["weight_known"])
    kind = r.kind
    if kind == "burst":
        first, win = window()
        n = len(win) + 1
        c.num("n_transactions", n, nb["n_transactions"])
        c.num("span_minutes", minutes(first), nb["span_minutes"])
        c.num("n_cited", len(cited), nb["n_cited"])
        c.rule("at least 3 transactions", n >= 3)
        c.rule(f"cited within {burst_hours:g} hours", all(minutes(p) <= burst_hours * 60 for p in cited))
        _frag(c, r.text, "count and span", f"{n} transactions in {_span(minutes(first))} up to this one")
    elif kind == "errors":
        first, win = window()
        err = rows["errors"].fillna("").astype(str).to_numpy()
        has = np.array([x.strip() not in ("", missing.get("errors", "<empty>")) for x in err])
        kinds = ", ".join(sorted({x for p in win[has[win]] for x in err[p].split("|") if x}))
        k, n = int(has[win].sum()), len(win)
        c.num("n_window", n, nb["n_window"])
        c.num("n_errors", k, nb["n_errors"])
        c.num("errors", kinds, nb["errors"])
        c.num("span_minutes", minutes(first), nb["span_minutes"])
        c.rule("every cited transaction had an error", all(has[p] for p in cited))
        _frag(c, r.text, "counts and span", f"{k} of the {n} transaction{'' if n == 1 else 's'} in the "
                                            f"{_span(minutes(first))} before this one")
        _frag(c, r.text, "error kinds", f"({kinds})")
    elif kind == "new_values":
        first, win = window()
        labels = {"merchant": "merchants", "terminal": "terminals", "mcc": "merchant categories",
                  "merchant_city": "cities", "merchant_state": "states"}
        any_new = np.zeros(len(rows), dtype=bool)
        named = []
        for col in labels:
            if col not in rows:
                continue
            new = _new_flags(rows, col, missing.get(col, "<empty>"), online)
            if not any(new[p] for p in earlier_cited):
                c.rule(f"{col}: not stated without a cited transaction at a new value", f"n_new_{col}" not in nb)
                continue
            named.append(col)
            any_new |= new
            kc = int(new[win].sum())
            c.num(f"n_new_{col}", kc, nb.get(f"n_new_{col}"))
            c.rule(f"text states n_new_{col}", re.search(rf"(?<!\d){kc} (?:was |were )?at {labels[col]}", r.text)
                   is not None, f"{kc} at {labels[col]}")
            if col in ("mcc", "merchant_state"):
                vals = ", ".join(sorted(set(rows[col].astype(str).to_numpy()[win][new[win]])))
                c.num(f"values_{col}", vals, nb.get(f"values_{col}"))
                _frag(c, r.text, f"values_{col}", f"({vals})")
        c.rule("every cited transaction is at a new value", all(any_new[p] for p in earlier_cited))
        n, k = len(win), int(any_new[win].sum())
        c.num("n_window", n, nb["n_window"])
        c.num("n_new", k, nb["n_new"])
        c.num("span_minutes", minutes(first), nb["span_minutes"])
        earlier = np.arange(NOVELTY_MIN_BEFORE, int(win.min()))
        c.rule(f"compared with the share before the span (>= {NOVELTY_MIN_COMPARED} positions)",
               len(earlier) >= NOVELTY_MIN_COMPARED, str(len(earlier)))
        c.rule(f"share in the span >= {NOVELTY_MIN_SHARE}", k / n >= NOVELTY_MIN_SHARE, f"{k}/{n}")
        if len(earlier) >= NOVELTY_MIN_COMPARED:
            before = float(any_new[earlier].mean())
            c.num("new_share_before", before, nb["new_share_before"])
            c.rule("share in the span above the share before", k / n > before, f"{k}/{n} vs {before:.3f}")
            _frag(c, r.text, "share before", f"(against {100 * before:.0f}% of its transactions "
                                             f"{NOVELTY_MIN_BEFORE + 1}-{int(win.min())} of the history shown)")
        _frag(c, r.text, "window", f"of the {n} transaction{'' if n == 1 else 's'} in the {_span(minutes(first))} "
                                   "before this one")
    elif kind == "amount":
        first, win = window()
        cs, bs = win[amt[win] > 0], positive(amt[:first])
        mc, mb = float(np.median(amt[cs])), float(np.median(bs))
        c.num("n_window", len(cs), nb["n_window"])
        c.num("n_before", len(bs), nb["n_before"])
        c.rule(f"median over >= {MEDIAN_MIN_PURCHASES} purchases", len(bs) >= MEDIAN_MIN_PURCHASES, str(len(bs)))
        c.num("median_window", mc, nb["median_window"])
        c.num("median_before", mb, nb["median_before"])
        c.num("ratio", mc / mb, nb["ratio"])
        c.rule(f"ratio >= {AMOUNT_RATIO}", mc / mb >= AMOUNT_RATIO)
        c.num("span_minutes", minutes(first), nb["span_minutes"])
        _frag(c, r.text, "window", f"the {len(cs)} purchase{'' if len(cs) == 1 else 's'} in the "
                                   f"{_span(minutes(first))} before this one")
        _frag(c, r.text, "medians and ratio", f"median of {money(mc)}, {mc / mb:.1f}x")
        _frag(c, r.text, "earlier median", f"({money(mb)} over {len(bs)} purchase{'' if len(bs) == 1 else 's'})")
    elif kind == "small_charges":
        new_m = _new_flags(rows, "merchant", missing.get("merchant", "<empty>"), np.zeros(len(rows), bool))
        for p in cited:
            b = positive(amt[:p])
            c.rule("small charge at a new merchant", p < q and len(b) >= MEDIAN_MIN_PURCHASES and bool(new_m[p])
                   and 0 < amt[p] <= SMALL_CHARGE_RATIO * float(np.median(b)), ids[p])
        c.num("n_small", len(cited), nb["n_small"])
        c.num("median_before", float(np.median(positive(amt[:cited[0]]))), nb["median_before"])
        c.num("span_minutes", minutes(cited[0]), nb["span_minutes"])
        _frag(c, r.text, "charges", f"{len(cited)} small charge{'' if len(cited) == 1 else 's'} ("
                                    + ", ".join(money(amt[p]) for p in cited) + ")")
        _frag(c, r.text, "span", f"{_span(minutes(cited[0]))} before this transaction")
    elif kind in ("query_amount", "test_then_purchase"):
        b = positive(amt[:q])
        med = float(np.median(b))
        ratio = amt[q] / med
        c.num("n_before", len(b), nb["n_before"])
        c.rule(f"median over >= {MEDIAN_MIN_PURCHASES} purchases", len(b) >= MEDIAN_MIN_PURCHASES, str(len(b)))
        c.num("median_before", med, nb["median_before"])
        c.num("ratio", ratio, nb["ratio"])
        c.rule(f"ratio >= {AMOUNT_RATIO}", ratio >= AMOUNT_RATIO)
        key = "amount" if kind == "query_amount" else "query_amount"
        c.num(key, amt[q], nb[key])
        if kind == "query_amount":
            _frag(c, r.text, "amount and ratio", f"{money(amt[q])}, is {ratio:.1f}x the {noun}'s median purchase "
                                                 f"({money(med)} over {len(b)} earlier purchase{'' if len(b) == 1 else 's'})")
        else:
            _audit_test_then_purchase(c, r, ctx, rows, ids, earlier_cited, amt, med, ratio, online, missing, money,
                                      minutes, query_weight, SMALL_CHARGE_RATIO, TEST_MAX_BETWEEN)
    elif kind == "query_errors":
        err = str(rows["errors"].fillna("").iloc[q]).strip()
        kinds = ", ".join(sorted(x for x in err.split("|") if x))
        c.num("errors", kinds, nb["errors"])
        _frag(c, r.text, "error kinds", f"({kinds})")
    elif kind == "query_new_values":
        c.num("n_before", q, nb["n_before"])
        for col in [x.strip() for x in str(nb["new_fields"]).split(",") if x.strip()]:
            vals = rows[col].astype(str).to_numpy()
            c.rule(f"{col}: the query's value is in no earlier row", vals[q] not in set(vals[:q])
                   and vals[q] != missing.get(col, "<empty>"), col)
            if col in ("merchant_city", "merchant_state"):
                c.rule(f"{col}: not named for an online query", not online[q])
            if col in ("mcc", "merchant_state"):
                c.num(f"value_{col}", vals[q], nb.get(f"value_{col}"))
                _frag(c, r.text, f"value_{col}", f" {vals[q]}")
        older = int(getattr(ctx, "n_before_context", 0) or 0)
        if frame is not None:  # the entity's transactions before the context, counted in the file
            ids_file = frame.loc[frame["entity_id"].astype(str) == str(ctx.entity_id), "transaction_id"].astype(str)
            older_file = ids_file.tolist().index(str(rows["transaction_id"].iloc[0]))
            c.num("n_older", older_file, nb.get("n_older", 0))
        if older:
            _frag(c, r.text, "history length", f"in its last {q} transaction{'' if q == 1 else 's'} "
                                               f"(the {older:,} older ones are not in the history shown)")
        else:
            _frag(c, r.text, "history length", f"in {q} earlier transaction{'' if q == 1 else 's'}")
    elif kind in ("query_online", "query_night"):
        if kind == "query_online":
            flag, limit, name = online, 0.25, "online_share_before"
        else:
            h = ts.dt.hour.to_numpy()
            flag, limit, name = (h >= NIGHT_HOURS[0]) & (h < NIGHT_HOURS[1]), 0.1, "night_share_before"
        share = float(flag[:q].mean())
        c.num(name, share, nb[name])
        c.num("n_before", q, nb["n_before"])
        c.rule(f"{'online' if kind == 'query_online' else 'night'} query, share before <= {limit}",
               bool(flag[q]) and share <= limit)
        _frag(c, r.text, "share", f"{100 * share:.0f}% of the {noun}'s {q} earlier")
    elif kind == "common_point" and frame is not None:
        _audit_common_point(c, r, frame, ctx, ids, cited, onsets, COMMON_POINT_P)
    else:
        c.rows.append({"kind": kind, "check": "not recomputed", "expected": "", "got": "", "ok": float("nan")})


def _audit_test_then_purchase(c: _Checker, r, ctx, rows, ids, charges, amt, med, ratio, online, missing, money,
                              minutes, query_weight, small_ratio, max_between) -> None:
    """test_then_purchase: the charges, the query, the deletion effect (re-measured with the model)
    and the weight = deletion effect + the query's field attribution."""
    nb, q = r.numbers, len(rows) - 1
    new_m = _new_flags(rows, "merchant", missing.get("merchant", "<empty>"), np.zeros(len(rows), bool))
    c.rule("each charge small, at a new merchant", bool(charges) and all(
        0 < amt[p] <= small_ratio * med and new_m[p] for p in charges))
    c.rule("the query is online or at a new merchant", bool(online[q] or new_m[q]))
    c.num("amounts", ", ".join(f"{amt[p]:.6f}" for p in charges), ", ".join(f"{a:.6f}" for a in nb["amounts"]))
    c.num("n_small", len(charges), nb["n_small"])
    n_between = q - charges[0] - 1
    c.num("n_between", n_between, nb["n_between"])
    c.rule(f"at most {max_between} transactions between", n_between <= max_between)
    c.num("span_minutes", minutes(charges[0]), nb["span_minutes"])
    c.num("online", bool(online[q]), nb["online"])
    c.num("new_merchant", bool(new_m[q]), nb["new_merchant"])
    present = torch.ones(2, ctx.T, dtype=torch.bool)
    present[1, charges] = False
    lg = ctx.logits(present).detach().cpu().numpy().astype(np.float64)
    joint = float(lg[0] - lg[1])
    c.num("deletion_logit (re-measured)", joint, nb["deletion_logit"], MODEL_TOL)
    qfields = ["amount", "amount_vs_history", "recent_activity"] + (["use_chip"] if online[q] else []) + \
        (["merchant", "first_seen"] if new_m[q] else [])
    wq = query_weight(qfields)
    c.num("query_field_weight", wq, nb["query_field_weight"])
    c.num("weight (deletion + query fields)", joint + (wq if math.isfinite(wq) else 0.0), r.weight, MODEL_TOL)
    p_with, p_without = (float(x) for x in ctx.bundle.probability(np.array([lg[0], lg[0] - joint])))
    c.num("probability_with", p_with, nb["probability_with"], MODEL_TOL)
    c.num("probability_without", p_without, nb["probability_without"], MODEL_TOL)
    _frag(c, r.text, "scores", f"would be {p_without:.2f} (now {p_with:.2f})")
    _frag(c, r.text, "charges", "(" + ", ".join(money(amt[p]) for p in charges) + ")")
    _frag(c, r.text, "between", f"({n_between} transaction{'' if n_between == 1 else 's'}) before this "
                                f"{money(amt[q])}")
    _frag(c, r.text, "ratio", f"({ratio:.1f}x the {_entity_noun(ctx.bundle.spec)}'s median purchase of {money(med)})")


def _audit_common_point(c: _Checker, r, frame: pd.DataFrame, ctx, ids, cited, onsets, p_max: float) -> None:
    """Recompute a ``common_point`` fact from the other entities' rows of ``frame``
    (definitions of :mod:`engine.trust.common_point`), its visits tested and its weight."""
    from scipy.stats import beta, binom

    from engine.trust.common_point import LOOKBACK_DAYS

    nb = r.numbers
    ent = str(ctx.entity_id)
    point, P = str(nb["point_field"]), str(nb["point"])
    W, follow = pd.Timedelta(days=int(nb["window_days"])), pd.Timedelta(days=int(nb["follow_days"]))
    rows = ctx.rows.reset_index(drop=True)
    q = len(rows) - 1
    c.rule("cites one earlier transaction", len(cited) == 1 and cited[0] < q)
    visit = rows.iloc[cited[0]]
    c.num("visit point", str(visit[point]), P)
    c.num("visit_time", str(pd.Timestamp(visit["timestamp"])), str(nb["visit_time"]))
    other_rows = frame[frame["entity_id"].astype(str) != ent]
    if onsets is None:
        lab = frame.loc[frame["label"].fillna(0).astype(int) == 1] if "label" in frame else frame.iloc[:0]
        onsets = lab.groupby(lab["entity_id"].astype(str))["timestamp"].min()
    onset = onsets[onsets.index.astype(str) != ent]
    onset.index = onset.index.astype(str)

    def in_window(day: pd.Timestamp) -> pd.DataFrame:
        tt = other_rows["timestamp"]
        return other_rows[(tt >= day - W) & (tt < day + W + pd.Timedelta(days=1))]

    def later_fraud(first: pd.Series) -> int:
        o = onset.reindex(first.index)
        return int(((o > first) & (o <= first + follow)).sum())

    d = pd.Timestamp(visit["timestamp"]).normalize()
    others = in_window(d)
    at_p = others[others[point].astype(str) == P]
    first_visit = at_p.groupby(at_p["entity_id"].astype(str))["timestamp"].min()
    first_any = others.groupby(others["entity_id"].astype(str))["timestamp"].min()
    n, k = len(first_visit), later_fraud(first_visit)
    n_act, k_act = len(first_any), later_fraud(first_any)
    r0 = (k_act + 0.5) / (n_act + 1)
    # the visits tested: the context's earlier visits in the lookback, one per (point, day), with another visitor
    t_q = pd.Timestamp(rows["timestamp"].iloc[q])
    miss = next((f.missing for f in getattr(ctx.bundle.spec, "fields", []) if f.name == point), "<empty>")
    own = rows.iloc[:q]
    own = own[(own["timestamp"] < t_q) & (own["timestamp"] >= t_q - pd.Timedelta(days=LOOKBACK_DAYS))
              & (own[point].astype(str) != miss)]
    days = {(str(x[point]), pd.Timestamp(x["timestamp"]).normalize()) for _, x in own.iterrows()}
    n_tested = 0
    for pt, day in days:
        o = in_window(day)
        n_tested += int((o[point].astype(str) == pt).any())
    p = float(binom.sf(k - 1, n, r0))
    p_adj = min(1.0, p * n_tested)
    c.num("n_visitors", n, nb["n_visitors"])
    c.num("n_later_fraud", k, nb["n_later_fraud"])
    c.num("n_active", n_act, nb["n_active"])
    c.num("n_active_fraud", k_act, nb["n_active_fraud"])
    c.num("base_rate", r0, nb["base_rate"])
    c.num("rate_ratio", (k / n) / r0, nb["rate_ratio"])
    c.num("p_value", p, nb["p_value"])
    c.num("n_tested", n_tested, nb["n_tested"])
    c.num("p_adjusted", p_adj, nb["p_adjusted"])  # Bonferroni over the visits tested
    c.rule(f"p_adjusted <= {p_max}", p_adj <= p_max)
    w = math.log(float(beta.ppf(0.025, k, n - k + 1)) / r0) if k else 0.0
    c.num("weight (log rate ratio at the lower 95 % bound)", w, r.weight)
    c.num("log_rate_ratio_lower95", w, nb["log_rate_ratio_lower95"])
    _frag(c, r.text, "visitors", f"{k} of the {n} other {_entity_noun(ctx.bundle.spec)}s that used it")
    _frag(c, r.text, "rates", f"({100 * k / n:.0f}%, against {100 * r0:.1f}% of the {n_act} other")
    _frag(c, r.text, "p-value", f"p = {p_adj:.2g} after testing {n_tested} visit")


def audit_markdown(res: pd.DataFrame, n_cases: int) -> str:
    """Markdown of :func:`audit_reasons` rows of ``n_cases`` cases (concatenated, with a ``query``
    column naming each case): per reason kind, reasons audited, checks passed / failed, reasons not
    recomputed, then every failed check (at most 30). The ``(all)`` kind is the ranking check of
    each case's list (one per case, not a reason): shown as "(order of each case's list)"."""
    if res.empty:
        return "No reason to audit."
    lines = [f"Reason codes of {n_cases} cases, every number recomputed from the rows (engine/trust/reason_audit.py).",
             "", "| reason kind | reasons | checks | passed | failed | not recomputed |", "|---|---|---|---|---|---|"]
    for kind, g in res.groupby("kind", sort=True):
        rec = g[g["check"] != "not recomputed"]
        n_r = len(g.drop_duplicates(["query", "reason_index"] if "query" in g else ["reason_index"]))
        name, n_txt = (kind, str(n_r)) if kind != "(all)" else (
            "(order of each case's list)", f"- ({n_r} list{'s' if n_r != 1 else ''})")
        lines.append(f"| {name} | {n_txt} | {len(rec)} | {int((rec['ok'] == True).sum())} | "  # noqa: E712
                     f"{int((rec['ok'] == False).sum())} | {int((g['check'] == 'not recomputed').sum())} |")  # noqa: E712
    bad = res[res["ok"] == False]  # noqa: E712
    lines += ["", f"Failed checks: {len(bad)} of {int(res['ok'].notna().sum())}."]
    if len(bad):
        lines += ["", "| case | kind | check | recomputed | stated |", "|---|---|---|---|---|"]
        for r in bad.head(30).itertuples():
            lines.append(f"| {getattr(r, 'query', '')} | {r.kind} | {r.check} | {r.expected} | {r.got} |")
    return "\n".join(lines)


__all__ = ["MODEL_TOL", "REL_TOL", "audit_markdown", "audit_reasons"]
