"""How much does the history matter? The query scored alone and with its history.

* **alone**: the query transaction with no earlier transaction at all — its context reduced to
  the query itself and no transaction before the window (``prev_time_s`` = none), so the fields
  the model computes from the history take their "no history" values (time since previous: "no
  previous transaction"; amount versus history: "no history").
* **with history**: the query in its context, the score the analyst sees.
* **difference** = with history - alone, in the model's output (``bundle.probability``: the
  calibration map's probability when the checkpoint has one, else the score ``sigmoid(logit)``; the
  number the review threshold applies to) and in logits.

When the query alone already reaches the review threshold, the history is not what flags it,
and :func:`history_sentence` says so plainly ("the transaction's own fields drive this score;
its history adds little (+0.03)") instead of leaving the analyst to read history bars that
point nowhere.

Words (:func:`engine.model.calibration.probability_word`): the number is called a *score*
(``sigmoid(logit)``, uncalibrated) unless the checkpoint carries a calibration map, then *probability*.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from engine.explain.context import QueryContext
from engine.explain.removal import eval_mode
from engine.model.calibration import probability_word
from engine.model.sequences import TransactionBatch

#: |difference| below this (score units) reads as "adds little"
LITTLE = 0.05


def score_word(meta: dict | None) -> str:
    """``"probability"`` when the checkpoint carries a calibration map, else ``"score"``."""
    return probability_word(meta)


@dataclass
class HistoryEffect:
    """The query alone versus with its history.

    Attributes:
        transaction_id: the query. n_history: earlier transactions in its context.
        alone_logit / with_logit: logits. alone / with_history: ``bundle.probability`` of them.
        difference: ``with_history - alone``. threshold: the review threshold (score units).
        alone_flagged / with_flagged: at or above the threshold. word: "score" or "probability".
        sentence: the plain-language reading (:func:`history_sentence`).
        adds_little: ``|difference| < LITTLE``.
    """

    transaction_id: str
    n_history: int
    alone_logit: float
    with_logit: float
    alone: float
    with_history: float
    difference: float
    threshold: float
    alone_flagged: bool
    with_flagged: bool
    word: str
    sentence: str
    adds_little: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (report ``history_effect``)."""
        return asdict(self)


def alone_batch(ctx: QueryContext) -> TransactionBatch:
    """``[1, 1]`` batch: the query with no earlier transaction (and none before the window)."""
    b = ctx.batch
    return TransactionBatch(cat=b.cat[:, -1:], num=b.num[:, -1:], multi=b.multi[:, -1:], time_s=b.time_s[:, -1:],
                            present=torch.ones(1, 1, dtype=torch.bool),
                            prev_time_s=torch.full((1,), float("nan"), dtype=torch.float64))


def history_sentence(alone: float, with_history: float, threshold: float, n_history: int, word: str = "score") -> str:
    """The plain reading of alone vs with history (scores in [0, 1], threshold the review threshold)."""
    d = with_history - alone
    if n_history == 0:
        return (f"This is the first transaction of its history: its {word} ({with_history:.3f}) comes from its "
                f"own fields alone.")
    if alone >= threshold:
        tail = (f"its history adds little ({d:+.3f})" if abs(d) < LITTLE else
                f"its history raises it further ({d:+.3f})" if d > 0 else f"its history lowers it ({d:+.3f})")
        return (f"The transaction's own fields drive this {word}: on its own, without any earlier transaction, "
                f"its {word} is {alone:.3f}, already at or above the review threshold {threshold:.3f}; {tail}.")
    if with_history >= threshold:
        return (f"The history matters here: on its own the transaction's {word} would be {alone:.3f}, below the "
                f"review threshold {threshold:.3f}; its {n_history} earlier transaction(s) raise it to "
                f"{with_history:.3f} ({d:+.3f}).")
    return (f"On its own the transaction's {word} would be {alone:.3f}; with its {n_history} earlier "
            f"transaction(s) it is {with_history:.3f} ({d:+.3f}); both below the review threshold {threshold:.3f}.")


def history_effect(ctx: QueryContext, threshold: float | None = None) -> HistoryEffect:
    """Score the query alone and with its history (module docstring).

    Args:
        ctx: the query context. threshold: review threshold in the units of ``bundle.probability``
            (default the bundle's, ``bundle.threshold``).
    Returns:
        :class:`HistoryEffect`.
    """
    thr = float(ctx.bundle.threshold if threshold is None else threshold)
    model = ctx.bundle.model
    with eval_mode(model), torch.no_grad():
        a = float(model.query_logits(alone_batch(ctx))[0])
        w = float(model.query_logits(ctx.batch)[0])
    pa, pw = (float(p) for p in ctx.bundle.probability([a, w]))
    word = score_word(ctx.bundle.meta)
    n = int(ctx.batch.present[0, :-1].sum())
    return HistoryEffect(transaction_id=ctx.query_transaction_id, n_history=n, alone_logit=a, with_logit=w,
                         alone=pa, with_history=pw, difference=pw - pa, threshold=thr, alone_flagged=pa >= thr,
                         with_flagged=pw >= thr, word=word, sentence=history_sentence(pa, pw, thr, n, word),
                         adds_little=abs(pw - pa) < LITTLE)


__all__ = ["HistoryEffect", "alone_batch", "history_effect", "history_sentence", "score_word"]
