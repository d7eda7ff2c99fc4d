"""Per-column parsing and validation of raw transaction files, one problem per rejected row.

Used by :func:`engine.data.io.read_transactions` (and :mod:`engine.data.inspect`): each parser takes
a raw column and returns the canonical values plus, for every row it cannot parse, the column,
the raw value (clipped to 200 characters) and the reason. Also the entity-key join (with its
separator check) and duplicate-transaction flagging. The rules are in :mod:`engine.data.io`.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from engine.data.spec import ColumnRole, DatasetSpec, FieldSpec

_MAX_VALUE_CHARS = 200
#: longest cell (characters) read in a column the spec uses; a longer one rejects its row. Real
#: transaction fields are far shorter; the bound keeps memory proportional to the file size.
MAX_CELL_CHARS = 4096
#: largest absolute amount accepted (in the file's currency); above it the row is rejected as
#: implausible (1e308 passes as a finite number, but no card or bank transaction is that large).
MAX_ABS_AMOUNT = 1e12
_NS_MIN = pd.Timestamp.min.as_unit("ns")
_NS_MAX = pd.Timestamp.max.as_unit("ns")

def _clip(v: str) -> str:
    return v if len(v) <= _MAX_VALUE_CHARS else v[: _MAX_VALUE_CHARS - 1] + "…"

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
#: a number whose commas group thousands ("1,234.50", "(1,234)"): only there is a stripped comma removed
_GROUPED = re.compile(r"\(?[-+]?\d{1,3}(,\d{3})+(\.\d*)?\)?")
#: the same with a decimal comma: "1.234,50" (dots group thousands)
_GROUPED_DOT = re.compile(r"\(?[-+]?\d{1,3}(\.\d{3})+(,\d*)?\)?")


def decimal_comma(t: str) -> str:
    """One cell's text (strip characters already removed) with a decimal comma, as a text with a
    decimal point: ``"11,65"`` -> ``"11.65"``, ``"1.234,50"`` -> ``"1234.50"``; a dot that does
    not group thousands (``"11.65"``, ``"1.5"``) makes it ``"?"`` (not a number) rather than a
    guess."""
    if "." in t:
        if not _GROUPED_DOT.fullmatch(t):
            return "?"
        t = t.replace(".", "")
    return t.replace(",", ".")


@functools.lru_cache(maxsize=64)
def _strip_tables(strip: str, decimal: str) -> tuple[dict, dict | None]:
    """(table removing ``strip`` and blanks, table removing them but the comma, or None when a
    comma is not stripped as a thousands separator)."""
    if decimal == ",":
        strip = strip.replace(",", "")
    table = str.maketrans("", "", strip + " \t")
    keep = str.maketrans("", "", strip.replace(",", "") + " \t") if "," in strip else None
    return table, keep


def number_literal(t: str, strip: str = "", decimal: str = ".") -> str:
    """One number cell's text as the literal to parse: ``strip`` characters and blanks removed, a
    stripped comma only where it groups thousands (``"1,234.50"``; else ``"?"``), a decimal comma
    read by :func:`decimal_comma` when ``decimal`` is ``","``. ``""``: the cell is empty. The one
    rule for files (:func:`_numbers`) and the scoring service (:mod:`engine.serve.record`)."""
    table, keep = _strip_tables(strip, decimal)
    c = t.translate(table)
    if decimal == ",":
        return decimal_comma(c)
    if keep is not None and "," in t and not _GROUPED.fullmatch(t.translate(keep)):
        return "?"  # a comma is stripped only as a thousands separator: "1,234.50", never "11,65" or "1,6"
    return c


def _numbers(s: pd.Series, strip: str = "", decimal: str = ".") -> tuple[np.ndarray, np.ndarray, np.ndarray | pd.Series]:
    """Parse a number column -> (float64 values, empty mask, raw cells for error reports).

    Text cells: the characters in ``strip`` and blanks are removed, ``"(25.00)"`` means -25.00,
    a comma in ``strip`` only where it groups thousands (``"1,234.50"``; ``"11,65"``, a decimal
    comma, is not a number rather than 1165),
    then the cell must be a decimal literal (``"nan"``, ``"inf"``, ``"0x1A"`` are not numbers).
    With ``decimal=","`` the comma is the decimal mark and a dot may only group thousands
    (:func:`decimal_comma`: ``"1.234,50"`` is 1234.5, ``"11.65"`` is not a number); a comma in
    ``strip`` is then ignored. Non-numbers are NaN with ``empty`` False.
    """
    if pd.api.types.is_numeric_dtype(s) and not pd.api.types.is_bool_dtype(s):
        v = s.to_numpy(dtype=np.float64, na_value=np.nan)
        return v, np.isnan(v), s
    codes, texts = _text_codes(s)
    cleaned = [number_literal(t, strip, decimal) for t in texts]

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
def _check_columns(path: Path, spec: DatasetSpec, found: list[str]) -> list[str]:
    """Refuse a file that lacks a column the spec reads, passthrough columns excepted (they are
    never model input, and a file stripped of personal data may lack them): returns those
    missing, for :func:`_missing_passthrough_note`.

    Raises:
        ValueError: names the file, each missing column with its role (and a close match among
            the columns found), and the columns found.
    """
    roles = spec.roles()
    missing = [c for c in spec.required_columns() if c not in found and roles[c] is not ColumnRole.PASSTHROUGH]
    if not missing:
        return [c for c in spec.passthrough if c not in found]
    parts = []
    for c in missing:
        hint = difflib.get_close_matches(c, found, n=1, cutoff=0.6)
        lower = [x for x in found if x.lower() == c.lower()]
        hint = lower or hint
        parts.append(f"{c!r} ({roles[c].value})" + (f", did you mean {hint[0]!r}?" if hint else ""))
    raise ValueError(
        f"{path}: column{'s' if len(missing) > 1 else ''} required by spec {spec.name!r} not found: "
        + "; ".join(parts)
        + f". Columns found: {_clip_names(found)}"
    )


def _without_absent_label(path: Path, spec: DatasetSpec, found: list[str]) -> tuple[DatasetSpec, str | None]:
    """For scoring: a file without the spec's label column is read as unlabelled (the spec
    without ``label``, and a note). A spec with aggregates still needs the column: their
    ``fraud_rate`` features read the known labels of earlier rows, and without them every one
    would be 0, scoring silently differently from a labelled file.

    Raises:
        ValueError: the label column is absent and the spec has aggregates (names the file, the
            column and the aggregates; an all-empty column means "labels unknown", explicitly).
    """
    if spec.label is None or spec.label.column in found:
        return spec, None
    if spec.aggregates:
        raise ValueError(
            f"{path}: label column {spec.label.column!r} not found, and spec {spec.name!r} computes "
            f"{', '.join(a.name for a in spec.aggregates)} from the known labels of earlier transactions "
            "(fraud_rate); without it every such feature would be 0. Add the column (empty cells mean "
            f"'unknown'). Columns found: {_clip_names(found)}")
    note = (f"{path}: no label column {spec.label.column!r}: read as unlabelled (scores only; no known-fraud "
            "counts or test metrics)")
    return spec.model_copy(update={"label": None}), note


def _missing_passthrough_note(path: Path, missing: list[str]) -> str:
    """The note (a warning) of a file read without some of the spec's passthrough columns."""
    return (f"{path}: passthrough column{'s' if len(missing) > 1 else ''} {_clip_names(missing)} not in the "
            f"file: {'they are' if len(missing) > 1 else 'it is'} empty (None) in every row (never model input; "
            "views and evaluations that show them show nothing)")


def _check_cells(raw: pd.DataFrame, columns: list[str], probs: "_Problems") -> None:
    """Reject rows with a cell above :data:`MAX_CELL_CHARS` characters or with a NUL character,
    in the text columns of ``columns`` (the ones the spec reads), naming the column."""
    for c in columns:
        s = raw[c]
        if not _is_text(s) or not len(s):
            continue
        lens = s.str.len().to_numpy(dtype=np.float64, na_value=0.0)
        long = lens > MAX_CELL_CHARS
        if long.any():
            reasons = np.empty(len(s), dtype=object)
            reasons[long] = [f"cell has {int(k):,} characters; the limit is {MAX_CELL_CHARS:,}" for k in lens[long]]
            probs.flag(long, c, _LazyText(s), reasons)
        nul = s.str.contains("\x00", regex=False).to_numpy(dtype=bool, na_value=False)
        probs.flag(nul, c, _LazyText(s), "cell contains a NUL character (binary data)")


def _clip_names(names: list[str], n: int = 30) -> str:
    """Column names for a message: at most ``n``, each clipped to 60 characters."""
    shown = [c if len(c) <= 60 else c[:59] + "…" for c in names[:n]]
    return repr(shown) + (f" and {len(names) - n:,} more" if len(names) > n else "")


def _check_parquet_types(p: Path, spec: DatasetSpec, schema: pa.Schema) -> None:
    """Refuse a Parquet column the spec reads that cannot hold one text or number per cell (a nested
    pass-through column is kept as its JSON text, :func:`engine.data.parquet.read_parquet`)."""
    passthrough = set(spec.passthrough)
    for c in [c for c in spec.required_columns() if c in schema.names]:  # a missing passthrough column: none
        t = schema.field(c).type
        if (pa.types.is_nested(t) and c not in passthrough) or pa.types.is_binary(t) or pa.types.is_large_binary(t) \
                or pa.types.is_fixed_size_binary(t):
            raise ValueError(f"{p}: column {c!r} has Parquet type {t}; the spec needs one text, number or "
                             "timestamp per cell (store it as a string column)")


def _is_text(s: pd.Series) -> bool:
    return pd.api.types.is_string_dtype(s) or pd.api.types.is_object_dtype(s)


class _LazyText:
    """A raw column whose text is only computed for the rows that get flagged."""

    def __init__(self, s: pd.Series):
        self.s = s


def _join_keys(parts: list[tuple[np.ndarray, np.ndarray]], sep: str) -> tuple[np.ndarray, np.ndarray]:
    """Entity parts (canonical codes, texts) -> (codes, keys): ``keys[codes]`` is the joined key
    per row; each distinct key string is built once and equal keys have equal codes. The join is
    unambiguous only for parts without ``sep``: the reader rejects the others first
    (:func:`_sep_in_parts`)."""
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


def _sep_in_parts(codes: np.ndarray, texts: np.ndarray, sep: str) -> np.ndarray:
    """Per row: the entity part contains the separator (``"0:1"`` + ``"2"`` would join to the same
    key as ``"0"`` + ``"1:2"``)."""
    has = np.asarray([sep in t for t in texts], dtype=bool)
    return has[codes]


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


def table_format(path: str | Path) -> str:
    """``"csv"`` or ``"parquet"`` from an output path's suffix (case-insensitive: ``.csv``;
    ``.parquet`` / ``.pq``).

    Raises:
        ValueError: any other suffix (``.csv.gz``, ``.json``, none): named, with the accepted ones,
            rather than a Parquet file under a name that says otherwise.
    """
    suf = Path(path).suffix.lower()
    if suf == ".csv":
        return "csv"
    if suf in (".parquet", ".pq"):
        return "parquet"
    raise ValueError(f"{path}: expected a name ending in .parquet, .pq or .csv, got "
                     + (f"{Path(path).suffix!r}" if suf else "no suffix")
                     + (" (compressed output is not written; Parquet is compressed already)"
                        if suf in (".gz", ".bz2", ".zip", ".xz", ".zst") else ""))
