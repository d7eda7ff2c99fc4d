"""Incremental scoring: one new transaction for an entity whose history is already cached.

Exactly the windowed scores of :mod:`engine.model.sequences` (tested equal to whole-file scoring),
at O(T) cost per new transaction instead of a forward pass over the whole window.

How: a transaction at position ``p`` belongs to every window ``k`` with ``k*S <= p < k*S + T``
(at most ``ceil(T / S)`` of them) and is *scored* in window ``k(p)``. Its hidden states differ
between windows (each window is a separate causal context), so the scorer keeps, per entity, a
key/value cache for every window the next transaction can belong to. A new transaction is
embedded once (its row embedding does not depend on the window), then run through the layers
once per open window as a single query against that window's cache; the logit comes from
window ``k(p)``. Windows that can receive no more transactions are dropped, new ones are opened
when ``p`` reaches their start — so no window is ever re-encoded.

A seed ensemble (:class:`engine.model.ensemble.SeedEnsemble`) of ``M`` members runs them side by
side: every weight is stacked on a leading member axis ``M``; the row embedding is one NumPy
operation over ``[M, ...]`` per field group, the window step one compiled call for all members
(:mod:`engine.model.incremental_kernel`); a window's times, amounts and first-seen values are
shared (every member reads the same rows), its keys/values are ``[M, L, H, capacity, dh]``. The score is the members' mean
logit, as the ensemble's. One model is ``M = 1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as Fnn

from engine.model.checkpoint import ModelBundle
from engine.model.ensemble import members_of
from engine.model.incremental_kernel import KernelWeights, compile_kernel
from engine.model.scoring import NonFiniteScoreError
from engine.model.sequences import window_of_position


@dataclass
class _Window:
    start: int  # entity position of the window's first transaction
    keys: np.ndarray  # [M, L, H, capacity, dh] float32, rows [:n] filled; capacity doubles up to T
    values: np.ndarray  # [M, L, H, capacity, dh] float32
    times: np.ndarray  # [capacity] float64 seconds of the cached rows
    zs: np.ndarray  # [capacity] float32 standardised log amounts of the cached rows (activity fields)
    cats: np.ndarray  # [capacity, C] int64 first-seen categorical values of the cached rows
    n: int = 0  # cached rows
    z_sum: float = 0.0  # sum of the standardised log amounts of the cached rows


@dataclass
class _EntityState:
    n: int = 0  # transactions seen
    last_time: float = float("nan")
    windows: list[_Window] = field(default_factory=list)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32)


class _Weights:
    """The parameters of ``M`` models of one configuration (an ensemble's members, or one model)
    as NumPy float32 arrays stacked on a leading member axis, laid out for one-row steps on
    activations ``[M, 1, D]``: each ``W`` transposed to ``[M, in, out]``, each bias ``[M, 1, out]``.
    The row embedding uses them in NumPy; :class:`engine.model.incremental_kernel.KernelWeights`
    lays the rest out for the compiled window step."""

    def __init__(self, models: list):
        def stack(get) -> np.ndarray:
            return np.stack([get(m) for m in models])

        def row(get) -> np.ndarray:  # [M, 1, out]
            return stack(get)[:, None, :]

        def mat(get) -> np.ndarray:  # torch Linear weight [out, in] -> [M, in, out]
            return stack(lambda m: _np(get(m)).T.copy())

        model, rows = models[0], models[0].rows  # input layout and shapes (equal in every member)
        self.M, self.D = len(models), model.cfg.d_model
        self.static_bias = row(lambda m: _np(m.rows.field_bias.sum(0) + m.rows.num_b.sum(0)))  # [M, 1, D]
        self.num_w = stack(lambda m: _np(m.rows.num_w))  # [M, Fn, D]
        self.ple = None if rows.ple_w is None else (  # piecewise-linear codes of some num columns
            rows.ple_cols.numpy(), rows.ple_lo.numpy(), rows.ple_scale.numpy(),
            stack(lambda m: _np(m.rows.ple_w).reshape(-1, self.D)))  # [P], [P, K] x2, [M, P*K, D]
        self.cat_emb = stack(lambda m: _np(m.rows.cat_emb.weight))  # [M, sum(cardinalities), D]
        self.cat_offsets = rows.cat_offsets.numpy().astype(np.int64)
        self.cat_keep = rows.cat_keep.numpy().astype(np.int64)  # 0 = novelty-only column
        self.multi = [mat(lambda m, i=i: m.rows.multi_proj[i].weight) for i in range(len(rows.multi_proj))]  # [M, w, D]
        self.multi_w = [w for _, w in model.cfg.multi_slots]
        self.gap_bins = stack(lambda m: _np(m.rows.gap_bins.weight))  # [M, n_bins + 2, D]
        self.gap_edges = rows.gap_edges.numpy()
        self.gap_lin_w = row(lambda m: _np(m.rows.gap_lin.weight)[:, 0])  # [M, 1, D]
        self.gap_lin_b = row(lambda m: _np(m.rows.gap_lin.bias))
        self.has_hist = rows.hist_field is not None
        self.hist_w = mat(lambda m: m.rows.hist_lin.weight)  # [M, 1 + K-1, D]
        self.hist_b = row(lambda m: _np(m.rows.hist_lin.bias))
        self.hist_edges = rows.hist_edges.numpy().astype(np.float32)
        self.hist_none = row(lambda m: _np(m.rows.hist_none))
        act = rows.activity
        self.act = None if act is None else dict(  # recent-activity / first-seen fields (engine.model.activity)
            windows=list(act.windows_s), cols=act.cols.numpy().astype(np.int64),
            recent_w=mat(lambda m: m.rows.activity.recent.weight),  # [M, A, D]
            recent_b=row(lambda m: _np(m.rows.activity.recent.bias)),
            seen_w=mat(lambda m: m.rows.activity.seen.weight),  # [M, C+1, D]
            seen_b=row(lambda m: _np(m.rows.activity.seen.bias)),
            ple=None if act.ple_w is None else (act.ple_lo.numpy(), act.ple_scale.numpy(),  # [A, K] x2
                                                stack(lambda m: _np(m.rows.activity.ple_w).reshape(-1, self.D))))  # [M, A*K, D]

        def ln(get):
            return row(lambda m: _np(get(m).weight)), row(lambda m: _np(get(m).bias)), get(model).eps

        self.ln_in = ln(lambda m: m.ln_in)
        self.row_ff = None if model.row_ff is None else (  # ModelConfig.row_ff: residual layer on the row vector
            mat(lambda m: m.row_ff[0].weight), row(lambda m: _np(m.row_ff[0].bias)),  # [M, D, R], [M, 1, R]
            mat(lambda m: m.row_ff[2].weight), row(lambda m: _np(m.row_ff[2].bias)))  # [M, R, D], [M, 1, D]
        self.ln_out = ln(lambda m: m.ln_out)
        self.head_w = mat(lambda m: m.head.weight)  # [M, D, 1]
        self.head_b = stack(lambda m: _np(m.head.bias))[:, :, None]  # [M, 1, 1]
        self.blocks = []
        for i, blk in enumerate(model.blocks):
            self.H, self.dh = blk.attn.h, blk.attn.dh

            def lin(get, i=i):  # (weight [M, in, out], bias [M, 1, out]) of block i's Linear
                return mat(lambda m: get(m.blocks[i]).weight), row(lambda m: _np(get(m.blocks[i]).bias))

            (qkv_w, qkv_b), (out_w, out_b) = lin(lambda b: b.attn.qkv), lin(lambda b: b.attn.out)
            (ff1_w, ff1_b), (ff2_w, ff2_b) = lin(lambda b: b.ff[0]), lin(lambda b: b.ff[2])
            self.blocks.append(dict(
                ln1=ln(lambda m, i=i: m.blocks[i].ln1), ln2=ln(lambda m, i=i: m.blocks[i].ln2),
                qkv_w=qkv_w, qkv_b=qkv_b, out_w=out_w, out_b=out_b,  # [M, D, 3D], [M, 1, 3D], [M, D, D], [M, 1, D]
                ff1_w=ff1_w, ff1_b=ff1_b, ff2_w=ff2_w, ff2_b=ff2_b,
                slope=stack(lambda m, i=i: _np(Fnn.softplus(m.blocks[i].attn.slope_raw.detach()))[:, None]),  # [M, H, 1]
            ))


class IncrementalScorer:
    """Keeps per-entity key/value caches and scores new transactions one at a time.

    ``add(entity_id, row) -> logit`` where ``row`` is one canonical-frame row (a dict or Series
    with timestamp, amount and the spec's fields). Returns the fraud logit (float; probability =
    sigmoid). ``add_frame(frame) -> [N] logits`` feeds a canonical frame row by row.

    The step is the model's own function (row encoder, pre-LayerNorm blocks with the time-decay
    attention bias, head) evaluated in float32 on the model's weights (NumPy for the row
    embedding, the compiled kernel of :mod:`engine.model.incremental_kernel` per window), copied once at
    construction; tests check it equal to whole-file scoring with the torch model. A seed
    ensemble's members run side by side on a leading member axis (module docstring); its score is
    their mean logit.

    Raises:
        ValueError: a transaction older than the entity's previous one (histories are time-ordered).
        NonFiniteScoreError: a NaN or infinite score (an error, never "not flagged").
    """

    def __init__(self, bundle: ModelBundle):
        self.bundle = bundle
        self.model = bundle.model.eval()
        self.cfg = bundle.config
        self.S = self.cfg.context_length - self.cfg.min_history
        self.entities: dict[str, _EntityState] = {}
        self.w = _Weights(members_of(self.model))
        self.kernel = KernelWeights(self.w)
        compile_kernel(self.kernel, self._new_window(0))

    # ------------------------------------------------------------------ encoding
    def _row_embedding(self, row, st: _EntityState) -> tuple[np.ndarray, float, float, np.ndarray]:
        """Summed field embedding ``[M, D]`` float32 (per member) of one new transaction *without*
        its window-dependent fields (``amount_vs_history``, the activity fields), its time in
        seconds, its standardised log amount and its first-seen categorical values ``[C]`` int64
        (the sum :meth:`RowEncoder.summed` computes for a lone row)."""
        enc = self.bundle.encoder.transform_row(row)
        t = float(enc.time_s[0])
        if not math.isnan(st.last_time) and t < st.last_time:
            raise ValueError(f"transaction at {pd.Timestamp(t, unit='s')} is older than the entity's previous one")
        W = self.w
        num = enc.num[0]
        x = W.static_bias + enc.num[:1] @ W.num_w  # [1, Fn] @ [M, Fn, D] -> [M, 1, D]
        if W.ple is not None:
            cols, lo, scale, pw = W.ple
            code = np.clip((num[cols, None] - lo) * scale, 0.0, 1.0).astype(np.float32)  # [P, K], as RowEncoder.num_ple_code
            x = x + code.reshape(1, -1) @ pw  # [1, P*K] @ [M, P*K, D]
        if len(W.cat_offsets):
            x = x + np.add.reduce(W.cat_emb[:, enc.cat[0] * W.cat_keep + W.cat_offsets], axis=1, keepdims=True)  # [M, Fc, D] -> [M, 1, D]
        start = 0
        for wmat, width in zip(W.multi, W.multi_w):
            x = x + enc.multi[:1, start : start + width] @ wmat  # [1, w] @ [M, w, D] -> [M, 1, D]
            start += width
        # time since the entity's previous transaction (window-independent: the previous one is passed in)
        if math.isnan(st.last_time):
            i = len(W.gap_edges) + 1
            x = x + W.gap_bins[:, i : i + 1]
        else:
            gap = max(t - st.last_time, 0.0)
            i = int(np.searchsorted(W.gap_edges, gap, side="left"))
            x = x + W.gap_bins[:, i : i + 1]
            x = x + W.gap_lin_w * np.float32(math.log1p(gap / 60.0) / 5.0) + W.gap_lin_b
        cats = enc.cat[0][W.act["cols"]] if W.act is not None else np.zeros(0, np.int64)
        return np.ascontiguousarray(x[:, 0], np.float32), t, float(num[0]), cats  # [M, 1, D] -> [M, D]

    def _step(self, base: np.ndarray, w: _Window, t: float, z: float, need_output: bool,
              cats: np.ndarray) -> float:
        """Run one new row (``base [M, D]`` float32, C-contiguous: its window-independent embedding;
        its time ``t`` in seconds, standardised log amount ``z`` and first-seen values ``cats [C]``
        int64) through every layer of every member against window ``w``'s cache, appending the
        row to it (:func:`engine.model.incremental_kernel.window_step`). Returns the members' mean
        logit (float64), NaN without ``need_output`` (then the last block computes keys/values only)."""
        self._reserve(w)
        logit = self.kernel.step(base, w, t, z, cats, need_output)
        w.n += 1
        w.z_sum += z
        return logit

    def _new_window(self, start: int, capacity: int = 8) -> _Window:
        M, L, H, dh = self.w.M, len(self.w.blocks), self.w.H, self.w.dh
        C = 0 if self.w.act is None else len(self.w.act["cols"])
        return _Window(start=start, keys=np.empty((M, L, H, capacity, dh), np.float32),
                       values=np.empty((M, L, H, capacity, dh), np.float32), times=np.empty(capacity, np.float64),
                       zs=np.empty(capacity, np.float32), cats=np.empty((capacity, C), np.int64))

    def _open_windows(self, st: _EntityState, p: int) -> None:
        """Before position ``p``: open the window that starts at ``p`` (window k starts at k*S),
        drop the full ones."""
        if p % self.S == 0:
            st.windows.append(self._new_window(p))
        T = self.cfg.context_length
        st.windows = [w for w in st.windows if p < w.start + T]

    def _reserve(self, w: _Window) -> None:
        """Room for one more cached row: the buffers double when full (at most ``T`` rows), so an
        entity with few transactions holds little memory."""
        cap = w.times.shape[0]
        if w.n < cap:
            return
        new = min(2 * cap, self.cfg.context_length)
        keys = np.empty(w.keys.shape[:3] + (new,) + w.keys.shape[4:], np.float32)
        values = np.empty_like(keys)
        keys[:, :, :, :cap], values[:, :, :, :cap] = w.keys, w.values
        times = np.empty(new, np.float64)
        times[:cap] = w.times
        zs = np.empty(new, np.float32)
        zs[:cap] = w.zs
        cats = np.empty((new, w.cats.shape[1]), np.int64)
        cats[:cap] = w.cats
        w.keys, w.values, w.times, w.zs, w.cats = keys, values, times, zs, cats

    # ------------------------------------------------------------------ public
    def add(self, entity_id: str, row) -> float:
        """Score one new transaction of ``entity_id`` (appended after its cached history).

        Raises:
            ValueError: the transaction is older than the entity's previous one.
            NonFiniteScoreError: the logit is NaN or infinite (names the transaction and entity);
                the entity's cache already holds the row, so the scorer must be discarded.
        """
        st = self.entities.setdefault(str(entity_id), _EntityState())
        p = st.n
        base, t, z, cats = self._row_embedding(row, st)
        T = self.cfg.context_length
        self._open_windows(st, p)
        k_score = int(window_of_position(p, T, self.cfg.min_history)) * self.S
        logit = float("nan")
        for w in st.windows:
            out = self._step(base, w, t, z, need_output=w.start == k_score, cats=cats)
            if w.start == k_score:
                logit = out
        st.n, st.last_time = p + 1, t
        if not math.isfinite(logit):
            tid = row.get("transaction_id", "?") if hasattr(row, "get") else "?"
            raise NonFiniteScoreError(
                f"the model gave a NaN or infinite score for transaction {tid} of entity {entity_id}; the model "
                "or its input is broken, so no score is reported (discard this scorer)", np.array([0]))
        return logit

    def add_many(self, items: list[tuple[str, object]]) -> np.ndarray:
        """Score one new transaction for each of several *distinct* entities at once: ``items =
        [(entity_id, row), ...]`` -> ``[N]`` float64 logits, equal to :meth:`add` on each in turn
        (to float32 rounding). See :func:`engine.model.incremental_many.add_many` (errors there)."""
        from engine.model.incremental_many import add_many

        return add_many(self, items)

    def resume(self, entity_id: str, rows, start: int, prev_time_s: float | None) -> None:
        """Rebuild ``entity_id``'s caches from the tail of its history, without scoring.

        ``rows`` are its transactions at positions ``start, start + 1, ...`` up to its last one
        (``n - 1``); ``prev_time_s`` is the time (seconds) of the transaction at ``start - 1``
        (None when ``start == 0``). ``start`` must be ``k * S`` with ``k * S > n - 1 - T`` (no
        later than the first window still open after ``n`` transactions): a window's caches
        (keys/values, times, amounts, first-seen values) depend only on its own rows and the time
        of the row before it, so the caches equal
        those of feeding the whole history (tested). Replayed rows are not scored.

        Raises:
            ValueError: ``start`` is not a window start, or a row is out of time order.
        """
        if start % self.S:
            raise ValueError(f"resume: start {start} is not a window start (a multiple of {self.S})")
        st = _EntityState(n=start, last_time=float("nan") if prev_time_s is None else float(prev_time_s))
        self.entities[str(entity_id)] = st
        for row in rows:
            p = st.n
            base, t, z, cats = self._row_embedding(row, st)
            self._open_windows(st, p)
            for w in st.windows:
                self._step(base, w, t, z, need_output=False, cats=cats)  # keys/values only
            st.n, st.last_time = p + 1, t

    def add_frame(self, frame: pd.DataFrame) -> np.ndarray:
        """Feed a canonical frame (sorted by entity, time) row by row; returns ``[N]`` logits."""
        out = np.empty(len(frame), np.float64)
        for i, row in enumerate(frame.to_dict("records")):
            try:
                out[i] = self.add(row["entity_id"], row)
            except NonFiniteScoreError as e:
                raise NonFiniteScoreError(str(e), np.array([i])) from None
        return out

    def cached_entities(self) -> int:
        return len(self.entities)
