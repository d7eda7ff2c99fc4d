"""engine.model.pretrain: next-transaction pretraining learns what is predictable, reads only the
training period, and hands the fraud training a model with a fresh head."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from engine.data.features import FeatureEncoder
from engine.model.checkpoint import build_model
from engine.model.pretrain import NextTransactionHeads, hidden_states, pretrain_next_transaction, pretraining_targets
from engine.model.sequences import build_windows, make_batch, window_entity_start
from tiny_models import tiny_frame, tiny_spec

@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models: one intra-op thread (two oversubscribe a 2-core machine running tests in parallel: 30x slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


KW = dict(d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0, context_length=16, min_history=6)


def _alternating(frame: pd.DataFrame) -> pd.DataFrame:
    """Each entity's mcc alternates 5411, 5812, 5411, ... (the next value is known from the last)."""
    f = frame.copy()
    pos = f.groupby("entity_id").cumcount().to_numpy()
    f["mcc"] = np.where(pos % 2 == 0, "5411", "5812")
    return f


def _setup(frame, seed=0):
    spec = tiny_spec()
    split = np.where(frame["timestamp"] < frame["timestamp"].quantile(0.7), 0, 2).astype(np.int8)
    encoder = FeatureEncoder.fit(frame.loc[split == 0], spec)
    enc = encoder.transform(frame)
    ents = frame["entity_id"].to_numpy()
    win = build_windows(ents, KW["context_length"], KW["min_history"])
    model = build_model(encoder, seed=seed, **KW)
    return model, enc, win, window_entity_start(win, ents), split


def _mcc_cross_entropy(model, heads, enc, win, ent_start, split) -> float:
    """Cross-entropy (nats) of the heads' next-mcc prediction over the training-period targets."""
    cfg = model.cfg
    col = [cfg.field_names[cfg.cat_field_index[c]] for c in range(len(cfg.cat_cardinalities))].index("mcc")
    rows = win.rows
    batch = make_batch(enc, rows, ent_start)
    valid = rows >= 0
    tgt = np.zeros_like(valid)
    tgt[:, 1:] = valid[:, 1:] & valid[:, :-1] & (split[np.where(valid, rows, 0)][:, 1:] == 0)
    m = torch.from_numpy(tgt)[:, 1:]
    with torch.no_grad():
        src = hidden_states(model.eval(), batch)[:, :-1][m]
        head = heads.cat_heads[heads.cat_cols.index(col)]
        return float(torch.nn.functional.cross_entropy(head(src), batch.cat[:, 1:][m][:, col]))


def test_pretraining_learns_a_predictable_next_transaction():
    """The next mcc alternates: after pretraining the states tell it (probe cross-entropy far
    below the log 2 of a coin flip); an untrained model's states barely do."""
    model, enc, win, ent_start, split = _setup(_alternating(tiny_frame(n_entities=6, n=60)))
    heads = NextTransactionHeads(model.cfg)
    before = _mcc_cross_entropy(model, heads, enc, win, ent_start, split)
    hist = pretrain_next_transaction(model, enc, win, ent_start, split == 0, minutes=5.0, lr=5e-3, batch_size=16, seed=0,
                                     max_epochs=40, log=lambda m: None, heads=heads)
    after = _mcc_cross_entropy(model, heads, enc, win, ent_start, split)
    assert len(hist) == 40 and hist[-1]["loss"] < hist[0]["loss"]
    assert after < 0.5 * math.log(2) < before, (before, after)  # a coin flip is log 2


def test_pretraining_reads_only_the_training_period():
    """Changing every feature of the validation / test rows changes no pretrained weight."""
    frame = tiny_frame(n_entities=5, n=50)
    runs = []
    for edit in (False, True):
        f = frame.copy()
        if edit:
            late = f["timestamp"] >= f["timestamp"].quantile(0.7)
            f.loc[late, "amount"] = f.loc[late, "amount"] * 100 + 7
            f.loc[late, "mcc"] = "5999"
            f.loc[late, "risk"] = 9.0
        model, enc, win, ent_start, split = _setup(f)
        pretrain_next_transaction(model, enc, win, ent_start, split == 0, minutes=5.0, lr=5e-3, batch_size=16, seed=0,
                                  max_epochs=3, log=lambda m: None)
        runs.append(model.state_dict())
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    # and the training rows do matter (the check can fail): a changed training amount changes the weights
    f = frame.copy()
    f.loc[f.index[:5], "amount"] += 50
    model, enc, win, ent_start, split = _setup(f)
    pretrain_next_transaction(model, enc, win, ent_start, split == 0, minutes=5.0, lr=5e-3, batch_size=16, seed=0,
                              max_epochs=3, log=lambda m: None)
    assert not all(torch.equal(runs[0][k], model.state_dict()[k]) for k in runs[0])


def test_fit_with_pretraining_keeps_a_fresh_fraud_head_and_records_the_history():
    from engine.model.train import TrainConfig, fit, new_model
    from engine.model.train_loop import prepare_fit

    frame = tiny_frame(n_entities=5, n=50)
    split = np.where(frame["timestamp"] < frame["timestamp"].quantile(0.6), 0,
                     np.where(frame["timestamp"] < frame["timestamp"].quantile(0.8), 1, 2)).astype(np.int8)
    cfg = TrainConfig(**KW, epochs=1, windows_per_epoch=None, min_steps_per_epoch=0, members=1, max_minutes=5.0,
                      pretrain_minutes=0.05, activity_ple=False, row_ff=0, ema_epochs=0.0)
    from engine.model.train import _pretrained

    d = prepare_fit(frame, tiny_spec(), split, cfg)
    state, hist = _pretrained(d, split, cfg, log=lambda m: None)
    init = new_model(d.encoder, cfg).state_dict()
    assert all(torch.equal(state[k], init[k]) for k in init if k.startswith("head."))
    assert not all(torch.equal(state[k], init[k]) for k in init if k.startswith("blocks."))
    bundle, history, _ = fit(frame, tiny_spec(), split, cfg, log=lambda m: None, progress=False)
    assert bundle.meta["pretrain_history"][0]["epoch"] == 1 and len(history) == 1
    with pytest.raises(ValueError, match="must leave part of max_minutes"):
        fit(frame, tiny_spec(), split, TrainConfig(**KW, members=1, max_minutes=1.0, pretrain_minutes=1.0),
            log=lambda m: None, progress=False)
    with pytest.raises(ValueError, match="positive budget"):
        pretrain_next_transaction(build_model(d.encoder, seed=0, **KW), d.enc, d.win, d.ent_start, split == 0,
                                  minutes=0.0, lr=1e-3, batch_size=8, seed=0)


def test_pretraining_targets_are_the_training_period_and_the_history_before_it():
    """History before the training period (split -1, e.g. the Handbook protocol's months before a
    fold's training week) is predicted; validation, test and history after the training start never."""
    split = np.array([-1, -1, 0, 0, -1, 1, 2, -1, 0], dtype=np.int8)
    t = np.array([1, 2, 3, 4, 5, 6, 7, 0, 8], dtype=np.float64)
    assert pretraining_targets(split, t).tolist() == [True, True, True, True, False, False, False, True, True]
    with pytest.raises(ValueError, match="no training row"):
        pretraining_targets(np.array([1, 2], dtype=np.int8), np.array([0.0, 1.0]))
