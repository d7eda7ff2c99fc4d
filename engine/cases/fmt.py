"""The one way fraudlens writes a time and an amount for people (dashboard, PDF, tables).

* :func:`format_ts` - ``"2026-12-01 14:05 UTC"`` (minutes, UTC; naive values are taken as UTC);
* :func:`format_amount` - ``"1,234.50 USD"`` (thousands separator, 2 decimals, ISO 4217 code
  after the number; a negative amount as ``"-25.00 USD"``);
* :func:`format_signed` - a signed attribution or logit, ``"+0.80"`` / ``"-0.20"`` (the sign
  always written, so a chart's tick or a table cell never reads ``8`` for ``0.8``);
* :func:`format_duration` - an age or time left in hours as ``"3 d 4 h"`` / ``"5 h"`` /
  ``"40 min"``;
* :func:`format_threshold` - a probability threshold, ``"0.200"`` (3 decimals), or 3 significant
  digits below 0.001 (``"6.8e-06"``, never a misleading ``"0.000"``) and up to 6 decimals just
  below 1 (``"0.9996"``, never ``"1.000"``).

Stored values keep full precision (ISO 8601 with microseconds in the case store, floats in the
JSON report); only what is shown goes through here.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pandas as pd

MISSING = "-"


def _missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def to_utc(value: Any) -> pd.Timestamp | None:
    """``value`` (ISO text, ``datetime``, ``pd.Timestamp``, epoch seconds) as a tz-aware UTC
    ``pd.Timestamp``; naive values are taken as UTC. ``None`` for missing. Raises ``ValueError``
    for text that is not a time."""
    if _missing(value):
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        ts = pd.Timestamp(float(value), unit="s")
    else:
        ts = pd.Timestamp(value)
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def format_ts(value: Any, *, seconds: bool = False) -> str:
    """A time as ``"2026-12-01 14:05 UTC"`` (``seconds=True``: ``"2026-12-01 14:05:09 UTC"``);
    ``"-"`` for missing. Naive values are UTC (the case store writes naive or ``+00:00`` UTC)."""
    ts = to_utc(value)
    if ts is None:
        return MISSING
    return ts.strftime("%Y-%m-%d %H:%M:%S UTC" if seconds else "%Y-%m-%d %H:%M UTC")


def format_date(value: Any) -> str:
    """A time as its UTC date ``"2026-12-01"``; ``"-"`` for missing."""
    ts = to_utc(value)
    return MISSING if ts is None else ts.strftime("%Y-%m-%d")


def format_amount(amount: Any, currency: str | None = "") -> str:
    """``1234.5, "USD"`` -> ``"1,234.50 USD"``; ``-25, "USD"`` -> ``"-25.00 USD"``; no currency
    -> ``"1,234.50"``; missing or not finite -> ``"-"``."""
    try:
        v = float(amount)
    except (TypeError, ValueError):
        return MISSING
    if not math.isfinite(v):
        return MISSING
    sign = "-" if v < 0 else ""
    text = f"{sign}{abs(v):,.2f}"
    cur = (currency or "").strip()
    return f"{text} {cur}" if cur else text


def format_signed(value: Any, decimals: int = 2) -> str:
    """``0.8`` -> ``"+0.80"``, ``-0.2`` -> ``"-0.20"``, ``0`` -> ``"0.00"``; missing -> ``"-"``.
    The minus is ASCII ``-`` (extractable, searchable)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return MISSING
    if not math.isfinite(v):
        return MISSING
    if round(v, decimals) == 0:
        return f"{0:.{decimals}f}"
    return f"{v:+.{decimals}f}"


def format_gap(value: Any, decimals: int = 4) -> str:
    """A small signed difference that must not read as zero when it is not (an IG convergence
    delta, in logits): ``format_signed`` with ``decimals``, but a non-zero value that would
    round to zero in scientific notation (``-3.2e-06``, never ``"-0.0000"``); exactly 0 ->
    ``"0.0000"``; missing -> ``"-"``."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return MISSING
    if math.isfinite(v) and v != 0 and round(v, decimals) == 0:
        return f"{v:+.1e}"
    return format_signed(v, decimals)


def format_threshold(value: Any) -> str:
    """A review / decline threshold (a probability in [0, 1]) as text: 3 decimals (``"0.200"``),
    or 3 significant digits when it is above 0 and below 0.001 (``"6.8e-06"``); ``"-"`` if missing."""
    if _missing(value):
        return MISSING
    v = float(value)
    if 0 < abs(v) < 0.001:
        return f"{v:.3g}"
    if 0.9995 <= v < 1:  # "1.000" would read as "never reached"
        return f"{v:.6f}".rstrip("0")
    return f"{v:.3f}"


def format_duration(hours: Any) -> str:
    """Hours (float) as ``"3 d 4 h"``, ``"5 h"`` or ``"40 min"`` (absolute value; the caller says
    whether it is overdue); ``"-"`` for missing."""
    try:
        h = abs(float(hours))
    except (TypeError, ValueError):
        return MISSING
    if not math.isfinite(h):
        return MISSING
    if h < 1:
        return f"{int(round(h * 60))} min"
    if h < 48:
        return f"{int(h)} h"
    d = int(h // 24)
    rest = int(h - 24 * d)
    return f"{d} d {rest} h" if rest else f"{d} d"


def utcnow() -> dt.datetime:
    """Now, tz-aware UTC."""
    return dt.datetime.now(dt.timezone.utc)
