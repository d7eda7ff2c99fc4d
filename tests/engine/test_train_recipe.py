"""Training recipe levers: weight averaging (TrainConfig.ema_epochs, engine.model.train_loop._Ema:
the average follows its closed form, swapping twice restores the optimiser's weights, off means off)
and the batch size lowered for small files (TrainConfig.min_steps_per_epoch); the default recipe's
amount-by-value input, row feed-forward layer and weight averaging reach the model."""

import math

import pytest
import torch

from engine.model.train_loop import MIN_AUTO_BATCH, _Ema, effective_batch_size


def _model(v: float) -> torch.nn.Module:
    m = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        m.weight.fill_(v)
    return m


def test_average_has_its_half_life_is_bias_corrected_and_swap_restores():
    m = _model(-7.0)  # initial weights: no share in the average (bias correction)
    ema = _Ema(m, half_life_epochs=2.0, steps_per_epoch=5)  # half-life 10 steps
    d = 0.5 ** (1 / 10)
    assert ema.decay == pytest.approx(d)
    seen = [1.0, 4.0, 2.0, 8.0, 5.0, 3.0, 9.0, 6.0, 0.0, 7.0, 10.0, 11.0]
    for w in seen:
        with torch.no_grad():
            m.weight.fill_(w)
        ema.update()
    t = len(seen)
    want = sum(d ** (t - i) * (1 - d) * w for i, w in enumerate(seen, start=1)) / (1 - d ** t)
    assert ema.avg[0].item() == pytest.approx(want, rel=1e-5)
    assert 4.0 < want < 11.0  # a weighted mean of the trajectory, the later weights weigh more
    ema.swap()
    assert m.weight.item() == pytest.approx(want, rel=1e-5)  # validation sees the average ...
    ema.swap()
    assert m.weight.item() == 11.0  # ... and training goes on from its own weights


def test_first_update_is_the_weights_themselves():
    m = _model(-7.0)
    ema = _Ema(m, half_life_epochs=100.0, steps_per_epoch=50)
    with torch.no_grad():
        m.weight.fill_(2.0)
    ema.update()
    assert ema.avg[0].item() == pytest.approx(2.0)  # without the correction: -7 + 0.0001 * 9


def test_off_is_a_no_op():
    m = _model(3.0)
    ema = _Ema(m, half_life_epochs=0.0, steps_per_epoch=5)
    assert not ema.active
    ema.update()
    ema.swap()
    assert m.weight.item() == 3.0


def test_fit_keeps_the_averaged_weights(tmp_path):
    """One epoch with a long half-life: the kept weights are the (bias-corrected) average of the
    epoch's weights: away from the last step's, and not pulled back to the initial weights (without
    the correction the average kept about 99 % of them: moved under 0.2 of the plain run's way)."""
    from engine.model.train import TrainConfig, fit, time_split
    from tiny_models import tiny_frame, tiny_spec

    fr = tiny_frame(6, 40, seed=2)
    split, _, _ = time_split(fr["timestamp"])
    kw = dict(members=1, epochs=1, patience=1, d_model=16, n_heads=2, n_layers=1, d_ff=32, context_length=16, min_history=4,
              batch_size=4, lr=0.05, seed=1, threads=1, calibration="none")
    plain, _, _ = fit(fr, tiny_spec(), split, TrainConfig(**kw, ema_epochs=0.0), log=lambda m: None, progress=False)
    avg, _, _ = fit(fr, tiny_spec(), split, TrainConfig(**kw, ema_epochs=50.0), log=lambda m: None, progress=False)
    init, _, _ = fit(fr, tiny_spec(), split, TrainConfig(**{**kw, "lr": 0.0, "ema_epochs": 0.0}), log=lambda m: None,
                     progress=False)
    w = lambda b: b.model.head.weight.detach().flatten()  # noqa: E731
    moved_plain = (w(plain) - w(init)).norm().item()
    moved_avg = (w(avg) - w(init)).norm().item()
    assert moved_plain > 1e-3 and moved_avg > 0.5 * moved_plain  # measured 0.79
    assert (w(avg) - w(plain)).norm().item() > 0.1 * moved_plain  # measured 0.28: not the last step's
    assert math.isfinite(moved_avg)


def test_small_files_get_smaller_batches_and_large_ones_keep_theirs():
    assert effective_batch_size(64, 669, 40) == 16  # the demo data: 42 steps per epoch, not 11
    assert effective_batch_size(64, 6000, 40) == 64  # the Handbook's 6,000 windows per epoch: unchanged
    assert effective_batch_size(64, 100, 40) == MIN_AUTO_BATCH  # never below 8
    assert effective_batch_size(4, 100, 40) == 4  # never above the configured size
    assert effective_batch_size(64, 669, 0) == 64  # 0 = off


def test_fit_logs_the_lowered_batch_size():
    from engine.model.train import TrainConfig, fit, time_split
    from tiny_models import tiny_frame, tiny_spec

    fr = tiny_frame(6, 40, seed=2)
    split, _, _ = time_split(fr["timestamp"])
    lines: list[str] = []
    fit(fr, tiny_spec(), split, TrainConfig(epochs=1, d_model=16, n_heads=2, n_layers=1, d_ff=32, context_length=16,
                                            min_history=4, threads=1, calibration="none", min_steps_per_epoch=40),
        log=lines.append, progress=False)
    assert any(line.startswith("batch size 8 (not 64)") for line in lines), lines


def test_the_default_recipe_trains_with_amount_by_value_and_the_row_layer():
    """TrainConfig's defaults reach the model: the encoder has the amount-by-value statistics, the
    model the row feed-forward layer of width 128; switched off, neither (the earlier layout)."""
    from engine.model.train import TrainConfig, fit, time_split
    from tiny_models import tiny_frame, tiny_spec

    fr = tiny_frame(6, 40, seed=2)
    split, _, _ = time_split(fr["timestamp"])
    kw = dict(members=1, epochs=1, d_model=16, n_heads=2, n_layers=1, d_ff=32, context_length=16, min_history=4, threads=1,
              calibration="none")
    on, _, _ = fit(fr, tiny_spec(), split, TrainConfig(**kw), log=lambda m: None, progress=False)
    assert on.meta["train_config"]["ema_epochs"] == 1.0  # weight averaging on by default
    assert set(on.encoder.state["amount_by_value"]) == {"merchant", "mcc"}
    assert on.model.cfg.row_ff == 128 and on.model.row_ff[0].weight.shape == (128, 16)
    off, _, _ = fit(fr, tiny_spec(), split, TrainConfig(**kw, amount_by_value=False, row_ff=0), log=lambda m: None,
                    progress=False)
    assert "amount_by_value" not in off.encoder.state and off.model.row_ff is None
    assert len(on.encoder.num_columns()) == len(off.encoder.num_columns()) + 2
