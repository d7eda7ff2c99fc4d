"""Pure Plotly figures of the trust checks: results in, ``go.Figure`` out (no Streamlit, no
torch: importable by the dashboard).

* :func:`deletion_curve_figure` — the query logit as the top-k earlier transactions are removed,
  in the method's order vs random orders (mean ± 1 sd band) vs the attention order, with the
  method's AOPC in the legend (:mod:`engine.trust.faithfulness`).
* :func:`insertion_curve_figure` — the query logit keeping only the top-k earlier transactions.
* :func:`agreement_heatmap` — the methods' rank-correlation matrix (:mod:`engine.trust.agreement`).
* :func:`randomisation_figure` — rank correlation with the original attributions along the
  cascade of the parameter-randomisation check (:mod:`engine.trust.sanity`).

Every figure keeps the plotted arrays unchanged (logits, correlations), so tests and exports can
read them back from ``fig.data``. Axis titles give the units.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import plotly.graph_objects as go

if TYPE_CHECKING:  # pragma: no cover
    from engine.trust.faithfulness import FaithfulnessResult

METHOD_COLOR = "#c62828"
RANDOM_COLOR = "#78909c"
ATTENTION_COLOR = "#1565c0"
BOUND_COLOR = "#424242"
METHOD_TITLES = {
    "attention": "Attention",
    "attention_rollout": "Attention rollout",
    "integrated_gradients": "Integrated gradients",
    "shap": "SHAP",
    "occlusion": "Occlusion",
}
_FONT = dict(family="sans-serif", size=12)
#: top margin (px) of a titled figure: the title sits in the top 28 px of the figure (``yref
#: "container"``) and a horizontal legend in the band just above the plot, so the two never overlap
TOP_MARGIN = 72


def _title(method: str) -> str:
    return METHOD_TITLES.get(method, method)


def _layout(fig: go.Figure, title: str | None, height: int | None) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, x=0, xanchor="left", yref="container", y=0.98, yanchor="top",
                   font=dict(size=14)) if title else None,
        font=_FONT, height=height, plot_bgcolor="white",
        margin=dict(l=10, r=10, t=TOP_MARGIN if title else 40, b=10),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
    )
    fig.update_xaxes(showline=True, linecolor="#b0bec5", gridcolor="#eceff1", zeroline=False)
    fig.update_yaxes(showline=True, linecolor="#b0bec5", gridcolor="#eceff1", zeroline=False)
    return fig


def _curve_figure(result: "FaithfulnessResult", kind: str, title: str | None, height: int | None) -> go.Figure:
    own = result.deletion if kind == "deletion" else result.insertion
    rnd = result.random_deletion if kind == "deletion" else result.random_insertion
    att = result.attention_deletion if kind == "deletion" else result.attention_insertion
    score = "aopc" if kind == "deletion" else "sufficiency"
    fig = go.Figure()
    k, m, sd = rnd["k"].to_numpy(), rnd["logit"].to_numpy(), rnd["logit_std"].to_numpy()
    fig.add_trace(go.Scatter(x=np.concatenate([k, k[::-1]]), y=np.concatenate([m + sd, (m - sd)[::-1]]),
                             fill="toself", fillcolor="rgba(120,144,156,0.2)", line=dict(width=0),
                             hoverinfo="skip", showlegend=False, name="random ± 1 sd"))
    fig.add_trace(go.Scatter(x=k, y=m, mode="lines", line=dict(color=RANDOM_COLOR, dash="dash"),
                             name=f"random order ({score} {getattr(result, score + '_random'):.2f})"))
    if att is not None and result.method != "attention":
        fig.add_trace(go.Scatter(x=att["k"], y=att["logit"], mode="lines+markers",
                                 line=dict(color=ATTENTION_COLOR, dash="dot"), marker=dict(size=5),
                                 name=f"attention order ({score} {getattr(result, score + '_attention'):.2f})"))
    fig.add_trace(go.Scatter(
        x=own["k"], y=own["logit"], mode="lines+markers", line=dict(color=METHOD_COLOR), marker=dict(size=6),
        customdata=own["transaction_id"].fillna("").to_numpy(),
        hovertemplate="k=%{x}<br>logit %{y:.3f}<br>last " + ("removed" if kind == "deletion" else "kept")
                      + ": %{customdata}<extra></extra>",
        name=f"{_title(result.method)} order ({score} {getattr(result, score):.2f})"))
    fig.add_vrect(x0=0.5, x1=result.k_max + 0.5, fillcolor="rgba(198,40,40,0.05)", line_width=0)
    fig.add_hline(y=result.full_logit, line=dict(color=BOUND_COLOR, width=1, dash="dot"),
                  annotation_text="f(x)", annotation_position="top right")
    xt = ("top-k earlier transactions removed" if kind == "deletion"
          else "top-k earlier transactions kept (all others removed)")
    fig.update_xaxes(title_text=xt)
    fig.update_yaxes(title_text="query score (logit)")
    return _layout(fig, title, height)


def deletion_curve_figure(result: "FaithfulnessResult", *, title: str | None = None, height: int | None = 380) -> go.Figure:
    """Deletion curve of one method vs random (mean ± 1 sd) vs attention order.

    ``result``: a :class:`engine.trust.faithfulness.FaithfulnessResult`. Traces: random band,
    random mean, attention order (omitted when ``result.method == "attention"``), the method's
    order (last). y = query logit; the shaded x range is the AOPC range ``k = 1..K``.
    """
    return _curve_figure(result, "deletion", title, height)


def insertion_curve_figure(result: "FaithfulnessResult", *, title: str | None = None, height: int | None = 380) -> go.Figure:
    """Insertion (keep only top-k) curve; same traces as :func:`deletion_curve_figure`."""
    return _curve_figure(result, "insertion", title, height)


def agreement_heatmap(matrix: pd.DataFrame, *, bound: float | None = None, title: str | None = None,
                      height: int | None = 360, kind: str = "Spearman") -> go.Figure:
    """Heat map of a symmetric method x method rank-correlation matrix (``AgreementResult.spearman``
    or ``.kendall``), colour range [-1, 1], values printed in the cells; cells below ``bound``
    are marked "disagree" in the hover text."""
    names = [_title(m) for m in matrix.columns]
    z = matrix.to_numpy(dtype=np.float64)
    text = np.vectorize(lambda v: "–" if np.isnan(v) else f"{v:.2f}")(z)
    hover = np.where(np.isnan(z), "undefined", np.where(z < bound, "methods disagree", "agree")) if bound is not None \
        else np.full(z.shape, "")
    fig = go.Figure(go.Heatmap(
        z=z, x=names, y=names, zmin=-1, zmax=1, colorscale="RdBu", text=text, texttemplate="%{text}",
        customdata=hover, hovertemplate="%{y} vs %{x}<br>" + kind + " %{z:.3f}<br>%{customdata}<extra></extra>",
        colorbar=dict(title=kind)))
    fig.update_yaxes(autorange="reversed", title_text=None)
    fig.update_xaxes(title_text=None)
    return _layout(fig, title, height)


def randomisation_figure(steps_table: pd.DataFrame, *, bound: float | None = None, title: str | None = None,
                         height: int | None = 360) -> go.Figure:
    """What the randomisation verdict reads: per method and cascade step, the mean over cases of
    ``rho = max(|spearman|, |spearman of magnitudes|)`` with the original attributions and its
    95 % interval as error bars (``RandomisationResult.steps_table``); the ``bound`` a step's
    interval must fall below, as a dashed line."""
    fig = go.Figure()
    d0 = steps_table.sort_values(["method", "step"])
    for m in steps_table["method"].drop_duplicates():
        d = d0[d0.method == m]
        hi = (d["ci_high"] - d["mean_rho"]).clip(lower=0).fillna(0)
        lo = (d["mean_rho"] - d["ci_low"]).clip(lower=0).fillna(0)
        fig.add_trace(go.Scatter(
            x=list(d["randomised"]), y=d["mean_rho"], mode="lines+markers", name=_title(m),
            error_y=dict(type="data", symmetric=False, array=hi.clip(upper=2), arrayminus=lo.clip(upper=2)),
            customdata=np.stack([d["ci_low"], d["ci_high"], d["changed"].astype(str)], axis=-1),
            hovertemplate="%{x}<br>rho %{y:.2f} (interval %{customdata[0]:.2f} to %{customdata[1]:.2f})"
                          "<br>changed: %{customdata[2]}<extra>" + _title(m) + "</extra>"))
    if bound is not None:
        fig.add_hline(y=bound, line=dict(color=BOUND_COLOR, dash="dash"), annotation_text=f"bound {bound}")
    fig.update_xaxes(title_text="randomised, top layer first (cumulative)")
    fig.update_yaxes(title_text="rank correlation |rho| with the original", range=[-0.05, 1.05])
    return _layout(fig, title, height)


__all__ = ["agreement_heatmap", "deletion_curve_figure", "insertion_curve_figure", "randomisation_figure"]
