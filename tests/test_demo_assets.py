"""The bundled demo model loads (sha256 verified) and scores the bundled demo data: a model change
without retraining assets/demo_model fails here, not in front of a stakeholder."""

import pandas as pd

from engine.checkpoint import ASSET_MODEL_DIR, load_checkpoint
from engine.io import read_transactions
from engine.scoring import score_frame
from engine.spec import load_spec


def test_demo_model_loads_and_scores_the_demo_data():
    bundle = load_checkpoint()  # verifies the checkpoint sha256
    assert bundle.path == ASSET_MODEL_DIR and bundle.meta["name"] == "demo"
    assert sum(f.stat().st_size for f in ASSET_MODEL_DIR.iterdir()) <= 20 * 2**20
    res = read_transactions("demo_data/transactions.csv", load_spec("demo"))
    s = score_frame(bundle, res.frame)
    assert len(s) == res.rows_read == 21_892 and s["probability"].between(0, 1).all()
    # the model separates the injected fraud episodes from legitimate rows on the data it was made from
    labelled = s.dropna(subset=["label"])
    fraud, legit = labelled[labelled.label == 1].probability, labelled[labelled.label == 0].probability
    assert fraud.median() > 10 * legit.median()
    assert pd.Series(bundle.meta["thresholds"]).between(0, 1).all()
