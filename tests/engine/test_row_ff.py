"""The row feed-forward layer (ModelConfig.row_ff): every scoring path computes the same function
with it (whole file, windowed queries, explainers' query path, the incremental scorer, a saved and
reloaded checkpoint), its weights are shape-checked on load, and the randomisation cascade
re-draws it with the row encoder."""

import numpy as np
import pytest
import torch

from engine.data.features import FeatureEncoder
from engine.model.checkpoint import CheckpointError, ModelBundle, build_model, load_checkpoint, save_checkpoint
from engine.model.config import ModelConfig
from engine.model.incremental import IncrementalScorer
from engine.model.scoring import score_frame
from engine.model.sequences import make_batch
from engine.trust.sanity import cascade_steps

from tiny_models import perturbed_bundle, tiny_frame, tiny_spec


@pytest.fixture(scope="module")
def bundle():
    spec, fr = tiny_spec(), tiny_frame(4, 60, seed=7)
    enc = FeatureEncoder.fit(fr, spec)
    return perturbed_bundle(enc, spec, seed=5, row_ff=24), fr


def test_the_layer_changes_the_scores(bundle):
    b, fr = bundle
    batch = make_batch(b.encoder.transform(fr), np.arange(16)[None, :], np.array([0]))
    with torch.no_grad():
        on = b.model(batch).logits
        saved = b.model.row_ff
        b.model.row_ff = None
        try:
            off = b.model(batch).logits
        finally:
            b.model.row_ff = saved
    assert float((on - off).abs().max()) > 1e-2


def test_every_scoring_path_agrees(bundle):
    b, fr = bundle
    m = b.model
    batch = make_batch(b.encoder.transform(fr), np.arange(16)[None, :], np.array([0]))
    with torch.no_grad():
        full = m(batch).logits
        fe = m(batch, output_field_embeddings=True)
        torch.testing.assert_close(fe.logits, full, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m.logits_from(batch, 6), full[:, 6:], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m.query_logits(batch), full[:, -1], rtol=1e-5, atol=1e-5)
    sub = fr[fr["entity_id"].isin(["c1", "c3"])].reset_index(drop=True)
    want = score_frame(b, sub)["logit"].to_numpy()
    np.testing.assert_allclose(IncrementalScorer(b).add_frame(sub), want, rtol=1e-4, atol=1e-4)


def test_checkpoint_round_trip_and_shape_check(bundle, tmp_path):
    b, fr = bundle
    save_checkpoint(b, tmp_path / "ok")
    back = load_checkpoint(tmp_path / "ok")
    assert back.model.cfg.row_ff == 24
    np.testing.assert_allclose(score_frame(back, fr)["logit"], score_frame(b, fr)["logit"], rtol=1e-6, atol=1e-6)
    # a checkpoint whose config says 24 but whose weights are of another width is refused
    other = build_model(b.encoder, d_model=16, n_heads=2, n_layers=2, d_ff=32, context_length=16, min_history=6,
                        row_ff=8)
    other.cfg = back.model.cfg
    save_checkpoint(ModelBundle(model=other.eval(), encoder=b.encoder, spec=b.spec, meta={"thresholds": {"review": 0.5}}),
                    tmp_path / "bad")
    with pytest.raises(CheckpointError, match="row_ff.0.weight"):
        load_checkpoint(tmp_path / "bad")


def test_config_range_and_legacy_default(bundle):
    b, _ = bundle
    d = b.model.cfg.to_dict()
    with pytest.raises(ValueError, match=r"row_ff: expected an integer in \[0, 8,192\], got -1"):
        ModelConfig.from_dict({**d, "row_ff": -1})
    legacy = {k: v for k, v in d.items() if k != "row_ff"}
    assert ModelConfig.from_dict(legacy).row_ff == 0


def test_randomisation_cascade_redraws_the_row_layer_with_the_row_encoder(bundle):
    b, _ = bundle
    steps = dict(cascade_steps(b.model))
    assert steps["row encoder"] == ["ln_in", "row_ff", "rows"]
    plain = build_model(b.encoder, d_model=16, n_heads=2, n_layers=1, d_ff=16, context_length=16, min_history=4)
    assert dict(cascade_steps(plain))["row encoder"] == ["ln_in", "rows"]
