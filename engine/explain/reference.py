"""The typical-transaction reference in the model's input and embedding spaces.

:mod:`engine.data.field_reference` defines the reference (a typical raw transaction, one value per
field). This module turns it into what the explainers replace fields with:

* :func:`reference_row_embedding`: the per-field embeddings ``[F, D]`` of the reference
  transaction placed after a reference transaction ``time_since_prev_s`` seconds earlier, so
  every field is at its reference, the model-computed ones included (time since previous = the
  median gap, amount versus history = deviation 0; recent activity = that one earlier
  transaction; first seen = nothing new). Replacing field ``f`` of the query means
  putting row ``f`` of this in place of the query's own embedding of field ``f``.
* :func:`reference_context_batch`: the context with every transaction's *content* (every
  field except the timing fields hour, weekday and time since previous) at the reference, its
  timestamps kept: "the same timeline, every transaction a typical one". A real model input.
* :func:`replace_cells`: the context with chosen (transaction, field) cells at the reference in
  the *input* (the model recomputes amount versus history, so an earlier amount set to the
  reference changes the query's deviation from the usual amount too).

The reference itself comes from the checkpoint (stored at training time) or is computed from the
model's statistics and the loaded data (:func:`attach_reference`); without either, from the
context's own rows (stated in ``sources``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from engine.data import field_reference as fr
from engine.data.features import AMOUNT_BY_VALUE_CLIP, amount_by_value_layout
from engine.data.field_reference import FieldReference
from engine.model.activity import ACTIVITY_FIELDS
from engine.model.sequences import TransactionBatch

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from engine.explain.context import QueryContext
    from engine.model.checkpoint import ModelBundle

TIMING_FIELDS = ("hour", "weekday", "time_since_prev")
#: fields computed inside the row encoder from the history (no input columns)
COMPUTED_FIELDS = ("time_since_prev", "amount_vs_history", *ACTIVITY_FIELDS)
_ATTR = "_field_reference"


def attach_reference(bundle: "ModelBundle", frame: "pd.DataFrame | None" = None) -> FieldReference:
    """Set (and return) the reference used for ``bundle``'s explanations: the checkpoint's, or one
    computed from the model's statistics and ``frame`` (the loaded data's rows). Recomputed only
    when ``frame`` differs from the last one (row count, first and last transaction id).

    Raises:
        ValueError: the checkpoint's stored reference is invalid.
    """
    key = None if frame is None else (len(frame), *(str(frame["transaction_id"].iloc[i]) for i in (0, -1))
                                      ) if len(frame) else (0,)
    cached = getattr(bundle, _ATTR, None)
    if cached is not None and getattr(bundle, _ATTR + "_key", None) == key:
        return cached  # same data (rows, first and last transaction id): same reference
    ref = fr.for_model(bundle.meta, bundle.encoder, frame)
    setattr(bundle, _ATTR, ref)
    setattr(bundle, _ATTR + "_key", key)
    return ref


def reference_of(ctx: "QueryContext") -> FieldReference:
    """The reference of ``ctx.bundle`` (attached, stored, or computed from the context's rows)."""
    ref = getattr(ctx.bundle, _ATTR, None)
    if ref is None:
        ref = fr.for_model(ctx.bundle.meta, ctx.bundle.encoder, ctx.rows)
        if ref.origin != "checkpoint":
            ref.sources = {k: v.replace("loaded data", "this case's context rows") for k, v in ref.sources.items()}
    return ref


def describe_reference(ctx: "QueryContext", ref: FieldReference | None = None) -> dict[str, str]:
    """``{field: typical value as text}`` for every model field of ``ctx`` (the encoder's fields and
    the model-computed activity fields: one earlier typical transaction, its values seen before)."""
    ref = ref or reference_of(ctx)
    out = ref.describe(ctx.bundle.encoder)
    gap = out.get("time_since_prev", "")
    extra = {"recent_activity": f"one earlier transaction, {gap} before, same amount",
             "first_seen": "values seen before on this history"}
    return {n: out.get(n, extra.get(n, "")) for n in ctx.field_names}


def _ref_tensors(ctx: "QueryContext", ref: FieldReference):
    e = ref.encode(ctx.bundle.encoder)
    return torch.from_numpy(e.cat[0]), torch.from_numpy(e.num[0]), torch.from_numpy(e.multi[0])


def reference_row_embedding(ctx: "QueryContext", ref: FieldReference | None = None) -> torch.Tensor:
    """``[F, D]`` float32: the reference transaction's per-field embeddings (see module docstring)."""
    ref = ref or reference_of(ctx)
    cat, num, multi = _ref_tensors(ctx, ref)
    two = TransactionBatch(
        cat=cat.expand(1, 2, -1).clone(), num=num.expand(1, 2, -1).clone(), multi=multi.expand(1, 2, -1).clone(),
        time_s=torch.tensor([[0.0, ref.time_since_prev_s]], dtype=torch.float64),
        present=torch.ones(1, 2, dtype=torch.bool), prev_time_s=torch.tensor([float("nan")], dtype=torch.float64))
    with torch.no_grad():
        return ctx.bundle.model.embed(two)[0, 1].detach()


def field_columns(ctx: "QueryContext") -> list[tuple[list[int], list[int], list[tuple[int, int]]]]:
    """Per field ``f`` (``F`` entries): its input columns ``(cat columns, num columns,
    [(multi start, multi end)])`` in :class:`TransactionBatch`; computed fields have none."""
    cfg = ctx.bundle.config
    out: list[tuple[list[int], list[int], list[tuple[int, int]]]] = [([], [], []) for _ in range(cfg.n_fields)]
    for j, f in enumerate(cfg.cat_field_index):
        out[f][0].append(j)
    for j, f in enumerate(cfg.num_field_index):
        out[f][1].append(j)
    start = 0
    for f, w in cfg.multi_slots:
        out[f][2].append((start, start + w))
        start += w
    return out


def replace_cells(ctx: "QueryContext", cells_masks: np.ndarray, cells: list[tuple[int, int]],
                  ref: FieldReference | None = None) -> TransactionBatch:
    """``[n, T]`` batch: for coalition ``k``, the input cells ``cells[i] = (position, field)`` with
    ``cells_masks[k, i]`` True are set to the reference (input columns of the field at that
    transaction); everything else, timestamps and presence included, as in ``ctx.batch``.

    Args:
        cells_masks: ``[n, C]`` bool, True = replace. cells: ``C`` (position, field index) pairs of
            fields with input columns (not the computed ones).
    Raises:
        ValueError: a cell's field has no input columns (time since previous, amount vs history).
    """
    ref = ref or reference_of(ctx)
    rc, rn, rm = _ref_tensors(ctx, ref)
    cols = field_columns(ctx)
    b = ctx.batch
    n = cells_masks.shape[0]
    cat, num, multi = b.cat.repeat(n, 1, 1), b.num.repeat(n, 1, 1), b.multi.repeat(n, 1, 1)
    masks = torch.as_tensor(np.asarray(cells_masks, dtype=bool))
    abv = amount_by_value_layout(ctx.bundle.encoder)
    amount_f = ctx.bundle.config.num_field_index[0] if abv else -1  # num column 0: the standardised log amount
    touched = {}  # (position, field) -> [n] bool: replaced in that coalition
    none = torch.zeros(n, dtype=torch.bool)
    for i, (t, f) in enumerate(cells):
        c_cols, n_cols, m_sl = cols[f]
        if not (c_cols or n_cols or m_sl):
            raise ValueError(f"cells: field {ctx.field_names[f]!r} is computed by the model, it has no input columns")
        rows = masks[:, i]
        for c in c_cols:
            cat[rows, t, c] = rc[c]
        for c in n_cols:
            num[rows, t, c] = rn[c]
        for a, z in m_sl:
            multi[rows, t, a:z] = rm[a:z]
        if abv:
            touched[(t, f)] = touched.get((t, f), none) | rows
    # an amount-by-value column (part of the amount field) depends on the amount and on its categorical
    # field's value: where either was replaced, recompute it from the cells now in place, as encoding
    # that transaction would (engine.data.features.amount_by_value_layout)
    cat_field = ctx.bundle.config.cat_field_index
    positions = sorted({t for t, _ in touched})
    for j, c, mu, inv in abv:
        mu_t, inv_t = torch.as_tensor(mu), torch.as_tensor(inv)
        for t in positions:
            rows = touched.get((t, amount_f), none) | touched.get((t, cat_field[c]), none)
            if bool(rows.any()):
                code = cat[rows, t, c]
                val = (num[rows, t, 0].double() - mu_t[code]) * inv_t[code]
                num[rows, t, j] = val.clamp(-AMOUNT_BY_VALUE_CLIP, AMOUNT_BY_VALUE_CLIP).float()
    return TransactionBatch(cat=cat, num=num, multi=multi, time_s=b.time_s.repeat(n, 1),
                            present=b.present.repeat(n, 1), prev_time_s=b.prev_time_s.repeat(n))


def reference_context_batch(ctx: "QueryContext", ref: FieldReference | None = None) -> TransactionBatch:
    """``[1, T]``: every context transaction's content at the reference, timing kept (module docstring)."""
    names = ctx.field_names
    content = [f for f in range(len(names)) if names[f] not in TIMING_FIELDS + COMPUTED_FIELDS]
    cells = [(t, f) for t in range(ctx.T) for f in content if any(field_columns(ctx)[f])]
    return replace_cells(ctx, np.ones((1, len(cells)), dtype=bool), cells, ref)


__all__ = ["COMPUTED_FIELDS", "TIMING_FIELDS", "attach_reference", "describe_reference", "field_columns", "reference_context_batch",
           "reference_of", "reference_row_embedding", "replace_cells"]
