"""Ray Train (engine.distributed.ray_train): 2 data-parallel workers reproduce the single-process
run (dropout 0: the same loss per epoch, validation and test metrics within the documented
tolerance) and give a checkpoint that saves and loads like a single-process one; without Ray the
commands say what to install."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from tiny_models import tiny_frame, tiny_spec

#: documented tolerance (README "Scale-out with Ray") of 2 workers vs 1 process with dropout 0
METRIC_TOL = 1e-3


def test_two_workers_match_one_process_and_checkpoint_loads(ray_local, tmp_path):
    from engine.distributed.ray_train import ray_fitter
    from engine.model.checkpoint import load_checkpoint, save_checkpoint
    from engine.model.scoring import score_frame
    from engine.model.train import TrainConfig, train

    frame = tiny_frame(n_entities=6, n=60, seed=2)  # frauds in validation (4) and test (2)
    cfg = TrainConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, context_length=16, min_history=4, batch_size=8,
                      epochs=3, windows_per_epoch=40, dropout=0.0, patience=5, lr_schedule="cosine", members=1)
    quiet = dict(log=lambda s: None, progress=False)
    one, rep1 = train(frame, tiny_spec(), cfg, **quiet)
    two, rep2 = train(frame, tiny_spec(), cfg, fitter=ray_fitter(2), **quiet)

    assert two.meta["distributed"]["workers"] == 2 and two.meta["best_epoch"] == one.meta["best_epoch"]
    h1, h2 = rep1["history"], rep2["history"]
    assert len(h1) == len(h2) == 3
    assert [r["loss"] for r in h2] == pytest.approx([r["loss"] for r in h1], rel=1e-5)
    for period in ("validation", "test"):
        for m in ("average_precision", "auc_roc"):
            assert abs(rep2[period][m] - rep1[period][m]) <= METRIC_TOL, (period, m)
    diff = max(float((a - b).abs().max()) for a, b in zip(one.model.state_dict().values(), two.model.state_dict().values()))
    assert 0 <= diff < 1e-3
    # the weights moved (a run that trained nothing would also "agree")
    assert h2[0]["loss"] > h2[-1]["loss"]

    sha = save_checkpoint(two, tmp_path / "model")
    back = load_checkpoint(tmp_path / "model")
    assert back.sha256 == sha and back.meta["distributed"]["engine"] == "ray-train"
    a = score_frame(two, frame)["logit"].to_numpy()
    b = score_frame(back, frame)["logit"].to_numpy()
    assert np.abs(a - b).max() == 0.0


def test_without_ray_the_commands_say_what_to_install(monkeypatch, tmp_path):
    import engine.distributed.runtime as rt
    from engine.cli import app

    def missing():
        raise RuntimeError(rt.RAY_MISSING)

    monkeypatch.setattr(rt, "require_ray", missing)
    runner = CliRunner()
    data = tmp_path / "d.parquet"
    tiny_frame(2, 20).assign(timestamp=lambda f: f["timestamp"].astype(str)).to_parquet(data)
    r = runner.invoke(app, ["score", "--data", str(data), "--engine", "ray", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "pip install 'fraudlens[ray]'" in r.output
    r = runner.invoke(app, ["train", "--data", str(data), "--spec", "tabformer", "--workers", "2"])
    assert r.exit_code == 2 and "pip install 'fraudlens[ray]'" in r.output
    r = runner.invoke(app, ["score", "--data", str(data), "--engine", "spark"])
    assert r.exit_code == 2 and "expected local or ray" in r.output


def test_pretraining_is_refused_on_workers_before_ray_starts():
    """Pretraining runs in one process: --workers with --pretrain-minutes is an error, raised
    before any Ray work (never silently skipped)."""
    from engine.distributed.ray_train import fit_on_ray
    from engine.model.train import TrainConfig

    frame = tiny_frame(n_entities=4, n=40)
    split = np.zeros(len(frame), dtype=np.int8)
    with pytest.raises(ValueError, match="pretraining .* runs on one machine only"):
        fit_on_ray(frame, tiny_spec(), split, TrainConfig(members=1, pretrain_minutes=1.0), workers=2)
