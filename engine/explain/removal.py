"""The one definition of *removing* a transaction from a query's context.

Removal rule
------------
A transaction is removed by setting its entry of the model's **presence mask** to ``False``
(:class:`engine.model.transformer.TransactionBatch` ``present``). The model then treats it exactly as if
the row had been deleted from the entity's history *within this context window*:

* no transaction attends to it (it is masked out of every attention row);
* the *time since previous transaction* field of the next remaining transaction is recomputed
  from the previous *remaining* transaction (or from the transaction just before the window,
  ``prev_time_s``, if none remains in the window);
* nothing else changes: no positions shift (the model has no position embeddings), the
  window is not re-cut, and every other transaction keeps its fields and timestamp.

So ``f(context without j)`` equals the score of the history with row ``j`` deleted (tested in
``tests/engine/test_model.py`` and, against a re-built context, in
``tests/engine/explain/test_occlusion.py``). The one difference from deleting a row of the raw
file: for a query in a later scoring window (``engine.model.sequences``), deleting a row of the file
would move the window start one row earlier; the removal rule keeps the window the scorer used.

The query (last position) is **never removed**: its logit is the quantity being explained. Every
explainer that removes transactions (occlusion, SHAP, faithfulness curves) goes through
:func:`presence_masks` and :func:`query_logits` here, so they all share this one rule.

Also here: :func:`eval_mode`, the guard every explainer runs the shared model under.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import numpy as np
import torch

if TYPE_CHECKING:  # pragma: no cover
    from engine.explain.context import QueryContext

REMOVAL_RULE = (
    "Removing a transaction = presence mask False: it is treated exactly as if deleted from the "
    "context window (nobody attends to it; the next transaction's time-since-previous is recomputed "
    "from the previous remaining one; no re-windowing). The query itself is never removed."
)

DEFAULT_BATCH_SIZE = 64


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Run ``model`` in eval mode (no dropout) and restore its previous ``training`` flag after.

    Explanations must be deterministic functions of the weights; a bundle's model is normally
    already in eval mode, in which case this changes nothing.
    """
    was_training = model.training
    if was_training:
        model.eval()
    try:
        yield model
    finally:
        if was_training:
            model.train()


def earlier_positions(ctx: "QueryContext") -> np.ndarray:
    """Positions ``[T-1]`` int64 of the context transactions before the query (the removable ones)."""
    return np.arange(ctx.T - 1, dtype=np.int64)


def presence_masks(ctx: "QueryContext", keep: np.ndarray | torch.Tensor, players: np.ndarray | None = None) -> torch.Tensor:
    """Presence masks ``[n, T]`` bool for coalitions of *players* (transactions that may be removed).

    Args:
        ctx: the query context (``T`` transactions, query last).
        keep: ``[n, P]`` coalition matrix (bool or 0/1 numbers): ``keep[k, i]`` is whether player
            ``i`` is present in coalition ``k``. Non-zero = present.
        players: ``[P]`` positions in ``0..T-2`` of the players; default every earlier transaction
            (``P = T - 1``, ``players[i] = i``).
    Returns:
        ``present [n, T]`` bool: non-players are present (the query always), players follow ``keep``,
        and a position already absent in ``ctx.batch`` stays absent.
    Raises:
        ValueError: ``keep`` is not 2-D with ``P`` columns, or a player is the query or out of range.
    """
    T = ctx.T
    players = earlier_positions(ctx) if players is None else np.asarray(players, dtype=np.int64)
    keep_t = torch.as_tensor(np.asarray(keep) if not isinstance(keep, torch.Tensor) else keep)
    if keep_t.ndim != 2 or keep_t.shape[1] != len(players):
        raise ValueError(f"keep: expected shape [n, {len(players)}], got {tuple(keep_t.shape)}")
    if len(players) and (players.min() < 0 or players.max() >= T - 1):
        raise ValueError(f"players: expected positions in 0..{T - 2} (the query at {T - 1} is never removed)")
    base = ctx.batch.present[0].to(torch.bool)  # [T]
    present = base.unsqueeze(0).repeat(keep_t.shape[0], 1)  # [n, T]
    if len(players):
        present[:, torch.as_tensor(players)] = keep_t.to(torch.bool) & base[torch.as_tensor(players)]
    return present


def leave_one_out_masks(ctx: "QueryContext") -> torch.Tensor:
    """``[T-1, T]`` bool: row ``j`` removes earlier transaction ``j`` and keeps everything else."""
    P = ctx.T - 1
    return presence_masks(ctx, ~np.eye(P, dtype=bool))


def query_logits(ctx: "QueryContext", present: torch.Tensor, batch_size: int = DEFAULT_BATCH_SIZE) -> np.ndarray:
    """Query logits ``[n]`` float64 for presence masks ``present [n, T]`` bool, in chunks of ``batch_size``.

    Each mask is scored as the packed history of its present rows (:func:`pack_present`; equal to
    :meth:`engine.explain.context.QueryContext.logits` with the mask, tested), masks sorted by their number
    of present rows so a chunk pads little; no gradients, model in eval mode. Results are in the
    order of ``present``.

    Raises:
        ValueError: ``present`` is not ``[n, T]`` bool, removes the query, or ``batch_size < 1``.
    """
    if present.ndim != 2 or present.shape[1] != ctx.T or present.dtype != torch.bool:
        raise ValueError(f"present: expected bool [n, {ctx.T}], got {present.dtype} {tuple(present.shape)}")
    if present.shape[0] and not bool(present[:, -1].all()):
        raise ValueError("present: the query (last position) must always be present")
    if batch_size < 1:
        raise ValueError(f"batch_size: expected >= 1, got {batch_size}")
    n = present.shape[0]
    if n == 0:
        return np.zeros(0)
    # removal = deletion, so a mask with m present rows is a history of m rows: score the packed
    # histories, masks of similar m together (SHAP coalitions are often small: far less work)
    m = present.sum(dim=1)
    order = torch.argsort(m, stable=True)
    out = torch.empty(n, dtype=torch.float64)
    model = ctx.bundle.model
    with eval_mode(model), torch.no_grad():
        for s in range(0, n, batch_size):
            idx = order[s : s + batch_size]
            out[idx] = model.query_logits(pack_present(ctx.batch, present[idx])).double()
    return out.numpy()


def pack_present(batch, present: torch.Tensor):
    """``[1, T]`` history + presence masks ``[n, T]`` -> a ``[n, M]`` batch of the present rows only.

    Each row holds its mask's present transactions in their order, right-aligned (the query, always
    present, stays last) after absent padding; ``M`` is the largest present count. Under the removal
    rule the query's logit is the same (tested): absent rows are invisible and time-since-previous
    already skips them, so dropping them changes nothing but the cost.

    Args:
        batch: :class:`engine.model.transformer.TransactionBatch` with ``B = 1``.
        present: ``[n, T]`` bool, last column all True.
    Returns:
        ``TransactionBatch`` ``[n, M]``.
    """
    from engine.model.sequences import TransactionBatch

    n, T = present.shape
    m = present.sum(dim=1)  # [n]
    M = int(m.max())
    dest = present.cumsum(dim=1) - 1 + (M - m).unsqueeze(1)  # [n, T] packed position of each present row
    src = torch.zeros(n, M, dtype=torch.long)  # [n, M] source position (padding: 0, never present)
    rows = torch.arange(n).unsqueeze(1).expand(n, T)
    src[rows[present], dest[present]] = torch.arange(T).expand(n, T)[present]
    packed = torch.arange(M).unsqueeze(0) >= (M - m).unsqueeze(1)  # [n, M]
    return TransactionBatch(
        cat=batch.cat[0][src], num=batch.num[0][src], multi=batch.multi[0][src],  # [T, ..] -> [n, M, ..]
        time_s=batch.time_s[0][src], present=packed & batch.present[0][src], prev_time_s=batch.prev_time_s.expand(n),
    )


def coalition_logits(ctx: "QueryContext", keep: np.ndarray, players: np.ndarray | None = None,
                     batch_size: int = DEFAULT_BATCH_SIZE) -> np.ndarray:
    """Coalition value function: query logits ``[n]`` float64 for coalitions ``keep [n, P]`` of
    ``players`` (absent players removed by :data:`REMOVAL_RULE`)."""
    return query_logits(ctx, presence_masks(ctx, keep, players), batch_size=batch_size)
