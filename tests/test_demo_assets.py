"""The bundled demo model loads (sha256 verified) and scores the bundled demo data: a model change
without retraining assets/demo_model fails here, not in front of a stakeholder."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.model.checkpoint import ASSET_MODEL_DIR, load_checkpoint
from engine.data.io import read_transactions
from engine.model.scoring import score_frame
from engine.data.spec import load_spec


def test_demo_model_loads_and_scores_the_demo_data():
    bundle = load_checkpoint()  # verifies the checkpoint sha256
    assert bundle.path == ASSET_MODEL_DIR and bundle.meta["name"] == "demo"
    assert sum(f.stat().st_size for f in ASSET_MODEL_DIR.iterdir()) <= 20 * 2**20
    res = read_transactions("demo_data/transactions.csv", load_spec("demo"))
    s = score_frame(bundle, res.frame)
    assert len(s) == res.rows_read == 42_368 and s["probability"].between(0, 1).all()
    assert bundle.calibrated  # the shipped demo model carries a calibration map
    # the model separates the injected fraud episodes from legitimate rows on the data it was made from
    labelled = s.dropna(subset=["label"])
    fraud, legit = labelled[labelled.label == 1].probability, labelled[labelled.label == 0].probability
    assert fraud.median() > 10 * legit.median()
    assert pd.Series(bundle.meta["thresholds"]).between(0, 1).all()


#: the demo model of commits b2810ed..d9b5014 (written before ``history_edges`` / ``num_ple_edges``
#: existed) and the demo data it was made from, kept as the backward-compatibility fixture
LEGACY_DIR = Path(__file__).parent / "fixtures" / "legacy_demo"
#: logits of that model on that data, computed with the code that wrote it (commit b2810ed)
LEGACY_LOGITS = {"r1": -4.244875, "r1441": 3.821565, "r4368": -4.756974, "r7182": -4.836442, "r9999": -4.90856,
                 "r12812": -4.726915, "r15627": -4.452305, "r18441": -4.815416, "r21256": -4.547793}


def test_a_checkpoint_from_before_the_piecewise_linear_codes_scores_as_before():
    """The legacy demo model's config has no ``history_edges`` / ``num_ple_edges``: it loads without
    the codes and gives the logits it gave when it was made, on the batch and on the incremental path."""
    from engine.model.incremental import IncrementalScorer

    bundle = load_checkpoint(LEGACY_DIR)
    assert "history_edges" not in json.loads((LEGACY_DIR / "checkpoint.json").read_text())["model_config"]
    assert bundle.model.cfg.history_edges == [] and bundle.model.rows.ple_w is None
    frame = read_transactions(LEGACY_DIR / "transactions.csv.gz", load_spec("tabformer")).frame
    assert len(frame) == 21_892
    s = score_frame(bundle, frame).set_index("transaction_id")["logit"]
    for tid, want in LEGACY_LOGITS.items():
        assert float(s[tid]) == pytest.approx(want, abs=1e-4), tid
    sub = frame[frame["entity_id"].isin(frame["entity_id"].unique()[:3])].reset_index(drop=True)
    got = IncrementalScorer(bundle).add_frame(sub)
    np.testing.assert_allclose(got, s.loc[sub["transaction_id"]].to_numpy(), rtol=1e-4, atol=1e-4)
