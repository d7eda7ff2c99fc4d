"""Integrated Gradients: completeness against independently computed f(x) - f(baseline), for the
typical-transaction baselines (default) and the former zero baseline (split path)."""

import numpy as np
import pytest
import torch
from explain_helpers import context, one_torch_thread  # noqa: F401 (autouse fixture)

from engine.explain.integrated_gradients import IGConfig, explain
from engine.explain.reference import reference_context_batch, reference_row_embedding

Z = {"baseline": "zero"}  # the former baseline: the split-path quadrature tests below are about it


def _f_baseline(ctx) -> float:
    m = ctx.bundle.model
    with torch.no_grad():
        x = m.embed(ctx.batch)
        return float(m.forward_from_embeddings(torch.zeros_like(x), ctx.batch)[0][0, -1])


@pytest.mark.parametrize("position", [0, 3, 12, 30])  # 30: a later window (prev_time_s set)
@pytest.mark.parametrize("adaptive", [False, True])
def test_completeness_at_50_steps(position, adaptive):
    ctx = context(position)
    e = explain(ctx, IGConfig(**Z) if adaptive else IGConfig(target_delta=None, **Z))
    f_x, f_0 = ctx.score_logit(), _f_baseline(ctx)
    assert e.method == "integrated_gradients" and e.units == "logit" and e.signed
    assert e.values.shape == (ctx.T,) and e.field_values.shape == (ctx.T, len(ctx.field_names))
    assert e.transaction_ids[-1] == ctx.query_transaction_id and e.field_names == ctx.field_names
    np.testing.assert_allclose(e.field_values.sum(-1), e.values, atol=1e-9)
    assert e.score_logit == pytest.approx(f_x, abs=1e-5)
    assert e.reference_logit == pytest.approx(f_0, abs=1e-5)
    gap = e.values.sum() - (f_x - f_0)
    assert abs(gap) <= abs(e.convergence_delta) + 1e-4
    assert abs(e.convergence_delta) < 1e-2
    if adaptive:
        assert abs(e.convergence_delta) <= 5e-3 and e.params["n_steps_total"] <= 400
    else:
        assert e.params["n_steps_total"] == 50 and e.params["segments"] == 5


def test_adaptive_refinement_shrinks_the_gap():
    ctx = context(30)
    fixed = explain(ctx, IGConfig(target_delta=None, **Z))
    target = 1e-5
    assert abs(fixed.convergence_delta) > target  # the 50-step rule misses the target: refinement has work to do
    fine = explain(ctx, IGConfig(target_delta=target, max_steps=600, **Z))
    assert fine.params["refinements"] >= 1 and 50 < fine.params["n_steps_total"] <= 600
    assert abs(fine.convergence_delta) < min(target, abs(fixed.convergence_delta))
    path = fine.params["path"]
    assert path[0] == 0.0 and path[-1] == 1.0 and all(a < b for a, b in zip(path, path[1:]))
    assert len(fine.extras["segment_deltas"]) == len(path) - 1 == fine.params["segments"]
    gap = fine.values.sum() - (ctx.score_logit() - _f_baseline(ctx))
    assert abs(gap) <= abs(fine.convergence_delta) + 1e-4
    np.testing.assert_allclose(fine.field_values, fixed.field_values, atol=2e-2)


def test_reported_delta_is_honest_for_the_plain_single_segment_rule():
    """Captum's plain rule over [0, 1] under-resolves the LayerNorm's steep start; the reported
    delta must say so (this is why the default splits the path)."""
    ctx = context(12)
    e = explain(ctx, IGConfig(path_breakpoints=(), target_delta=None, **Z))
    gap = e.values.sum() - (ctx.score_logit() - _f_baseline(ctx))
    assert gap == pytest.approx(e.convergence_delta, abs=1e-4)
    assert e.params["segments"] == 1
    split = explain(ctx, IGConfig(**Z))
    assert abs(split.convergence_delta) < abs(e.convergence_delta)


def test_split_path_converges_to_the_same_attributions():
    ctx = context(7)
    a = explain(ctx, IGConfig(n_steps=50, target_delta=None, **Z))
    b = explain(ctx, IGConfig(n_steps=250, target_delta=None, **Z))  # 50 Gauss-Legendre points per segment
    np.testing.assert_allclose(a.field_values, b.field_values, atol=5e-3)
    c = explain(ctx, IGConfig(n_steps=1000, max_steps=1000, method="riemann_trapezoid", target_delta=None, **Z))
    # the zero baseline's path changes steeply near alpha ~ 0.01 (LayerNorm), where 1,000 equal trapezoids are
    # coarse: measured 0.0118 logit with the activity fields; the Gauss-Legendre split path above is what ships
    assert abs(c.convergence_delta) < 2e-2
    np.testing.assert_allclose(c.field_values, b.field_values, rtol=1e-2, atol=2e-2)  # other rule, same integral


def test_internal_batch_size_does_not_change_the_result():
    ctx = context(9)
    a = explain(ctx, IGConfig(internal_batch_size=64))
    b = explain(ctx, IGConfig(internal_batch_size=7))
    np.testing.assert_allclose(a.field_values, b.field_values, atol=1e-5)


def test_config_validation_and_inference_mode():
    with pytest.raises(ValueError, match="n_steps"):
        IGConfig(n_steps=0)
    with pytest.raises(ValueError, match="method"):
        IGConfig(method="simpson")
    with pytest.raises(ValueError, match="path_breakpoints"):
        IGConfig(path_breakpoints=(0.5, 0.1))
    with pytest.raises(ValueError, match="max_steps"):
        IGConfig(n_steps=500)
    with pytest.raises(ValueError, match="target_delta"):
        IGConfig(target_delta=0.0)
    with pytest.raises(ValueError, match="baseline"):
        IGConfig(baseline="mean")
    with pytest.raises(ValueError, match="scope"):
        IGConfig(scope="history")
    assert IGConfig().path_breakpoints == () and IGConfig(**Z).path_breakpoints == (1e-4, 1e-3, 1e-2, 1e-1)
    ctx = context(3)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="inference_mode"):
        explain(ctx)
    with torch.no_grad():  # a caller's no_grad must not break IG
        assert abs(explain(ctx).convergence_delta) < 1e-2


POSITIONS = [3, 7, 12, 20, 30]


def _typical_query_logit(ctx) -> float:
    """f(history as it is, query replaced by the typical transaction), via forward_from_embeddings."""
    m = ctx.bundle.model
    with torch.no_grad():
        x = m.embed(ctx.batch)
        x[0, -1] = reference_row_embedding(ctx)
        return float(m.forward_from_embeddings(x, ctx.batch)[0][0, -1])


@pytest.mark.parametrize("position", POSITIONS)
def test_typical_timeline_baseline_is_a_real_input_and_complete(position):
    ctx = context(position)
    e = explain(ctx)  # default: typical timeline
    with torch.no_grad():  # f(baseline) = the model's own score of the typical-timeline input (fast path)
        f_ref = float(ctx.bundle.model.query_logits(reference_context_batch(ctx))[0])
    assert e.reference_logit == pytest.approx(f_ref, abs=1e-4)
    assert e.score_logit == pytest.approx(ctx.score_logit(), abs=1e-5)
    assert abs(e.convergence_delta) < 5e-3 and e.params["segments"] >= 1
    assert e.values.sum() == pytest.approx(e.score_logit - e.reference_logit, abs=6e-3)
    names = ctx.field_names
    for f in ("hour", "weekday", "time_since_prev"):  # timing kept in the baseline: nothing to attribute
        np.testing.assert_allclose(e.field_values[:, names.index(f)], 0.0, atol=1e-9)
    assert "typical" in e.baseline and e.extras["reference_sources"]["amount"]


@pytest.mark.parametrize("position", POSITIONS)
def test_typical_query_baseline_moves_the_query_only(position):
    ctx = context(position)
    e = explain(ctx, IGConfig(scope="query"))
    assert e.reference_logit == pytest.approx(_typical_query_logit(ctx), abs=1e-4)
    np.testing.assert_allclose(e.field_values[:-1], 0.0, atol=1e-9)  # the history stays as it is
    assert e.field_values[-1].sum() == pytest.approx(e.score_logit - e.reference_logit, abs=6e-3)
    assert abs(e.convergence_delta) < 5e-3


def test_reference_baselines_are_not_degenerate_but_the_zero_baseline_is():
    """After LayerNorm every zeroed row is one vector: f(zero) is the same number for every case.
    The typical-transaction baselines depend on the case (its history, its timing)."""
    ctxs = [context(p) for p in POSITIONS] + [context(p, "c1") for p in (5, 25)]
    f = {kw: np.array([explain(c, IGConfig(n_steps=8, target_delta=None, **dict(kw))).reference_logit
                       for c in ctxs]) for kw in ((), (("scope", "query"),), (("baseline", "zero"),))}
    assert np.ptp(f[(("baseline", "zero"),)]) < 1e-4
    assert np.ptp(f[()]) > 1e-2 and np.ptp(f[(("scope", "query"),)]) > 1e-2
