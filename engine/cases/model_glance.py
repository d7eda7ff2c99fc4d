"""The model at a glance: plain data for the Model page (no Streamlit; no torch at import).

* :func:`calibration_view` - is the model calibrated (the word its outputs get), the map, the
  test ECE and reliability tables stored at training;
* :func:`operating_curve` / :func:`operating_at` - precision-recall curve with alerts per day
  on loaded labelled scores, and the figures at one threshold;
* :func:`loaded_calibration` - ECE and reliability of the loaded labelled data;
* :func:`drift_table` - population stability index per field between the training period
  (the checkpoint's ``drift_reference``) and the loaded data;
* :func:`global_importance` - mean |Integrated Gradients attribution| per field and the
  reason-code kinds ("history patterns") over a bounded number of flagged transactions, each
  attribution (logit) with its probability reading.

Words: "probability" only for a calibrated model (:func:`engine.model.calibration.probability_word`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from engine.model.calibration import (
    CALIBRATION_KEY,
    apply_calibration,
    calibration_of,
    calibration_summary,
    probability_word,
)
from engine.model.drift import DRIFT_KEY, psi_table
from engine.model.operating_point import curve_points

#: most thresholds a plotted curve keeps (evenly spaced in rank)
MAX_CURVE_POINTS = 400
#: most flagged transactions explained for the global importance
MAX_IMPORTANCE_CASES = 50


def calibration_view(meta: dict | None) -> dict[str, Any]:
    """What the checkpoint says about calibration.

    Returns:
        ``calibrated`` (bool), ``word`` (``"probability"`` / ``"score"``), ``method``,
        ``choice`` (rule), ``test`` (``{"score": summary, "probability": summary}`` from
        training, empty if not recorded), ``operating_point`` (target, validation and test
        figures with intervals and warnings; ``{}`` if not recorded).
    """
    meta = meta or {}
    cal = calibration_of(meta)
    cm = meta.get("calibration_metrics") or {}
    return {"calibrated": cal is not None, "word": probability_word(meta),
            "method": cal.get("method") if cal else None, "choice": (cal or {}).get("choice", {}),
            "n_breakpoints": len(cal["x"]) if cal and cal.get("method") == "isotonic" else None,
            "test": dict(cm.get("test") or {}), "operating_point": dict(meta.get("operating_point") or {}),
            "has_map": CALIBRATION_KEY in meta}


def _labelled(scores: pd.DataFrame) -> pd.DataFrame:
    if "label" not in scores:
        return scores.iloc[:0]
    lab = pd.to_numeric(scores["label"], errors="coerce")
    return scores[lab.notna()].assign(label=lab[lab.notna()].astype(int))


def data_days(scores: pd.DataFrame) -> float:
    """Days spanned by the scored rows' timestamps (at least one hour, 1/24)."""
    if not len(scores) or "timestamp" not in scores:
        return 1.0 / 24
    ts = pd.to_datetime(scores["timestamp"])
    return max((ts.max() - ts.min()).total_seconds() / 86400.0, 1.0 / 24)


def operating_curve(scores: pd.DataFrame, days: float | None = None) -> pd.DataFrame:
    """Precision-recall curve of the loaded labelled scores, one row per threshold (at most
    :data:`MAX_CURVE_POINTS`, descending thresholds): ``threshold`` (on the ``probability``
    column), ``precision``, ``recall``, ``alerts`` (labelled rows at or above it) and
    ``alerts_per_day`` (over ``days``, default the data's span). Empty without labels of both
    classes."""
    lab = _labelled(scores)
    cols = ["threshold", "precision", "recall", "alerts", "alerts_per_day"]
    if not len(lab) or not 0 < lab["label"].sum() < len(lab):
        return pd.DataFrame(columns=cols)
    days = data_days(scores) if days is None else days
    pts = curve_points(lab["label"].to_numpy(), lab["probability"].to_numpy(np.float64), days, MAX_CURVE_POINTS)
    return pd.DataFrame(pts)[cols]


def stored_curve(meta: dict | None) -> pd.DataFrame:
    """The test-period curve stored at training (``operating_point.test_curve``, as
    :func:`operating_curve`); empty when the checkpoint has none."""
    c = ((meta or {}).get("operating_point") or {}).get("test_curve")
    cols = ["threshold", "precision", "recall", "alerts", "alerts_per_day"]
    if not isinstance(c, dict) or not all(isinstance(c.get(k), list) for k in cols):
        return pd.DataFrame(columns=cols)
    if len({len(c[k]) for k in cols}) != 1:
        return pd.DataFrame(columns=cols)
    return pd.DataFrame({k: pd.to_numeric(pd.Series(c[k]), errors="coerce") for k in cols}).dropna()


def operating_at(scores: pd.DataFrame, threshold: float, days: float | None = None) -> dict[str, Any]:
    """At ``threshold`` on the ``probability`` column of ``scores``: ``alerts`` and
    ``alerts_per_day`` over all scored rows; ``precision`` and ``recall`` over the labelled rows
    (``None`` without labels, or without an alert / a fraud); ``labelled`` (count)."""
    days = data_days(scores) if days is None else days
    flag = scores["probability"].to_numpy(np.float64) >= threshold
    lab = _labelled(scores)
    out: dict[str, Any] = {"threshold": float(threshold), "alerts": int(flag.sum()),
                           "alerts_per_day": float(flag.sum() / days), "labelled": int(len(lab)),
                           "precision": None, "recall": None}
    if len(lab):
        f = lab["probability"].to_numpy(np.float64) >= threshold
        y = lab["label"].to_numpy()
        tp = int((f & (y == 1)).sum())
        out["precision"] = tp / int(f.sum()) if f.any() else None
        out["recall"] = tp / int(y.sum()) if y.any() else None
    return out


def loaded_calibration(scores: pd.DataFrame) -> dict[str, Any] | None:
    """:func:`engine.model.calibration.calibration_summary` of the loaded labelled rows'
    ``probability`` column (``None`` without labelled rows)."""
    lab = _labelled(scores)
    if not len(lab):
        return None
    return calibration_summary(lab["label"].to_numpy(), lab["probability"].to_numpy(np.float64))


def drift_table(meta: dict | None, frame: pd.DataFrame) -> pd.DataFrame:
    """PSI per field between the checkpoint's training-period reference and ``frame``
    (:func:`engine.model.drift.psi_table`); empty when the checkpoint has no reference."""
    return psi_table((meta or {}).get(DRIFT_KEY), frame)


def probability_reading(meta: dict | None, logit: float, attribution: float) -> float:
    """The probability reading of a logit attribution: how much the model's output for a
    transaction of logit ``logit`` would drop without it, ``P(logit) - P(logit - attribution)``
    (points in [-1, 1]; ``P`` = the calibration map, else ``sigmoid`` - a score)."""
    cal = calibration_of(meta)
    p = apply_calibration(cal, np.array([logit, logit - attribution], np.float64))
    return float(p[0] - p[1])


def global_importance(bundle, frame: pd.DataFrame, scores: pd.DataFrame, threshold: float, *,
                      n_cases: int = 10, ig_steps: int = 16) -> dict[str, Any]:
    """Which fields and which history patterns drive flags, over the ``n_cases`` highest-scored
    flagged transactions (probability >= ``threshold``; at most :data:`MAX_IMPORTANCE_CASES`).

    Per case: Integrated Gradients (:mod:`engine.explain.integrated_gradients`, ``ig_steps``
    path points, its default baseline) gives ``[T, F]`` attributions (logit); the field's
    importance is ``sum_t |a[t, f]|`` and its signed total ``sum_t a[t, f]``; the reason codes of
    :func:`engine.trust.reasons.reason_codes` give the history patterns.

    Returns:
        ``fields``: DataFrame ``field``, ``mean_abs_logit`` (mean over cases of the field's
        importance), ``mean_logit`` (signed), ``probability_reading`` (mean over cases of
        :func:`probability_reading` of the signed total: probability points it adds), sorted by
        ``mean_abs_logit``; ``patterns``: DataFrame ``pattern``, ``cases`` (flagged cases citing
        it), ``share``, ``mean_weight_logit``, ``probability_reading``; ``n_cases``; ``word``.
    Raises:
        ValueError: ``n_cases`` < 1.
    """
    from engine.explain import explain_all
    from engine.explain.context import build_context
    from engine.trust.reasons import reason_codes

    if n_cases < 1:
        raise ValueError(f"n_cases must be >= 1, got {n_cases}")
    n_cases = min(int(n_cases), MAX_IMPORTANCE_CASES)
    flagged = scores[scores["probability"].to_numpy(np.float64) >= threshold]
    top = flagged.sort_values(["probability", "logit"], ascending=False, kind="stable").head(n_cases)
    meta = bundle.meta
    per_field: dict[str, list[tuple[float, float, float]]] = {}
    patterns: dict[str, list[tuple[float, float]]] = {}
    done = 0
    for tid, logit in zip(top["transaction_id"].astype(str), top["logit"].astype(float)):
        ctx = build_context(bundle, frame, tid)
        ex = explain_all(ctx, ["integrated_gradients"], ig_steps=ig_steps)
        ig = ex["integrated_gradients"]
        if ig.field_values is None:
            continue
        done += 1
        for j, name in enumerate(ig.field_names or []):
            col = ig.field_values[:, j]
            tot = float(col.sum())
            per_field.setdefault(name, []).append((float(np.abs(col).sum()), tot,
                                                   probability_reading(meta, logit, tot)))
        for r in reason_codes(ctx, ex):
            patterns.setdefault(r.kind, []).append((float(r.weight), probability_reading(meta, logit, float(r.weight))))
    n = max(done, 1)
    fields = pd.DataFrame(
        [{"field": k, "mean_abs_logit": float(np.sum([v[0] for v in vs]) / n),
          "mean_logit": float(np.sum([v[1] for v in vs]) / n),
          "probability_reading": float(np.sum([v[2] for v in vs]) / n)} for k, vs in per_field.items()],
        columns=["field", "mean_abs_logit", "mean_logit", "probability_reading"],
    ).sort_values("mean_abs_logit", ascending=False, kind="stable").reset_index(drop=True)
    pats = pd.DataFrame(
        [{"pattern": k, "cases": len(vs), "share": len(vs) / max(done, 1),
          "mean_weight_logit": float(np.mean([v[0] for v in vs])),
          "probability_reading": float(np.mean([v[1] for v in vs]))} for k, vs in patterns.items()],
        columns=["pattern", "cases", "share", "mean_weight_logit", "probability_reading"],
    ).sort_values(["cases", "mean_weight_logit"], ascending=False, kind="stable").reset_index(drop=True)
    return {"fields": fields, "patterns": pats, "n_cases": done, "n_flagged": int(len(flagged)),
            "word": probability_word(meta), "ig_steps": ig_steps}
