"""The per-field reference (a typical transaction): computed from training rows or from the
model's statistics, stored in the checkpoint and validated on load."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from engine.data import field_reference as fr
from engine.data.features import FeatureEncoder
from engine.model.checkpoint import CheckpointError, ModelBundle, build_model, load_checkpoint, save_checkpoint
from tiny_models import tiny_frame, tiny_spec


@pytest.fixture(scope="module")
def enc_frame():
    f = tiny_frame()
    return FeatureEncoder.fit(f, tiny_spec()), f


def test_training_reference_is_medians_and_modes(enc_frame):
    enc, f = enc_frame
    r = fr.compute(enc, f, training=True)
    assert r.amount == pytest.approx(float(np.median(f["amount"])))
    ts = pd.to_datetime(f["timestamp"])
    assert r.hour == ts.dt.hour.value_counts().index[0] and r.weekday == ts.dt.day_of_week.value_counts().index[0]
    gaps = np.concatenate([np.diff(g.astype("int64").to_numpy() / 1e9) for _, g in ts.groupby(f["entity_id"])])
    assert r.time_since_prev_s == pytest.approx(float(np.median(gaps)))
    assert r.categorical["mcc"] == f["mcc"].value_counts().index[0]  # vocabulary order = training frequency
    assert r.categorical["merchant"] == f["merchant"].astype(str).value_counts().index[0]  # hashed: from rows
    assert r.numeric["risk"] == pytest.approx(float(np.median(f["risk"])))
    assert r.multi_valued == {"errors": ""}
    assert set(r.sources) >= set(enc.field_names()) - {"amount_vs_history"} | {"amount_vs_history"}
    e = r.encode(enc)
    assert e.cat.shape == (1, len(enc.cat_columns())) and e.multi.sum() == 0


def test_statistics_reference_without_rows_says_so(enc_frame):
    enc, _ = enc_frame
    r = fr.compute(enc)
    assert r.amount == pytest.approx(np.expm1(enc.state["amount_log_mean"]))
    assert r.numeric["risk"] == pytest.approx(enc.state["numeric"]["risk"]["mean"])
    assert (r.hour, r.weekday, r.time_since_prev_s) == (12, 0, fr.DEFAULT_GAP_S)
    assert "default" in r.sources["hour"] and "default" in r.sources["time_since_prev"]
    with pytest.raises(ValueError, match="training rows"):
        fr.compute(enc, None, training=True)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(version=2), "version"),
    (lambda d: d.update(hour=24), "hour"),
    (lambda d: d.update(amount="12"), "amount"),
    (lambda d: d.update(time_since_prev_s=0), "time_since_prev_s"),
    (lambda d: d["categorical"].pop("mcc"), "missing"),
    (lambda d: d["numeric"].update(risk=float("nan")), "numeric.risk"),
    (lambda d: d["categorical"].update(mcc="x" * 2000), "1000"),
])
def test_invalid_stored_reference_is_refused(enc_frame, edit, match):
    enc, f = enc_frame
    d = json.loads(json.dumps(fr.compute(enc, f, training=True).to_dict()))
    assert fr.from_dict(d, enc).origin == "checkpoint"
    edit(d)
    with pytest.raises(ValueError, match=match):
        fr.from_dict(d, enc)


def test_checkpoint_round_trip_and_refusal(tmp_path, enc_frame):
    enc, f = enc_frame
    model = build_model(enc, seed=0, d_model=8, n_heads=2, n_layers=1, d_ff=16, context_length=8, min_history=2)
    ref = fr.compute(enc, f, training=True)
    meta = {"thresholds": {"review": 0.5, "decline": 0.8}, fr.CHECKPOINT_KEY: ref.to_dict()}
    save_checkpoint(ModelBundle(model=model, encoder=enc, spec=tiny_spec(), meta=meta), tmp_path / "ok")
    b = load_checkpoint(tmp_path / "ok")
    got = fr.for_model(b.meta, b.encoder)
    assert got.origin == "checkpoint" and got.amount == pytest.approx(ref.amount) and got.hour == ref.hour
    bad = dict(meta, **{fr.CHECKPOINT_KEY: {**ref.to_dict(), "weekday": 9}})
    with torch.no_grad():
        save_checkpoint(ModelBundle(model=model, encoder=enc, spec=tiny_spec(), meta=bad), tmp_path / "bad")
    with pytest.raises(CheckpointError, match="field_reference: weekday"):
        load_checkpoint(tmp_path / "bad")
