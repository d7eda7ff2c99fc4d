"""Shared tiny model + data for the explainer tests (copied from tests/engine/test_model.py so
these tests do not depend on import order; not collected: no ``test_`` prefix)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd
import pytest
import torch

from engine.checkpoint import ModelBundle, build_model
from engine.context import build_context
from engine.features import FeatureEncoder
from engine.spec import DatasetSpec


def tiny_spec() -> DatasetSpec:
    return DatasetSpec.model_validate(
        {
            "name": "tiny",
            "entity": {"columns": ["card"]},
            "timestamp": {"column": "ts"},
            "amount": {"column": "amt"},
            "label": {"column": "y"},
            "fields": [
                {"name": "merchant", "column": "m", "kind": "categorical", "hashed_buckets": 64},
                {"name": "mcc", "column": "mcc", "kind": "categorical"},
                {"name": "risk", "column": "r", "kind": "numeric"},
                {"name": "errors", "column": "e", "kind": "multi_valued"},
            ],
        }
    )


def tiny_frame(n_entities=4, n=40, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    parts = []
    for e in range(n_entities):
        m = n + 7 * e
        ts = pd.Timestamp("2024-01-01") + pd.to_timedelta(np.cumsum(rng.exponential(3600 * 5, m)), unit="s")
        parts.append(
            pd.DataFrame(
                {
                    "entity_id": f"c{e}",
                    "timestamp": ts,
                    "amount": np.round(rng.lognormal(3, 1, m) * rng.choice([1, -1], m, p=[0.95, 0.05]), 2),
                    "merchant": rng.integers(0, 30, m).astype(str),
                    "mcc": rng.choice(["5411", "5812", "5999"], m),
                    "risk": rng.normal(size=m),
                    "errors": rng.choice(["", "Bad PIN", "Bad PIN|Insufficient Balance"], m, p=[0.8, 0.1, 0.1]),
                    "label": pd.array(rng.random(m) < 0.1, dtype="Int8"),
                }
            )
        )
    f = pd.concat(parts, ignore_index=True)
    f.insert(0, "row_number", np.arange(1, len(f) + 1))
    f.insert(1, "transaction_id", [f"t{i}" for i in range(len(f))])
    return f.sort_values(["entity_id", "timestamp", "row_number"]).reset_index(drop=True)


def make_bundle(seed: int = 3, **overrides) -> ModelBundle:
    """Tiny model (d_model 16, 2 heads, 2 layers, context 16) with large random weights."""
    spec = tiny_spec()
    fr = tiny_frame()
    enc = FeatureEncoder.fit(fr, spec)
    kw = dict(d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0, context_length=16, min_history=6)
    kw.update(overrides)
    model = build_model(enc, seed=seed, **kw)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    model.eval()
    return ModelBundle(model=model, encoder=enc, spec=spec, meta={"thresholds": {"review": 0.5}})


@lru_cache(maxsize=None)
def shared_bundle() -> ModelBundle:
    return make_bundle()


@lru_cache(maxsize=None)
def frame() -> pd.DataFrame:
    return tiny_frame(2, 40)


def context(position: int, entity: str = "c0", bundle: ModelBundle | None = None):
    """Context of the ``position``-th transaction (0-based) of ``entity`` in :func:`frame`."""
    fr = frame()
    tid = fr.loc[fr.entity_id == entity, "transaction_id"].iloc[position]
    return build_context(bundle or shared_bundle(), fr, tid)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Run a test module with one torch thread (the 2 shared cores are busy; two OpenMP threads
    spin-wait against other processes and run far slower), restoring the setting after."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
