"""Piecewise-linear codes of the recent-activity inputs (ModelConfig.activity_ple): the code is the
documented clip((x - e_k) / (e_{k+1} - e_k), 0, 1), the incremental scorer and a checkpoint round
trip give the batch scores, and the option is off for older checkpoints."""

import math

import numpy as np
import pytest
import torch

from engine.data.features import FeatureEncoder
from engine.model.activity import activity_ple_edges, n_activity_inputs, ple_tables
from engine.model.checkpoint import ModelBundle, build_model, load_checkpoint, save_checkpoint
from engine.model.checkpoint_checks import expected_state_shapes
from engine.model.config import ModelConfig
from engine.model.incremental import IncrementalScorer
from engine.model.scoring import score_frame

from tiny_models import tiny_frame, tiny_spec


@pytest.fixture(scope="module")
def ple_bundle():
    spec = tiny_spec()
    enc = FeatureEncoder.fit(tiny_frame(), spec)
    model = build_model(enc, seed=4, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0, context_length=16,
                        min_history=6, activity_ple=True)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return ModelBundle(model=model.eval(), encoder=enc, spec=spec, meta={"thresholds": {"review": 0.5}})


def test_edges_and_code_by_hand():
    edges = activity_ple_edges(4)
    assert len(edges) == n_activity_inputs(4) and edges[-1] == []  # the 0/1 flag has no code
    assert edges[0][:3] == [0.0, pytest.approx(math.log1p(1) / 3), pytest.approx(math.log1p(2) / 3)]
    assert edges[-2][3] == pytest.approx(math.log1p(10) / 5)  # second-previous gap: 10 minutes
    lo, scale = ple_tables(edges)
    x = torch.tensor(math.log1p(4) / 3)  # 4 earlier transactions in the first window
    code = ((x - lo[0]) * scale[0]).clamp(0, 1)
    # bins [0,1], [1,2], [2,3] full, [3,5] half-way in log1p units, the rest empty
    want = [1, 1, 1, (math.log1p(4) - math.log1p(3)) / (math.log1p(5) - math.log1p(3)), 0, 0, 0]
    np.testing.assert_allclose(code[:7].numpy(), want, atol=1e-6)
    assert (scale[-1] == 0).all()  # padding bins never fire


def test_ple_changes_scores_and_incremental_equals_batch(ple_bundle, tmp_path):
    fr = tiny_frame(3, 40, seed=5)
    want = score_frame(ple_bundle, fr)["logit"].to_numpy()
    got = IncrementalScorer(ple_bundle).add_frame(fr)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        ple_bundle.model.rows.activity.ple_w.mul_(0.0)
        off = score_frame(ple_bundle, fr)["logit"].to_numpy()
        assert np.abs(off - want).max() > 1e-2  # the codes matter (the check can fail)
    save_checkpoint(ple_bundle, tmp_path / "m")
    back = load_checkpoint(tmp_path / "m")
    assert back.config.activity_ple is True
    np.testing.assert_allclose(score_frame(back, fr)["logit"].to_numpy(), off, atol=1e-6)


def test_config_and_shapes():
    base = dict(cat_cardinalities=[3, 5], cat_field_index=[0, 1], num_field_index=[0], multi_slots=[],
                field_names=["amount", "time_since_prev", "recent_activity", "first_seen"],
                activity_windows_s=[3600.0, 86400.0], first_seen_cols=[1], activity_ple=True)
    cfg = ModelConfig(**base)
    from engine.model.transformer import FraudTransformer

    want = {k: tuple(v.shape) for k, v in FraudTransformer(cfg).state_dict().items()}
    assert expected_state_shapes(cfg) == want and want["rows.activity.ple_w"] == (7, 9, 64)
    with pytest.raises(ValueError, match="activity_ple: expected false, or true with activity_windows_s set"):
        ModelConfig(**{**base, "activity_windows_s": [], "first_seen_cols": [],
                       "field_names": ["amount", "time_since_prev", "a", "b"]})
    with pytest.raises(ValueError, match="activity_ple"):
        ModelConfig(**{**base, "activity_ple": "yes"})
    legacy = ModelConfig.from_dict({k: v for k, v in cfg.to_dict().items() if k != "activity_ple"})
    assert legacy.activity_ple is False
