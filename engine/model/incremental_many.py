"""Several entities' new transactions through the incremental scorer at once (dynamic batching).

:class:`engine.model.incremental.IncrementalScorer` steps one row through every layer with ~40
tiny NumPy operations per open window, a cost dominated by per-call overhead. When the scoring
service holds rows of several entities at once (:mod:`engine.serve.scorer`), :func:`add_many` runs
the row-wise layers (LayerNorms, projections, feed-forward layers, head) once on ``[M, J, D]`` for
the ``J`` open windows of all of them; attention still reads each window's own cache. The result
equals one :meth:`~engine.model.incremental.IncrementalScorer.add` per row to float32 rounding (tested).
``self`` below is the scorer (its private helpers and weights are used as they are).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf as _erf

from engine.data.features import piecewise_linear
from engine.model.incremental import _EntityState, _layer_norm
from engine.model.scoring import NonFiniteScoreError
from engine.model.sequences import window_of_position


def step_many(self, jobs: list[tuple]) -> np.ndarray:
    """``IncrementalScorer._step`` for ``J`` (window, new row) pairs at once, each window of a different
    entity or a different window of one entity: ``jobs[j] = (window, base [M, 1, D], t, z,
    cats, need_output)``. Every row-wise operation (LayerNorms, projections, feed-forward
    layers) runs once on ``[M, J, D]``; attention reads each window's own cache. Returns the
    final hidden states ``[M, J, D]`` (rows without ``need_output`` are not meaningful: their
    last block computes keys/values only, as in ``_step``)."""
    W = self.w
    M, H, dh, D = W.M, W.H, W.dh, W.D
    bases, gaps, ns = [], [], []
    for w, base, t, z, cats, _ in jobs:
        self._reserve(w)
        n = w.n
        if W.has_hist:
            if n:
                dev = np.float32(z - w.z_sum / n)
                feats = np.concatenate([[dev], piecewise_linear(np.array([dev]), W.hist_edges)[0]])
                base = base + feats.astype(np.float32)[None] @ W.hist_w + W.hist_b
            else:
                base = base + W.hist_none
        if W.act is not None:
            base = base + self._activity(w, t, z, cats)
            w.cats[n] = cats
        w.times[n] = t
        w.zs[n] = z
        gaps.append(np.log1p(np.maximum(t - w.times[: n + 1], 0.0).astype(np.float32) / np.float32(60.0)))
        bases.append(base)
        ns.append(n)
    x = _layer_norm(np.concatenate(bases, axis=1), *W.ln_in, W.mean)  # [M, J, D]
    if W.row_ff is not None:
        w1, b1, w2, b2 = W.row_ff
        f = x @ w1 + b1
        x = x + (0.5 * f * (1.0 + _erf(f * self._gelu_c))) @ w2 + b2
    last = len(W.blocks) - 1
    scale = np.float32(math.sqrt(dh))
    for li, B in enumerate(W.blocks):
        qkv = _layer_norm(x, *B["ln1"], W.mean) @ B["qkv_w"] + B["qkv_b"]  # [M, J, D] @ [M, D, 3D]
        a = np.zeros((M, len(jobs), D), np.float32)
        for j, (w, _, _, _, _, need) in enumerate(jobs):
            n = ns[j]
            w.keys[:, li, :, n] = qkv[:, j, D : 2 * D].reshape(M, H, dh)
            w.values[:, li, :, n] = qkv[:, j, 2 * D :].reshape(M, H, dh)
            if li == last and not need:
                continue
            K, V = w.keys[:, li, :, : n + 1], w.values[:, li, :, : n + 1]  # [M, H, n+1, dh]
            sc = (K @ qkv[:, j, :D].reshape(M, H, dh, 1))[..., 0] / scale - B["slope"] * gaps[j]  # [M, H, n+1]
            sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
            a[:, j] = (((sc / sc.sum(axis=-1, keepdims=True))[:, :, None, :] @ V)).reshape(M, D)
        x = x + a @ B["out_w"] + B["out_b"]
        f = _layer_norm(x, *B["ln2"], W.mean) @ B["ff1_w"] + B["ff1_b"]
        f = 0.5 * f * (1.0 + _erf(f * self._gelu_c))
        x = x + f @ B["ff2_w"] + B["ff2_b"]
    for (w, _, _, z, _, _), n in zip(jobs, ns):
        w.n = n + 1
        w.z_sum += z
    return x


def add_many(self, items: list[tuple[str, object]]) -> np.ndarray:
    """Score one new transaction for each of several *distinct* entities at once (the dynamic
    batches of :mod:`engine.serve.scorer`): ``items = [(entity_id, row), ...]``; returns
    ``[N]`` float64 logits, equal to calling ``IncrementalScorer.add`` on each in turn (to float32 rounding;
    tested). The row-wise layers run once over all the entities' open windows
    (:func:`step_many`), which costs far less than one :meth:`add` per row.

    Raises:
        ValueError: two items of one entity, or a transaction older than its entity's previous one.
        NonFiniteScoreError: a NaN or infinite logit (``.rows`` = the positions in ``items``);
            the entities' caches already hold their rows, so the scorer must be discarded.
    """
    if len(items) == 1:
        return np.array([self.add(*items[0])])
    keys = [str(e) for e, _ in items]
    if len(set(keys)) != len(keys):
        raise ValueError("add_many: each entity at most once per call (its rows depend on each other)")
    T = self.cfg.context_length
    jobs, owners, states = [], [], []
    for i, (e, (_, row)) in enumerate(zip(keys, items)):
        st = self.entities.setdefault(e, _EntityState())
        p = st.n
        base, t, z, cats = self._row_embedding(row, st)
        self._open_windows(st, p)
        k_score = int(window_of_position(p, T, self.cfg.min_history)) * self.S
        for w in st.windows:
            jobs.append((w, base, t, z, cats, w.start == k_score))
            owners.append(i if w.start == k_score else -1)
        states.append((st, p, t))
    h = step_many(self, jobs)  # [M, J, D]
    sel = [j for j, o in enumerate(owners) if o >= 0]
    W = self.w
    per_member = _layer_norm(h[:, sel], *W.ln_out, W.mean) @ W.head_w + W.head_b  # [M, N, 1]
    logits = np.empty(len(items), np.float64)
    logits[[owners[j] for j in sel]] = per_member[:, :, 0].astype(np.float64).sum(axis=0) / W.M
    for st, p, t in states:
        st.n, st.last_time = p + 1, t
    bad = np.flatnonzero(~np.isfinite(logits))
    if len(bad):
        raise NonFiniteScoreError(
            f"the model gave a NaN or infinite score for entity {keys[bad[0]]}; the model or its input is broken, "
            "so no score is reported (discard this scorer)", bad)
    return logits
