"""The one source of truth for thresholds and decision bands (no Streamlit, no torch).

* :func:`thresholds_in_force` - the review / decline thresholds in force for a model: the ones
  stored for its sha256 in the case store (set on the Queue page), else the checkpoint's
  ``meta.thresholds``;
* :func:`decision_band` - ``below_review`` / ``review`` / ``decline`` of a probability.

Every page of the dashboard, the report (JSON / PDF / CSV) and the CLI use these two functions,
so a score is in the same band, against the same threshold, everywhere.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

#: decision bands, lowest first
BANDS = ("below_review", "review", "decline")
#: display words of :data:`BANDS`
BAND_LABELS = {"below_review": "below review", "review": "review", "decline": "decline"}


def decision_band(probability: float, review: float, decline: float | None) -> str:
    """``"decline"`` (p >= decline), ``"review"`` (review <= p < decline) or ``"below_review"``
    (p < review); probabilities in [0, 1]. Raises ``ValueError`` for a non-finite probability
    (a NaN score is never "below review")."""
    p = float(probability)
    if not math.isfinite(p):
        raise ValueError(f"decision_band: probability must be finite, got {probability!r}")
    if decline is not None and p >= decline:
        return "decline"
    return "review" if p >= review else "below_review"


def checkpoint_thresholds(meta: dict | None) -> dict[str, Any]:
    """The thresholds a checkpoint's ``meta`` carries: ``review`` (default 0.5), ``decline``
    (default ``max(review, 0.9)``, never below review), ``source`` ``"checkpoint default"``."""
    m = (meta or {}).get("thresholds", {}) or {}
    review = float(m.get("review", 0.5))
    decline = float(m.get("decline", max(review, 0.9)))
    return {"review": review, "decline": max(decline, review), "source": "checkpoint default"}


def thresholds_in_force(bundle: Any, store: Any = None, db_path: str | Path | None = None) -> dict[str, Any]:
    """The review / decline thresholds (probabilities) in force for ``bundle``'s model.

    Args:
        bundle: a :class:`engine.model.checkpoint.ModelBundle` (``sha256`` and ``meta`` are read).
        store: a :class:`engine.cases.store.CaseStore`; when ``None``, the case store at
            ``db_path`` (default: :func:`engine.cases.store.default_db_path`) is opened if that
            file exists, read and closed again - a missing store is never created here.

    Returns:
        ``{"review", "decline", "source"}``: the thresholds stored for the model's sha256
        (``source`` = ``"set by NAME at TIME UTC"``), else :func:`checkpoint_thresholds`.
    """
    sha = getattr(bundle, "sha256", None)
    t = None
    if store is None and sha:
        from engine.cases.store import CaseStore, default_db_path

        p = Path(db_path) if db_path is not None else default_db_path()
        if p.is_file():
            with CaseStore(p) as opened:  # closed again: the scoring service re-reads every 30 s
                t = opened.get_thresholds(sha)
    elif store is not None and sha:
        t = store.get_thresholds(sha)
    if t is not None:
        return {"review": float(t.review), "decline": float(t.decline),
                "source": f"set by {t.updated_by} at {t.updated_at[:19]} UTC"}
    return checkpoint_thresholds(getattr(bundle, "meta", None))
