"""SHAP values of the earlier transactions of the context, each with a standard error.

Shapley values (Shapley 1953) of the game below, estimated by :mod:`engine.explain.shapley`
(exact enumeration, TimeSHAP pruning, repeated KernelSHAP: Lundberg & Lee 2017,
arXiv:1705.07874; Bento et al. 2021, arXiv:2012.00073; sources and the choice of estimator are
in that module's docstring).

* **Players**: the ``P = T - 1`` earlier transactions of the context. The **query is not a
  player**: its logit is the quantity being explained, and under the removal rule the query
  cannot be removed (nothing would be left to score). Its stand-alone logit is instead the base
  value. Its entry of ``values`` (and of ``standard_errors``) is ``0.0``
  (``extras["player_mask"]`` is ``False`` there).
* **Coalition value** ``v(S)``: the query logit with every earlier transaction outside ``S``
  removed by the presence mask (:mod:`engine.explain.removal`: as if deleted from the window;
  time-since-previous recomputed, nobody attends to it). Each distinct coalition is evaluated
  once (:class:`~engine.explain.shapley.CachedGame`), in batched model calls.
* **Base value**: ``v({}) = f(query alone)`` (``prev_time_s``, the time of the transaction just
  before the window, is kept), reported as ``reference_logit``.
* **Estimator** (``extras["estimator"]``):

  1. ``P <= exact_max_players`` (default :data:`~engine.explain.shapley.EXACT_MAX_PLAYERS` = 12):
     ``"exact"``, all ``2**P`` coalitions; standard errors 0.
  2. otherwise TimeSHAP pruning with ``prune_tolerance`` (logit): the oldest transactions
     whose joint effect (and every older prefix's) is within the tolerance become one player
     (``extras["pruned"]``); if the reduced game has ``<= exact_max_players`` players,
     ``"pruned+exact"``. The group's value (and standard error) is split equally over its
     transactions: per-transaction resolution inside the group is given up, by construction
     for transactions whose joint effect is negligible.
  3. otherwise ``"kernel"`` / ``"pruned+kernel"``: KernelSHAP with ``nsamples`` coalitions
     (default ``2 * P + 512``) per round, repeated with independent seeds (at least
     ``min_rounds``) until the top-``top_k`` ranking by ``|value|`` is resolved by the standard
     errors, or ``time_budget_s`` / ``max_rounds`` is reached (``extras["converged"]`` says
     which). ``values`` = mean of the rounds, ``standard_errors`` = their std / sqrt(rounds).

* **Additivity** ``sum(values) = f(x) - f(query alone)`` holds for every estimator by
  construction (KernelSHAP imposes it in each round), so it says nothing about sampling error.
  It is kept as ``extras["additivity_gap"]`` (float rounding), **not** as
  ``convergence_delta`` (``None`` for SHAP) and not as a check; ``standard_errors`` is the
  accuracy measure. Units: **logit**, signed.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np

from engine.explain.base import Explanation
from engine.explain.context import QueryContext
from engine.explain.removal import DEFAULT_BATCH_SIZE, REMOVAL_RULE, coalition_logits
from engine.explain.shapley import (
    ENUMERATION_LIMIT,
    EXACT_MAX_PLAYERS,
    CachedGame,
    exact_shapley,
    merged_game,
    repeated_kernel_shap,
    temporal_pruning,
)

UNITS = "logit"
BASELINE = (
    "players = earlier transactions (query always present, not a player); absent players removed "
    "by the presence mask. Background = empty coalition, so base value = logit of the query with "
    "all earlier context transactions removed. " + REMOVAL_RULE
)
ESTIMATORS = ("exact", "pruned+exact", "kernel", "pruned+kernel")


@dataclass
class ShapConfig:
    """SHAP settings (see the module docstring for how they are used).

    Attributes:
        nsamples: KernelSHAP coalitions per round, ``>= 2`` or ``None`` (default) for
            ``2 * P + 512`` (``P`` = players of the game, after pruning).
        seed: seed of the coalition sampling (round ``r`` uses ``SeedSequence([seed, r])``).
        batch_size: coalitions per forward pass, ``>= 1`` (default 64; memory
            ``~ batch_size * L * H * T^2`` floats).
        exact_max_players: enumerate all ``2**P`` coalitions up to this many players
            (``0..20``; default 12).
        prune_tolerance: TimeSHAP pruning tolerance in logits (default 0.01); ``None`` or 0
            turns pruning off. Only used when ``P > exact_max_players``.
        min_rounds: KernelSHAP rounds always run (``>= 2``; default 4).
        max_rounds: rounds at most (default 64).
        time_budget_s: no further round is started that would end past this many seconds of
            sampling (default 5.0; ``min_rounds`` are run regardless).
        top_k: ranks whose order must be resolved to stop (default 5).
        z: standard errors a gap must exceed to count as resolved (default 2).
        tie_tolerance: logit; a pair whose ``z * sd`` is below it counts as a practical tie
            (default 0.05, the project's completeness tolerance: ~1.25 probability points at most).
        stop_when_stable: ``False`` = exactly ``min_rounds`` rounds (no stopping rule).
    """

    nsamples: int | None = None
    seed: int = 0
    batch_size: int = DEFAULT_BATCH_SIZE
    exact_max_players: int = EXACT_MAX_PLAYERS
    prune_tolerance: float | None = 0.01
    min_rounds: int = 4
    max_rounds: int = 64
    time_budget_s: float = 5.0
    top_k: int = 5
    z: float = 2.0
    tie_tolerance: float = 0.05
    stop_when_stable: bool = True

    def __post_init__(self) -> None:
        if self.nsamples is not None and self.nsamples < 2:
            raise ValueError(f"nsamples: expected >= 2 or None, got {self.nsamples}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size: expected >= 1, got {self.batch_size}")
        if not 0 <= self.exact_max_players <= ENUMERATION_LIMIT:
            raise ValueError(f"exact_max_players: expected 0..{ENUMERATION_LIMIT}, got {self.exact_max_players}")
        if self.prune_tolerance is not None and self.prune_tolerance < 0:
            raise ValueError(f"prune_tolerance: expected >= 0 or None, got {self.prune_tolerance}")
        if self.min_rounds < 2:
            raise ValueError(f"min_rounds: expected >= 2, got {self.min_rounds}")
        if self.max_rounds < self.min_rounds:
            raise ValueError(f"max_rounds: expected >= min_rounds ({self.min_rounds}), got {self.max_rounds}")
        if not self.time_budget_s > 0:
            raise ValueError(f"time_budget_s: expected > 0, got {self.time_budget_s}")


def default_nsamples(n_players: int) -> int:
    """``2 * P + 512`` coalitions per KernelSHAP round."""
    return 2 * n_players + 512


def explain(ctx: QueryContext, cfg: ShapConfig | None = None) -> Explanation:
    """SHAP values and standard errors of the earlier context transactions for the query logit.

    Returns an :class:`Explanation` with ``method="shap"``, ``values [T]`` and
    ``standard_errors [T]`` float64 logits (query's own entries 0), ``reference_logit`` = base
    value = f(query alone), ``convergence_delta = None`` (see the module docstring) and
    ``extras``: ``player_mask [T]``, ``estimator`` (one of :data:`ESTIMATORS`), ``n_players``
    (players of the game solved, after pruning), ``pruned`` (``{"n_transactions", "positions",
    "tolerance", "joint_effect"}``: oldest transactions merged into one player), ``converged``
    (always True for the exact estimators), ``n_evaluations`` (distinct coalitions evaluated),
    ``rounds``, ``stop_reason``, ``nsamples`` (coalitions per round, 0 when exact), ``exact``
    (``estimator == "exact"``), ``additivity_gap`` (``sum(values) - (f(x) - base)``, imposed).
    """
    cfg = cfg or ShapConfig()
    t0 = time.perf_counter()
    T = ctx.T
    P = T - 1
    game = CachedGame(lambda keep: coalition_logits(ctx, keep, batch_size=cfg.batch_size), P)
    ends = game(np.vstack([np.ones((1, P), bool), np.zeros((1, P), bool)]))
    f_x, base = float(ends[0]), float(ends[1])
    phi, se = np.zeros(P), np.zeros(P)
    estimator, pruned, info = "exact", {"n_transactions": 0, "positions": [], "tolerance": cfg.prune_tolerance,
                                        "joint_effect": None}, {"rounds": 0, "stop_reason": "exact", "nsamples": 0}
    n_game, converged = P, True
    if 1 <= P <= max(cfg.exact_max_players, 1):  # one player takes the whole difference
        phi = exact_shapley(game, P)
    elif P > 1:
        pr = temporal_pruning(game, P, cfg.prune_tolerance)
        n = pr.n_pruned
        g = merged_game(game, P, n) if n else game
        n_game = P - n + 1 if n else P
        if n:
            pruned.update(n_transactions=n, positions=list(range(n)), joint_effect=float(pr.joint_effects[n - 1]))
        if n_game <= cfg.exact_max_players:
            phi_g, se_g = exact_shapley(g, n_game), np.zeros(n_game)
            estimator = "pruned+exact"
        else:
            nsamples = cfg.nsamples if cfg.nsamples is not None else default_nsamples(n_game)
            k = repeated_kernel_shap(g, n_game, nsamples, seed=cfg.seed, min_rounds=cfg.min_rounds,
                                     max_rounds=cfg.max_rounds, time_budget_s=cfg.time_budget_s, top_k=cfg.top_k,
                                     z=cfg.z, tie_tolerance=cfg.tie_tolerance, stop_when_stable=cfg.stop_when_stable)
            phi_g, se_g, converged = k.values, k.standard_errors, k.converged
            info = {"rounds": k.rounds, "stop_reason": k.stop_reason, "nsamples": k.nsamples}
            estimator = "pruned+kernel" if n else "kernel"
        if n:  # the group's value and error split equally over its transactions
            phi = np.concatenate([np.full(n, phi_g[0] / n), phi_g[1:]])
            se = np.concatenate([np.full(n, se_g[0] / n), se_g[1:]])
        else:
            phi, se = phi_g, se_g
    values = np.concatenate([phi, [0.0]])
    standard_errors = np.concatenate([se, [0.0]])
    player_mask = np.zeros(T, dtype=bool)
    player_mask[:P] = True
    extras: dict[str, Any] = {
        "player_mask": player_mask, "estimator": estimator, "n_players": int(n_game), "pruned": pruned,
        "converged": bool(converged), "n_evaluations": game.n_evaluations, **info,
        "exact": estimator == "exact", "additivity_gap": float(values.sum() - (f_x - base)),
    }
    return Explanation(
        method="shap",
        entity_id=ctx.entity_id,
        transaction_ids=list(ctx.transaction_ids),
        query_transaction_id=ctx.query_transaction_id,
        values=values,
        standard_errors=standard_errors,
        units=UNITS,
        signed=True,
        baseline=BASELINE,
        params={**asdict(cfg), "nsamples_resolved": info["nsamples"], "n_players": P, "query_is_player": False,
                "algorithm": _algorithm(estimator), "cost": ShapExplainer.cost},
        score_logit=f_x,
        reference_logit=base,
        convergence_delta=None,
        extras=extras,
        elapsed_s=time.perf_counter() - t0,
    )


def _algorithm(estimator: str) -> str:
    parts = []
    if estimator.startswith("pruned"):
        parts.append("TimeSHAP temporal pruning (prefix rule)")
    parts.append("exact enumeration of all coalitions" if estimator.endswith("exact")
                 else "shap.KernelExplainer (l1_reg=False) repeated with independent seeds")
    return " + ".join(parts)


class ShapExplainer:
    """``"shap"`` (see :func:`explain`)."""

    name: ClassVar[str] = "shap"
    cost: ClassVar[str] = (
        "P <= exact_max_players: 2^P forward passes; else 2(P-1) for pruning, then 2^P' (exact) or "
        "rounds x nsamples (KernelSHAP, distinct coalitions only) forward passes, batched batch_size at a "
        "time, within time_budget_s after min_rounds; P = T - 1, P' = players after pruning"
    )
    signed: ClassVar[bool] = True
    units: ClassVar[str] = UNITS
    config_class: ClassVar[type] = ShapConfig

    def __init__(self, cfg: ShapConfig | None = None):
        self.cfg = cfg or ShapConfig()

    def explain(self, ctx: QueryContext) -> Explanation:
        return explain(ctx, self.cfg)
