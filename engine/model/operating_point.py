"""Operating point: the review threshold chosen on the validation period against a stated
target, and its precision, recall and alerts per day on the test period with a bootstrap
interval over entities.

Targets (one of):

* ``precision`` P (the default, P = :data:`DEFAULT_TARGET_PRECISION`): the **lowest** threshold
  whose validation precision is >= P (most frauds caught at that precision), raised to the
  highest threshold with the same validation recall (lower ones only add false positives). If no threshold
  reaches P, the threshold of maximum validation F1 is used and a warning says so.
* ``alerts_per_day`` A: the **lowest** threshold whose validation alerts per day
  (transactions at or above it / days in the validation period) are <= A (as many alerts as
  the stated capacity allows), raised the same way. With ties (equal probabilities) the volume
  can be below A. The decline threshold follows the precision rule at :data:`DECLINE_PRECISION`.

Thresholds are on the value the ``probability`` column of :func:`engine.model.scoring.score_frame`
holds: the calibrated probability when the checkpoint has a calibration map, else the score.

Test check: precision, recall and alerts/day at the threshold on the test period, each with a
percentile interval of a bootstrap over entities (the resampling of
:func:`engine.model.compare.paired_bootstrap`: each draw picks entities with replacement and
weights their transactions by the count; Field & Welsh, JRSS B 69(3), 2007). **Warning rule**:
the validation precision at the threshold lies outside the test precision's interval (the test
period does not confirm the precision the threshold was chosen for).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.metrics import precision_recall_curve

#: default target: review threshold = lowest validation threshold with precision >= this
DEFAULT_TARGET_PRECISION = 0.5
#: decline threshold: lowest validation threshold with precision >= this (never below review)
DECLINE_PRECISION = 0.8


def period_days(start, end) -> float:
    """Length of a period in days (float; at least 1/24, one hour), from two timestamps."""
    import pandas as pd

    return max((pd.Timestamp(end) - pd.Timestamp(start)).total_seconds() / 86400.0, 1.0 / 24)


def _curve(y: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Distinct thresholds ascending with precision, recall and alerts (count of p >= t)."""
    prec, rec, thr = precision_recall_curve(y, p)
    ps = np.sort(p)
    alerts = len(p) - np.searchsorted(ps, thr, side="left")
    return thr, prec[:-1], rec[:-1], alerts


def _highest_at_same_recall(rec: np.ndarray, i: int) -> int:
    """The highest threshold index with the recall of index ``i`` (thresholds ascending, recall
    non-increasing): below it the threshold only adds false positives. Without this step the
    lowest threshold with precision >= P, on a model that catches every validation fraud early,
    went on down until the false positives brought the precision to exactly P (threshold 2.6e-10,
    875 alerts for 248 frauds on a new user's file, where 0.5 gave 249 alerts at the same recall)."""
    same = np.flatnonzero(rec == rec[i])
    return int(same.max()) if len(same) else i


def choose_operating_thresholds(
    y: np.ndarray,
    p: np.ndarray,
    days: float,
    *,
    target_precision: float | None = None,
    alerts_per_day: float | None = None,
    decline_precision: float = DECLINE_PRECISION,
) -> dict[str, Any]:
    """Review and decline thresholds on validation (see the module doc).

    Args:
        y: ``[N]`` 0/1 validation labels. p: ``[N]`` validation probabilities (or scores) in [0, 1].
        days: length of the validation period in days (for alerts per day).
        target_precision / alerts_per_day: the target; at most one; neither = precision
            :data:`DEFAULT_TARGET_PRECISION`.
        decline_precision: precision target of the decline threshold.

    Returns:
        ``{"review", "decline", "target": {"kind", "value"}, "validation": {"precision",
        "recall", "alerts", "alerts_per_day"}, "met": bool, "warning": str | None}``.

    Raises:
        ValueError: both targets given, a target out of range, or ``y`` holds one class only.
    """
    if target_precision is not None and alerts_per_day is not None:
        raise ValueError("state one target: --target-precision or --alerts-per-day, not both")
    if alerts_per_day is not None and not alerts_per_day > 0:
        raise ValueError(f"alerts per day: expected a number > 0, got {alerts_per_day}")
    if alerts_per_day is None:
        target_precision = DEFAULT_TARGET_PRECISION if target_precision is None else target_precision
        if not 0 < target_precision <= 1:
            raise ValueError(f"target precision: expected a number in (0, 1], got {target_precision}")
    y = np.asarray(y).astype(int)
    p = np.asarray(p, np.float64)
    if not 0 < y.sum() < len(y):
        raise ValueError("choose_operating_thresholds: the validation labels hold one class only")
    thr, prec, rec, alerts = _curve(y, p)
    f1 = 2 * prec * rec / np.maximum(prec + rec, 1e-12)
    warning = None
    if alerts_per_day is not None:
        target = {"kind": "alerts_per_day", "value": float(alerts_per_day)}
        ok = np.flatnonzero(alerts / days <= alerts_per_day)
        met = len(ok) > 0
        i = int(ok[0]) if met else len(thr) - 1
        if not met:
            warning = (f"no validation threshold gives <= {alerts_per_day:g} alerts per day (the highest gives "
                       f"{alerts[-1] / days:.1f}); the highest threshold is used")
    else:
        target = {"kind": "precision", "value": float(target_precision)}
        ok = np.flatnonzero(prec >= target_precision)
        met = len(ok) > 0
        i = int(ok[0]) if met else int(np.argmax(f1))
        if not met:
            warning = (f"no validation threshold reaches precision {target_precision:g} (the best is "
                       f"{prec.max():.3f}); the threshold of maximum validation F1 is used")
    i = _highest_at_same_recall(rec, i)
    review = float(thr[i])
    okd = np.flatnonzero(prec >= decline_precision)
    decline = max(float(thr[_highest_at_same_recall(rec, int(okd[0]))]) if len(okd) else review, review)
    return {"review": review, "decline": decline, "target": target, "met": bool(met), "warning": warning,
            "validation": {"precision": float(prec[i]), "recall": float(rec[i]), "alerts": int(alerts[i]),
                           "alerts_per_day": float(alerts[i] / days), "days": float(days)}}


def curve_points(y: np.ndarray, p: np.ndarray, days: float, max_points: int = 400) -> dict[str, list]:
    """Precision-recall curve with alerts per day, one point per distinct value of ``p``
    (descending), thinned to at most ``max_points`` evenly spaced in rank.

    Args:
        y: ``[N]`` 0/1 labels with at least one fraud. p: ``[N]`` probabilities (or scores).
        days: length of the period in days.
    Returns:
        JSON-able ``{"threshold", "precision", "recall", "alerts", "alerts_per_day"}`` lists;
        the point at threshold ``t`` counts the rows with ``p >= t``.
    Raises:
        ValueError: no fraud in ``y`` or lengths differ.
    """
    y, p = np.asarray(y).astype(int), np.asarray(p, np.float64)
    if len(y) != len(p) or not y.sum():
        raise ValueError("curve_points: needs equal lengths and at least one fraud")
    order = np.argsort(-p, kind="stable")
    ps, ys = p[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(ps) != 0), len(ps) - 1]  # last index of each distinct value
    tp, alerts = np.cumsum(ys)[last], last + 1
    if len(last) > max_points:
        keep = np.unique(np.linspace(0, len(last) - 1, max_points).round().astype(int))
        last, tp, alerts = last[keep], tp[keep], alerts[keep]
    return {"threshold": ps[last].tolist(), "precision": (tp / alerts).tolist(), "recall": (tp / ys.sum()).tolist(),
            "alerts": alerts.tolist(), "alerts_per_day": (alerts / days).tolist()}


def bootstrap_at_threshold(
    y: np.ndarray,
    p: np.ndarray,
    entities: np.ndarray,
    threshold: float,
    days: float,
    *,
    n_boot: int = 500,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Precision, recall and alerts per day of ``p >= threshold`` with percentile intervals of
    a bootstrap over entities.

    Args:
        y: ``[N]`` 0/1 labels. p: ``[N]`` probabilities. entities: ``[N]`` entity of each row.
        threshold: the decision threshold (same units as ``p``). days: length of the period.
        n_boot / level / seed: draws, two-sided coverage, random seed.

    Returns:
        ``{"threshold", "precision", "recall", "alerts", "alerts_per_day", "days", "level",
        "n_boot", "n_entities", "interval": {metric: [low, high]}}``; a metric without a value
        (no alert, or no fraud) is ``None`` and draws without one are left out of its interval.

    Raises:
        ValueError: lengths differ.
    """
    y = np.asarray(y).astype(np.float64)
    p = np.asarray(p, np.float64)
    if not len(y) == len(p) == len(entities):
        raise ValueError(f"bootstrap_at_threshold: lengths differ: y {len(y)}, p {len(p)}, entities {len(entities)}")
    pred = (p >= threshold).astype(np.float64)
    uniq, codes = np.unique(np.asarray(entities).astype(str), return_inverse=True)
    # per-entity sums: a draw's totals are weighted sums of these (fast: no per-row work per draw)
    tp_e = np.bincount(codes, weights=pred * y, minlength=len(uniq))
    al_e = np.bincount(codes, weights=pred, minlength=len(uniq))
    pos_e = np.bincount(codes, weights=y, minlength=len(uniq))

    def stats(tp: float, al: float, pos: float) -> tuple[float | None, float | None, float]:
        return (tp / al if al else None, tp / pos if pos else None, al / days)

    full = stats(tp_e.sum(), al_e.sum(), pos_e.sum())
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {"precision": [], "recall": [], "alerts_per_day": []}
    for _ in range(n_boot):
        w = rng.multinomial(len(uniq), np.full(len(uniq), 1.0 / len(uniq))).astype(np.float64)
        for k, v in zip(draws, stats(w @ tp_e, w @ al_e, w @ pos_e)):
            if v is not None:
                draws[k].append(v)
    a = (1.0 - level) / 2.0
    interval = {k: ([float(np.quantile(v, a)), float(np.quantile(v, 1 - a))] if v else None) for k, v in draws.items()}
    return {"threshold": float(threshold), "precision": full[0], "recall": full[1], "alerts": int(al_e.sum()),
            "alerts_per_day": full[2], "days": float(days), "level": level, "n_boot": n_boot,
            "n_entities": int(len(uniq)), "interval": interval}


def precision_warning(val_precision: float | None, test: dict[str, Any]) -> str | None:
    """The warning of the module doc, or ``None``: validation precision outside the test interval."""
    iv = (test.get("interval") or {}).get("precision")
    if val_precision is None or iv is None:
        return None
    lo, hi = iv
    if lo <= val_precision <= hi:
        return None
    return (f"validation precision {val_precision:.3f} at threshold {test['threshold']:.4f} lies outside the test "
            f"precision's {test['level']:.0%} interval [{lo:.3f}, {hi:.3f}]: the test period does not confirm it")
