"""Which fields of the query — and which fields of which earlier transactions — moved the score.

Three measurements of the query's ``F`` fields, all against the typical transaction of
:mod:`engine.data.field_reference` (replacing field ``f`` = putting the reference transaction's
embedding of field ``f``, :func:`engine.explain.reference.reference_row_embedding`, in place of
the query's; the history stays as it is):

* **field ablation** ``a_f = f(x) - f(x with the query's field f at the reference)`` (logit): the
  direct effect of one field, one re-score per field.
* **Integrated Gradients** of the query's fields (``IGConfig(scope="query")``, path from the
  typical query to the real one, embeddings interpolated before the first LayerNorm).
* **exact field Shapley values** over the query's ``F`` fields (Shapley 1953; the
  feature-level attribution of TimeSHAP, Bento et al. 2021, "TimeSHAP: Explaining Recurrent
  Models through Sequence Perturbations", KDD, arXiv:2012.00073): ``v(S) = f(x with the query's
  fields outside S at the reference)``, all ``2^F`` coalitions evaluated, ``phi_f = sum_S
  |S|! (F-|S|-1)! / F! (v(S + f) - v(S))``; ``sum_f phi_f = f(x) - f(typical query)`` exactly.

**Validation** (:func:`validate`): attributions are compared with the ablation effects; they pass
when the sign agrees on at least :data:`MIN_SIGN_AGREEMENT` of the fields whose ablation moves the
score by at least ``tol`` logit, and their total size ``sum |phi|`` is on the score's scale: at
most ``MAX_MAGNITUDE_RATIO`` times ``max(sum |a|, |f(x) - f(typical query)|)`` (no large
cancelling values) and at least ``1 / MAX_MAGNITUDE_RATIO`` times the smaller of the two (an
efficient attribution splits a joint effect, so it may well be smaller than the sum of the
single-field effects, but not smaller than both). What is shown (:func:`explain_fields`): IG if it passes, else the field
Shapley values if they pass, else only the ablation effects (direct measurements), with the reason.

**Cell level** (:func:`cell_shapley`, TimeSHAP's cell-level explanation): exact Shapley values of
(transaction, field) cells of the ``k`` earlier transactions whose removal moves the score most,
the rest of the history fixed. A cell at the reference is replaced in the *input* (the model
recomputes amount versus history), so an earlier transaction's amount is credited for its effect
on the query's deviation from the usual amount — what IG on embeddings cannot do. Only fields with
input columns are cells (time since previous and amount versus history are computed); the
``max_cells`` cells with the largest single-cell effect are players, the other cells of those
transactions one grouped player, as TimeSHAP groups the pruned events.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.explain.context import QueryContext
from engine.explain.integrated_gradients import IGConfig
from engine.explain.integrated_gradients import explain as explain_ig
from engine.explain.reference import (
    describe_reference,
    field_columns,
    reference_of,
    reference_row_embedding,
    replace_cells,
)
from engine.explain.removal import DEFAULT_BATCH_SIZE, eval_mode, leave_one_out_masks, query_logits

MIN_SIGN_AGREEMENT = 0.9
MAX_MAGNITUDE_RATIO = 3.0
DEFAULT_TOL = 0.02  #: logit: fields whose ablation moves the score less are not counted for signs
MAX_EXACT_PLAYERS = 16  #: 2^16 coalitions at most per exact Shapley computation


@dataclass
class Validation:
    """Attributions ``phi [F]`` against ablation effects ``a [F]`` (logits).

    Attributes:
        sign_agreement: share of the counted fields (``|a_f| >= tol``) where ``sign(phi_f) ==
            sign(a_f)``; NaN when no field is counted.
        n_counted: fields counted. magnitude_ratio: ``sum |phi| / sum |a|`` (inf when ``a`` is 0).
        ok: passes both checks. reason: plain sentence when not ``ok`` ("" otherwise).
    """

    sign_agreement: float
    n_counted: int
    magnitude_ratio: float
    ok: bool
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (non-finite numbers as None)."""
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in self.__dict__.items()}


def validate(values: np.ndarray, ablation: np.ndarray, total: float, *, tol: float = DEFAULT_TOL,
             min_agreement: float = MIN_SIGN_AGREEMENT, max_ratio: float = MAX_MAGNITUDE_RATIO) -> Validation:
    """Check attributions ``values [F]`` against ablation effects ``ablation [F]`` (logits).

    Args:
        total: ``f(x) - f(reference)`` the attributions should add up to (logit).
        tol: fields with ``|ablation| < tol`` logit are not counted for sign agreement.
    Returns:
        :class:`Validation` (see the module docstring for the rule).
    Raises:
        ValueError: shapes differ.
    """
    v, a = np.asarray(values, float), np.asarray(ablation, float)
    if v.shape != a.shape:
        raise ValueError(f"values: expected shape {a.shape}, got {v.shape}")
    counted = np.abs(a) >= tol
    agree = float((np.sign(v[counted]) == np.sign(a[counted])).mean()) if counted.any() else float("nan")
    size, sa, st = float(np.abs(v).sum()), float(np.abs(a).sum()), abs(float(total))
    ratio = size / sa if sa > 0 else float("inf")
    reasons = []
    if not counted.any():
        reasons.append(f"no single field moves the score by {tol} logit or more on its own")
    elif agree < min_agreement:
        reasons.append(f"the sign agrees with field ablation on {agree:.0%} of the {int(counted.sum())} fields "
                       f"that move the score (at least {min_agreement:.0%} required)")
    if size > max_ratio * max(sa, st):
        reasons.append(f"their total size ({size:.2f} logit) is more than {max_ratio:g} times the score's change "
                       f"({max(sa, st):.2f} logit): large values that cancel")
    elif size < min(sa, st) / max_ratio:
        reasons.append(f"their total size ({size:.2f} logit) is less than 1/{max_ratio:g} of the score's change "
                       f"({min(sa, st):.2f} logit)")
    return Validation(agree, int(counted.sum()), ratio, not reasons, "; ".join(reasons))


def _query_row_logits(ctx: QueryContext, x: torch.Tensor, ref_row: torch.Tensor, keep: np.ndarray,
                      batch_size: int = DEFAULT_BATCH_SIZE) -> np.ndarray:
    """Logits ``[n]`` with the query's field ``f`` real where ``keep[k, f]`` else at the reference.

    ``x [1, T, F, D]`` context embeddings, ``ref_row [F, D]``, ``keep [n, F]`` bool."""
    model = ctx.bundle.model
    hist = x[0].sum(dim=1)  # [T, F, D] -> [T, D]
    keep_t = torch.as_tensor(np.asarray(keep, dtype=bool))
    out = np.empty(len(keep_t))
    with eval_mode(model), torch.no_grad():
        for s in range(0, len(keep_t), batch_size):
            k = keep_t[s : s + batch_size].unsqueeze(-1)  # [b, F, 1]
            q = torch.where(k, x[0, -1].unsqueeze(0), ref_row.unsqueeze(0)).sum(dim=1)  # [b, F, D] -> [b, D]
            rows = hist.unsqueeze(0).repeat(len(k), 1, 1)  # [b, T, D]
            rows[:, -1] = q
            out[s : s + len(k)] = model.query_logits(ctx.batch, field_embeddings=rows.unsqueeze(2)).double().numpy()
    return out


def field_ablation(ctx: QueryContext) -> tuple[np.ndarray, float, float]:
    """Field ablation of the query: ``(a [F] float64, f(x), f(typical query))`` in logits, with
    ``a_f = f(x) - f(x with the query's field f at the reference)``."""
    with torch.no_grad():
        x = ctx.bundle.model.embed(ctx.batch)
    ref = reference_row_embedding(ctx)
    F = x.shape[2]
    keep = np.vstack([np.ones(F, bool), ~np.eye(F, dtype=bool), np.zeros(F, bool)])  # all, all but f, none
    lg = _query_row_logits(ctx, x, ref, keep)
    return lg[0] - lg[1 : F + 1], float(lg[0]), float(lg[-1])


def shapley_from_values(v: np.ndarray, P: int) -> np.ndarray:
    """Exact Shapley values ``[P]`` from the value of every coalition ``v [2^P]`` (coalition index
    = bit mask: player ``i`` present iff bit ``i`` is set)."""
    if len(v) != 1 << P:
        raise ValueError(f"v: expected 2^{P} = {1 << P} values, got {len(v)}")
    masks = np.arange(1 << P)
    size = np.array([bin(m).count("1") for m in masks])
    w = np.array([math.factorial(s) * math.factorial(P - s - 1) / math.factorial(P) if s < P else 0.0
                  for s in range(P + 1)])
    phi = np.zeros(P)
    for i in range(P):
        without = masks[(masks >> i) & 1 == 0]
        phi[i] = float((w[size[without]] * (v[without | (1 << i)] - v[without])).sum())
    return phi


def _all_coalitions(P: int) -> np.ndarray:
    """``[2^P, P]`` bool: row ``m`` = the bits of ``m``."""
    return ((np.arange(1 << P)[:, None] >> np.arange(P)[None, :]) & 1).astype(bool)


def field_shapley(ctx: QueryContext) -> np.ndarray:
    """Exact Shapley values ``[F]`` float64 (logits) of the query's fields (module docstring).

    Raises:
        ValueError: more than :data:`MAX_EXACT_PLAYERS` fields.
    """
    with torch.no_grad():
        x = ctx.bundle.model.embed(ctx.batch)
    F = x.shape[2]
    if F > MAX_EXACT_PLAYERS:
        raise ValueError(f"field_shapley: {F} fields, exact Shapley is limited to {MAX_EXACT_PLAYERS}")
    v = _query_row_logits(ctx, x, reference_row_embedding(ctx), _all_coalitions(F))
    return shapley_from_values(v, F)


@dataclass
class CellAttribution:
    """Cell-level Shapley values of the top earlier transactions (logits).

    Attributes:
        positions: ``[k]`` context positions of the top transactions (by leave-one-out effect).
        cells: ``[(position, field name)]`` of the individual players.
        values: ``[len(cells)]`` their Shapley values; ``other``: the grouped player (the other
            cells of those transactions), NaN when there is none.
        total: ``f(x) - f(all those cells at the reference)``; ``sum(values) + other == total``.
        leave_one_out: ``[k]`` ``f(x) - f(x without the transaction)`` of the top transactions.
    """

    positions: list[int]
    cells: list[tuple[int, str]]
    values: np.ndarray
    other: float
    total: float
    leave_one_out: list[float]
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (report); ``other`` None when there is no grouped player."""
        return {"positions": self.positions, "cells": [list(c) for c in self.cells],
                "values": [float(v) for v in self.values],
                "other": None if not math.isfinite(self.other) else float(self.other),
                "total": float(self.total), "leave_one_out": self.leave_one_out, "elapsed_s": self.elapsed_s}


def cell_shapley(ctx: QueryContext, k: int = 3, max_cells: int = 10, batch_size: int = DEFAULT_BATCH_SIZE
                 ) -> CellAttribution | None:
    """Exact Shapley values of (transaction, field) cells of the ``k`` earlier transactions whose
    removal moves the score most (module docstring); ``None`` for a query without history.

    Raises:
        ValueError: ``k < 1`` or ``max_cells`` outside ``1..MAX_EXACT_PLAYERS - 1``.
    """
    if k < 1 or not 1 <= max_cells < MAX_EXACT_PLAYERS:
        raise ValueError(f"k >= 1 and 1 <= max_cells < {MAX_EXACT_PLAYERS} expected, got k={k}, max_cells={max_cells}")
    if ctx.T < 2:
        return None
    t0 = time.perf_counter()
    full = ctx.score_logit()
    loo = full - query_logits(ctx, leave_one_out_masks(ctx), batch_size)  # [T-1]
    top = [int(p) for p in np.argsort(-np.abs(loo), kind="stable")[:k]]
    cols = field_columns(ctx)
    fields = [f for f in range(len(cols)) if any(cols[f])]
    cand = [(t, f) for t in top for f in fields]
    model = ctx.bundle.model

    def value(masks: np.ndarray, cells: list) -> np.ndarray:  # masks [n, C] True = at the reference
        out = np.empty(len(masks))
        with eval_mode(model), torch.no_grad():
            for s in range(0, len(masks), batch_size):
                out[s : s + batch_size] = model.query_logits(replace_cells(ctx, masks[s : s + batch_size], cells)).numpy()
        return out

    single = full - value(np.eye(len(cand), dtype=bool), cand)  # [C] one cell at the reference
    order = np.argsort(-np.abs(single), kind="stable")
    players = [cand[i] for i in order[:max_cells]]
    rest = [cand[i] for i in order[max_cells:]]
    P = len(players) + (1 if rest else 0)
    keep = _all_coalitions(P)  # [2^P, P] True = real value
    cells = players + rest
    grp = np.hstack([keep[:, : len(players)], np.repeat(keep[:, -1:], len(rest), axis=1)]) if rest else keep
    v = value(~grp, cells)
    phi = shapley_from_values(v, P)
    names = ctx.field_names
    return CellAttribution(
        positions=top, cells=[(t, names[f]) for t, f in players], values=phi[: len(players)],
        other=float(phi[-1]) if rest else float("nan"), total=float(v[-1] - v[0]),
        leave_one_out=[float(loo[p]) for p in top], elapsed_s=time.perf_counter() - t0)


@dataclass
class FieldAttribution:
    """The query's per-field attributions, validated, and what to show (:func:`explain_fields`).

    Attributes:
        field_names: ``[F]``. reference: ``{field: typical value as text}``; reference_sources:
            ``{field: where the value comes from}``.
        score_logit: ``f(x)``; reference_logit: ``f(typical query)`` (history as it is).
        ablation: ``[F]`` field ablation effects. ig: ``[F]`` IG of the query's fields (or None).
        ig_delta: IG's convergence delta (logit). shapley: ``[F]`` exact field Shapley values (or None).
        validation: ``{"integrated_gradients": Validation, "field_shapley": Validation}``.
        shown: ``"integrated_gradients"``, ``"field_shapley"`` or ``"field_ablation"``.
        caption: plain sentence on what is shown and why. cells: the cell-level values (or None).
    """

    field_names: list[str]
    reference: dict[str, str]
    reference_sources: dict[str, str]
    score_logit: float
    reference_logit: float
    ablation: np.ndarray
    ig: np.ndarray | None
    ig_delta: float | None
    shapley: np.ndarray | None
    validation: dict[str, Validation] = field(default_factory=dict)
    shown: str = "field_ablation"
    caption: str = ""
    cells: CellAttribution | None = None
    elapsed_s: float = 0.0

    @property
    def shown_values(self) -> np.ndarray:
        """``[F]`` the values the page and report show (logits)."""
        return {"integrated_gradients": self.ig, "field_shapley": self.shapley}.get(self.shown, self.ablation)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (report)."""
        arr = lambda a: None if a is None else [float(v) for v in a]  # noqa: E731
        return {"field_names": self.field_names, "reference": self.reference,
                "reference_sources": self.reference_sources, "score_logit": self.score_logit,
                "reference_logit": self.reference_logit, "ablation": arr(self.ablation),
                "integrated_gradients": arr(self.ig), "ig_convergence_delta": self.ig_delta,
                "field_shapley": arr(self.shapley),
                "validation": {k: v.to_dict() for k, v in self.validation.items()},
                "shown": self.shown, "shown_values": arr(self.shown_values), "caption": self.caption,
                "cells": None if self.cells is None else self.cells.to_dict(), "elapsed_s": self.elapsed_s}


SHOWN_LABEL = {"integrated_gradients": "Integrated gradients", "field_shapley": "Field Shapley values",
               "field_ablation": "Field ablation"}


def explain_fields(ctx: QueryContext, *, ig_steps: int = 50, tol: float = DEFAULT_TOL, cells: bool = True,
                   k: int = 3, max_cells: int = 10, ig_config: IGConfig | None = None) -> FieldAttribution:
    """Ablation, IG and (when IG fails validation) exact field Shapley values of the query's fields,
    validated against ablation, plus cell-level Shapley values of the top ``k`` earlier
    transactions (``cells=True``). See the module docstring; all values in logits.

    ``ig_config``: the IG run whose query row is validated (default ``IGConfig(scope="query")``
    with ``ig_steps``); another baseline (e.g. ``baseline="zero"``) is validated the same way."""
    t0 = time.perf_counter()
    ref = reference_of(ctx)
    abl, f_x, f_ref = field_ablation(ctx)
    total = f_x - f_ref
    ig = explain_ig(ctx, ig_config or IGConfig(n_steps=ig_steps, max_steps=8 * ig_steps, scope="query"))
    ig_v = ig.field_values[-1]
    checks = {"integrated_gradients": validate(ig_v, abl, total, tol=tol)}
    shap_v = None
    if checks["integrated_gradients"].ok:
        shown = "integrated_gradients"
        caption = (f"Integrated gradients of the query's fields (path from the typical transaction), checked "
                   f"against replacing each field by its typical value: signs agree on "
                   f"{checks['integrated_gradients'].sign_agreement:.0%} of the fields that move the score.")
    else:
        shap_v = field_shapley(ctx) if len(abl) <= MAX_EXACT_PLAYERS else None
        if shap_v is not None:
            checks["field_shapley"] = validate(shap_v, abl, total, tol=tol)
        why = checks["integrated_gradients"].reason
        if shap_v is not None and checks["field_shapley"].ok:
            shown = "field_shapley"
            caption = (f"Exact Shapley values of the query's fields (typical transaction as reference). "
                       f"Integrated gradients are not shown: {why}.")
        else:
            shown = "field_ablation"
            extra = f"; field Shapley values: {checks['field_shapley'].reason}" if "field_shapley" in checks else ""
            caption = (f"Only the direct effect of replacing each field by its typical value is shown; no "
                       f"attribution passed the check against it (integrated gradients: {why}{extra}).")
    cell = cell_shapley(ctx, k=k, max_cells=max_cells) if cells else None
    return FieldAttribution(
        field_names=list(ctx.field_names), reference=describe_reference(ctx, ref),
        reference_sources=dict(ref.sources), score_logit=f_x, reference_logit=f_ref, ablation=abl, ig=ig_v,
        ig_delta=ig.convergence_delta, shapley=shap_v, validation=checks, shown=shown, caption=caption,
        cells=cell, elapsed_s=time.perf_counter() - t0)


__all__ = ["CellAttribution", "FieldAttribution", "MAX_MAGNITUDE_RATIO", "MIN_SIGN_AGREEMENT", "SHOWN_LABEL",
           "Validation", "cell_shapley", "explain_fields", "field_ablation", "field_shapley",
           "shapley_from_values", "validate"]
