"""Novelty-only categoricals (spec ``embed = false``, ``ModelConfig.novelty_only_cols``): the model
reads such a field only through ``first_seen`` ("new merchant"), never through an identity
embedding of its value; batch, incremental and checkpoint paths agree."""

import json

import numpy as np
import pytest
import torch

from engine.data.features import NOVELTY_HASH_BUCKETS, FeatureEncoder
from engine.data.spec import DatasetSpec
from engine.model.checkpoint import (META, WEIGHTS, CheckpointError, ModelBundle, build_model, checkpoint_sha256,
                                     load_checkpoint, save_checkpoint)
from engine.model.incremental import IncrementalScorer
from engine.model.scoring import score_frame

from tiny_models import tiny_frame, tiny_spec


def _spec(embed: bool) -> DatasetSpec:
    d = tiny_spec().model_dump(mode="json")
    d["fields"][0]["embed"] = embed  # merchant, hashed into 64 buckets
    return DatasetSpec.model_validate(d)


def _bundle(embed: bool) -> ModelBundle:
    spec = _spec(embed)
    enc = FeatureEncoder.fit(tiny_frame(), spec)
    model = build_model(enc, seed=3, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0,
                        context_length=16, min_history=6)
    with torch.no_grad():  # large weights so every input matters
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.eval()
    return ModelBundle(model=model, encoder=enc, spec=spec, meta={"thresholds": {"review": 0.5}})


@pytest.fixture(scope="module")
def novelty():
    return _bundle(embed=False)


@pytest.fixture(scope="module")
def embedded():
    return _bundle(embed=True)


def _relabelled(fr):
    """The same frame with every merchant value renamed by a bijection (the same novelty pattern)."""
    out = fr.copy()
    out["merchant"] = "shop-" + out["merchant"].astype(str) + "-x"
    return out


def test_spec_refuses_embed_false_on_a_non_categorical():
    d = tiny_spec().model_dump(mode="json")
    d["fields"][2]["embed"] = False  # risk: numeric
    with pytest.raises(ValueError, match="field 'risk': embed = false applies to categorical fields only"):
        DatasetSpec.model_validate(d)


def test_layout_marks_the_column_and_gives_it_one_embedding_row(novelty, embedded):
    cfg, full = novelty.config, embedded.config
    names = [c for c, _, _ in novelty.encoder.cat_columns()]
    j = names.index("merchant")
    assert cfg.novelty_only_cols == [j] and full.novelty_only_cols == []
    assert j in cfg.first_seen_cols
    assert cfg.embedding_cardinalities[j] == 1 and full.embedding_cardinalities[j] == 64 + 2
    assert cfg.cat_cardinalities[j] == NOVELTY_HASH_BUCKETS + 2  # codes for equality only: no collisions
    assert novelty.model.rows.cat_emb.weight.shape[0] == embedded.model.rows.cat_emb.weight.shape[0] - 65


def test_scores_ignore_the_value_but_not_its_novelty(novelty, embedded):
    fr = tiny_frame(3, 40, seed=5)
    re = _relabelled(fr)
    # renaming every merchant leaves which ones are new unchanged: equal scores without the embedding ...
    np.testing.assert_allclose(score_frame(novelty, re)["logit"].to_numpy(),
                               score_frame(novelty, fr)["logit"].to_numpy(), atol=1e-5)
    # ... and different ones with it (the check can fail)
    assert np.abs(score_frame(embedded, re)["logit"].to_numpy()
                  - score_frame(embedded, fr)["logit"].to_numpy()).max() > 1e-2
    # a merchant the card has visited before, replaced by one it never saw: first_seen changes the score
    e0 = fr[fr["entity_id"] == "c0"].reset_index(drop=True)
    i = next(k for k in range(10, len(e0)) if e0.loc[k, "merchant"] in set(e0.loc[: k - 1, "merchant"]))
    moved = e0.copy()
    moved.loc[i, "merchant"] = "never-seen"
    a = score_frame(novelty, e0)["logit"].to_numpy()[i]
    b = score_frame(novelty, moved)["logit"].to_numpy()[i]
    assert abs(a - b) > 1e-3


def test_incremental_equals_whole_file_scoring(novelty):
    fr = tiny_frame(3, 40, seed=5)
    want = score_frame(novelty, fr)["logit"].to_numpy()
    got = IncrementalScorer(novelty).add_frame(fr)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_checkpoint_round_trip_and_a_tampered_layout(novelty, tmp_path):
    save_checkpoint(novelty, tmp_path / "m")
    back = load_checkpoint(tmp_path / "m")
    assert back.config.novelty_only_cols == novelty.config.novelty_only_cols
    fr = tiny_frame(2, 30, seed=2)
    np.testing.assert_allclose(score_frame(back, fr)["logit"].to_numpy(),
                               score_frame(novelty, fr)["logit"].to_numpy(), atol=1e-6)
    d = tmp_path / "m"
    j_mcc = [c for c, _, _ in novelty.encoder.cat_columns()].index("mcc")

    def tampered(cols):
        meta = json.loads((d / META).read_text())
        meta["model_config"]["novelty_only_cols"] = cols
        meta["sha256"] = checkpoint_sha256((d / WEIGHTS).read_bytes(), meta)  # an attacker can rehash
        (d / META).write_text(json.dumps(meta))
        return d

    # embedding the 2^40-code column would need a 2^40-row table: refused before anything is allocated
    with pytest.raises(CheckpointError, match=r"cat_cardinalities\[4\]: expected an integer in \[1, 4,194,304\]"):
        load_checkpoint(tampered([]))
    # one more novelty-only column than the feature statistics say
    with pytest.raises(CheckpointError, match="novelty_only_cols is .* but the feature statistics imply"):
        load_checkpoint(tampered(novelty.config.novelty_only_cols + [j_mcc]))
