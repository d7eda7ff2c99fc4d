"""Reason-code accuracy: every number of every reason recomputed from the data, independently.

:func:`engine.trust.reasons.reason_codes` states facts ("9 transactions in 38 minutes up to this
one", "3.1x the card's median purchase"). :func:`audit_reasons` recomputes each fact's numbers
from the query context's rows (and, for ``common_point``, from the whole frame's other entities)
with its own pandas code, not the reason module's helpers, and checks the rules the reasons
promise:

* **numbers**: each recomputed number equals the reason's ``numbers`` entry (counts exactly,
  floats to 1e-9 relative); counts are over the data window the reason describes (every
  transaction from the earliest cited one up to the query), never over the cited set;
* **text**: each count the reason states appears in its text as a whole word;
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

#: a float is equal when within this relative (and absolute) tolerance
REL_TOL = 1e-9

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

    def num(self, name: str, expected: Any, got: Any) -> None:
        if isinstance(expected, str) or isinstance(got, str):
            ok = str(expected) == str(got)
        elif expected is None or got is None:
            ok = expected is None and got is None
        else:
            e, g = float(expected), float(got)
            ok = (math.isnan(e) and math.isnan(g)) or math.isclose(e, g, rel_tol=REL_TOL, abs_tol=REL_TOL)
        self.rows.append({"kind": self.kind, "check": f"number {name}", "expected": expected, "got": got, "ok": ok})

    def rule(self, name: str, ok: bool, detail: str = "") -> None:
        self.rows.append({"kind": self.kind, "check": name, "expected": detail, "got": "", "ok": bool(ok)})


def _in_text(c: _Checker, text: str, name: str, n: Any) -> None:
    c.rule(f"text states {name}", re.search(rf"(?<![\d.,]){int(n)}(?![\d.,]\d)", text) is not None, f"{name}={n}")


def audit_reasons(ctx, reasons, explanations: Mapping[str, Any], *, frame: pd.DataFrame | None = None,
                  method: str | None = None, z: float | None = None) -> pd.DataFrame:
    """Recompute and check the reasons of one query context (module docstring).

    Args:
        ctx: the :class:`engine.explain.context.QueryContext` the reasons were computed on.
        reasons: its :class:`engine.trust.reasons.Reason` list (as returned, in order).
        explanations: the explanations the reasons were computed from (the ranking method's values
            and standard errors are checked against the history citations).
        frame: the whole canonical frame (needed to recompute ``common_point``; without it that
            kind is ``not recomputed``).
        method / z: the ranking method and citation threshold (defaults: the reason module's).
    Returns:
        one row per check: ``kind``, ``check``, ``expected`` (recomputed), ``got`` (stated), ``ok``
        (bool), ``reason_index`` (position in ``reasons``; -1 for the ranking check of the list); a
        kind with no recomputation gives one row with check ``"not recomputed"`` and ``ok`` NaN.
    """
    from engine.trust.reasons import RANKING_METHODS, Z_CITE

    z = Z_CITE if z is None else z
    method = method or next(m for m in RANKING_METHODS if m in explanations)
    e = explanations[method]
    v = np.asarray(e.values, dtype=np.float64)
    se = getattr(e, "standard_errors", None)
    if se is None:
        se = (e.extras or {}).get("standard_errors")
    se = np.zeros_like(v) if se is None else np.nan_to_num(np.asarray(se, dtype=np.float64), nan=np.inf)
    rows = ctx.rows.reset_index(drop=True)
    q = len(rows) - 1
    ts = pd.to_datetime(rows["timestamp"])
    pos = {str(t): i for i, t in enumerate(rows["transaction_id"].astype(str))}
    amt = rows["amount"].to_numpy(np.float64)
    spec = ctx.bundle.spec
    missing = {f.name: f.missing for f in getattr(spec, "fields", [])}
    online = _online(rows)
    out: list[dict[str, Any]] = []

    def minutes(p: int) -> float:
        return (ts.iloc[q] - ts.iloc[p]).total_seconds() / 60.0

    def span_of(r) -> tuple[int, np.ndarray]:
        """(first cited position, earlier positions at or after its time): the reason's window."""
        first = min(pos[t] for t in r.transaction_ids if pos[t] < q)
        win = np.flatnonzero((ts >= ts.iloc[first]).to_numpy()[:q])
        return first, win

    def positive(before: np.ndarray) -> np.ndarray:
        return before[before > 0]

    from engine.trust.reasons import MEDIAN_MIN_PURCHASES, NOVELTY_MIN_BEFORE, SMALL_CHARGE_RATIO

    for ri, r in enumerate(reasons):
        c, nb = _Checker(r.kind), r.numbers
        if r.about == "history":
            bad = [t for t in r.transaction_ids if not (pos[t] < q and v[pos[t]] > z * se[pos[t]])]
            c.rule("cites only values positive beyond their error", not bad, ", ".join(bad))
        if r.kind == "burst":
            first, win = span_of(r)
            c.num("n_transactions", len(win) + 1, nb["n_transactions"])
            c.num("span_minutes", minutes(first), nb["span_minutes"])
            c.num("n_cited", len(r.transaction_ids), nb["n_cited"])
            _in_text(c, r.text, "n_transactions", nb["n_transactions"])
        elif r.kind == "errors":
            first, win = span_of(r)
            err = rows["errors"].fillna("").astype(str).str.strip()
            has = (err != "").to_numpy() & (err != missing.get("errors", "<empty>")).to_numpy()
            c.num("n_window", len(win), nb["n_window"])
            c.num("n_errors", int(has[win].sum()), nb["n_errors"])
            c.num("errors", ", ".join(sorted({x for s in err.to_numpy()[win][has[win]] for x in s.split("|") if x})),
                  nb["errors"])
            c.num("span_minutes", minutes(first), nb["span_minutes"])
            _in_text(c, r.text, "n_errors", nb["n_errors"])
            _in_text(c, r.text, "n_window", nb["n_window"])
        elif r.kind == "new_values":
            first, win = span_of(r)
            cols = [k[len("n_new_"):] for k in nb if k.startswith("n_new_")]
            any_new = np.zeros(len(rows), dtype=bool)
            for col in cols:
                new = _new_flags(rows, col, missing.get(col, "<empty>"), online)
                any_new |= new
                c.num(f"n_new_{col}", int(new[win].sum()), nb[f"n_new_{col}"])
                c.rule(f"{col}: a cited transaction is at a new value",
                       any(new[pos[t]] for t in r.transaction_ids), col)
                if f"values_{col}" in nb:
                    c.num(f"values_{col}", ", ".join(sorted(set(rows[col].astype(str).to_numpy()[win][new[win]]))),
                          nb[f"values_{col}"])
            c.num("n_window", len(win), nb["n_window"])
            c.num("n_new", int(any_new[win].sum()), nb["n_new"])
            c.num("span_minutes", minutes(first), nb["span_minutes"])
            earlier = np.arange(NOVELTY_MIN_BEFORE, int(win.min()))
            c.rule("compared with the share before the span", len(earlier) >= NOVELTY_MIN_BEFORE)
            if len(earlier) >= NOVELTY_MIN_BEFORE:
                c.num("new_share_before", float(any_new[earlier].mean()), nb["new_share_before"])
                c.rule("share in the span above the share before", nb["n_new"] / nb["n_window"] > nb["new_share_before"])
            _in_text(c, r.text, "n_window", nb["n_window"])
        elif r.kind == "amount":
            first, win = span_of(r)
            cs = win[amt[win] > 0]
            bs = positive(amt[:first])
            c.num("n_window", len(cs), nb["n_window"])
            c.num("n_before", len(bs), nb["n_before"])
            c.rule(f"median over >= {MEDIAN_MIN_PURCHASES} purchases", len(bs) >= MEDIAN_MIN_PURCHASES)
            c.num("median_window", float(np.median(amt[cs])), nb["median_window"])
            c.num("median_before", float(np.median(bs)), nb["median_before"])
            c.num("ratio", float(np.median(amt[cs]) / np.median(bs)), nb["ratio"])
            c.num("span_minutes", minutes(first), nb["span_minutes"])
            _in_text(c, r.text, "n_window", nb["n_window"])
            _in_text(c, r.text, "n_before", nb["n_before"])
        elif r.kind == "small_charges":
            cited = sorted(pos[t] for t in r.transaction_ids)
            new_m = _new_flags(rows, "merchant", missing.get("merchant", "<empty>"), np.zeros(len(rows), bool))
            for p in cited:
                b = positive(amt[:p])
                c.rule("small charge at a new merchant", len(b) >= MEDIAN_MIN_PURCHASES and new_m[p]
                       and 0 < amt[p] <= SMALL_CHARGE_RATIO * float(np.median(b)), str(rows["transaction_id"].iloc[p]))
            c.num("n_small", len(cited), nb["n_small"])
            c.num("median_before", float(np.median(positive(amt[:cited[0]]))), nb["median_before"])
            c.num("span_minutes", minutes(cited[0]), nb["span_minutes"])
            _in_text(c, r.text, "n_small", nb["n_small"])
        elif r.kind in ("query_amount", "test_then_purchase"):
            b = positive(amt[:q])
            c.num("n_before", len(b), nb["n_before"])
            c.rule(f"median over >= {MEDIAN_MIN_PURCHASES} purchases", len(b) >= MEDIAN_MIN_PURCHASES)
            c.num("median_before", float(np.median(b)), nb["median_before"])
            c.num("ratio", amt[q] / float(np.median(b)), nb["ratio"])
            key = "amount" if r.kind == "query_amount" else "query_amount"
            c.num(key, amt[q], nb[key])
            if r.kind == "test_then_purchase":
                cited = sorted(pos[t] for t in r.transaction_ids if pos[t] < q)
                new_m = _new_flags(rows, "merchant", missing.get("merchant", "<empty>"), np.zeros(len(rows), bool))
                med = float(np.median(b))
                c.rule("each charge small, at a new merchant", all(0 < amt[p] <= SMALL_CHARGE_RATIO * med and new_m[p]
                                                                   for p in cited))
                c.num("n_small", len(cited), nb["n_small"])
                c.num("n_between", q - cited[0] - 1, nb["n_between"])
                c.num("span_minutes", minutes(cited[0]), nb["span_minutes"])
                c.num("online", bool(online[q]), nb["online"])
                c.num("new_merchant", bool(new_m[q]), nb["new_merchant"])
                _in_text(c, r.text, "n_between", nb["n_between"])
            else:
                _in_text(c, r.text, "n_before", nb["n_before"])
        elif r.kind == "query_errors":
            err = str(rows["errors"].fillna("").iloc[q]).strip()
            c.num("errors", ", ".join(sorted(x for x in err.split("|") if x)), nb["errors"])
        elif r.kind == "query_new_values":
            c.num("n_before", q, nb["n_before"])
            for col in [x.strip() for x in str(nb["new_fields"]).split(",") if x.strip()]:
                vals = rows[col].astype(str).to_numpy()
                c.rule(f"{col}: the query's value is in no earlier row", vals[q] not in set(vals[:q])
                       and vals[q] != missing.get(col, "<empty>"), col)
        elif r.kind == "query_online":
            c.num("online_share_before", float(online[:q].mean()), nb["online_share_before"])
            c.rule("the query is online", bool(online[q]))
        elif r.kind == "query_night":
            from engine.trust.reasons import NIGHT_HOURS

            h = ts.dt.hour.to_numpy()
            night = (h >= NIGHT_HOURS[0]) & (h < NIGHT_HOURS[1])
            c.num("night_share_before", float(night[:q].mean()), nb["night_share_before"])
            c.rule("the query is at night", bool(night[q]))
        elif r.kind == "common_point" and frame is not None:
            _audit_common_point(c, r, frame, ctx)
        else:
            c.rows.append({"kind": r.kind, "check": "not recomputed", "expected": "", "got": "", "ok": float("nan")})
        out += [{**x, "reason_index": ri} for x in c.rows]
    weighed = [r.weight for r in reasons if math.isfinite(r.weight)]
    k = len(weighed)
    order_ok = all(math.isfinite(r.weight) for r in reasons[:k]) and all(w > 0 for w in weighed) and \
        all(a >= b for a, b in zip(weighed, weighed[1:]))
    out.append({"kind": "(all)", "check": "ranked by signed contribution towards fraud", "expected": "",
                "got": ", ".join(f"{w:.3f}" for w in weighed), "ok": order_ok, "reason_index": -1})
    return pd.DataFrame(out, columns=["kind", "check", "expected", "got", "ok", "reason_index"])


def _audit_common_point(c: _Checker, r, frame: pd.DataFrame, ctx) -> None:
    """Recompute a ``common_point`` fact from the other entities' rows of ``frame``
    (definitions of :mod:`engine.trust.common_point`; onsets from labels only)."""
    from scipy.stats import binom

    nb = r.numbers
    ent = str(ctx.entity_id)
    point, P = str(nb["point_field"]), str(nb["point"])
    d = pd.Timestamp(nb["visit_time"]).normalize()
    W, follow = pd.Timedelta(days=int(nb["window_days"])), pd.Timedelta(days=int(nb["follow_days"]))
    t = frame["timestamp"]
    others = frame[(frame["entity_id"].astype(str) != ent) & (t >= d - W) & (t < d + W + pd.Timedelta(days=1))]
    lab = frame.loc[frame["label"].fillna(0).astype(int) == 1] if "label" in frame else frame.iloc[:0]
    onset = lab.groupby(lab["entity_id"].astype(str))["timestamp"].min()

    def later_fraud(first: pd.Series) -> int:
        o = onset.reindex(first.index)
        return int(((o > first) & (o <= first + follow)).sum())

    at_p = others[others[point].astype(str) == P]
    first_visit = at_p.groupby(at_p["entity_id"].astype(str))["timestamp"].min()
    first_any = others.groupby(others["entity_id"].astype(str))["timestamp"].min()
    n, k = len(first_visit), later_fraud(first_visit)
    n_act, k_act = len(first_any), later_fraud(first_any)
    r0 = (k_act + 0.5) / (n_act + 1)
    c.num("n_visitors", n, nb["n_visitors"])
    c.num("n_later_fraud", k, nb["n_later_fraud"])
    c.num("n_active", n_act, nb["n_active"])
    c.num("n_active_fraud", k_act, nb["n_active_fraud"])
    c.num("base_rate", r0, nb["base_rate"])
    p = float(binom.sf(k - 1, n, r0))
    c.num("p_value", p, nb["p_value"])
    c.num("p_adjusted", min(1.0, p * int(nb["n_tested"])), nb["p_adjusted"])  # Bonferroni over the visits tested
    _in_text(c, r.text, "n_later_fraud", nb["n_later_fraud"])
    _in_text(c, r.text, "n_visitors", nb["n_visitors"])


def audit_markdown(res: pd.DataFrame, n_cases: int) -> str:
    """Markdown of :func:`audit_reasons` rows of ``n_cases`` cases (concatenated, with a ``query``
    column naming each case): per reason kind, reasons audited, checks passed / failed, reasons not
    recomputed, then every failed check (at most 30). The ``(all)`` row is the ranking check, one
    per case."""
    if res.empty:
        return "No reason to audit."
    lines = [f"Reason codes of {n_cases} cases, every number recomputed from the rows (engine/trust/reason_audit.py).",
             "", "| reason kind | reasons | checks | passed | failed | not recomputed |", "|---|---|---|---|---|---|"]
    for kind, g in res.groupby("kind", sort=True):
        rec = g[g["check"] != "not recomputed"]
        n_r = len(g.drop_duplicates(["query", "reason_index"] if "query" in g else ["reason_index"]))
        lines.append(f"| {kind} | {n_r} | {len(rec)} | {int((rec['ok'] == True).sum())} | "  # noqa: E712
                     f"{int((rec['ok'] == False).sum())} | {int((g['check'] == 'not recomputed').sum())} |")  # noqa: E712
    bad = res[res["ok"] == False]  # noqa: E712
    lines += ["", f"Failed checks: {len(bad)} of {int(res['ok'].notna().sum())}."]
    if len(bad):
        lines += ["", "| case | kind | check | recomputed | stated |", "|---|---|---|---|---|"]
        for r in bad.head(30).itertuples():
            lines.append(f"| {getattr(r, 'query', '')} | {r.kind} | {r.check} | {r.expected} | {r.got} |")
    return "\n".join(lines)


__all__ = ["REL_TOL", "audit_markdown", "audit_reasons"]
