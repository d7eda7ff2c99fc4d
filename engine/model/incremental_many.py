"""Several entities' new transactions through the incremental scorer at once (dynamic batching).

When the scoring service holds rows of several entities at once (:mod:`engine.serve.scorer`),
:func:`add_many` embeds the ``N`` rows together (:func:`rows_embedding`: ~25 NumPy operations on
``[M, N, D]`` instead of ~15 per row) and then steps each open window of each entity with the
compiled window step (:mod:`engine.model.incremental_kernel`). The result equals one
:meth:`~engine.model.incremental.IncrementalScorer.add` per row to float32 rounding (tested).
``self`` below is the scorer (its private helpers and weights are used as they are).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from engine.model.incremental import _EntityState
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


def add_many(self, items: list[tuple[str, object]]) -> np.ndarray:
    """Score one new transaction for each of several *distinct* entities at once (the dynamic
    batches of :mod:`engine.serve.scorer`): ``items = [(entity_id, row), ...]``; returns
    ``[N]`` float64 logits, equal to calling ``IncrementalScorer.add`` on each in turn (to float32 rounding;
    tested). The rows are embedded together (:func:`rows_embedding`), then each entity's open
    windows are stepped by the compiled kernel.

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
    if len(items) == 1:  # one row: the one-row embedding has less overhead
        return np.array([self.add(*items[0])])
    T = self.cfg.context_length
    states = [self.entities.get(e) or _EntityState() for e in keys]
    base, t, z, cats = rows_embedding(self, [r for _, r in items], np.array([st.last_time for st in states]))
    logits = np.empty(len(items), np.float64)
    for i, (e, st) in enumerate(zip(keys, states)):
        self.entities[e] = st
        p = st.n
        self._open_windows(st, p)
        k_score = (0 if p < T else (p - T) // self.S + 1) * self.S  # sequences.window_of_position
        bi = np.ascontiguousarray(base[:, i])  # [M, D]
        ti, zi = float(t[i]), float(z[i])
        for w in st.windows:  # one compiled step per open window (engine.model.incremental_kernel)
            out = self._step(bi, w, ti, zi, need_output=w.start == k_score, cats=cats[i])
            if w.start == k_score:
                logits[i] = out
        st.n, st.last_time = p + 1, ti
    bad = np.flatnonzero(~np.isfinite(logits))
    if len(bad):
        raise NonFiniteScoreError(
            f"the model gave a NaN or infinite score for entity {keys[bad[0]]}; the model or its input is broken, "
            "so no score is reported (discard this scorer)", bad)
    return logits
