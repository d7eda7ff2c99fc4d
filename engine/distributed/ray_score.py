"""Batch scoring on Ray: ``fraudlens score --engine ray``.

Flow:

1. The driver reads the dataset through the spec (:func:`engine.distributed.dataset.read_dataset`:
   the reader's validation and row accounting, unchanged; every record is accepted or rejected
   with its reason).
2. Accepted transactions are split into hash partitions of the entity key
   (:func:`entity_partitions`: blake2b of the key, so the same entity lands in the same partition
   in every process and run). A partition is one Ray Data block holding the whole, time-ordered
   history of each of its entities (the model reads an entity's earlier transactions).
3. ``Dataset.map_batches`` with a callable class (:class:`PartitionScorer`) and a fixed actor pool
   (``ActorPoolStrategy(size=workers)``, one CPU and one torch thread per actor) scores one whole
   block per call (``batch_size=None``). Each actor loads the checkpoint once: the driver sends
   the checkpoint's two files as bytes and the actor loads them with
   :func:`engine.model.checkpoint.load_checkpoint` (all its validation, never unpickled) and checks
   the identity against the driver's, so a cluster needs no shared checkpoint folder.
4. Scored blocks are written by ``Dataset.write_parquet`` into a folder of Parquet part files;
   the rejected rows are one more part file. Every part has the columns and types of the
   single-process ``fraudlens score`` output (:func:`engine.model.scoring.output_rows`), so the
   folder read as one table is the same table (up to row order; sort by ``row_number``).
5. The driver reads back ``row_number`` and ``status`` of the folder and checks the accounting:
   ``rows read = rows scored + rows rejected``, each row number once.

The folder is written under a temporary name next to ``out`` and renamed at the end, so an
interrupted run leaves no half-written dataset under ``out``.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from engine.data.features import stable_hash
from engine.data.io import REJECTED_COLUMNS, LoadResult
from engine.distributed.runtime import ray_session, unwrap_ray_error
from engine.model.checkpoint import META, WEIGHTS, ModelBundle
from engine.model.scoring import output_rows, score_frame

_PART, _PART_ROWS = "_fraudlens_partition", "_fraudlens_partition_rows"
#: rows per hash partition aimed at by the default partition count
ROWS_PER_PARTITION = 200_000


def entity_partitions(entity_ids, n_partitions: int) -> np.ndarray:
    """``[N]`` int64 partition of each row's entity key in ``[0, n_partitions)``: blake2b of the
    key (:func:`engine.data.features.stable_hash`), the same in every process, run and machine."""
    return stable_hash(np.asarray(entity_ids, dtype=object), n_partitions)


def default_partitions(n_rows: int, workers: int) -> int:
    """Hash partitions for ``n_rows`` transactions on ``workers`` actors: 4 per actor (so a slow
    partition does not idle the others) and about :data:`ROWS_PER_PARTITION` rows each at most."""
    return max(4 * workers, math.ceil(n_rows / ROWS_PER_PARTITION), 1)


def output_schema(frame: pd.DataFrame, calibrated: bool) -> pa.Schema:
    """The Arrow schema of the single-process score output for a canonical ``frame``: the columns
    and types ``write_scores`` gives (text as ``string``, ``label`` int8, logit float32, score
    float64, probability float64 only when ``calibrated``, ``timestamp`` timestamp[ns])."""
    cols = [c for c in ("row_number", "transaction_id", "entity_id", "timestamp", "amount", "label") if c in frame]
    s = frame[cols].head(0).copy()
    s["logit"] = np.zeros(0, np.float32)
    s["score"] = np.zeros(0, np.float64)
    s["probability"] = np.zeros(0, np.float64)
    r = pd.DataFrame({c: pd.Series([], dtype=np.int64 if c == "row_number" else object) for c in REJECTED_COLUMNS})
    both = _typed(output_rows(s, r, calibrated=calibrated))
    return pa.Schema.from_pandas(both, preserve_index=False)


def _typed(both: pd.DataFrame) -> pd.DataFrame:
    return both.astype({c: "string" for c in both.columns if both[c].dtype == object})


def _to_table(both: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pandas(_typed(both)[schema.names], schema=schema, preserve_index=False)


class PartitionScorer:
    """Ray Data callable class: scores whole entity partitions with a model loaded once per actor.

    Args:
        checkpoint_files: ``{"model.safetensors": bytes, "checkpoint.json": bytes}`` of the
            checkpoint, or a Ray object reference to it (written to a private temporary folder,
            then loaded with :func:`engine.model.checkpoint.load_checkpoint`).
        sha256: the checkpoint identity the driver loaded; a different one is an error.
        dtypes: ``{column: dtype text}`` of the canonical frame (restored on each batch: Arrow
            blocks turn a nullable ``Int8`` label into float, for example).
        schema: output :func:`output_schema`.
        batch_size: windows per forward pass (as ``score_frame``).
        threads: torch intra-op threads per actor.
    """

    def __init__(self, checkpoint_files: dict, sha256: str, dtypes: dict, schema: pa.Schema,
                 batch_size: int = 64, threads: int = 1):
        import torch

        from engine.model.checkpoint import load_checkpoint

        torch.set_num_threads(threads)
        if not isinstance(checkpoint_files, dict):
            import ray

            checkpoint_files = ray.get(checkpoint_files)
        with tempfile.TemporaryDirectory(prefix="fraudlens-actor-") as tmp:
            for name in (WEIGHTS, META):
                (Path(tmp) / name).write_bytes(checkpoint_files[name])
            self.bundle = load_checkpoint(tmp)
        if self.bundle.sha256 != sha256:
            raise ValueError(f"actor loaded checkpoint {self.bundle.sha256[:12]}, the driver {sha256[:12]}")
        self.dtypes, self.schema, self.batch_size = dtypes, schema, batch_size

    def __call__(self, batch: pd.DataFrame) -> pa.Table:
        """Score one batch of whole partitions: ``batch`` holds canonical rows plus the partition
        columns; returns the scored rows as an Arrow table of ``schema`` (status ``"scored"``).

        Raises:
            RuntimeError: a partition arrived incomplete (its history would be cut).
            ValueError / NonFiniteScoreError: from :func:`engine.model.scoring.score_frame`.
        """
        got = batch.groupby(_PART)[_PART_ROWS].agg(["size", "first"])
        short = got[got["size"] != got["first"]]
        if len(short):
            k = short.index[0]
            raise RuntimeError(f"partition {k} arrived with {short.loc[k, 'size']:,} of {short.loc[k, 'first']:,} "
                               "rows; an entity's history must be scored whole")
        part = batch.drop(columns=[_PART, _PART_ROWS])
        part = part.astype({c: t for c, t in self.dtypes.items() if str(part[c].dtype) != t})
        part = part.sort_values(["entity_id", "timestamp", "row_number"], kind="stable").reset_index(drop=True)
        scores = score_frame(self.bundle, part, batch_size=self.batch_size)
        empty = pd.DataFrame({c: pd.Series([], dtype=np.int64 if c == "row_number" else object) for c in REJECTED_COLUMNS})
        return _to_table(output_rows(scores, empty, calibrated=self.bundle.calibrated), self.schema)


@dataclass
class RayScoreRun:
    """Result of :func:`score_with_ray`.

    Attributes:
        out: the folder of Parquet part files. rows_read / rows_scored / rows_rejected: the
        accounting, checked on the folder as written. probability: ``[rows_scored]`` float64 of
        the scored rows, the value the thresholds apply to (calibrated probability, or the score
        of an uncalibrated model; for the flagged count). seconds: wall time of scoring and writing.
        workers / partitions: actors and hash partitions used. files: part files written.
    """

    out: Path
    rows_read: int
    rows_scored: int
    rows_rejected: int
    probability: np.ndarray
    seconds: float
    workers: int
    partitions: int
    files: int

    def accounting(self) -> str:
        """The same line as :meth:`engine.model.scoring.ScoreRun.accounting`."""
        return (f"rows read {self.rows_read:,} = rows scored {self.rows_scored:,} "
                f"+ rows rejected {self.rows_rejected:,}")


def check_out_folder(out: Path) -> None:
    """Refuse an output that exists as a file or as a non-empty folder.

    Raises:
        ValueError: names ``out`` and what to do.
    """
    if out.is_file() or out.is_symlink():
        raise ValueError(f"--out {out} is a file; the Ray engine writes a folder of Parquet part files "
                         f"(e.g. --out {out.with_suffix('')}_parts)")
    if out.is_dir() and any(out.iterdir()):
        raise ValueError(f"--out {out} is a folder that is not empty; choose a new folder or remove it")


def _checkpoint_files(bundle: ModelBundle) -> dict:
    if bundle.path is None:
        raise ValueError("the Ray engine scores a saved checkpoint (--model DIR or the demo model)")
    return {name: (Path(bundle.path) / name).read_bytes() for name in (WEIGHTS, META)}


def score_with_ray(bundle: ModelBundle, res: LoadResult, out: str | Path, *, workers: int = 2,
                   address: str | None = None, partitions: int | None = None,
                   batch_size: int = 64) -> RayScoreRun:
    """Score the accepted rows of ``res`` on Ray and write them with the rejected rows to ``out``.

    Args:
        bundle: a checkpoint loaded from disk (its files are sent to the actors).
        res: the dataset as read (:func:`engine.distributed.dataset.read_dataset`).
        out: output folder (created; must not exist or be empty).
        workers: actors in the pool (each one CPU); also ``num_cpus`` of a local Ray started here.
        address: Ray cluster address (see :func:`engine.distributed.runtime.ray_session`).
        partitions: entity hash partitions (default :func:`default_partitions`).
        batch_size: windows per forward pass.
    Returns:
        :class:`RayScoreRun`.
    Raises:
        ValueError: ``out`` is a file or a non-empty folder; the data lacks a field of the model;
            a score is NaN or infinite (the actor's message, naming transaction ids).
        RuntimeError: Ray missing or unreachable; the accounting of the written folder is broken.
    """
    out = Path(out)
    check_out_folder(out)
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    from engine.model.scoring import check_compatible

    check_compatible(bundle, res.frame, str(res.file))
    t0 = time.perf_counter()
    frame = res.frame
    n_part = partitions or default_partitions(len(frame), workers)
    part = entity_partitions(frame["entity_id"].to_numpy(), n_part)
    order = np.argsort(part, kind="stable")  # keeps each entity's time order
    bounds = np.flatnonzero(np.diff(part[order])) + 1
    blocks = []
    for idx in np.split(order, bounds):
        if len(idx):
            b = frame.iloc[idx].reset_index(drop=True)
            b[_PART] = int(part[idx[0]])
            b[_PART_ROWS] = len(idx)
            blocks.append(b)
    schema = output_schema(frame, bundle.calibrated)
    dtypes = {c: str(t) for c, t in frame.dtypes.items()}
    tmp_out = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp_out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out.mkdir(mode=0o700)  # the owner only while Ray writes into it (the scores hold card numbers)
    try:
        with ray_session(workers, address) as ray:
            if blocks:
                ds = ray.data.from_pandas(blocks).map_batches(
                    PartitionScorer,
                    fn_constructor_kwargs=dict(checkpoint_files=ray.put(_checkpoint_files(bundle)), sha256=bundle.sha256,
                                               dtypes=dtypes, schema=schema, batch_size=batch_size),
                    batch_size=None, batch_format="pandas", zero_copy_batch=True,
                    compute=ray.data.ActorPoolStrategy(size=workers), num_cpus=1,
                )
                try:
                    ds.write_parquet(str(tmp_out))
                except Exception as e:  # noqa: BLE001 - Ray wraps the actor's error
                    cause = unwrap_ray_error(e)
                    if isinstance(cause, ValueError):
                        raise ValueError(str(cause).strip().splitlines()[-1] if str(cause) else repr(cause)) from None
                    raise RuntimeError(f"Ray scoring failed: {type(cause).__name__}: {cause}") from None
        empty = frame.iloc[:0]
        none = empty.assign(logit=np.zeros(0, np.float32), score=np.zeros(0), probability=np.zeros(0))
        rej = _to_table(output_rows(none, res.rejected, calibrated=bundle.calibrated), schema)
        pq.write_table(rej, tmp_out / "rejected-00000.parquet")
        value = "probability" if bundle.calibrated else "score"  # the column the thresholds apply to
        written = pq.read_table(tmp_out, columns=["row_number", "status", value])
        rn = written["row_number"].to_numpy()
        status = written["status"].to_numpy(zero_copy_only=False)
        n_scored = int((status == "scored").sum())
        if (len(rn) != res.rows_read or n_scored != len(frame) or len(np.unique(rn)) != len(rn)):
            raise RuntimeError(f"row accounting broken in {out}: {len(rn):,} rows written ({n_scored:,} scored, "
                               f"{len(np.unique(rn)):,} distinct row numbers) for {res.rows_read:,} rows read")
        prob = written[value].to_numpy(zero_copy_only=False)[status == "scored"].astype(np.float64)
        files = sum(1 for _ in tmp_out.glob("*.parquet"))
        for f in tmp_out.iterdir():  # Ray's writers create files with the process umask: 0600, as the CSV outputs
            if f.is_file() and not f.is_symlink():
                f.chmod(0o600)
        if out.is_dir():
            out.rmdir()  # empty (checked above)
        tmp_out.rename(out)
    finally:
        shutil.rmtree(tmp_out, ignore_errors=True)
    return RayScoreRun(out=out, rows_read=res.rows_read, rows_scored=n_scored, rows_rejected=len(res.rejected),
                       probability=prob, seconds=time.perf_counter() - t0, workers=workers, partitions=len(blocks),
                       files=files)


def score_command(bundle: ModelBundle, data, spec, out: Path, workers: int, address: str | None, *,
                  read, fail, log) -> tuple[LoadResult, RayScoreRun]:
    """``fraudlens score --engine ray``: check Ray and ``out`` first, read ``data`` with the CLI's
    reader ``read(data, spec, reader=...)`` (prints the accounting), score on Ray, ``log`` the
    pool. ``fail(message)`` is the CLI's exit-2 error (called for every ValueError/RuntimeError)."""
    from engine.distributed.dataset import read_dataset
    from engine.distributed.runtime import require_ray

    try:
        require_ray()
        check_out_folder(out)
    except (RuntimeError, ValueError) as e:
        fail(str(e))
    _, res = read(data, spec or bundle.spec, reader=read_dataset)
    try:
        run = score_with_ray(bundle, res, out, workers=workers, address=address)
    except (RuntimeError, ValueError) as e:
        fail(f"{data}: {e}")
    log(f"Ray: {run.workers} actor(s), {run.partitions} entity partition(s), {run.files} part file(s)", markup=False)
    return res, run
