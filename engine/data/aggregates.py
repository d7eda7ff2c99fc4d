"""Delayed-label aggregates of another key (e.g. terminal risk), computed once per file.

See :class:`engine.data.spec.DelayedAggregateSpec` for the definition. The computation is
vectorised: rows are sorted by (key, time) into one int64 sort key ``key_code * span + t``, so
a window ``[t - delay - w, t - delay)`` of the same key is a pair of ``searchsorted`` look-ups
into that array, and counts/frauds are differences of cumulative sums.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from engine.data.spec import DatasetSpec, DelayedAggregateSpec

DAY_S = 86400


def delayed_aggregates(frame: pd.DataFrame, agg: DelayedAggregateSpec) -> pd.DataFrame:
    """Columns ``agg.columns()`` for every row of a canonical frame (float64, same index).

    ``count``: number of same-key transactions in the window; ``fraud_rate``: frauds / count
    (0 when count is 0). Rows with unknown label count as transactions, not as frauds.
    """
    key_codes = pd.factorize(frame[agg.key].astype(str), sort=False)[0].astype(np.int64)
    t = frame["timestamp"].to_numpy("datetime64[s]").astype(np.int64)
    t = t - t.min()
    span = int(t.max()) + (max(agg.windows_days) + agg.delay_days + 2) * DAY_S + 1
    sk = key_codes * span + t
    order = np.argsort(sk, kind="stable")
    sorted_sk = sk[order]
    y = frame["label"].to_numpy(dtype="float64", na_value=np.nan) if "label" in frame else np.full(len(frame), np.nan)
    fraud_sorted = np.nan_to_num(y[order], nan=0.0)
    cum_fraud = np.concatenate([[0.0], np.cumsum(fraud_sorted)])
    out = {}
    floor = (key_codes * span)[order]  # queries (in sorted order: fast) clamped to the key's own range
    hi_q = np.maximum(sorted_sk - agg.delay_days * DAY_S, floor)
    hi = np.searchsorted(sorted_sk, hi_q, side="left")
    for w in agg.windows_days:
        lo = np.searchsorted(sorted_sk, np.maximum(hi_q - w * DAY_S, floor), side="left")
        count_s = (hi - lo).astype(np.float64)
        rate_s = np.where(count_s > 0, (cum_fraud[hi] - cum_fraud[lo]) / np.maximum(count_s, 1), 0.0)
        count, rate = np.empty_like(count_s), np.empty_like(rate_s)
        count[order], rate[order] = count_s, rate_s  # back to frame order
        out[f"{agg.name}_count_{w}d"] = count
        out[f"{agg.name}_fraud_rate_{w}d"] = rate
    if agg.recent_labels or agg.fraud_run:
        out.update(_label_history(sorted_sk, floor, hi, fraud_sorted, t[order], order, agg))
    return pd.DataFrame(out, index=frame.index)[agg.columns()]


def _label_history(sorted_sk, floor, hi, fraud_sorted, t_sorted, order, agg) -> dict[str, np.ndarray]:
    """``recent_fraud_share_k`` and the fraud-run pair (see :class:`DelayedAggregateSpec`).

    All arrays are in (key, time) sorted order; ``hi[i]`` is one past the key's last
    transaction before ``t_i - delay``, ``gstart[i]`` the key's first row, so the known
    transactions of row ``i``'s key are ``[gstart[i], hi[i])``.
    """
    n = len(sorted_sk)
    gstart = np.searchsorted(sorted_sk, floor, side="left")
    n_known = hi - gstart
    cum = np.concatenate([[0.0], np.cumsum(fraud_sorted)])
    out: dict[str, np.ndarray] = {}

    def back(x: np.ndarray) -> np.ndarray:
        y = np.empty_like(x)
        y[order] = x
        return y

    for k in agg.recent_labels:
        kk = np.minimum(n_known, k)
        share = np.where(kk > 0, (cum[hi] - cum[hi - kk]) / np.maximum(kk, 1), 0.0)
        out[f"{agg.name}_recent_fraud_share_{k}"] = back(share)
    if agg.fraud_run:
        idx = np.arange(n)
        is_fraud = fraud_sorted > 0
        first_of_key = np.r_[True, floor[1:] != floor[:-1]]
        prev_fraud = np.r_[False, is_fraud[:-1]] & ~first_of_key
        run_first = np.maximum.accumulate(np.where(is_fraud & ~prev_fraud, idx, -1))  # valid where is_fraud
        safe = np.maximum(hi - 1, 0)  # the key's last known transaction (valid where n_known > 0)
        has_run = (n_known > 0) & is_fraud[safe]
        length = np.where(has_run, safe - run_first[safe] + 1, 0).astype(np.float64)
        days = np.where(has_run, (t_sorted - t_sorted[np.maximum(run_first[safe], 0)]) / DAY_S, 0.0)
        out[f"{agg.name}_fraud_run_length"] = back(length)
        out[f"{agg.name}_fraud_run_days"] = back(days)
    return out


def add_aggregates(frame: pd.DataFrame, spec: DatasetSpec) -> pd.DataFrame:
    """Return ``frame`` with every aggregate of ``spec`` added as columns (no-op without any)."""
    if not spec.aggregates:
        return frame
    parts = [frame] + [delayed_aggregates(frame, a) for a in spec.aggregates]
    return pd.concat(parts, axis=1)
