"""How far is a SHAP explanation from the Shapley values it estimates?

For one query, :func:`shap_accuracy` compares the SHAP values of an explanation (normally the
default :class:`~engine.explain.shap_values.ShapConfig`) with a **reference**:

* ``P <= exact_max_players`` of the explanation's config: the **exact** Shapley values (all
  ``2**P`` coalitions, :func:`engine.explain.shapley.exact_shapley`);
* otherwise a **high-sample** KernelSHAP reference on the unpruned game: ``reference_rounds``
  independent rounds of ``reference_samples / reference_rounds`` coalitions (default 10 x 2,000
  = 20,000), with its own standard error (``ref_mean_se``), so the reference's noise is known.

Metrics over the ``P`` earlier transactions (logits): ``rmse``; ``spearman`` (rank correlation of
the values); ``top6_overlap`` (share of the reference's 6 largest ``|value|`` among the
estimate's 6 largest); ``coverage_2se`` (share of players with
``|estimate - reference| <= 2 sqrt(se^2 + se_ref^2)``: about 95 % when the standard errors are
honest); ``mean_se``; ``seconds`` (the explanation's wall time). The same metrics are computed for
the previous default, one KernelSHAP run of ``2 P + 512`` coalitions (``single_*``), to show
what the repeated estimator changes.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import pandas as pd

from engine.explain.base import Explanation
from engine.explain.context import QueryContext
from engine.explain.removal import coalition_logits
from engine.explain.shap_values import default_nsamples
from engine.explain.shapley import CachedGame, exact_shapley, kernel_shap_round, repeated_kernel_shap, round_seed

TOP_N = 6
REFERENCE_SAMPLES = 20_000


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2:
        return float("nan")
    ra, rb = pd.Series(a).rank().to_numpy(), pd.Series(b).rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _top_overlap(a: np.ndarray, b: np.ndarray, n: int = TOP_N) -> float:
    n = min(n, len(a))
    if n == 0:
        return float("nan")
    top = lambda v: set(np.argsort(-np.abs(v), kind="stable")[:n].tolist())  # noqa: E731
    return len(top(a) & top(b)) / n


def compare(estimate: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """``rmse``, ``spearman`` and ``top6_overlap`` of ``estimate [P]`` against ``reference [P]``."""
    e, r = np.asarray(estimate, np.float64), np.asarray(reference, np.float64)
    return {"rmse": float(np.sqrt(np.mean((e - r) ** 2))) if len(e) else float("nan"),
            "spearman": _spearman(e, r), "top6_overlap": _top_overlap(e, r)}


def shap_accuracy(ctx: QueryContext, expl: Explanation, *, reference_samples: int = REFERENCE_SAMPLES,
                  reference_rounds: int = 10, seed: int = 0) -> dict[str, Any]:
    """Error of the SHAP explanation ``expl`` of ``ctx`` against the exact / high-sample
    reference (see the module docstring). Returns one flat dict (one bench row).

    Raises:
        ValueError: ``expl`` is not a SHAP explanation of this context, or it has no players.
    """
    if expl.method != "shap" or list(expl.transaction_ids) != list(ctx.transaction_ids):
        raise ValueError("expl: expected the SHAP explanation of this context")
    P = ctx.T - 1
    if P < 1:
        raise ValueError("ctx: the query has no earlier transactions to attribute")
    p_exact = int(expl.params.get("exact_max_players", 12))
    game = CachedGame(lambda keep: coalition_logits(ctx, keep), P)
    t0 = time.perf_counter()
    if P <= p_exact:
        ref, ref_se, ref_kind = exact_shapley(game, P), np.zeros(P), "exact"
    else:
        k = repeated_kernel_shap(game, P, max(2, reference_samples // reference_rounds), seed=seed + 7919,
                                 min_rounds=reference_rounds, stop_when_stable=False)
        ref, ref_se, ref_kind = k.values, k.standard_errors, f"kernel {reference_rounds}x{k.nsamples}"
    ref_s = time.perf_counter() - t0
    est = expl.values[:-1]
    se = expl.standard_errors[:-1] if expl.standard_errors is not None else np.zeros(P)
    single = kernel_shap_round(game, P, default_nsamples(P), round_seed(seed, 0)) if P > p_exact else ref
    tol = 2 * np.sqrt(se**2 + ref_se**2) + 1e-6  # + float32 model noise (exact vs exact differ by ~1e-7)
    ex = expl.extras
    row: dict[str, Any] = {
        "case": ctx.query_transaction_id, "P": P, "estimator": ex.get("estimator"), "n_players": ex.get("n_players"),
        "pruned": (ex.get("pruned") or {}).get("n_transactions", 0), "rounds": ex.get("rounds"),
        "converged": ex.get("converged"), "n_evaluations": ex.get("n_evaluations"), "reference": ref_kind,
        "ref_mean_se": float(ref_se.mean()), "median_abs_value": float(np.median(np.abs(ref))),
        **compare(est, ref), "coverage_2se": float(np.mean(np.abs(est - ref) <= tol)),
        "mean_se": float(se.mean()), "seconds": float(expl.elapsed_s), "reference_seconds": ref_s,
    }
    row.update({f"single_{k}": v for k, v in compare(single, ref).items()})
    return row


def accuracy_markdown(rows: pd.DataFrame) -> str:
    """Per-case rows of :func:`shap_accuracy` and their means as a markdown table."""
    if not len(rows):
        return "No case with earlier transactions."
    cols = ["case", "P", "estimator", "n_players", "pruned", "rounds", "converged", "reference", "median_abs_value",
            "rmse", "spearman", "top6_overlap", "coverage_2se", "mean_se", "ref_mean_se", "seconds", "single_rmse",
            "single_spearman", "single_top6_overlap"]
    head = ["case", "P", "estimator", "players", "pruned", "rounds", "converged", "reference",
            "median abs ref value", "RMSE", "Spearman", "top-6 overlap", "within 2 SE", "mean SE", "ref mean SE",
            "s", "single-run RMSE", "single-run Spearman", "single-run top-6"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(v: Any) -> str:
        if isinstance(v, (bool, np.bool_)):
            return "yes" if v else "no"
        if isinstance(v, (float, np.floating)):
            return "–" if math.isnan(v) else f"{v:.3f}"
        return "–" if v is None else str(v)

    for _, r in rows.iterrows():
        lines.append("| " + " | ".join(cell(r[c]) for c in cols) + " |")
    num = rows[[c for c in cols if c not in ("case", "estimator", "reference", "converged")]].astype(float).mean()
    mean_row = ["**mean**", *(cell(num[c]) if c in num else "" for c in cols[1:])]
    mean_row[cols.index("converged")] = f"{100 * rows.converged.astype(bool).mean():.0f}%"
    lines.append("| " + " | ".join(mean_row) + " |")
    return "\n".join(lines)


__all__ = ["REFERENCE_SAMPLES", "TOP_N", "accuracy_markdown", "compare", "shap_accuracy"]
