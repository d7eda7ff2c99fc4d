"""Drift between the training period and loaded data: per-field reference statistics stored in
the checkpoint at training time (key :data:`DRIFT_KEY`) and the population stability index.

Reference (training-period rows only):

* numeric fields and ``amount``: inner bin edges at the training deciles (duplicates dropped,
  so up to :data:`NUMERIC_BINS` bins ``(-inf, e1), [e1, e2), ..., [ek, inf)``), the share of
  rows per bin and the share of missing values;
* categorical and multi-valued fields (a multi-valued cell's text is its category): the
  :data:`TOP_CATEGORIES` most frequent values with their shares and the share of all others.

PSI (Siddiqi, "Credit Risk Scorecards", Wiley 2006, ch. 8; also Yurdakul, "Statistical
properties of population stability index", 2018): ``PSI = sum_i (a_i - e_i) * ln(a_i / e_i)``
over the bins, ``e`` = training shares, ``a`` = loaded-data shares, both floored at
:data:`PSI_FLOOR` so an empty bin is finite. Reading: < 0.1 stable, 0.1 - 0.25 moderate
shift, >= 0.25 major shift.

No torch here (the dashboard computes PSI from these functions).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import pandas as pd

#: the drift reference's key in ``checkpoint.json``
DRIFT_KEY = "drift_reference"
NUMERIC_BINS = 10
TOP_CATEGORIES = 20
PSI_FLOOR = 1e-4
MAX_FIELDS = 512
MAX_CATEGORY_CHARS = 200
PSI_READING = ((0.1, "stable"), (0.25, "moderate shift"), (math.inf, "major shift"))


def _numeric_ref(v: pd.Series) -> dict[str, Any]:
    x = pd.to_numeric(v, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    ok = np.isfinite(x)
    n = len(x)
    edges = np.unique(np.quantile(x[ok], np.arange(1, NUMERIC_BINS) / NUMERIC_BINS)) if ok.any() else np.array([])
    props = _numeric_shares(x, edges)
    return {"kind": "numeric", "edges": edges.tolist(), "proportions": props[:-1], "missing": props[-1],
            "n": int(n)}


def _numeric_shares(x: np.ndarray, edges: np.ndarray) -> list[float]:
    """Shares per bin of ``edges`` then the missing share (one list, sums to 1)."""
    ok = np.isfinite(x)
    n = max(len(x), 1)
    counts = np.bincount(np.searchsorted(edges, x[ok], side="right"), minlength=len(edges) + 1)
    return [float(c / n) for c in counts] + [float((~ok).sum() / n)]


def _cat_text(v: pd.Series) -> pd.Series:
    return v.astype("string").fillna("<missing>").str.slice(0, MAX_CATEGORY_CHARS)


def _categorical_ref(v: pd.Series) -> dict[str, Any]:
    s = _cat_text(v)
    share = s.value_counts(normalize=True, sort=True)
    top = share.iloc[:TOP_CATEGORIES]
    return {"kind": "categorical", "categories": [str(c) for c in top.index],
            "proportions": [float(p) for p in top.to_numpy()], "other": float(max(0.0, 1.0 - top.sum())),
            "n": int(len(s))}


def drift_reference(frame: pd.DataFrame, spec) -> dict[str, Any]:
    """Reference statistics of the training-period rows ``frame`` (canonical frame) for every
    input field of ``spec`` and ``amount`` (see the module doc). JSON-able."""
    fields: dict[str, Any] = {}
    if "amount" in frame:
        fields["amount"] = _numeric_ref(frame["amount"])
    for f in spec.fields:
        if f.name not in frame or f.name in fields:
            continue
        kind = getattr(f.kind, "value", f.kind)
        fields[f.name] = _numeric_ref(frame[f.name]) if kind == "numeric" else _categorical_ref(frame[f.name])
    return {"period": "training", "n_rows": int(len(frame)), "psi_floor": PSI_FLOOR, "fields": fields}


def psi(expected: np.ndarray, actual: np.ndarray, floor: float = PSI_FLOOR) -> float:
    """Population stability index of share vectors ``expected`` (reference) and ``actual``
    (both ``[K]``, summing to 1), floored at ``floor`` (see the module doc).

    Raises:
        ValueError: lengths differ or are 0.
    """
    e, a = np.asarray(expected, np.float64), np.asarray(actual, np.float64)
    if len(e) != len(a) or not len(e):
        raise ValueError(f"psi: share vectors must have the same, non-zero length (got {len(e)} and {len(a)})")
    e, a = np.maximum(e, floor), np.maximum(a, floor)
    return float(np.sum((a - e) * np.log(a / e)))


def psi_reading(value: float) -> str:
    """``"stable"`` (< 0.1), ``"moderate shift"`` (0.1 - 0.25) or ``"major shift"`` (>= 0.25)."""
    return next(word for bound, word in PSI_READING if value < bound)


def field_shares(ref: dict[str, Any], values: pd.Series) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Bins of one field's reference and the ``(labels, expected, actual)`` shares of ``values``."""
    if ref["kind"] == "numeric":
        edges = np.asarray(ref["edges"], np.float64)
        x = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        actual = np.asarray(_numeric_shares(x, edges))
        expected = np.asarray(list(ref["proportions"]) + [ref["missing"]])
        bounds = ["-inf", *[f"{e:.4g}" for e in edges], "inf"]
        labels = [f"[{bounds[i]}, {bounds[i + 1]})" for i in range(len(edges) + 1)] + ["missing"]
        return labels, expected, actual
    s = _cat_text(values)
    n = max(len(s), 1)
    counts = s.value_counts()
    actual_top = np.array([counts.get(c, 0) / n for c in ref["categories"]], np.float64)
    actual = np.append(actual_top, max(0.0, 1.0 - actual_top.sum()))
    expected = np.asarray(list(ref["proportions"]) + [ref["other"]])
    return list(ref["categories"]) + ["(other)"], expected, actual


def psi_table(reference: dict[str, Any] | None, frame: pd.DataFrame) -> pd.DataFrame:
    """One row per reference field found in ``frame``: ``field``, ``kind``, ``psi``,
    ``reading``, ``largest_change`` (the bin whose share moved most) and ``rows``; sorted by
    PSI, largest first. Empty when there is no reference."""
    rows = []
    for name, ref in ((reference or {}).get("fields") or {}).items():
        if name not in frame:
            continue
        labels, e, a = field_shares(ref, frame[name])
        v = psi(e, a)
        j = int(np.argmax(np.abs(a - e)))
        rows.append({"field": name, "kind": ref["kind"], "psi": v, "reading": psi_reading(v),
                     "largest_change": f"{labels[j]}: {e[j]:.1%} -> {a[j]:.1%}", "rows": int(len(frame))})
    cols = ["field", "kind", "psi", "reading", "largest_change", "rows"]
    return pd.DataFrame(rows, columns=cols).sort_values("psi", ascending=False, kind="stable").reset_index(drop=True)


def check_drift_reference(ref: Any) -> None:
    """Validate a drift reference read from an untrusted checkpoint: at most
    :data:`MAX_FIELDS` fields; numeric: <= ``NUMERIC_BINS - 1`` finite, strictly increasing
    edges and ``len(edges) + 1`` shares; categorical: <= :data:`TOP_CATEGORIES` distinct text
    categories of <= :data:`MAX_CATEGORY_CHARS` characters, one share each; every share finite
    in [0, 1] and each field's shares (with ``missing`` / ``other``) summing to 1 (+-1e-6).

    Raises:
        ValueError: names the field and what is wrong (the checkpoint loader adds the file).
    """
    def share(v: Any) -> bool:
        return not isinstance(v, bool) and isinstance(v, numbers.Real) and math.isfinite(v) and 0 <= v <= 1

    if not isinstance(ref, dict) or not isinstance(ref.get("fields"), dict):
        raise ValueError("expected an object with a 'fields' object")
    if len(ref["fields"]) > MAX_FIELDS:
        raise ValueError(f"{len(ref['fields'])} fields, above the limit of {MAX_FIELDS}")
    for name, f in ref["fields"].items():
        if not isinstance(f, dict) or f.get("kind") not in ("numeric", "categorical"):
            raise ValueError(f"fields.{str(name)[:40]}: expected kind 'numeric' or 'categorical'")
        props = f.get("proportions")
        if not isinstance(props, list) or not all(share(p) for p in props):
            raise ValueError(f"fields.{name}.proportions: expected a list of shares in [0, 1]")
        if f["kind"] == "numeric":
            edges, rest = f.get("edges"), f.get("missing")
            if not isinstance(edges, list) or len(edges) > NUMERIC_BINS - 1 or not all(
                    not isinstance(e, bool) and isinstance(e, numbers.Real) and math.isfinite(e) for e in edges):
                raise ValueError(f"fields.{name}.edges: expected at most {NUMERIC_BINS - 1} finite numbers")
            if (np.diff(np.asarray(edges, np.float64)) <= 0).any():
                raise ValueError(f"fields.{name}.edges: must be strictly increasing")
            if len(props) != len(edges) + 1:
                raise ValueError(f"fields.{name}: {len(props)} shares for {len(edges)} edges (expected "
                                 f"{len(edges) + 1})")
        else:
            cats, rest = f.get("categories"), f.get("other")
            if (not isinstance(cats, list) or len(cats) > TOP_CATEGORIES or len(set(map(str, cats))) != len(cats)
                    or not all(isinstance(c, str) and len(c) <= MAX_CATEGORY_CHARS for c in cats)):
                raise ValueError(f"fields.{name}.categories: expected at most {TOP_CATEGORIES} distinct texts")
            if len(props) != len(cats):
                raise ValueError(f"fields.{name}: {len(props)} shares for {len(cats)} categories")
        if not share(rest):
            raise ValueError(f"fields.{name}: the missing/other share must be a number in [0, 1]")
        total = sum(props) + rest
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"fields.{name}: shares sum to {total:.6f}, expected 1")
