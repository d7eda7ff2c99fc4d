"""Do the explanation methods agree on which transactions matter?

For one query, every method gives one value per context transaction. The methods are compared
on the **earlier** transactions only (``P = T - 1``; the query is not removable and SHAP /
occlusion give it 0 by definition), ranked by *value* (the same ranking as the deletion curves of
:mod:`engine.trust.faithfulness`: most fraud-pushing first; attention by weight):

* Spearman's rho (Spearman 1904) and Kendall's tau-b (Kendall 1938) between every pair of
  methods, as symmetric ``[M, M]`` DataFrames with a unit diagonal (``scipy.stats``; ties get
  average ranks / tau-b's tie correction).
* A pair with Spearman rho below :data:`DISAGREE_BOUND` (0.3; below ~0.3 is conventionally a
  *weak* correlation, Cohen 1988) is flagged **"methods disagree"**: their explanations of this
  case point at different transactions, so neither ranking should be read on its own. A
  correlation is undefined (NaN, flagged as ``"undefined"``) when a method gives every earlier
  transaction the same value or ``P < 3``.

No torch here (importable by the dashboard).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import pandas as pd
from scipy.stats import kendalltau, spearmanr

#: Spearman rho below which two methods "disagree" (see module doc)
DISAGREE_BOUND = 0.3


@dataclass
class AgreementResult:
    """Rank agreement between methods on one query.

    Attributes:
        spearman: ``[M, M]`` DataFrame (index and columns = method names), symmetric, diagonal 1.
        kendall: ``[M, M]`` DataFrame of Kendall's tau-b, symmetric, diagonal 1.
        pairs: one row per unordered pair: ``method_a``, ``method_b``, ``spearman``, ``kendall``,
            ``status`` (``"agree"``, ``"methods disagree"`` or ``"undefined"``).
        n_transactions: ``P``, the number of ranked (earlier) transactions.
        bound: the disagreement bound used.
        query_transaction_id: the case.
    """

    spearman: pd.DataFrame
    kendall: pd.DataFrame
    pairs: pd.DataFrame
    n_transactions: int
    bound: float
    query_transaction_id: str = ""
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def disagreements(self) -> pd.DataFrame:
        """The pairs flagged ``"methods disagree"``."""
        return self.pairs[self.pairs["status"] == "methods disagree"].reset_index(drop=True)


def _corr(fn, a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(fn(a, b).statistic)


def method_agreement(explanations: Mapping[str, Any], *, bound: float = DISAGREE_BOUND) -> AgreementResult:
    """Spearman / Kendall matrices of the methods' transaction rankings on one query.

    Args:
        explanations: ``{method: Explanation}`` of one query (all over the same context), or
            ``{method: [T] values}`` (query last).
        bound: Spearman rho below which a pair is flagged (default :data:`DISAGREE_BOUND`).
    Returns:
        :class:`AgreementResult`.
    Raises:
        ValueError: fewer than 1 method, or values of different lengths / contexts.
    """
    if not explanations:
        raise ValueError("explanations: expected at least one method")
    names = list(explanations)
    vals, ids = {}, set()
    for m, e in explanations.items():
        v = np.asarray(getattr(e, "values", e), dtype=np.float64).reshape(-1)
        vals[m] = v[:-1]
        if hasattr(e, "transaction_ids"):
            ids.add(tuple(e.transaction_ids))
    if len({len(v) for v in vals.values()}) != 1 or len(ids) > 1:
        raise ValueError("explanations: expected explanations of one and the same context")
    M = len(names)
    sp, kd = np.eye(M), np.eye(M)
    rows = []
    for i, j in itertools.combinations(range(M), 2):
        a, b = vals[names[i]], vals[names[j]]
        s, k = _corr(spearmanr, a, b), _corr(kendalltau, a, b)
        sp[i, j] = sp[j, i] = s
        kd[i, j] = kd[j, i] = k
        status = "undefined" if math.isnan(s) else ("methods disagree" if s < bound else "agree")
        rows.append({"method_a": names[i], "method_b": names[j], "spearman": s, "kendall": k, "status": status})
    first = next(iter(explanations.values()))
    return AgreementResult(
        spearman=pd.DataFrame(sp, index=names, columns=names),
        kendall=pd.DataFrame(kd, index=names, columns=names),
        pairs=pd.DataFrame(rows, columns=["method_a", "method_b", "spearman", "kendall", "status"]),
        n_transactions=len(next(iter(vals.values()))),
        bound=bound,
        query_transaction_id=str(getattr(first, "query_transaction_id", "")),
    )


__all__ = ["DISAGREE_BOUND", "AgreementResult", "method_agreement"]
