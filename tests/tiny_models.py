"""Tiny spec and synthetic canonical frame shared by the model, explainer and trust tests
(importable because tests/conftest.py puts tests/ on sys.path)."""

import numpy as np
import pandas as pd

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
