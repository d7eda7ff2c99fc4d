"""Shapley values of a coalition game, with their sampling error: exact enumeration, temporal
pruning (TimeSHAP) and repeated KernelSHAP with standard errors.

The game: ``P`` players (for SHAP of a query: its earlier transactions, oldest first) and a
value function ``v(keep [n, P] bool) -> [n] float64`` (logits). The Shapley value of player
``i`` is ``phi_i = sum over S not containing i of |S|! (P - |S| - 1)! / P! * (v(S + i) - v(S))``
(Shapley 1953). Three estimators, chosen by :mod:`engine.explain.shap_values`:

* :func:`exact_shapley` - every one of the ``2**P`` coalitions evaluated (one batched call) and
  the formula above applied; no sampling error. Used for ``P <=``
  :data:`EXACT_MAX_PLAYERS` (12: 4,096 coalitions, about 1 s on the demo model with one CPU
  thread; each further player doubles it).
* :func:`temporal_pruning` - TimeSHAP's temporal coalition pruning (Bento et al. 2021,
  "TimeSHAP: Explaining Recurrent Models through Sequence Perturbations", KDD,
  arXiv:2012.00073; github.com/feedzai/timeshap ``explainer/pruning.py``). For each split
  ``s`` the game is reduced to two players, the ``s`` oldest transactions as one group and the
  rest as the other, and the group's exact two-player Shapley value is
  ``0.5 * ((v(all) - v(recent)) + (v(old) - v(none)))`` (``2 (P - 1) + 2`` evaluations for all
  splits). TimeSHAP merges the largest old group whose value is within the tolerance; here the
  rule is stricter: the ``s`` oldest are merged only if **every** older prefix (``1..s``
  oldest) is within the tolerance too, so one far-past transaction that matters on its own
  blocks the merge even when a later one happens to cancel it in the group.
* :func:`repeated_kernel_shap` - KernelSHAP (Lundberg & Lee 2017, "A Unified Approach to
  Interpreting Model Predictions", NeurIPS, arXiv:1705.07874; ``shap.KernelExplainer``,
  ``l1_reg=False``) run ``R`` times with independent seeds; the estimate is the mean of the
  ``R`` estimates and its **standard error** is their standard deviation / ``sqrt(R)`` (the
  usual standard error of a mean of independent replicates). More rounds are drawn until the
  top-``k`` ranking is resolved (:func:`topk_resolved`) or a time budget / round cap is hit.

Why replicated KernelSHAP rather than a single run or permutation sampling: one KernelSHAP run
has no usable error estimate (it imposes efficiency, so ``sum(values) = v(all) - v(none)``
holds whatever the sampling error), and ``shap`` mixes deterministically enumerated coalition
sizes with sampled ones, so no closed-form variance applies. Independent replicates give an
unbiased variance of the mean whatever the estimator does inside a round (Covert & Lee 2021,
"Improving KernelSHAP: Practical Shapley Value Estimation via Linear Regression", AISTATS,
arXiv:2012.01536, likewise detect KernelSHAP convergence from the estimate's standard
deviation). Permutation sampling (Castro et al. 2009; Strumbelj & Kononenko 2014) would give
per-player errors directly but pays ``P`` evaluations per permutation; the repeated estimator
reuses the project's validated KernelSHAP, and ``bench explanations`` measures its error
against exact or 20,000-coalition references (bench/results/explanations.md).

Everything here is NumPy over a value function; no torch, no model.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

ValueFn = Callable[[np.ndarray], np.ndarray]

#: players solved exactly by enumerating all 2**P coalitions (4,096 at 12; measured ~1 s per
#: query on the demo model, one CPU thread; see bench/results/explanations.md)
EXACT_MAX_PLAYERS = 12
#: hard cap on exact enumeration (2**20 coalitions), whatever the configuration asks
ENUMERATION_LIMIT = 20


class CachedGame:
    """A value function that evaluates each distinct coalition once.

    ``game(keep [n, P])`` -> ``[n]`` float64: coalitions already seen are served from memory, the
    others are passed (deduplicated, in first-seen order) to ``fn`` in one call.
    ``n_evaluations`` = distinct coalitions evaluated so far (model calls are ``fn``'s business).

    Raises:
        ValueError: ``keep`` is not ``[n, n_players]``.
    """

    def __init__(self, fn: ValueFn, n_players: int):
        self.fn = fn
        self.n_players = int(n_players)
        self._cache: dict[bytes, float] = {}

    @property
    def n_evaluations(self) -> int:
        return len(self._cache)

    def __call__(self, keep: np.ndarray) -> np.ndarray:
        keep = np.asarray(keep)
        if keep.ndim != 2 or keep.shape[1] != self.n_players:
            raise ValueError(f"keep: expected shape [n, {self.n_players}], got {keep.shape}")
        keep = keep > 0.5 if keep.dtype != bool else keep
        keys = [r.tobytes() for r in np.packbits(keep, axis=1)]
        new: dict[bytes, int] = {}
        for i, k in enumerate(keys):
            if k not in self._cache and k not in new:
                new[k] = i
        if new:
            vals = np.asarray(self.fn(keep[list(new.values())]), dtype=np.float64).reshape(-1)
            self._cache.update(zip(new.keys(), vals.tolist()))
        return np.array([self._cache[k] for k in keys], dtype=np.float64)


def all_coalitions(n_players: int) -> np.ndarray:
    """``[2**P, P]`` bool: row ``m`` holds player ``i`` iff bit ``i`` of ``m`` is set.

    Raises:
        ValueError: ``P`` outside ``0..ENUMERATION_LIMIT``.
    """
    if not 0 <= n_players <= ENUMERATION_LIMIT:
        raise ValueError(f"n_players: expected 0..{ENUMERATION_LIMIT} for enumeration, got {n_players}")
    idx = np.arange(2**n_players, dtype=np.int64)[:, None]
    return ((idx >> np.arange(n_players, dtype=np.int64)) & 1).astype(bool)


def shapley_from_table(v: np.ndarray) -> np.ndarray:
    """Exact Shapley values ``[P]`` from the values ``v [2**P]`` of every coalition (indexed as
    :func:`all_coalitions`): ``phi_i = sum_{S not i} w(|S|) (v(S + i) - v(S))`` with
    ``w(s) = 1 / (P * C(P - 1, s))`` (= ``s! (P - s - 1)! / P!``).

    Raises:
        ValueError: ``len(v)`` is not a power of two.
    """
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    P = int(round(math.log2(len(v)))) if len(v) else -1
    if P < 0 or 2**P != len(v):
        raise ValueError(f"v: expected 2**P coalition values (a power of two), got {len(v)}")
    if P == 0:
        return np.zeros(0)
    idx = np.arange(2**P, dtype=np.int64)
    size = all_coalitions(P).sum(axis=1)
    w = np.array([1.0 / (P * math.comb(P - 1, s)) for s in range(P)])
    phi = np.empty(P)
    for i in range(P):
        bit = 1 << i
        without = idx[(idx & bit) == 0]
        phi[i] = float(np.sum(w[size[without]] * (v[without | bit] - v[without])))
    return phi


def exact_shapley(game: ValueFn, n_players: int) -> np.ndarray:
    """Exact Shapley values ``[P]`` of ``game`` (all ``2**P`` coalitions in one call)."""
    return shapley_from_table(game(all_coalitions(n_players)))


@dataclass
class PruningResult:
    """Outcome of :func:`temporal_pruning`.

    Attributes:
        n_pruned: oldest players merged into one player (0 = no pruning; otherwise ``>= 2``).
        tolerance: the tolerance used (logit; ``None`` = pruning off).
        joint_effects: ``[P - 1]`` float64: entry ``s - 1`` = two-player Shapley value (logit) of
            the ``s`` oldest players as one group against the rest, ``s = 1..P-1``; empty when
            pruning was not run.
    """

    n_pruned: int
    tolerance: float | None
    joint_effects: np.ndarray = field(default_factory=lambda: np.zeros(0))


def temporal_pruning(game: ValueFn, n_players: int, tolerance: float | None) -> PruningResult:
    """TimeSHAP temporal coalition pruning with the prefix rule (see the module docstring).

    Players are ordered oldest first. Returns the number of oldest players to merge: the largest
    ``s >= 2`` such that ``|joint_effects[s' - 1]| <= tolerance`` for every ``s' <= s``, and 0 when
    there is none, ``tolerance`` is ``None`` / ``<= 0`` or ``P < 3``. At most ``P - 1`` are merged
    (the most recent player always stays on its own).
    """
    P = int(n_players)
    if tolerance is None or not tolerance > 0 or P < 3:
        return PruningResult(0, tolerance)
    s = np.arange(1, P)
    older = np.arange(P)[None, :] < s[:, None]  # [P-1, P]: the s oldest
    keep = np.vstack([np.ones((1, P), bool), np.zeros((1, P), bool), ~older, older])
    v = game(keep)
    v_all, v_none, v_recent, v_old = v[0], v[1], v[2 : P + 1], v[P + 1 :]
    effects = 0.5 * ((v_all - v_recent) + (v_old - v_none))
    leading = int(np.cumprod(np.abs(effects) <= tolerance).sum())
    return PruningResult(leading if leading >= 2 else 0, float(tolerance), effects)


def merged_game(game: ValueFn, n_players: int, n_pruned: int) -> ValueFn:
    """The game with the ``n_pruned`` oldest players merged: player 0 = the group (all present or
    all absent together), players ``1..P - n_pruned`` = the remaining ones in order."""
    def value(keep: np.ndarray) -> np.ndarray:
        keep = np.asarray(keep) > 0.5
        full = np.empty((keep.shape[0], n_players), dtype=bool)
        full[:, :n_pruned] = keep[:, :1]
        full[:, n_pruned:] = keep[:, 1:]
        return game(full)

    return value


def topk_resolved(values: np.ndarray, standard_errors: np.ndarray, k: int, z: float = 2.0,
                  tie_tolerance: float = 0.05) -> bool:
    """Whether the top-``k`` ranking by ``|value|`` is resolved by the standard errors.

    Rank the players by ``|value|``; for each adjacent pair among the first ``k + 1`` (ranks
    ``j, j+1``, ``j < k``) with gap ``g = |v_j| - |v_{j+1}|`` and ``sd = sqrt(se_j^2 + se_{j+1}^2)``
    the pair is resolved when ``g >= z * sd`` (ordered beyond sampling error) or
    ``z * sd <= tie_tolerance`` (estimated so precisely that any remaining swap is between values
    within ``tie_tolerance`` logit: a practical tie). True when every pair is resolved (always
    for ``P <= 1`` or ``k <= 0``).
    """
    a = np.abs(np.asarray(values, dtype=np.float64))
    se = np.asarray(standard_errors, dtype=np.float64)
    order = np.argsort(-a, kind="stable")
    for j in range(min(int(k), len(a) - 1)):
        hi, lo = order[j], order[j + 1]
        sd = math.hypot(se[hi], se[lo])
        if not (a[hi] - a[lo] >= z * sd or z * sd <= tie_tolerance):
            return False
    return True


@dataclass
class KernelEstimate:
    """Outcome of :func:`repeated_kernel_shap`.

    Attributes:
        values: ``[P]`` float64 mean of the round estimates (logit).
        standard_errors: ``[P]`` float64 std (ddof 1) of the round estimates / ``sqrt(R)``.
        rounds: ``R``, KernelSHAP runs made.
        converged: the top-k ranking was resolved (:func:`topk_resolved`) before a limit.
        stop_reason: ``"top-k resolved"``, ``"time budget"``, ``"max rounds"`` or
            ``"fixed rounds"`` (stopping rule off).
        round_values: ``[R, P]`` the individual estimates.
        nsamples: coalitions per round.
        elapsed_s: wall time (seconds).
    """

    values: np.ndarray
    standard_errors: np.ndarray
    rounds: int
    converged: bool
    stop_reason: str
    round_values: np.ndarray
    nsamples: int
    elapsed_s: float


def kernel_shap_round(game: ValueFn, n_players: int, nsamples: int, seed: int) -> np.ndarray:
    """One KernelSHAP estimate ``[P]`` (``shap.KernelExplainer``, background = the empty
    coalition, ``l1_reg=False``, ``nsamples`` coalitions). ``shap`` samples with NumPy's global
    RNG: it is seeded with ``seed`` and restored afterwards."""
    shap = _shap()
    state = np.random.get_state()
    np.random.seed(int(seed) % 2**32)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            explainer = shap.KernelExplainer(lambda z: game(np.asarray(z) > 0.5), np.zeros((1, n_players)))
            phi = explainer.shap_values(np.ones((1, n_players)), nsamples=nsamples, l1_reg=False, silent=True)
    finally:
        np.random.set_state(state)
    return np.asarray(phi, dtype=np.float64).reshape(-1)[:n_players]


def _shap():
    """The ``shap`` module, imported lazily (slow, and it warns about matplotlib)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import shap
    return shap


def round_seed(seed: int, r: int) -> int:
    """Independent seed of round ``r`` (NumPy ``SeedSequence([seed, r])``)."""
    return int(np.random.SeedSequence([int(seed) % 2**63, int(r)]).generate_state(1)[0])


def repeated_kernel_shap(
    game: ValueFn,
    n_players: int,
    nsamples: int,
    *,
    seed: int = 0,
    min_rounds: int = 4,
    max_rounds: int = 64,
    time_budget_s: float = 5.0,
    top_k: int = 5,
    z: float = 2.0,
    tie_tolerance: float = 0.05,
    stop_when_stable: bool = True,
) -> KernelEstimate:
    """KernelSHAP repeated with independent seeds until the top-``k`` ranking is resolved.

    Runs at least ``min_rounds`` (``>= 2``: a standard error needs two) rounds of ``nsamples``
    coalitions each; after each further round stops when :func:`topk_resolved` holds
    (``converged``), when ``max_rounds`` is reached, or when another round would end past
    ``time_budget_s`` seconds (projected from the mean round time). With
    ``stop_when_stable=False`` exactly ``min_rounds`` rounds are run.

    Raises:
        ValueError: ``min_rounds < 2``, ``max_rounds < min_rounds`` or ``nsamples < 2``.
    """
    if min_rounds < 2:
        raise ValueError(f"min_rounds: expected >= 2 (a standard error needs two rounds), got {min_rounds}")
    if max_rounds < min_rounds:
        raise ValueError(f"max_rounds: expected >= min_rounds ({min_rounds}), got {max_rounds}")
    if nsamples < 2:
        raise ValueError(f"nsamples: expected >= 2, got {nsamples}")
    _shap()  # a first import (seconds) must not eat the time budget
    t0 = time.perf_counter()
    est: list[np.ndarray] = []
    converged, reason = False, "fixed rounds"
    while True:
        est.append(kernel_shap_round(game, n_players, nsamples, round_seed(seed, len(est))))
        R = len(est)
        if R < min_rounds:
            continue
        if not stop_when_stable:
            break
        arr = np.vstack(est)
        mean, se = arr.mean(axis=0), arr.std(axis=0, ddof=1) / math.sqrt(R)
        if topk_resolved(mean, se, top_k, z, tie_tolerance):
            converged, reason = True, "top-k resolved"
            break
        if R >= max_rounds:
            reason = "max rounds"
            break
        elapsed = time.perf_counter() - t0
        if elapsed + elapsed / R > time_budget_s:
            reason = "time budget"
            break
    arr = np.vstack(est)
    R = len(est)
    return KernelEstimate(values=arr.mean(axis=0), standard_errors=arr.std(axis=0, ddof=1) / math.sqrt(R),
                          rounds=R, converged=converged, stop_reason=reason, round_values=arr,
                          nsamples=int(nsamples), elapsed_s=time.perf_counter() - t0)


__all__ = ["CachedGame", "ENUMERATION_LIMIT", "EXACT_MAX_PLAYERS", "KernelEstimate", "PruningResult",
           "all_coalitions", "exact_shapley", "kernel_shap_round", "merged_game", "repeated_kernel_shap",
           "round_seed", "shapley_from_table", "temporal_pruning", "topk_resolved"]
