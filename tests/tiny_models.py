"""Tiny spec and synthetic canonical frame shared by the model, explainer and trust tests
(importable because tests/conftest.py puts tests/ on sys.path)."""

import numpy as np
import pandas as pd

from engine.data.spec import DatasetSpec


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


def demo_slice(path, n_rows: int):
    """Write the header and the first ``n_rows`` rows of the committed demo data to ``path``."""
    from engine.cases.view import DEMO_DATA

    with open(DEMO_DATA, encoding="utf-8") as f:
        path.write_text("".join(next(f) for _ in range(n_rows + 1)), encoding="utf-8")
    return path


def tiny_checkpoint(frame: pd.DataFrame, spec: DatasetSpec, out, meta: dict, *, seed: int = 2, **overrides):
    """An untrained tiny model (d_model 16, 2 heads, 2 layers, context 16; ``overrides`` replace
    any of those) fitted to ``frame``, its weights perturbed with N(0, 0.3) noise from generator
    seed 0 so scores spread, saved with ``meta`` as a checkpoint in ``out``; returns ``out``."""
    import torch

    from engine.model.checkpoint import ModelBundle, build_model, save_checkpoint
    from engine.data.features import FeatureEncoder

    enc = FeatureEncoder.fit(frame, spec)
    kw = dict(d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0, context_length=16, min_history=6)
    kw.update(overrides)
    model = build_model(enc, seed=seed, **kw)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3)
    model.eval()
    save_checkpoint(ModelBundle(model=model, encoder=enc, spec=spec, meta=meta), out)
    return out


def perturbed_bundle(enc, spec, seed: int = 0, **overrides):
    """A small model for ``enc`` whose weights are moved off their initialisation (N(0, 0.3^2) added), so
    that every input path changes the scores; eval mode, review threshold 0.5. ``overrides``: ModelConfig
    fields on top of d_model 16, 2 heads, 2 layers, d_ff 32, no dropout, context 16, min history 6."""
    import torch

    from engine.model.checkpoint import ModelBundle, build_model

    cfg = {"d_model": 16, "n_heads": 2, "n_layers": 2, "d_ff": 32, "dropout": 0.0, "context_length": 16,
           "min_history": 6, **overrides}
    model = build_model(enc, seed=seed, **cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return ModelBundle(model=model.eval(), encoder=enc, spec=spec, meta={"thresholds": {"review": 0.5}})
