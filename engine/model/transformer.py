"""The fraudlens sequence model: a field-aware row encoder and a causal transformer over an
entity's transaction history. One forward pass gives a fraud logit for every transaction,
each computed from that transaction and its past only.

Dimensions: ``B`` batch (histories), ``T`` transactions, ``F`` fields, ``D`` width, ``H`` heads,
``L`` layers. Scores are logits here; ``sigmoid`` gives probabilities.

Design notes
------------
* **Presence mask instead of positions.** There are no absolute position embeddings. A
  transaction that is not ``present`` (padding, or removed by an explainer) is invisible:
  no query attends to it, and the *time since previous transaction* field is computed inside
  the model from the previous *present* transaction. So masking a transaction out gives exactly
  the score of the history with that transaction deleted (tested).
* **Time-decay attention bias.** Each head adds ``-slope_h * log1p(gap_minutes)`` to the
  attention logit between query ``i`` and key ``j`` (``gap`` = time between them), an ALiBi-style
  recency bias (Press et al., 2022, "Train Short, Test Long", arXiv:2108.12409) measured in
  time rather than positions; ``slope_h >= 0`` is learned per head.
* **Explicit attention.** Attention is computed by hand (not ``nn.TransformerEncoder``, whose
  fast path returns no weights), so every layer's ``[B, H, T, T]`` weights are available as an
  opt-in output (``output_attentions=True``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as Fnn
from torch import nn

from engine.data.features import TIME_GAP_BOUNDARIES_S
from engine.model.activity import ACTIVITY_FIELDS, ActivityEncoder
from engine.model.sequences import TransactionBatch

from engine.model.config import (  # noqa: F401  (re-exported: the config lives with the model)
    CONFIG_LIMITS,
    DEFAULT_HISTORY_EDGES,
    MAX_EDGES,
    MAX_EMBEDDING_ROWS,
    MAX_LIST_LEN,
    MAX_MULTI_WIDTH,
    ModelConfig,
)


@dataclass
class ScoreOutput:
    """Output of :meth:`FraudTransformer.forward`.

    Attributes:
        logits: ``[B, T]`` float32 fraud logit of every transaction (meaningless where not present).
        attentions: ``None`` unless ``output_attentions=True``; then a tuple of ``L`` tensors
            ``[B, H, T, T]`` float32 (query, key), each row summing to 1 over allowed keys.
        field_embeddings: ``[B, T, F, D]`` per-field input embeddings (the inputs IG attributes to).
    """

    logits: torch.Tensor
    attentions: tuple[torch.Tensor, ...] | None = None
    field_embeddings: torch.Tensor | None = None


def time_since_previous(time_s: torch.Tensor, present: torch.Tensor, prev_time_s: torch.Tensor):
    """Seconds since the previous *present* transaction of the same history.

    Args:
        time_s: ``[B, T]`` float64 seconds. present: ``[B, T]`` bool. prev_time_s: ``[B]`` float64 (NaN = none).
    Returns:
        ``(gap_s [B, T] float64, has_prev [B, T] bool)``; gap is 0 where ``has_prev`` is False.
    """
    B, T = time_s.shape
    pos = torch.arange(T, device=time_s.device).expand(B, T)
    last = torch.where(present, pos, torch.full_like(pos, -1)).cummax(dim=1).values  # [B, T]
    prev_idx = torch.cat([torch.full((B, 1), -1, device=time_s.device, dtype=last.dtype), last[:, :-1]], dim=1)
    prev_t = torch.gather(time_s, 1, prev_idx.clamp(min=0))
    outside = prev_time_s.unsqueeze(1).expand(B, T)
    prev_t = torch.where(prev_idx >= 0, prev_t, outside)
    has_prev = ~torch.isnan(prev_t)
    gap = torch.where(has_prev, (time_s - prev_t).clamp(min=0), torch.zeros_like(time_s))
    return gap, has_prev


def amount_vs_history(z: torch.Tensor, present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``amount_vs_history`` input: the standardised log amount minus its mean over the earlier
    *present* transactions of the same history.

    Args:
        z: ``[B, T]`` float32 standardised log |amount| (``TransactionBatch.num[..., 0]``).
        present: ``[B, T]`` bool.
    Returns:
        ``(dev [B, T] float32, has_prev [B, T] bool)``; ``dev`` is ``z`` where ``has_prev`` is False.
    """
    p = present.to(z.dtype)
    prev_sum = torch.cumsum(z * p, dim=1) - z * p  # [B, T] sum over earlier present rows
    prev_n = torch.cumsum(p, dim=1) - p
    return z - prev_sum / prev_n.clamp(min=1.0), prev_n > 0


class RowEncoder(nn.Module):
    """Per-field embeddings of each transaction: ``TransactionBatch -> [B, T, F, D]``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        D, F = cfg.d_model, cfg.n_fields
        self.cfg = cfg
        card = cfg.embedding_cardinalities  # 1 row for a novelty-only column
        offsets = [0]
        for c in card[:-1]:
            offsets.append(offsets[-1] + c)
        self.register_buffer("cat_offsets", torch.tensor(offsets, dtype=torch.int64), persistent=False)
        # 0 for a novelty-only column (every value -> its one row), 1 otherwise
        novelty = set(cfg.novelty_only_cols)
        keep = [0 if j in novelty else 1 for j in range(len(card))]
        self.register_buffer("cat_keep", torch.tensor(keep, dtype=torch.int64), persistent=False)
        self.cat_emb = nn.Embedding(max(1, sum(card)), D)
        self.num_w = nn.Parameter(torch.randn(len(cfg.num_field_index), D) * 0.1)
        self.num_b = nn.Parameter(torch.zeros(len(cfg.num_field_index), D))
        self.multi_proj = nn.ModuleList([nn.Linear(w, D, bias=False) for _, w in cfg.multi_slots])
        # piecewise-linear codes of some num columns: P columns, up to K bins each (padding bins never fire)
        ple = [(j, e) for j, e in enumerate(cfg.num_ple_edges) if len(e) > 1]
        K = max((len(e) - 1 for _, e in ple), default=0)
        lo = torch.zeros(len(ple), K)
        scale = torch.zeros(len(ple), K)  # padding bins: scale 0 -> code 0 for any finite input
        for p, (_, e) in enumerate(ple):
            e = torch.tensor(e, dtype=torch.float32)
            lo[p, : len(e) - 1] = e[:-1]
            scale[p, : len(e) - 1] = 1.0 / (e[1:] - e[:-1])
        self.register_buffer("ple_cols", torch.tensor([j for j, _ in ple], dtype=torch.int64), persistent=False)
        self.register_buffer("ple_lo", lo, persistent=False)
        self.register_buffer("ple_scale", scale, persistent=False)
        self.ple_w = nn.Parameter(torch.randn(len(ple), K, D) * 0.1 * (scale > 0).unsqueeze(-1)) if ple else None
        self.time_field = cfg.field_names.index("time_since_prev")
        self.hist_field = cfg.field_names.index("amount_vs_history") if "amount_vs_history" in cfg.field_names else None
        edges = torch.tensor(cfg.history_edges, dtype=torch.float32)
        self.register_buffer("hist_edges", edges, persistent=False)
        self.hist_lin = nn.Linear(1 + max(0, len(cfg.history_edges) - 1), D)
        self.hist_none = nn.Parameter(torch.zeros(D))
        self.gap_bins = nn.Embedding(len(TIME_GAP_BOUNDARIES_S) + 2, D)  # + "no previous"
        self.gap_lin = nn.Linear(1, D)
        self.register_buffer(
            "gap_edges", torch.tensor(TIME_GAP_BOUNDARIES_S, dtype=torch.float64), persistent=False
        )
        # component -> field assignment matrix [C, F]; components: cat cols, num cols, multi blocks
        comp_field = list(cfg.cat_field_index) + list(cfg.num_field_index) + [f for f, _ in cfg.multi_slots]
        self.register_buffer("comp_field", torch.tensor(comp_field, dtype=torch.int64), persistent=False)
        self.field_bias = nn.Parameter(torch.zeros(F, D))
        self.activity = (ActivityEncoder(D, cfg.activity_windows_s, cfg.first_seen_cols, ple=cfg.activity_ple)
                         if cfg.activity_windows_s else None)
        self.act_field = [cfg.field_names.index(n) for n in ACTIVITY_FIELDS] if self.activity is not None else []

    def num_ple_code(self, num: torch.Tensor) -> torch.Tensor:
        """``[..., Fn]`` standardised num columns -> ``[..., P, K]`` float32: the piecewise-linear
        code of each of the ``P`` coded columns (``cfg.num_ple_edges``; Gorishniy et al. 2022,
        "On Embeddings for Numerical Features in Tabular Deep Learning", arXiv:2203.05556):
        bin ``k`` is ``clip((x - e_k) / (e_{k+1} - e_k), 0, 1)``; padding bins are 0."""
        x = num.index_select(-1, self.ple_cols).unsqueeze(-1)  # [..., Fn] -> [..., P, 1]
        return ((x - self.ple_lo) * self.ple_scale).clamp_(0.0, 1.0)  # [..., P, K]

    def num_ple(self, num: torch.Tensor) -> torch.Tensor:
        """``[..., Fn]`` -> ``[..., P, D]``: the embedding of each coded column's code."""
        return torch.einsum("...pk,pkd->...pd", self.num_ple_code(num), self.ple_w)  # [..., P, D]

    def _time_embedding(self, batch: TransactionBatch) -> torch.Tensor:
        """``[B, T, D]`` embedding of the time since the previous present transaction."""
        gap, has_prev = time_since_previous(batch.time_s, batch.present, batch.prev_time_s)
        gap_bin = torch.bucketize(gap, self.gap_edges)  # [B, T]
        gap_bin = torch.where(has_prev, gap_bin, torch.full_like(gap_bin, len(TIME_GAP_BOUNDARIES_S) + 1))
        log_gap = torch.log1p(gap / 60.0).float().unsqueeze(-1) / 5.0  # [B, T, 1], ~unit scale
        return self.gap_bins(gap_bin) + self.gap_lin(log_gap) * has_prev.unsqueeze(-1)  # [B, T, D]

    def history_embedding(self, dev: torch.Tensor, has_prev: torch.Tensor) -> torch.Tensor:
        """``[..., D]`` embedding of ``dev`` (log amount minus the mean over earlier present
        transactions, ``[...]`` float32) where ``has_prev``, else a learned "no history" vector."""
        x = (dev * has_prev).unsqueeze(-1)  # [..., 1]
        if len(self.hist_edges) > 1:
            e = self.hist_edges
            ple = ((x - e[:-1]) / (e[1:] - e[:-1])).clamp(0.0, 1.0)  # [..., 1] -> [..., K-1]
            x = torch.cat([x, ple], dim=-1)
        return torch.where(has_prev.unsqueeze(-1), self.hist_lin(x), self.hist_none)

    def _history_field(self, batch: TransactionBatch) -> torch.Tensor:
        """``[B, T, D]``: amount versus the mean of the earlier present transactions of the window."""
        # num column 0 is the standardised log |amount| by construction
        return self.history_embedding(*amount_vs_history(batch.num[..., 0], batch.present))

    def summed(self, batch: TransactionBatch) -> torch.Tensor:
        """``[B, T, D]`` = ``forward(batch).sum(dim=2)`` without materialising ``[B, T, F, D]``
        (the scoring fast path; tested equal)."""
        return self.summed_static(batch) + self.summed_dynamic(batch)

    def summed_dynamic(self, batch: TransactionBatch) -> torch.Tensor:
        """``[B, T, D]``: the fields that depend on which transactions are present (time since
        previous, amount versus history)."""
        x = self._time_embedding(batch)
        if self.hist_field is not None:
            x = x + self._history_field(batch)
        if self.activity is not None:
            recent, seen = self.activity(batch)  # [B, T, D] each
            x = x + recent + seen
        return x

    def summed_static(self, batch: TransactionBatch) -> torch.Tensor:
        """``[B, T, D]``: the sum of the fields that depend on the transaction alone."""
        B, T = batch.shape
        D = self.cfg.d_model
        x = self.field_bias.sum(0) + self.num_b.sum(0) + batch.num @ self.num_w  # [B, T, Fn] -> [B, T, D]
        if self.ple_w is not None:
            code = self.num_ple_code(batch.num).flatten(-2)  # [B, T, P, K] -> [B, T, P*K]
            x = x + code @ self.ple_w.flatten(0, 1)  # [B, T, P*K] @ [P*K, D] -> [B, T, D]
        if batch.cat.shape[-1]:
            flat = (batch.cat * self.cat_keep + self.cat_offsets).view(B * T, -1)  # [B, T, Fc] -> [B*T, Fc]
            x = x + Fnn.embedding_bag(flat, self.cat_emb.weight, mode="sum").view(B, T, D)
        start = 0
        for (_, w), proj in zip(self.cfg.multi_slots, self.multi_proj):
            x = x + proj(batch.multi[..., start : start + w])
            start += w
        return x

    def forward(self, batch: TransactionBatch) -> torch.Tensor:
        B, T = batch.shape
        parts = []
        if batch.cat.shape[-1]:
            parts.append(self.cat_emb(batch.cat * self.cat_keep + self.cat_offsets))  # [B, T, Fc] -> [B, T, Fc, D]
        num = batch.num.unsqueeze(-1) * self.num_w + self.num_b  # [B, T, Fn] -> [B, T, Fn, D]
        if self.ple_w is not None:
            num = num.index_add(2, self.ple_cols, self.num_ple(batch.num))  # + [B, T, P, D] at the coded columns
        parts.append(num)
        start = 0
        for (_, w), proj in zip(self.cfg.multi_slots, self.multi_proj):
            block = batch.multi[..., start : start + w]  # [B, T, w]
            parts.append(proj(block).unsqueeze(2))  # [B, T, 1, D]
            start += w
        comps = torch.cat(parts, dim=2)  # [B, T, C, D]
        fields_ = comps.new_zeros(B, T, self.cfg.n_fields, comps.shape[-1])
        fields_ = fields_.index_add(2, self.comp_field, comps)  # [B, T, C, D] -> [B, T, F, D]
        t_emb = self._time_embedding(batch)  # [B, T, D]
        onehot = Fnn.one_hot(torch.tensor(self.time_field), self.cfg.n_fields).to(fields_.dtype)  # [F]
        fields_ = fields_ + t_emb.unsqueeze(2) * onehot.view(1, 1, -1, 1)
        if self.hist_field is not None:
            onehot_h = Fnn.one_hot(torch.tensor(self.hist_field), self.cfg.n_fields).to(fields_.dtype)
            fields_ = fields_ + self._history_field(batch).unsqueeze(2) * onehot_h.view(1, 1, -1, 1)
        if self.activity is not None:
            for j, emb in zip(self.act_field, self.activity(batch)):  # [B, T, D] into field j
                onehot_a = Fnn.one_hot(torch.tensor(j), self.cfg.n_fields).to(fields_.dtype)
                fields_ = fields_ + emb.unsqueeze(2) * onehot_a.view(1, 1, -1, 1)
        return fields_ + self.field_bias  # [B, T, F, D]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a time-decay bias, computed explicitly."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.h, self.dh = cfg.n_heads, cfg.d_model // cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)
        # slope_h = softplus(raw): heads start from no decay to strong decay
        self.slope_raw = nn.Parameter(torch.linspace(-4.0, 1.0, cfg.n_heads))

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, log_gap: torch.Tensor, need_weights: bool = False,
                query_start: int = 0):
        """x: ``[B, T, D]``; allowed: ``[B, 1, Tq, T]`` float32 additive mask (0 allowed, -inf not)
        and log_gap: ``[B, 1, Tq, T]`` float32, rows of the queries ``query_start..T-1``
        (``Tq = T - query_start``; all ``T`` rows by default). Keys and values are every position.

        Returns ``(y [B, Tq, D], weights [B, H, Tq, T] or None)``. Without ``need_weights`` the
        fused ``scaled_dot_product_attention`` kernel computes the same function (tested equal).
        """
        B, T, D = x.shape
        if query_start:  # only the queries' rows of W_q
            q = Fnn.linear(x[:, query_start:], self.qkv.weight[:D], self.qkv.bias[:D])
            k, v = Fnn.linear(x, self.qkv.weight[D:], self.qkv.bias[D:]).split(D, dim=-1)
        else:
            q, k, v = self.qkv(x).split(D, dim=-1)
        Tq = T - query_start
        q = q.view(B, Tq, self.h, self.dh).transpose(1, 2)  # [B, Tq, D] -> [B, H, Tq, dh]
        k = k.view(B, T, self.h, self.dh).transpose(1, 2)  # [B, T, D] -> [B, H, T, dh]
        v = v.view(B, T, self.h, self.dh).transpose(1, 2)
        # allowed: additive mask [B, 1, Tq, T] (0 or -inf); bias = mask - slope_h * log_gap
        bias = torch.addcmul(allowed, Fnn.softplus(self.slope_raw).view(1, -1, 1, 1), log_gap, value=-1.0)
        if need_weights:
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.dh) + bias  # [B, H, Tq, T]
            w = torch.softmax(scores, dim=-1)  # rows sum to 1 over allowed keys
            y = w @ v  # [B, H, Tq, dh]
        else:
            w = None
            y = Fnn.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # [B, H, Tq, dh]
        y = y.transpose(1, 2).reshape(B, Tq, D)  # [B, H, Tq, dh] -> [B, Tq, D]
        return self.out(y), w


class Block(nn.Module):
    """Pre-LayerNorm transformer block: attention then feed-forward, both residual."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.ff = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model), nn.Dropout(cfg.dropout)
        )
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, allowed, log_gap, need_weights: bool = False, query_start: int = 0):
        """``x [B, T, D]`` -> ``([B, T - query_start, D], weights | None)``: the outputs of
        positions ``query_start..T-1`` (see :meth:`CausalSelfAttention.forward` for the masks)."""
        a, w = self.attn(self.ln1(x), allowed, log_gap, need_weights, query_start)
        x = x[:, query_start:] + self.drop(a)
        x = x + self.ff(self.ln2(x))
        return x, w


class FraudTransformer(nn.Module):
    """Row encoder + causal transformer + logit head. See the module docstring.

    ``forward(batch)`` scores every transaction of every history in one pass.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.rows = RowEncoder(cfg)
        self.ln_in = nn.LayerNorm(cfg.d_model)
        self.row_ff = nn.Sequential(
            nn.Linear(cfg.d_model, cfg.row_ff), nn.GELU(), nn.Linear(cfg.row_ff, cfg.d_model), nn.Dropout(cfg.dropout)
        ) if cfg.row_ff else None
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.ln_out = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, 1)

    def input_layer(self, row_sum: torch.Tensor) -> torch.Tensor:
        """``[B, T, D]`` sum of field embeddings -> ``[B, T, D]`` input of the first block:
        LayerNorm, then the residual row feed-forward layer (``ModelConfig.row_ff``) if any."""
        x = self.ln_in(row_sum)
        return x if self.row_ff is None else x + self.row_ff(x)

    def embed(self, batch: TransactionBatch) -> torch.Tensor:
        """Per-field input embeddings ``[B, T, F, D]`` float32 (what IG attributes to)."""
        return self.rows(batch)

    def forward(
        self, batch: TransactionBatch, output_attentions: bool = False, output_field_embeddings: bool = False
    ) -> ScoreOutput:
        """Score every transaction. Returns logits ``[B, T]`` (+ attentions ``L x [B, H, T, T]`` and
        per-field embeddings ``[B, T, F, D]`` when asked; without them a fused path that never
        materialises ``[B, T, F, D]`` runs — tested equal)."""
        if output_field_embeddings:
            fe = self.embed(batch)
            logits, att = self.forward_from_embeddings(fe, batch, output_attentions=output_attentions)
            return ScoreOutput(logits=logits, attentions=att, field_embeddings=fe)
        logits, att = self._encode(self.rows.summed(batch), batch.present, batch.time_s, output_attentions)
        return ScoreOutput(logits=logits, attentions=att)

    def forward_from_embeddings(
        self, field_embeddings: torch.Tensor, batch: TransactionBatch, output_attentions: bool = False
    ):
        """Run the transformer from per-field embeddings.

        Args:
            field_embeddings: ``[B, T, F, D]`` float32 (``B`` may be a multiple of ``batch``'s ``B``,
                e.g. IG steps; the batch's masks and times are then repeated).
            batch: supplies ``present`` and ``time_s``.
        Returns:
            ``(logits [B, T] float32, attentions tuple of L x [B, H, T, T] or None)``.
        """
        B, T = field_embeddings.shape[:2]
        present, time_s = batch.present, batch.time_s
        if present.shape[0] != B:
            if B % present.shape[0]:
                raise ValueError(f"field_embeddings: expected batch a multiple of {present.shape[0]}, got {B}")
            r = B // present.shape[0]
            present, time_s = present.repeat_interleave(r, 0), time_s.repeat_interleave(r, 0)
        return self._encode(field_embeddings.sum(dim=2), present, time_s, output_attentions)  # [B,T,F,D] -> [B,T,D]

    def _encode(self, row_sum: torch.Tensor, present: torch.Tensor, time_s: torch.Tensor, output_attentions: bool):
        """``row_sum [B, T, D]`` (sum of field embeddings) -> ``(logits [B, T], attentions | None)``."""
        x = self.input_layer(row_sum)
        allowed, log_gap = self.attention_mask(present, time_s)
        atts = []
        for blk in self.blocks:
            x, w = blk(x, allowed, log_gap, output_attentions)
            if output_attentions:
                atts.append(w)
        logits = self.head(self.ln_out(x)).squeeze(-1)  # [B, T, D] -> [B, T]
        return logits, (tuple(atts) if output_attentions else None)

    def logits_from(self, batch: TransactionBatch, start: int) -> torch.Tensor:
        """Logits of positions ``start..T-1`` only (the whole-file scorer: a window after an
        entity's first scores only its last ``T - min_history`` positions).

        Equal to ``forward(batch).logits[:, start:]`` (tested), cheaper: every block but the last
        runs all ``T`` positions (they are the context), the last block runs only the queries
        ``start..T-1`` against the keys/values of all positions.

        Args:
            batch: ``[B, T]`` histories. start: first position whose logit is wanted, ``0 <= start < T``.
        Returns:
            ``[B, T - start]`` float32 logits.
        """
        B, T = batch.shape
        if not 0 <= start < T:
            raise ValueError(f"start: expected 0 <= start < {T}, got {start}")
        mask, log_gap = self.attention_mask(batch.present, batch.time_s)
        x = self.input_layer(self.rows.summed(batch))
        for blk in self.blocks[:-1]:
            x, _ = blk(x, mask, log_gap)
        xq, _ = self.blocks[-1](x, mask[..., start:, :], log_gap[..., start:, :], query_start=start)  # [B, T-start, D]
        return self.head(self.ln_out(xq)).squeeze(-1)

    def query_logits(
        self, batch: TransactionBatch, present: torch.Tensor | None = None, field_embeddings: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Logit of the *last* position only, for many variants of one history (explainers).

        Args:
            batch: ``[1, T]`` history (query last).
            present: ``[n, T]`` bool presence masks (removal rule), or None for ``batch.present``.
            field_embeddings: ``[n, T, F, D]`` per-field embeddings (IG path points) instead of
                the batch's own; then ``present`` must be None.
        Returns:
            ``[n]`` float32 logits, equal to ``forward(...).logits[:, -1]`` (tested) but cheaper:
            the transaction-only fields are embedded once, and the last block runs the query row
            only (keys/values of all rows are still computed).
        """
        if field_embeddings is not None:
            n = field_embeddings.shape[0]
            row = field_embeddings.sum(dim=2)  # [n, T, F, D] -> [n, T, D]
            pres = batch.present.expand(n, -1)
        else:
            pres = batch.present if present is None else present
            n = pres.shape[0]
            bn = batch.repeat(n).with_present(pres) if batch.shape[0] == 1 else batch.with_present(pres)
            row = self.rows.summed_static(batch) + self.rows.summed_dynamic(bn)  # [1|n, T, D] + [n, T, D]
        ts = batch.time_s.expand(n, -1)
        mask, log_gap = self.attention_mask(pres, ts)
        x = self.input_layer(row)
        for blk in self.blocks[:-1]:
            x, _ = blk(x, mask, log_gap)
        T = x.shape[1]
        xq = self.blocks[-1](x, mask[..., -1:, :], log_gap[..., -1:, :], query_start=T - 1)[0][:, 0]  # [n, D]
        return self.head(self.ln_out(xq)).squeeze(-1)

    @staticmethod
    def attention_mask(present: torch.Tensor, time_s: torch.Tensor):
        """``allowed [B, 1, T, T]`` float32 additive mask: 0 where key j <= query i and key j is
        present (a query always sees itself so padded rows stay finite), -inf elsewhere; and
        ``log_gap [B, 1, T, T]`` float32 = log1p(minutes between query and key)."""
        B, T = present.shape
        causal = torch.ones(T, T, dtype=torch.bool, device=present.device).tril()
        eye = torch.eye(T, dtype=torch.bool, device=present.device)
        allowed = (causal & present.unsqueeze(1)) | eye  # [B, T(q), T(k)]
        mask = torch.zeros(allowed.shape, dtype=torch.float32, device=present.device).masked_fill_(~allowed, float("-inf"))
        # [B, T] -> [B, T, T] float64 differences (exact), then float32 in place: clamp, minutes, log1p
        gap_min = (time_s.unsqueeze(2) - time_s.unsqueeze(1)).float().clamp_(min=0).div_(60.0)
        return mask.unsqueeze(1), gap_min.log1p_().unsqueeze(1)

    def n_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
