"""Key evidence: the earlier transactions an analyst should look at first, and what the model
says without them ("without these 8 transactions the score would be 0.12").

The evidence set is the citable set of the reason codes (:func:`engine.trust.reasons.citable_positions`:
earlier transactions whose attribution is positive beyond twice its standard error, at most
``top_k``, highest first). The query is then re-scored with all of them removed at once under the
removal rule of :mod:`engine.explain.removal` (a removed transaction is deleted from the history:
the time since the previous transaction, the amount-vs-history and the activity fields are
recomputed without it), so the number shown is the model's own output on that history, not a
sum of attributions. ``output_with`` / ``output_without`` are the model's outputs
(:meth:`engine.model.checkpoint.ModelBundle.probability`): calibrated probabilities when the
checkpoint has a calibration map, sigmoid scores otherwise (``word`` says which).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from engine.explain.base import Explanation
from engine.explain.removal import presence_masks, query_logits
from engine.model.scoring import sigmoid
from engine.trust.reasons import Z_CITE, citable_positions


@dataclass
class KeyEvidence:
    """The evidence set of one query and the query's score without it.

    Attributes:
        transaction_ids: the evidence transactions (most fraud-pushing first).
        method: the attribution method that ranked them.
        logit_with / logit_without: the query's logit on the full history / with every evidence
            transaction removed.
        score_with / score_without: the same as sigmoid scores in [0, 1] (uncalibrated).
        output_with / output_without: the model's outputs (calibrated probability or score).
        word: ``"probability"`` (calibrated) or ``"score"``.
    """

    transaction_ids: list[str]
    method: str
    logit_with: float
    logit_without: float
    output_with: float = float("nan")
    output_without: float = float("nan")
    word: str = "score"

    @property
    def score_with(self) -> float:
        return float(sigmoid(np.float64(self.logit_with)))

    @property
    def score_without(self) -> float:
        return float(sigmoid(np.float64(self.logit_without)))

    def to_dict(self) -> dict:
        return {**asdict(self), "score_with": self.score_with, "score_without": self.score_without}


def key_evidence(ctx, explanation: Explanation, top_k: int = 8, z: float = Z_CITE) -> KeyEvidence:
    """The key evidence of ``ctx``'s query by ``explanation`` (module docstring).

    Args:
        ctx: the query context (:class:`engine.explain.context.QueryContext`).
        explanation: an attribution of this context (SHAP, occlusion or IG values ``[T]``).
        top_k: evidence transactions at most. z: citable when value > ``z`` standard errors.
    Returns:
        :class:`KeyEvidence` (empty ``transaction_ids`` and ``logit_without == logit_with`` when
        nothing is citable).
    Raises:
        ValueError: ``explanation`` explains another context.
    """
    if list(explanation.transaction_ids) != list(ctx.transaction_ids):
        raise ValueError(f"explanation ({explanation.method}): explains another context")
    pos = citable_positions(explanation, top_k, z)
    full = np.ones((1, ctx.T - 1), dtype=bool)
    cut = full.copy()
    cut[0, pos] = False
    logits = query_logits(ctx, presence_masks(ctx, np.vstack([full, cut])))
    bundle = ctx.bundle
    out = np.asarray(bundle.probability(logits), dtype=np.float64)
    word = "probability" if bundle.calibrated else "score"
    return KeyEvidence([ctx.transaction_ids[p] for p in pos], explanation.method, float(logits[0]),
                       float(logits[1]), float(out[0]), float(out[1]), word)


__all__ = ["KeyEvidence", "key_evidence"]
