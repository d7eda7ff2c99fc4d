"""Read raw transaction files through a dataset spec, validate them, and account for every row.

CONTRACT (other modules rely on it):

``read_transactions(path, spec) -> LoadResult``

``LoadResult.frame`` is the canonical transaction frame, one row per accepted input row,
sorted by (entity_id, timestamp, row_number), index reset, with columns:

=================  ===============  ==========================================================
column             dtype            meaning
=================  ===============  ==========================================================
row_number         int64            1-based record number in the file (CSV: line = row_number + 1)
transaction_id     string (object)  spec.id column as text, else ``"r{row_number}"``
entity_id          string (object)  entity columns joined with spec.entity.separator ("0:3")
timestamp          datetime64[ns]   naive UTC
amount             float64          signed amount in spec.amount.currency; negative = refund
<field.name>       object (str)     categorical fields, normalised text ("91750", "<empty>")
<field.name>       float64          numeric fields
<field.name>       object (str)     multi-valued fields: sorted values joined with "|", "" = none
label              Int8 (nullable)  1 fraud, 0 legit, <NA> unknown (column absent if no label)
<passthrough>      as read          spec.passthrough columns, original names, never model input; None if not in file
=================  ===============  ==========================================================

``LoadResult.rejected`` has columns file, row_number, transaction_id, entity_id, column, value,
reason (one row per rejected input row; the ids as the row would have had them, so a rejected row
can be found by them: ``"r{row_number}"`` without an id column, the joined entity key; the
entity ``""`` where the record could not be split into cells). ``rows_read == len(frame) + len(rejected)`` always holds.

Details of the parsing rules (beyond the contract):

* A Parquet column the spec reads must hold one value per cell: list, struct, map and binary
  columns are refused (``ValueError`` naming the column and its type).
* CSV cells are read as text, never type-inferred, so nothing is coerced silently (a 64-bit
  merchant id stays exact). Parquet columns keep their stored types; they are turned into text
  where a role needs text (integers and floats as their shortest exact text, ``1.0`` -> ``"1"``).
* Before parsing, :func:`engine.data.sniff.probe` checks the file: a directory, a device, a zip
  archive, UTF-16 text, binary data or a non-UTF-8 header line fail with one line naming the cause;
  gzip/bzip2/xz are read by their magic bytes; a semicolon-, tab- or pipe-delimited file is
  detected from its header line.
* CSV records: rows read is the file's record count. A quoted cell may contain a line break, but
  a quote that loses sync (the record then has the wrong number of cells, is never closed, or a
  cell swallows whole records) fails the read, naming the line where the quote opened.
* A cell of a column the spec reads that is longer than ``MAX_CELL_CHARS`` (4,096) characters or
  contains a NUL character is rejected (row and column named).
* Entity and id cells are stripped of surrounding blanks. An empty entity part is rejected; with
  several entity columns, a part containing the separator is rejected (``"0:1"`` + ``"2"`` and
  ``"0"`` + ``"1:2"`` would both be ``"0:1:2"``).
* Amount: the characters in ``spec.amount.strip`` are removed, then the text must be a finite
  number (``"$-25.00"`` -> -25.0, ``"1,234.50"`` -> 1234.5) of absolute value at most
  ``MAX_ABS_AMOUNT`` (1e12).
* Timestamp: see :class:`engine.data.spec.TimestampSpec`. Text is parsed as ISO 8601 unless a
  ``format`` is given; offsets are converted to UTC, then dropped. It must fall in the
  datetime64[ns] range (1677-09-22 .. 2262-04-11).
* Categorical fields: normalised per ``field.normalize`` (``zip5``: ``"91750.0"`` -> ``"91750"``,
  ``"1234.0"`` -> ``"01234"``, ``"12345-6789"`` -> ``"12345"``); an empty cell becomes
  ``field.missing``.
* Numeric fields: an empty cell is NaN (missing); any other non-number is rejected.
* Multi-valued fields: split on ``field.separator``, items stripped, empties dropped, duplicates
  removed, sorted, joined with ``"|"``; an empty cell is ``""``. An item containing ``"|"`` is
  rejected.
* Label: ``spec.label.positive`` -> 1, ``negative`` -> 0, empty -> <NA>; anything else is rejected.
* A row whose raw cells all equal an earlier row's is rejected as ``"exact duplicate of row N"``;
  with ``spec.id``, a row reusing an earlier row's transaction id is rejected too (the id is a key).
* A row with several problems is rejected once, for the first problem found in the order
  cell length/NUL, entity, timestamp, amount, id, fields, label, duplicates.
* CSV records with the wrong number of cells or invalid UTF-8 are rejected (``column`` is ``""``
  for a wrong cell count).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from engine.data.parquet import parquet_file, read_parquet
from engine.data.sniff import Probe, _Lines, _open_quote_column, file_sha256, probe  # noqa: F401 (file_sha256: re-exported)
from engine.data.spec import DatasetSpec, FieldKind
from engine.data.validate import (
    MAX_ABS_AMOUNT,
    MAX_CELL_CHARS,
    _categorical,
    _check_cells,
    _check_parquet_types,
    _check_columns,
    _without_absent_label,
    _clip,
    _clip_names,
    _first_of,
    _flag_duplicates,
    _is_text,
    _join_keys,
    _LazyText,
    _missing_passthrough_note as _pass_note,
    _multi,
    _numbers,
    _Problems,
    _sep_in_parts,
    _text,
    _text_codes,
    _timestamps,
    table_format,
)

__all__ = ["LoadResult", "read_transactions", "spec_for_scoring", "read_raw", "REJECTED_COLUMNS", "detect_format",
           "MAX_CELL_CHARS", "MAX_ABS_AMOUNT", "table_format"]

REJECTED_COLUMNS = ["file", "row_number", "transaction_id", "entity_id", "column", "value", "reason"]
#: csv module field limit while reading (its default, 131,072, raised an uncaught error); cells
#: above MAX_CELL_CHARS are rejected afterwards, so this only bounds one record's size
_CSV_FIELD_LIMIT = 1 << 30


# ---------------------------------------------------------------------------------------------
# result type
# ---------------------------------------------------------------------------------------------

@dataclass
class LoadResult:
    """What :func:`read_transactions` returns.

    Attributes:
        frame: the canonical frame (see the module CONTRACT).
        rejected: one row per rejected input row, columns ``file`` (str), ``row_number``
            (int64, 1-based record number), ``transaction_id`` and ``entity_id`` (str, the
            row's ids as an accepted row would carry them, clipped to 200 characters:
            ``"r{row_number}"`` without an id column; ``entity_id`` is ``""`` for a record rejected
            before its cells are read (ragged, not UTF-8) and so is ``transaction_id`` where the
            spec has an id column; an empty id cell gives ``""``),
            ``column`` (str, raw column name, ``""`` for a
            whole-row problem), ``value`` (str, the raw cell text, clipped to 200 characters),
            ``reason`` (str), sorted by row_number.
        rows_read: number of data records read from the file (``len(frame) + len(rejected)``).
        file: the file that was read.
        spec: the spec it was read with.
        unused_columns: file columns the spec does not mention (not read into the frame).
        notes: sentences for the user about how the file was read (e.g. a detected delimiter).
    """

    frame: pd.DataFrame
    rejected: pd.DataFrame
    rows_read: int
    file: Path
    spec: DatasetSpec | None = None
    unused_columns: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line of row accounting, e.g. ``"rows read 19,963 = accepted 19,963 + rejected 0"``."""
        return (
            f"rows read {self.rows_read:,} = accepted {len(self.frame):,} "
            f"+ rejected {len(self.rejected):,}"
        )

    def reason_counts(self) -> pd.Series:
        """Number of rejected rows per reason (duplicates grouped), most frequent first."""
        r = self.rejected["reason"].str.replace(r"row \d+$", "row N", regex=True)
        return r.value_counts()

    def write_rejected(self, path: str | Path) -> Path:
        """Write ``rejected`` to ``path``: Parquet if the suffix is ``.parquet``/``.pq``, CSV if it
        is ``.csv`` (either case); any other suffix is a ValueError naming it.

        The CSV goes through :func:`engine.data.csv_writer.write_csv`: a rejected value such as
        ``=HYPERLINK(...)`` is written neutralised (``'=HYPERLINK(...)``). Returns the path
        written. Parent folders are created.
        """
        p = Path(path)
        fmt = table_format(p)
        p.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "parquet":
            from engine.data.csv_writer import write_private_parquet  # raw values: 0600, as the CSV

            write_private_parquet(self.rejected.astype({c: "string" for c in REJECTED_COLUMNS if c != "row_number"}), p)
        else:
            from engine.data.csv_writer import write_csv

            write_csv(self.rejected, p)
        return p


# ---------------------------------------------------------------------------------------------
# raw reading
# ---------------------------------------------------------------------------------------------
def detect_format(path: str | Path, spec_format: str = "auto") -> str:
    """``"csv"`` or ``"parquet"``: ``spec_format`` unless ``"auto"``, then the file's magic bytes
    (``PAR1`` -> parquet, else csv; a ``.parquet`` name without them is refused).

    Raises:
        FileNotFoundError, ValueError: see :func:`engine.data.sniff.probe`.
    """
    return probe(path, spec_format).format


def _csv_header(path: Path, pr: Probe) -> list[str]:
    limit = csv.field_size_limit()
    csv.field_size_limit(max(limit, _CSV_FIELD_LIMIT))
    try:
        with pr.open_text(path) as f:
            header = next(csv.reader(f, delimiter=pr.delimiter), None)
    finally:
        csv.field_size_limit(limit)
    if header == []:
        raise ValueError(f"{path}: line 1 is blank; the header (the column names) must be the first line")
    if not header:
        raise ValueError(f"{path}: empty file (no header line)")
    long = [i for i, c in enumerate(header) if len(c) > MAX_CELL_CHARS]
    if long:
        raise ValueError(f"{path}: header column {long[0] + 1} has {len(header[long[0]]):,} characters "
                         f"(the limit is {MAX_CELL_CHARS:,})")
    dup = sorted({c for c in header if header.count(c) > 1})
    if dup:
        raise ValueError(f"{path}: duplicate column names in the header: {_clip_names(dup)}")
    return header


def _read_csv(path: Path, max_rows: int | None, pr: Probe) -> tuple[pd.DataFrame, np.ndarray, list[dict]]:
    header = _csv_header(path, pr)
    ropts = pacsv.ReadOptions(use_threads=True, block_size=1 << 24)
    popts = pacsv.ParseOptions(delimiter=pr.delimiter)
    copts = pacsv.ConvertOptions(
        column_types={c: pa.string() for c in header},
        strings_can_be_null=False,
        quoted_strings_can_be_null=False,
    )
    try:
        stream = pa.input_stream(str(path), compression=pr.compression)
        if max_rows is None:
            table = pacsv.read_csv(stream, read_options=ropts, parse_options=popts, convert_options=copts)
        else:
            reader = pacsv.open_csv(stream, read_options=ropts, parse_options=popts, convert_options=copts)
            batches, n = [], 0
            while n < max_rows:
                try:
                    b = reader.read_next_batch()
                except StopIteration:
                    break
                batches.append(b)
                n += b.num_rows
            table = pa.Table.from_batches(batches, schema=reader.schema).slice(0, max_rows)
    except (pa.ArrowInvalid, UnicodeDecodeError):
        # ragged records, invalid UTF-8, over-long cells: go record by record
        return _read_csv_slow(path, header, max_rows, pr)
    if any(pc.any(pc.match_substring_regex(col, "[\\r\\n]")).as_py() for col in table.columns):
        # a line break inside a quoted cell: legitimate, or a stray quote that swallowed records;
        # the record-by-record reader tells them apart (it tracks physical lines)
        return _read_csv_slow(path, header, max_rows, pr)
    raw = table.to_pandas()
    return raw, np.arange(1, len(raw) + 1, dtype=np.int64), []


def _lost_sync(path: Path, start: int, end: int, column: str, why: str) -> ValueError:
    return ValueError(
        f"{path}: line {start}: a quote opened in column {column!r} runs over a line break "
        f"to line {end}: {why}; parsing lost sync there (a stray or unclosed '\"'?). "
        "Fix the quoting (a quote inside a quoted cell is written '\"\"') and read the file again"
    )


def _quoted_column(rec: list[str], header: list[str]) -> str:
    i = next((i for i, v in enumerate(rec) if "\n" in v or "\r" in v), None)
    return header[i] if i is not None and i < len(header) else f"#{(i or 0) + 1}"


def _read_csv_slow(path: Path, header: list[str], max_rows: int | None, pr: Probe):
    """Record by record with :mod:`csv` (strict quoting), tracking the physical lines of each record.

    A record that spans several lines (a quoted cell with a line break) is kept only if it is
    well formed: the right number of cells, its quotes closed, and no cell with a line break that
    holds as many delimiters as a whole record; otherwise a quote lost sync and swallowed
    records, and the read fails naming the line where the quote opened.
    """
    m = len(header)
    rows: list[list[str]] = []
    numbers: list[int] = []
    rejected: list[dict] = []
    n = 0
    limit = csv.field_size_limit()
    csv.field_size_limit(max(limit, _CSV_FIELD_LIMIT))
    try:
        with pr.open_text(path) as f:
            lines = _Lines(f)
            reader = csv.reader(lines, delimiter=pr.delimiter, strict=True)
            next(reader, None)
            last = reader.line_num
            while True:
                if max_rows is not None and n >= max_rows:
                    break
                lines.first = None
                try:
                    rec = next(reader)
                except StopIteration:
                    break
                except csv.Error as e:
                    start = last + 1
                    if reader.line_num > start or "end of data" in str(e):
                        raise _lost_sync(path, start, reader.line_num, _open_quote_column(lines.first, header, pr),
                                         "the quote is never closed" if "end of data" in str(e)
                                         else f"the quote closes there with text after it ({e})") from None
                    # text after a closing quote on one line ('"Mia"mi'): read leniently, as the fast reader does
                    rec = next(csv.reader([lines.first or ""], delimiter=pr.delimiter), [])
                start, last = last + 1, reader.line_num
                if not rec:  # blank line: not a record (same as the fast reader)
                    continue
                n += 1
                if last > start:
                    if len(rec) != m:
                        raise _lost_sync(path, start, last, _quoted_column(rec, header),
                                         f"the record then has {len(rec)} cells, expected {m}")
                    swallow = next((header[i] for i, v in enumerate(rec) if ("\n" in v or "\r" in v)
                                    and v.count(pr.delimiter) >= m - 1), None)
                    if swallow is not None:
                        raise _lost_sync(path, start, last, swallow, "the cell holds whole records")
                if len(rec) != m:
                    text = pr.delimiter.join(rec).encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                    rejected.append(
                        dict(row_number=n, column="", value=_clip(text),
                             reason=f"record has {len(rec)} cells, expected {m}")
                    )
                    continue
                bad = next((i for i, v in enumerate(rec) if _has_surrogate(v)), None)
                if bad is not None:
                    v = rec[bad].encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                    rejected.append(
                        dict(row_number=n, column=header[bad], value=_clip(v), reason="not valid UTF-8 text")
                    )
                    continue
                rows.append(rec)
                numbers.append(n)
    finally:
        csv.field_size_limit(limit)
    raw = pd.DataFrame(rows, columns=header, dtype=str) if rows else pd.DataFrame(
        {c: pd.Series([], dtype=str) for c in header}
    )
    return raw, np.asarray(numbers, dtype=np.int64), rejected


def _has_surrogate(v: str) -> bool:
    return any("\udc80" <= ch <= "\udcff" for ch in v) if not v.isascii() else False


def read_raw(path: str | Path, fmt: str = "auto", *, max_rows: int | None = None,
             rejected: list[dict] | None = None) -> pd.DataFrame:
    """Read a raw file as it is, without a spec: CSV cells as text (``str``; empty cell = ``""``),
    Parquet columns with their stored types. At most ``max_rows`` records. Ill-formed CSV records
    (wrong cell count, invalid UTF-8, an over-long record) are not in the frame: with a
    ``rejected`` list, each is appended to it (``row_number``, ``column``, ``value``, ``reason``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a regular file, not UTF-8 CSV or Parquet (see :func:`engine.data.sniff.probe`),
            empty CSV, duplicate column names, a quote that lost sync (names the line), no
            well-formed record at all (records with the wrong cell count are otherwise skipped).
    """
    p = Path(path)
    pr = probe(p, fmt)
    raw, _, bad = _read_csv(p, max_rows, pr) if pr.format == "csv" else read_parquet(p, max_rows)
    if len(raw) == 0 and bad:
        raise ValueError(f"{p}: none of the {len(bad):,} records read is well formed "
                         f"(row {bad[0]['row_number']}: {bad[0]['reason']})")
    if rejected is not None:
        rejected.extend(bad)
    return raw


def _id_reuse_note(p: Path, id_col: str, n_reused: int, n: int) -> str | None:
    """A note when more than 1 % of the rows reuse a transaction id: the spec's id column is then
    likely not a transaction id (``inspect`` judges uniqueness on a sample of the file)."""
    if n_reused <= max(1, 0.01 * n):
        return None
    return (f"{p.name}: {n_reused:,} rows ({n_reused / n:.1%}) were rejected because their {id_col!r} was already "
            f"used by an earlier row: if {id_col!r} is not a unique transaction id, remove `id = {id_col!r}` "
            "from the spec (rows are then identified by their row number)")


def spec_for_scoring(path: str | Path, spec: DatasetSpec) -> tuple[DatasetSpec, str | None]:
    """``spec`` for scoring ``path`` (``score --partitions``, which reads the file in parts): without
    its label when the file has no label column, with the note saying so, as
    :func:`read_transactions` with ``label_required=False``. Raises like it (no such file, not CSV /
    Parquet, no label column while the spec has aggregates)."""
    p = Path(path)
    return _without_absent_label(p, spec, _file_columns(p, probe(p, spec.format))[1])


def _file_columns(p: Path, pr: Probe) -> "tuple[pa.Schema | None, list[str]]":
    """``(Parquet schema or None for a CSV, column names)``: the header or the schema, read once."""
    schema = None if pr.format == "csv" else parquet_file(p).schema_arrow
    return schema, (_csv_header(p, pr) if schema is None else list(schema.names))


def read_transactions(path: str | Path, spec: DatasetSpec, *, max_rows: int | None = None,
                      label_required: bool = True) -> LoadResult:
    """Read a raw CSV or Parquet file through ``spec`` into the canonical frame.

    Every record read ends up either in ``frame`` or in ``rejected`` (see the module docstring
    for the frame's columns and dtypes and for the parsing rules).

    Args:
        path: the raw file. Format from ``spec.format``, else the suffix, else the magic bytes.
        spec: the dataset spec (see :mod:`engine.data.spec`).
        max_rows: read at most this many data records (from the start of the file).
        label_required: False for scoring: a file without the label column is read without labels
            (``result.spec`` has no label, a note says so), unless the spec has aggregates.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: not a regular file or not UTF-8 CSV / Parquet (:func:`engine.data.sniff.probe`),
            the file is empty, has duplicate column names, lacks a column the spec requires (the
            message names the file, the missing column(s) and the columns found; a missing
            passthrough column is None in the frame and a note), or a quote lost sync (the line).
    """
    p = Path(path)
    if max_rows is not None and max_rows < 0:
        raise ValueError(f"max_rows must be >= 0, got {max_rows}")
    pr = probe(p, spec.format)
    schema, names = _file_columns(p, pr)
    label_note = None
    if not label_required:
        spec, label_note = _without_absent_label(p, spec, names)
    no_pass = _check_columns(p, spec, names)
    if schema is None:
        raw, row_numbers, pre_rejected = _read_csv(p, max_rows, pr)
        file_columns = list(raw.columns)
    else:
        _check_parquet_types(p, spec, schema)
        raw, row_numbers, pre_rejected = read_parquet(p, max_rows, spec.required_columns())
        file_columns = list(schema.names)  # only the spec's columns are read
    n = len(raw)
    probs = _Problems(n)

    # cells: length, NUL ------------------------------------------------------------------------
    _check_cells(raw, [c for c in spec.required_columns() if c in raw.columns], probs)

    # entity -----------------------------------------------------------------------------------
    ent_parts = []
    sep = spec.entity.separator
    for c in spec.entity.columns:
        codes, texts = _text_codes(raw[c], strip=True, canonical=True)
        probs.flag((texts == "")[codes], c, "", "entity key is empty")
        if len(spec.entity.columns) > 1:
            probs.flag(_sep_in_parts(codes, texts, sep), c, texts[codes],
                       f"entity part contains the separator {sep!r} (the joined entity key would be ambiguous)")
        ent_parts.append((codes, texts))
    ent_codes, ent_keys = _join_keys(ent_parts, spec.entity.separator)

    # timestamp ----------------------------------------------------------------------------------
    ts_ns = _timestamps(raw, spec, probs)

    # amount -------------------------------------------------------------------------------------
    a = spec.amount.column
    amount, empty, atext = _numbers(raw[a], strip=spec.amount.strip, decimal=spec.amount.decimal)
    probs.flag(empty, a, atext, "amount is empty")
    probs.flag(np.isnan(amount), a, atext, "amount is not a number")
    probs.flag(np.isinf(amount), a, atext, "amount is not finite")
    probs.flag(np.abs(np.nan_to_num(amount)) > MAX_ABS_AMOUNT, a, atext,
               f"amount is above the limit of {MAX_ABS_AMOUNT:.0e} in absolute value")

    # id -----------------------------------------------------------------------------------------
    id_key = None  # per-row array: equal ids <=> equal keys
    if spec.id:
        sid = raw[spec.id]
        if _is_text(sid):
            id_codes, id_texts = _text_codes(sid, strip=True, canonical=True)
            probs.flag((id_texts == "")[id_codes], spec.id, "", "transaction id is empty")
            id_key = id_codes
        else:
            probs.flag(sid.isna().to_numpy(), spec.id, "", "transaction id is empty")
            id_key = sid.to_numpy()

    # fields -------------------------------------------------------------------------------------
    field_cols: dict[str, tuple] = {}
    for f in spec.fields:
        s = raw[f.column]
        if f.kind is FieldKind.CATEGORICAL:
            field_cols[f.name] = _categorical(s, f)
        elif f.kind is FieldKind.NUMERIC:
            v, empty, t = _numbers(s, decimal=f.decimal)
            probs.flag(np.isnan(v) & ~empty, f.column, t, f"{f.name} is not a number")
            probs.flag(np.isinf(v), f.column, t, f"{f.name} is not finite")
            field_cols[f.name] = (v,)
        else:
            codes, mapped, bad = _multi(s, f)
            probs.flag(bad, f.column, s, f"{f.name} has an item containing '|'")
            field_cols[f.name] = (codes, mapped)

    # label --------------------------------------------------------------------------------------
    label_kind = None
    if spec.label is not None:
        lab = spec.label
        posset, negset = set(lab.positive), set(lab.negative)
        lcodes, ltexts = _text_codes(raw[lab.column], strip=True)
        ukind = np.asarray(
            [1 if v in posset else 0 if v in negset else -1 if v == "" else -2 for v in ltexts], dtype=np.int8
        )
        label_kind = ukind[lcodes]
        other = label_kind == -2
        if other.any():
            allowed = "/".join(lab.positive + lab.negative)
            ureason = np.asarray([f"label value {v!r} is not one of {allowed}" for v in ltexts], dtype=object)
            probs.flag(other, lab.column, ltexts[lcodes], ureason[lcodes])

    # duplicates ---------------------------------------------------------------------------------
    n_reused = 0
    if n:
        _flag_duplicates(raw, row_numbers, probs, candidates=id_key)
        if id_key is not None:
            ok = ~probs.bad
            d = pd.Series(id_key[ok]).duplicated(keep=False).to_numpy()
            if d.any():
                rows = np.flatnonzero(ok)[d]
                first_rn = row_numbers[rows[_first_of(id_key[rows])]]
                later = row_numbers[rows] != first_rn
                mask = np.zeros(n, bool)
                mask[rows[later]] = True
                reasons = np.empty(n, dtype=object)
                reasons[rows[later]] = [f"transaction id already used by row {r}" for r in first_rn[later]]
                probs.flag(mask, spec.id, _LazyText(raw[spec.id]), reasons)
                n_reused = int(later.sum())
    reuse_note = _id_reuse_note(p, spec.id, n_reused, n) if id_key is not None and n else None

    # assemble ------------------------------------------------------------------------------------
    keep = np.flatnonzero(~probs.bad)
    # entity keys ranked in text order; np.lexsort is stable and keep is in file order, so
    # ties in (entity, timestamp) stay in row_number order
    rank = np.empty(len(ent_keys), dtype=np.int64)
    rank[np.argsort(ent_keys, kind="stable")] = np.arange(len(ent_keys))
    order = keep[np.lexsort((ts_ns[keep], rank[ent_codes[keep]]))]
    rn = row_numbers[order]
    if spec.id:
        tid = _text(raw[spec.id].iloc[order], strip=True)
    else:
        tid = np.asarray([f"r{i}" for i in rn.tolist()], dtype=object)
    cols: dict[str, object] = {
        "row_number": pd.Series(rn, dtype=np.int64),
        "transaction_id": pd.Series(tid, dtype=object),
        "entity_id": pd.Series(ent_keys[ent_codes[order]], dtype=object),
        "timestamp": pd.Series(ts_ns[order].view("datetime64[ns]")),
        "amount": pd.Series(amount[order], dtype=np.float64),
    }
    for f in spec.fields:
        fc = field_cols[f.name]
        if f.kind is FieldKind.NUMERIC:
            cols[f.name] = pd.Series(fc[0][order], dtype=np.float64)
        else:
            cols[f.name] = pd.Series(fc[1][fc[0][order]], dtype=object)
    if label_kind is not None:
        lk = label_kind[order]
        cols["label"] = pd.Series(pd.arrays.IntegerArray(np.where(lk == 1, 1, 0).astype(np.int8), lk == -1))
    for c in spec.passthrough:  # a passthrough column the file lacks: None (a note says so)
        cols[c] = raw[c].iloc[order].reset_index(drop=True) if c in raw else pd.Series([None] * len(order), dtype=object)
    frame = pd.DataFrame(cols, copy=False)
    if spec.aggregates:  # delayed-label history features of other keys (engine.data.aggregates)
        from engine.data.aggregates import add_aggregates

        frame = add_aggregates(frame, spec)

    bad = np.flatnonzero(probs.bad)
    if spec.id:
        bad_tid = [_clip(str(v)) for v in _text(raw[spec.id].iloc[bad], strip=True)]
    else:
        bad_tid = [f"r{i}" for i in row_numbers[bad].tolist()]
    rej = pd.DataFrame(
        {
            "file": pd.Series([str(p)] * len(bad), dtype=object),
            "row_number": pd.Series(row_numbers[bad], dtype=np.int64),
            "transaction_id": pd.Series(bad_tid, dtype=object),
            "entity_id": pd.Series([_clip(str(v)) for v in ent_keys[ent_codes[bad]]], dtype=object),
            "column": pd.Series(probs.column[bad], dtype=object),
            "value": pd.Series([_clip(str(v)) for v in probs.value[bad]], dtype=object),
            "reason": pd.Series(probs.reason[bad], dtype=object),
        }
    )
    if pre_rejected:
        pre = pd.DataFrame(pre_rejected)
        pre.insert(0, "file", str(p))
        pre["transaction_id"] = "" if spec.id else [f"r{i}" for i in pre["row_number"].tolist()]
        pre["entity_id"] = ""
        rej = pd.concat([rej, pre.astype({c: object for c in REJECTED_COLUMNS if c != "row_number"})],
                        ignore_index=True)
    rej = rej[REJECTED_COLUMNS].sort_values("row_number", kind="stable").reset_index(drop=True)
    rej = rej.astype({"row_number": np.int64, **{c: object for c in REJECTED_COLUMNS if c != "row_number"}})

    rows_read = n + len(pre_rejected)
    assert rows_read == len(frame) + len(rej)
    mentioned = set(spec.roles())
    unused = [c for c in file_columns if c not in mentioned]
    notes = ([pr.note] if pr.format == "csv" and pr.note else []) + ([_pass_note(p, no_pass)] if no_pass else [])
    notes += [n for n in (reuse_note, label_note) if n]
    return LoadResult(frame=frame, rejected=rej, rows_read=rows_read, file=p, spec=spec, unused_columns=unused,
                      notes=notes)
