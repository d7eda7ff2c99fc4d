"""Shared helpers of the scoring-service tests: a tiny spec with a transaction id column, raw
records (the JSON a client posts) made from tests/tiny_models.tiny_frame, and a tiny checkpoint."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from engine.data.spec import DatasetSpec
from tiny_models import tiny_checkpoint, tiny_frame, tiny_spec


def id_spec() -> DatasetSpec:
    """tests/tiny_models.tiny_spec with the transaction id column ``tid``."""
    return DatasetSpec.model_validate({**tiny_spec().model_dump(mode="json"), "name": "tiny_id", "id": "tid"})


def raw_records(n_entities: int = 4, n: int = 40, seed: int = 0) -> list[dict]:
    """Raw records (spec column names, JSON values) in global time order (entities interleaved)."""
    fr = tiny_frame(n_entities, n, seed=seed).sort_values(["timestamp", "row_number"])
    out = []
    for r in fr.to_dict("records"):
        out.append({"tid": r["transaction_id"], "card": r["entity_id"], "ts": r["timestamp"].isoformat(),
                    "amt": float(r["amount"]), "m": r["merchant"], "mcc": r["mcc"], "r": float(r["risk"]),
                    "e": r["errors"].replace("|", ","), "y": "" if pd.isna(r["label"]) else str(int(r["label"]))})
    return out


def write_raw(records: list[dict], path: Path) -> Path:
    """The records as a Parquet file (text columns, as posted), for batch scoring."""
    pd.DataFrame(records).astype({"amt": float, "r": float}).to_parquet(path, index=False)
    return path


def make_checkpoint(tmp: Path, review: float = 0.5, decline: float = 0.8) -> Path:
    """A tiny checkpoint (context 16, min_history 6) fitted to :func:`raw_records`' data."""
    from engine.data.io import read_transactions

    spec = id_spec()
    frame = read_transactions(write_raw(raw_records(), tmp / "fit.parquet"), spec).frame
    return tiny_checkpoint(frame, spec, tmp / "model", {"name": "tiny-serve",
                                                       "thresholds": {"review": review, "decline": decline}})


def batch_probabilities(bundle, records: list[dict], folder: Path) -> dict[str, float]:
    """Whole-file scoring of ``records`` (written to ``folder``): transaction id -> probability.
    The reference the service's scores are compared with; every record must be accepted."""
    from engine.data.io import read_transactions
    from engine.model.scoring import score_frame

    res = read_transactions(write_raw(records, folder / "all.parquet"), id_spec())
    assert len(res.rejected) == 0
    s = score_frame(bundle, res.frame)
    return dict(zip(s["transaction_id"], s["probability"]))
