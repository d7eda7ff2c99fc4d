"""Pure Plotly figure functions: DataFrames / :class:`~engine.explain.base.Explanation` in,
``go.Figure`` out. No Streamlit here: the dashboard and the PDF export draw the same figures.

Conventions (shared by every figure):

* scores are probabilities in [0, 1]; attributions are in logits (log-odds), positive = pushed
  towards fraud, and every axis says which;
* the query transaction is highlighted everywhere in :data:`QUERY_COLOR`;
* transactions of a context are labelled by time and amount (``labels``; see
  :func:`transaction_labels`), falling back to their ids;
* colours: :data:`FRAUD_COLOR` for "towards fraud" / known fraud, :data:`LEGIT_COLOR` for
  "towards legitimate".

Every figure stores the plotted arrays unchanged (no rescaling), so tests and exports can read
them back from ``fig.data``.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from engine.cases.fmt import format_threshold, format_ts

if TYPE_CHECKING:  # figures stay importable without the explainers (and torch)
    from engine.explain.base import Explanation

__all__ = [
    "FRAUD_COLOR",
    "LEGIT_COLOR",
    "QUERY_COLOR",
    "METHOD_TITLES",
    "transaction_labels",
    "plain_text",
    "unique_labels",
    "timeline_figure",
    "attention_heatmap",
    "attention_matrix",
    "attention_shape",
    "attribution_bars",
    "field_heatmap",
    "field_bars",
    "score_distribution",
    "training_history_figure",
]

FRAUD_COLOR = "#c62828"
LEGIT_COLOR = "#1565c0"
QUERY_COLOR = "#ef6c00"
NEUTRAL_COLOR = "#90a4ae"
THRESHOLD_COLOR = "#424242"
#: diverging scale for signed attributions (blue = towards legitimate, red = towards fraud)
SIGNED_SCALE = [[0.0, LEGIT_COLOR], [0.5, "#f7f7f7"], [1.0, FRAUD_COLOR]]
#: sequential scale for probabilities and attention weights
PROB_SCALE = [[0.0, "#cfd8dc"], [0.5, "#ffb74d"], [1.0, FRAUD_COLOR]]
ATTN_SCALE = "Blues"

METHOD_TITLES = {
    "attention": "Attention",
    "attention_rollout": "Attention rollout",
    "integrated_gradients": "Integrated gradients",
    "shap": "SHAP",
    "occlusion": "Occlusion",
}
_FONT = dict(family="sans-serif", size=12)  # system fonts only: nothing from a CDN
#: top margin (px) of a titled figure: the title sits in the top 28 px of the figure (``yref
#: "container"``) and a horizontal legend in the band just above the plot, so the two never overlap
TOP_MARGIN = 72


def _layout(fig: go.Figure, title: str | None = None, height: int | None = None) -> go.Figure:
    fig.update_layout(
        title=dict(text=title, x=0, xanchor="left", yref="container", y=0.98, yanchor="top",
                   font=dict(size=14)) if title else None,
        font=_FONT,
        margin=dict(l=10, r=10, t=TOP_MARGIN if title else 40, b=10),
        height=height,
        plot_bgcolor="white",
        hoverlabel=dict(font_size=12),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
    )
    fig.update_xaxes(showline=True, linecolor="#b0bec5", gridcolor="#eceff1", zeroline=False)
    fig.update_yaxes(showline=True, linecolor="#b0bec5", gridcolor="#eceff1", zeroline=False)
    return fig


# ------------------------------------------------------------------------------------- labels
def format_amount(amount: float, currency: str = "") -> str:
    """``17.23, "USD"`` -> ``"17.23 USD"``; ``-25, "USD"`` -> ``"-25.00 USD"``: the one amount
    format of fraudlens (:func:`engine.cases.fmt.format_amount`; ``"?"`` for a missing amount)."""
    from engine.cases.fmt import format_amount as _fmt

    text = _fmt(amount, currency)
    return "?" if text == "-" else text


def plain_text(text: Any) -> str:
    """``text`` for a Plotly label, title or hover text, shown literally: Plotly renders a subset
    of HTML there (``<a href>``, ``<b>``, ``<br>``, entities), so ``& < >`` become entities
    (``"<a href=x>"`` -> ``"&lt;a href=x&gt;"``, drawn as the literal text)."""
    return html.escape(str(text), quote=False)


def unique_labels(labels: Sequence[str]) -> list[str]:
    """Make labels unique (Plotly merges equal category labels): repeats get `` (2)``, `` (3)``...
    Each label is made plain text first (:func:`plain_text`)."""
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        lab = plain_text(lab)
        n = seen.get(lab, 0) + 1
        seen[lab] = n
        out.append(lab if n == 1 else f"{lab} ({n})")
    return out


def transaction_labels(
    timestamps: Sequence[Any], amounts: Sequence[float], currency: str = "", query_last: bool = False
) -> list[str]:
    """Short unique labels ``"2023-01-08 19:06 UTC · 17.23 USD"`` for transactions (time order kept;
    :mod:`engine.cases.fmt`).

    With ``query_last`` the last label is prefixed ``"▶ query · "``.
    """
    ts = pd.to_datetime(pd.Series(list(timestamps)))
    labs = [
        f"{format_ts(t)} · {format_amount(float(a), currency)}" if not pd.isna(t) else f"? · {a}"
        for t, a in zip(ts, amounts)
    ]
    if query_last and labs:
        labs[-1] = f"▶ query · {labs[-1]}"
    return unique_labels(labs)


def _labels_for(expl: Explanation, labels: Sequence[str] | None) -> list[str]:
    if labels is None:
        labs = list(expl.transaction_ids)
        if labs:
            labs[-1] = f"▶ {labs[-1]} (query)"
        return unique_labels(labs)
    if len(labels) != len(expl.transaction_ids):
        raise ValueError(f"labels: expected {len(expl.transaction_ids)}, got {len(labels)}")
    return unique_labels(labels)


def _sparse_ticks(fig: go.Figure, labels: list[str], axis: str = "x", max_ticks: int = 32) -> None:
    """Label at most ``max_ticks`` categories (evenly spaced, the last - the query - always);
    hover still names every one."""
    n = len(labels)
    if n <= max_ticks:
        return
    step = int(np.ceil(n / max_ticks))
    keep = list(range(n - 1, -1, -step))[::-1]
    vals = [labels[i] for i in keep]
    upd = dict(tickmode="array", tickvals=vals, ticktext=vals)
    (fig.update_xaxes if axis == "x" else fig.update_yaxes)(**upd)


def _units_title(expl: Explanation) -> str:
    if expl.units == "logit":
        return "contribution to the fraud logit"
    return expl.units


# ------------------------------------------------------------------------------------ timeline
#: above this many transactions the timeline's marker trace is WebGL (``scattergl``): thousands of
#: SVG markers keep the browser busy for seconds (a 9,391-transaction card)
WEBGL_MIN_POINTS = 2000


def timeline_figure(
    timeline: pd.DataFrame,
    threshold: float,
    *,
    y: str = "probability",
    query_id: str | None = None,
    currency: str = "",
    hover_columns: Sequence[str] = (),
    title: str | None = None,
) -> go.Figure:
    """Transactions of one entity over time.

    Args:
        timeline: one row per transaction with ``transaction_id``, ``timestamp``, ``amount``,
            ``probability`` and optionally ``label`` (1 = known fraud) and any ``hover_columns``.
        threshold: the model's review threshold (probability); drawn as a horizontal line when
            ``y == "probability"``.
        y: ``"probability"`` or ``"amount"``.
        query_id: transaction to highlight (the query).
        currency: ISO code for amount labels.
        hover_columns: extra columns shown on hover (already display-safe, e.g. masked).
    Returns:
        A figure whose first trace ("transactions") has one marker per row of ``timeline`` in
        its order (``scattergl`` above :data:`WEBGL_MIN_POINTS` rows, else ``scatter``):
        colour = probability, size grows with probability, ``customdata[:, 0]`` = the
        row position in ``timeline`` (selection events map back through it; raw ids never go to
        the browser). Known frauds get a ring ("known fraud" trace), the query a star ("query").
    """
    if y not in ("probability", "amount"):
        raise ValueError(f"y must be 'probability' or 'amount', got {y!r}")
    df = timeline.reset_index(drop=True)
    prob = df["probability"].to_numpy(dtype=float)
    pos = np.arange(len(df))
    hover_cols = [c for c in hover_columns if c in df]
    custom = np.column_stack(
        [pos, [format_amount(a, currency) for a in df["amount"]], prob]
        + [np.asarray([plain_text(v) for v in df[c].astype(str)], dtype=object) for c in hover_cols]
    ) if len(df) else np.empty((0, 3 + len(hover_cols)))
    extra = "".join(f"<br>{plain_text(c)}: %{{customdata[{3 + i}]}}" for i, c in enumerate(hover_cols))
    hover = "%{x|%d %b %Y %H:%M}<br>amount %{customdata[1]}<br>probability %{customdata[2]:.3f}" + extra + "<extra></extra>"
    yvals = df[y].to_numpy(dtype=float)
    size = 7 + 13 * np.nan_to_num(prob, nan=0.0)
    fig = go.Figure()
    scatter = go.Scattergl if len(df) > WEBGL_MIN_POINTS else go.Scatter  # SVG markers stall the browser
    fig.add_trace(
        scatter(
            name="transactions",
            x=df["timestamp"],
            y=yvals,
            mode="markers",
            customdata=custom,
            hovertemplate=hover,
            marker=dict(
                color=prob, cmin=0.0, cmax=1.0, colorscale=PROB_SCALE, size=size,
                line=dict(width=0.5, color="#546e7a"),
                colorbar=dict(title=dict(text="fraud<br>probability"), thickness=12, len=0.8),
            ),
            showlegend=False,
        )
    )
    if "label" in df:
        fraud = df["label"].fillna(0).astype(int).to_numpy() == 1
        if fraud.any():
            fig.add_trace(
                go.Scatter(
                    name="known fraud",
                    x=df["timestamp"][fraud],
                    y=yvals[fraud],
                    mode="markers",
                    customdata=custom[fraud],
                    hovertemplate="known fraud<br>" + hover,
                    marker=dict(symbol="circle-open", size=size[fraud] + 8, color=FRAUD_COLOR, line=dict(width=2)),
                )
            )
    if query_id is not None:
        q = df["transaction_id"].astype(str).to_numpy() == str(query_id)
        if q.any():
            fig.add_trace(
                go.Scatter(
                    name="query",
                    x=df["timestamp"][q],
                    y=yvals[q],
                    mode="markers",
                    customdata=custom[q],
                    hovertemplate="query<br>" + hover,
                    marker=dict(symbol="star", size=20, color=QUERY_COLOR, line=dict(width=1, color="black")),
                )
            )
    if y == "probability":
        fig.add_hline(
            y=threshold, line=dict(color=THRESHOLD_COLOR, dash="dash", width=1),
            annotation_text=f"review threshold {format_threshold(threshold)}", annotation_position="top left",
        )
        fig.update_yaxes(title_text="fraud probability", range=[-0.03, 1.05])
    else:
        fig.update_yaxes(title_text=f"amount ({currency})" if currency else "amount")
    fig.update_xaxes(title_text="time (UTC)")
    # no clickmode / dragmode here: Streamlit sets them for selections (overriding breaks clicks)
    fig = _layout(fig, title, height=360)
    # legend top left: the mode bar sits top right
    fig.update_layout(legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="left", x=0.0))
    return fig


# ----------------------------------------------------------------------------------- attention
def attention_matrix(expl: Explanation, layer: int | None = None, head: int | None = None) -> np.ndarray:
    """The ``[T, T]`` (query row, key column) matrix shown by :func:`attention_heatmap`.

    * ``attention``: ``extras["matrices"][layer, head]``; ``head=None`` = mean over heads;
      ``layer=None`` = last layer. Without matrices, ``extras["per_layer_head"][layer, head]``
      (the query row only) as a ``[1, T]`` matrix.
    * ``attention_rollout``: ``extras["rollout"]`` / ``extras["matrix"]`` if present (``[T, T]``),
      else ``values`` as a ``[1, T]`` matrix (the query row).
    * any other method: ``values`` as ``[1, T]``.
    """
    T = len(expl.transaction_ids)
    ex = expl.extras or {}
    if expl.method == "attention":
        if "matrices" in ex and ex["matrices"] is not None:
            m = np.asarray(ex["matrices"], dtype=float)  # [L, H, T, T]
        elif "per_layer_head" in ex and ex["per_layer_head"] is not None:
            m = np.asarray(ex["per_layer_head"], dtype=float)[:, :, None, :]  # [L, H, 1, T]
        else:
            return expl.values[None, :]
        L = m.shape[0]
        li = L - 1 if layer is None else int(layer)
        if not 0 <= li < L:
            raise ValueError(f"layer {layer} out of range 0..{L - 1}")
        ml = m[li]
        if head is None:
            return ml.mean(axis=0)
        if not 0 <= int(head) < ml.shape[0]:
            raise ValueError(f"head {head} out of range 0..{ml.shape[0] - 1}")
        return ml[int(head)]
    for key in ("rollout", "matrix", "rollout_matrix"):
        v = ex.get(key)
        if v is not None and np.ndim(v) == 2 and np.shape(v) == (T, T):
            return np.asarray(v, dtype=float)
    return expl.values[None, :]


def attention_heatmap(
    expl: Explanation,
    layer: int | None = None,
    head: int | None = None,
    *,
    labels: Sequence[str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """Attention (or rollout) heat map: rows = attending transaction (the query last, boxed),
    columns = attended earlier transaction. ``z`` is exactly :func:`attention_matrix`.

    ``layer``/``head`` are 0-based; ``head=None`` = mean over heads. A ``[1, T]`` matrix (query
    row only) is drawn as a single row.
    """
    z = attention_matrix(expl, layer, head)
    labs = _labels_for(expl, labels)
    rows = labs if z.shape[0] == len(labs) else [labs[-1]]
    if title is None:
        if expl.method == "attention":
            L = attention_shape(expl)[0]
            li = (L - 1 if layer is None else layer) + 1
            title = f"Attention · layer {li} · " + ("mean over heads" if head is None else f"head {head + 1}")
        else:
            title = METHOD_TITLES.get(expl.method, expl.method)
    fig = go.Figure(
        go.Heatmap(
            z=z, x=labs, y=rows, colorscale=ATTN_SCALE, zmin=0.0,
            colorbar=dict(title=dict(text="attention<br>weight"), thickness=12),
            hovertemplate="%{y}<br>attends to %{x}<br>weight %{z:.3f}<extra></extra>",
            xgap=1 if len(labs) <= 40 else 0, ygap=1 if len(rows) <= 40 else 0,
        )
    )
    fig.update_yaxes(autorange="reversed", title_text="attending transaction", tickfont=dict(size=10))
    fig.update_xaxes(title_text="attended transaction (earlier → later)", tickangle=-45, tickfont=dict(size=10))
    _sparse_ticks(fig, labs)
    _sparse_ticks(fig, rows, "y", 48)
    # box the query row
    qi = len(rows) - 1
    fig.add_shape(
        type="rect", xref="x", yref="y", x0=-0.5, x1=len(labs) - 0.5, y0=qi - 0.5, y1=qi + 0.5,
        line=dict(color=QUERY_COLOR, width=2), fillcolor="rgba(0,0,0,0)",
    )
    height = 260 if len(rows) == 1 else int(min(1000, max(380, 200 + 18 * len(rows))))
    return _layout(fig, title, height)


def attention_shape(expl: Explanation) -> tuple[int, int]:
    """``(layers, heads)`` available in an attention explanation (``(1, 1)`` if none)."""
    ex = expl.extras or {}
    for k in ("matrices", "per_layer_head"):
        if ex.get(k) is not None:
            sh = np.shape(ex[k])
            return int(sh[0]), int(sh[1])
    return 1, 1


# ---------------------------------------------------------------------------------------- bars
def attribution_bars(
    expl: Explanation,
    title: str | None = None,
    *,
    labels: Sequence[str] | None = None,
    include_query: bool = True,
    height: int = 320,
) -> go.Figure:
    """One bar per context transaction (time order, query last), height = ``expl.values``.

    Signed methods: red = pushed towards fraud, blue = towards legitimate; the query's bar is
    outlined in :data:`QUERY_COLOR`. The y axis names the units (logit for attributions).
    With ``include_query=False`` only the earlier transactions get bars (``values[:-1]``) and
    the query's own value is written in the title instead (IG gives the query's own fields a
    value that can dwarf the history; SHAP and occlusion give it 0 by construction).

    Explanations with ``standard_errors`` (SHAP) get error bars of **±2 standard errors**
    (``error_y.array = 2 * standard_errors``, about a 95 % interval); the hover shows the value
    ± its standard error and the title says so. Bars whose interval crosses 0 may have either sign.
    """
    labs = _labels_for(expl, labels)
    v = expl.values
    se = expl.standard_errors
    q_value = float(v[-1]) if len(v) else 0.0
    ids = list(expl.transaction_ids)
    if not include_query:
        labs, v, ids = labs[:-1], v[:-1], ids[:-1]
        se = se[:-1] if se is not None else None
    has_se = se is not None and bool(np.any(se > 0))
    if expl.signed:
        colors = np.where(v >= 0, FRAUD_COLOR, LEGIT_COLOR).tolist()
    else:
        colors = [NEUTRAL_COLOR] * len(v)
    line_w = [0.0] * len(v)
    line_c = ["rgba(0,0,0,0)"] * len(v)
    if len(v) and include_query:
        line_w[-1], line_c[-1] = 3.0, QUERY_COLOR
    extra: dict[str, Any] = {}
    hover = "%{x}<br>%{y:+.4f} " + expl.units + "<extra></extra>"
    custom: Any = np.asarray(ids, dtype=object)
    if has_se:
        extra["error_y"] = dict(type="data", array=2.0 * np.asarray(se), visible=True, color="#37474f",
                                thickness=1.2, width=3)
        custom = np.stack([np.asarray(ids, dtype=object), np.asarray(se, dtype=object)], axis=1)
        hover = ("%{x}<br>%{y:+.4f} ± %{customdata[1]:.4f} " + expl.units
                 + " (± 1 standard error; bars ± 2)<extra></extra>")
    fig = go.Figure(
        go.Bar(
            x=labs, y=v, marker=dict(color=colors, line=dict(width=line_w, color=line_c)),
            customdata=custom, hovertemplate=hover, name=METHOD_TITLES.get(expl.method, expl.method), **extra,
        )
    )
    if expl.signed:
        fig.add_hline(y=0, line=dict(color="#607d8b", width=1))
    fig.update_yaxes(title_text="logit" if expl.units == "logit" else expl.units)
    fig.update_xaxes(
        title_text="context transaction (time order" + (", query last)" if include_query else ")"),
        tickangle=-45, tickfont=dict(size=10),
    )
    _sparse_ticks(fig, list(labs))
    if title is None:
        title = METHOD_TITLES.get(expl.method, expl.method)
        if not include_query and q_value != 0.0:
            title += f" · the query's own fields: {q_value:+.3f} {expl.units} (not drawn)"
        if has_se:
            title += " · error bars ±2 standard errors"
    return _layout(fig, title, height=height)


# ------------------------------------------------------------------------------------- fields
def field_heatmap(
    expl: Explanation,
    *,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    scale: str = "all",
) -> go.Figure:
    """Transaction x field attributions: ``z = expl.field_values`` (rows = context transactions
    in time order, query last and boxed; columns = ``expl.field_names``), diverging colours
    centred on 0, in the explanation's units.

    ``scale="history"`` sets the colour range from the earlier transactions only, so their
    pattern stays visible when the query's own row is much larger (the query row then
    saturates; hover shows exact values). ``z`` is never changed.

    Raises:
        ValueError: the explanation has no field resolution, or an unknown ``scale``.
    """
    if expl.field_values is None:
        raise ValueError(f"{expl.method}: no per-field values")
    if scale not in ("all", "history"):
        raise ValueError(f"scale must be 'all' or 'history', got {scale!r}")
    labs = _labels_for(expl, labels)
    z = expl.field_values
    ref = z[:-1] if scale == "history" and len(z) > 1 else z
    lim = float(np.nanmax(np.abs(ref))) if ref.size and np.isfinite(ref).any() else 1.0
    lim = lim or 1.0
    fields = [plain_text(f) for f in (expl.field_names or [])]
    fig = go.Figure(
        go.Heatmap(
            z=z, x=fields, y=labs, colorscale=SIGNED_SCALE, zmid=0.0, zmin=-lim, zmax=lim,
            colorbar=dict(title=dict(text=expl.units), thickness=12),
            hovertemplate="%{y}<br>%{x}: %{z:+.4f} " + expl.units + "<extra></extra>",
            xgap=1, ygap=1 if len(labs) <= 40 else 0,
        )
    )
    qi = len(labs) - 1
    fig.add_shape(
        type="rect", xref="x", yref="y", x0=-0.5, x1=len(fields) - 0.5, y0=qi - 0.5, y1=qi + 0.5,
        line=dict(color=QUERY_COLOR, width=2), fillcolor="rgba(0,0,0,0)",
    )
    fig.update_yaxes(autorange="reversed", tickfont=dict(size=10))
    fig.update_xaxes(side="top", tickangle=-30)
    _sparse_ticks(fig, labs, "y", 48)
    if title is None:
        title = f"{METHOD_TITLES.get(expl.method, expl.method)} per transaction and field ({expl.units})"
    height = int(min(1400, max(320, 150 + 18 * len(labs))))
    fig = _layout(fig, title, height)
    # field names sit on top: put the title above them
    fig.update_layout(margin=dict(t=130), title=dict(yref="container", y=0.99, yanchor="top"))
    return fig


def field_bars(
    expl: Explanation,
    position: int = -1,
    *,
    title: str | None = None,
    values: Sequence[str] | None = None,
) -> go.Figure:
    """One transaction's per-field attributions as horizontal bars (default: the query's own
    fields): ``x = expl.field_values[position]``, one bar per field (top = first field).

    ``values``: optional display text of each field's raw value (e.g. ``"$41.86"``,
    ``"5411"``) shown in the axis labels as ``"field = value"``.
    """
    if expl.field_values is None:
        raise ValueError(f"{expl.method}: no per-field values")
    x = expl.field_values[position]
    names = [plain_text(n) for n in (expl.field_names or [])]
    if values is not None:
        names = [f"{n} = {plain_text(v)}" for n, v in zip(names, values)]
    colors = np.where(x >= 0, FRAUD_COLOR, LEGIT_COLOR).tolist()
    fig = go.Figure(
        go.Bar(
            x=x, y=names, orientation="h", marker_color=colors,
            hovertemplate="%{y}: %{x:+.4f} " + expl.units + "<extra></extra>",
        )
    )
    fig.add_vline(x=0, line=dict(color="#607d8b", width=1))
    fig.update_yaxes(autorange="reversed", tickfont=dict(size=11))
    fig.update_xaxes(title_text="logit" if expl.units == "logit" else expl.units)
    if title is None:
        who = "the query's own fields" if position in (-1, len(expl.values) - 1) else f"transaction {position + 1}"
        title = f"{METHOD_TITLES.get(expl.method, expl.method)} · {who}"
    return _layout(fig, title, height=int(max(240, 70 + 26 * len(names))))


# ------------------------------------------------------------------------------- distributions
def score_distribution(
    probabilities: Sequence[float] | pd.Series,
    threshold: float,
    *,
    highlight: Sequence[float] | None = None,
    highlight_name: str = "this entity",
    bins: int = 50,
    title: str | None = None,
) -> go.Figure:
    """Histogram of fraud probabilities (log-scaled counts) with the review threshold as a
    vertical line; ``highlight`` values (e.g. one entity's transactions) as a rug of ticks."""
    p = np.asarray(pd.Series(probabilities, dtype=float).dropna())
    fig = go.Figure(
        go.Histogram(
            x=p, xbins=dict(start=0.0, end=1.0, size=1.0 / bins), marker_color=NEUTRAL_COLOR,
            name="all transactions", hovertemplate="probability %{x}<br>%{y:,} transactions<extra></extra>",
        )
    )
    if highlight is not None and len(highlight):
        h = np.asarray(highlight, dtype=float)
        fig.add_trace(
            go.Scatter(
                x=h, y=np.zeros_like(h), mode="markers", name=highlight_name, yaxis="y2",
                marker=dict(symbol="line-ns-open", size=14, color=QUERY_COLOR, line=dict(width=2)),
                hovertemplate="%{x:.3f}<extra></extra>",
            )
        )
        fig.update_layout(yaxis2=dict(overlaying="y", range=[0, 1], visible=False))
    fig.add_vline(
        x=threshold, line=dict(color=THRESHOLD_COLOR, dash="dash", width=1),
        annotation_text=f"review threshold {format_threshold(threshold)}", annotation_position="top",
    )
    fig.update_xaxes(title_text="fraud probability", range=[0, 1])
    fig.update_yaxes(title_text="transactions (log scale)", type="log")
    fig.update_layout(bargap=0.05)
    return _layout(fig, title, height=280)


def training_history_figure(history: Sequence[dict] | pd.DataFrame, title: str | None = None) -> go.Figure:
    """Training loss and validation average precision / AUC per epoch (from checkpoint meta); a
    seed ensemble's history (a ``member`` column) gets one set of lines per member."""
    h = pd.DataFrame(history)
    fig = go.Figure()
    groups = list(h.groupby("member", sort=True)) if "member" in h else [(None, h)]
    for member, g in groups:
        tag = "" if member is None else f" (member {int(member) + 1})"
        dash = "solid" if member is None else ("solid", "dash", "dot", "dashdot")[int(member) % 4]
        if "loss" in g:
            fig.add_trace(go.Scatter(x=g["epoch"], y=g["loss"], name="training loss" + tag, mode="lines+markers",
                                     line=dict(color=NEUTRAL_COLOR, dash=dash)))
        for col, name, color in (("val_average_precision", "validation AP", FRAUD_COLOR),
                                 ("val_auc_roc", "validation AUC ROC", LEGIT_COLOR)):
            if col in g:
                fig.add_trace(go.Scatter(x=g["epoch"], y=g[col], name=name + tag, mode="lines+markers",
                                         line=dict(color=color, dash=dash), yaxis="y2"))
    fig = _layout(fig, title, height=280)
    fig.update_xaxes(title_text="epoch", dtick=1)
    fig.update_layout(yaxis=dict(title=dict(text="training loss")),
                      yaxis2=dict(overlaying="y", side="right", range=[0, 1], showgrid=False,
                                  title=dict(text="validation metric")))
    return fig
