"""Shared tiny model + data for the explainer tests (tiny spec and frame from tests/tiny_models.py;
not collected: no ``test_`` prefix)."""

from __future__ import annotations

from functools import lru_cache

import pandas as pd
import pytest
import torch

from engine.model.checkpoint import ModelBundle, build_model
from engine.explain.context import build_context
from engine.data.features import FeatureEncoder


from tiny_models import tiny_frame, tiny_spec  # noqa: E402,F401


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
