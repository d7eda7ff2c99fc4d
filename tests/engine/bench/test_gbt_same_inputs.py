"""The equally informed GBT of the Handbook bench reads the book features plus every transformer input."""

from pathlib import Path

import pandas as pd
import pytest

from engine.bench.gbt_same_inputs import PREFIX, same_inputs_dataset
from engine.bench.handbook_features import INPUT_FEATURES

HANDBOOK = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "handbook" / "transactions.parquet"


@pytest.mark.skipif(not HANDBOOK.exists(), reason="shared Handbook data not present")
def test_same_inputs_cover_the_transformer_inputs(tmp_path):
    raw = pd.read_parquet(HANDBOOK)
    small = raw[raw["TX_DATETIME"] < raw["TX_DATETIME"].min() + pd.Timedelta(days=20)]
    path = tmp_path / "hb.parquet"
    small.to_parquet(path)
    df, feats = same_inputs_dataset(path)
    assert len(df) == len(small) and feats[: len(INPUT_FEATURES)] == list(INPUT_FEATURES)
    extra = [f for f in feats if f.startswith(PREFIX)]
    # the five delayed terminal aggregates the transformer reads, the amount and the entity history
    for want in ("agg_terminal_risk_fraud_rate_7d", "agg_terminal_risk_count_30d", "amount", "ef_amount_z"):
        assert PREFIX + want in extra, (want, extra[:10])
    assert len([f for f in extra if f.startswith(PREFIX + "agg_")]) >= 5
    # joined by transaction id: the amount column equals the raw amount row by row
    assert (df[PREFIX + "amount"].to_numpy() == df["TX_AMOUNT"].to_numpy()).all()
