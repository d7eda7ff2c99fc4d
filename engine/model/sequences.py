"""Per-entity histories cut into context windows, and batches of windows as tensors.

Long histories (documented rule)
--------------------------------
An entity's history (time-sorted, ``n`` transactions, positions ``p = 0..n-1``) is cut into
windows of ``T = context_length`` transactions starting every ``S = T - min_history`` positions:
window ``k`` covers positions ``[k*S, k*S + T)``. Transaction ``p`` is scored in exactly one
window, ``k(p) = 0 if p < T else (p - T) // S + 1``, where it sits at position ``p - k*S``:
the first ``T`` transactions see their whole history, every later one sees at least
``min_history`` and at most ``T - 1`` earlier transactions. ``k(p)`` depends on ``p`` only, so
appending transactions never changes an earlier score. The time since the transaction just
before a window is passed in (``prev_time_s``), so no window starts "cold".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from engine.data.features import EncodedFrame


@dataclass
class WindowIndex:
    """Windows over a canonical frame sorted by (entity_id, timestamp).

    Attributes:
        rows: ``[W, T]`` int64 global row index of each window slot, -1 = padding.
        length: ``[W]`` int64 number of real rows in each window.
        scored_from: ``[W]`` int64 first window position whose score comes from this window.
        row_window: ``[N]`` int64 window in which each row is scored.
        row_pos: ``[N]`` int64 position of each row in that window.
    """

    rows: np.ndarray
    length: np.ndarray
    scored_from: np.ndarray
    row_window: np.ndarray
    row_pos: np.ndarray

    @property
    def n_windows(self) -> int:
        return len(self.length)



@dataclass
class TransactionBatch:
    """Model input for ``B`` histories of ``T`` transactions (validated on construction).

    Attributes:
        cat: ``[B, T, Fc]`` int64 category indices.
        num: ``[B, T, Fn]`` float32 standardised numbers.
        multi: ``[B, T, Vm]`` float32 multi-hot blocks.
        time_s: ``[B, T]`` float64 seconds (any fixed origin; only differences are used).
        present: ``[B, T]`` bool; ``False`` = padding or removed transaction.
        prev_time_s: ``[B]`` float64 time of the transaction just before the window, NaN if none.
    """

    cat: torch.Tensor
    num: torch.Tensor
    multi: torch.Tensor
    time_s: torch.Tensor
    present: torch.Tensor
    prev_time_s: torch.Tensor

    def __post_init__(self) -> None:
        B, T = self.present.shape
        checks = [
            ("cat", self.cat, torch.int64, (B, T)),
            ("num", self.num, torch.float32, (B, T)),
            ("multi", self.multi, torch.float32, (B, T)),
            ("time_s", self.time_s, torch.float64, (B, T)),
            ("present", self.present, torch.bool, (B, T)),
            ("prev_time_s", self.prev_time_s, torch.float64, (B,)),
        ]
        for name, t, dtype, lead in checks:
            if t.dtype != dtype:
                raise ValueError(f"TransactionBatch.{name}: expected dtype {dtype}, got {t.dtype}")
            if tuple(t.shape[: len(lead)]) != lead:
                raise ValueError(f"TransactionBatch.{name}: expected leading shape {lead}, got {tuple(t.shape)}")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.present.shape)  # type: ignore[return-value]

    def index(self, idx) -> "TransactionBatch":
        """Select histories along ``B`` (``idx``: int tensor, slice or list)."""
        return TransactionBatch(
            self.cat[idx], self.num[idx], self.multi[idx], self.time_s[idx], self.present[idx], self.prev_time_s[idx]
        )

    def with_present(self, present: torch.Tensor) -> "TransactionBatch":
        """Same batch with another presence mask ``[B, T]`` bool (the removal rule of explainers)."""
        return TransactionBatch(self.cat, self.num, self.multi, self.time_s, present, self.prev_time_s)

    def repeat(self, n: int) -> "TransactionBatch":
        """``[1, T, ..]`` -> ``[n, T, ..]`` (for coalitions / perturbations of one history)."""
        if self.shape[0] != 1:
            raise ValueError(f"repeat: expected B=1, got B={self.shape[0]}")
        return TransactionBatch(
            self.cat.expand(n, -1, -1), self.num.expand(n, -1, -1), self.multi.expand(n, -1, -1),
            self.time_s.expand(n, -1), self.present.expand(n, -1).clone(), self.prev_time_s.expand(n),
        )


def window_of_position(p: np.ndarray | int, T: int, min_history: int):
    """Window index ``k(p)`` in which position ``p`` of a history is scored (see module doc)."""
    S = T - min_history
    p = np.asarray(p)
    return np.where(p < T, 0, (p - T) // S + 1)


def entity_bounds(entity_ids: pd.Series | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start index and length of each entity's contiguous block of rows.

    Raises:
        ValueError: rows of one entity are not contiguous (frame not sorted by entity).
    """
    e = np.asarray(entity_ids)
    if len(e) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    change = np.flatnonzero(e[1:] != e[:-1]) + 1
    starts = np.concatenate([[0], change]).astype(np.int64)
    lengths = np.diff(np.concatenate([starts, [len(e)]])).astype(np.int64)
    if len(pd.unique(e[starts])) != len(starts):
        raise ValueError("entity_id: expected each entity's rows to be contiguous (sort by entity_id, timestamp)")
    return starts, lengths


def build_windows(entity_ids, T: int, min_history: int) -> WindowIndex:
    """Cut every entity's history into scoring windows (vectorised; see module doc)."""
    S = T - min_history
    starts, lengths = entity_bounds(entity_ids)
    n_win = window_of_position(np.maximum(lengths - 1, 0), T, min_history) + 1  # [E]
    ent_of_win = np.repeat(np.arange(len(starts)), n_win)
    k = np.arange(n_win.sum()) - np.repeat(np.cumsum(n_win) - n_win, n_win)  # window number in entity
    wstart = starts[ent_of_win] + k * S
    wlen = np.minimum(T, starts[ent_of_win] + lengths[ent_of_win] - wstart)
    slots = np.arange(T)
    rows = wstart[:, None] + slots[None, :]
    rows = np.where(slots[None, :] < wlen[:, None], rows, -1).astype(np.int64)
    scored_from = np.where(k == 0, 0, min_history).astype(np.int64)
    N = len(np.asarray(entity_ids))
    pos_in_ent = np.arange(N) - np.repeat(starts, lengths)
    kp = window_of_position(pos_in_ent, T, min_history)
    first_win = np.repeat(np.cumsum(n_win) - n_win, lengths)
    return WindowIndex(
        rows=rows,
        length=wlen.astype(np.int64),
        scored_from=scored_from,
        row_window=(first_win + kp).astype(np.int64),
        row_pos=(pos_in_ent - kp * S).astype(np.int64),
    )


def make_batch(enc: EncodedFrame, rows: np.ndarray, entity_start: np.ndarray | None = None) -> TransactionBatch:
    """Gather windows into a :class:`TransactionBatch`.

    Args:
        enc: encoded frame (``N`` rows).
        rows: ``[B, T]`` int64 global row indices, -1 = padding (right-padded).
        entity_start: ``[B]`` global index of the first row of each window's entity; when given,
            ``prev_time_s`` is the time of the row just before the window (same entity), else NaN.
    """
    rows = np.asarray(rows)
    present = rows >= 0
    idx = np.where(present, rows, 0)
    cat = enc.cat[idx]  # [B, T] -> [B, T, Fc]
    num = enc.num[idx] * present[..., None]
    multi = enc.multi[idx] * present[..., None]
    t = enc.time_s[idx]
    first = rows[:, 0]
    origin = enc.time_s[np.maximum(first, 0)]
    prev = np.full(len(rows), np.nan)
    if entity_start is not None:
        has = first > entity_start
        prev[has] = enc.time_s[first[has] - 1] - origin[has]
    t = np.where(present, t - origin[:, None], 0.0)
    return TransactionBatch(
        cat=torch.from_numpy(np.ascontiguousarray(cat)),
        num=torch.from_numpy(np.ascontiguousarray(num, dtype=np.float32)),
        multi=torch.from_numpy(np.ascontiguousarray(multi, dtype=np.float32)),
        time_s=torch.from_numpy(np.ascontiguousarray(t, dtype=np.float64)),
        present=torch.from_numpy(present),
        prev_time_s=torch.from_numpy(prev),
    )


def window_entity_start(win: WindowIndex, entity_ids) -> np.ndarray:
    """``[W]`` global index of the first row of each window's entity."""
    starts, lengths = entity_bounds(entity_ids)
    row_entity_start = np.repeat(starts, lengths)
    return row_entity_start[np.maximum(win.rows[:, 0], 0)]


def length_batches(win: WindowIndex, batch_size: int, order: np.ndarray | None = None):
    """Yield ``(window ids, T_batch)`` with windows of similar length together (less padding).

    ``order`` (window ids) defaults to all windows sorted by length."""
    ids = np.argsort(win.length, kind="stable") if order is None else np.asarray(order)
    for i in range(0, len(ids), batch_size):
        b = ids[i : i + batch_size]
        yield b, int(win.length[b].max())
