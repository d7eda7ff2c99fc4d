"""Attention and attention rollout: rows are distributions, matrices are the model's own."""

import numpy as np
import pytest
import torch
from explain_helpers import context, one_torch_thread, shared_bundle  # noqa: F401 (autouse fixture)

from engine.explain.attention import (
    AttentionConfig, RolloutConfig, attention_matrices, explain, explain_rollout, rollout,
)
from engine.explain.base import ATTENTION_CAVEAT


@pytest.mark.parametrize("position", [0, 5, 12, 30])
def test_query_rows_sum_to_one_and_shapes(position):
    ctx = context(position)
    cfg = ctx.bundle.config
    L, H, T = cfg.n_layers, cfg.n_heads, ctx.T
    e = explain(ctx)
    assert e.method == "attention" and e.units == "attention weight" and not e.signed
    assert e.values.shape == (T,) and e.transaction_ids[-1] == e.query_transaction_id == ctx.query_transaction_id
    plh = e.extras["per_layer_head"]
    assert plh.shape == (L, H, T)
    np.testing.assert_allclose(plh.sum(-1), np.ones((L, H)), atol=1e-5)
    assert (plh >= 0).all()
    np.testing.assert_allclose(e.values, plh[-1].mean(0))
    assert e.values.sum() == pytest.approx(1.0, abs=1e-5)
    assert e.extras["matrices"].shape == (L, H, T, T)
    assert e.params["caveat"] == ATTENTION_CAVEAT
    assert e.score_logit == pytest.approx(ctx.score_logit(), abs=1e-6)


def test_matrices_equal_model_output_attentions():
    ctx = context(12)
    with torch.no_grad():
        out = ctx.bundle.model(ctx.batch, output_attentions=True)
    want = np.stack([w[0].numpy() for w in out.attentions])
    np.testing.assert_array_equal(attention_matrices(ctx), want)
    np.testing.assert_allclose(explain(ctx).extras["matrices"], want)


def test_layer_and_head_selection():
    ctx = context(12)
    plh = explain(ctx).extras["per_layer_head"]
    e = explain(ctx, AttentionConfig(layer=0, head=1, return_matrices=False))
    np.testing.assert_allclose(e.values, plh[0, 1])
    assert "matrices" not in e.extras and e.params["layer_resolved"] == 0
    with pytest.raises(ValueError, match="layer: expected -2 <= layer < 2, got 2"):
        explain(ctx, AttentionConfig(layer=2))
    with pytest.raises(ValueError, match="head: expected 0 <= head < 2 or None, got 5"):
        explain(ctx, AttentionConfig(head=5))


@pytest.mark.parametrize("position", [0, 12, 30])
def test_rollout_rows_sum_to_one(position):
    ctx = context(position)
    e = explain_rollout(ctx)
    assert e.method == "attention_rollout" and e.values.shape == (ctx.T,) and not e.signed
    r = e.extras["rollout"]
    np.testing.assert_allclose(r.sum(-1), np.ones(ctx.T), atol=1e-9)
    assert (r >= 0).all() and np.allclose(np.triu(r, 1), 0)  # causal: no flow from the future
    np.testing.assert_allclose(e.values, r[-1])
    assert e.params["caveat"] == ATTENTION_CAVEAT


def test_rollout_matches_the_definition():
    ctx = context(9)
    m = attention_matrices(ctx).astype(np.float64)
    T = ctx.T
    # Abnar & Zuidema: average heads, add identity, renormalise rows, multiply layers (last @ first)
    a = [(m[l].mean(0) + np.eye(T)) for l in range(m.shape[0])]
    a = [x / x.sum(-1, keepdims=True) for x in a]
    want = a[1] @ a[0]
    np.testing.assert_allclose(rollout(m), want, atol=1e-12)
    np.testing.assert_allclose(explain_rollout(ctx).values, want[-1], atol=1e-12)
    # residual_weight 0 = plain product of head-averaged attention
    np.testing.assert_allclose(rollout(m, 0.0), m[1].mean(0) @ m[0].mean(0), atol=1e-6)
    with pytest.raises(ValueError, match="residual_weight"):
        RolloutConfig(residual_weight=1.0)
