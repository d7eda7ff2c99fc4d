"""Ray batch scoring (engine.distributed.ray_score) equals the single-process scorer: same
scores (max abs difference <= 1e-6), same columns and types, same row accounting, on a dataset
of two Parquet files with a rejected row; and its checks fail when they must."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from tiny_models import tiny_checkpoint, tiny_frame, tiny_spec

pytest.importorskip("ray")


def _raw(frame: pd.DataFrame) -> pd.DataFrame:
    """The raw file of a canonical tiny frame (tiny_spec's column names), in row_number order."""
    f = frame.sort_values("row_number")
    return pd.DataFrame({
        "card": f["entity_id"].to_numpy(), "ts": f["timestamp"].dt.strftime("%Y-%m-%d %H:%M:%S").to_numpy(),
        "amt": f["amount"].to_numpy(), "y": f["label"].astype(str).to_numpy(), "m": f["merchant"].to_numpy(),
        "mcc": f["mcc"].to_numpy(), "r": f["risk"].to_numpy(), "e": f["errors"].str.replace("|", ",").to_numpy(),
    })


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    """A tiny checkpoint and a two-file Parquet dataset of 8 entities (346 records), record 200
    with an empty amount (rejected), plus the same records as one file."""
    from engine.model.checkpoint import load_checkpoint

    d = tmp_path_factory.mktemp("ray-score")
    frame = tiny_frame(n_entities=8, n=30, seed=3)
    raw = _raw(frame)
    raw.loc[199, "amt"] = np.nan
    (d / "data").mkdir()
    raw.iloc[:150].to_parquet(d / "data" / "part-a.parquet", index=False)
    raw.iloc[150:].to_parquet(d / "data" / "part-b.parquet", index=False)
    raw.to_parquet(d / "whole.parquet", index=False)
    ckpt = tiny_checkpoint(frame, tiny_spec(), d / "model", {"name": "tiny"})
    return load_checkpoint(ckpt), d, len(raw)


def test_ray_scores_equal_single_process_with_row_accounting(ray_local, tiny_dataset, tmp_path):
    """``fraudlens score --engine ray`` on a folder of two Parquet files (the local Ray of the
    fixture is reused) against the single-process scorer on the same records as one file."""
    from typer.testing import CliRunner

    from engine.cli import app
    from engine.data.io import read_transactions
    from engine.distributed.dataset import read_dataset
    from engine.model.scoring import ScoreRun, score_frame, write_scores

    bundle, d, n = tiny_dataset
    res = read_dataset(d / "data", tiny_spec())
    assert res.rows_read == n and len(res.rejected) == 1
    rej = res.rejected.iloc[0]
    assert rej["row_number"] == 200 and rej["reason"] == "amount is empty"
    assert rej["file"].endswith("part-b.parquet")  # the file the record came from

    r = CliRunner().invoke(app, ["score", "--data", str(d / "data"), "--engine", "ray", "--workers", "2",
                                 "--model", str(bundle.path), "--out", str(tmp_path / "scores"),
                                 "--rejected", str(tmp_path / "rejected.csv")])
    assert r.exit_code == 0, r.output
    assert f"rows read {n:,} = rows scored {n - 1:,} + rows rejected 1" in r.output
    import stat as _stat

    # the scores hold card numbers: the folder is the owner's only and so is each part file (Ray's writers use the umask)
    assert _stat.S_IMODE((tmp_path / "scores").stat().st_mode) == 0o700
    parts = list((tmp_path / "scores").iterdir())
    assert parts and all(_stat.S_IMODE(f.stat().st_mode) == 0o600 for f in parts)
    from engine.distributed.ray_score import entity_partitions

    blocks = len(set(entity_partitions(res.frame["entity_id"].to_numpy(), 8)))  # 4 partitions per actor, non-empty ones
    assert 1 < blocks <= 8 and f"Ray: 2 actor(s), {blocks} entity partition(s)" in r.output
    assert len(list((tmp_path / "scores").glob("*.parquet"))) >= 2  # scored parts + the rejected part
    assert "amount is empty" in (tmp_path / "rejected.csv").read_text()

    # single process on the same records as one file
    one = read_transactions(d / "whole.parquet", tiny_spec())
    single = score_frame(bundle, one.frame)
    write_scores(ScoreRun(scores=single, rejected=one.rejected, rows_read=one.rows_read, seconds=0.0,
                          calibrated=bundle.calibrated),
                 tmp_path / "single.parquet")
    want = pq.read_table(tmp_path / "single.parquet")
    got = pq.read_table(tmp_path / "scores")
    assert got.schema.names == want.schema.names
    assert [f.type for f in got.schema] == [f.type for f in want.schema]
    g = got.to_pandas().sort_values("row_number").reset_index(drop=True)
    w = want.to_pandas().sort_values("row_number").reset_index(drop=True)
    assert len(g) == n and g["row_number"].tolist() == list(range(1, n + 1))
    s = g["status"] == "scored"
    assert (s == (w["status"] == "scored")).all()
    assert np.abs(g.loc[s, "logit"].to_numpy() - w.loc[s, "logit"].to_numpy()).max() <= 1e-6
    assert "probability" not in got.schema.names and not bundle.calibrated  # an uncalibrated model: scores only
    assert np.abs(g.loc[s, "score"].to_numpy() - w.loc[s, "score"].to_numpy()).max() <= 1e-6
    assert g.loc[s, "score"].std() > 0.01  # real, spread scores
    for c in ("transaction_id", "entity_id", "timestamp", "amount", "label"):
        pd.testing.assert_series_equal(g.loc[s, c], w.loc[s, c])
    bad = g.loc[~s].iloc[0]
    assert bad["row_number"] == 200 and bad["reason"] == "amount is empty" and bad["status"] == "rejected"
    assert bad["file"].endswith("part-b.parquet")


def test_partitions_keep_each_entity_whole():
    from engine.distributed.ray_score import entity_partitions

    ents = np.asarray([f"card{i % 50}" for i in range(1000)], dtype=object)
    p = entity_partitions(ents, 7)
    per_entity = pd.Series(p).groupby(ents).nunique()
    assert (per_entity == 1).all() and set(p) == set(range(7))
    assert (entity_partitions(ents[::-1], 7) == p[::-1]).all()  # a key's partition is the key's, not its position


def test_incomplete_partition_is_refused(tiny_dataset):
    """The actor refuses a block that holds part of a partition (a cut history)."""
    from engine.data.io import read_transactions
    from engine.distributed.ray_score import _PART, _PART_ROWS, PartitionScorer, output_schema
    from engine.model.checkpoint import META, WEIGHTS

    bundle, d, _ = tiny_dataset
    frame = read_transactions(d / "whole.parquet", tiny_spec()).frame
    files = {k: (bundle.path / k).read_bytes() for k in (WEIGHTS, META)}
    scorer = PartitionScorer(files, bundle.sha256, {c: str(t) for c, t in frame.dtypes.items()}, output_schema(frame, bundle.calibrated))
    whole = frame.assign(**{_PART: 0, _PART_ROWS: len(frame)})
    assert scorer(whole).num_rows == len(frame)
    with pytest.raises(RuntimeError, match="arrived with 100 of"):
        scorer(whole.iloc[:100])
    with pytest.raises(ValueError, match="actor loaded checkpoint"):
        PartitionScorer(files, "0" * 64, {}, output_schema(frame, bundle.calibrated))


def test_output_folder_must_be_new_or_empty(tiny_dataset, tmp_path):
    from engine.distributed.dataset import read_dataset
    from engine.distributed.ray_score import score_with_ray

    bundle, d, _ = tiny_dataset
    res = read_dataset(d / "whole.parquet", tiny_spec())
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old.parquet").write_bytes(b"x")
    with pytest.raises(ValueError, match="not empty"):
        score_with_ray(bundle, res, tmp_path / "full")
    (tmp_path / "f.parquet").write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file"):
        score_with_ray(bundle, res, tmp_path / "f.parquet")


def test_dataset_files_and_schema_mismatch(tmp_path):
    from engine.distributed.dataset import dataset_files, read_dataset

    with pytest.raises(FileNotFoundError, match="no file matches"):
        dataset_files(tmp_path / "nothing-*.parquet")
    pd.DataFrame({"card": ["a"], "ts": ["2024-01-01"], "amt": [1.0]}).to_parquet(tmp_path / "a.parquet")
    pd.DataFrame({"card": ["a"], "ts": ["2024-01-02"], "amt": ["1"]}).to_parquet(tmp_path / "b.parquet")
    assert [p.name for p in dataset_files(tmp_path / "*.parquet")] == ["a.parquet", "b.parquet"]
    with pytest.raises(ValueError, match=r"b.parquet: column 'amt' is \w*string, but double"):
        read_dataset(tmp_path, tiny_spec())


def test_ray_scores_a_dataset_without_the_label_column(ray_local, tiny_dataset, tmp_path):
    """Production files carry no label: `score --engine ray` needed the column (the local path did not)."""
    from typer.testing import CliRunner

    from engine.cli import app

    bundle, d, n = tiny_dataset
    (tmp_path / "bare").mkdir()
    for p in sorted((d / "data").glob("*.parquet")):
        pd.read_parquet(p).drop(columns=["y"]).to_parquet(tmp_path / "bare" / p.name, index=False)
    outs = {}
    for name, src in (("bare", tmp_path / "bare"), ("labelled", d / "data")):
        r = CliRunner().invoke(app, ["score", "--data", str(src), "--engine", "ray", "--workers", "1",
                                     "--model", str(bundle.path), "--out", str(tmp_path / f"s-{name}")])
        assert r.exit_code == 0, r.output
        outs[name] = pq.read_table(tmp_path / f"s-{name}").to_pandas().sort_values("row_number").reset_index(drop=True)
        if name == "bare":
            assert "no label column 'y': read as unlabelled" in " ".join(r.output.split())
    a, b = outs["bare"], outs["labelled"]
    assert len(a) == len(b) == n and "label" not in a.columns
    s = b["status"] == "scored"
    assert np.abs(a.loc[s, "logit"].to_numpy() - b.loc[s, "logit"].to_numpy()).max() <= 1e-6
