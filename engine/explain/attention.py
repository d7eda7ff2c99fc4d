"""Attention weights of the query and attention rollout.

Two methods, both read from one forward pass with explicit attention
(``FraudTransformer.forward(batch, output_attentions=True)``):

* ``"attention"`` — the query's row of the attention matrix: how much weight the query put on
  each context transaction (itself included), for a chosen layer (default the last) averaged
  over heads or for one head.
* ``"attention_rollout"`` — Abnar & Zuidema (2020), "Quantifying Attention Flow in
  Transformers", arXiv:2005.00928: per layer, average the heads, add the identity for the
  residual connection, renormalise the rows, and multiply the layers' matrices from the first
  layer to the last; the query's row of the product is the value per transaction.

Both are in units of *attention weight* (non-negative, each query row sums to 1 over the
context). They are **not attributions**: see :data:`engine.explain.base.ATTENTION_CAVEAT`
(included in every result's ``params["caveat"]``). Rollout's residual weighting is a heuristic:
this model is pre-LayerNorm with a feed-forward sub-layer, so the true mix of residual and
attention paths is not 1:1.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np
import torch

from engine.explain.context import QueryContext
from engine.explain.base import ATTENTION_CAVEAT, Explanation
from engine.explain.removal import eval_mode

UNITS = "attention weight"
BASELINE = "none (attention weights are read from one forward pass of the unmodified context)"


@dataclass
class AttentionConfig:
    """Which attention to show.

    Attributes:
        layer: layer index, Python-style (``-1`` = last; valid ``-L <= layer < L``).
        head: head index ``0 <= head < H``, or ``None`` (default) for the mean over heads.
        return_matrices: include every layer's full ``[L, H, T, T]`` matrices in
            ``extras["matrices"]`` (for the heat map; ``L*H*T*T`` floats).
    """

    layer: int = -1
    head: int | None = None
    return_matrices: bool = True


@dataclass
class RolloutConfig:
    """Attention rollout settings.

    Attributes:
        residual_weight: weight ``a`` of the identity in ``A = (1 - a) * mean_h(W) + a * I``, in
            ``[0, 1)``. ``0.5`` (default) is Abnar & Zuidema's "add I and renormalise rows".
        return_matrices: include the full rollout matrix ``[T, T]`` in ``extras["rollout"]``.
    """

    residual_weight: float = 0.5
    return_matrices: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.residual_weight < 1.0:
            raise ValueError(f"residual_weight: expected 0 <= residual_weight < 1, got {self.residual_weight}")


def attention_matrices(ctx: QueryContext) -> np.ndarray:
    """Every layer's attention ``[L, H, T, T]`` float32 (query, key) for the context, from
    ``model(batch, output_attentions=True).attentions`` (rows sum to 1 over allowed keys)."""
    model = ctx.bundle.model
    with eval_mode(model), torch.no_grad():
        out = model(ctx.batch, output_attentions=True)
    return torch.stack([w[0] for w in out.attentions]).cpu().numpy()  # L x [1, H, T, T] -> [L, H, T, T]


def rollout(matrices: np.ndarray, residual_weight: float = 0.5) -> np.ndarray:
    """Attention rollout ``[T, T]`` float64 from ``[L, H, T, T]`` matrices (Abnar & Zuidema 2020).

    ``A_l = (1 - a) * mean_h W_l + a * I`` with rows renormalised; result ``A_L @ ... @ A_1``
    (row ``i``: how much of query ``i``'s representation flows from each input position).
    Every row sums to 1.
    """
    m = np.asarray(matrices, dtype=np.float64)
    L, _, T, _ = m.shape
    out = np.eye(T)
    for layer in range(L):
        a = (1.0 - residual_weight) * m[layer].mean(axis=0) + residual_weight * np.eye(T)
        a = a / a.sum(axis=-1, keepdims=True)
        out = a @ out
    return out


def _result(ctx, method, values, params, extras, t0) -> Explanation:
    score = _score(ctx)
    return Explanation(
        method=method,
        entity_id=ctx.entity_id,
        transaction_ids=list(ctx.transaction_ids),
        query_transaction_id=ctx.query_transaction_id,
        values=values,
        units=UNITS,
        signed=False,
        baseline=BASELINE,
        params=params,
        score_logit=score,
        extras=extras,
        elapsed_s=time.perf_counter() - t0,
    )


def explain(ctx: QueryContext, cfg: AttentionConfig | None = None) -> Explanation:
    """Query's attention row for one layer (mean over heads, or one head).

    Returns an :class:`Explanation` with ``method="attention"``, ``values [T]`` float64 attention
    weights (sum 1), ``extras["per_layer_head"] [L, H, T]`` (the query row of every layer and
    head), ``extras["matrices"] [L, H, T, T]`` (if ``return_matrices``), ``params["caveat"]``.

    Raises:
        ValueError: ``layer`` or ``head`` out of range.
    """
    cfg = cfg or AttentionConfig()
    t0 = time.perf_counter()
    m = attention_matrices(ctx)
    L, H = m.shape[:2]
    if not -L <= cfg.layer < L:
        raise ValueError(f"layer: expected -{L} <= layer < {L}, got {cfg.layer}")
    if cfg.head is not None and not 0 <= cfg.head < H:
        raise ValueError(f"head: expected 0 <= head < {H} or None, got {cfg.head}")
    per_layer_head = m[:, :, -1, :]  # [L, H, T, T] -> [L, H, T]: the query's row
    row = per_layer_head[cfg.layer]  # [H, T]
    values = row.mean(axis=0) if cfg.head is None else row[cfg.head]
    extras = {"per_layer_head": per_layer_head.astype(np.float64)}
    if cfg.return_matrices:
        extras["matrices"] = m.astype(np.float64)
    params = {**asdict(cfg), "layer_resolved": cfg.layer % L, "n_layers": L, "n_heads": H,
              "cost": AttentionExplainer.cost, "caveat": ATTENTION_CAVEAT}
    return _result(ctx, "attention", values, params, extras, t0)


def explain_rollout(ctx: QueryContext, cfg: RolloutConfig | None = None) -> Explanation:
    """Attention rollout (Abnar & Zuidema 2020) of the query.

    Returns an :class:`Explanation` with ``method="attention_rollout"``, ``values [T]`` float64
    (the query's row of the rollout, sums to 1), ``extras["rollout"] [T, T]`` (if
    ``return_matrices``), ``params["caveat"]``.
    """
    cfg = cfg or RolloutConfig()
    t0 = time.perf_counter()
    m = attention_matrices(ctx)
    r = rollout(m, cfg.residual_weight)
    extras = {}
    if cfg.return_matrices:
        extras["rollout"] = r
    params = {**asdict(cfg), "head_fusion": "mean", "n_layers": int(m.shape[0]),
              "cost": AttentionRolloutExplainer.cost, "caveat": ATTENTION_CAVEAT}
    return _result(ctx, "attention_rollout", r[-1], params, extras, t0)


def _score(ctx: QueryContext) -> float:
    with eval_mode(ctx.bundle.model):
        return ctx.score_logit()


class AttentionExplainer:
    """``"attention"``: query attention row (see :func:`explain`)."""

    name: ClassVar[str] = "attention"
    cost: ClassVar[str] = "1 forward pass of the context (explicit attention), O(L*H*T^2) memory"
    signed: ClassVar[bool] = False
    units: ClassVar[str] = UNITS
    config_class: ClassVar[type] = AttentionConfig

    def __init__(self, cfg: AttentionConfig | None = None):
        self.cfg = cfg or AttentionConfig()

    def explain(self, ctx: QueryContext) -> Explanation:
        return explain(ctx, self.cfg)


class AttentionRolloutExplainer:
    """``"attention_rollout"``: Abnar & Zuidema rollout (see :func:`explain_rollout`)."""

    name: ClassVar[str] = "attention_rollout"
    cost: ClassVar[str] = "1 forward pass of the context (explicit attention) + L products of [T, T] matrices"
    signed: ClassVar[bool] = False
    units: ClassVar[str] = UNITS
    config_class: ClassVar[type] = RolloutConfig

    def __init__(self, cfg: RolloutConfig | None = None):
        self.cfg = cfg or RolloutConfig()

    def explain(self, ctx: QueryContext) -> Explanation:
        return explain_rollout(ctx, self.cfg)
