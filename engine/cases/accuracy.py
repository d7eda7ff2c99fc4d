"""Plain-language accuracy of sampled attributions (SHAP) for captions, popovers and the Trust tab.

Pure functions of an :class:`~engine.explain.base.Explanation` (no torch, no Streamlit): the
estimator (:mod:`engine.explain.shap_values`), the standard errors (logit), whether the top-k
ranking was resolved within the time budget, and the additivity that the estimator imposes
(shown as such, never as an accuracy check).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from engine.explain.base import Explanation


def median_standard_error(expl: "Explanation | None") -> float | None:
    """Median standard error (logit) over the earlier transactions (the query's own entry left
    out), or ``None`` for a method without standard errors or without earlier transactions."""
    se = getattr(expl, "standard_errors", None)
    if se is None or len(se) < 2:
        return None
    return float(np.median(np.asarray(se, dtype=float)[:-1]))


def estimate_parts(expl: "Explanation") -> list[str]:
    """Caption parts: estimator, standard errors (median / max, logit), rounds and whether the
    top-k ranking was resolved; ``[]`` for a method without standard errors."""
    se = getattr(expl, "standard_errors", None)
    ex = expl.extras or {}
    if se is None or "estimator" not in ex:
        return []
    est = ex["estimator"]
    pr = (ex.get("pruned") or {}).get("n_transactions", 0)
    out = [f"estimator {est}" + (f" ({pr} oldest transactions merged into one player)" if pr else "")]
    if not est.endswith("kernel"):
        return out + ["exact (standard error 0)" if not pr else "exact on the merged players (standard error 0)"]
    k = (expl.params or {}).get("top_k", 5)
    players = np.asarray(se, dtype=float)[:-1] if len(se) > 1 else np.asarray(se, dtype=float)
    out.append(f"standard error median {float(np.median(players)):.3f}, max {float(np.max(players)):.3f} logit "
               f"({ex.get('rounds')} rounds)")
    out.append(f"top-{k} ranking resolved" if ex.get("converged") else
               f"top-{k} ranking not resolved within the time budget: bars whose error bars overlap may swap")
    return out


def shap_accuracy_text(expl: "Explanation | None") -> str:
    """One paragraph on how accurate the SHAP values are and that their additivity is imposed;
    ``""`` without an explanation with standard errors."""
    if expl is None or getattr(expl, "standard_errors", None) is None:
        return ""
    gap = (expl.extras or {}).get("additivity_gap")
    tail = ("" if gap is None else " Additivity (imposed by the estimator, not a check): the values add up to "
            f"score − base value within {abs(gap):.1e} logit.")
    return "SHAP: " + "; ".join(estimate_parts(expl)) + "." + tail


__all__ = ["estimate_parts", "median_standard_error", "shap_accuracy_text"]
