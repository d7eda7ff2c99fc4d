"""Incremental scoring: one new transaction for an entity whose history is already cached.

Exactly the windowed scores of :mod:`engine.sequences` (tested equal to whole-file scoring),
at O(T) cost per new transaction instead of a forward pass over the whole window.

How: a transaction at position ``p`` belongs to every window ``k`` with ``k*S <= p < k*S + T``
(at most ``ceil(T / S)`` of them) and is *scored* in window ``k(p)``. Its hidden states differ
between windows (each window is a separate causal context), so the scorer keeps, per entity, a
key/value cache for every window the next transaction can belong to. A new transaction is
embedded once (its row embedding does not depend on the window), then run through the layers
once per open window as a single query against that window's cache; the logit comes from
window ``k(p)``. Windows that can receive no more transactions are dropped, new ones are opened
when ``p`` reaches their start — so no window is ever re-encoded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as Fnn

from .checkpoint import ModelBundle
from .model import TransactionBatch
from .sequences import window_of_position


@dataclass
class _Window:
    start: int  # entity position of the window's first transaction
    keys: list[torch.Tensor] = field(default_factory=list)  # per layer [H, n, dh]
    values: list[torch.Tensor] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # seconds, per cached row
    z_sum: float = 0.0  # sum of the standardised log amounts of the cached rows


@dataclass
class _EntityState:
    n: int = 0  # transactions seen
    last_time: float = float("nan")
    windows: list[_Window] = field(default_factory=list)


class IncrementalScorer:
    """Keeps per-entity key/value caches and scores new transactions one at a time.

    ``add(entity_id, row) -> logit`` where ``row`` is one canonical-frame row (a dict or Series
    with timestamp, amount and the spec's fields). Returns the fraud logit (float; probability =
    sigmoid). ``add_frame(frame) -> [N] logits`` feeds a canonical frame row by row.

    Raises:
        ValueError: a transaction older than the entity's previous one (histories are time-ordered).
    """

    def __init__(self, bundle: ModelBundle):
        self.bundle = bundle
        self.model = bundle.model.eval()
        self.cfg = bundle.config
        self.S = self.cfg.context_length - self.cfg.min_history
        self.entities: dict[str, _EntityState] = {}
        self._slopes = [Fnn.softplus(b.attn.slope_raw.detach()).view(-1, 1) for b in self.model.blocks]  # [H, 1]

    # ------------------------------------------------------------------ encoding
    def _row_embedding(self, row, st: _EntityState) -> tuple[torch.Tensor, float, float]:
        """Summed field embedding ``[D]`` of one new transaction *without* its window-dependent
        ``amount_vs_history`` field, its time in seconds and its standardised log amount."""
        enc = self.bundle.encoder.transform_row(row)
        t = float(enc.time_s[0])
        if not math.isnan(st.last_time) and t < st.last_time:
            raise ValueError(f"transaction at {pd.Timestamp(t, unit='s')} is older than the entity's previous one")
        # window-relative times are irrelevant for the row embedding: only the gap to the previous row matters
        batch = TransactionBatch(
            cat=torch.from_numpy(enc.cat).view(1, 1, -1),
            num=torch.from_numpy(enc.num).view(1, 1, -1),
            multi=torch.from_numpy(enc.multi).view(1, 1, -1),
            time_s=torch.tensor([[t]], dtype=torch.float64),
            present=torch.ones(1, 1, dtype=torch.bool),
            prev_time_s=torch.tensor([st.last_time], dtype=torch.float64),
        )
        rows = self.model.rows
        base = rows.summed(batch)[0, 0]  # [1, 1, D] -> [D]
        if rows.hist_field is not None:
            base = base - rows.hist_none  # a lone row has "no history": take that part out again
        return base, t, float(enc.num[0, 0])

    def _step(self, base: torch.Tensor, w: _Window, t: float, z: float) -> torch.Tensor:
        """Run one new row (``base [D]``, its time ``t`` and log amount ``z``) through every layer
        against window ``w``'s cache; returns the final hidden state ``[D]`` and appends the row's
        keys/values to the cache."""
        rows = self.model.rows
        if rows.hist_field is not None:
            n = len(w.times)
            dev = torch.tensor(z - (w.z_sum / n if n else 0.0))
            base = base + rows.history_embedding(dev, torch.tensor(n > 0))
        x = self.model.ln_in(base)
        times = torch.tensor(w.times + [t], dtype=torch.float64)
        log_gap = torch.log1p((t - times).clamp(min=0) / 60.0).float()  # [n+1]
        first = not w.keys
        for li, blk in enumerate(self.model.blocks):
            att = blk.attn
            h = blk.ln1(x)
            q, k, v = att.qkv(h).split(x.shape[-1])
            q = q.view(att.h, 1, att.dh)  # [D] -> [H, 1, dh]
            k = k.view(att.h, 1, att.dh)
            v = v.view(att.h, 1, att.dh)
            if first:
                w.keys.append(k)
                w.values.append(v)
            else:
                w.keys[li] = torch.cat([w.keys[li], k], dim=1)  # [H, n+1, dh]
                w.values[li] = torch.cat([w.values[li], v], dim=1)
            scores = (q @ w.keys[li].transpose(1, 2)).squeeze(1) / math.sqrt(att.dh)  # [H, n+1]
            scores = scores - self._slopes[li] * log_gap
            a = torch.softmax(scores, dim=-1).unsqueeze(1) @ w.values[li]  # [H, 1, dh]
            x = x + att.out(a.reshape(-1))
            x = x + blk.ff(blk.ln2(x))
        w.times.append(t)
        w.z_sum += z
        return x

    # ------------------------------------------------------------------ public
    @torch.inference_mode()
    def add(self, entity_id: str, row) -> float:
        """Score one new transaction of ``entity_id`` (appended after its cached history)."""
        st = self.entities.setdefault(str(entity_id), _EntityState())
        p = st.n
        base, t, z = self._row_embedding(row, st)
        T = self.cfg.context_length
        # window k starts at k*S: open it there; drop windows that are full
        if p % self.S == 0:
            st.windows.append(_Window(start=p))
        st.windows = [w for w in st.windows if p < w.start + T]
        k_score = int(window_of_position(p, T, self.cfg.min_history)) * self.S
        logit = float("nan")
        for w in st.windows:
            h = self._step(base, w, t, z)
            if w.start == k_score:
                logit = float(self.model.head(self.model.ln_out(h)))
        st.n, st.last_time = p + 1, t
        return logit

    def add_frame(self, frame: pd.DataFrame) -> np.ndarray:
        """Feed a canonical frame (sorted by entity, time) row by row; returns ``[N]`` logits."""
        out = np.empty(len(frame), np.float64)
        for i, row in enumerate(frame.to_dict("records")):
            out[i] = self.add(row["entity_id"], row)
        return out

    def cached_entities(self) -> int:
        return len(self.entities)
