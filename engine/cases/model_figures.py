"""Pure Plotly figures of the Model page ("the model at a glance"): DataFrames / dicts in,
``go.Figure`` out, no Streamlit. Conventions as in :mod:`engine.cases.figures` (plotted arrays
stored unchanged so tests read them back from ``fig.data``; text shown literally).

``word`` is ``"probability"`` for a calibrated model, else ``"score"``
(:func:`engine.model.calibration.probability_word`): axes say which.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.cases.figures import FRAUD_COLOR, LEGIT_COLOR, NEUTRAL_COLOR, QUERY_COLOR, THRESHOLD_COLOR, _layout, plain_text

__all__ = ["pr_curve_figure", "reliability_figure", "importance_figure", "psi_figure"]

_SERIES_COLORS = (NEUTRAL_COLOR, FRAUD_COLOR, LEGIT_COLOR, QUERY_COLOR)


def pr_curve_figure(curve: pd.DataFrame, threshold: float | None = None, *, word: str = "probability",
                    title: str | None = None) -> go.Figure:
    """Precision (y) against recall (x) of :func:`engine.cases.model_glance.operating_curve`
    (columns threshold, precision, recall, alerts_per_day); hover shows the threshold and
    alerts per day; ``threshold`` is marked at the curve's point nearest above it (the
    lowest plotted threshold >= it)."""
    c = curve.sort_values("recall", kind="stable")
    fig = go.Figure(go.Scatter(
        x=c["recall"].to_numpy(), y=c["precision"].to_numpy(), mode="lines", name="precision-recall",
        line=dict(color=LEGIT_COLOR, shape="hv"), customdata=np.c_[c["threshold"], c["alerts_per_day"]],
        hovertemplate=f"{word} ≥ %{{customdata[0]:.4f}}<br>recall %{{x:.3f}} · precision %{{y:.3f}}"
                      "<br>%{customdata[1]:,.1f} alerts/day<extra></extra>"))
    if threshold is not None and len(c):
        above = c[c["threshold"] >= threshold]
        if len(above):
            pt = above.loc[above["threshold"].idxmin()]
            fig.add_trace(go.Scatter(
                x=[pt["recall"]], y=[pt["precision"]], mode="markers", name=f"threshold {threshold:.4f}",
                marker=dict(color=QUERY_COLOR, size=11, line=dict(color=THRESHOLD_COLOR, width=1)),
                hovertemplate="recall %{x:.3f} · precision %{y:.3f}<extra></extra>"))
    fig.update_xaxes(title_text="recall (share of frauds flagged)", range=[0, 1.02])
    fig.update_yaxes(title_text="precision (share of alerts that are fraud)", range=[0, 1.02])
    return _layout(fig, title, height=320)


def reliability_figure(tables: Mapping[str, Sequence[Mapping[str, Any]]], *, ece: Mapping[str, float] | None = None,
                       title: str | None = None) -> go.Figure:
    """Reliability diagram: observed fraud rate (y) against mean output (x) per bin, one
    series per entry of ``tables`` (name -> :func:`engine.model.calibration.reliability_table`),
    the diagonal = perfectly calibrated; empty bins are left out; marker size grows with the
    bin's transactions (hover gives the count); ``ece`` (name -> value) is shown in the legend."""
    fig = go.Figure(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="calibrated (diagonal)",
                               line=dict(color="#b0bec5", dash="dot"), hoverinfo="skip"))
    for i, (name, rows) in enumerate(tables.items()):
        r = [x for x in rows if x.get("n")]
        n = np.array([x["n"] for x in r], dtype=float)
        label = plain_text(name) + (f" (ECE {ece[name]:.4f})" if ece and ece.get(name) is not None else "")
        fig.add_trace(go.Scatter(
            x=[x["mean_probability"] for x in r], y=[x["fraud_rate"] for x in r], mode="lines+markers", name=label,
            marker=dict(size=(6 + 4 * np.log10(np.maximum(n, 1))).tolist(), color=_SERIES_COLORS[(i + 1) % 4]),
            line=dict(color=_SERIES_COLORS[(i + 1) % 4]), customdata=np.c_[n, [x["bin_low"] for x in r],
                                                                            [x["bin_high"] for x in r]],
            hovertemplate="bin [%{customdata[1]:.1f}, %{customdata[2]:.1f})<br>mean %{x:.3f} · fraud rate %{y:.3f}"
                          "<br>%{customdata[0]:,} transactions<extra></extra>"))
    fig.update_xaxes(title_text="mean output in the bin", range=[0, 1])
    fig.update_yaxes(title_text="observed fraud rate", range=[0, 1])
    return _layout(fig, title, height=340)


def importance_figure(fields: pd.DataFrame, *, word: str = "probability", title: str | None = None) -> go.Figure:
    """Horizontal bars of ``mean_abs_logit`` per field (largest on top) from
    :func:`engine.cases.model_glance.global_importance`; the bar text gives the signed mean in
    logits and its ``probability_reading`` in points of the model's ``word``."""
    f = fields.sort_values("mean_abs_logit", kind="stable")
    text = [f"{m:+.2f} logit ≈ {pr * 100:+.1f} pts of {word}" for m, pr in zip(f["mean_logit"], f["probability_reading"])]
    fig = go.Figure(go.Bar(
        x=f["mean_abs_logit"].tolist(), y=[plain_text(v) for v in f["field"]], orientation="h",
        marker_color=FRAUD_COLOR, text=text, textposition="auto",
        hovertemplate="%{y}: mean |attribution| %{x:.3f} logit<br>%{text}<extra></extra>"))
    fig.update_xaxes(title_text="mean |Integrated Gradients attribution| over flagged cases (logit)")
    return _layout(fig, title, height=int(max(220, 60 + 26 * len(f))))


def psi_figure(table: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """Bars of PSI per field (:func:`engine.cases.model_glance.drift_table`) with the 0.1
    (moderate) and 0.25 (major shift) lines."""
    t = table.sort_values("psi", kind="stable")
    color = [FRAUD_COLOR if v >= 0.25 else QUERY_COLOR if v >= 0.1 else NEUTRAL_COLOR for v in t["psi"]]
    fig = go.Figure(go.Bar(x=t["psi"].tolist(), y=[plain_text(v) for v in t["field"]], orientation="h",
                           marker_color=color, customdata=t["reading"].to_numpy(),
                           hovertemplate="%{y}: PSI %{x:.3f} (%{customdata})<extra></extra>"))
    for x, name in ((0.1, "0.1 moderate"), (0.25, "0.25 major")):
        fig.add_vline(x=x, line=dict(color=THRESHOLD_COLOR, dash="dash", width=1), annotation_text=name,
                      annotation_position="top")
    fig.update_xaxes(title_text="population stability index (training period vs loaded data)")
    return _layout(fig, title, height=int(max(220, 60 + 26 * len(t))))
