"""Recent-activity and first-seen fields computed inside the row encoder from the history it sees.

A practitioner's GBT gets per-card velocity features (counts and amounts over the last hour, day,
week, month; the amount against the card's past; "first time at this merchant / MCC"). Fed to the
transformer as precomputed columns, those would be opaque to its explanations: deleting an
earlier transaction would not change them. So they are computed *in the model*, from the window's
timestamps, the standardised log amounts, the categorical indices and the **presence mask** —
exactly like ``time_since_prev`` and ``amount_vs_history`` — and the removal-based explanations
(occlusion, SHAP) see a transaction's effect through them (the idea of Nubank's nuFormer, which
joins sequence and tabular features, here without leaving the sequence).

Two model fields (names in :data:`ACTIVITY_FIELDS`, appended to ``ModelConfig.field_names``):

``recent_activity`` ([B, T, A] with ``A = 2 * len(windows) + 3``), for each transaction ``t``
over the earlier *present* transactions ``s < t`` of its window:

* per window ``w`` (seconds, ``ModelConfig.activity_windows_s``; default 1 h, 24 h, 7 d, 30 d):
  ``log1p(count) / 3`` of the earlier transactions within ``w``, and the query's standardised log
  amount minus their mean (0 when there are none);
* the amount's z-score against all earlier transactions of the window,
  ``(z - mean) / sqrt(var + 0.25)`` clipped to [-6, 6] (0 with fewer than 2);
* ``log1p(minutes since the second-previous present transaction) / 5`` and a 0/1 flag that
  there is one.

``first_seen`` ([B, T, C + 1]): per categorical spec field chosen in ``ModelConfig.first_seen_cols``
(column indices of ``TransactionBatch.cat``; merchant, MCC, city, ...), 1.0 when no earlier present
transaction of the window has the same value ("new merchant", "new MCC") and the window has
history; then a 0/1 "has history" flag.

Only the window is seen (at most ``context_length - 1`` earlier transactions): a 30-day count on a
card with more transactions than that in 30 days is capped by the window. Counting is not
differentiable, so Integrated Gradients credits these fields to the query row only; the
removal methods credit the earlier transactions that feed them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

#: the two model fields this module computes, in field order
ACTIVITY_FIELDS = ("recent_activity", "first_seen")
#: default windows (seconds): 1 hour, 24 hours, 7 days, 30 days
DEFAULT_ACTIVITY_WINDOWS_S = [3600.0, 86400.0, 604800.0, 2592000.0]


def n_activity_inputs(n_windows: int) -> int:
    """Width ``A`` of the ``recent_activity`` input vector for ``n_windows`` windows."""
    return 2 * n_windows + 3


def activity_ple_edges(n_windows: int) -> list[list[float]]:
    """Per ``recent_activity`` input (``A`` lists, in input order), the edges of its piecewise-linear
    code (``ModelConfig.activity_ple``), in the input's own units: counts at 0, 1, 2, 3, 5, 8, 13, 21
    earlier transactions (``log1p(c) / 3``); amount deviations and the z-score in standard
    deviations; the second-previous gap at 1, 3, 10, 30 minutes, 1, 3, 12, 24 hours and 7 days
    (``log1p(minutes) / 5``); none for the 0/1 flag. Fixed, not fitted: the same for every file.
    A linear map alone cannot place a sharp threshold such as "the second-previous transaction
    was under 10 minutes ago" (Gorishniy et al. 2022, arXiv:2203.05556)."""
    count = [math.log1p(c) / 3.0 for c in (0, 1, 2, 3, 5, 8, 13, 21)]
    dev = [-3.0, -2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0]
    zdev = [-4.0, -2.0, -1.0, 0.0, 1.0, 2.0, 4.0]
    gap = [math.log1p(m) / 5.0 for m in (0, 1, 3, 10, 30, 60, 180, 720, 1440, 10080)]
    return [e for _ in range(n_windows) for e in (count, dev)] + [zdev, gap, []]


def ple_tables(edges: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lo [A, K], scale [A, K])`` float32 of the codes of :func:`activity_ple_edges` (``K`` the
    most bins of any input; padding bins have scale 0, so their code is 0)."""
    K = max(len(e) - 1 for e in edges)
    lo, scale = torch.zeros(len(edges), K), torch.zeros(len(edges), K)
    for a, e in enumerate(edges):
        for k in range(len(e) - 1):
            lo[a, k], scale[a, k] = e[k], 1.0 / (e[k + 1] - e[k])
    return lo, scale


def activity_inputs(
    time_s: torch.Tensor, present: torch.Tensor, z: torch.Tensor, cat: torch.Tensor, windows_s: list[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The raw inputs of the two activity fields (see the module docstring).

    Args:
        time_s: ``[B, T]`` float64 seconds. present: ``[B, T]`` bool.
        z: ``[B, T]`` float32 standardised log |amount| (``TransactionBatch.num[..., 0]``).
        cat: ``[B, T, C]`` int64 the categorical columns checked for "first seen".
        windows_s: window lengths in seconds (at least one).
    Returns:
        ``(recent [B, T, 2W+3] float32, first_seen [B, T, C+1] float32)``.
    """
    fast = _activity_inputs_sorted(time_s, present, z, cat, windows_s)
    if fast is not None:
        return fast
    B, T = present.shape
    causal = torch.ones(T, T, dtype=torch.bool, device=present.device).tril(-1)  # [t, s]: s < t
    earlier = causal & present.unsqueeze(1)  # [B, T(t), T(s)]
    dt = time_s.unsqueeze(2) - time_s.unsqueeze(1)  # [B, T, T] float64 seconds t - s
    zs = z.unsqueeze(1)  # [B, 1, T(s)]
    feats = []
    for w in windows_s:
        m = (earlier & (dt <= w)).to(z.dtype)  # [B, T, T]
        c = m.sum(-1)  # [B, T]
        mean = (m * zs).sum(-1) / c.clamp(min=1.0)
        feats += [torch.log1p(c) / 3.0, torch.where(c > 0, z - mean, torch.zeros_like(z))]
    m = earlier.to(z.dtype)
    c = m.sum(-1)
    mean = (m * zs).sum(-1) / c.clamp(min=1.0)
    var = (m * (zs - mean.unsqueeze(-1)) ** 2).sum(-1) / c.clamp(min=1.0)
    zdev = torch.where(c >= 2, (z - mean) / torch.sqrt(var + 0.25), torch.zeros_like(z)).clamp(-6.0, 6.0)
    # second-previous present transaction: an earlier present s with exactly one present row in (s, t)
    pc = torch.cumsum(present.to(torch.int64), dim=1)  # [B, T] present rows in [0, i]
    before_t = torch.cat([pc.new_zeros(B, 1), pc[:, :-1]], dim=1)  # present rows in [0, t)
    between = before_t.unsqueeze(2) - pc.unsqueeze(1)  # [B, T(t), T(s)] present rows in (s, t)
    second = earlier & (between == 1)
    t2 = torch.where(second, time_s.unsqueeze(1).expand(B, T, T), torch.full_like(dt, float("-inf"))).amax(-1)
    has2 = second.any(-1)
    gap2 = torch.where(has2, (time_s - t2).clamp(min=0.0), torch.zeros_like(time_s))
    feats += [zdev, (torch.log1p(gap2 / 60.0) / 5.0).to(z.dtype), has2.to(z.dtype)]
    recent = torch.stack(feats, dim=-1)  # [B, T, 2W+3]
    has_prev = earlier.any(-1)  # [B, T]
    if cat.shape[-1]:
        same = (cat.unsqueeze(2) == cat.unsqueeze(1)) & earlier.unsqueeze(-1)  # [B, T, T, C]
        return recent, _first_seen((~same.any(2)) & has_prev.unsqueeze(-1), has_prev, z.dtype)
    return recent, _first_seen(None, has_prev, z.dtype)  # [B, T, 2W+3], [B, T, C+1]


def _first_seen(new: torch.Tensor | None, has_prev: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B, T, C+1]``: the "new value" flags ``new [B, T, C]`` bool (None when ``C = 0``) and the
    "has history" flag ``has_prev [B, T]``, as ``dtype``."""
    flag = has_prev.to(dtype).unsqueeze(-1)
    return flag if new is None else torch.cat([new.to(dtype), flag], dim=-1)


def _window_start(time_s: torch.Tensor, w: float) -> torch.Tensor | None:
    """``[B, T]`` int64: per position ``t`` the first ``s`` with ``time_s[t] - time_s[s] <= w``
    (times non-decreasing along ``T``), the same float64 comparison as the general path: a binary
    search for ``time_s[t] - w``, then corrected where that rounding differs from the comparison
    (times far from each other in magnitude). None when a few corrections do not settle it."""
    B, T = time_s.shape
    lo = torch.searchsorted(time_s, time_s - w, side="left").clamp(max=T - 1)
    pos = torch.arange(T, device=time_s.device).expand(B, T)
    lo = torch.minimum(lo, pos)
    for _ in range(4):
        prev = (lo - 1).clamp(min=0)
        down = (lo > 0) & (time_s - time_s.gather(1, prev) <= w)  # the one before also qualifies
        up = (lo < pos) & (time_s - time_s.gather(1, lo) > w)  # this one does not
        if not bool(down.any()) and not bool(up.any()):
            return lo
        lo = lo - down.to(lo.dtype) + up.to(lo.dtype)
    return None


def _activity_inputs_sorted(time_s: torch.Tensor, present: torch.Tensor, z: torch.Tensor, cat: torch.Tensor,
                            windows_s: list[float]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`activity_inputs` for histories in time order (every row's ``time_s`` non-decreasing,
    as windows, packed coalitions and deletions are) in ``O(B T log T)``: counts and amount sums
    over a window are differences of prefix sums (float64) between the window's first position
    (:func:`_window_start`) and ``t``; the second-previous present transaction comes from a
    running maximum of present positions; "first seen" from prefix counts within groups of equal
    values (a sort on unique keys). The general path builds ``[B, T, T]`` tensors per window and ``[B, T,
    T, C]`` for first-seen: most of the forward pass of SHAP's coalitions on 128-transaction
    contexts. Equal to it up to float summation (tested); None (use the general path) when a row
    is not in time order or a window start does not settle."""
    B, T = present.shape
    if T < 2 or not bool((time_s[:, 1:] >= time_s[:, :-1]).all()):
        return None
    dtype, dev = z.dtype, present.device
    p = present.to(torch.float64)
    z64 = z.to(torch.float64)

    def before(x: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T + 1]: out[:, i] = sum of x[:, :i]
        return torch.cat([x.new_zeros(B, 1), x.cumsum(dim=1)], dim=1)

    P, PZ, PZZ = before(p), before(p * z64), before(p * z64 * z64)
    c, sz, szz = P[:, :T], PZ[:, :T], PZZ[:, :T]  # over all earlier present rows: [0, t)
    pos = torch.arange(T, device=dev).expand(B, T)
    feats = []
    for w in windows_s:
        lo = _window_start(time_s, float(w))
        if lo is None:
            return None
        cw = c - P.gather(1, lo)  # earlier present in [lo, t)
        mean = (sz - PZ.gather(1, lo)) / cw.clamp(min=1.0)
        feats += [(torch.log1p(cw) / 3.0).to(dtype), torch.where(cw > 0, z64 - mean, torch.zeros_like(z64)).to(dtype)]
    mean = sz / c.clamp(min=1.0)
    var = ((szz - 2.0 * mean * sz + mean * mean * c) / c.clamp(min=1.0)).clamp(min=0.0)
    zdev = torch.where(c >= 2, (z64 - mean) / torch.sqrt(var + 0.25), torch.zeros_like(z64)).clamp(-6.0, 6.0)
    last = torch.where(present, pos, torch.full_like(pos, -1)).cummax(dim=1).values  # last present <= i
    prev1 = torch.cat([last.new_full((B, 1), -1), last[:, :-1]], dim=1)  # last present < t
    prev2 = torch.where(prev1 >= 0, prev1.gather(1, prev1.clamp(min=0)), torch.full_like(prev1, -1))
    has2 = prev2 >= 0
    gap2 = torch.where(has2, (time_s - time_s.gather(1, prev2.clamp(min=0))).clamp(min=0.0), torch.zeros_like(time_s))
    feats += [zdev.to(dtype), (torch.log1p(gap2 / 60.0) / 5.0).to(dtype), has2.to(dtype)]
    recent = torch.stack(feats, dim=-1)  # [B, T, 2W+3]
    has_prev = prev1 >= 0
    C = cat.shape[-1]
    if C:
        # per column, earlier present rows with the same value: sort by (value, position), prefix counts
        # of present rows within each value's run, read back at each row's place
        key = cat.permute(0, 2, 1)  # [B, C, T]
        order = torch.sort(key * T + pos.unsqueeze(1), dim=-1).indices  # value, then position
        sk = key.gather(-1, order)
        sp = present.unsqueeze(1).expand(B, C, T).gather(-1, order).to(torch.int64)
        cs = sp.cumsum(-1) - sp  # present rows before, in sorted order
        start = torch.ones_like(sk, dtype=torch.bool)
        start[..., 1:] = sk[..., 1:] != sk[..., :-1]  # first of each value's run
        run0 = torch.where(start, cs, torch.zeros_like(cs)).cummax(-1).values  # cs at the run's start
        same_before = torch.empty_like(cs).scatter_(-1, order, cs - run0)  # [B, C, T] back in position order
        return recent, _first_seen((same_before.permute(0, 2, 1) == 0) & has_prev.unsqueeze(-1), has_prev, dtype)
    return recent, _first_seen(None, has_prev, dtype)


class ActivityEncoder(nn.Module):
    """``TransactionBatch -> ([B, T, D], [B, T, D])``: the embeddings of the ``recent_activity``
    and ``first_seen`` fields (a linear map of :func:`activity_inputs` each; with ``ple``, plus a
    learned embedding of the piecewise-linear code of each ``recent_activity`` input,
    :func:`activity_ple_edges`)."""

    def __init__(self, d_model: int, windows_s: list[float], first_seen_cols: list[int], ple: bool = False):
        super().__init__()
        self.windows_s = [float(w) for w in windows_s]
        self.register_buffer("cols", torch.tensor(first_seen_cols, dtype=torch.int64), persistent=False)
        self.recent = nn.Linear(n_activity_inputs(len(windows_s)), d_model)
        self.seen = nn.Linear(len(first_seen_cols) + 1, d_model)
        self.ple_w = None
        if ple:
            lo, scale = ple_tables(activity_ple_edges(len(windows_s)))
            self.register_buffer("ple_lo", lo, persistent=False)
            self.register_buffer("ple_scale", scale, persistent=False)
            self.ple_w = nn.Parameter(torch.randn(*lo.shape, d_model) * 0.1 * (scale > 0).unsqueeze(-1))  # [A, K, D]

    def forward(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        cat = batch.cat.index_select(-1, self.cols)  # [B, T, Fc] -> [B, T, C]
        recent, seen = activity_inputs(batch.time_s, batch.present, batch.num[..., 0], cat, self.windows_s)
        r = self.recent(recent)  # [B, T, A] -> [B, T, D]
        if self.ple_w is not None:
            code = ((recent.unsqueeze(-1) - self.ple_lo) * self.ple_scale).clamp(0.0, 1.0)  # [B, T, A, K]
            r = r + code.flatten(-2) @ self.ple_w.flatten(0, 1)  # [B, T, A*K] @ [A*K, D] -> [B, T, D]
        return r, self.seen(seen)  # [B, T, D] each
