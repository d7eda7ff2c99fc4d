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
<passthrough>      as read          spec.passthrough columns, original names, never model input
=================  ===============  ==========================================================

``LoadResult.rejected`` has columns file, row_number, column, value, reason (one row per
rejected input row). ``rows_read == len(frame) + len(rejected)`` always holds.

Details of the parsing rules (beyond the contract):

* CSV cells are read as text, never type-inferred, so nothing is coerced silently (a 64-bit
  merchant id stays exact). Parquet columns keep their stored types; they are turned into text
  where a role needs text (integers and floats as their shortest exact text, ``1.0`` -> ``"1"``).
* Entity and id cells are stripped of surrounding blanks. An empty entity part is rejected.
* Amount: the characters in ``spec.amount.strip`` are removed, then the text must be a finite
  number (``"$-25.00"`` -> -25.0, ``"1,234.50"`` -> 1234.5).
* Timestamp: see :class:`engine.spec.TimestampSpec`. Text is parsed as ISO 8601 unless a
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
  entity, timestamp, amount, id, fields, label, duplicates.
* CSV records with the wrong number of cells or invalid UTF-8 are rejected (``column`` is ``""``
  for a wrong cell count).
"""

from __future__ import annotations

import bz2
import csv
import difflib
import gzip
import lzma
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from .spec import DatasetSpec, FieldKind, FieldSpec

__all__ = ["LoadResult", "read_transactions", "read_raw", "REJECTED_COLUMNS", "detect_format"]

REJECTED_COLUMNS = ["file", "row_number", "column", "value", "reason"]
_MAX_VALUE_CHARS = 200
_NS_MIN = pd.Timestamp.min.as_unit("ns")
_NS_MAX = pd.Timestamp.max.as_unit("ns")


# ---------------------------------------------------------------------------------------------
# result type
# ---------------------------------------------------------------------------------------------
@dataclass
class LoadResult:
    """What :func:`read_transactions` returns.

    Attributes:
        frame: the canonical frame (see the module CONTRACT).
        rejected: one row per rejected input row, columns ``file`` (str), ``row_number``
            (int64, 1-based record number), ``column`` (str, raw column name, ``""`` for a
            whole-row problem), ``value`` (str, the raw cell text, clipped to 200 characters),
            ``reason`` (str), sorted by row_number.
        rows_read: number of data records read from the file (``len(frame) + len(rejected)``).
        file: the file that was read.
        spec: the spec it was read with.
        unused_columns: file columns the spec does not mention (not read into the frame).
    """

    frame: pd.DataFrame
    rejected: pd.DataFrame
    rows_read: int
    file: Path
    spec: DatasetSpec | None = None
    unused_columns: list[str] = field(default_factory=list)

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
        """Write ``rejected`` to ``path``: Parquet if the suffix is ``.parquet``/``.pq``, else CSV.

        Returns the path written. Parent folders are created.
        """
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.suffix.lower() in (".parquet", ".pq"):
            self.rejected.astype({c: "string" for c in REJECTED_COLUMNS if c != "row_number"}).to_parquet(
                p, index=False
            )
        else:
            self.rejected.to_csv(p, index=False)
        return p


# ---------------------------------------------------------------------------------------------
# raw reading
# ---------------------------------------------------------------------------------------------
def detect_format(path: str | Path, spec_format: str = "auto") -> str:
    """``"csv"`` or ``"parquet"``: ``spec_format`` unless ``"auto"``, then the suffix
    (``.parquet``/``.pq`` -> parquet, ``.csv``/``.txt`` and compressed ``.csv.gz`` -> csv), then the
    file's magic bytes (``PAR1`` -> parquet, else csv)."""
    if spec_format != "auto":
        return spec_format
    p = Path(path)
    suffixes = [s.lower() for s in p.suffixes]
    if suffixes and suffixes[-1] in (".parquet", ".pq"):
        return "parquet"
    if any(s in (".csv", ".txt") for s in suffixes):
        return "csv"
    with open(p, "rb") as f:
        return "parquet" if f.read(4) == b"PAR1" else "csv"


def _open_text(path: Path):
    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(path.suffix.lower(), open)
    return opener(path, "rt", encoding="utf-8-sig", errors="surrogateescape", newline="")


def _clip(v: str) -> str:
    return v if len(v) <= _MAX_VALUE_CHARS else v[: _MAX_VALUE_CHARS - 1] + "…"


def _csv_header(path: Path) -> list[str]:
    with _open_text(path) as f:
        header = next(csv.reader(f), None)
    if not header:
        raise ValueError(f"{path}: empty file (no header line)")
    dup = sorted({c for c in header if header.count(c) > 1})
    if dup:
        raise ValueError(f"{path}: duplicate column names in the header: {dup}")
    return header


def _read_csv(path: Path, max_rows: int | None) -> tuple[pd.DataFrame, np.ndarray, list[dict]]:
    header = _csv_header(path)
    ropts = pacsv.ReadOptions(use_threads=True, block_size=1 << 24)
    copts = pacsv.ConvertOptions(
        column_types={c: pa.string() for c in header},
        strings_can_be_null=False,
        quoted_strings_can_be_null=False,
    )
    try:
        if max_rows is None:
            table = pacsv.read_csv(path, read_options=ropts, convert_options=copts)
        else:
            reader = pacsv.open_csv(path, read_options=ropts, convert_options=copts)
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
        # ragged records, invalid UTF-8, newlines inside quoted cells: go record by record
        return _read_csv_slow(path, header, max_rows)
    raw = table.to_pandas()
    return raw, np.arange(1, len(raw) + 1, dtype=np.int64), []


def _read_csv_slow(path: Path, header: list[str], max_rows: int | None):
    m = len(header)
    rows: list[list[str]] = []
    numbers: list[int] = []
    rejected: list[dict] = []
    n = 0
    with _open_text(path) as f:
        reader = csv.reader(f)
        next(reader, None)
        for rec in reader:
            if not rec:  # blank line: not a record (same as the fast reader)
                continue
            if max_rows is not None and n >= max_rows:
                break
            n += 1
            if len(rec) != m:
                text = ",".join(rec).encode("utf-8", "surrogateescape").decode("utf-8", "replace")
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
    raw = pd.DataFrame(rows, columns=header, dtype=str) if rows else pd.DataFrame(
        {c: pd.Series([], dtype=str) for c in header}
    )
    return raw, np.asarray(numbers, dtype=np.int64), rejected


def _has_surrogate(v: str) -> bool:
    return any("\udc80" <= ch <= "\udcff" for ch in v) if not v.isascii() else False


def _read_parquet(path: Path, max_rows: int | None) -> tuple[pd.DataFrame, np.ndarray, list[dict]]:
    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    dup = sorted({c for c in names if names.count(c) > 1})
    if dup:
        raise ValueError(f"{path}: duplicate column names: {dup}")
    if max_rows is None:
        table = pf.read()
    else:
        batches, n = [], 0
        for b in pf.iter_batches(batch_size=max(1, min(max_rows, 1 << 16))):
            batches.append(b)
            n += b.num_rows
            if n >= max_rows:
                break
        table = pa.Table.from_batches(batches, schema=pf.schema_arrow).slice(0, max_rows)
    cols = {}
    for name, col in zip(table.column_names, table.columns):
        if pa.types.is_integer(col.type) and col.null_count:
            # keep integers exact (default to_pandas would turn them into float64)
            nullable = {pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(), pa.int32(): pd.Int32Dtype(),
                        pa.int64(): pd.Int64Dtype(), pa.uint8(): pd.UInt8Dtype(), pa.uint16(): pd.UInt16Dtype(),
                        pa.uint32(): pd.UInt32Dtype(), pa.uint64(): pd.UInt64Dtype()}
            cols[name] = col.to_pandas(types_mapper=nullable.get)
        else:
            cols[name] = col.to_pandas()
    raw = pd.DataFrame(cols, copy=False) if cols else pd.DataFrame(index=range(table.num_rows))
    return raw, np.arange(1, len(raw) + 1, dtype=np.int64), []


def read_raw(path: str | Path, fmt: str = "auto", *, max_rows: int | None = None) -> pd.DataFrame:
    """Read a raw file as it is, without a spec: CSV cells as text (``str``; empty cell = ``""``),
    Parquet columns with their stored types. At most ``max_rows`` records.

    Raises:
        FileNotFoundError: no such file.
        ValueError: empty CSV, duplicate column names.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file")
    f = detect_format(p, fmt)
    raw, _, _ = _read_csv(p, max_rows) if f == "csv" else _read_parquet(p, max_rows)
    return raw


# ---------------------------------------------------------------------------------------------
# per-role parsing helpers
# ---------------------------------------------------------------------------------------------
class _Problems:
    """First problem per row: column, raw value, reason."""

    def __init__(self, n: int):
        self.bad = np.zeros(n, dtype=bool)
        self.column = np.empty(n, dtype=object)
        self.value = np.empty(n, dtype=object)
        self.reason = np.empty(n, dtype=object)

    def flag(self, mask, column: str, values, reason) -> None:
        """Mark rows in ``mask`` not yet marked. ``values``: scalar, per-row array or the raw
        Series (turned into text for the flagged rows only); ``reason``: scalar or per-row array."""
        idx = np.flatnonzero(np.asarray(mask, dtype=bool) & ~self.bad)
        if not len(idx):
            return
        self.bad[idx] = True
        self.column[idx] = column
        if isinstance(values, (pd.Series, _LazyText)):
            self.value[idx] = _text((values.s if isinstance(values, _LazyText) else values).iloc[idx])
        else:
            self.value[idx] = values[idx] if isinstance(values, np.ndarray) else values
        self.reason[idx] = reason[idx] if isinstance(reason, np.ndarray) else reason


def _text_codes(s: pd.Series, strip: bool = False, canonical: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Any column -> (codes, texts) with ``texts[codes]`` the cell text per row.

    Missing cells are ``""``. Numbers as shortest exact text (``1.0`` -> ``"1"``, int64 exact),
    booleans ``"true"``/``"false"``, datetimes ISO. ``strip`` removes surrounding blanks of text
    cells. Each distinct value is converted once (fast for repetitive columns). With
    ``canonical``, equal texts have equal codes and codes are >= 0.
    """
    if pd.api.types.is_string_dtype(s) and not pd.api.types.is_object_dtype(s):
        # pandas str / string dtype: dictionary-encode in Arrow (much faster than factorize)
        arr = pa.array(s, type=pa.large_string(), from_pandas=True)
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        enc = arr.dictionary_encode()
        codes = np.asarray(enc.indices.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
        dictionary = pc.utf8_trim_whitespace(enc.dictionary) if strip else enc.dictionary
        # Arrow's dictionary is duplicate-free; only trimming or a null next to "" can merge texts
        distinct = not (strip and not dictionary.equals(enc.dictionary)) and not (
            enc.indices.null_count and pc.any(pc.equal(dictionary, "")).as_py()
        )
        utext = dictionary.to_numpy(zero_copy_only=False)
    elif pd.api.types.is_object_dtype(s):
        distinct = False
        codes, uniq = pd.factorize(s, use_na_sentinel=True)
        u = np.asarray(uniq, dtype=object)
        utext = ["" if m else (x if isinstance(x, str) else str(x)) for x, m in zip(u.tolist(), pd.isna(u).tolist())]
        if strip:
            utext = [x.strip() for x in utext]
    elif pd.api.types.is_datetime64_any_dtype(s):
        distinct = False
        codes, uniq = pd.factorize(s, use_na_sentinel=True)
        utext = [str(u) for u in uniq]
    else:
        distinct = False
        codes, uniq = pd.factorize(s, use_na_sentinel=True)
        try:
            arr = pa.array(np.asarray(uniq), from_pandas=True)
            if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
                arr = arr.cast(pa.string())
            utext = arr.fill_null("").to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            utext = ["" if _isna(u) else str(u) for u in uniq]
    codes = np.asarray(codes, dtype=np.int64)
    texts = np.empty(len(utext) + 1, dtype=object)
    texts[:-1] = utext
    texts[-1] = ""  # code -1 (missing) picks this one
    if canonical and not (distinct and not (codes == -1).any()):
        # one code per distinct text ("a" and "a " merge after strip; "" and missing)
        tc, tu = pd.factorize(texts)
        return tc[codes], np.asarray(tu, dtype=object)
    return codes, texts


def _text(s: pd.Series, strip: bool = False) -> np.ndarray:
    """Any column -> object array of str (see :func:`_text_codes`)."""
    codes, texts = _text_codes(s, strip)
    return texts[codes]


def _map_text(s: pd.Series, fn, strip: bool = False, dtype=object) -> np.ndarray:
    """``fn(cell text)`` per row, computed once per distinct value."""
    codes, mapped = _map_text_codes(s, fn, strip, dtype)
    return mapped[codes]


def _map_text_codes(s: pd.Series, fn, strip: bool = False, dtype=object) -> tuple[np.ndarray, np.ndarray]:
    """(codes, mapped) with ``mapped[codes]`` = ``fn(cell text)`` per row."""
    codes, texts = _text_codes(s, strip)
    mapped = np.empty(len(texts), dtype=dtype)
    mapped[:] = [fn(t) for t in texts]
    return codes, mapped


def _isna(v) -> bool:
    try:
        return v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and math.isnan(v))
    except TypeError:
        return False


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _numbers(s: pd.Series, strip: str = "") -> tuple[np.ndarray, np.ndarray, np.ndarray | pd.Series]:
    """Parse a number column -> (float64 values, empty mask, raw cells for error reports).

    Text cells: the characters in ``strip`` and blanks are removed, ``"(25.00)"`` means -25.00,
    then the cell must be a decimal literal (``"nan"``, ``"inf"``, ``"0x1A"`` are not numbers).
    Non-numbers are NaN with ``empty`` False.
    """
    if pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s):
        v = s.to_numpy(dtype=np.float64, na_value=np.nan)
        return v, np.isnan(v), s
    codes, texts = _text_codes(s)
    table = str.maketrans("", "", strip + " \t")
    cleaned = [t.translate(table) for t in texts]

    def conv(t: str) -> float:
        if t[:1] == "(" and t[-1:] == ")":  # accounting negative "(25.00)"
            t = "-" + t[1:-1]
        return float(t) if _NUMBER.fullmatch(t) else math.nan

    uv = np.asarray([conv(t) for t in cleaned], dtype=np.float64)
    ue = np.asarray([t == "" for t in cleaned], dtype=bool)
    return uv[codes], ue[codes], texts[codes]


def _zip5(t: str) -> str:
    m = re.fullmatch(r"(\d{1,5})(?:\.0*)?", t)
    if m:
        return m.group(1).zfill(5)
    m = re.fullmatch(r"(\d{5})-?\d{4}", t)
    if m:
        return m.group(1)
    return t


def _categorical(s: pd.Series, f: FieldSpec) -> tuple[np.ndarray, np.ndarray]:
    def norm(t: str) -> str:
        if f.normalize != "none":
            t = t.strip()
        if f.normalize == "zip5":
            t = _zip5(t)
        return t if t != "" else f.missing

    return _map_text_codes(s, norm)


def _multi(s: pd.Series, f: FieldSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (codes, joined values, bad mask per row: an item contains '|')."""

    def split(t: str) -> str | None:
        items = sorted({x.strip() for x in t.split(f.separator)} - {""})
        return "|".join(items) if all("|" not in x for x in items) else None

    codes, mapped = _map_text_codes(s, split)
    ubad = np.asarray([v is None for v in mapped], dtype=bool)
    mapped[ubad] = ""
    return codes, mapped, ubad[codes]


_UNIT_NS = {"s": 1_000_000_000, "h": 3_600_000_000_000, "D": 86_400_000_000_000}


def _timestamps(raw: pd.DataFrame, spec: DatasetSpec, probs: _Problems) -> np.ndarray:
    """-> int64 ns since epoch per row (garbage where flagged)."""
    ts = spec.timestamp
    n = len(raw)
    out = np.zeros(n, dtype=np.int64)
    if ts.column is not None:
        s = raw[ts.column]
        if pd.api.types.is_datetime64_any_dtype(s):
            if getattr(s.dtype, "tz", None) is not None:
                s = s.dt.tz_convert("UTC").dt.tz_localize(None)
            nat = s.isna().to_numpy()
            probs.flag(nat, ts.column, "", "timestamp is empty")
            vals = s.astype("datetime64[ns]").to_numpy()
            out = np.where(nat, np.datetime64(0, "ns"), vals).astype("datetime64[ns]").view(np.int64)
            return out
        if ts.unit is not None:
            v, empty, rawv = _numbers(s)
            probs.flag(empty, ts.column, rawv, "timestamp is empty")
            probs.flag(~np.isfinite(v), ts.column, rawv, "timestamp offset is not a number")
            origin = pd.Timestamp(ts.origin)
            if origin.tzinfo is not None:
                origin = origin.tz_convert("UTC").tz_localize(None)
            fns = np.where(np.isfinite(v), v, 0.0) * _UNIT_NS[ts.unit] + origin.as_unit("ns").value
            oor = (fns < _NS_MIN.value) | (fns > _NS_MAX.value)
            probs.flag(oor, ts.column, rawv, "timestamp out of range (1677..2262)")
            # exact for integral offsets; rounding to whole ns otherwise
            vi = np.where(np.isfinite(v) & ~oor, v, 0.0)
            whole = np.floor(vi)
            out = (whole.astype(np.int64) * _UNIT_NS[ts.unit]
                   + np.round((vi - whole) * _UNIT_NS[ts.unit]).astype(np.int64)
                   + origin.as_unit("ns").value)
            return out
        codes, uniq = _text_codes(s, strip=True)
        text = uniq[codes]
        probs.flag(text == "", ts.column, text, "timestamp is empty")
        if len(codes):
            parsed = pd.to_datetime(pd.Index(uniq, dtype=object), format=ts.format or "ISO8601",
                                    errors="coerce", utc=True).tz_localize(None)
            ok = ~parsed.isna()
            inrange = ok & (parsed >= _NS_MIN) & (parsed <= _NS_MAX)
            u_ns = np.zeros(len(uniq), dtype=np.int64)
            u_ns[inrange] = parsed[inrange].as_unit("ns").asi8
            reason_bad = "timestamp not parseable" + (f" with format {ts.format!r}" if ts.format else "")
            probs.flag(~np.asarray(ok)[codes], ts.column, text, reason_bad)
            probs.flag(~np.asarray(inrange)[codes], ts.column, text, "timestamp out of range (1677..2262)")
            out = u_ns[codes]
        return out

    # parts
    parts = ts.parts or {}
    ints: dict[str, np.ndarray] = {}
    for key in ("year", "month", "day", "hour", "minute"):
        if key not in parts:
            continue
        col = parts[key]
        v, empty, t = _numbers(raw[col])
        lim = {"year": (1678, 2261), "month": (1, 12), "day": (1, 31), "hour": (0, 23), "minute": (0, 59)}[key]
        probs.flag(empty, col, t, f"timestamp part {key} is empty")
        whole = np.isfinite(v) & (v == np.floor(np.where(np.isfinite(v), v, 0)))
        probs.flag(~whole, col, t, f"timestamp part {key} is not a whole number")
        oor = whole & ((v < lim[0]) | (v > lim[1]))
        probs.flag(oor, col, t, f"timestamp part {key} out of range {lim[0]}..{lim[1]}")
        # flagged rows get a harmless placeholder so the date arithmetic below cannot fail
        ints[key] = np.where(whole & ~oor, v, lim[0] if key != "year" else 2000).astype(np.int64)
    secs = np.zeros(n, dtype=np.int64)
    if "time" in parts:
        col = parts["time"]
        def tsec(x: str) -> float:
            if not x.strip():
                return -2.0  # empty
            m = re.fullmatch(r"\s*(\d{1,2}):(\d{2})(?::(\d{2}))?\s*", x)
            if not m:
                return -1.0
            h, mi, se = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
            return float(h * 3600 + mi * 60 + se) if h < 24 and mi < 60 and se < 60 else -1.0

        tv = _map_text(raw[col], tsec, dtype=np.float64)
        probs.flag(tv == -2.0, col, "", "timestamp part time is empty")
        probs.flag(tv < 0, col, raw[col], "timestamp part time is not HH:MM or HH:MM:SS")
        secs += np.where(tv < 0, 0, tv).astype(np.int64)
    secs += ints.get("hour", 0) * 3600 + ints.get("minute", 0) * 60
    # valid calendar dates, computed once per distinct (year, month, day)
    key = ints["year"] * 10000 + ints["month"] * 100 + ints["day"]
    codes, uniq = pd.factorize(key)
    if len(uniq):
        u = np.asarray(uniq)
        d = pd.to_datetime(
            pd.DataFrame({"year": u // 10000, "month": u // 100 % 100, "day": u % 100}), errors="coerce"
        )
        ok = ~d.isna().to_numpy()
        u_ns = np.zeros(len(u), dtype=np.int64)
        u_ns[ok] = d[ok].astype("datetime64[ns]").to_numpy().view(np.int64)
        ymd_cols = "/".join(parts[k] for k in ("year", "month", "day"))
        invalid = ~ok[codes]
        if invalid.any():
            ymd_text = np.full(n, "", dtype=object)
            bad_idx = np.flatnonzero(invalid)
            cells = [_text(raw[parts[k]].iloc[bad_idx]) for k in ("year", "month", "day")]
            ymd_text[bad_idx] = ["/".join(x) for x in zip(*cells)]
            probs.flag(invalid, ymd_cols, ymd_text, "timestamp parts do not form a valid date")
        out = u_ns[codes] + secs * 1_000_000_000
    return out


# ---------------------------------------------------------------------------------------------
# the reader
# ---------------------------------------------------------------------------------------------
def _check_columns(path: Path, spec: DatasetSpec, found: list[str]) -> None:
    roles = spec.roles()
    missing = [c for c in spec.required_columns() if c not in found]
    if not missing:
        return
    parts = []
    for c in missing:
        hint = difflib.get_close_matches(c, found, n=1, cutoff=0.6)
        lower = [x for x in found if x.lower() == c.lower()]
        hint = lower or hint
        parts.append(f"{c!r} ({roles[c].value})" + (f", did you mean {hint[0]!r}?" if hint else ""))
    raise ValueError(
        f"{path}: column{'s' if len(missing) > 1 else ''} required by spec {spec.name!r} not found: "
        + "; ".join(parts)
        + f". Columns found: {found}"
    )


def read_transactions(path: str | Path, spec: DatasetSpec, *, max_rows: int | None = None) -> LoadResult:
    """Read a raw CSV or Parquet file through ``spec`` into the canonical frame.

    Every record read ends up either in ``frame`` or in ``rejected`` (see the module docstring
    for the frame's columns and dtypes and for the parsing rules).

    Args:
        path: the raw file. Format from ``spec.format``, else the suffix, else the magic bytes.
        spec: the dataset spec (see :mod:`engine.spec`).
        max_rows: read at most this many data records (from the start of the file).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is empty, has duplicate column names, or lacks a column the spec
            requires (the message names the file, the missing column(s) and the columns found).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file")
    if max_rows is not None and max_rows < 0:
        raise ValueError(f"max_rows must be >= 0, got {max_rows}")
    fmt = detect_format(p, spec.format)
    if fmt == "csv":
        _check_columns(p, spec, _csv_header(p))
        raw, row_numbers, pre_rejected = _read_csv(p, max_rows)
    else:
        _check_columns(p, spec, pq.ParquetFile(p).schema_arrow.names)
        raw, row_numbers, pre_rejected = _read_parquet(p, max_rows)
    n = len(raw)
    probs = _Problems(n)

    # entity -----------------------------------------------------------------------------------
    ent_parts = []
    for c in spec.entity.columns:
        codes, texts = _text_codes(raw[c], strip=True, canonical=True)
        probs.flag((texts == "")[codes], c, "", "entity key is empty")
        ent_parts.append((codes, texts))
    ent_codes, ent_keys = _join_keys(ent_parts, spec.entity.separator)

    # timestamp ----------------------------------------------------------------------------------
    ts_ns = _timestamps(raw, spec, probs)

    # amount -------------------------------------------------------------------------------------
    a = spec.amount.column
    amount, empty, atext = _numbers(raw[a], strip=spec.amount.strip)
    probs.flag(empty, a, atext, "amount is empty")
    probs.flag(np.isnan(amount), a, atext, "amount is not a number")
    probs.flag(np.isinf(amount), a, atext, "amount is not finite")

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
            v, empty, t = _numbers(s)
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
    for c in spec.passthrough:
        cols[c] = raw[c].iloc[order].reset_index(drop=True)
    frame = pd.DataFrame(cols, copy=False)
    if spec.aggregates:  # delayed-label history features of other keys (engine.aggregates)
        from .aggregates import add_aggregates

        frame = add_aggregates(frame, spec)

    bad = np.flatnonzero(probs.bad)
    rej = pd.DataFrame(
        {
            "file": pd.Series([str(p)] * len(bad), dtype=object),
            "row_number": pd.Series(row_numbers[bad], dtype=np.int64),
            "column": pd.Series(probs.column[bad], dtype=object),
            "value": pd.Series([_clip(str(v)) for v in probs.value[bad]], dtype=object),
            "reason": pd.Series(probs.reason[bad], dtype=object),
        }
    )
    if pre_rejected:
        pre = pd.DataFrame(pre_rejected)
        pre.insert(0, "file", str(p))
        rej = pd.concat([rej, pre.astype({c: object for c in REJECTED_COLUMNS if c != "row_number"})],
                        ignore_index=True)
    rej = rej.sort_values("row_number", kind="stable").reset_index(drop=True)
    rej = rej.astype({"row_number": np.int64, **{c: object for c in REJECTED_COLUMNS if c != "row_number"}})

    rows_read = n + len(pre_rejected)
    assert rows_read == len(frame) + len(rej)
    mentioned = set(spec.roles())
    unused = [c for c in raw.columns if c not in mentioned]
    return LoadResult(frame=frame, rejected=rej, rows_read=rows_read, file=p, spec=spec, unused_columns=unused)


def _is_text(s: pd.Series) -> bool:
    return pd.api.types.is_string_dtype(s) or pd.api.types.is_object_dtype(s)


class _LazyText:
    """A raw column whose text is only computed for the rows that get flagged."""

    def __init__(self, s: pd.Series):
        self.s = s


def _join_keys(parts: list[tuple[np.ndarray, np.ndarray]], sep: str) -> tuple[np.ndarray, np.ndarray]:
    """Entity parts (canonical codes, texts) -> (codes, keys): ``keys[codes]`` is the joined key
    per row; each distinct key string is built once and equal keys have equal codes."""
    if len(parts) == 1:
        return parts[0]
    n = len(parts[0][0])
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.empty(0, dtype=object)
    combined = np.zeros(n, dtype=np.int64)
    for codes, texts in parts:
        combined = pd.factorize(combined * (len(texts) + 1) + codes)[0].astype(np.int64)
    _, first = np.unique(combined, return_index=True)
    keys = np.asarray([sep.join(t[c[i]] for c, t in parts) for i in first], dtype=object)
    # different part tuples can still join to the same text ("a:b" + "c" vs "a" + "b:c")
    kc, ku = pd.factorize(keys)
    return kc[combined], np.asarray(ku, dtype=object)


def _first_of(keys) -> np.ndarray:
    """Position of the first element with the same key, per element."""
    codes = pd.factorize(keys)[0]
    _, first = np.unique(codes, return_index=True)
    return first[codes]


def _flag_duplicates(raw: pd.DataFrame, row_numbers: np.ndarray, probs: _Problems, candidates=None) -> None:
    """Reject later copies of rows whose raw cells all equal an earlier row's.

    ``candidates``: optional per-row key that equal rows must share (the transaction id), so
    only rows with a repeated key are compared in full.
    """
    if raw.shape[1] == 0:
        return
    if candidates is not None:
        cand = pd.Series(candidates).duplicated(keep=False).to_numpy()
    else:
        h = pd.util.hash_pandas_object(raw, index=False).to_numpy()
        cand = pd.Series(h).duplicated(keep=False).to_numpy()
    if not cand.any():
        return
    idx = np.flatnonzero(cand)
    sub = raw.iloc[idx].reset_index(drop=True)
    grp = sub.groupby(list(sub.columns), sort=False, dropna=False).ngroup().to_numpy()
    first_rn = row_numbers[idx[_first_of(grp)]]
    later = row_numbers[idx] != first_rn
    if not later.any():
        return
    mask = np.zeros(len(raw), dtype=bool)
    mask[idx[later]] = True
    reasons = np.empty(len(raw), dtype=object)
    reasons[idx[later]] = [f"exact duplicate of row {r}" for r in first_rn[later]]
    probs.flag(mask, "", "", reasons)

