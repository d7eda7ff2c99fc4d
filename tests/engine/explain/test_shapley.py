"""Shapley estimators on toy games: exact enumeration, TimeSHAP pruning, repeated KernelSHAP
standard errors and the top-k stopping rule (engine/explain/shapley.py)."""

import itertools
import math

import numpy as np
import pytest

from engine.explain.shapley import (
    CachedGame,
    all_coalitions,
    exact_shapley,
    merged_game,
    repeated_kernel_shap,
    shapley_from_table,
    temporal_pruning,
    topk_resolved,
)


def permutation_shapley(v, P):
    """Shapley values by the permutation definition: mean marginal contribution over all P! orders."""
    phi = np.zeros(P)
    for order in itertools.permutations(range(P)):
        s = np.zeros(P, dtype=bool)
        prev = v(s[None])[0]
        for i in order:
            s[i] = True
            cur = v(s[None])[0]
            phi[i] += cur - prev
            prev = cur
    return phi / math.factorial(P)


def toy_game(P=5, seed=0):
    """Non-additive game: weights, pairwise interactions and a saturating term."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=P)
    inter = rng.normal(size=(P, P)) * 0.5

    def v(keep):
        z = np.asarray(keep, dtype=float)
        return z @ w + np.einsum("ni,ij,nj->n", z, np.triu(inter, 1), z) + np.tanh(z.sum(1) - 2)

    return v


def test_exact_equals_permutation_definition():
    v = toy_game(5)
    np.testing.assert_allclose(exact_shapley(v, 5), permutation_shapley(v, 5), atol=1e-12)
    assert exact_shapley(v, 5).sum() == pytest.approx(v(np.ones((1, 5)))[0] - v(np.zeros((1, 5)))[0])
    assert all_coalitions(3).tolist()[5] == [True, False, True]  # bit i of the row index = player i
    with pytest.raises(ValueError, match="power of two"):
        shapley_from_table(np.zeros(6))


def test_cached_game_evaluates_each_coalition_once():
    calls = []

    def fn(keep):
        calls.append(len(keep))
        return keep.sum(1).astype(float)

    g = CachedGame(fn, 3)
    keep = np.array([[1, 0, 1], [1, 0, 1], [0, 0, 0]], dtype=bool)
    np.testing.assert_array_equal(g(keep), [2, 2, 0])
    np.testing.assert_array_equal(g(keep[:1]), [2])
    assert calls == [2] and g.n_evaluations == 2
    with pytest.raises(ValueError, match="expected shape"):
        g(np.ones((1, 4), dtype=bool))


def _additive(weights):
    w = np.asarray(weights, dtype=float)
    return lambda keep: np.asarray(keep, dtype=float) @ w


def test_pruning_merges_negligible_far_past():
    P = 10
    w = np.r_[np.full(6, 1e-3), [0.5, -0.8, 1.2, 0.9]]  # the 6 oldest barely matter
    pr = temporal_pruning(_additive(w), P, tolerance=0.01)
    assert pr.n_pruned == 6 and len(pr.joint_effects) == P - 1
    np.testing.assert_allclose(pr.joint_effects[:6], np.cumsum(w[:6]))
    # the merged game: group player first, then the recent ones; its Shapley value = the group's sum
    phi = exact_shapley(merged_game(_additive(w), P, 6), P - 6 + 1)
    np.testing.assert_allclose(phi, np.r_[w[:6].sum(), w[6:]], atol=1e-12)


def test_pruning_keeps_a_far_past_transaction_that_matters():
    P = 10
    w = np.r_[[0.7], np.full(9, 1e-3)]  # the oldest transaction matters
    assert temporal_pruning(_additive(w), P, tolerance=0.01).n_pruned == 0
    # the oldest matters but a later old one cancels it in the group: TimeSHAP's largest-group rule
    # would merge all 4 (joint effect 0); the prefix rule must not
    w2 = np.r_[[0.7, 0.0, 0.0, -0.7], [0.5, 0.4, 0.3, 0.2, 0.1, 0.6]]
    pr = temporal_pruning(_additive(w2), P, tolerance=0.01)
    assert abs(pr.joint_effects[3]) < 1e-12 and pr.n_pruned == 0
    assert temporal_pruning(_additive(w), P, tolerance=None).n_pruned == 0


def test_standard_error_shrinks_and_covers_the_exact_value():
    P = 10
    v = toy_game(P, seed=3)
    exact = exact_shapley(v, P)
    few = repeated_kernel_shap(v, P, 60, seed=1, min_rounds=4, stop_when_stable=False)
    many = repeated_kernel_shap(v, P, 60, seed=1, min_rounds=64, stop_when_stable=False)
    assert few.rounds == 4 and many.rounds == 64 and many.stop_reason == "fixed rounds"
    assert np.median(many.standard_errors) < 0.5 * np.median(few.standard_errors)  # ~ 1 / sqrt(16)
    assert np.abs(many.values - exact).max() < np.abs(few.values - exact).max()
    covered = np.abs(many.values - exact) <= 3 * many.standard_errors
    assert covered.mean() >= 0.8
    np.testing.assert_allclose(many.values, many.round_values.mean(0))
    # each round imposes efficiency, whatever its error: the sum is no accuracy check
    assert many.values.sum() == pytest.approx(v(np.ones((1, P)))[0] - v(np.zeros((1, P)))[0], abs=1e-9)
    with pytest.raises(ValueError, match="min_rounds"):
        repeated_kernel_shap(v, P, 60, min_rounds=1)


def test_topk_rule():
    assert topk_resolved([3.0, 2.0, 1.0, 0.1], [0.1, 0.1, 0.1, 0.1], k=2)
    assert not topk_resolved([3.0, 2.9, 1.0, 0.1], [0.1, 0.1, 0.1, 0.1], k=2)  # ranks 1/2 overlap
    assert topk_resolved([3.0, 2.0, 1.95], [0.1, 0.1, 0.1], k=1, tie_tolerance=0)  # ranks 2/3 overlap: not in top 1
    # a practical tie estimated precisely counts as resolved; imprecisely it does not
    assert topk_resolved([3.0, 3.0, 1.0], [1e-4, 1e-4, 0.1], k=1, tie_tolerance=0.02)
    assert not topk_resolved([3.0, 3.0, 1.0], [0.1, 0.1, 0.1], k=1, tie_tolerance=0.02)
    assert not topk_resolved([-3.0, 2.95, 1.0], [0.1, 0.1, 0.1], k=1)  # ranked by |value|


def test_topk_rule_stops_sampling():
    P = 10
    w = np.linspace(2.0, 0.2, P)
    sep = lambda keep: _additive(w)(keep) + 0.05 * np.sin(np.asarray(keep, float).sum(1))  # noqa: E731
    est = repeated_kernel_shap(sep, P, 40, seed=0, min_rounds=3, max_rounds=50, top_k=3)
    assert est.converged and est.stop_reason == "top-k resolved" and est.rounds < 50
    # a symmetric game: every player has the same value, so the top-k order can never be resolved
    sym = lambda keep: np.tanh(np.asarray(keep, float).sum(1) - 4.0) * 3  # noqa: E731
    est = repeated_kernel_shap(sym, P, 40, seed=0, min_rounds=3, max_rounds=8, top_k=3, tie_tolerance=0.0)
    assert not est.converged and est.stop_reason == "max rounds" and est.rounds == 8
    est = repeated_kernel_shap(sym, P, 40, seed=0, min_rounds=3, max_rounds=10_000, top_k=3, tie_tolerance=0.0,
                               time_budget_s=1e-6)
    assert not est.converged and est.stop_reason == "time budget" and est.rounds == 3
