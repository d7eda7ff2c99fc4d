"""The case page's and the report's "which fields, and does the history matter" block.

:func:`query_fields` computes, for one query transaction, the history effect
(:mod:`engine.trust.history_effect`: the query alone vs with its history) and the validated
per-field attributions (:mod:`engine.explain.field_attribution`: IG of the query's fields from
the typical transaction if it passes the check against field ablation, else exact field Shapley
values, else only the ablation effects; cell-level Shapley values of the top earlier
transactions), as one JSON-able dict — what the page draws (:func:`field_figure`,
:func:`cells_figure`) and the report stores (``history_effect`` and ``field_attribution``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.cases.fmt import format_threshold
from engine.cases.figures import FRAUD_COLOR, LEGIT_COLOR, _layout, plain_text
from engine.cases.redact import mask_field_value
from engine.cases.view import field_value_texts

#: the sentence shown for every method's per-field values
UNITS_NOTE = "in logits (log-odds): + pushed towards fraud, − towards legitimate"


def usual_amount_text(ctx) -> str:
    """The query's amount versus the mean of its earlier context transactions, as the model
    computes ``amount_vs_history`` (standardised ``log1p(|amount|)`` difference), in words:
    ``"4.8× the usual amount"``; ``"no history"`` for a first transaction."""
    z = ctx.batch.num[0, :, 0].double().numpy()  # [T] standardised log1p |amount|
    present = ctx.batch.present[0].numpy()
    earlier = z[:-1][present[:-1]]
    if not len(earlier):
        return "no history"
    dev = float(z[-1] - earlier.mean()) * float(ctx.bundle.encoder.state["amount_log_std"])
    return f"{math.exp(dev):.1f}× the usual amount"


def activity_texts(ctx) -> dict[str, str]:
    """Display text of the model-computed activity fields of the query (``recent_activity``,
    ``first_seen``; :mod:`engine.model.activity`) from its context: earlier transactions within 1 h
    and 24 h, and the first-seen fields ("new: merchant, mcc" or "nothing new")."""
    names, out = ctx.field_names, {}
    present = ctx.batch.present[0].numpy()
    t = ctx.batch.time_s[0].numpy()
    earlier = present[:-1]
    if "recent_activity" in names:
        gap = t[-1] - t[:-1][earlier]
        out["recent_activity"] = f"{int((gap <= 3600).sum())} earlier in 1 h, {int((gap <= 86400).sum())} in 24 h"
    if "first_seen" in names:
        cfg = ctx.bundle.config
        cat = ctx.batch.cat[0].numpy()  # [T, Fc]
        new = [names[cfg.cat_field_index[j]] for j in cfg.first_seen_cols
               if earlier.any() and not (cat[:-1][earlier, j] == cat[-1, j]).any()]
        out["first_seen"] = ("no history" if not earlier.any() else
                             "new: " + ", ".join(new) if new else "nothing new")
    return out


def query_fields(bundle, frame: pd.DataFrame, transaction_id: str, *, cells: bool = True,
                 currency: str = "") -> dict[str, Any]:
    """History effect and validated per-field attributions of ``transaction_id`` (module docstring).

    Args:
        bundle: the model bundle. frame: the canonical frame the model scores (its rows also give
            the typical transaction where the checkpoint stores none). cells: also the cell-level
            values of the top earlier transactions.
    Returns:
        ``{"history_effect": {...}, "field_attribution": {...}}``, JSON-able; the field block adds
        ``values`` (the query's own value of each field, text) and ``cell_labels`` (time · amount
        of the top transactions).
    Raises:
        KeyError: the transaction is not in ``frame``.
    """
    from engine.explain.context import build_context
    from engine.explain.field_attribution import explain_fields
    from engine.explain.reference import attach_reference
    from engine.trust.history_effect import history_effect

    attach_reference(bundle, frame)  # the loaded data's typical transaction (unless the checkpoint has one)
    ctx = build_context(bundle, frame, str(transaction_id))
    he = history_effect(ctx)
    fa = explain_fields(ctx, cells=cells)
    rows = ctx.rows
    prev = rows["timestamp"].iloc[-2] if len(rows) > 1 else None
    vals = field_value_texts(rows.iloc[-1], fa.field_names, currency, prev)
    if "amount_vs_history" in fa.field_names:
        vals[fa.field_names.index("amount_vs_history")] = usual_amount_text(ctx)
    for name, text in activity_texts(ctx).items():
        vals[fa.field_names.index(name)] = text
    d = fa.to_dict()
    d["values"] = vals
    d["reference"] = {k: mask_field_value(k, str(v)) for k, v in d["reference"].items()}
    if "amount_vs_history" in fa.field_names:  # its reference is 0 = the entity's usual amount
        d["reference"].setdefault("amount_vs_history", "the entity's usual amount")
    if fa.cells is not None:
        d["cell_labels"] = {str(p): f"{str(rows['timestamp'].iloc[p])[:16]} · {rows['amount'].iloc[p]:.2f} {currency}".strip()
                            for p in fa.cells.positions}
        d["cell_values"] = {f"{p}:{f}": mask_field_value(f, str(field_value_texts(rows.iloc[p], [f], currency)[0]))
                            for p, f in fa.cells.cells}
    return {"history_effect": he.to_dict(), "field_attribution": d}


def field_figure(fields: dict[str, Any]) -> go.Figure:
    """Horizontal bars of the *shown* per-field values of the query (``field_attribution`` of
    :func:`query_fields`), labelled ``field = value (typical: reference)``."""
    fa = fields["field_attribution"]
    x = np.asarray(fa["shown_values"], dtype=float)
    names = [f"{plain_text(n)} = {plain_text(v)} (typical: {plain_text(fa['reference'].get(n, '?'))})"
             for n, v in zip(fa["field_names"], fa["values"])]
    fig = go.Figure(go.Bar(x=x, y=names, orientation="h", marker_color=np.where(x >= 0, FRAUD_COLOR, LEGIT_COLOR).tolist(),
                           hovertemplate="%{y}: %{x:+.4f} logit<extra></extra>"))
    fig.add_vline(x=0, line=dict(color="#607d8b", width=1))
    fig.update_yaxes(autorange="reversed", tickfont=dict(size=11))
    fig.update_xaxes(title_text="logit")
    from engine.explain.field_attribution import SHOWN_LABEL

    return _layout(fig, f"{SHOWN_LABEL.get(fa['shown'], fa['shown'])} · the query's own fields",
                   height=int(max(240, 70 + 26 * len(names))))


def cells_figure(fields: dict[str, Any]) -> go.Figure | None:
    """Bars of the cell-level Shapley values (transaction · field = value), or ``None``."""
    fa = fields["field_attribution"]
    c = fa.get("cells")
    if not c or not c["cells"]:
        return None
    labels = fa.get("cell_labels", {})
    cv = fa.get("cell_values", {})
    names = [f"{plain_text(labels.get(str(p), p))} · {plain_text(f)} = {plain_text(cv.get(f'{p}:{f}', '?'))}"
             for p, f in c["cells"]]
    x = list(c["values"])
    if c.get("other") is not None:
        names.append("other fields of these transactions")
        x.append(c["other"])
    x = np.asarray(x, dtype=float)
    fig = go.Figure(go.Bar(x=x, y=names, orientation="h", marker_color=np.where(x >= 0, FRAUD_COLOR, LEGIT_COLOR).tolist(),
                           hovertemplate="%{y}: %{x:+.4f} logit<extra></extra>"))
    fig.add_vline(x=0, line=dict(color="#607d8b", width=1))
    fig.update_yaxes(autorange="reversed", tickfont=dict(size=10))
    fig.update_xaxes(title_text="logit")
    return _layout(fig, "Cell-level Shapley values · fields of the most influential earlier transactions",
                   height=int(max(240, 70 + 24 * len(names))))


def cached_query_fields(cache: Any, bundle: Any, frame: pd.DataFrame, source_id: str, transaction_id: str,
                        params: dict[str, Any], currency: str = "") -> tuple[dict[str, Any], str]:
    """:func:`query_fields` of one transaction through the explanation cache (kind
    :data:`engine.cases.explain_cache.FIELDS_KIND`, keyed as its explanations: model, source,
    transaction, ``params``): the stored block, else computed and stored. Returns ``(fields,
    how)``, ``how`` ``"stored"`` or ``"computed"``. A cache that cannot be read or written is a
    miss (logged), never an error: the Case page and ``fraudlens report`` both read it so."""
    import logging
    import time

    from engine.cases.explain_cache import FIELDS_KIND

    log = logging.getLogger("fraudlens.cases")
    try:
        stored = cache.get_json(bundle.sha256, source_id, transaction_id, params, FIELDS_KIND)
    except Exception as e:  # noqa: BLE001 - an unreadable cache is a miss
        log.warning("explanation cache unavailable: %s", e)
        cache = stored = None
    if stored is not None:
        return stored, "stored"
    t0 = time.perf_counter()
    out = query_fields(bundle, frame, transaction_id, currency=currency)
    if cache is not None:
        try:
            cache.put_json(bundle.sha256, source_id, transaction_id, params, FIELDS_KIND, out, time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - an unwritable cache: the result is still used
            log.warning("fields of %s not stored: %s", transaction_id, e)
    return out, "computed"


def history_caption(fields: dict[str, Any]) -> str:
    """One line of numbers under the history sentence."""
    h = fields["history_effect"]
    w = h["word"]
    return (f"Alone (no earlier transaction): {w} {h['alone']:.3f} (logit {h['alone_logit']:+.3f}) · with its "
            f"{h['n_history']} earlier transaction(s): {h['with_history']:.3f} (logit {h['with_logit']:+.3f}) · "
            f"difference {h['difference']:+.3f} · review threshold {format_threshold(h['threshold'])}.")


def reference_caption(fields: dict[str, Any]) -> str:
    """Where the typical transaction comes from and what it scores, in one sentence."""
    fa = fields["field_attribution"]
    srcs = sorted(set(fa["reference_sources"].values()))
    return (f"Reference = a typical transaction on this history (score logit {fa['reference_logit']:+.3f}; the "
            f"query scores {fa['score_logit']:+.3f}): " + "; ".join(srcs) + ".")


__all__ = ["UNITS_NOTE", "activity_texts", "cells_figure", "field_figure", "history_caption", "query_fields", "reference_caption",
           "usual_amount_text"]
