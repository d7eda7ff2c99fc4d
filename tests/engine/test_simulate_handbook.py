"""The Handbook-like generator: exact row count, the Handbook's schema, fraud scenarios, determinism."""

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from engine.cli import app
from engine.data.io import read_transactions
from engine.data.simulate.handbook import SCHEMA, generate_handbook_like
from engine.data.spec import load_spec

HANDBOOK_COLUMNS = ["TRANSACTION_ID", "TX_DATETIME", "CUSTOMER_ID", "TERMINAL_ID", "TX_AMOUNT", "TX_TIME_SECONDS",
                    "TX_TIME_DAYS", "TX_FRAUD", "TX_FRAUD_SCENARIO"]


def test_exact_rows_readable_by_the_handbook_spec_with_all_three_scenarios(tmp_path):
    r = generate_handbook_like(25_001, tmp_path / "a.parquet", seed=1, chunk_customers=50)
    assert r["rows"] == 25_001 and r["row_groups"] > 1  # written in several chunks
    pf = pq.ParquetFile(tmp_path / "a.parquet")
    assert pf.metadata.num_rows == 25_001 and pf.schema_arrow.names == HANDBOOK_COLUMNS
    res = read_transactions(tmp_path / "a.parquet", load_spec("handbook"))
    assert res.rows_read == 25_001 and len(res.rejected) == 0 and len(res.frame) == 25_001
    t = pf.read().to_pandas()
    assert t["TRANSACTION_ID"].tolist() == list(range(25_001))
    assert set(t["TX_FRAUD_SCENARIO"]) == {0, 1, 2, 3}
    assert ((t["TX_FRAUD"] == 1) == (t["TX_FRAUD_SCENARIO"] > 0)).all()
    assert (t.loc[t["TX_FRAUD_SCENARIO"] == 1, "TX_AMOUNT"] > 220).all()
    assert 0.002 < t["TX_FRAUD"].mean() < 0.05
    assert (t["TX_TIME_SECONDS"] // 86400 == t["TX_TIME_DAYS"]).all()
    secs = (t["TX_DATETIME"] - np.datetime64("2018-04-01")).dt.total_seconds()
    assert (secs == t["TX_TIME_SECONDS"]).all()
    # each customer's rows are contiguous and in time order
    assert t["CUSTOMER_ID"].is_monotonic_increasing
    assert t.groupby("CUSTOMER_ID")["TX_TIME_SECONDS"].apply(lambda s: s.is_monotonic_increasing).all()


def test_same_seed_same_rows_other_seed_other_rows(tmp_path):
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        generate_handbook_like(3000, tmp_path / f"{name}.parquet", seed=seed, chunk_customers=20)
    a, b, c = (pq.read_table(tmp_path / f"{n}.parquet") for n in "abc")
    assert a.equals(b) and a.schema == SCHEMA
    assert not a.equals(c)
    with pytest.raises(ValueError, match="rows and days must be >= 1"):
        generate_handbook_like(0, tmp_path / "d.parquet")


def test_cli_simulate_rows_writes_parquet_and_refuses_csv(tmp_path, monkeypatch):
    r = CliRunner().invoke(app, ["simulate", "--rows", "1234", "--seed", "2", "--out", str(tmp_path / "h.parquet")])
    assert r.exit_code == 0, r.output
    assert "1,234 transactions" in r.output
    assert pq.ParquetFile(tmp_path / "h.parquet").metadata.num_rows == 1234
    r = CliRunner().invoke(app, ["simulate", "--rows", "10", "--out", str(tmp_path / "h.csv")])
    assert r.exit_code == 2 and "--rows writes Parquet" in r.output
    assert not (tmp_path / "h.csv").exists()
