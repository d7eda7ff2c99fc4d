"""Occlusion (leave-one-out) of each earlier context transaction.

Zeiler & Fergus (2014), "Visualizing and Understanding Convolutional Networks",
arXiv:1311.2901, with whole transactions as the occluded units and deletion (not a grey patch)
as the occluder.

* ``values[j] = f(x) - f(x without j)`` for every earlier transaction ``j`` (``0 <= j < T-1``),
  where ``f`` is the query logit and "without ``j``" is the removal rule of
  :mod:`engine.explain.removal` (presence mask False = as if deleted from the window). Positive
  = the transaction pushed the score towards fraud. Units: **logit**; signed.
* The **query's own value is 0.0** by definition (``extras["player_mask"]`` is ``False`` there):
  the query cannot be removed, its logit is the quantity explained.
* All ``T - 1`` removals are scored in batched forward passes (``batch_size`` per pass).

Leave-one-out misses redundancy: two transactions that each suffice get ~0 each (SHAP splits
the credit instead).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np
import torch

from engine.explain.context import QueryContext
from engine.explain.base import Explanation
from engine.explain.removal import DEFAULT_BATCH_SIZE, REMOVAL_RULE, leave_one_out_masks, query_logits

UNITS = "logit"
BASELINE = "f(x) - f(x with that one earlier transaction removed); query's own value 0. " + REMOVAL_RULE


@dataclass
class OcclusionConfig:
    """Occlusion settings.

    Attributes:
        batch_size: removals scored per forward pass, ``>= 1`` (default 64).
    """

    batch_size: int = DEFAULT_BATCH_SIZE

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size: expected >= 1, got {self.batch_size}")


def explain(ctx: QueryContext, cfg: OcclusionConfig | None = None) -> Explanation:
    """Leave-one-out occlusion of every earlier transaction.

    Returns an :class:`Explanation` with ``method="occlusion"``, ``values [T]`` float64 logits
    (query's entry 0), ``extras``: ``player_mask [T]`` bool, ``removed_logits [T]`` (``f(x
    without j)``, the query's entry = ``f(x)``).
    """
    cfg = cfg or OcclusionConfig()
    t0 = time.perf_counter()
    T = ctx.T
    full = ctx.batch.present[0].clone().unsqueeze(0)  # [1, T]
    masks = torch.cat([full, leave_one_out_masks(ctx)])  # [T, T]: row 0 = nothing removed
    logits = query_logits(ctx, masks, batch_size=cfg.batch_size)
    f_x, removed = float(logits[0]), logits[1:]
    values = np.concatenate([f_x - removed, [0.0]])
    player_mask = np.zeros(T, dtype=bool)
    player_mask[: T - 1] = True
    return Explanation(
        method="occlusion",
        entity_id=ctx.entity_id,
        transaction_ids=list(ctx.transaction_ids),
        query_transaction_id=ctx.query_transaction_id,
        values=values,
        units=UNITS,
        signed=True,
        baseline=BASELINE,
        params={**asdict(cfg), "cost": OcclusionExplainer.cost},
        score_logit=f_x,
        extras={"player_mask": player_mask, "removed_logits": np.concatenate([removed, [f_x]])},
        elapsed_s=time.perf_counter() - t0,
    )


class OcclusionExplainer:
    """``"occlusion"`` (see :func:`explain`)."""

    name: ClassVar[str] = "occlusion"
    cost: ClassVar[str] = "T forward passes of the context (one per removal + 1), batched batch_size at a time"
    signed: ClassVar[bool] = True
    units: ClassVar[str] = UNITS
    config_class: ClassVar[type] = OcclusionConfig

    def __init__(self, cfg: OcclusionConfig | None = None):
        self.cfg = cfg or OcclusionConfig()

    def explain(self, ctx: QueryContext) -> Explanation:
        return explain(ctx, self.cfg)
