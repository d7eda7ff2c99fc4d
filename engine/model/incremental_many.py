"""Several entities' new transactions through the incremental scorer at once (dynamic batching).

:class:`engine.model.incremental.IncrementalScorer` steps one row through every layer with ~40
tiny NumPy operations per open window, a cost dominated by per-call overhead. When the scoring
service holds rows of several entities at once (:mod:`engine.serve.scorer`), :func:`add_many`
embeds the ``N`` rows together (:func:`rows_embedding`) and :func:`step_many` runs every layer
once on ``[M, J, D]`` for the ``J`` open windows of all of them: the window-dependent fields
(``amount_vs_history``, the recent-activity and first-seen fields) and the attention read each
window's cached rows through arrays padded to the longest window of the batch (``[J, N_max]``,
``[M, J, H, N_max, dh]``) with the padding masked out. The result equals one
:meth:`~engine.model.incremental.IncrementalScorer.add` per row to float32 rounding (tested).
``self`` below is the scorer (its private helpers and weights are used as they are).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy.special import erf as _erf

from engine.data.features import piecewise_linear
from engine.model.incremental import _EntityState, _layer_norm, _Window
from engine.model.scoring import NonFiniteScoreError


def rows_embedding(self, rows: list, last_times: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:meth:`IncrementalScorer._row_embedding` for ``N`` rows of distinct entities at once.

    Args:
        rows: ``N`` canonical rows (dicts).
        last_times: ``[N]`` float64 seconds of each entity's previous transaction (NaN: none).
    Returns:
        ``base [M, N, D]`` float32 (summed field embeddings without the window-dependent fields),
        ``t [N]`` float64 seconds, ``z [N]`` float64 standardised log amounts, ``cats [N, C]``
        int64 first-seen categorical values.
    Raises:
        ValueError: a row older than its entity's previous transaction (``.args[1]`` = its position).
    """
    W = self.w
    encs = [self.bundle.encoder.transform_row(r) for r in rows]
    t = np.array([e.time_s[0] for e in encs], np.float64)
    has_prev = ~np.isnan(last_times)
    older = np.flatnonzero(has_prev & (t < np.where(has_prev, last_times, -np.inf)))
    if len(older):
        i = int(older[0])
        raise ValueError(f"transaction at {pd.Timestamp(t[i], unit='s')} is older than the entity's previous one", i)
    num = np.concatenate([e.num for e in encs])  # [N, Fn] float32
    cat = np.concatenate([e.cat for e in encs])  # [N, Fc] int64
    x = W.static_bias + num @ W.num_w  # [N, Fn] @ [M, Fn, D] -> [M, N, D]
    if W.ple is not None:
        cols, lo, scale, pw = W.ple
        code = np.clip((num[:, cols, None] - lo) * scale, 0.0, 1.0).astype(np.float32)  # [N, P, K]
        x = x + code.reshape(len(rows), -1) @ pw  # [N, P*K] @ [M, P*K, D]
    if len(W.cat_offsets):
        x = x + np.add.reduce(W.cat_emb[:, cat * W.cat_keep + W.cat_offsets], axis=2)  # [M, N, Fc, D] -> [M, N, D]
    if W.multi:
        multi = np.concatenate([e.multi for e in encs])  # [N, sum(widths)]
        start = 0
        for wmat, width in zip(W.multi, W.multi_w):
            x = x + multi[:, start : start + width] @ wmat  # [N, w] @ [M, w, D] -> [M, N, D]
            start += width
    # time since the entity's previous transaction (the no-previous bin when there is none)
    gap = np.maximum(t - np.where(has_prev, last_times, t), 0.0)  # [N] seconds
    idx = np.where(has_prev, np.searchsorted(W.gap_edges, gap, side="left"), len(W.gap_edges) + 1)
    x = x + W.gap_bins[:, idx]  # [M, N, D]
    if has_prev.any():
        g = (np.log1p(gap / 60.0) / 5.0).astype(np.float32)  # [N]
        lin = W.gap_lin_w * g[None, :, None] + W.gap_lin_b  # [M, N, D]
        x = x + np.where(has_prev[None, :, None], lin, np.float32(0.0))
    cats = cat[:, W.act["cols"]] if W.act is not None else np.zeros((len(rows), 0), np.int64)
    return x.astype(np.float32), t, num[:, 0].astype(np.float64), cats


def _activity_many(self, t: np.ndarray, z: np.ndarray, cats: np.ndarray, ns: np.ndarray, Tp: np.ndarray,
                   Zp: np.ndarray, Cp: np.ndarray) -> np.ndarray:
    """``[M, J, D]``: :meth:`IncrementalScorer._activity` of ``J`` new rows (``t``, ``z`` ``[J]``
    float64, ``cats [J, C]``) against their windows' cached rows, padded to ``N_max``: times ``Tp
    [J, N_max]`` (``-inf`` on padding), amounts ``Zp [J, N_max]`` float64 (0 on padding), first-seen
    values ``Cp [J, N_max, C]`` (-1 on padding), ``ns [J]`` cached rows per window."""
    A = self.w.act
    J = len(ns)
    dt = t[:, None] - Tp  # [J, N_max] seconds; +inf on padding, so never within a window
    cols = []
    for win in A["windows"]:
        within = dt <= win
        c = within.sum(axis=1)  # the rows within ``win`` (a suffix of the window)
        s = (Zp * within).sum(axis=1)
        cols += [np.log1p(c) / 3.0, np.where(c > 0, z - s / np.maximum(c, 1), 0.0)]
    two = ns >= 2
    nn = np.maximum(ns, 1)
    mean = Zp.sum(axis=1) / nn
    dz = np.where(np.isfinite(Tp), Zp - mean[:, None], 0.0)
    zdev = np.clip((z - mean) / np.sqrt((dz * dz).sum(axis=1) / nn + 0.25), -6.0, 6.0)
    prev2 = Tp[np.arange(J), np.maximum(ns - 2, 0)]
    gap2 = np.log1p(np.maximum(t - np.where(two, prev2, t), 0.0) / 60.0) / 5.0
    cols += [np.where(two, zdev, 0.0), np.where(two, gap2, 0.0), two.astype(np.float64)]
    r = np.stack(cols, axis=1).astype(np.float32)  # [J, A]
    some = (ns > 0)
    seen = np.concatenate([((Cp != cats[:, None, :]).all(axis=1) & some[:, None]), some[:, None]],
                          axis=1).astype(np.float32)  # [J, C + 1]
    out = r @ A["recent_w"] + A["recent_b"] + seen @ A["seen_w"] + A["seen_b"]  # [J, A] @ [M, A, D] -> [M, J, D]
    if A["ple"] is not None:  # piecewise-linear codes of the inputs, as ActivityEncoder.forward
        lo, scale, pw = A["ple"]
        code = np.clip((r[:, :, None] - lo) * scale, 0.0, 1.0).astype(np.float32)  # [J, A, K]
        out = out + code.reshape(J, -1) @ pw  # [J, A*K] @ [M, A*K, D] -> [M, J, D]
    return out


def step_many(self, wins: list[_Window], of_row: np.ndarray, base: np.ndarray, t: np.ndarray, z: np.ndarray,
              cats: np.ndarray) -> np.ndarray:
    """``IncrementalScorer._step`` for ``J`` (window, new row) pairs at once, each window of a
    different entity or a different window of one entity.

    Args:
        wins: the ``J`` windows (their caches receive the new rows).
        of_row: ``[J]`` int, the row (index into the next arguments) each window receives.
        base: ``[M, N, D]`` float32 row embeddings (:func:`rows_embedding`).
        t, z: ``[N]`` float64 times (seconds) and standardised log amounts; ``cats [N, C]`` int64.
    Returns:
        the final hidden states ``[M, J, D]`` float32 of every (window, row) pair.
    """
    W = self.w
    M, H, dh, D = W.M, W.H, W.dh, W.D
    J = len(wins)
    for w in wins:
        self._reserve(w)
    ns = np.array([w.n for w in wins], np.int64)  # [J] cached rows per window
    Np = int(ns.max()) + 1  # positions up to and including the new row
    t, z, base = t[of_row], z[of_row], base[:, of_row]  # [J], [J], [M, J, D]
    C = cats.shape[1]
    cj = cats[of_row]  # [J, C]
    Tp = np.full((J, Np), -np.inf)  # [J, Np] the cached rows' times, then the new row's
    Zp = np.zeros((J, Np))
    Cp = np.full((J, Np, C), -1, np.int64)
    for j, w in enumerate(wins):
        n = w.n
        Tp[j, :n] = w.times[:n]
        Zp[j, :n] = w.zs[:n]
        Cp[j, :n] = w.cats[:n]
    if W.has_hist:  # the amount against the window's earlier amounts
        dev = (z - np.array([w.z_sum for w in wins]) / np.maximum(ns, 1)).astype(np.float32)  # [J]
        feats = np.concatenate([dev[:, None], piecewise_linear(dev, W.hist_edges)], axis=1)  # [J, 1 + K-1]
        hist = feats @ W.hist_w + W.hist_b  # [M, J, D]
        base = base + np.where((ns > 0)[None, :, None], hist, W.hist_none)
    if W.act is not None:
        base = base + _activity_many(self, t, z, cj, ns, Tp, Zp, Cp)  # the new rows' column is still padding
    rows = np.arange(J)
    Tp[rows, ns] = t
    valid = np.arange(Np)[None, :] <= ns[:, None]  # [J, Np]
    gaps = np.where(valid, np.log1p(np.maximum(t[:, None] - Tp, 0.0).astype(np.float32) / np.float32(60.0)),
                    np.float32(0.0))  # [J, Np]
    x = _layer_norm(base, *W.ln_in, W.mean)  # [M, J, D]
    if W.row_ff is not None:
        w1, b1, w2, b2 = W.row_ff
        f = x @ w1 + b1
        x = x + (0.5 * f * (1.0 + _erf(f * self._gelu_c))) @ w2 + b2  # exact GELU, as Block.ff
    scale = np.float32(math.sqrt(dh))
    masked = np.where(valid, np.float32(0.0), np.float32(-np.inf))[None, :, None, :]  # [1, J, 1, Np]
    Kp = np.zeros((M, J, H, Np, dh), np.float32)
    Vp = np.zeros((M, J, H, Np, dh), np.float32)
    for li, B in enumerate(W.blocks):
        qkv = _layer_norm(x, *B["ln1"], W.mean) @ B["qkv_w"] + B["qkv_b"]  # [M, J, D] @ [M, D, 3D] -> [M, J, 3D]
        k_new = qkv[:, :, D : 2 * D].reshape(M, J, H, dh)
        v_new = qkv[:, :, 2 * D :].reshape(M, J, H, dh)
        for j, w in enumerate(wins):
            n = w.n
            w.keys[:, li, :, n] = k_new[:, j]
            w.values[:, li, :, n] = v_new[:, j]
            Kp[:, j, :, : n + 1] = w.keys[:, li, :, : n + 1]
            Vp[:, j, :, : n + 1] = w.values[:, li, :, : n + 1]
        q = qkv[:, :, :D].reshape(M, J, H, dh, 1)
        sc = (Kp @ q)[..., 0] / scale - B["slope"][:, None] * gaps[None, :, None, :] + masked  # [M, J, H, Np]
        sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
        p = sc / sc.sum(axis=-1, keepdims=True)
        a = (p[..., None, :] @ Vp).reshape(M, J, D)  # [M, J, H, 1, Np] @ [M, J, H, Np, dh] -> [M, J, D]
        x = x + a @ B["out_w"] + B["out_b"]
        f = _layer_norm(x, *B["ln2"], W.mean) @ B["ff1_w"] + B["ff1_b"]
        f = 0.5 * f * (1.0 + _erf(f * self._gelu_c))  # exact GELU (nn.GELU default)
        x = x + f @ B["ff2_w"] + B["ff2_b"]
    for j, w in enumerate(wins):
        n = w.n
        w.times[n] = t[j]
        w.zs[n] = z[j]
        if C:
            w.cats[n] = cj[j]
        w.n = n + 1
        w.z_sum += float(z[j])
    return x


def add_many(self, items: list[tuple[str, object]]) -> np.ndarray:
    """Score one new transaction for each of several *distinct* entities at once (the dynamic
    batches of :mod:`engine.serve.scorer`): ``items = [(entity_id, row), ...]``; returns
    ``[N]`` float64 logits, equal to calling ``IncrementalScorer.add`` on each in turn (to float32 rounding;
    tested). The rows are embedded together (:func:`rows_embedding`) and every layer runs once
    over all the entities' open windows (:func:`step_many`), which costs far less than one
    :meth:`add` per row.

    Raises:
        ValueError: two items of one entity, or a transaction older than its entity's previous one
            (raised before any cache changes).
        NonFiniteScoreError: a NaN or infinite logit (``.rows`` = the positions in ``items``);
            the entities' caches already hold their rows, so the scorer must be discarded.
    """
    keys = [str(e) for e, _ in items]
    if len(set(keys)) != len(keys):
        raise ValueError("add_many: each entity at most once per call (its rows depend on each other)")
    if not items:
        return np.zeros(0, np.float64)
    if len(items) == 1:  # one row: the one-row step has less overhead than the padded arrays
        return np.array([self.add(*items[0])])
    T = self.cfg.context_length
    states = [self.entities.get(e) or _EntityState() for e in keys]
    base, t, z, cats = rows_embedding(self, [r for _, r in items], np.array([st.last_time for st in states]))
    wins, of_row, owner = [], [], []
    for i, (e, st) in enumerate(zip(keys, states)):
        self.entities[e] = st
        p = st.n
        self._open_windows(st, p)
        k_score = (0 if p < T else (p - T) // self.S + 1) * self.S  # sequences.window_of_position
        for w in st.windows:
            wins.append(w)
            of_row.append(i)
            owner.append(w.start == k_score)
    h = step_many(self, wins, np.asarray(of_row), base, t, z, cats)  # [M, J, D]
    sel = np.flatnonzero(owner)  # one scoring window per row, in row order
    W = self.w
    per_member = _layer_norm(h[:, sel], *W.ln_out, W.mean) @ W.head_w + W.head_b  # [M, N, 1]
    logits = np.empty(len(items), np.float64)
    logits[np.asarray(of_row)[sel]] = per_member[:, :, 0].astype(np.float64).sum(axis=0) / W.M
    for st, ti in zip(states, t):
        st.n, st.last_time = st.n + 1, float(ti)
    bad = np.flatnonzero(~np.isfinite(logits))
    if len(bad):
        raise NonFiniteScoreError(
            f"the model gave a NaN or infinite score for entity {keys[bad[0]]}; the model or its input is broken, "
            "so no score is reported (discard this scorer)", bad)
    return logits
