"""Comparing two scorers on the same test rows: a paired bootstrap over entities.

Transactions of one card or customer are not independent (one fraud episode is many rows), so
the resampling unit is the entity: each draw picks ``n_entities`` entities with replacement and
weights every row by how often its entity was picked (equivalent to concatenating the picked
entities' rows). Both scorers are evaluated on the same draw, so the interval is for the
*difference* (Efron & Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 6 and 16;
cluster bootstrap: Field & Welsh, JRSS B 69(3), 2007).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score

_METRICS = {"average_precision": average_precision_score, "auc_roc": roc_auc_score}


def paired_bootstrap(
    y: np.ndarray,
    score_a: np.ndarray,
    score_b: np.ndarray,
    entities: np.ndarray,
    *,
    metric: str = "average_precision",
    n_boot: int = 500,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Metric of A, of B, and a percentile interval of ``metric(A) - metric(B)``.

    Args:
        y: ``[N]`` 0/1 labels of the test rows.
        score_a, score_b: ``[N]`` scores (probabilities or logits; only the order matters).
        entities: ``[N]`` entity id of each row (the resampling unit).
        metric: ``"average_precision"`` or ``"auc_roc"``.
        n_boot: bootstrap draws; draws where a class is absent are skipped (counted in
            ``n_skipped``).
        level: two-sided coverage of the interval.
        seed: random seed of the draws.

    Returns:
        dict with ``metric``, ``a``, ``b``, ``diff`` (on all rows), ``ci_low``, ``ci_high``,
        ``share_diff_le_0`` (share of draws where A is not better), ``n_boot``, ``n_skipped``,
        ``n_entities``, ``level``.

    Raises:
        ValueError: unknown metric, mismatched lengths, or ``y`` holds one class only.
    """
    if metric not in _METRICS:
        raise ValueError(f"metric: expected one of {sorted(_METRICS)}, got {metric!r}")
    y = np.asarray(y).astype(int)
    a, b = np.asarray(score_a, np.float64), np.asarray(score_b, np.float64)
    if not len(y) == len(a) == len(b) == len(entities):
        raise ValueError(f"paired_bootstrap: lengths differ: y {len(y)}, a {len(a)}, b {len(b)}, "
                         f"entities {len(entities)}")
    if not 0 < y.sum() < len(y):
        raise ValueError("paired_bootstrap: the labels hold one class only")
    fn = _METRICS[metric]
    codes, uniq = _codes(entities)
    n_ent = len(uniq)
    rng = np.random.default_rng(seed)
    diffs = []
    skipped = 0
    for _ in range(n_boot):
        w_ent = rng.multinomial(n_ent, np.full(n_ent, 1.0 / n_ent))
        w = w_ent[codes].astype(np.float64)
        pos = float((w * y).sum())
        if pos == 0 or pos == w.sum():
            skipped += 1
            continue
        keep = w > 0
        diffs.append(fn(y[keep], a[keep], sample_weight=w[keep]) - fn(y[keep], b[keep], sample_weight=w[keep]))
    d = np.asarray(diffs)
    alpha = (1.0 - level) / 2.0
    full_a, full_b = float(fn(y, a)), float(fn(y, b))
    return {
        "metric": metric, "a": full_a, "b": full_b, "diff": full_a - full_b,
        "ci_low": float(np.quantile(d, alpha)) if len(d) else float("nan"),
        "ci_high": float(np.quantile(d, 1.0 - alpha)) if len(d) else float("nan"),
        "share_diff_le_0": float((d <= 0).mean()) if len(d) else float("nan"),
        "n_boot": int(len(d)), "n_skipped": skipped, "n_entities": int(n_ent), "level": level,
    }


def _codes(entities: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    uniq, codes = np.unique(np.asarray(entities).astype(str), return_inverse=True)
    return codes, uniq
