"""SHAP values of the earlier transactions of the context (KernelSHAP).

Lundberg & Lee (2017), "A Unified Approach to Interpreting Model Predictions", NeurIPS,
arXiv:1705.07874; computed with the ``shap`` library's :class:`shap.KernelExplainer`.

* **Players**: the ``P = T - 1`` earlier transactions of the context. The **query is not a
  player**: its logit is the quantity being explained, and under the removal rule the query
  cannot be removed (nothing would be left to score). Its stand-alone logit is instead the base
  value. Its entry of ``values`` is ``0.0`` (``extras["player_mask"]`` is ``False`` there).
* **Coalition value** ``v(S)``: the query logit with every earlier transaction outside ``S``
  removed by the presence mask (:mod:`engine.explain.removal`: as if deleted from the window;
  time-since-previous recomputed, nobody attends to it).
* **Background**: the single empty coalition (all earlier transactions removed), so the base
  value is ``v({}) = f(query alone)`` — the logit of the query with no history in the window
  (``prev_time_s``, the time of the transaction just before the window, is kept). It is
  reported as ``reference_logit``.
* **Efficiency**: ``sum(values) = f(x) - f(query alone)``; the gap is reported as
  ``convergence_delta`` (KernelSHAP enforces efficiency, so it is float rounding, ~1e-6).
* **Sampling**: KernelSHAP enumerates every coalition when ``nsamples >= 2**P - 2`` (the result
  is then the exact Shapley value, ``extras["exact"] = True``); otherwise it samples coalitions
  (seeded) and solves the Shapley-kernel weighted regression, an estimate. Units: **logit**,
  signed.

``shap`` draws with NumPy's global RNG; it is seeded with ``seed`` and its previous state
restored afterwards.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np

from engine.explain.context import QueryContext
from engine.explain.base import Explanation
from engine.explain.removal import DEFAULT_BATCH_SIZE, REMOVAL_RULE, coalition_logits

UNITS = "logit"
BASELINE = (
    "players = earlier transactions (query always present, not a player); absent players removed "
    "by the presence mask. Background = empty coalition, so base value = logit of the query with "
    "all earlier context transactions removed. " + REMOVAL_RULE
)


@dataclass
class ShapConfig:
    """KernelSHAP settings.

    Attributes:
        nsamples: coalitions to evaluate, ``>= 2`` or ``None`` (default) for ``2 * P + 512``.
            Capped at ``2**P - 2`` (every coalition: exact Shapley values).
        seed: seed of the coalition sampling (NumPy global RNG, restored afterwards).
        batch_size: coalitions per forward pass, ``>= 1`` (default 64; memory
            ``~ batch_size * L * H * T^2`` floats).
    """

    nsamples: int | None = None
    seed: int = 0
    batch_size: int = DEFAULT_BATCH_SIZE

    def __post_init__(self) -> None:
        if self.nsamples is not None and self.nsamples < 2:
            raise ValueError(f"nsamples: expected >= 2 or None, got {self.nsamples}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size: expected >= 1, got {self.batch_size}")


def default_nsamples(n_players: int) -> int:
    """``2 * P + 512`` coalitions (capped at ``2**P - 2`` by KernelSHAP)."""
    return 2 * n_players + 512


def explain(ctx: QueryContext, cfg: ShapConfig | None = None) -> Explanation:
    """KernelSHAP values of the earlier context transactions for the query logit.

    Returns an :class:`Explanation` with ``method="shap"``, ``values [T]`` float64 logits
    (query's own entry 0), ``reference_logit`` = base value = f(query alone),
    ``convergence_delta = sum(values) - (f(x) - base)``, ``extras``: ``player_mask [T]``,
    ``nsamples`` (coalitions evaluated), ``exact``.
    """
    cfg = cfg or ShapConfig()
    t0 = time.perf_counter()
    T = ctx.T
    P = T - 1
    f_x = float(coalition_logits(ctx, np.ones((1, P), dtype=bool))[0])
    base = float(coalition_logits(ctx, np.zeros((1, P), dtype=bool))[0])
    nsamples = cfg.nsamples if cfg.nsamples is not None else default_nsamples(P)
    max_samples = 2**P - 2 if P <= 30 else 2**30
    n_used = min(nsamples, max_samples) if P >= 2 else 0
    phi = np.zeros(P)
    if P == 1:
        phi[0] = f_x - base  # one player takes the whole difference
    elif P >= 2:
        phi = _kernel_shap(ctx, P, nsamples, cfg)
    values = np.concatenate([phi, [0.0]])
    player_mask = np.zeros(T, dtype=bool)
    player_mask[:P] = True
    return Explanation(
        method="shap",
        entity_id=ctx.entity_id,
        transaction_ids=list(ctx.transaction_ids),
        query_transaction_id=ctx.query_transaction_id,
        values=values,
        units=UNITS,
        signed=True,
        baseline=BASELINE,
        params={**asdict(cfg), "nsamples_resolved": n_used, "n_players": P, "query_is_player": False,
                "algorithm": "shap.KernelExplainer (l1_reg=False)", "cost": ShapExplainer.cost},
        score_logit=f_x,
        reference_logit=base,
        convergence_delta=float(values.sum() - (f_x - base)),
        extras={"player_mask": player_mask, "nsamples": n_used, "exact": bool(P < 2 or nsamples >= max_samples)},
        elapsed_s=time.perf_counter() - t0,
    )


def _kernel_shap(ctx: QueryContext, P: int, nsamples: int, cfg: ShapConfig) -> np.ndarray:
    with warnings.catch_warnings():  # lazy: shap's import is slow and warns about matplotlib
        warnings.simplefilter("ignore")
        import shap

    def value_fn(coalitions: np.ndarray) -> np.ndarray:  # [n, P] 0/1 -> [n] logits
        return coalition_logits(ctx, np.asarray(coalitions) > 0.5, batch_size=cfg.batch_size)

    state = np.random.get_state()
    np.random.seed(cfg.seed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            explainer = shap.KernelExplainer(value_fn, np.zeros((1, P)))
            phi = explainer.shap_values(np.ones((1, P)), nsamples=nsamples, l1_reg=False, silent=True)
    finally:
        np.random.set_state(state)
    return np.asarray(phi, dtype=np.float64).reshape(-1)[:P]


class ShapExplainer:
    """``"shap"`` (see :func:`explain`)."""

    name: ClassVar[str] = "shap"
    cost: ClassVar[str] = (
        "min(nsamples, 2^P - 2) + 3 forward passes of the context (batched batch_size at a time) "
        "+ a [nsamples, P] weighted least squares; P = T - 1"
    )
    signed: ClassVar[bool] = True
    units: ClassVar[str] = UNITS
    config_class: ClassVar[type] = ShapConfig

    def __init__(self, cfg: ShapConfig | None = None):
        self.cfg = cfg or ShapConfig()

    def explain(self, ctx: QueryContext) -> Explanation:
        return explain(ctx, self.cfg)
