"""Calibration: a monotone map from the model's logit to a fraud probability, fitted on the
validation period after model choice (early stopping), stored in the checkpoint as JSON.

Why. Training weights frauds by ``pos_weight`` (see :mod:`engine.model.train`), so
``sigmoid(logit)`` is a *score*: it ranks transactions but overstates how often they are fraud.
A calibration map turns it into a probability: among transactions given 0.3, about 30 % are fraud.

Methods (both monotone non-decreasing, so the ranking of transactions is kept, up to ties):

* ``isotonic`` - isotonic regression of the label on the logit (pool-adjacent-violators;
  Zadrozny & Elkan, "Transforming classifier scores into accurate multiclass probability
  estimates", KDD 2002), via :class:`sklearn.isotonic.IsotonicRegression`, **centred** (Oron &
  Flournoy 2017, ``"variant": "centred"``): one breakpoint per block at its mean logit, so the map
  is strictly increasing between the first and last block and ranking by probability does not tie
  whole blocks (:func:`_fit_isotonic`). Stored as breakpoints ``x`` (logits) and ``y``
  (probabilities) and applied with :func:`numpy.interp` (linear between breakpoints, clipped at
  the ends; an end block's rate of exactly 0 or 1 is replaced by its Jeffreys estimate, so no
  transaction is given probability exactly 0 or 1). Maps written before the centred variant hold sklearn's step breakpoints
  (``X_thresholds_``, ``y_thresholds_``) and are applied the same way.
* ``platt`` - ``p = sigmoid(a * logit + b)`` with ``a > 0`` (Platt, "Probabilistic outputs for
  support vector machines", 1999), fitted by logistic regression on the logit (two floats).

Choice (``method="auto"``, the default, documented rule): with fewer than
:data:`MIN_ISOTONIC_FRAUDS` fraud-labelled validation transactions, ``platt``; otherwise the
method with the lower Brier score in :data:`CV_FOLDS`-fold cross-validation over the
validation period, folds by entity (a card's transactions stay in one fold); ties go to Platt.
The chosen method is then refitted on the whole validation period.

Measure: expected calibration error (Guo et al., "On Calibration of Modern Neural Networks",
ICML 2017), :data:`ECE_BINS` **equal-width** bins on [0, 1]:
``ECE = sum_b (n_b / N) * |mean probability_b - fraud rate_b|``; the reliability table gives
per bin the transactions, mean probability and observed fraud rate.

Nothing here imports torch (the dashboard reads these functions).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

#: calibration map key in the checkpoint's ``checkpoint.json``
CALIBRATION_KEY = "calibration"
METHODS = ("isotonic", "platt")
#: fewer fraud-labelled validation transactions than this: Platt (two parameters) only
MIN_ISOTONIC_FRAUDS = 30
#: folds of the method choice (by entity)
CV_FOLDS = 5
#: bins of the expected calibration error and reliability table (equal width on [0, 1])
ECE_BINS = 10
#: most breakpoints an isotonic map may have in a checkpoint
MAX_BREAKPOINTS = 20_000
#: bound on |a|, |b| of a Platt map in a checkpoint
MAX_PLATT = 1e4


def _sigmoid(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # = 1 / (1 + exp(-x)), without overflow


def _fit_isotonic(logit: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Centred isotonic regression (Oron & Flournoy, "Centered Isotonic Regression: Point and
    Interval Estimation for Dose-Response Studies", Statistics in Biopharmaceutical Research 9(3),
    2017): the pool-adjacent-violators fit (:class:`sklearn.isotonic.IsotonicRegression`) gives
    blocks of logits with one fraud rate each; each block becomes ONE breakpoint at its mean logit
    with that rate, and the map interpolates linearly between them. Plain isotonic regression is a
    step function: every transaction of a block gets the same probability, so ranking by
    probability ties whole blocks (on the demo model, test AP 0.823 from its probabilities against
    0.848 from its logits). The centred map is strictly increasing between the first and last
    block's mean logit (ties are left only beyond them) and keeps the block rates, except a first
    block rate of exactly 0 and a last one of exactly 1: those become the Jeffreys estimate
    ``(k + 1/2) / (n + 1)`` of the block (a block of 5,000 legitimate transactions gives 1e-4,
    never "probability 0" for a transaction the validation period merely did not see as fraud)."""
    from sklearn.isotonic import IsotonicRegression

    lg, yy = np.asarray(logit, np.float64), np.asarray(y, np.float64)
    iso = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip").fit(lg, yy)
    fitted = np.clip(iso.predict(lg), 0.0, 1.0)
    order = np.argsort(lg, kind="stable")
    f_sorted, x_sorted = fitted[order], lg[order]
    # blocks: runs of one fitted rate (equal adjacent rates are one block)
    start = np.concatenate([[True], np.diff(f_sorted) != 0])
    block = np.cumsum(start) - 1
    n_b = np.bincount(block)
    x = np.bincount(block, weights=x_sorted) / n_b
    yy_b = f_sorted[start].copy()
    # the end blocks: a rate of exactly 0 (no fraud among the lowest logits) or 1 is a sample
    # limit, not a probability. They get the Jeffreys posterior mean (k + 1/2) / (n + 1) of their
    # n transactions (Brown, Cai & DasGupta, "Interval Estimation for a Binomial Proportion",
    # Statistical Science 16(2), 2001), kept within half the gap to the next block's rate
    if len(yy_b) and yy_b[0] == 0.0:
        nxt = yy_b[1] if len(yy_b) > 1 else 1.0
        yy_b[0] = min(0.5 / (n_b[0] + 1.0), nxt / 2.0)
    if len(yy_b) and yy_b[-1] == 1.0:
        prv = yy_b[-2] if len(yy_b) > 1 else 0.0
        yy_b[-1] = max(1.0 - 0.5 / (n_b[-1] + 1.0), (1.0 + prv) / 2.0)
    if len(x) == 1:  # one block (constant map): two equal breakpoints keep the stored form uniform
        x, yy_b = np.array([x[0], x[0] + 1.0]), np.array([yy_b[0], yy_b[0]])
    return {"method": "isotonic", "variant": "centred", "x": x.tolist(), "y": yy_b.tolist()}


def _fit_platt(logit: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    from sklearn.linear_model import LogisticRegression

    lr = LogisticRegression(C=1e6, max_iter=1000)  # (almost) unpenalised: Platt's two-parameter fit
    lr.fit(np.asarray(logit, np.float64).reshape(-1, 1), np.asarray(y, int))
    a, b = float(lr.coef_[0, 0]), float(lr.intercept_[0])
    if not a > 0:  # a score that does not rank frauds higher: keep the map monotone (constant rate)
        a, b = 1e-6, float(np.log(max(y.mean(), 1e-6) / max(1 - y.mean(), 1e-6)))
    return {"method": "platt", "a": a, "b": b}


def _fit(method: str, logit: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    return _fit_isotonic(logit, y) if method == "isotonic" else _fit_platt(logit, y)


def apply_calibration(cal: dict[str, Any] | None, logit: np.ndarray) -> np.ndarray:
    """Fraud probabilities ``[N]`` (float64, in [0, 1]) of logits ``[N]`` under map ``cal``.

    ``cal`` is ``None`` (no map): ``sigmoid(logit)`` is returned, which is a *score*, not a
    calibrated probability (see :func:`is_calibrated`).

    Raises:
        ValueError: ``cal`` has an unknown method.
    """
    lg = np.asarray(logit, dtype=np.float64)
    if cal is None:
        return _sigmoid(lg)
    if cal.get("method") == "isotonic":
        return np.interp(lg, np.asarray(cal["x"], np.float64), np.asarray(cal["y"], np.float64))
    if cal.get("method") == "platt":
        return _sigmoid(float(cal["a"]) * lg + float(cal["b"]))
    raise ValueError(f"calibration: unknown method {cal.get('method')!r} (expected one of {METHODS})")


def calibration_of(meta: dict | None) -> dict[str, Any] | None:
    """The calibration map stored in a checkpoint's ``meta`` (``None`` when it has none)."""
    cal = (meta or {}).get(CALIBRATION_KEY)
    return cal if isinstance(cal, dict) and cal.get("method") in METHODS else None


def is_calibrated(meta: dict | None) -> bool:
    """True when the checkpoint carries a calibration map: its outputs are probabilities."""
    return calibration_of(meta) is not None


def probability_word(meta: dict | None) -> str:
    """``"probability"`` for a calibrated model, else ``"score"`` (the words rule: only a
    calibrated number is called a probability)."""
    return "probability" if is_calibrated(meta) else "score"


def _brier(y: np.ndarray, p: np.ndarray) -> float:
    return float(np.mean((np.asarray(p, np.float64) - y) ** 2))


def _entity_folds(entities: np.ndarray, k: int, seed: int) -> np.ndarray:
    uniq, codes = np.unique(np.asarray(entities).astype(str), return_inverse=True)
    fold_of = np.random.default_rng(seed).permutation(len(uniq)) % k
    return fold_of[codes]


def fit_calibration(
    logit: np.ndarray,
    y: np.ndarray,
    entities: np.ndarray,
    *,
    method: str = "auto",
    seed: int = 0,
) -> dict[str, Any]:
    """Fit a calibration map on the validation period (see the module doc for the rule).

    Args:
        logit: ``[N]`` model logits of the labelled validation transactions.
        y: ``[N]`` 0/1 labels.
        entities: ``[N]`` entity of each transaction (folds of the method choice).
        method: ``"auto"``, ``"isotonic"`` or ``"platt"``.
        seed: seed of the fold assignment.

    Returns:
        JSON-able map: ``method``, its parameters (``x``/``y`` or ``a``/``b``), ``input``
        (``"logit"``), ``fitted_on`` (``"validation"``), ``n``, ``n_fraud`` and ``choice``
        (``rule`` and, for ``auto`` with enough frauds, ``cv_brier`` per method).

    Raises:
        ValueError: unknown method, lengths differ, non-finite logits, or ``y`` holds one class only.
    """
    if method not in ("auto", *METHODS):
        raise ValueError(f"calibration method: expected 'auto', 'isotonic' or 'platt', got {method!r}")
    lg, yy = np.asarray(logit, np.float64), np.asarray(y).astype(int)
    if not len(lg) == len(yy) == len(entities):
        raise ValueError(f"fit_calibration: lengths differ: logit {len(lg)}, y {len(yy)}, entities {len(entities)}")
    if not np.isfinite(lg).all():
        raise ValueError("fit_calibration: logits must be finite")
    n_fraud = int(yy.sum())
    if not 0 < n_fraud < len(yy):
        raise ValueError("fit_calibration: the validation labels hold one class only; no calibration map can be fitted")
    choice: dict[str, Any]
    if method != "auto":
        chosen, choice = method, {"rule": f"method {method} requested"}
    elif n_fraud < MIN_ISOTONIC_FRAUDS:
        chosen, choice = "platt", {"rule": f"{n_fraud} validation frauds < {MIN_ISOTONIC_FRAUDS}: Platt"}
    else:
        folds = _entity_folds(entities, CV_FOLDS, seed)
        briers = {}
        for m in ("platt", "isotonic"):
            p = np.empty(len(lg))
            for f in range(CV_FOLDS):
                te = folds == f
                tr = ~te
                if not te.any():
                    continue
                if not 0 < yy[tr].sum() < tr.sum():  # a fold without both classes: the class rate
                    p[te] = yy[tr].mean() if tr.any() else yy.mean()
                    continue
                p[te] = apply_calibration(_fit(m, lg[tr], yy[tr]), lg[te])
            briers[m] = _brier(yy, p)
        chosen = "isotonic" if briers["isotonic"] < briers["platt"] else "platt"
        choice = {"rule": f"lower {CV_FOLDS}-fold (by entity) cross-validated Brier score on validation",
                  "cv_brier": briers}
    cal = _fit(chosen, lg, yy)
    cal.update(input="logit", fitted_on="validation", n=int(len(yy)), n_fraud=n_fraud, choice=choice)
    check_calibration(cal)
    return cal


def check_calibration(cal: Any) -> None:
    """Validate a calibration map read from an untrusted checkpoint.

    Isotonic: ``x`` and ``y`` lists of 2 .. :data:`MAX_BREAKPOINTS` finite numbers of equal
    length, ``x`` strictly increasing, ``y`` non-decreasing and within [0, 1]. Platt: ``a`` and
    ``b`` finite numbers, ``0 < a <= MAX_PLATT``, ``|b| <= MAX_PLATT``.

    Raises:
        ValueError: names the key and what is wrong (the checkpoint loader adds the file).
    """
    if not isinstance(cal, dict):
        raise ValueError(f"expected an object, got {type(cal).__name__}")
    m = cal.get("method")
    if m not in METHODS:
        raise ValueError(f"method: expected one of {list(METHODS)}, got {str(m)[:40]!r}")

    def num(v: Any) -> bool:
        return not isinstance(v, bool) and isinstance(v, numbers.Real) and math.isfinite(v)

    if m == "platt":
        a, b = cal.get("a"), cal.get("b")
        if not (num(a) and 0 < a <= MAX_PLATT):
            raise ValueError(f"a: expected a finite number in (0, {MAX_PLATT:g}] (a monotone map), got {str(a)[:40]}")
        if not (num(b) and abs(b) <= MAX_PLATT):
            raise ValueError(f"b: expected a finite number with |b| <= {MAX_PLATT:g}, got {str(b)[:40]}")
        return
    x, y = cal.get("x"), cal.get("y")
    for k, v in (("x", x), ("y", y)):
        if not isinstance(v, list) or not 2 <= len(v) <= MAX_BREAKPOINTS:
            raise ValueError(f"{k}: expected a list of 2 .. {MAX_BREAKPOINTS:,} numbers, got "
                             f"{type(v).__name__}{f' of {len(v):,}' if isinstance(v, list) else ''}")
        bad = next((i for i, t in enumerate(v) if not num(t)), None)
        if bad is not None:
            raise ValueError(f"{k}[{bad}]: expected a finite number, got {str(v[bad])[:40]}")
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length ({len(x)} vs {len(y)})")
    xa, ya = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if (np.diff(xa) <= 0).any():
        i = int(np.flatnonzero(np.diff(xa) <= 0)[0])
        raise ValueError(f"x: breakpoints must be strictly increasing, x[{i}] = {xa[i]} >= x[{i + 1}] = {xa[i + 1]}")
    if (np.diff(ya) < 0).any():
        i = int(np.flatnonzero(np.diff(ya) < 0)[0])
        raise ValueError(f"y: a calibration map must be non-decreasing, y[{i}] = {ya[i]} > y[{i + 1}] = {ya[i + 1]}")
    if ya.min() < 0 or ya.max() > 1:
        raise ValueError(f"y: probabilities must lie in [0, 1], got values in [{ya.min()}, {ya.max()}]")


def reliability_table(y: np.ndarray, p: np.ndarray, n_bins: int = ECE_BINS) -> list[dict[str, Any]]:
    """Per equal-width bin of ``p`` on [0, 1] (the last bin closed): ``bin_low``, ``bin_high``,
    ``n`` (transactions), ``mean_probability`` and ``fraud_rate`` (``None`` for an empty bin).

    Args:
        y: ``[N]`` 0/1 labels. p: ``[N]`` probabilities (or scores) in [0, 1].
    Raises:
        ValueError: lengths differ, ``n_bins < 1``, or a value of ``p`` outside [0, 1] / not finite.
    """
    y, p = np.asarray(y, np.float64), np.asarray(p, np.float64)
    if len(y) != len(p):
        raise ValueError(f"reliability_table: lengths differ: y {len(y)}, p {len(p)}")
    if n_bins < 1:
        raise ValueError(f"reliability_table: n_bins must be >= 1, got {n_bins}")
    if len(p) and (not np.isfinite(p).all() or p.min() < 0 or p.max() > 1):
        raise ValueError("reliability_table: probabilities must be finite and in [0, 1]")
    b = np.minimum((p * n_bins).astype(int), n_bins - 1)
    out = []
    for i in range(n_bins):
        m = b == i
        n = int(m.sum())
        out.append({"bin_low": i / n_bins, "bin_high": (i + 1) / n_bins, "n": n,
                    "mean_probability": float(p[m].mean()) if n else None,
                    "fraud_rate": float(y[m].mean()) if n else None})
    return out


def expected_calibration_error(y: np.ndarray, p: np.ndarray, n_bins: int = ECE_BINS) -> float | None:
    """ECE over ``n_bins`` equal-width bins (see the module doc); in [0, 1]; ``None`` for no rows."""
    rows = reliability_table(y, p, n_bins)
    n = sum(r["n"] for r in rows)
    if n == 0:
        return None
    return float(sum(r["n"] / n * abs(r["mean_probability"] - r["fraud_rate"]) for r in rows if r["n"]))


def calibration_summary(y: np.ndarray, p: np.ndarray, n_bins: int = ECE_BINS) -> dict[str, Any]:
    """JSON-able calibration measures of probabilities ``p`` against labels ``y``: ``ece``,
    ``n_bins``, ``binning`` (``"equal-width"``), ``brier``, ``sum_probability`` (expected
    frauds), ``n_fraud``, ``sum_over_frauds`` (their ratio; 1 = as many expected as observed),
    ``reliability`` (:func:`reliability_table`)."""
    y, p = np.asarray(y, np.float64), np.asarray(p, np.float64)
    s, nf = float(p.sum()), int(y.sum())
    return {"ece": expected_calibration_error(y, p, n_bins), "n_bins": n_bins, "binning": "equal-width",
            "brier": _brier(y, p) if len(y) else None, "sum_probability": s, "n_fraud": nf,
            "sum_over_frauds": s / nf if nf else None, "reliability": reliability_table(y, p, n_bins)}
