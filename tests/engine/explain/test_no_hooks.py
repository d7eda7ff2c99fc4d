"""Every explainer leaves the shared model as it found it; results have the common shape and
survive a JSON round trip."""

import json

import numpy as np
import pytest
import torch
from explain_helpers import context, frame, make_bundle, one_torch_thread  # noqa: F401 (autouse fixture)

from engine.explain.context import build_context
from engine.explain import DEFAULT_METHODS, METHODS, Explanation, explain_all, explain_transaction


def _hooks(model):
    names = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
             "_forward_hooks_with_kwargs", "_state_dict_hooks")
    return {(n, h): len(getattr(mod, h, {})) for n, mod in model.named_modules() for h in names}


def test_no_hooks_params_flags_or_mode_changed():
    bundle = make_bundle(seed=5, dropout=0.1)
    model = bundle.model
    model.train()  # a model left in train mode: explanations run in eval mode and restore it
    model.ln_in.weight.requires_grad_(False)  # mixed flags must come back as they were
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    hooks_before = _hooks(model)
    assert all(v == 0 for v in hooks_before.values())
    ctx = build_context(bundle, frame(), frame().transaction_id.iloc[12])
    model.eval()
    ref = explain_all(ctx)
    model.train()
    res = explain_all(ctx)
    for m in DEFAULT_METHODS:  # same results as in eval mode: no dropout during explanation
        np.testing.assert_allclose(res[m].values, ref[m].values, atol=1e-6)
    assert model.training
    assert _hooks(model) == hooks_before
    assert not torch.nn.modules.module._global_forward_hooks
    assert not torch.nn.modules.module._global_backward_hooks
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert all(p.grad is None for p in model.parameters())
    after = model.state_dict()
    for k, v in before.items():
        assert torch.equal(after[k], v), k


@pytest.mark.parametrize("position", [0, 12, 30])
def test_every_method_shape_and_json_roundtrip(position):
    ctx = context(position)
    res = explain_all(ctx)
    assert list(res) == list(DEFAULT_METHODS) == list(METHODS)
    for m, e in res.items():
        assert e.method == m
        assert e.values.shape == (ctx.T,) and np.isfinite(e.values).all()
        assert e.transaction_ids == ctx.transaction_ids and e.transaction_ids[-1] == e.query_transaction_id
        assert e.entity_id == ctx.entity_id and e.units in ("logit", "attention weight")
        assert e.score_logit == pytest.approx(ctx.score_logit(), abs=1e-5)
        assert isinstance(e.params.get("cost"), str) and e.elapsed_s > 0
        d = e.to_dict()
        back = Explanation.from_dict(json.loads(json.dumps(d)))
        assert back.to_dict() == d
        np.testing.assert_array_equal(back.values, e.values)


def test_explain_transaction_and_errors():
    bundle, fr = make_bundle(), frame()
    tid = fr.transaction_id.iloc[5]
    res = explain_transaction(bundle, fr, tid, methods=("occlusion", "shap"), shap_samples=50, seed=3)
    assert list(res) == ["occlusion", "shap"] and res["shap"].params["seed"] == 3
    with pytest.raises(ValueError, match="unknown"):
        explain_all(context(3), methods=("lime",))
    with pytest.raises(KeyError):
        explain_transaction(bundle, fr, "nope")
