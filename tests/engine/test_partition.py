"""The partitioned (larger-than-memory) scorer gives the in-memory scorer's scores and rejected rows."""

import numpy as np
import pandas as pd
import pytest

from engine.data.csv_writer import write_csv
from engine.data.io import read_transactions
from engine.data.simulate.handbook import generate_handbook_like
from engine.data.spec import load_spec
from engine.distributed.partition import PART, _connect, partition_by_entity, score_partitioned
from engine.model.checkpoint import load_checkpoint
from engine.model.scoring import score_file, write_scores
from tiny_models import tiny_checkpoint


@pytest.fixture(scope="module")
def hb(tmp_path_factory):
    """A Handbook-like file (Parquet and CSV) with bad rows, and a tiny model for the handbook spec."""
    d = tmp_path_factory.mktemp("part")
    generate_handbook_like(3000, d / "clean.parquet", seed=3, days=40, chunk_customers=15)
    raw = pd.read_parquet(d / "clean.parquet")
    spec = load_spec("handbook")
    tiny_checkpoint(read_transactions(d / "clean.parquet", spec).frame, spec, d / "model",
                    {"name": "tiny-hb"}, context_length=8, min_history=4)
    txt = raw.astype(str)
    txt["TX_DATETIME"] = raw["TX_DATETIME"].dt.strftime("%Y-%m-%d %H:%M:%S")
    txt.loc[10, "TX_AMOUNT"] = "abc"                      # not a number
    txt.loc[20, "TX_DATETIME"] = "2018-13-45 00:00:00"    # not a timestamp
    txt.loc[30, "CUSTOMER_ID"] = " "                      # empty entity
    txt.loc[40, "TX_FRAUD"] = "2"                         # label not 0/1
    import duckdb

    from engine.distributed.partition import _entity_sql

    part = duckdb.sql(f"SELECT {_entity_sql(spec)} % 4 AS p FROM txt").df()["p"].to_numpy()  # as read from the CSV
    far = txt.index[part != part[50]][-5]  # a customer in another of 4 partitions
    txt.loc[far, "TRANSACTION_ID"] = txt.loc[50, "TRANSACTION_ID"]   # id reused by another customer, later
    near = txt.index[txt["CUSTOMER_ID"] == txt.loc[60, "CUSTOMER_ID"]][-1]
    txt.loc[near, "TRANSACTION_ID"] = txt.loc[60, "TRANSACTION_ID"]  # id reused by the same customer
    txt.loc[far + 1, "TRANSACTION_ID"] = txt.loc[60, "TRANSACTION_ID"]  # and by another one
    dup = txt.iloc[[5, 700, 1500]]                        # exact duplicates of earlier rows, later
    txt = pd.concat([txt.iloc[:2000], dup, txt.iloc[2000:]], ignore_index=True)
    write_csv(txt, d / "bad.csv")
    return d, spec, load_checkpoint(d / "model")


@pytest.fixture(scope="module")
def hb_plain(hb):
    """The handbook spec without its terminal aggregates, and a tiny model for it."""
    d, spec, _ = hb
    plain = spec.model_copy(update={"aggregates": []})
    tiny_checkpoint(read_transactions(d / "clean.parquet", plain).frame, plain, d / "model_plain",
                    {"name": "tiny-hb-plain"}, context_length=8, min_history=4)
    return d, plain, load_checkpoint(d / "model_plain")


def _in_memory(bundle, path, out):
    run = score_file(bundle, path)
    write_scores(run, out)
    return run, pd.read_parquet(out)


@pytest.mark.parametrize("n,aggregates", [(1, True), (4, True), (4, False)])
def test_partitioned_scores_and_rejections_equal_the_in_memory_path(hb, hb_plain, tmp_path, n, aggregates):
    d, spec, bundle = hb if aggregates else hb_plain
    run, mem = _in_memory(bundle, d / "bad.csv", tmp_path / "mem.parquet")
    assert len(run.rejected) >= 8  # the bad rows above were all rejected in memory
    part = score_partitioned(bundle, d / "bad.csv", spec, tmp_path / "part.parquet", partitions=n,
                             tmp_dir=tmp_path)
    assert part.passes == 2  # aggregates, or (n=4) an id reused in another partition
    assert not list(tmp_path.glob("fraudlens-partitions-*"))  # the partition files are removed
    got = pd.read_parquet(tmp_path / "part.parquet")
    assert part.rows_read == run.rows_read == len(got) == len(mem) == 3003
    assert part.rows_scored == len(run.scores)
    m = mem.sort_values("row_number").reset_index(drop=True)
    g = got.sort_values("row_number").reset_index(drop=True)
    assert list(g.columns) == list(m.columns)
    assert (g["row_number"].to_numpy() == m["row_number"].to_numpy()).all()
    for c in ("status", "transaction_id", "entity_id", "rejected_column", "rejected_value", "reason", "file"):
        assert g[c].fillna("<na>").astype(str).tolist() == m[c].fillna("<na>").astype(str).tolist(), c
    sc = m["status"] == "scored"
    # float32 logits: a window batched with other windows differs in the last bits (score_frame on a
    # subset of the entities of one frame differs by up to ~1e-6 too); probabilities within 1e-6
    assert np.abs(g.loc[sc, "score"] - m.loc[sc, "score"]).max() <= 1e-6
    assert np.abs(g.loc[sc, "logit"].to_numpy(float) - m.loc[sc, "logit"].to_numpy(float)).max() <= 1e-5
    assert (g.loc[sc, "timestamp"] == m.loc[sc, "timestamp"]).all()
    assert (g.loc[sc, "label"] == m.loc[sc, "label"]).all()
    pd.testing.assert_frame_equal(part.load.rejected.reset_index(drop=True), run.rejected.reset_index(drop=True))
    # each rejected row names the transaction and the entity of its record (its raw id and customer cells)
    raw = pd.read_csv(d / "bad.csv", dtype=str, keep_default_na=False)
    ids = [raw.loc[r - 1, ["TRANSACTION_ID", "CUSTOMER_ID"]].str.strip().tolist() for r in run.rejected["row_number"]]
    assert run.rejected[["transaction_id", "entity_id"]].values.tolist() == ids
    assert [""] == run.rejected.loc[run.rejected["reason"] == "entity key is empty", "entity_id"].tolist()
    reasons = set(run.rejected["reason"])
    assert any(r.startswith("exact duplicate of row ") for r in reasons)
    assert any(r.startswith("transaction id already used by row ") for r in reasons)
    assert part.flagged == int((m.loc[sc, "score"] >= 0.5).sum())


def test_one_pass_without_aggregates_and_repeated_ids(hb_plain, tmp_path):
    d, spec, bundle = hb_plain
    run, mem = _in_memory(bundle, d / "clean.parquet", tmp_path / "mem.parquet")
    part = score_partitioned(bundle, d / "clean.parquet", spec, tmp_path / "part.parquet", partitions=3,
                             tmp_dir=tmp_path)
    assert part.passes == 1 and part.rows_scored == 3000 and 1000 <= part.peak_partition_rows < 3000
    got = pd.read_parquet(tmp_path / "part.parquet").sort_values("row_number").reset_index(drop=True)
    mem = mem.sort_values("row_number").reset_index(drop=True)
    assert (got["transaction_id"] == mem["transaction_id"]).all()
    assert np.abs(got["score"] - mem["score"]).max() <= 1e-6
    assert sorted(np.concatenate([part.entity_sizes])) == sorted(mem.groupby("entity_id").size().tolist())


def test_parquet_input_gives_the_same_rows_as_in_memory(hb, tmp_path):
    d, spec, bundle = hb
    src = d / "clean.parquet"
    run, mem = _in_memory(bundle, src, tmp_path / "mem.parquet")
    score_partitioned(bundle, src, spec, tmp_path / "part.parquet", partitions=3, tmp_dir=tmp_path)
    got = pd.read_parquet(tmp_path / "part.parquet").sort_values("row_number").reset_index(drop=True)
    assert len(got) == len(mem) == 3000 and (got["status"] == "scored").all()
    mem = mem.sort_values("row_number").reset_index(drop=True)
    assert (got["transaction_id"] == mem["transaction_id"]).all()
    assert np.abs(got["score"] - mem["score"]).max() <= 1e-6


def test_each_entity_lands_in_one_partition_with_its_rows_in_time_order(hb, tmp_path):
    d, spec, bundle = hb
    for name, n_rows in (("bad.csv", 3003), ("clean.parquet", 3000)):  # text and int64 entity columns
        (tmp_path / name).mkdir()
        con = _connect(tmp_path / name, "256MB", 1)
        parts, rows = partition_by_entity(con, d / name, spec, tmp_path / name, 4)
        assert rows == n_rows
        tab = con.execute(f"SELECT trim(CAST(CUSTOMER_ID AS VARCHAR)) AS c, {PART} AS p, count(*) AS n FROM "
                          f"read_parquet('{parts}/*/*.parquet', hive_partitioning = true) GROUP BY ALL").df()
        assert tab["n"].sum() == n_rows
        assert tab.groupby("c")["p"].nunique().max() == 1  # never two partitions
        assert tab["p"].nunique() == 4
    # the scored output: each entity one contiguous block, in time order
    score_partitioned(bundle, d / "bad.csv", spec, tmp_path / "s.parquet", partitions=4, tmp_dir=tmp_path)
    s = pd.read_parquet(tmp_path / "s.parquet")
    s = s[s["status"] == "scored"].reset_index(drop=True)
    e = s["entity_id"].to_numpy(dtype=object)
    block = pd.Series(np.r_[True, e[1:] != e[:-1]].cumsum())
    assert block.groupby(e).nunique().max() == 1
    assert s.groupby("entity_id")["timestamp"].apply(lambda t: t.is_monotonic_increasing).all()


def test_a_csv_with_a_ragged_record_is_refused_with_its_cause(hb, tmp_path):
    d, spec, bundle = hb
    lines = (d / "bad.csv").read_text().splitlines()
    lines[100] += ",extra"
    (tmp_path / "ragged.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="cannot be parsed.*without --partitions"):
        score_partitioned(bundle, tmp_path / "ragged.csv", spec, tmp_path / "o.parquet", partitions=2,
                          tmp_dir=tmp_path)
    with pytest.raises(ValueError, match="ending in .parquet"):
        score_partitioned(bundle, d / "bad.csv", spec, tmp_path / "o.csv", partitions=2)


def test_cli_score_partitions_prints_the_accounting_and_writes_the_same_rejected_rows(hb, tmp_path):
    from typer.testing import CliRunner

    from engine.cli import app

    d, spec, bundle = hb
    args = ["score", "--data", str(d / "bad.csv"), "--model", str(d / "model")]
    mem = CliRunner().invoke(app, args + ["--out", str(tmp_path / "m.parquet"), "--rejected", str(tmp_path / "m.csv")])
    part = CliRunner().invoke(app, args + ["--out", str(tmp_path / "p.parquet"), "--rejected", str(tmp_path / "p.csv"),
                                           "--partitions", "3", "--tmp-dir", str(tmp_path)])
    assert mem.exit_code == 0 and part.exit_code == 0, part.output
    line = next(x for x in mem.output.splitlines() if x.startswith("rows read") and "scored" in x)
    assert line in part.output  # "rows read 3,003 = rows scored ... + rows rejected ..."
    assert (tmp_path / "p.csv").read_text() == (tmp_path / "m.csv").read_text()
    flagged = next(x for x in mem.output.splitlines() if "at or above the review threshold" in x).split(" transactions")[0]
    assert any(x.startswith(flagged + " transactions at or above") for x in part.output.splitlines())
    bad = CliRunner().invoke(app, args + ["--out", str(tmp_path / "p.csv"), "--partitions", "3"])
    assert bad.exit_code == 2 and "ending in .parquet" in bad.output


def test_a_duckdb_failure_is_one_runtime_error_and_leaves_no_partition_files(hb, tmp_path):
    d, spec, bundle = hb
    with pytest.raises(RuntimeError, match="partitioning .* with DuckDB failed"):
        score_partitioned(bundle, d / "clean.parquet", spec, tmp_path / "o.parquet", partitions=2,
                          memory_limit="not a size", tmp_dir=tmp_path)
    assert not list(tmp_path.glob("fraudlens-partitions-*"))
    assert not list(tmp_path.glob("*o.parquet*"))  # no output, no temporary file


def test_the_streamed_output_is_private_atomic_and_never_written_through_a_link(hb_plain, tmp_path, monkeypatch):
    """Written 0600 into a temporary file and put at --out when complete: a symlink planted at --out
    is replaced, its target untouched; a run that fails mid-way leaves the old output as it was."""
    import os
    import stat

    d, spec, bundle = hb_plain
    target = tmp_path / "victim.txt"
    target.write_text("keep", encoding="utf-8")
    out = tmp_path / "part.parquet"
    out.symlink_to(target)
    old = os.umask(0o022)
    try:
        score_partitioned(bundle, d / "clean.parquet", spec, out, partitions=2, tmp_dir=tmp_path)
    finally:
        os.umask(old)
    assert target.read_text(encoding="utf-8") == "keep" and not out.is_symlink()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 and len(pd.read_parquet(out)) == 3000
    before = out.read_bytes()
    import engine.distributed.partition as part_mod

    def boom(*a, **k):
        raise RuntimeError("scoring failed mid-run")

    monkeypatch.setattr(part_mod, "score_frame", boom)
    with pytest.raises(RuntimeError, match="mid-run"):
        score_partitioned(bundle, d / "clean.parquet", spec, out, partitions=2, tmp_dir=tmp_path)
    assert out.read_bytes() == before and not list(tmp_path.glob(".part.parquet.*"))


def test_demo_model_on_a_slice_of_the_demo_csv_two_entity_columns_no_id(tmp_path):
    """The shipped demo model and spec (entity User + Card, no id column: ids are "r{row}")."""
    from tiny_models import demo_slice

    src = demo_slice(tmp_path / "demo.csv", 4000)
    lines = src.read_text().splitlines()
    lines[3000] = lines[10]  # an exact duplicate of row 10, later
    src.write_text("\n".join(lines) + "\n")
    bundle = load_checkpoint(None)
    run, mem = _in_memory(bundle, src, tmp_path / "mem.parquet")
    part = score_partitioned(bundle, src, bundle.spec, tmp_path / "part.parquet", partitions=3, tmp_dir=tmp_path)
    assert part.passes == 1 and part.rows_read == 4000
    got = pd.read_parquet(tmp_path / "part.parquet").sort_values("row_number").reset_index(drop=True)
    mem = mem.sort_values("row_number").reset_index(drop=True)
    assert got["transaction_id"].fillna("").tolist() == mem["transaction_id"].fillna("").tolist()
    assert got["reason"].fillna("").tolist() == mem["reason"].fillna("").tolist()
    assert set(got["reason"].dropna()) == {"exact duplicate of row 10"}  # lines[10] is record 10
    sc = mem["status"] == "scored"
    assert np.abs(got.loc[sc, "score"] - mem.loc[sc, "score"]).max() <= 1e-6
    # the rejected row carries the ids it would have had: "r<record number>" and the joined User:Card key
    rej = got[got["status"] == "rejected"]
    assert rej["transaction_id"].tolist() == ["r3000"] and rej["entity_id"].tolist() == [mem.loc[9, "entity_id"]]
    pd.testing.assert_frame_equal(part.load.rejected.reset_index(drop=True), run.rejected.reset_index(drop=True))


def test_partitioned_run_names_a_2099_typo_as_the_in_memory_check_does(hb_plain, tmp_path):
    from engine.model.split_checks import date_outliers

    d, spec, bundle = hb_plain
    raw = pd.read_parquet(d / "clean.parquet")
    assert score_partitioned(bundle, d / "clean.parquet", spec, tmp_path / "p0.parquet", partitions=3,
                             tmp_dir=tmp_path).date_warning is None
    raw.loc[[123, 2500], "TX_DATETIME"] = pd.Timestamp("2099-06-01 08:00")
    raw.to_parquet(tmp_path / "typo.parquet", index=False)
    part = score_partitioned(bundle, tmp_path / "typo.parquet", spec, tmp_path / "p.parquet", partitions=3,
                             tmp_dir=tmp_path)
    mem = date_outliers(read_transactions(tmp_path / "typo.parquet", spec).frame, hint="fix or remove them")
    assert part.date_warning == mem
    assert mem.startswith("2 transactions are dated far outside") and "row 124 at 2099-06-01 08:00:00, row 2501" in mem
