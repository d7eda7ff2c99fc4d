"""SHAP over earlier transactions: exact enumeration against brute force, repeated KernelSHAP with
standard errors, TimeSHAP pruning, seeding, the JSON with standard_errors."""

import itertools
import json
import math

import numpy as np
import pytest
from explain_helpers import context, one_torch_thread  # noqa: F401 (autouse fixture)

from engine.explain.removal import coalition_logits
from engine.explain.base import Explanation
from engine.explain.shap_values import ShapConfig, explain


def brute_force_shapley(ctx) -> np.ndarray:
    """Exact Shapley values of the T-1 earlier transactions by enumerating all 2^P coalitions."""
    P = ctx.T - 1
    coalitions = np.array(list(itertools.product([False, True], repeat=P)), dtype=bool)  # [2^P, P]
    v = dict(zip(map(tuple, coalitions), coalition_logits(ctx, coalitions)))
    phi = np.zeros(P)
    for s in coalitions:
        k = int(s.sum())
        for i in np.flatnonzero(~s):
            w = math.factorial(k) * math.factorial(P - k - 1) / math.factorial(P)
            with_i = s.copy()
            with_i[i] = True
            phi[i] += w * (v[tuple(with_i)] - v[tuple(s)])
    return phi


@pytest.mark.parametrize("position", [2, 5, 7, 12])  # contexts of 3, 6, 8 and 13 transactions
def test_equals_brute_force_exact_shapley(position):
    ctx = context(position)
    e = explain(ctx)
    P = ctx.T - 1
    assert e.extras["exact"] and e.extras["estimator"] == "exact" and e.extras["n_evaluations"] == 2**P
    np.testing.assert_allclose(e.values[:-1], brute_force_shapley(ctx), atol=1e-5)
    assert e.values[-1] == 0.0 and not e.extras["player_mask"][-1]
    np.testing.assert_array_equal(e.standard_errors, np.zeros(ctx.T))
    assert e.convergence_delta is None and abs(e.extras["additivity_gap"]) < 1e-9


def _base_logit(ctx):
    import torch

    alone = np.zeros((1, ctx.T), dtype=bool)
    alone[0, -1] = True
    return float(ctx.logits(torch.as_tensor(alone))[0])


@pytest.mark.parametrize("position,entity", [(15, "c0"), (25, "c1")])
def test_kernel_estimate_with_standard_errors(position, entity):
    ctx = context(position, entity)
    P = ctx.T - 1
    assert P > 12  # beyond exact enumeration
    e = explain(ctx, ShapConfig(prune_tolerance=None, time_budget_s=2.0))
    x = e.extras
    assert x["estimator"] == "kernel" and not x["exact"] and x["n_players"] == P and x["rounds"] >= 4
    assert x["nsamples"] == 2 * P + 512 and x["stop_reason"] in ("top-k resolved", "time budget", "max rounds")
    assert x["converged"] == (x["stop_reason"] == "top-k resolved")
    assert 0 < x["n_evaluations"] <= x["rounds"] * x["nsamples"] + 2
    assert e.score_logit == pytest.approx(ctx.score_logit(), abs=1e-5)
    assert e.reference_logit == pytest.approx(_base_logit(ctx), abs=1e-5)
    assert e.values.sum() == pytest.approx(e.score_logit - e.reference_logit, abs=1e-4)  # imposed, not a check
    se = e.standard_errors
    assert se.shape == (ctx.T,) and se[-1] == 0.0 and (se[:-1] > 0).all()
    assert e.units == "logit" and e.signed and e.values.shape == (ctx.T,)


def test_standard_errors_cover_exact_values_on_the_model():
    ctx = context(12)  # 12 players: exact by default; forced to the sampled estimator here
    exact = explain(ctx).values[:-1]
    cfg = dict(exact_max_players=0, prune_tolerance=None, nsamples=200, stop_when_stable=False)
    few, many = explain(ctx, ShapConfig(min_rounds=3, **cfg)), explain(ctx, ShapConfig(min_rounds=24, **cfg))
    assert many.extras["rounds"] == 24 and many.extras["estimator"] == "kernel"
    assert np.median(many.standard_errors[:-1]) < 0.6 * np.median(few.standard_errors[:-1])
    err = np.abs(many.values[:-1] - exact)
    assert (err <= 3 * many.standard_errors[:-1] + 1e-9).mean() >= 0.8
    assert np.sqrt(np.mean(err**2)) < np.sqrt(np.mean((few.values[:-1] - exact) ** 2))


def test_seeded():
    ctx = context(12)
    cfg = dict(exact_max_players=0, prune_tolerance=None, nsamples=150, stop_when_stable=False, min_rounds=2)
    a, b = explain(ctx, ShapConfig(seed=1, **cfg)), explain(ctx, ShapConfig(seed=1, **cfg))
    np.testing.assert_array_equal(a.values, b.values)
    np.testing.assert_array_equal(a.standard_errors, b.standard_errors)
    assert not np.array_equal(a.values, explain(ctx, ShapConfig(seed=2, **cfg)).values)


def test_pruning_on_the_model_merges_oldest_into_one_player():
    ctx = context(15)
    P = ctx.T - 1
    e = explain(ctx, ShapConfig(prune_tolerance=1e6, exact_max_players=4))  # everything "negligible"
    pr = e.extras["pruned"]
    assert e.extras["estimator"] == "pruned+exact" and pr["n_transactions"] == P - 1
    assert pr["positions"] == list(range(P - 1)) and e.extras["n_players"] == 2
    np.testing.assert_allclose(e.values[: P - 1], e.values[0])  # the group's value split equally
    assert e.values.sum() == pytest.approx(e.score_logit - e.reference_logit, abs=1e-5)
    # a tolerance nothing meets: no pruning, the sampled estimator
    e0 = explain(ctx, ShapConfig(prune_tolerance=1e-12, min_rounds=2, stop_when_stable=False))
    assert e0.extras["pruned"]["n_transactions"] == 0 and e0.extras["estimator"] == "kernel"


def test_json_has_standard_errors_aligned_with_values():
    ctx = context(15)
    e = explain(ctx, ShapConfig(min_rounds=2, stop_when_stable=False))
    d = json.loads(e.to_json())
    assert len(d["standard_errors"]) == len(d["values"]) == ctx.T
    assert d["standard_errors"][-1] == 0.0 and d["extras"]["estimator"] in ("kernel", "pruned+kernel")
    for k in ("n_players", "pruned", "converged", "n_evaluations"):
        assert k in d["extras"]
    back = Explanation.from_dict(d)
    np.testing.assert_allclose(back.standard_errors, e.standard_errors)
    assert list(e.to_frame()["standard_error"]) == pytest.approx(list(e.standard_errors))
    with pytest.raises(ValueError, match="standard_errors"):
        Explanation.from_dict({**d, "standard_errors": d["standard_errors"][:-1]})


def test_tiny_contexts():
    e1 = explain(context(0))  # the query alone: no players
    np.testing.assert_array_equal(e1.values, [0.0])
    np.testing.assert_array_equal(e1.standard_errors, [0.0])
    assert e1.reference_logit == pytest.approx(e1.score_logit)
    ctx = context(1)  # one player takes the whole difference
    e2 = explain(ctx, ShapConfig(exact_max_players=0))
    assert e2.values[0] == pytest.approx(e2.score_logit - e2.reference_logit, abs=1e-6)
    np.testing.assert_allclose(e2.values[:-1], brute_force_shapley(ctx), atol=1e-5)
    with pytest.raises(ValueError, match="nsamples"):
        ShapConfig(nsamples=1)
    with pytest.raises(ValueError, match="min_rounds"):
        ShapConfig(min_rounds=1)
    with pytest.raises(ValueError, match="exact_max_players"):
        ShapConfig(exact_max_players=21)
