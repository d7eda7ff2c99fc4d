"""Dataset specs: which column of a raw file plays which role.

A spec is a TOML file. It maps the columns of a raw CSV or Parquet file to roles
(:class:`ColumnRole`): the entity key a history belongs to (one or several columns),
the timestamp (one column, or parts such as Year/Month/Day/Time), the amount, the
model's input fields (categorical, numeric, multi-valued), the optional label, and
columns that are carried along for display or evaluation but are never model input.

Built-in specs live in ``engine/data/specs/*.toml`` (``tabformer``, ``handbook``, ``banksim``).
``load_spec("tabformer")`` loads a built-in one, ``load_spec("path/to/my.toml")`` a file.

Example (abridged ``tabformer.toml``)::

    name = "tabformer"
    [entity]
    columns = ["User", "Card"]
    [timestamp]
    parts = { year = "Year", month = "Month", day = "Day", time = "Time" }
    [amount]
    column = "Amount"
    [label]
    column = "Is Fraud?"
    positive = ["Yes"]
    negative = ["No"]
    [[fields]]
    name = "merchant"
    column = "Merchant Name"
    kind = "categorical"
    hashed_buckets = 4096
"""

from __future__ import annotations

import enum
import functools
import hashlib
import re
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

SPEC_DIR = Path(__file__).parent / "specs"


class ColumnRole(str, enum.Enum):
    """The role a raw column plays. Every column of a file has exactly one role."""

    ENTITY = "entity"  #: part of the key a history belongs to (card, customer)
    TIMESTAMP = "timestamp"  #: the time of the transaction (or a part of it)
    AMOUNT = "amount"  #: signed amount in the file's currency; negative = refund
    CATEGORICAL = "categorical"  #: a field, one category per row (MCC, merchant); model input unless model_input = false
    NUMERIC = "numeric"  #: model input, one real number per row
    MULTI_VALUED = "multi_valued"  #: model input, a set of categories per row ("Errors?")
    LABEL = "label"  #: known fraud label (never model input)
    ID = "id"  #: transaction id (never model input)
    PASSTHROUGH = "passthrough"  #: kept for display/evaluation, never model input
    IGNORED = "ignored"  #: not read at all


class FieldKind(str, enum.Enum):
    """Semantic type of a model input field (cf. pytorch-frame's ``stype``)."""

    CATEGORICAL = "categorical"
    NUMERIC = "numeric"
    MULTI_VALUED = "multi_valued"


_FIELD_ROLES = {ColumnRole.CATEGORICAL, ColumnRole.NUMERIC, ColumnRole.MULTI_VALUED}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EntitySpec(_Strict):
    """Columns whose joined values form the entity id (joined with ``separator``)."""

    columns: list[str] = Field(min_length=1)
    #: joins the parts; never empty. A part containing it is rejected at read time, so the
    #: joined key is unambiguous ("0:1" + "2" vs "0" + "1:2").
    separator: str = Field(default=":", min_length=1)


class TimestampSpec(_Strict):
    """How to build one timestamp per row.

    Exactly one of:
      * ``column``: a datetime column (text parsed with ``format`` if given, else ISO 8601),
        or a numeric column counted in ``unit`` (``"s"``, ``"h"``, ``"D"``) from ``origin``;
      * ``parts``: a mapping with keys ``year``, ``month``, ``day`` and optional ``time``
        (text ``"HH:MM"`` or ``"HH:MM:SS"``), ``hour``, ``minute``.
    Timestamps are naive and taken as UTC.
    """

    column: str | None = None
    format: str | None = None
    unit: Literal["s", "h", "D"] | None = None
    origin: str | None = None
    parts: dict[str, str] | None = None

    @model_validator(mode="after")
    def _one_way(self) -> "TimestampSpec":
        import pandas as pd  # the same parser the reader uses

        if self.format is not None:
            try:
                pd.to_datetime(pd.Index(["2000-01-01"]), format=self.format, errors="coerce")
            except ValueError as e:
                raise ValueError(f"format {self.format!r} is not a valid strftime format: {e}") from None
        if self.origin is not None:
            try:
                o = pd.Timestamp(self.origin)
            except (ValueError, TypeError) as e:
                raise ValueError(f"origin {self.origin!r} is not a date: {e}") from None
            if o is pd.NaT:
                raise ValueError(f"origin {self.origin!r} is not a date")
        if (self.column is None) == (self.parts is None):
            raise ValueError("timestamp: give exactly one of 'column' or 'parts'")
        if self.parts is not None:
            missing = {"year", "month", "day"} - set(self.parts)
            if missing:
                raise ValueError(f"timestamp.parts: missing keys {sorted(missing)}")
            unknown = set(self.parts) - {"year", "month", "day", "time", "hour", "minute"}
            if unknown:
                raise ValueError(f"timestamp.parts: unknown keys {sorted(unknown)}")
        if self.unit is not None and self.origin is None:
            raise ValueError("timestamp: 'unit' needs an 'origin' date")
        return self

    def columns(self) -> list[str]:
        return [self.column] if self.column else list(self.parts.values())  # type: ignore[union-attr]


class AmountSpec(_Strict):
    """The amount column. Text such as ``"$-25.00"`` or ``"1,234.50"`` is parsed; the
    currency symbols in ``strip`` are removed first. Negative amounts are refunds.
    ``decimal = ","`` reads a decimal comma (``"11,65"``, ``"1.234,50"``: many European bank
    exports); a dot then only groups thousands."""

    column: str
    currency: str = "USD"
    strip: str = "$€£ ,"
    decimal: Literal[".", ","] = "."

    @model_validator(mode="after")
    def _decimal_not_stripped(self) -> "AmountSpec":
        if self.decimal == "," and "." in self.strip:
            raise ValueError("amount: decimal ',' with '.' in strip would drop the thousands dots unchecked; "
                             "remove '.' from strip (grouping dots are read by the decimal rule)")
        return self


class LabelSpec(_Strict):
    """Known fraud label. Values in ``positive`` map to 1, in ``negative`` to 0; an empty
    cell is "unknown" (kept, scored, not used for training). Any other value is rejected."""

    column: str
    positive: list[str] = ["1", "Yes", "yes", "True", "true", "fraud"]
    negative: list[str] = ["0", "No", "no", "False", "false", "legit"]

    @model_validator(mode="after")
    def _disjoint(self) -> "LabelSpec":
        both = set(self.positive) & set(self.negative)
        if both:
            raise ValueError(f"label: values {sorted(both)} are both positive and negative")
        if "" in self.positive or "" in self.negative:
            raise ValueError("label: the empty value means 'unknown'; it cannot be positive or negative")
        return self


#: upper bound of ``hashed_buckets`` and ``max_vocab`` (an embedding row per category: a huge value
#: would only allocate memory; the built-in specs use at most 16,384)
MAX_CATEGORIES = 1 << 20


class FieldSpec(_Strict):
    """One field of the canonical frame: a model input unless ``model_input = false``.

    * ``name``: canonical name used everywhere downstream (explanations, figures).
    * ``column``: the raw column it is read from.
    * ``kind``: categorical, numeric or multi_valued.
    * ``hashed_buckets``: for high-cardinality categoricals (merchant, terminal): values
      are hashed into this many buckets instead of a vocabulary (2 .. ``MAX_CATEGORIES``).
    * ``max_vocab``: vocabulary size cap for plain categoricals (most frequent in training;
      2 .. ``MAX_CATEGORIES``).
    * ``separator``: the list separator of a multi-valued cell (TabFormer ``"Errors?"``: ``","``).
    * ``missing``: what an empty cell means for a categorical (a category name). An empty
      multi-valued cell is the empty set (``""`` in the canonical frame); ``missing`` is unused there.
    * ``normalize``: for categoricals, ``"zip5"`` turns ``"91750.0"`` into ``"91750"``.
    * ``decimal``: for numerics, ``","`` reads a decimal comma (``"1,5"``, ``"1.234,50"``), as
      :class:`AmountSpec` ``decimal``; a decimal point is then not a number.
    * ``model_input``: ``false`` keeps the field in the canonical frame (display, reasons,
      ``[[aggregates]]`` keys) without feeding its value to the model — e.g. a terminal id whose
      embedding would only memorise the few terminals seen with frauds in a short training period.
    * ``embed``: categoricals only. ``false`` feeds the field to the model *without* an identity
      embedding of its value: the model sees only whether the value is new to the entity (the
      ``first_seen`` flag, "new merchant"), and the field stays available to reasons and links.
      For high-cardinality ids (merchant, city, zip) whose per-value embeddings memorise the few
      values seen with frauds in training (bench/results/recipe_probe.md). Its values are hashed
      into 2^40 codes, only compared for equality (``hashed_buckets`` and ``max_vocab`` are then
      unused). With the activity fields off the field adds nothing.
    """

    name: str
    column: str
    kind: FieldKind
    hashed_buckets: int | None = Field(default=None, ge=2, le=MAX_CATEGORIES)
    max_vocab: int = Field(default=256, ge=2, le=MAX_CATEGORIES)
    separator: str = ","
    missing: str = "<empty>"
    normalize: Literal["zip5", "strip", "none"] = "strip"
    decimal: Literal[".", ","] = "."
    model_input: bool = True
    embed: bool = True
    description: str = ""

    @model_validator(mode="after")
    def _embed_categorical_only(self) -> "FieldSpec":
        if not self.embed and self.kind is not FieldKind.CATEGORICAL:
            raise ValueError(f"field {self.name!r}: embed = false applies to categorical fields only, "
                             f"got kind {self.kind.value!r}")
        if self.decimal != "." and self.kind is not FieldKind.NUMERIC:
            raise ValueError(f"field {self.name!r}: decimal applies to numeric fields only, got kind {self.kind.value!r}")
        return self


class DelayedAggregateSpec(_Strict):
    """Per-row history features of *another* key (e.g. the terminal) with a label delay.

    For a transaction at time ``t`` and each window ``w`` in ``windows_days``: over the earlier
    transactions with the same ``key`` value whose time lies in ``[t - delay - w, t - delay)``,
    ``count`` (how many) and ``fraud_rate`` (share with label 1; 0 when none). Labels become
    known only ``delay_days`` after a transaction, so nothing from the future or from the delay
    period is used — the "delayed terminal risk" of the Fraud Detection Handbook (Le Borgne et
    al., chapter 3.4, "Baseline feature transformation"). Rows without a known label count in
    ``count`` and not in ``fraud_rate``'s numerator. The result is one model field called
    ``name`` made of all the numbers of :meth:`columns` (``2 * len(windows_days)``, plus
    ``len(recent_labels)``, plus 2 with ``fraud_run``).

    Optional label-history columns of the same key, under the same delay (a summary of the
    key's own delayed label sequence — what a second sequence over the terminal's history would
    read):

    * ``recent_labels = [k, ...]``: ``recent_fraud_share_k``, the share of frauds among the
      key's last ``k`` transactions before ``t - delay`` (fewer when it has fewer; 0 when none).
      As for ``fraud_rate``, a transaction whose label is unknown counts as not a fraud (it
      also ends a fraud run).
    * ``fraud_run = true``: ``fraud_run_length``, the number of consecutive frauds ending at
      the key's last transaction before ``t - delay`` (0 when that one was not a fraud or there
      is none), and ``fraud_run_days``, the time from the first fraud of that run to ``t`` in
      days (0 when there is no run; otherwise at least ``delay_days``). A compromised terminal
      (Handbook scenario 2: every transaction at it is a fraud for 28 days) shows as a run that
      grows and then ages out; an isolated fraud as a run of 1.

    * ``key``: a field name of this spec (e.g. ``"terminal"``).
    """

    name: str
    key: str
    windows_days: list[int] = [1, 7, 30]
    delay_days: int = Field(default=7, ge=0, le=3650)
    recent_labels: list[int] = []
    fraud_run: bool = False
    description: str = ""

    @field_validator("windows_days")
    @classmethod
    def _windows_ok(cls, v: list[int]) -> list[int]:
        if not v or any(not 1 <= w <= 3650 for w in v) or len(set(v)) != len(v):
            raise ValueError(f"windows_days must be distinct whole days in 1..3650, got {v}")
        return v

    @field_validator("recent_labels")
    @classmethod
    def _recent_ok(cls, v: list[int]) -> list[int]:
        if any(k < 1 for k in v) or len(set(v)) != len(v):
            raise ValueError(f"recent_labels must be distinct positive counts, got {v}")
        return v

    def columns(self) -> list[str]:
        """Names of the frame columns this aggregate adds: ``count`` then ``fraud_rate`` per
        window, then ``recent_fraud_share_k`` per ``recent_labels``, then the fraud-run pair."""
        cols = [f"{self.name}_{stat}_{w}d" for w in self.windows_days for stat in ("count", "fraud_rate")]
        cols += [f"{self.name}_recent_fraud_share_{k}" for k in self.recent_labels]
        if self.fraud_run:
            cols += [f"{self.name}_fraud_run_length", f"{self.name}_fraud_run_days"]
        return cols

    def is_count(self, column: str) -> bool:
        """True for the columns that are counts (encoded as ``log1p``): ``count_*`` and ``fraud_run_length``."""
        return "_count_" in column or column.endswith("_fraud_run_length")


class DatasetSpec(_Strict):
    """Column roles of one raw dataset. See the module docstring for the TOML form."""

    name: str
    description: str = ""
    format: Literal["csv", "parquet", "auto"] = "auto"
    entity: EntitySpec
    timestamp: TimestampSpec
    amount: AmountSpec
    label: LabelSpec | None = None
    id: str | None = None
    fields: list[FieldSpec] = []
    passthrough: list[str] = []
    ignored: list[str] = []
    aggregates: list[DelayedAggregateSpec] = []
    #: categorical field names that are *points* an entity visits (merchant, terminal): where links
    #: between cases are looked for (:mod:`engine.cases.links`, common point of compromise); the
    #: first is the default point
    link_points: list[str] = []

    @model_validator(mode="after")
    def _link_points_ok(self) -> "DatasetSpec":
        cats = {f.name for f in self.fields if f.kind is FieldKind.CATEGORICAL}
        for p in self.link_points:
            if p not in cats:
                raise ValueError(f"link_points: {p!r} is not a categorical field name ({sorted(cats)})")
        if len(set(self.link_points)) != len(self.link_points):
            raise ValueError(f"link_points: duplicate names in {self.link_points}")
        return self

    @model_validator(mode="after")
    def _aggregates_ok(self) -> "DatasetSpec":
        names = {f.name for f in self.fields}
        for a in self.aggregates:
            if a.key not in names:
                raise ValueError(f"aggregates.{a.name}: key {a.key!r} is not a field name ({sorted(names)})")
            if a.name in names:
                raise ValueError(f"aggregates.{a.name}: name clashes with a field")
            if self.label is None:
                raise ValueError(f"aggregates.{a.name}: delayed label aggregates need a [label]")
        return self

    @model_validator(mode="after")
    def _unique(self) -> "DatasetSpec":
        names = [f.name for f in self.fields]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"fields: duplicate names {sorted(dup)}")
        reserved = {"row_number", "transaction_id", "entity_id", "timestamp", "amount", "label"}
        clash = reserved & set(names)
        if clash:
            raise ValueError(f"fields: names {sorted(clash)} are reserved")
        clash = (reserved | set(names)) & set(self.passthrough)
        if clash:
            raise ValueError(
                f"passthrough: columns {sorted(clash)} would clash with canonical or field names in the frame"
            )
        # every column has exactly one role (several fields may read the same column)
        seen: dict[str, str] = {}
        conflicts: list[str] = []
        for col, role in self._role_pairs():
            group = "field" if role in _FIELD_ROLES else role.value
            if col in seen and seen[col] != group:
                conflicts.append(f"{col!r} is both {seen[col]} and {group}")
            seen.setdefault(col, group)
        if conflicts:
            raise ValueError("a column can have only one role: " + "; ".join(conflicts))
        return self

    def _role_pairs(self):
        for c in self.entity.columns:
            yield c, ColumnRole.ENTITY
        for c in self.timestamp.columns():
            yield c, ColumnRole.TIMESTAMP
        yield self.amount.column, ColumnRole.AMOUNT
        if self.label:
            yield self.label.column, ColumnRole.LABEL
        if self.id:
            yield self.id, ColumnRole.ID
        for f in self.fields:
            yield f.column, ColumnRole(f.kind.value)
        for c in self.passthrough:
            yield c, ColumnRole.PASSTHROUGH
        for c in self.ignored:
            yield c, ColumnRole.IGNORED

    # ---- role lookup -------------------------------------------------------------
    def roles(self) -> dict[str, ColumnRole]:
        """Raw column name -> role, for every column the spec names."""
        return dict(self._role_pairs())

    def required_columns(self) -> list[str]:
        """Raw columns that must exist in the file (everything but ignored ones)."""
        return [c for c, r in self.roles().items() if r is not ColumnRole.IGNORED]

    def fields_of(self, kind: FieldKind, model_inputs_only: bool = False) -> list[FieldSpec]:
        """Fields of ``kind`` in spec order (only those with ``model_input`` if asked)."""
        return [f for f in self.fields if f.kind is kind and (f.model_input or not model_inputs_only)]

    def to_toml(self) -> str:
        """Serialise back to TOML (used by ``fraudlens inspect`` and checkpoints)."""
        return _dump_toml(self.model_dump(mode="json", exclude_none=True))


def builtin_specs() -> list[str]:
    """Names of the built-in specs shipped in ``engine/specs``."""
    return sorted(p.stem for p in SPEC_DIR.glob("*.toml"))


@functools.lru_cache(maxsize=32)
def _builtin_toml(name: str) -> str | None:
    path = SPEC_DIR / f"{name}.toml"
    if not path.is_file():
        return None
    try:
        return load_spec(path).to_toml()
    except (OSError, ValueError):
        return None


def spec_key(spec: DatasetSpec) -> str:
    """The identity of ``spec`` in case-store and explanation-cache keys (with the file's content
    hash): its ``name`` when its content equals the built-in spec of that name, else
    ``"<name>@<first 12 hex digits of sha256(to_toml())>"``. Two specs that share a name but
    read the file differently (another entity column, other fields) are two sources: a case or a
    cached explanation made through one is never shown through the other."""
    text = spec.to_toml()
    if _builtin_toml(spec.name) == text:
        return spec.name
    return f"{spec.name}@{hashlib.sha256(text.encode('utf-8')).hexdigest()[:12]}"


def source_spec_key(spec: "DatasetSpec | str") -> str:
    """:func:`spec_key` of a loaded spec; a spec given only by name or path (no DatasetSpec at
    hand) keys by that string as given."""
    return spec_key(spec) if isinstance(spec, DatasetSpec) else str(spec)


def load_spec(name_or_path: str | Path) -> DatasetSpec:
    """Load a built-in spec by name or a TOML spec file by path.

    Raises:
        FileNotFoundError: neither a built-in name nor an existing file.
        ValueError: a directory, not UTF-8 text, the TOML is malformed or does not validate
            (message names the file).
    """
    p = Path(name_or_path)
    if not p.suffix and (SPEC_DIR / f"{name_or_path}.toml").exists():
        p = SPEC_DIR / f"{name_or_path}.toml"
    if not p.exists():
        raise FileNotFoundError(
            f"spec {str(name_or_path)!r}: not a built-in spec ({', '.join(builtin_specs())}) "
            "and no such file"
        )
    if p.is_dir():
        raise ValueError(f"spec {str(p)!r}: is a directory, not a TOML spec file")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ValueError(f"{p}: not a TOML spec (the file is not UTF-8 text)") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{p}: invalid TOML: {e}") from e
    return spec_from_dict(data, source=str(p))


def spec_from_dict(data: dict, source: str = "<dict>") -> DatasetSpec:
    """Validate a spec from a plain dict (as parsed from TOML or stored in a checkpoint)."""
    try:
        return DatasetSpec.model_validate(data)
    except ValidationError as e:  # -> one readable line: "where: what" per problem
        problems = "; ".join(
            f"{'.'.join(str(x) for x in err['loc']) or 'spec'}: {err['msg'].removeprefix('Value error, ')}"
            for err in e.errors()
        )
        raise ValueError(f"{source}: invalid dataset spec: {problems}") from None
    except Exception as e:
        raise ValueError(f"{source}: invalid dataset spec: {e}") from e


_TOML_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}


def _toml_char(ch: str) -> str:
    if ch in _TOML_ESCAPES:
        return _TOML_ESCAPES[ch]
    return f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return repr(v)
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return '"' + "".join(_toml_char(ch) for ch in v) + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v)} to TOML")


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_value(k)


def _dump_toml(d: dict) -> str:
    lines: list[str] = []
    tables, arrays = {}, {}
    for k, v in d.items():
        if isinstance(v, dict):
            tables[k] = v
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            arrays[k] = v
        else:
            lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
    for k, v in tables.items():
        lines += ["", f"[{k}]"] + [f"{_toml_key(kk)} = {_toml_value(vv)}" for kk, vv in v.items()]
    for k, items in arrays.items():
        for it in items:
            lines += ["", f"[[{k}]]"] + [f"{_toml_key(kk)} = {_toml_value(vv)}" for kk, vv in it.items()]
    return "\n".join(lines) + "\n"
