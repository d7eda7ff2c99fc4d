"""The context of a query transaction: exactly the history the scorer used for it.

A query at position ``p`` of its entity's history is scored in window ``k(p)``
(:mod:`engine.model.sequences`). Its context is that window cut right after the query: ``T``
transactions in time order, query last, with ``prev_time_s`` for the transaction before the
window. Scoring the context gives the same logit as whole-file scoring (tested), so every
explanation explains the score the analyst sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from engine.model.checkpoint import ModelBundle
from engine.data.features import EncodedFrame
from engine.model.sequences import TransactionBatch
from engine.model.sequences import entity_bounds, make_batch, window_of_position


@dataclass
class QueryContext:
    """One query transaction and its context.

    Attributes:
        bundle: the model bundle.
        batch: ``[1, T]`` :class:`TransactionBatch` (all present, query last).
        rows: the ``T`` canonical-frame rows of the context (time order, query last).
        transaction_ids: ``[T]`` ids (== ``rows.transaction_id``).
        entity_id: the entity.
        field_names: the ``F`` model fields.
        n_before_context: the entity's transactions before the context's first (the model's window
            starts after them: "new merchant" in the context means new among the rows shown).
    """

    bundle: ModelBundle
    batch: TransactionBatch
    rows: pd.DataFrame
    transaction_ids: list[str]
    entity_id: str
    field_names: list[str]
    n_before_context: int = 0

    @property
    def T(self) -> int:
        return len(self.transaction_ids)

    @property
    def query_transaction_id(self) -> str:
        return self.transaction_ids[-1]

    def logits(self, present: torch.Tensor | None = None) -> torch.Tensor:
        """Query logits ``[B]`` for presence masks ``present [B, T]`` bool (default: all present).

        A transaction with ``present=False`` is removed from the history (see engine.model.transformer)."""
        with torch.no_grad():
            return self.bundle.model.query_logits(self.batch, present)

    def score_logit(self) -> float:
        return float(self.logits()[0])


def build_context(bundle: ModelBundle, frame: pd.DataFrame, transaction_id: str, enc: EncodedFrame | None = None) -> QueryContext:
    """Context of ``transaction_id`` in a canonical frame (sorted by entity, timestamp).

    Raises:
        KeyError: the transaction id is not in the frame.
    """
    hits = np.flatnonzero(frame["transaction_id"].to_numpy() == str(transaction_id))
    if len(hits) == 0:
        raise KeyError(f"transaction_id {transaction_id!r} not found")
    q = int(hits[0])
    ent = frame["entity_id"].iloc[q]
    starts, lengths = entity_bounds(frame["entity_id"].to_numpy())
    e = int(np.searchsorted(starts, q, side="right") - 1)
    s0 = int(starts[e])
    p = q - s0
    cfg = bundle.config
    k = int(window_of_position(p, cfg.context_length, cfg.min_history))
    wstart = s0 + k * (cfg.context_length - cfg.min_history)
    rows_idx = np.arange(wstart, q + 1)
    sub = frame.iloc[max(s0, wstart - 1) : q + 1]
    sub_enc = bundle.encoder.transform(sub) if enc is None else EncodedFrame(
        enc.cat[sub.index.min() : q + 1], enc.num[sub.index.min() : q + 1],
        enc.multi[sub.index.min() : q + 1], enc.time_s[sub.index.min() : q + 1])
    off = wstart - max(s0, wstart - 1)  # 1 if the row before the window is in `sub`
    local_rows = (np.arange(len(rows_idx)) + off)[None, :]
    batch = make_batch(sub_enc, local_rows, np.array([0]))
    rows = frame.iloc[rows_idx].reset_index(drop=True)
    return QueryContext(
        bundle=bundle,
        batch=batch,
        rows=rows,
        transaction_ids=rows["transaction_id"].astype(str).tolist(),
        entity_id=str(ent),
        field_names=list(bundle.model.cfg.field_names),
        n_before_context=int(wstart - s0),
    )
