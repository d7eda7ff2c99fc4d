"""Reason codes: a short plain-language summary of why a transaction was flagged.

Every reason is built from the **attributions and the data** together:

1. **Which transactions may be cited.** The earlier context transactions are ranked by the
   attribution values of one method (default: the first available of SHAP, occlusion,
   Integrated Gradients — the order of their deletion AOPC in ``bench/results/explanations.md``;
   by *value*, most fraud-pushing first, as in :mod:`engine.trust.faithfulness`). The top ``top_k`` with a **positive** value are citable:
   a reason for an alert cites only what pushed the score towards fraud. The query itself is
   citable when its own value is positive, or when the method does not score it (SHAP and
   occlusion: the query is not a player; it is the flagged transaction). These are the *cited
   set* ``S``.
2. **Which fields may be cited.** With Integrated Gradients' per-(transaction, field)
   attributions, each field's score is the sum of its positive attributions over ``S``; the top
   ``max_fields`` fields with a positive score are citable. A reason about merchants, amounts,
   timing, ... is produced only if its field is citable (``Reason.fields``). Without IG there is
   no field resolution and no field restriction (``Reason.numbers['field_ranked'] = 0``).
3. **The numbers come from the data**: the raw canonical rows of the context (``ctx.rows``:
   ``timestamp``, ``amount``, ``merchant``, ``mcc``, ``use_chip``, ``merchant_state``,
   ``errors``, ``terminal``, ``terminal_risk_*`` where present). "The card's other
   transactions" (*baseline*) are the earlier context transactions **not** in ``S``: a merchant
   is *new* when no baseline row has it; "the card's median" is the median of the baseline's
   positive amounts.

Reason kinds (field that must be citable -> text):

* ``burst`` (``time_since_prev``): "6 transactions in 35 minutes" — the cited transactions within
  ``burst_hours`` before the query (query included), at least 3.
* ``channel`` (``use_chip``): "5 of 6 were online purchases, against 8% of the card's other
  transactions".
* ``new_<field>`` (``merchant``, ``terminal``, ``mcc``, ``merchant_city``, or any categorical
  model-input field): "4 of 6 at merchants not seen in the card's other 40 transactions". A field
  with ``model_input = false`` (the Handbook terminal) carries no attribution and is not cited.
* ``location`` (``merchant_state``): "in 3 states (CA, NV, TX) not seen in the card's other ...".
* ``amount`` (``amount`` or ``amount_vs_history``): "amounts 4.2x the card's median (median
  52.10 USD of 6 cited purchases against 12.40 USD of 30 other purchases)", when the ratio of the
  medians of the positive amounts is >= 2 or <= 0.5.
* ``night`` (``hour``): "3 between 00:00 and 05:59, against 2% of the card's other transactions".
* ``errors`` (``errors``): "2 with authorisation errors (Bad CVV, Bad PIN)".
* ``terminal_risk`` (aggregate ``terminal_risk``): "the terminal's fraud rate was 25% (3 of 12
  transactions) in the 7 days ending 7 days before".
* ``terminal_risk_run`` (aggregate with ``fraud_run``): "this transaction's terminal: its last 4 known
  transactions were all frauds, a run that began 12 days before it (labels known 7 days late)".

Each :class:`Reason` lists the transaction ids it cites and a ``numbers`` dict holding every
number of its text unrounded (so a test can check each against the data). Its ``weight`` is the
attribution mass behind it: the positive IG attribution of its fields summed over the
transactions it cites (logit); with IG, a reason of weight 0 (its own transactions carry no
positive attribution on its field) is dropped. Reasons are ordered by weight.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np
import pandas as pd

from engine.explain.base import Explanation

RANKING_METHODS = ("shap", "occlusion", "integrated_gradients")
NIGHT_HOURS = (0, 6)  # [start, end) hours counted as night


@dataclass
class Reason:
    """One reason code.

    Attributes:
        kind: ``"burst"``, ``"channel"``, ``"new_merchant"``, ``"amount"``, ... (module doc).
        text: the plain-language sentence.
        transaction_ids: the transactions it cites (all in the cited set ``S``).
        fields: the model fields it rests on (citable fields).
        numbers: every number in ``text``, unrounded (counts, minutes, ratios, amounts, percents).
        weight: attribution mass behind the reason (sum of the positive attributions of its
            fields over its transactions; logit) — the ordering key.
    """

    kind: str
    text: str
    transaction_ids: list[str]
    fields: list[str]
    numbers: dict[str, Any] = field(default_factory=dict)
    weight: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fmt_num(x: float) -> str:
    return f"{x:,.0f}" if abs(x - round(x)) < 1e-9 else f"{x:,.2f}"


def _plural(n: int, one: str, many: str | None = None) -> str:
    return one if n == 1 else (many or one + "s")


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _entity_noun(spec) -> str:
    cols = " ".join(getattr(getattr(spec, "entity", None), "columns", []) or []).lower()
    return "card" if "card" in cols else "customer" if "customer" in cols else "account"


def _span_text(minutes: float) -> str:
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


def _missing_values(spec) -> dict[str, str]:
    return {f.name: f.missing for f in getattr(spec, "fields", [])}


def reason_codes(
    ctx,
    explanations: Mapping[str, Explanation],
    *,
    method: str | None = None,
    top_k: int = 6,
    max_fields: int = 4,
    max_reasons: int = 4,
    burst_hours: float = 24.0,
) -> list[Reason]:
    """Reason codes for the query of ``ctx`` (see the module docstring for the rules).

    Args:
        ctx: the query context (:class:`engine.explain.context.QueryContext`; uses ``ctx.rows``,
            ``ctx.field_names``, ``ctx.bundle.spec``).
        explanations: ``{method: Explanation}`` of this context (IG needed for field resolution).
        method: the method ranking the transactions (default: first of
            :data:`RANKING_METHODS` present).
        top_k: citable earlier transactions (top by positive value), default 6.
        max_fields: citable fields (top by positive IG field attribution over the cited set).
        max_reasons: reasons returned at most (highest weight first).
        burst_hours: window before the query for the ``burst`` reason.
    Returns:
        list of :class:`Reason` (possibly empty: nothing citable, or no pattern in the data).
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
    rows = ctx.rows.reset_index(drop=True)
    T = ctx.T
    q = T - 1
    v = np.asarray(e.values, dtype=np.float64)
    earlier = np.arange(q)
    order = earlier[np.lexsort((-earlier, -v[:q]))] if q else earlier
    cited = [int(j) for j in order if v[j] > 0][:top_k]
    player_mask = e.extras.get("player_mask")
    query_scored = player_mask is None or bool(np.asarray(player_mask)[q])
    if not query_scored or v[q] > 0:
        cited.append(q)
    S = np.array(sorted(cited), dtype=np.int64)
    if len(S) == 0:
        return []
    baseline = np.array([j for j in range(q) if j not in set(S.tolist())], dtype=np.int64)

    # citable fields
    ig = explanations.get("integrated_gradients")
    fv_pos = None
    if ig is not None and ig.field_values is not None and list(ig.transaction_ids) == list(ctx.transaction_ids):
        fnames = list(ig.field_names or [])
        fv_pos = np.clip(ig.field_values, 0, None)  # [T, F]
        score = fv_pos[S].sum(0)
        top = [fnames[i] for i in np.argsort(-score, kind="stable")[:max_fields] if score[i] > 0]
        citable = set(top)
    else:
        fnames = list(ctx.field_names)
        citable = set(fnames)
    field_ranked = int(fv_pos is not None)

    def weight(pos: np.ndarray, fields: list[str]) -> float:
        if fv_pos is None:
            return float(np.clip(v[pos], 0, None).sum())
        idx = [fnames.index(f) for f in fields if f in fnames]
        return float(fv_pos[np.ix_(pos, idx)].sum()) if idx else 0.0

    spec = ctx.bundle.spec
    noun = _entity_noun(spec)
    currency = (getattr(getattr(spec, "amount", None), "currency", "") or "").strip()
    missing = _missing_values(spec)
    ids = [str(t) for t in rows["transaction_id"]]
    ts = pd.to_datetime(rows["timestamp"])
    other = f"the {noun}'s other {len(baseline)} {_plural(len(baseline), 'transaction')} in this history"
    out: list[Reason] = []

    def add(kind, text, pos, fields, numbers):
        pos = np.asarray(sorted(set(int(p) for p in pos)), dtype=np.int64)
        numbers = {**numbers, "field_ranked": field_ranked}
        out.append(Reason(kind, text, [ids[p] for p in pos], list(fields), numbers, weight(pos, fields)))

    # burst ---------------------------------------------------------------------------------------
    if "time_since_prev" in citable:
        t_q = ts.iloc[q]
        near = S[(ts.iloc[S] >= t_q - pd.Timedelta(hours=burst_hours)).to_numpy()]
        if len(near) >= 3:
            span = float((t_q - ts.iloc[near].min()).total_seconds() / 60.0)
            add("burst", f"{len(near)} transactions in {_span_text(span)}", near, ["time_since_prev"],
                {"n_transactions": int(len(near)), "span_minutes": span})

    # channel -------------------------------------------------------------------------------------
    if "use_chip" in citable and "use_chip" in rows:
        online = _is_online(rows)
        n_on = int(online[S].sum())
        base_share = float(online[baseline].mean()) if len(baseline) else float("nan")
        if n_on and (not len(baseline) or base_share <= 0.5):
            text = f"{n_on} of {len(S)} were online purchases"
            if len(baseline):
                text += f", against {_pct(base_share)} of {other}"
            add("channel", text, S[online[S]], ["use_chip"],
                {"n_online": n_on, "n_cited": int(len(S)), "baseline_online_share": base_share})

    # novelty of categorical values ------------------------------------------------------------------
    novelty_fields = [("merchant", "merchants"), ("terminal", "terminals"), ("mcc", "merchant categories"),
                      ("merchant_city", "cities")]
    cat_fields = [f.name for f in getattr(spec, "fields", []) if getattr(f.kind, "value", f.kind) == "categorical"]
    known = {n for n, _ in novelty_fields} | {"merchant_state", "use_chip", "zip"}
    novelty_fields += [(f, f"{f} values") for f in cat_fields if f not in known]
    if len(baseline):
        for f, label in novelty_fields:
            if f not in citable or f not in rows:
                continue
            vals = rows[f].astype(str).to_numpy()
            seen = set(vals[baseline])
            miss = missing.get(f, "<empty>")
            new = np.array([p for p in S if vals[p] not in seen and vals[p] != miss], dtype=np.int64)
            if f == "merchant_city":
                new = new[~_is_online(rows)[new]] if len(new) else new
            if len(new):
                numbers = {"n_new": int(len(new)), "n_cited": int(len(S)), "n_baseline": int(len(baseline))}
                text = f"{len(new)} of {len(S)} at {label} not seen in {other}"
                if f == "mcc":
                    codes = sorted(set(vals[new]))
                    numbers["values"] = ", ".join(codes)
                    text = f"{len(new)} of {len(S)} in merchant categories ({', '.join(codes)}) not seen in {other}"
                add(f"new_{f}", text, new, [f], numbers)

        # location --------------------------------------------------------------------------------
        if "merchant_state" in citable and "merchant_state" in rows:
            st = rows["merchant_state"].astype(str).to_numpy()
            miss = missing.get("merchant_state", "<empty>")
            seen = set(st[baseline])
            new = np.array([p for p in S if st[p] not in seen and st[p] != miss], dtype=np.int64)
            if len(new):
                states = sorted(set(st[new]))
                add("location", f"{len(new)} of {len(S)} in {len(states)} {_plural(len(states), 'state')} "
                                f"({', '.join(states)}) not seen in {other}", new, ["merchant_state"],
                    {"n_new": int(len(new)), "n_states": len(states), "states": ", ".join(states),
                     "n_cited": int(len(S)), "n_baseline": int(len(baseline))})

        # amount ----------------------------------------------------------------------------------
        amount_fields = [f for f in ("amount", "amount_vs_history") if f in citable]
        if amount_fields:
            amt = rows["amount"].to_numpy(np.float64)
            cs = S[amt[S] > 0]
            bs = baseline[amt[baseline] > 0]
            if len(cs) and len(bs):
                mc, mb = float(np.median(amt[cs])), float(np.median(amt[bs]))
                ratio = mc / mb if mb > 0 else float("inf")
                if ratio >= 2 or ratio <= 0.5:
                    cur = f" {currency}" if currency else ""
                    text = (f"amounts {ratio:.1f}x the {noun}'s median (median {mc:,.2f}{cur} of {len(cs)} cited "
                            f"{_plural(len(cs), 'purchase')} against {mb:,.2f}{cur} of {len(bs)} other "
                            f"{_plural(len(bs), 'purchase')})")
                    add("amount", text, cs, amount_fields,
                        {"ratio": ratio, "median_cited": mc, "median_baseline": mb,
                         "n_cited": int(len(cs)), "n_baseline": int(len(bs))})

        # night -----------------------------------------------------------------------------------
        if "hour" in citable:
            h = ts.dt.hour.to_numpy()
            night = (h >= NIGHT_HOURS[0]) & (h < NIGHT_HOURS[1])
            n_n = int(night[S].sum())
            share = float(night[baseline].mean())
            if n_n and share <= 0.25:
                add("night", f"{n_n} of {len(S)} between {NIGHT_HOURS[0]:02d}:00 and {NIGHT_HOURS[1] - 1:02d}:59, "
                             f"against {_pct(share)} of {other}", S[night[S]], ["hour"],
                    {"n_night": n_n, "n_cited": int(len(S)), "baseline_night_share": share})

    # errors --------------------------------------------------------------------------------------
    if "errors" in citable and "errors" in rows:
        err = rows["errors"].fillna("").astype(str).to_numpy()
        has = np.array([p for p in S if err[p].strip() != ""], dtype=np.int64)
        if len(has):
            kinds = sorted({k for p in has for k in err[p].split("|") if k})
            add("errors", f"{len(has)} of {len(S)} with authorisation errors ({', '.join(kinds)})", has, ["errors"],
                {"n_errors": int(len(has)), "n_cited": int(len(S)), "errors": ", ".join(kinds)})

    # delayed terminal risk -----------------------------------------------------------------------
    for agg in getattr(spec, "aggregates", []) or []:
        if agg.name not in citable:
            continue
        best = None
        for w in agg.windows_days:
            rc, cc = f"{agg.name}_fraud_rate_{w}d", f"{agg.name}_count_{w}d"
            if rc not in rows or cc not in rows:
                continue
            for p in S:
                r, c = float(rows[rc].iloc[p]), float(rows[cc].iloc[p])
                if c > 0 and r > 0 and (best is None or r > best[0]):
                    best = (r, c, w, int(p))
        if best is not None:
            r, c, w, p = best
            key = agg.key
            who = "this transaction's" if p == q else "a cited transaction's"
            n_fraud = r * c
            add(agg.name, f"{who} {key} had a fraud rate of {_pct(r)} ({_fmt_num(n_fraud)} of {_fmt_num(c)} "
                          f"{_plural(int(round(c)), 'transaction')}) in the {_plural(int(w), 'day', f'{w} days')} ending "
                          f"{agg.delay_days} days before it",
                [p], [agg.name],
                {"fraud_rate": r, "count": c, "n_fraud": n_fraud, "window_days": int(w), "delay_days": int(agg.delay_days)})
        lc, dc = f"{agg.name}_fraud_run_length", f"{agg.name}_fraud_run_days"
        if agg.fraud_run and lc in rows and dc in rows:
            runs = [(float(rows[lc].iloc[p]), float(rows[dc].iloc[p]), int(p)) for p in S if float(rows[lc].iloc[p]) > 0]
            if runs:
                length, days, p = max(runs, key=lambda x: (x[0], -x[1]))
                who = "this transaction's" if p == q else "a cited transaction's"
                what = (f"its last {_fmt_num(length)} known transactions were all frauds, a run that began "
                        f"{_fmt_num(days)} days before it" if length > 1 else
                        f"its last known transaction, {_fmt_num(days)} days before it, was a fraud")
                add(f"{agg.name}_run", f"{who} {agg.key}: {what} (labels known {agg.delay_days} days late)",
                    [p], [agg.name], {"run_length": length, "run_days": days, "delay_days": int(agg.delay_days)})

    if field_ranked:  # the reason's own transactions must carry positive attribution on its fields
        out = [r for r in out if r.weight > 0]
    out.sort(key=lambda r: -r.weight)
    return out[:max_reasons]


def summary_text(reasons: list[Reason]) -> str:
    """The reasons joined into one sentence ("" if none)."""
    if not reasons:
        return ""
    s = "; ".join(r.text for r in reasons)
    return s[0].upper() + s[1:] + "."


__all__ = ["RANKING_METHODS", "Reason", "reason_codes", "summary_text"]
