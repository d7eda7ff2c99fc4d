"""One posted transaction -> one canonical-frame row, under the same rules as files.

The scoring service receives transactions as JSON objects keyed by the spec's raw column names
(TabFormer: ``"User"``, ``"Card"``, ``"Year"``, ..., ``"Amount"``; Handbook: ``"CUSTOMER_ID"``,
``"TX_DATETIME"``, ...). :func:`canonical_row` applies the rules of
:func:`engine.data.io.read_transactions` (the module docstring of :mod:`engine.data.io` lists
them) to one record without pandas, in the same order, with the same reasons, so a cell that a
file would reject is refused by the service with the same column and reason
(``tests/engine/serve/test_record.py`` checks both on the same cells). Per-record work is a few
microseconds; the file reader's vectorised path costs ~25 ms for a single row.

JSON values are turned into cell text as Parquet values are (:func:`engine.data.validate._text_codes`):
``null`` -> empty, numbers as their shortest exact text (``1.0`` -> ``"1"``), booleans
``"true"`` / ``"false"``. A number posted for a numeric role is used as the number.

Service-specific rules (a file has no equivalent):

* the transaction id is required: the spec's ``id`` column, or ``"transaction_id"`` when the
  spec has none (a file numbers its rows instead); it is the idempotency key of the service;
* the label column may be omitted (unknown at authorisation time);
* a spec with ``[[aggregates]]`` (delayed terminal risk) needs its aggregate columns
  (:meth:`engine.data.spec.DelayedAggregateSpec.columns`) in the request, as finite numbers from
  the caller's feature store: the service keeps no labels of other keys to compute them;
* a JSON text can hold what no file can, each refused naming its key: a lone surrogate
  (``"\\ud800"``, not Unicode text) in any key or text value; a list or object for a column the
  spec reads; an integer too large for a float (``"amount is not finite"``, as the text
  ``1e999`` in a file); a JSON number beyond the float range (``1e400``, which Python's json
  reads as ``inf``) for any other column read - an id, entity, timestamp part, categorical,
  multi-valued, label or passthrough column (``"number is not finite ..."``; as text it would be
  the value ``"inf"``).
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from typing import Any

import pandas as pd

from engine.data.spec import DatasetSpec, FieldKind
from engine.data.validate import _NUMBER, MAX_ABS_AMOUNT, MAX_CELL_CHARS, _clip, _zip5, number_literal

#: key of the transaction id when the spec has no ``id`` column
TRANSACTION_ID_KEY = "transaction_id"
_NS_MIN = pd.Timestamp.min.as_unit("ns").value
_NS_MAX = pd.Timestamp.max.as_unit("ns").value
_UNIT_NS = {"s": 1_000_000_000, "h": 3_600_000_000_000, "D": 86_400_000_000_000}
_TIME = re.compile(r"\s*(\d{1,2}):(\d{2})(?::(\d{2}))?\s*")
#: the plain ISO 8601 local time most files carry ("2018-04-01 00:00:31", "...T...", fractions up to ns)
_ISO_PLAIN = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?", re.ASCII)
_PART_LIMITS = {"year": (1678, 2261), "month": (1, 12), "day": (1, 31), "hour": (0, 23), "minute": (0, 59)}


_SURROGATE = re.compile("[\ud800-\udfff]")


def _encodable(t: str) -> str:
    """``t`` with lone surrogates written as ``\\udXXX`` escapes (so it encodes as UTF-8)."""
    return t if t.isascii() or not _SURROGATE.search(t) else t.encode("utf-8", "backslashreplace").decode("utf-8")


class RecordError(ValueError):
    """A posted transaction is refused: ``column`` (raw column name, as in a file's rejected
    rows), ``value`` (the cell text, clipped to 200 characters) and ``reason``; lone
    surrogates of the column or value are written as ``\\udXXX`` escapes."""

    def __init__(self, column: str, value: Any, reason: str):
        column = _encodable(str(column))
        super().__init__(f"{column}: {reason}")
        self.column, self.value, self.reason = column, _encodable(_clip(str(value))), reason

    def detail(self) -> dict[str, Any]:
        """FastAPI-style error item: ``{"loc": ["body", column], "msg", "type", "input"}``."""
        return {"loc": ["body", self.column], "msg": self.reason, "type": "value_error", "input": self.value}


def cell_text(v: Any) -> str:
    """A JSON value as cell text (see the module docstring); raises ``TypeError`` for lists/objects
    and ``ValueError`` for an infinite float (a JSON ``1e400`` parses to ``inf``: it is no cell
    text, never the text ``"inf"``; :func:`canonical_row` refuses it first, naming the key).
    NaN (not JSON; the service's parser refuses the literal) is an empty cell, as in Parquet."""
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        if math.isinf(v):
            raise ValueError(f"{v!r} is not a finite number")
        return str(int(v)) if v.is_integer() and abs(v) < 2**63 else repr(v)
    raise TypeError(f"expected a text or a number, got {type(v).__name__}")


_EPOCH, _MICROSECOND = datetime(1970, 1, 1), timedelta(microseconds=1)


def json_finite(v: Any) -> Any:
    """``v`` (JSON-like: dicts, lists, numbers, text) with every non-finite float (NaN, +-inf)
    replaced by ``None``, so ``json.dumps(..., allow_nan=False)`` accepts it."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: json_finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_finite(x) for x in v]
    return v


def _number(v: Any, strip: str = "", decimal: str = ".") -> tuple[float, bool, str]:
    """(value, empty, text) under :func:`engine.data.validate._numbers`' rules (one cell's text
    through :func:`engine.data.validate.number_literal`); NaN = not a number; an integer beyond
    the float range is +-inf. A JSON number is that number whatever ``decimal`` says."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        try:
            x = float(v)
        except OverflowError:  # a JSON integer of hundreds of digits
            return (math.inf if v > 0 else -math.inf), False, _clip(str(v))
        return x, math.isnan(x), cell_text(v) if not math.isinf(x) else repr(x)
    t = cell_text(v)
    c = number_literal(t, strip, decimal)
    if c == "":
        return math.nan, True, t
    if c[:1] == "(" and c[-1:] == ")":  # accounting negative "(25.00)"
        c = "-" + c[1:-1]
    return (float(c) if _NUMBER.fullmatch(c) else math.nan), False, t


_COLUMNS: dict[int, tuple] = {}


def _columns(spec: DatasetSpec) -> tuple[list[str], list[str], list[str], frozenset[str]]:
    """(required keys, columns the spec reads, aggregate columns, all keys read) of ``spec``,
    computed once per spec."""
    hit = _COLUMNS.get(id(spec))
    if hit is None or hit[0] is not spec:
        req, cols, aggs = required_keys(spec), spec.required_columns(), aggregate_columns(spec)
        hit = _COLUMNS[id(spec)] = (spec, req, cols, aggs, frozenset(req + cols + aggs))
    return hit[1], hit[2], hit[3], hit[4]


def _finite_checked(spec: DatasetSpec) -> frozenset[str]:
    """Columns read as numbers that refuse a non-finite value themselves, with the file reader's
    reason (``"amount is not finite"``, ``"<field> is not finite"``, ``"timestamp offset is not a
    number"``, the aggregates' ``"must be a finite number"``): the amount, numeric fields, a
    counter timestamp and the aggregate columns. Called only for an infinite posted number."""
    cols = {spec.amount.column, *aggregate_columns(spec)}
    cols |= {f.column for f in spec.fields if f.kind is FieldKind.NUMERIC}
    if spec.timestamp.column is not None and spec.timestamp.unit is not None:
        cols.add(spec.timestamp.column)
    return frozenset(cols)


def required_keys(spec: DatasetSpec) -> list[str]:
    """Raw columns a request must carry: every column the spec reads except the label and the
    passthrough columns, plus the transaction id key and the aggregate columns."""
    skip = set(spec.passthrough) | ({spec.label.column} if spec.label else set()) | set(spec.ignored)
    keys = [c for c in spec.required_columns() if c not in skip]
    if not spec.id:
        keys.append(TRANSACTION_ID_KEY)
    return keys + aggregate_columns(spec)


def aggregate_columns(spec: DatasetSpec) -> list[str]:
    return [c for a in spec.aggregates for c in a.columns()]


def _wall_ns(day: datetime, seconds: int) -> int:
    """Nanoseconds since the epoch of ``seconds`` after midnight of ``day`` (naive, taken as UTC)."""
    return (day - _EPOCH) // _MICROSECOND * 1000 + seconds * 1_000_000_000


def _iso_plain_ns(t: str) -> int | None:
    """Nanoseconds since the epoch of a plain ISO 8601 local time (``YYYY-MM-DD HH:MM[:SS[.f]]``,
    no zone: taken as UTC, as the file reader's ``pd.to_datetime(..., format="ISO8601",
    utc=True)`` does), or None for anything else (then pandas parses it and words the error).
    ~100x cheaper than one ``pd.to_datetime`` call per request (which cost 40 % of a Handbook
    request's CPU); tested equal to it."""
    m = _ISO_PLAIN.fullmatch(t)
    if m is None:
        return None
    y, mo, d, h, mi, se, frac = m.groups()
    try:
        day = datetime(int(y), int(mo), int(d))
    except ValueError:
        return None
    h, mi, se = int(h), int(mi), int(se or 0)
    if h > 23 or mi > 59 or se > 59:
        return None
    ns = _wall_ns(day, h * 3600 + mi * 60 + se) + (int(frac.ljust(9, "0")) if frac else 0)
    return ns if _NS_MIN <= ns <= _NS_MAX else None


def _timestamp_ns(rec: dict, spec: DatasetSpec) -> int:
    ts = spec.timestamp
    if ts.column is not None:
        col, v = ts.column, rec.get(ts.column)
        if ts.unit is not None:
            x, empty, t = _number(v)
            if empty:
                raise RecordError(col, t, "timestamp is empty")
            if not math.isfinite(x):
                raise RecordError(col, t, "timestamp offset is not a number")
            origin = pd.Timestamp(ts.origin)
            if origin.tzinfo is not None:
                origin = origin.tz_convert("UTC").tz_localize(None)
            o = origin.as_unit("ns").value
            if not _NS_MIN <= x * _UNIT_NS[ts.unit] + o <= _NS_MAX:
                raise RecordError(col, t, "timestamp out of range (1677..2262)")
            whole = math.floor(x)
            return int(whole) * _UNIT_NS[ts.unit] + round((x - whole) * _UNIT_NS[ts.unit]) + o
        t = cell_text(v).strip()
        if t == "":
            raise RecordError(col, t, "timestamp is empty")
        if ts.format is None:
            ns = _iso_plain_ns(t)
            if ns is not None:
                return ns
        parsed = pd.to_datetime(pd.Index([t], dtype=object), format=ts.format or "ISO8601", errors="coerce",
                                utc=True).tz_localize(None)
        if parsed.isna()[0]:
            raise RecordError(col, t, "timestamp not parseable" + (f" with format {ts.format!r}" if ts.format else ""))
        p = parsed[0]
        if not pd.Timestamp.min <= p <= pd.Timestamp.max:
            raise RecordError(col, t, "timestamp out of range (1677..2262)")
        return int(p.as_unit("ns").value)
    parts = ts.parts or {}
    ints: dict[str, int] = {}
    for key in ("year", "month", "day", "hour", "minute"):
        if key not in parts:
            continue
        col = parts[key]
        x, empty, t = _number(rec.get(col))
        lo, hi = _PART_LIMITS[key]
        if empty:
            raise RecordError(col, t, f"timestamp part {key} is empty")
        if not (math.isfinite(x) and x == math.floor(x)):
            raise RecordError(col, t, f"timestamp part {key} is not a whole number")
        if not lo <= x <= hi:
            raise RecordError(col, t, f"timestamp part {key} out of range {lo}..{hi}")
        ints[key] = int(x)
    secs = 0
    if "time" in parts:
        col = parts["time"]
        t = cell_text(rec.get(col))
        if not t.strip():
            raise RecordError(col, "", "timestamp part time is empty")
        m = _TIME.fullmatch(t)
        h, mi, se = (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else (99, 0, 0)
        if not (h < 24 and mi < 60 and se < 60):
            raise RecordError(col, t, "timestamp part time is not HH:MM or HH:MM:SS")
        secs = h * 3600 + mi * 60 + se
    secs += ints.get("hour", 0) * 3600 + ints.get("minute", 0) * 60
    try:
        day = datetime(ints["year"], ints["month"], ints["day"])
    except ValueError:
        cols = "/".join(parts[k] for k in ("year", "month", "day"))
        raise RecordError(cols, "/".join(cell_text(rec.get(parts[k])) for k in ("year", "month", "day")),
                          "timestamp parts do not form a valid date") from None
    return _wall_ns(day, secs)


def canonical_row(rec: dict[str, Any], spec: DatasetSpec) -> dict[str, Any]:
    """Validate one posted transaction and return its canonical-frame row.

    Args:
        rec: the JSON object (raw column name -> text, number, boolean or null).
        spec: the model's dataset spec.
    Returns:
        ``{"transaction_id": str, "entity_id": str, "timestamp": pd.Timestamp (naive UTC),
        "ts_ns": int, "amount": float (spec currency, negative = refund), <field>: str | float,
        "label": 1 | 0 | None, <aggregate column>: float, <passthrough>: as posted}``, the
        values :func:`engine.data.io.read_transactions` would put in its frame for this record.
    Raises:
        RecordError: the first problem: a lone surrogate in a key or text value, a list or
            object for a column read, a boolean for an entity, id, timestamp or amount column,
            an infinite number (JSON ``1e400``) for a column read that is not a number column;
            then in the file reader's order (cell length / NUL, entity, timestamp, amount, id,
            fields, label), then missing aggregate columns.
    """
    required, columns, aggregates, read = _columns(spec)
    # key columns: a JSON boolean there is a client's type error, never the text "true"
    keys = {*spec.entity.columns, spec.id or TRANSACTION_ID_KEY, spec.amount.column, *spec.timestamp.columns()}
    for k, v in rec.items():
        if not k.isascii() and _SURROGATE.search(k):
            raise RecordError(k, "", "the key contains a lone surrogate (an escape such as \\ud800 that is not "
                              "Unicode text)")
        if isinstance(v, str):
            if not v.isascii() and _SURROGATE.search(v):
                raise RecordError(k, v, "text contains a lone surrogate (an escape such as \\ud800 that is not "
                                  "Unicode text)")
        elif k in read and isinstance(v, (list, dict)):
            raise RecordError(k, v, f"expected a text or a number, got {'a list' if isinstance(v, list) else 'an object'}")
        elif isinstance(v, bool) and k in keys:
            raise RecordError(k, str(v).lower(), "expected a text or a number, got a boolean (true/false)")
        elif isinstance(v, float) and math.isinf(v) and k in read and k not in _finite_checked(spec):
            # Python's json reads 1e400 as inf: as text it would be the id / entity / category "inf"
            raise RecordError(k, repr(v), "number is not finite (a JSON number beyond the float range, "
                              "such as 1e400)")
    missing = [c for c in required if c not in rec]
    if missing:  # named at once, not one per retry
        more = missing[1:]
        raise RecordError(missing[0], "", "field required" + (
            f" (also missing: {', '.join(repr(c) for c in more[:8])}{f' and {len(more) - 8} more' if len(more) > 8 else ''})"
            if more else ""))
    for c in columns:
        v = rec.get(c)
        if isinstance(v, str):
            if len(v) > MAX_CELL_CHARS:
                raise RecordError(c, v, f"cell has {len(v):,} characters; the limit is {MAX_CELL_CHARS:,}")
            if "\x00" in v:
                raise RecordError(c, v, "cell contains a NUL character (binary data)")
    sep = spec.entity.separator
    parts = []
    for c in spec.entity.columns:
        t = cell_text(rec.get(c)).strip()
        if t == "":
            raise RecordError(c, "", "entity key is empty")
        if len(spec.entity.columns) > 1 and sep in t:
            raise RecordError(c, t, f"entity part contains the separator {sep!r} (the joined entity key would be ambiguous)")
        parts.append(t)
    ts_ns = _timestamp_ns(rec, spec)
    a = spec.amount.column
    amount, empty, at = _number(rec.get(a), strip=spec.amount.strip, decimal=spec.amount.decimal)
    if empty:
        raise RecordError(a, at, "amount is empty")
    if math.isnan(amount):
        raise RecordError(a, at, "amount is not a number")
    if math.isinf(amount):
        raise RecordError(a, at, "amount is not finite")
    if abs(amount) > MAX_ABS_AMOUNT:
        raise RecordError(a, at, f"amount is above the limit of {MAX_ABS_AMOUNT:.0e} in absolute value")
    id_col = spec.id or TRANSACTION_ID_KEY
    tid = cell_text(rec.get(id_col)).strip()
    if tid == "":
        raise RecordError(id_col, "", "transaction id is empty")
    if len(tid) > MAX_CELL_CHARS or "\x00" in tid:
        raise RecordError(id_col, tid, "transaction id is too long or contains a NUL character")
    row: dict[str, Any] = {"transaction_id": tid, "entity_id": sep.join(parts),
                           "timestamp": pd.Timestamp(ts_ns, unit="ns"), "ts_ns": ts_ns, "amount": amount}
    for f in spec.fields:
        v = rec.get(f.column)
        if f.kind is FieldKind.CATEGORICAL:
            t = cell_text(v)
            if f.normalize != "none":
                t = t.strip()
            if f.normalize == "zip5":
                t = _zip5(t)
            row[f.name] = t if t != "" else f.missing
        elif f.kind is FieldKind.NUMERIC:
            x, empty, t = _number(v, decimal=f.decimal)
            if math.isnan(x) and not empty:
                raise RecordError(f.column, t, f"{f.name} is not a number")
            if math.isinf(x):
                raise RecordError(f.column, t, f"{f.name} is not finite")
            row[f.name] = x
        else:
            items = sorted({x.strip() for x in cell_text(v).split(f.separator)} - {""})
            if any("|" in x for x in items):
                raise RecordError(f.column, cell_text(v), f"{f.name} has an item containing '|'")
            row[f.name] = "|".join(items)
    row["label"] = None
    if spec.label is not None and spec.label.column in rec:
        lab = spec.label
        t = cell_text(rec[lab.column]).strip()
        if t in lab.positive:
            row["label"] = 1
        elif t in lab.negative:
            row["label"] = 0
        elif t != "":
            raise RecordError(lab.column, t, f"label value {t!r} is not one of {'/'.join(lab.positive + lab.negative)}")
    for c in aggregates:
        x, empty, t = _number(rec.get(c))
        if empty or not math.isfinite(x):
            raise RecordError(c, t, f"{c} must be a finite number (the caller's delayed aggregate)")
        row[c] = x
    for c in spec.passthrough:
        row[c] = rec.get(c)
    return row
