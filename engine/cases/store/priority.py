"""Work-list rules: a case's priority (from its score and amount) and its SLA due time.

Priority score (``cases.priority``, in [0, 1], higher first)::

    priority = max_probability * (0.5 + 0.5 * amount_weight)
    amount_weight = min(1, log10(1 + max(max_amount, 0)) / log10(1 + AMOUNT_FULL_WEIGHT))

so the model's score counts most, and the case's largest transaction amount (file currency)
moves it by up to a factor of two: an amount of 0 (or unknown) halves the score, an amount of
:data:`AMOUNT_FULL_WEIGHT` (10,000) or more keeps it whole, on a log scale in between
(100 -> 0.75 of the score, 1,000 -> 0.875).

Priority level and SLA (hours from the case's creation until it must be worked):

==========  ==================  =========
level       priority score      SLA
==========  ==================  =========
``P1``      >= 0.60             24 h
``P2``      >= 0.30             72 h
``P3``      below 0.30          168 h
==========  ==================  =========

``cases.sla_due_at`` = ``created_at`` + the SLA of the level; when a rescoring raises the level,
the due time moves earlier (never later: the clock a case started on is not reset).
A case is *overdue* when it is still open work (:data:`OPEN_STATES`) after its due time.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

AMOUNT_FULL_WEIGHT = 10_000.0
#: level -> (lowest priority score, SLA hours), highest level first
LEVELS: dict[str, tuple[float, float]] = {"P1": (0.60, 24.0), "P2": (0.30, 72.0), "P3": (0.0, 168.0)}
#: states that are still work (the default of the work queue); the others are closed
OPEN_STATES = ("open", "assigned", "pending_approval", "escalated")
CLOSED_STATES = ("confirmed_fraud", "false_positive", "closed_no_action")
#: a case this close (hours) to its due time is "due soon"
DUE_SOON_H = 4.0


def priority_score(max_probability: Any, max_amount: Any) -> float:
    """The priority score in [0, 1] (formula in the module docstring). ``max_probability`` is a
    fraud probability in [0, 1]; ``max_amount`` the case's largest amount (missing -> 0)."""
    p = float(max_probability) if max_probability is not None and math.isfinite(float(max_probability)) else 0.0
    try:
        a = float(max_amount)
    except (TypeError, ValueError):
        a = 0.0
    a = a if math.isfinite(a) and a > 0 else 0.0
    w = min(1.0, math.log10(1.0 + a) / math.log10(1.0 + AMOUNT_FULL_WEIGHT))
    return round(min(1.0, max(0.0, p)) * (0.5 + 0.5 * w), 6)


def priority_level(score: Any) -> str:
    """``"P1"``, ``"P2"`` or ``"P3"`` for a priority score (see :data:`LEVELS`)."""
    s = float(score) if score is not None and not pd.isna(score) else 0.0
    for level, (lo, _) in LEVELS.items():
        if s >= lo:
            return level
    return "P3"


def sla_hours(score: Any) -> float:
    """SLA in hours for a priority score (24, 72 or 168)."""
    return LEVELS[priority_level(score)][1]


def sla_due(created_at: Any, score: Any) -> pd.Timestamp:
    """``created_at`` (naive UTC or aware) + the SLA of ``score``'s level, as naive UTC."""
    ts = pd.Timestamp(created_at)
    if ts.tzinfo is not None:
        ts = ts.tz_convert("UTC").tz_localize(None)
    return ts + pd.Timedelta(hours=sla_hours(score))


def sla_status(due: Any, state: str, now: Any) -> str:
    """``"closed"`` (not open work), ``"overdue"`` (past ``due``), ``"due soon"`` (within
    :data:`DUE_SOON_H` hours) or ``"on time"``; ``due`` / ``now`` naive UTC or aware."""
    if state not in OPEN_STATES:
        return "closed"
    if due is None or pd.isna(due):
        return "on time"
    d, n = pd.Timestamp(due), pd.Timestamp(now)
    d = d.tz_localize("UTC") if d.tzinfo is None else d.tz_convert("UTC")
    n = n.tz_localize("UTC") if n.tzinfo is None else n.tz_convert("UTC")
    left = (d - n).total_seconds() / 3600.0
    if left < 0:
        return "overdue"
    return "due soon" if left <= DUE_SOON_H else "on time"
