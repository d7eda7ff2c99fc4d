"""Scoring: every transaction of every entity in one causal pass per window.

``score_frame`` returns one row per transaction of the canonical frame; ``score_file`` reads a
raw file through a spec, scores it and accounts for every input row (scored or rejected).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from engine.data.features import EncodedFrame
from engine.data.io import table_format
from engine.model.checkpoint import ModelBundle
from engine.model.sequences import (
    build_windows,
    length_batches,
    make_batch,
    window_entity_start,
)
from engine.model.transformer import FraudTransformer


class NonFiniteScoreError(ValueError):
    """The model gave a NaN or infinite logit: an error, never "not flagged".

    Attributes:
        rows: indices (into the scored rows) of the non-finite scores.
    """

    def __init__(self, message: str, rows: np.ndarray):
        super().__init__(message)
        self.rows = rows


def _ids(values, n: int = 5) -> str:
    v = [str(x) for x in values[:n]]
    return ", ".join(v) + (f" and {len(values) - n:,} more" if len(values) > n else "")


def score_encoded(
    model: FraudTransformer,
    enc: EncodedFrame,
    entity_ids,
    *,
    batch_size: int = 64,
    progress=None,
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """Fraud logits of every row, one forward pass per window batch.

    Args:
        model: the model (put in eval mode here).
        enc: encoded rows ``N``, sorted by (entity_id, timestamp).
        entity_ids: ``[N]`` entity of each row.
        batch_size: windows per forward pass.
        progress: optional callable ``(n_windows_done) -> None``.
        rows: optional subset of row indices to score (only the windows that score them run);
            other rows are NaN.
    Returns:
        ``[N]`` float32 logits (probability = sigmoid(logit)).
    Raises:
        NonFiniteScoreError: a scored row's logit is NaN or infinite (names the row indices).
    """
    cfg = model.cfg
    win = build_windows(entity_ids, cfg.context_length, cfg.min_history)
    ent_start = window_entity_start(win, entity_ids)
    out = np.full(len(enc), np.nan, dtype=np.float32)
    bad: list[np.ndarray] = []
    model.eval()
    with torch.inference_mode():
        # windows grouped by (first scored position, length): a batch of later windows runs its
        # last block for the scored positions only (FraudTransformer.logits_from)
        need = np.arange(win.n_windows) if rows is None else np.unique(win.row_window[np.asarray(rows)])
        order = need[np.lexsort((win.length[need], win.scored_from[need] > 0))]
        for ids, Tb in length_batches(win, batch_size, order):
            start = int(min(win.scored_from[ids].min(), Tb - 1))
            batch = make_batch(enc, win.rows[ids, :Tb], ent_start[ids])
            logits = model.logits_from(batch, start).numpy()  # [b, Tb - start]
            rows_b = win.rows[ids, start:Tb]
            take = (rows_b >= 0) & (np.arange(start, Tb)[None, :] >= win.scored_from[ids][:, None])
            out[rows_b[take]] = logits[take]
            if not np.isfinite(logits[take]).all():
                bad.append(rows_b[take][~np.isfinite(logits[take])])
            if progress is not None:
                progress(len(ids))
    if bad:
        rows_bad = np.unique(np.concatenate(bad))
        raise NonFiniteScoreError(
            f"the model gave a NaN or infinite score for {len(rows_bad):,} row(s) (row index {_ids(rows_bad)}); "
            "the model or its input is broken, so no score is reported", rows_bad)
    return out


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def check_compatible(bundle: ModelBundle, frame: pd.DataFrame, source: str = "the data") -> None:
    """Raise a clear ValueError if ``frame`` lacks a field the model was trained on.

    Raises:
        ValueError: names the missing fields, the model's spec, and what to do.
    """
    need = [f.name for f in bundle.spec.fields] + [c for a in bundle.spec.aggregates for c in a.columns()]
    missing = [c for c in need if c not in frame.columns]
    if missing:
        from engine.model.checkpoint import DEMO_MODEL_SHA256

        demo = (" The demo model, used when no --model is given, reads TabFormer-format files only "
                "(--spec tabformer or demo).") if getattr(bundle, "sha256", None) == DEMO_MODEL_SHA256 else ""
        raise ValueError(
            f"{source} lacks field(s) {missing} that model {bundle.meta.get('name', '')!r} (spec "
            f"{bundle.spec.name!r}) was trained on; score it with a model trained for this spec "
            f"(fraudlens train --data FILE --spec SPEC --out DIR, then --model DIR) or use the model's spec.{demo}"
        )


def score_frame(bundle: ModelBundle, frame: pd.DataFrame, *, batch_size: int = 64) -> pd.DataFrame:
    """Score a canonical frame (see :mod:`engine.data.io`).

    Returns:
        DataFrame with row_number, transaction_id, entity_id, timestamp, amount, label (if known),
        logit (float32), score (``sigmoid(logit)``, float64 in [0, 1]) and probability (float64
        in [0, 1]: the calibrated fraud probability when the checkpoint has a calibration map,
        else equal to ``score``; the thresholds apply to this column), in the frame's row order.
    Raises:
        ValueError: the frame lacks a field of the model (see :func:`check_compatible`).
        NonFiniteScoreError: a score is NaN or infinite; names the transaction ids.
    """
    check_compatible(bundle, frame)
    enc = bundle.encoder.transform(frame)
    try:
        logits = score_encoded(bundle.model, enc, frame["entity_id"].to_numpy(), batch_size=batch_size)
    except NonFiniteScoreError as e:
        tid = frame["transaction_id"].to_numpy()[e.rows] if "transaction_id" in frame else e.rows
        raise NonFiniteScoreError(
            f"model {bundle.short_sha or bundle.meta.get('name', '')} gave a NaN or infinite score for "
            f"{len(e.rows):,} transaction(s) ({_ids(tid)}); the model or its input is broken, so no score is reported",
            e.rows) from None
    cols = [c for c in ("row_number", "transaction_id", "entity_id", "timestamp", "amount", "label") if c in frame]
    out = frame[cols].copy()
    out["logit"] = logits
    out["score"] = sigmoid(logits.astype(np.float64))
    out["probability"] = bundle.probability(logits) if bundle.calibrated else out["score"].to_numpy()
    return out


@dataclass
class ScoreRun:
    """Result of :func:`score_file`: scores, rejected rows and the row accounting.

    ``calibrated``: the model has a calibration map, so the ``probability`` column is a
    probability; otherwise :func:`write_scores` writes only ``score`` (the words rule)."""

    scores: pd.DataFrame
    rejected: pd.DataFrame
    rows_read: int
    seconds: float
    calibrated: bool = False

    def accounting(self) -> str:
        return (
            f"rows read {self.rows_read:,} = rows scored {len(self.scores):,} + rows rejected {len(self.rejected):,}"
        )


def score_file(bundle: ModelBundle, path: str | Path, spec=None, *, batch_size: int = 64) -> ScoreRun:
    """Read ``path`` with ``spec`` (default: the model's spec), score every accepted row.

    Raises:
        ValueError / FileNotFoundError: from reading (missing columns, unreadable file).
        AssertionError never: the accounting identity is checked and raised as RuntimeError.
    """
    from engine.data.io import read_transactions

    t0 = time.perf_counter()
    res = read_transactions(path, spec or bundle.spec)
    scores = score_frame(bundle, res.frame, batch_size=batch_size)
    if res.rows_read != len(scores) + len(res.rejected):
        raise RuntimeError(f"row accounting broken: {res.rows_read} != {len(scores)} + {len(res.rejected)}")
    return ScoreRun(scores=scores, rejected=res.rejected, rows_read=res.rows_read, seconds=time.perf_counter() - t0,
                    calibrated=bundle.calibrated)


def write_scores(run: ScoreRun, out: str | Path) -> Path:
    """Write one row per input row: scored rows (status "scored") and rejected rows (status
    "rejected", with column and reason) to Parquet or CSV by suffix (:func:`table_format`, whose
    ValueError it raises). The CSV goes through
    :func:`engine.data.csv_writer.write_csv` (formula-like text cells neutralised).

    Columns ``logit`` and ``score`` (``sigmoid(logit)``) always; ``probability`` only when
    ``run.calibrated`` (an uncalibrated number is never written as a probability)."""
    from engine.data.csv_writer import write_csv

    fmt = table_format(out)
    both = output_rows(run.scores, run.rejected, calibrated=run.calibrated)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "csv":
        write_csv(both, out)
    else:
        from engine.data.csv_writer import write_private_parquet  # raw entity ids: 0600, as the CSV

        write_private_parquet(both.astype({c: "string" for c in both.columns if both[c].dtype == object}), out)
    return out


def output_rows(scores: pd.DataFrame, rejected: pd.DataFrame, *, calibrated: bool) -> pd.DataFrame:
    """The rows :func:`write_scores` writes: ``scores`` (status ``"scored"``; without its
    ``probability`` column unless ``calibrated``) and ``rejected`` (status ``"rejected"``; its
    ``column``/``value`` renamed ``rejected_column``/``rejected_value``), in row_number order.
    Columns: the scores' columns, ``status``, then ``file``, ``rejected_column``,
    ``rejected_value``, ``reason`` (empty on scored rows)."""
    s = scores.copy()
    if not calibrated:
        s = s.drop(columns=["probability"], errors="ignore")
    s["status"] = "scored"
    r = rejected.rename(columns={"column": "rejected_column", "value": "rejected_value"}).copy()
    r["status"] = "rejected"
    return pd.concat([s, r], ignore_index=True).sort_values("row_number", kind="stable")
