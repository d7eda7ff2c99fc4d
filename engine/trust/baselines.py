"""Model-free orders an explanation has to beat: "most recent first" and "largest amount first".

A fraud episode is usually the last few transactions before the query, so ranking the earlier
transactions by recency alone already scores high on deletion AOPC and on precision@k against
episode ground truth; ranking by amount catches "the large purchases". A method that does not
beat these tells the analyst nothing a sort of the table would not. Both are returned as
:class:`~engine.explain.base.Explanation` objects (``units = "rank score"``, not attributions) so
that :func:`engine.trust.faithfulness.evaluate_faithfulness` and the bench treat them exactly
like the real methods.
"""

from __future__ import annotations

import numpy as np

from engine.explain.base import Explanation
from engine.explain.context import QueryContext

#: name -> plain-language description
BASELINES = {
    "recency": "most recent first (no model)",
    "largest_amount": "largest absolute amount first (no model)",
}


def _explanation(ctx: QueryContext, name: str, values: np.ndarray) -> Explanation:
    return Explanation(
        method=name, entity_id=ctx.entity_id, transaction_ids=list(ctx.transaction_ids),
        query_transaction_id=ctx.query_transaction_id, values=values, units="rank score", signed=False,
        baseline=BASELINES[name], params={"model_free": True}, score_logit=ctx.score_logit(),
    )


def baseline_orders(ctx: QueryContext) -> dict[str, Explanation]:
    """``{"recency": ..., "largest_amount": ...}`` for one query context.

    ``recency``: value ``t`` for position ``t`` (``[T]`` float64), so the latest earlier
    transaction ranks first; ``largest_amount``: ``|amount|`` of each context row (file
    currency). The query's own value is ``0`` in both (it is never removed).
    """
    T = ctx.T
    rec = np.arange(T, dtype=np.float64)
    amt = np.abs(ctx.rows["amount"].to_numpy(np.float64))
    rec[-1] = amt[-1] = 0.0
    return {"recency": _explanation(ctx, "recency", rec), "largest_amount": _explanation(ctx, "largest_amount", amt)}
