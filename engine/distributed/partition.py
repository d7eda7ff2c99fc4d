"""Files larger than memory: partition by entity with DuckDB, then validate and score partition by partition.

``score_partitioned(bundle, path, spec, out, partitions=N)`` gives the same scores and the same
rejected rows as ``fraudlens score`` reading the whole file (``engine.data.io.read_transactions``
then ``engine.model.scoring.score_frame``), while holding about one N-th of the file in memory:

1. **Partition** (DuckDB, ``memory_limit`` and ``temp_directory`` set, so DuckDB spills to disk):
   every record gets its 1-based record number (Parquet: ``file_row_number``; CSV: the file is
   first streamed to Parquet with pyarrow's CSV reader, the same reader and options as
   :func:`engine.data.io.read_transactions`) and ``hash(entity key) % N``; ``COPY ... TO``
   (``FORMAT parquet, PARTITION_BY``) writes one folder per partition. Every entity lands in
   exactly one partition (the key: the entity columns, text stripped of surrounding blanks as
   the reader strips it).
2. **Validate** each partition with :func:`engine.data.io.read_transactions` (the spec without
   its aggregates), its rows in file order, so "exact duplicate of row N" (copies share their
   entity, hence their partition) finds the same earlier row. Record numbers, the
   ``transaction_id`` of a file without id column (``"r{row}"``) and the row named in
   duplicate reasons are mapped back to the file's own record numbers.
3. **Transaction ids** (spec ``id``): a row reusing an id of an earlier row in *another*
   partition is found by one DuckDB query over all accepted ids (the reader's rule: among rows
   without another problem, later uses of an id are rejected, naming the first row).
4. **Aggregates of other keys** (e.g. the Handbook spec's terminal risk): computed by
   :func:`engine.data.aggregates.delayed_aggregates` on a second partitioning by that key (all of
   a terminal's rows in one piece, in the reader's (entity, time, row) order) and joined back.
5. **Score** each partition with :func:`engine.model.scoring.score_frame`; the scored rows are
   appended to the output Parquet file as they come (pyarrow ``ParquetWriter``), the rejected
   rows at the end. Columns are those of :func:`engine.model.scoring.write_scores`; rows are
   grouped by partition (sorted by entity and time inside one), not sorted by row number.

Not handled (refused with a message that names the cause, so the in-memory path can be used): a
CSV whose records the fast reader cannot parse (a wrong number of cells, invalid UTF-8, a line
break inside a quoted cell), and ``max_rows``.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from engine.data.aggregates import delayed_aggregates
from engine.data.io import REJECTED_COLUMNS, LoadResult, _csv_header, read_transactions
from engine.data.sniff import probe
from engine.data.spec import DatasetSpec
from engine.data.validate import _check_columns, _check_parquet_types, _clip, _text
from engine.model.checkpoint import ModelBundle
from engine.model.scoring import score_frame
from engine.model.split_checks import DateOutliers

ROW = "__fl_row"
PART = "__fl_part"
_ROW_REASON = re.compile(r"^(exact duplicate of row |transaction id already used by row )(\d+)$")
_ID_REASON = "transaction id already used by row "
#: leading/trailing characters Python's str.strip() removes (Unicode whitespace), as an RE2 pattern
_BLANKS = r"^[\s\x{0b}\x{1c}-\x{1f}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]+|" \
          r"[\s\x{0b}\x{1c}-\x{1f}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]+$"


@dataclass
class PartitionedRun:
    """What :func:`score_partitioned` returns.

    Attributes:
        load: the rejected rows of the whole file (``load.rejected``, columns
            :data:`engine.data.io.REJECTED_COLUMNS`, sorted by row_number) with ``rows_read``;
            ``load.frame`` is empty (the accepted rows were never in memory at once).
        rows_scored: rows written with status "scored".
        flagged: scored rows with probability >= ``review_threshold``.
        partitions: number of entity partitions.
        seconds: wall time of the whole run (partitioning included).
        entity_sizes: ``[entities]`` int64 number of accepted transactions per entity.
        unseen: :meth:`engine.data.features.FittedEncoder.unseen_values`-style dicts merged over
            partitions (``rows`` summed; ``distinct`` the most found in one partition, a lower bound).
        peak_partition_rows: most input records in one partition.
        passes: 1 when each partition was validated and scored at once; 2 when ids repeat across
            partitions or the spec has aggregates (validated first, scored after the whole-file step).
        date_warning: :class:`engine.model.split_checks.DateOutliers` over the partitions (the
            transactions dated far outside the file's dates), or None.
    """

    load: LoadResult
    rows_scored: int
    flagged: int
    partitions: int
    seconds: float
    entity_sizes: np.ndarray
    unseen: list[dict] = field(default_factory=list)
    peak_partition_rows: int = 0
    passes: int = 1
    date_warning: str | None = None

    @property
    def rows_read(self) -> int:
        return self.load.rows_read

    def accounting(self) -> str:
        """The same sentence as :meth:`engine.model.scoring.ScoreRun.accounting`."""
        return (f"rows read {self.rows_read:,} = rows scored {self.rows_scored:,} + "
                f"rows rejected {len(self.load.rejected):,}")


def _q(name: str) -> str:
    """A SQL identifier, double-quoted."""
    return '"' + name.replace('"', '""') + '"'


def _lit(path: Path | str) -> str:
    """A SQL string literal (a path)."""
    return "'" + str(path).replace("'", "''") + "'"


def _entity_sql(spec: DatasetSpec, schema: pa.Schema | None = None) -> str:
    """DuckDB expression ``hash(part, ...)`` of the entity key: text columns with surrounding
    blanks removed (as the reader strips them), other columns as stored (one value, one text).
    Equal keys in the reader give equal hashes: parts of accepted rows never contain the
    separator, so equal joined keys are equal tuples of parts. ``schema``: the file's (None:
    every column text, as a CSV)."""
    parts = []
    for c in spec.entity.columns:
        t = schema.field(c).type if schema is not None else pa.string()
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
            parts.append(f"coalesce(regexp_replace(CAST({_q(c)} AS VARCHAR), {_lit(_BLANKS)}, '', 'g'), '')")
        else:
            parts.append(_q(c))
    return f"hash({', '.join(parts)})"


def _csv_to_parquet(path: Path, pr, dest: Path) -> int:
    """Stream the CSV ``path`` to the Parquet file ``dest`` (every cell as text, column ``ROW``
    the 1-based record number) with the reader's fast-path options; returns the record count.

    Raises:
        ValueError: a record the fast reader cannot parse, or a line break inside a cell.
    """
    header = _csv_header(path, pr)
    ropts = pacsv.ReadOptions(use_threads=True, block_size=1 << 24)
    popts = pacsv.ParseOptions(delimiter=pr.delimiter)
    copts = pacsv.ConvertOptions(column_types={c: pa.string() for c in header}, strings_can_be_null=False,
                                 quoted_strings_can_be_null=False)
    n = 0
    why = ("the partitioned reader reads well-formed CSV only; score it without --partitions "
           "(the in-memory reader reports such records row by row), or convert it to Parquet")
    try:
        reader = pacsv.open_csv(pa.input_stream(str(path), compression=pr.compression),
                                read_options=ropts, parse_options=popts, convert_options=copts)
        schema = reader.schema.append(pa.field(ROW, pa.int64()))
        with pq.ParquetWriter(dest, schema) as w:
            for b in reader:
                if any(pc.any(pc.match_substring_regex(col, "[\\r\\n]")).as_py() for col in b.columns):
                    raise ValueError(f"{path}: a cell near record {n + 1:,} holds a line break; {why}")
                rows = pa.array(np.arange(n + 1, n + 1 + b.num_rows, dtype=np.int64))
                w.write_batch(pa.RecordBatch.from_arrays(b.columns + [rows], schema=schema))
                n += b.num_rows
    except (pa.ArrowInvalid, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: a record cannot be parsed ({str(e).splitlines()[0][:200]}); {why}") from None
    return n


def _connect(tmp: Path, memory_limit: str, threads: int | None = None):
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET memory_limit = {_lit(memory_limit)}")
    con.execute(f"SET temp_directory = {_lit(tmp / 'duckdb_spill')}")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    con.execute("SET preserve_insertion_order = true")
    return con


def partition_by_entity(con, path: Path, spec: DatasetSpec, tmp: Path, n: int) -> tuple[Path, int]:
    """Write ``path``'s records to ``tmp/parts/PART=k/`` (Parquet, one folder per partition ``k``
    of ``hash(entity key) % n``), each with its 1-based record number in column ``ROW``.

    Returns:
        (the partition folder, the file's record count).
    Raises:
        FileNotFoundError / ValueError: as :func:`engine.data.io.read_transactions` for an
            unreadable file or a missing column; a CSV the fast reader cannot parse.
    """
    pr = probe(path, spec.format)
    schema = None
    if pr.format == "csv":
        _check_columns(path, spec, _csv_header(path, pr))
        src_file = tmp / "source.parquet"
        rows = _csv_to_parquet(path, pr, src_file)
        src = f"SELECT * FROM read_parquet({_lit(src_file)})"
    else:
        pf = pq.ParquetFile(path)
        _check_columns(path, spec, pf.schema_arrow.names)
        _check_parquet_types(path, spec, pf.schema_arrow)
        rows = pf.metadata.num_rows
        schema = pf.schema_arrow
        src = (f"SELECT * EXCLUDE (file_row_number), file_row_number + 1 AS {ROW} "
               f"FROM read_parquet({_lit(path)}, file_row_number = true)")
    parts = tmp / "parts"
    con.execute(f"COPY (SELECT *, ({_entity_sql(spec, schema)} % {int(n)})::BIGINT AS {PART} FROM ({src})) "
                f"TO {_lit(parts)} (FORMAT parquet, PARTITION_BY ({PART}))")
    return parts, rows


def _files(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("*.parquet")) if folder.is_dir() else []


def _remap(res: LoadResult, rows: np.ndarray, path: Path, spec: DatasetSpec) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A partition's frame and rejected rows with the file's record numbers (``rows[k - 1]`` for
    the partition's record ``k``), also in duplicate reasons and in ``"r{row}"`` ids."""
    fr, rej = res.frame, res.rejected.copy()
    fr["row_number"] = rows[fr["row_number"].to_numpy() - 1]
    if not spec.id:
        fr["transaction_id"] = ["r" + str(r) for r in fr["row_number"].tolist()]
    rej["row_number"] = rows[rej["row_number"].to_numpy(dtype=np.int64) - 1].astype(np.int64)
    if not spec.id:  # "r{row}" of the file's record number, as the accepted rows' ids
        rej["transaction_id"] = pd.Series(["r" + str(r) for r in rej["row_number"].tolist()], index=rej.index,
                                          dtype=object)
    rej["file"] = str(path)
    rej["reason"] = pd.Series([(lambda m: f"{m.group(1)}{rows[int(m.group(2)) - 1]}" if m else r)(_ROW_REASON.match(r))
                               for r in rej["reason"].tolist()], index=rej.index, dtype=object)
    return fr, rej


def _cross_partition_ids(con, valid: Path, rejected: pd.DataFrame, path: Path, spec: DatasetSpec,
                         raw_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Transaction ids used in several partitions: (rows now rejected, with their partition;
    ``rejected`` with id reasons naming the first row of the whole file)."""
    earlier = rejected[np.asarray([str(r).startswith(_ID_REASON) for r in rejected["reason"]], dtype=bool)]
    prior = pd.DataFrame({"row_number": earlier["row_number"].to_numpy(np.int64),
                          "first_local": earlier["reason"].str.slice(len(_ID_REASON)).astype(np.int64).to_numpy()})
    con.register("prior_ids", prior)
    acc = f"read_parquet({_lit(valid / '*.parquet')})"
    con.execute(f"""CREATE OR REPLACE TEMP TABLE id_first AS
        WITH cand AS (SELECT row_number, transaction_id FROM {acc}
                      UNION ALL SELECT p.row_number, a.transaction_id FROM prior_ids p JOIN {acc} a
                      ON a.row_number = p.first_local)
        SELECT transaction_id, min(row_number) AS first FROM cand GROUP BY transaction_id HAVING count(*) > 1""")
    later = con.execute(f"""SELECT a.row_number, a.{PART} AS part, f.first, a.transaction_id, a.entity_id
        FROM {acc} a JOIN id_first f
        USING (transaction_id) WHERE a.row_number > f.first ORDER BY a.row_number""").df()
    fixed = con.execute(f"""SELECT p.row_number, f.first FROM prior_ids p JOIN {acc} a ON a.row_number = p.first_local
        JOIN id_first f ON f.transaction_id = a.transaction_id""").df()
    con.unregister("prior_ids")
    if len(fixed):
        first = dict(zip(fixed["row_number"].tolist(), fixed["first"].tolist()))
        rejected = rejected.copy()
        rn = rejected["row_number"].tolist()
        rejected["reason"] = pd.Series([f"{_ID_REASON}{first[r]}" if r in first else why
                                        for r, why in zip(rn, rejected["reason"].tolist())], index=rejected.index,
                                       dtype=object)
    new = []
    for part, g in later.groupby("part", sort=True):
        raw_rows = np.load(raw_dir / f"{part}.rows.npy")
        ids = pq.read_table(raw_dir / f"{part}.parquet", columns=[spec.id]).column(0).to_pandas()
        pos = np.searchsorted(raw_rows, g["row_number"].to_numpy())
        new.append(pd.DataFrame({
            "file": str(path), "row_number": g["row_number"].to_numpy(np.int64),
            "transaction_id": [_clip(str(v)) for v in g["transaction_id"].tolist()],
            "entity_id": [_clip(str(v)) for v in g["entity_id"].tolist()], "column": spec.id,
            "value": [_clip(str(v)) for v in _text(ids.iloc[pos])],
            "reason": [f"{_ID_REASON}{f}" for f in g["first"].tolist()], "part": part}))
    return (pd.concat(new, ignore_index=True) if new else pd.DataFrame(columns=[*REJECTED_COLUMNS, "part"])), rejected


def _aggregate_by_key(con, valid: Path, dropped: pd.DataFrame, spec: DatasetSpec, tmp: Path, n: int) -> list[Path]:
    """For each aggregate of ``spec``: its columns for every accepted row, in folders
    ``PART=k`` by entity partition (columns row_number + the aggregate's)."""
    con.register("dropped_rows", dropped[["row_number"]])
    out = []
    for i, agg in enumerate(spec.aggregates):
        bykey = tmp / f"bykey_{i}"
        cols = ", ".join(_q(c) for c in ("row_number", "entity_id", "timestamp", agg.key, PART)
                         + (("label",) if spec.label is not None else ()))
        con.execute(f"""COPY (SELECT {cols}, (hash(CAST({_q(agg.key)} AS VARCHAR)) % {n})::BIGINT AS key_part
            FROM read_parquet({_lit(valid / '*.parquet')})
            WHERE row_number NOT IN (SELECT row_number FROM dropped_rows))
            TO {_lit(bykey)} (FORMAT parquet, PARTITION_BY (key_part))""")
        done = tmp / f"agg_{i}"
        done.mkdir()
        for j in range(n):
            files = _files(bykey / f"key_part={j}")
            if not files:
                continue
            fr = pa.concat_tables([pq.read_table(f) for f in files]).to_pandas()
            if "label" in fr:
                fr["label"] = fr["label"].astype("Int8")
            fr = fr.sort_values(["entity_id", "timestamp", "row_number"], kind="stable").reset_index(drop=True)
            a = delayed_aggregates(fr, agg)
            a.insert(0, "row_number", fr["row_number"].to_numpy())
            a[PART] = fr[PART].to_numpy()
            pq.write_table(pa.Table.from_pandas(a, preserve_index=False), done / f"{j}.parquet")
        shutil.rmtree(bykey, ignore_errors=True)
        by_part = tmp / f"aggp_{i}"
        con.execute(f"COPY (SELECT * FROM read_parquet({_lit(done / '*.parquet')})) TO {_lit(by_part)} "
                    f"(FORMAT parquet, PARTITION_BY ({PART}))")
        shutil.rmtree(done, ignore_errors=True)
        out.append(by_part)
    con.unregister("dropped_rows")
    return out


def _out_schema(has_label: bool, calibrated: bool = False) -> pa.Schema:
    """The columns and pandas dtypes of :func:`engine.model.scoring.write_scores` (scored, then
    rejected columns; text as pandas ``string``, label ``Int8``; ``probability`` only for a
    calibrated model), with pandas metadata so a reader gets the same dtypes."""
    text = pd.Series([], dtype="string")
    cols = {"row_number": pd.Series([], dtype=np.int64), "transaction_id": text, "entity_id": text,
            "timestamp": pd.Series([], dtype="datetime64[ns]"), "amount": pd.Series([], dtype=np.float64)}
    if has_label:
        cols["label"] = pd.Series([], dtype="Int8")
    cols.update(logit=pd.Series([], dtype=np.float32), score=pd.Series([], dtype=np.float64))
    if calibrated:
        cols["probability"] = pd.Series([], dtype=np.float64)
    cols.update(status=text, file=text, rejected_column=text, rejected_value=text, reason=text)
    return pa.Schema.from_pandas(pd.DataFrame(cols), preserve_index=False)


def _to_table(df: pd.DataFrame, schema: pa.Schema) -> pa.Table:
    cols = {}
    for f in schema:
        if f.name in df:
            s = df[f.name]
            text = pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
            cols[f.name] = pa.array(s.astype(object).where(s.notna(), None) if text else s, type=f.type,
                                    from_pandas=True)
        else:
            cols[f.name] = pa.nulls(len(df), type=f.type)
    return pa.table(cols, schema=schema)


def _ids_in_several_partitions(con, parts: Path, spec: DatasetSpec) -> bool:
    """True if some transaction id (as text, surrounding blanks removed) occurs in two
    partitions: then ids are checked over the whole file (two passes)."""
    key = f"regexp_replace(CAST({_q(spec.id)} AS VARCHAR), {_lit(_BLANKS)}, '', 'g')"
    return bool(con.execute(f"""SELECT count(*) FROM (SELECT {key} AS k FROM read_parquet({_lit(parts / '*/*.parquet')},
        hive_partitioning = true) GROUP BY k HAVING count(DISTINCT {PART}) > 1 LIMIT 1)""").fetchone()[0])


def _validate_partition(con, parts: Path, k: int, raw_dir: Path, path: Path, spec: DatasetSpec):
    """Partition ``k``'s records in file order, read by :func:`engine.data.io.read_transactions`:
    (frame, rejected, unused columns) with the file's record numbers, or None if it is empty."""
    files = _files(parts / f"{PART}={k}")
    if not files:
        return None
    raw_file = raw_dir / f"{k}.parquet"
    glob = f"read_parquet([{', '.join(_lit(f) for f in files)}], hive_partitioning = false)"
    con.execute(f"COPY (SELECT * EXCLUDE ({ROW}) FROM {glob} ORDER BY {ROW}) TO {_lit(raw_file)} (FORMAT parquet)")
    rows = con.execute(f"SELECT {ROW} FROM {glob} ORDER BY {ROW}").fetchnumpy()[ROW].astype(np.int64)
    np.save(raw_dir / f"{k}.rows.npy", rows)
    shutil.rmtree(parts / f"{PART}={k}", ignore_errors=True)
    res = read_transactions(raw_file, spec)
    fr, rej = _remap(res, rows, path, spec)
    return fr, rej, res.unused_columns


def _second_pass_frame(valid_file: Path, dropped: pd.DataFrame, agg_dirs: list[Path], k: int) -> pd.DataFrame:
    """Partition ``k``'s accepted rows without the later uses of ids from other partitions, with
    the aggregate columns computed over the whole file."""
    fr = pq.read_table(valid_file).to_pandas().drop(columns=[PART])
    drop = dropped.loc[dropped["part"] == k, "row_number"].to_numpy()
    if len(drop):
        fr = fr[~fr["row_number"].isin(drop)].reset_index(drop=True)
    for d in agg_dirs:
        files = _files(d / f"{PART}={k}")
        if not files:
            continue
        a = pa.concat_tables([pq.read_table(f) for f in files]).to_pandas()
        a = a.set_index("row_number").reindex(fr["row_number"].to_numpy())
        for c in a.columns:
            fr[c] = a[c].to_numpy()
    return fr


class _Scorer:
    """Scores frames with :func:`engine.model.scoring.score_frame` and appends them to ``out``."""

    def __init__(self, bundle: ModelBundle, out: Path, schema: pa.Schema, review_threshold: float, batch_size: int):
        from engine.data.csv_writer import PrivateFile

        self.bundle, self.schema, self.thr, self.batch_size = bundle, schema, review_threshold, batch_size
        # the scores hold card numbers: 0600, never through a link, put at ``out`` only when complete
        self.file = PrivateFile(out)
        self.writer = pq.ParquetWriter(pa.PythonFile(self.file.file, mode="w"), schema)
        self.scored = self.flagged = 0
        self.sizes: list[np.ndarray] = []
        self.unseen: dict = {}
        self.dates = DateOutliers()

    def score(self, fr: pd.DataFrame) -> None:
        if fr.empty:
            return
        s = score_frame(self.bundle, fr, batch_size=self.batch_size)
        s["status"] = "scored"
        self.writer.write_table(_to_table(s, self.schema))
        self.scored += len(s)
        self.flagged += int((s["probability"] >= self.thr).sum())
        self.sizes.append(fr.groupby("entity_id", sort=False).size().to_numpy())
        self.dates.add(fr["timestamp"], fr["row_number"])
        _merge_unseen(self.unseen, self.bundle.encoder.unseen_values(fr))

    def close(self, rejected: pd.DataFrame) -> None:
        """Append the rejected rows (columns renamed as in write_scores) and close the file."""
        r = rejected.rename(columns={"column": "rejected_column", "value": "rejected_value"})
        r["status"] = "rejected"
        if len(r):
            self.writer.write_table(_to_table(r, self.schema))
        self.writer.close()
        self.file.commit()

    def abort(self) -> None:
        """Drop the partial output (a failed run leaves no half-written file at ``out``)."""
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - the file is removed whatever state the writer is in
            pass
        self.file.abort()


def _merge_unseen(acc: dict, found: list[dict]) -> None:
    for u in found:
        a = acc.setdefault(u["field"], dict(u, rows=0, distinct=0))
        a["rows"] += u["rows"]
        if u["distinct"] > a["distinct"]:
            a["distinct"], a["example"] = u["distinct"], u["example"]


def score_partitioned(
    bundle: ModelBundle,
    path: str | Path,
    spec: DatasetSpec,
    out: str | Path,
    *,
    partitions: int,
    review_threshold: float = 0.5,
    memory_limit: str = "1GB",
    threads: int | None = None,
    tmp_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
    batch_size: int = 64,
) -> PartitionedRun:
    """Score the file ``path`` partition by partition and write the Parquet file ``out``.

    Args:
        bundle: the model (see :func:`engine.model.checkpoint.load_checkpoint`).
        path: CSV or Parquet file (CSV: well formed, see the module docstring).
        spec: how to read it (its aggregates are computed over the whole file).
        out: output Parquet file, one row per input record (status "scored" or "rejected").
        partitions: number of entity partitions N (>= 1); memory holds about 1/N of the file.
        review_threshold: probability at or above which a row counts as flagged.
        memory_limit: DuckDB's memory limit (it spills to ``tmp_dir`` above it), e.g. ``"1GB"``.
        threads: DuckDB threads (default: DuckDB's, one per core).
        tmp_dir: where the partitions are written (default: the system's temp folder); removed after.
        log: optional callable for one line of progress per partition.
    Returns:
        :class:`PartitionedRun`.
    Raises:
        FileNotFoundError / ValueError: unreadable file, missing column, CSV the fast reader cannot
            parse, ``out`` not ``.parquet``, ``partitions`` < 1, no accepted transaction.
        engine.model.scoring.NonFiniteScoreError: a NaN or infinite score (nothing is reported).
        RuntimeError: DuckDB failed (e.g. out of memory or disk in ``tmp_dir``; the message says
            which), or the row accounting does not add up (never expected).
    """
    t0 = time.perf_counter()
    path, out = Path(path), Path(out)
    if partitions < 1:
        raise ValueError(f"--partitions must be >= 1, got {partitions}")
    if out.suffix.lower() not in (".parquet", ".pq"):
        raise ValueError(f"the partitioned scorer writes Parquet: give an --out ending in .parquet (got {out})")
    log = _with_rss(log)
    import duckdb

    tmp = Path(tempfile.mkdtemp(prefix="fraudlens-partitions-", dir=tmp_dir))
    sc, committed = None, False
    try:
        con = _connect(tmp, memory_limit, threads)
        parts, rows_read = partition_by_entity(con, path, spec, tmp, partitions)
        two_pass = bool(spec.aggregates) or bool(spec.id and _ids_in_several_partitions(con, parts, spec))
        log(f"partitioned {rows_read:,} records into {partitions} partitions by entity "
            f"({time.perf_counter() - t0:.1f} s); {'two passes' if two_pass else 'one pass'}")
        sc = _Scorer(bundle, out, _out_schema(spec.label is not None, bundle.calibrated), review_threshold, batch_size)
        raw_dir, valid = tmp / "raw", tmp / "valid"
        raw_dir.mkdir()
        valid.mkdir()
        rejected, unused = [], None
        base = spec.model_copy(update={"aggregates": []})
        for k in range(partitions):
            got = _validate_partition(con, parts, k, raw_dir, path, base)
            if got is None:
                continue
            fr, rej, unused_k = got
            unused = unused_k if unused is None else unused
            rejected.append(rej)
            if two_pass:
                fr[PART] = k
                pq.write_table(pa.Table.from_pandas(fr, preserve_index=False), valid / f"{k}.parquet")
                log(f"partition {k + 1}/{partitions}: {len(fr):,} transactions accepted ({time.perf_counter() - t0:.1f} s)")
            else:
                sc.score(fr)
                log(f"partition {k + 1}/{partitions}: {sc.scored:,} transactions scored ({time.perf_counter() - t0:.1f} s)")
            del fr
        rej = pd.concat(rejected, ignore_index=True) if rejected else pd.DataFrame(columns=REJECTED_COLUMNS)
        if two_pass:
            dropped = pd.DataFrame({"row_number": pd.Series([], dtype=np.int64), "part": pd.Series([], dtype=np.int64)})
            if spec.id and _files(valid):
                dropped, rej = _cross_partition_ids(con, valid, rej, path, spec, raw_dir)
                rej = pd.concat([rej, dropped[REJECTED_COLUMNS]], ignore_index=True)
            agg_dirs = _aggregate_by_key(con, valid, dropped, spec, tmp, partitions) if spec.aggregates else []
            log(f"validated, ids and aggregates over the whole file ({time.perf_counter() - t0:.1f} s); scoring")
            for k in range(partitions):
                if (valid / f"{k}.parquet").exists():
                    sc.score(_second_pass_frame(valid / f"{k}.parquet", dropped, agg_dirs, k))
                    log(f"partition {k + 1}/{partitions}: {sc.scored:,} transactions scored "
                        f"({time.perf_counter() - t0:.1f} s)")
        rej = rej.sort_values("row_number", kind="stable").reset_index(drop=True)
        rej = rej.astype({"row_number": np.int64, **{c: object for c in REJECTED_COLUMNS if c != "row_number"}})
        sc.close(rej)
        committed = True
        con.close()
        peak = _peak_rows(raw_dir)
    except duckdb.Error as e:  # out of memory or disk in DuckDB's spill folder, an unreadable Parquet file, ...
        raise RuntimeError(f"partitioning {path} with DuckDB failed: {str(e).splitlines()[0][:300]}") from None
    finally:
        if sc is not None and not committed:
            sc.abort()  # no half-written output left at ``out``
        shutil.rmtree(tmp, ignore_errors=True)
    if rows_read != sc.scored + len(rej):
        raise RuntimeError(f"row accounting broken: {rows_read} != {sc.scored} + {len(rej)}")
    if sc.scored == 0 and rows_read:
        top = rej["reason"].iloc[0] if len(rej) else ""
        raise ValueError(f"{path}: no transaction accepted (all {rows_read:,} rows rejected; first reason: {top})")
    load = LoadResult(frame=pd.DataFrame(), rejected=rej[REJECTED_COLUMNS], rows_read=rows_read, file=path, spec=spec,
                      unused_columns=list(unused or []))
    return PartitionedRun(load=load, rows_scored=sc.scored, flagged=sc.flagged, partitions=partitions,
                          seconds=time.perf_counter() - t0,
                          entity_sizes=np.concatenate(sc.sizes) if sc.sizes else np.zeros(0, np.int64),
                          unseen=list(sc.unseen.values()), peak_partition_rows=peak,
                          passes=2 if two_pass else 1, date_warning=sc.dates.warning(hint="fix or remove them"))


def _with_rss(log: Callable[[str], None] | None) -> Callable[[str], None]:
    """``log`` with this process's peak resident memory so far appended to each line."""
    import resource

    if log is None:
        return lambda s: None
    return lambda s: log(f"{s} [peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB]")


def _peak_rows(raw_dir: Path) -> int:
    return max((len(np.load(f, mmap_mode="r")) for f in raw_dir.glob("*.rows.npy")), default=0)
