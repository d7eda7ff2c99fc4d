"""The per-field reference: "a typical transaction" an analyst can picture, one value per field.

Explanations that replace a field need a value to replace it *with*. Zero vectors in the model's
embedding space are not a transaction anyone can picture (and, after the model's first
LayerNorm, every zeroed row is the same vector). The reference is instead a raw transaction:

* ``amount``: the training **median** amount (from the model's statistics when no training rows are
  at hand: ``expm1`` of the mean training ``log1p(|amount|)``, i.e. the geometric-mean amount);
* ``hour`` / ``weekday``: the **most frequent** hour (0-23, UTC) and weekday (0 = Monday);
* ``time_since_prev_s``: the **median** seconds between consecutive transactions of an entity;
* ``amount_vs_history``: the amount equal to the entity's usual amount (deviation 0) — implied,
  not stored: the model computes this field, and a reference transaction following reference
  transactions has deviation 0;
* every categorical field: its **most frequent** training value (the first vocabulary entry, the
  vocabularies are stored in frequency order; hashed fields: the most frequent value of the rows);
* every numeric field and delayed-label aggregate column: the training **median** (the training
  **mean** from the stored statistics when no rows are at hand);
* every multi-valued field: **empty** (no value).

It is computed once at training time from the training rows and stored in the checkpoint under
:data:`CHECKPOINT_KEY` (validated on load by :func:`from_dict`). For an older checkpoint without it
(e.g. the bundled demo model, whose files are pinned), :func:`compute` builds it from the model's
stored statistics where they suffice and from the loaded data's rows for the rest; ``sources``
says, per field, which.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from engine.data.features import EncodedFrame, FeatureEncoder

#: key of the reference in ``checkpoint.json`` (``bundle.meta``)
CHECKPOINT_KEY = "field_reference"
VERSION = 1
DEFAULT_GAP_S = 86400.0  # no entity with two transactions: one day (stated in ``sources``)
_MONDAY = pd.Timestamp("2024-01-01")  # a Monday: the reference timestamp's date carries hour and weekday


@dataclass
class FieldReference:
    """A typical transaction, field by field (see the module docstring).

    Attributes:
        amount: signed amount in the data's currency.
        hour: 0-23 (UTC). weekday: 0 (Monday) - 6.
        time_since_prev_s: seconds since the entity's previous transaction (> 0).
        categorical: ``{field: value}`` raw text values.
        numeric: ``{field: value}`` raw numbers.
        aggregates: ``{aggregate column: value}`` raw numbers (counts as counts, not log).
        multi_valued: ``{field: ""}`` (empty).
        sources: ``{field: plain-language source}``, e.g. ``"training median (12,000 rows)"``.
        origin: ``"checkpoint"`` (stored at training time) or ``"computed"`` (this session).
    """

    amount: float
    hour: int
    weekday: int
    time_since_prev_s: float
    categorical: dict[str, str] = field(default_factory=dict)
    numeric: dict[str, float] = field(default_factory=dict)
    aggregates: dict[str, float] = field(default_factory=dict)
    multi_valued: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    origin: str = "computed"

    def to_dict(self) -> dict[str, Any]:
        """JSON form stored in the checkpoint (``origin`` is not stored)."""
        d = asdict(self)
        d.pop("origin")
        return {"version": VERSION, **d}

    def raw_row(self, encoder: FeatureEncoder) -> dict[str, Any]:
        """The reference as one canonical-frame row (``amount``, ``timestamp`` and every field /
        aggregate column of ``encoder``), ready for :meth:`FeatureEncoder.transform_row`."""
        row: dict[str, Any] = {"amount": self.amount,
                               "timestamp": _MONDAY + pd.Timedelta(days=self.weekday, hours=self.hour)}
        row.update(self.categorical)
        row.update(self.numeric)
        row.update(self.aggregates)
        row.update({k: "" for k in encoder.state["multi_valued"]})
        return row

    def encode(self, encoder: FeatureEncoder) -> EncodedFrame:
        """The reference encoded by ``encoder``: an :class:`EncodedFrame` of one row
        (``cat [1, Fc]`` int64, ``num [1, Fn]`` float32, ``multi [1, Vm]`` float32)."""
        return encoder.transform_row(self.raw_row(encoder))

    def describe(self, encoder: FeatureEncoder) -> dict[str, str]:
        """``{field: value as text}`` for every model field, in field order (for captions/reports)."""
        out: dict[str, str] = {}
        cur = encoder.spec.amount.currency
        for name in encoder.field_names():
            if name == "amount":
                out[name] = f"{self.amount:.2f} {cur}"
            elif name == "time_since_prev":
                out[name] = _duration(self.time_since_prev_s)
            elif name == "amount_vs_history":
                out[name] = "equal to the usual amount"
            elif name == "hour":
                out[name] = f"{self.hour:02d}h"
            elif name == "weekday":
                out[name] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")[self.weekday]
            elif name in self.categorical:
                out[name] = self.categorical[name]
            elif name in self.numeric:
                out[name] = f"{self.numeric[name]:g}"
            elif name in self.multi_valued:
                out[name] = "(none)"
            else:  # an aggregate field: its columns
                cols = encoder.state.get("aggregates", {}).get(name, {})
                out[name] = ", ".join(f"{c}={self.aggregates.get(c, float('nan')):g}" for c in cols)
        return out


def _duration(s: float) -> str:
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= n:
            return f"{s / n:.1f} {unit}"
    return f"{s:.0f} s"


def _median(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else None


def _mode(s: pd.Series):
    s = s.dropna()
    return s.value_counts().index[0] if len(s) else None


def compute(encoder: FeatureEncoder, frame: pd.DataFrame | None = None, *, training: bool = False,
            what: str = "") -> FieldReference:
    """The reference of ``encoder``'s fields.

    Args:
        encoder: the model's fitted feature encoder (its statistics are training statistics).
        frame: canonical rows (sorted by entity, timestamp). With ``training=True`` they are the
            training rows and every median / mode comes from them; otherwise the model's stored
            statistics are used where they suffice (amount: geometric mean, numeric/aggregates: mean,
            categoricals: first vocabulary entry) and ``frame`` only for hour, weekday, time since
            previous and hashed categoricals. ``None``: statistics only; hour 12, weekday Monday
            (0) and one day between transactions are then stated defaults.
        training: whether ``frame`` is the training period.
        what: how ``frame`` is named in ``sources`` (default ``"training rows"`` / ``"loaded data"``).
    Returns:
        :class:`FieldReference` with ``sources`` for every field.
    Raises:
        ValueError: ``training=True`` without rows.
    """
    st = encoder.state
    if training and (frame is None or not len(frame)):
        raise ValueError("compute: training=True needs the training rows")
    have = frame is not None and len(frame) > 0
    what = what or ("training rows" if training else "loaded data")
    rows = f"{what} ({len(frame):,} rows)" if have else ""
    src: dict[str, str] = {}
    if training:
        amount = _median(frame["amount"].to_numpy(np.float64))
        src["amount"] = f"median of {rows}"
    else:
        amount = float(math.expm1(st["amount_log_mean"]))
        src["amount"] = "model statistics: exp(mean training log(1 + |amount|)) - 1"
    if have:
        ts = pd.to_datetime(frame["timestamp"])
        hour, weekday = int(_mode(ts.dt.hour)), int(_mode(ts.dt.day_of_week))
        t = ts.astype("int64").to_numpy() / 1e9
        same = frame["entity_id"].to_numpy()[1:] == frame["entity_id"].to_numpy()[:-1]
        gap = _median(np.diff(t)[same])
        src["hour"] = src["weekday"] = f"most frequent in {rows}"
        src["time_since_prev"] = f"median gap between an entity's consecutive transactions in {rows}"
    else:
        hour, weekday, gap = 12, 0, None
        src["hour"] = src["weekday"] = "default (no rows at hand): 12h, Monday"
    if gap is None or gap <= 0:
        gap = DEFAULT_GAP_S
        src["time_since_prev"] = "default: one day (no entity with two transactions at hand)"
    src["amount_vs_history"] = "equal to the entity's usual amount (deviation 0)"
    fspec = {f.name: f for f in encoder.spec.fields}
    cats: dict[str, str] = {}
    for name, cs in st["categorical"].items():
        if "hashed_buckets" not in cs and cs["vocab"]:
            cats[name], src[name] = str(cs["vocab"][0]), "most frequent training value (model vocabulary)"
        elif have and name in frame:
            vals = frame[name].astype(str)
            m = _mode(vals[vals != fspec[name].missing])
            cats[name], src[name] = (str(m), f"most frequent in {rows}") if m is not None else (
                fspec[name].missing, "missing (no value at hand)")
        else:
            cats[name], src[name] = fspec[name].missing, "missing (no rows at hand)"
    nums: dict[str, float] = {}
    for name, ns in st["numeric"].items():
        med = _median(frame[name].to_numpy(np.float64)) if training and name in frame else None
        nums[name], src[name] = (med, f"median of {rows}") if med is not None else (
            float(ns["mean"]), "training mean (model statistics)")
    aggs: dict[str, float] = {}
    for name, cols in st.get("aggregates", {}).items():
        for c, cs in cols.items():
            med = _median(frame[c].to_numpy(np.float64)) if training and c in frame else None
            if med is None:
                v = float(cs["mean"])
                med = float(math.expm1(v)) if cs["log"] else v
            aggs[c] = med
        src[name] = f"median of {rows}" if training else "training mean (model statistics)"
    multi = {name: "" for name in st["multi_valued"]}
    for name in multi:
        src[name] = "empty (no value)"
    return FieldReference(amount=float(amount if amount is not None else 0.0), hour=hour, weekday=weekday,
                          time_since_prev_s=float(gap), categorical=cats, numeric=nums, aggregates=aggs,
                          multi_valued=multi, sources=src)


def from_dict(d: Any, encoder: FeatureEncoder, source: str = "checkpoint") -> FieldReference:
    """Validate a stored reference (untrusted checkpoint JSON) against ``encoder``'s fields.

    Raises:
        ValueError: names ``source``, the key and what was expected: not an object, wrong version,
            a non-finite or out-of-range number, a field of the encoder missing, text too long.
    """
    where = f"{source}: {CHECKPOINT_KEY}"
    if not isinstance(d, dict):
        raise ValueError(f"{where}: expected an object, got {type(d).__name__}")
    if d.get("version") != VERSION:
        raise ValueError(f"{where}: version: expected {VERSION}, got {d.get('version')!r}")

    def num(key: str, v: Any, lo: float = -math.inf, hi: float = math.inf) -> float:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or not lo <= v <= hi:
            raise ValueError(f"{where}: {key}: expected a finite number in [{lo}, {hi}], got {str(v)[:40]!r}")
        return float(v)

    def mapping(key: str, names, kind) -> dict:
        m = d.get(key)
        if not isinstance(m, dict):
            raise ValueError(f"{where}: {key}: expected an object")
        missing = [n for n in names if n not in m]
        if missing:
            raise ValueError(f"{where}: {key}: missing field(s) {missing[:5]}")
        out = {}
        for n in names:
            v = m[n]
            if kind is str:
                if not isinstance(v, str) or len(v) > 1000:
                    raise ValueError(f"{where}: {key}.{n}: expected text of at most 1000 characters")
                out[n] = v
            else:
                out[n] = num(f"{key}.{n}", v)
        return out

    st = encoder.state
    hour, weekday = num("hour", d.get("hour"), 0, 23), num("weekday", d.get("weekday"), 0, 6)
    if hour != int(hour) or weekday != int(weekday):
        raise ValueError(f"{where}: hour/weekday: expected integers")
    agg_cols = [c for cols in st.get("aggregates", {}).values() for c in cols]
    src = d.get("sources", {})
    if not isinstance(src, dict) or not all(isinstance(v, str) and len(v) <= 500 for v in src.values()):
        raise ValueError(f"{where}: sources: expected an object of short texts")
    return FieldReference(
        amount=num("amount", d.get("amount")), hour=int(hour), weekday=int(weekday),
        time_since_prev_s=num("time_since_prev_s", d.get("time_since_prev_s"), 1e-9),
        categorical=mapping("categorical", list(st["categorical"]), str),
        numeric=mapping("numeric", list(st["numeric"]), float),
        aggregates=mapping("aggregates", agg_cols, float),
        multi_valued={n: "" for n in st["multi_valued"]},
        sources={str(k): v for k, v in src.items()}, origin="checkpoint",
    )


def for_model(meta: dict[str, Any], encoder: FeatureEncoder, frame: pd.DataFrame | None = None) -> FieldReference:
    """The model's reference: the stored one (``meta[CHECKPOINT_KEY]``, validated) if present, else
    :func:`compute` from the model's statistics and ``frame`` (the loaded data).

    Raises:
        ValueError: the stored reference is invalid (see :func:`from_dict`).
    """
    if CHECKPOINT_KEY in meta:
        return from_dict(meta[CHECKPOINT_KEY], encoder)
    return compute(encoder, frame)


__all__ = ["CHECKPOINT_KEY", "FieldReference", "compute", "for_model", "from_dict"]
