"""KernelSHAP over earlier transactions: efficiency, exactness against brute force, seeding."""

import itertools
import math

import numpy as np
import pytest
from explain_helpers import context, one_torch_thread  # noqa: F401 (autouse fixture)

from engine.explain.removal import coalition_logits
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


@pytest.mark.parametrize("position", [2, 5, 7])  # contexts of 3, 6 and 8 transactions
def test_equals_brute_force_exact_shapley(position):
    ctx = context(position)
    e = explain(ctx)
    assert e.extras["exact"]
    np.testing.assert_allclose(e.values[:-1], brute_force_shapley(ctx), atol=1e-4)
    assert e.values[-1] == 0.0 and not e.extras["player_mask"][-1]


@pytest.mark.parametrize("position,entity", [(12, "c0"), (30, "c0"), (25, "c1")])
def test_efficiency_when_sampled(position, entity):
    ctx = context(position, entity)
    e = explain(ctx, ShapConfig(nsamples=200))
    P = ctx.T - 1
    assert not e.extras["exact"] and e.extras["nsamples"] == 200 and e.params["n_players"] == P
    f_x = ctx.score_logit()
    alone = np.zeros((1, ctx.T), dtype=bool)
    alone[0, -1] = True
    import torch

    base = float(ctx.logits(torch.as_tensor(alone))[0])
    assert e.score_logit == pytest.approx(f_x, abs=1e-5)
    assert e.reference_logit == pytest.approx(base, abs=1e-5)
    assert e.values.sum() == pytest.approx(f_x - base, abs=1e-4)
    assert abs(e.convergence_delta) < 1e-4
    assert e.units == "logit" and e.signed and e.values.shape == (ctx.T,)


def test_seeded_and_close_to_exact_with_enough_samples():
    ctx = context(12)  # 12 players: 4094 coalitions in all
    a, b = explain(ctx, ShapConfig(nsamples=300, seed=1)), explain(ctx, ShapConfig(nsamples=300, seed=1))
    np.testing.assert_array_equal(a.values, b.values)
    c = explain(ctx, ShapConfig(nsamples=300, seed=2))
    assert not np.array_equal(a.values, c.values)
    exact = explain(ctx, ShapConfig(nsamples=5000))
    assert exact.extras["exact"] and exact.extras["nsamples"] == 4094
    approx = explain(ctx).values  # default 2 * 12 + 512 = 536 samples: an estimate
    np.testing.assert_allclose(approx, exact.values, atol=0.25)
    assert np.corrcoef(approx[:-1], exact.values[:-1])[0, 1] > 0.95


def test_tiny_contexts():
    e1 = explain(context(0))  # the query alone: no players
    np.testing.assert_array_equal(e1.values, [0.0])
    assert e1.reference_logit == pytest.approx(e1.score_logit)
    ctx = context(1)  # one player takes the whole difference
    e2 = explain(ctx)
    assert e2.values[0] == pytest.approx(e2.score_logit - e2.reference_logit, abs=1e-6)
    np.testing.assert_allclose(e2.values[:-1], brute_force_shapley(ctx), atol=1e-5)
    with pytest.raises(ValueError, match="nsamples"):
        ShapConfig(nsamples=1)
