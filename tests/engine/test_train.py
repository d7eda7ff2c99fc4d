"""Training options: the cosine learning-rate schedule, snapshot reproduction (stop_after), and
fields kept out of the model (model_input = false)."""

import numpy as np
import pytest
import torch

from engine.data.features import FeatureEncoder
from engine.model.train import TrainConfig, fit

from tiny_models import tiny_frame, tiny_spec

CFG = TrainConfig(context_length=16, min_history=6, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0,
                  epochs=3, windows_per_epoch=None, batch_size=4, lr=1e-2, max_minutes=5.0,
                  members=1)  # one transformer: these tests read its epochs and batches


def _split(fr):
    split = np.full(len(fr), -1, np.int8)
    split[fr["timestamp"] < fr["timestamp"].quantile(0.7)] = 0
    split[fr["timestamp"] >= fr["timestamp"].quantile(0.7)] = 1
    return split


def test_stop_after_reproduces_the_snapshot_of_a_longer_run():
    """Epochs 1..k of a run are the same computation whether or not the run goes on: the
    snapshot a validation fold chose is reproduced on a test fold by ``stop_after``."""
    fr = tiny_frame(4, 40)
    cfg = CFG.__class__(**{**CFG.__dict__, "lr_schedule": "cosine"})
    full, hist_full, _ = fit(fr, tiny_spec(), _split(fr), cfg, log=lambda *a: None, progress=False, early_stopping=False)
    short, hist_short, _ = fit(fr, tiny_spec(), _split(fr), cfg, log=lambda *a: None, progress=False,
                               early_stopping=False, stop_after=2)
    assert len(hist_full) == 3 and len(hist_short) == 2
    assert hist_short[1]["val_average_precision"] == pytest.approx(hist_full[1]["val_average_precision"], abs=1e-9)
    assert hist_short[1]["loss"] == pytest.approx(hist_full[1]["loss"], rel=1e-6)
    # and the third epoch changed the weights (the snapshot is not the final model)
    diffs = [float((a - b).abs().max()) for a, b in zip(full.model.state_dict().values(), short.model.state_dict().values())
             if a.dtype.is_floating_point]
    assert max(diffs) > 0


def test_cosine_and_constant_schedules_differ_and_unknown_schedule_is_rejected():
    fr = tiny_frame(4, 40)
    runs = {}
    for sched in ("constant", "cosine"):
        cfg = CFG.__class__(**{**CFG.__dict__, "lr_schedule": sched, "epochs": 2})
        b, h, _ = fit(fr, tiny_spec(), _split(fr), cfg, log=lambda *a: None, progress=False, early_stopping=False)
        runs[sched] = h[-1]["loss"]
    assert runs["constant"] != pytest.approx(runs["cosine"], rel=1e-9)
    bad = CFG.__class__(**{**CFG.__dict__, "lr_schedule": "linear"})
    with pytest.raises(ValueError, match="lr_schedule"):
        fit(fr, tiny_spec(), _split(fr), bad, log=lambda *a: None, progress=False)


def test_a_field_with_model_input_false_stays_in_the_frame_but_not_in_the_model():
    spec = tiny_spec()
    fields = [f.model_copy(update={"model_input": False}) if f.name == "merchant" else f for f in spec.fields]
    spec_off = spec.model_copy(update={"fields": fields})
    fr = tiny_frame(2, 30)
    on, off = FeatureEncoder.fit(fr, spec), FeatureEncoder.fit(fr, spec_off)
    assert "merchant" in on.field_names() and "merchant" not in off.field_names()
    assert "mcc" in off.field_names()
    enc_on, enc_off = on.transform(fr), off.transform(fr)
    assert enc_off.cat.shape[1] == enc_on.cat.shape[1] - 1
    row = off.transform_row(fr.iloc[3].to_dict())
    np.testing.assert_array_equal(row.cat[0], enc_off.cat[3])
    torch.testing.assert_close(torch.from_numpy(row.num[0]), torch.from_numpy(enc_off.num[3]))


def test_fill_epoch_samples_windows_with_replacement_up_to_windows_per_epoch(monkeypatch):
    """fill_epoch: a file with fewer training windows than windows_per_epoch still takes that many
    windows per epoch (drawn with replacement); without it each window is used once."""
    import engine.model.train_loop as tl

    fr = tiny_frame(4, 40)
    seen = []
    orig = tl._batch_loss

    def counting(model, d, ids, dp):
        seen.append(len(ids))
        return orig(model, d, ids, dp)

    monkeypatch.setattr(tl, "_batch_loss", counting)
    base = {**CFG.__dict__, "epochs": 1, "windows_per_epoch": 40}
    fit(fr, tiny_spec(), _split(fr), TrainConfig(**base), log=lambda *a: None, progress=False)
    once = sum(seen)
    assert 0 < once < 40  # a tiny file: fewer training windows than windows_per_epoch
    seen.clear()
    fit(fr, tiny_spec(), _split(fr), TrainConfig(**{**base, "fill_epoch": True}), log=lambda *a: None, progress=False)
    assert sum(seen) == 40
