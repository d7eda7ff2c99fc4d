"""Causal per-entity features for a tabular baseline, derived from any dataset spec.

What a practitioner's gradient-boosted baseline gets (Le Borgne et al. 2022, Fraud Detection
Handbook, ch. 3.3 "Baseline feature transformation", generalised from the Handbook's customer
and terminal windows to any entity and any categorical field of the spec):

=====================================  ==================================================================
column                                 meaning (``E`` = the row's entity, earlier = before it in the
                                       canonical order: earlier timestamp, or same timestamp and
                                       smaller row number)
=====================================  ==================================================================
``ef_n_{w}``                           count of E's earlier transactions with ``t_row - w < t <= t_row``,
                                       for ``w`` in :data:`WINDOWS` (1 h, 24 h, 7 d, 30 d)
``ef_amount_sum_{w}``                  sum of their amounts (currency of the file)
``ef_amount_mean_{w}``                 their mean amount (NaN when the count is 0)
``ef_n_past``                          count of all of E's earlier transactions
``ef_amount_z``                        ``(amount - mean) / std`` over all of E's earlier amounts
                                       (population std; NaN with fewer than 2 earlier transactions or
                                       std 0)
``ef_amount_vs_mean_{field}``          amount / mean amount of E's earlier transactions with the same
                                       value of categorical ``field`` (NaN when there is none or that
                                       mean is 0)
``ef_new_{field}``                     1.0 when E has no earlier transaction with this value of
                                       categorical ``field`` (new merchant, new MCC), else 0.0
``ef_dt_prev_s``, ``ef_dt_prev2_s``    seconds since E's previous and second-previous transaction
                                       (NaN when there is none)
``ef_hour``, ``ef_weekday``            hour of day 0-23 and weekday 0 = Monday (timestamps are UTC)
=====================================  ==================================================================

Strictly causal: a row's features read only the row itself and E's earlier rows, so changing or
adding later rows never changes them (tested). Vectorised: one int64 sort key
``entity_code * span + t`` per file, windows are ``searchsorted`` look-ups and sums are
differences of cumulative sums, as in :mod:`engine.data.aggregates`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from engine.data.spec import DatasetSpec, FieldKind

#: window name -> length in seconds
WINDOWS: dict[str, int] = {"1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}
_INT63 = 2**62


def _sort_keys(frame: pd.DataFrame, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(order, key)``: canonical order (entity, time, row_number) and its int64 key.

    ``key[i] = codes[order[i]] * span + t`` with ``t`` in whole seconds from the file's first
    transaction, so one entity's rows are one contiguous, time-ordered run of ``key``.

    Raises:
        ValueError: the key would overflow int64 (more than about 4e18 / span entities).
    """
    t = frame["timestamp"].to_numpy("datetime64[s]").astype(np.int64)
    t = t - (t.min() if len(t) else 0)
    span = int(t.max() if len(t) else 0) + max(WINDOWS.values()) + 1
    n_codes = int(codes.max()) + 1 if len(codes) else 0
    if n_codes * span >= _INT63:
        raise ValueError(
            f"entity features: {n_codes} entities over {span} s overflow the int64 sort key; "
            "score the file in parts"
        )
    rn = frame["row_number"].to_numpy(np.int64) if "row_number" in frame else np.arange(len(frame))
    t_ns = frame["timestamp"].to_numpy("datetime64[ns]").astype(np.int64)
    order = np.lexsort((rn, t_ns, codes))  # whole seconds never decrease along this order
    return order, codes[order] * span + t[order]


def _group_start(codes_sorted: np.ndarray) -> np.ndarray:
    """For each sorted row, the sorted index of its entity's first row."""
    n = len(codes_sorted)
    first = np.ones(n, dtype=bool)
    first[1:] = codes_sorted[1:] != codes_sorted[:-1]
    return np.maximum.accumulate(np.where(first, np.arange(n), 0))


def _earlier_in_group(start: np.ndarray, values_sorted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per sorted row: count and sum of ``values`` over the earlier rows of the same group
    (``start``: :func:`_group_start` of the group codes)."""
    n = len(start)
    cum = np.concatenate([[0.0], np.cumsum(values_sorted)])
    idx = np.arange(n)
    return (idx - start).astype(np.float64), cum[idx] - cum[start]


def causal_entity_features(frame: pd.DataFrame, spec: DatasetSpec) -> pd.DataFrame:
    """The table in the module docstring for every row of a canonical frame.

    Args:
        frame: canonical transaction frame (:func:`engine.data.io.read_transactions`): columns
            ``entity_id``, ``timestamp`` (naive UTC), ``amount`` (float64, file currency),
            ``row_number`` and the spec's categorical fields; any row order.
        spec: the dataset spec; its categorical fields (model inputs or not) get the
            ``ef_amount_vs_mean_*`` and ``ef_new_*`` columns.

    Returns:
        float64 DataFrame with the same index as ``frame``, columns in the order of the table.

    Raises:
        KeyError: a column the spec names is missing from ``frame``.
        ValueError: the int64 sort key would overflow (see :func:`_sort_keys`).
    """
    n = len(frame)
    codes = pd.factorize(frame["entity_id"].astype(str), sort=False)[0].astype(np.int64)
    order, key = _sort_keys(frame, codes)
    amount = frame["amount"].to_numpy(np.float64)[order]
    codes_s = codes[order]
    cum = np.concatenate([[0.0], np.cumsum(amount)])
    idx = np.arange(n)
    out: dict[str, np.ndarray] = {}
    for name, w in WINDOWS.items():
        # earlier rows j < i of the same entity with t_j > t_i - w; key is entity-major, so
        # the window [key_i - w + 1, key_i] never reaches the previous entity's rows
        lo = np.searchsorted(key, key - w, side="right")
        cnt = (idx - lo).astype(np.float64)
        s = cum[idx] - cum[lo]
        out[f"ef_n_{name}"] = cnt
        out[f"ef_amount_sum_{name}"] = s
        with np.errstate(invalid="ignore", divide="ignore"):
            out[f"ef_amount_mean_{name}"] = np.where(cnt > 0, s / np.maximum(cnt, 1), np.nan)
    start = _group_start(codes_s)
    n_past, s1 = _earlier_in_group(start, amount)
    _, s2 = _earlier_in_group(start, amount * amount)
    out["ef_n_past"] = n_past
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = s1 / n_past
        var = np.maximum(s2 / n_past - mean * mean, 0.0)
        std = np.sqrt(var)
        z = (amount - mean) / std
    out["ef_amount_z"] = np.where((n_past >= 2) & (std > 1e-9 * np.maximum(np.abs(mean), 1.0)), z, np.nan)
    for f in spec.fields_of(FieldKind.CATEGORICAL):
        vals = pd.factorize(frame[f.name].astype(str).to_numpy()[order], sort=False)[0].astype(np.int64)
        # (entity, value) groups in canonical order: a stable sort by value keeps time order
        pair = codes_s * (int(vals.max()) + 1 if n else 1) + vals
        g_order = np.argsort(pair, kind="stable")
        cnt_g, sum_g = _earlier_in_group(_group_start(pair[g_order]), amount[g_order])
        cnt_v, sum_v = np.empty(n), np.empty(n)
        cnt_v[g_order], sum_v[g_order] = cnt_g, sum_g
        with np.errstate(invalid="ignore", divide="ignore"):
            past_mean = sum_v / cnt_v
            ok = (cnt_v > 0) & (np.abs(past_mean) > 1e-9)
            out[f"ef_amount_vs_mean_{f.name}"] = np.where(ok, amount / np.where(ok, past_mean, 1.0), np.nan)
        out[f"ef_new_{f.name}"] = (cnt_v == 0).astype(np.float64)
    t_s = frame["timestamp"].to_numpy("datetime64[ns]").astype(np.int64)[order] / 1e9
    for k, name in ((1, "ef_dt_prev_s"), (2, "ef_dt_prev2_s")):
        prev = idx - k
        ok = prev >= start
        out[name] = np.where(ok, t_s - t_s[np.maximum(prev, 0)], np.nan)
    ts = pd.DatetimeIndex(frame["timestamp"].to_numpy()[order])
    out["ef_hour"] = ts.hour.to_numpy(np.float64)
    out["ef_weekday"] = ts.day_of_week.to_numpy(np.float64)
    result = np.empty((n, len(out)), dtype=np.float64)
    for j, v in enumerate(out.values()):
        result[order, j] = v  # back to frame order
    return pd.DataFrame(result, index=frame.index, columns=list(out))
