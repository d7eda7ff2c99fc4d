"""Shared fixtures of the trust tests (not collected: no ``test_`` prefix).

A tiny model *trained* on a synthetic task whose label depends on the history, so attributions
mean something: a transaction is fraud iff an earlier transaction of the same card with MCC
``7995`` (the *trigger*) happened less than 3 hours before it. Each trigger and the frauds it
causes form one ``Fraud Episode`` (evaluation-only column, never model input). Training: ~300
Adam steps on windows of 16, about 3 s on one thread.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd
import pytest
import torch

from engine.model.checkpoint import ModelBundle, build_model
from engine.explain.context import build_context
from engine.data.features import FeatureEncoder
from engine.model.sequences import build_windows, make_batch, window_entity_start
from engine.data.spec import DatasetSpec

TRIGGER = "7995"
WINDOW_H = 3.0
T_CTX = 16


def spec(with_id: bool = False) -> DatasetSpec:
    d = {
        "name": "trust-tiny",
        "entity": {"columns": ["card"]},
        "timestamp": {"column": "ts"},
        "amount": {"column": "amt"},
        "label": {"column": "y", "positive": ["1"], "negative": ["0"]},
        "passthrough": ["Fraud Episode"],
        "fields": [
            {"name": "merchant", "column": "m", "kind": "categorical", "hashed_buckets": 64},
            {"name": "mcc", "column": "mcc", "kind": "categorical"},
            {"name": "risk", "column": "r", "kind": "numeric"},
            {"name": "errors", "column": "e", "kind": "multi_valued"},
        ],
    }
    if with_id:
        d["id"] = "tid"
    return DatasetSpec.model_validate(d)


def synthetic_frame(n_entities: int = 24, n: int = 40, seed: int = 0) -> pd.DataFrame:
    """Canonical frame (engine.data.io contract) of the synthetic task; ``Fraud Episode`` column."""
    rng = np.random.default_rng(seed)
    parts = []
    for e in range(n_entities):
        m = n + (e % 5)
        ts = pd.Timestamp("2024-01-01") + pd.to_timedelta(np.cumsum(rng.exponential(3600 * 2.0, m)).round(), unit="s")
        mcc = rng.choice(["5411", "5812", "5999", TRIGGER], m, p=[0.35, 0.3, 0.2, 0.15])
        label = np.zeros(m, dtype=np.int8)
        episode = np.array([""] * m, dtype=object)
        t_s = (ts - ts[0]).total_seconds().to_numpy()
        for i in range(m):
            prev = np.flatnonzero((mcc[:i] == TRIGGER) & (t_s[i] - t_s[:i] < WINDOW_H * 3600))
            if len(prev):
                label[i] = 1
                # the latest trigger's episode (a trigger that is itself a fraud continues its own)
                ep = episode[prev[-1]] or f"E{e:02d}-{prev[-1]:02d}"
                episode[i] = episode[prev[-1]] = ep
        parts.append(pd.DataFrame({
            "entity_id": f"c{e:02d}", "timestamp": ts,
            "amount": np.round(rng.lognormal(3, 0.8, m), 2),
            "merchant": rng.integers(0, 30, m).astype(str), "mcc": mcc, "risk": rng.normal(size=m),
            "errors": rng.choice(["", "Bad PIN"], m, p=[0.9, 0.1]),
            "label": pd.array(label, dtype="Int8"), "Fraud Episode": episode,
        }))
    f = pd.concat(parts, ignore_index=True)
    f.insert(0, "row_number", np.arange(1, len(f) + 1))
    f.insert(1, "transaction_id", [f"t{i}" for i in range(len(f))])
    return f.sort_values(["entity_id", "timestamp", "row_number"]).reset_index(drop=True)


def _train(bundle: ModelBundle, frame: pd.DataFrame, steps: int = 300, seed: int = 0) -> None:
    model, cfg = bundle.model, bundle.model.cfg
    enc = bundle.encoder.transform(frame)
    ents = frame["entity_id"].to_numpy()
    win = build_windows(ents, cfg.context_length, cfg.min_history)
    start = window_entity_start(win, ents)
    y = frame["label"].to_numpy(dtype="float32", na_value=0.0)
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        ids = rng.choice(win.n_windows, size=32)
        rows = win.rows[ids]
        batch = make_batch(enc, rows, start[ids])
        logits = model(batch).logits
        m = torch.from_numpy((rows >= 0) & (np.arange(cfg.context_length)[None] >= win.scored_from[ids][:, None]))
        target = torch.from_numpy(y[np.maximum(rows, 0)])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits[m], target[m])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


@lru_cache(maxsize=None)
def frame() -> pd.DataFrame:
    return synthetic_frame()


@lru_cache(maxsize=None)
def trained_bundle(activity: bool = True) -> ModelBundle:
    """Tiny model (d_model 16, 2 heads, 2 layers, context 16) trained on :func:`frame`
    (``activity``: with the recent-activity / first-seen fields, the default of new models)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        fr = frame()
        sp = spec()
        enc = FeatureEncoder.fit(fr, sp)
        model = build_model(enc, seed=0, activity=activity, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                            dropout=0.0, context_length=T_CTX, min_history=6)
        bundle = ModelBundle(model=model, encoder=enc, spec=sp,
                             meta={"thresholds": {"review": 0.5},
                                   "split": {"val_end": str(fr["timestamp"].quantile(0.5).normalize())}})
        _train(bundle, fr)
        return bundle
    finally:
        torch.set_num_threads(n)


def context(transaction_id: str, bundle: ModelBundle | None = None, fr: pd.DataFrame | None = None):
    return build_context(bundle or trained_bundle(), frame() if fr is None else fr, transaction_id)


def positive_queries(max_position: int | None = None) -> list[str]:
    """Fraud-labelled transactions whose episode's trigger is in their context (first window when
    ``max_position`` < T), in frame order."""
    fr = frame()
    pos = fr.groupby("entity_id").cumcount().to_numpy()
    ok = (fr["label"] == 1).to_numpy() & (pos >= 2)
    if max_position is not None:
        ok &= pos <= max_position
    return fr.loc[ok, "transaction_id"].tolist()


def to_raw(fr: pd.DataFrame) -> pd.DataFrame:
    """The raw file (spec ``trust-tiny`` with id column ``tid``) of a canonical frame, in file order."""
    fr = fr.sort_values("row_number")
    return pd.DataFrame({
        "tid": fr["transaction_id"].to_numpy(), "card": fr["entity_id"].to_numpy(),
        "ts": pd.to_datetime(fr["timestamp"]).dt.strftime("%Y-%m-%dT%H:%M:%S").to_numpy(),
        "amt": fr["amount"].map(lambda x: f"{x:.2f}").to_numpy(), "y": fr["label"].astype(int).astype(str).to_numpy(),
        "m": fr["merchant"].to_numpy(), "mcc": fr["mcc"].to_numpy(), "r": fr["risk"].map(repr).to_numpy(),
        "e": fr["errors"].str.replace("|", ",").to_numpy(), "Fraud Episode": fr["Fraud Episode"].to_numpy(),
    })


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One torch thread per test module (the 2 shared cores are busy), restored after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def two_card_frame(card: pd.DataFrame, filler: pd.DataFrame) -> pd.DataFrame:
    """A canonical frame of card 0:0 (``card``'s rows) and card 0:1 (``filler`` one hour later):
    labels 0, ``row_number`` 1..N and ``transaction_id`` ``r<row>`` in that order, sorted by
    (entity, time, row) as the reader sorts."""
    a = card.assign(entity_id="0:0")
    b = filler.assign(entity_id="0:1", timestamp=filler["timestamp"] + pd.Timedelta(hours=1))
    fr = pd.concat([a, b], ignore_index=True)
    fr["label"] = pd.array(np.zeros(len(fr), dtype=np.int8), dtype="Int8")
    fr.insert(0, "row_number", np.arange(1, len(fr) + 1))
    fr.insert(1, "transaction_id", [f"r{i}" for i in fr["row_number"]])
    return fr.sort_values(["entity_id", "timestamp", "row_number"]).reset_index(drop=True)
