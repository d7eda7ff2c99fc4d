"""Case page, Attention tab: the query's row of attention as bars over the earlier transactions.

The query row of :func:`engine.cases.figures.attention_matrix` (how much the query attends to each
earlier transaction, weights of one softmax row, so they sum to at most 1 over the earlier ones
plus the query itself) is what an analyst reads; the full ``[T, T]`` map (every transaction
attending to every earlier one) is optional behind a toggle. Attention weights are not
attributions (the caveat is shown above the tab); nothing here imports torch.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from engine.cases import figures as fig


def query_row(expl: Any, layer: int | None = None, head: int | None = None) -> np.ndarray:
    """The query's attention weights over the earlier transactions, ``[T - 1]`` float64 (the last
    row of :func:`engine.cases.figures.attention_matrix`, its own weight dropped)."""
    z = np.asarray(fig.attention_matrix(expl, layer, head), dtype=np.float64)
    return z[-1, :-1] if z.shape[-1] > 1 else np.zeros(0)


def row_figure(expl: Any, labels: Sequence[str], title: str, layer: int | None = None,
               head: int | None = None) -> go.Figure:
    """Bars: one per earlier transaction (time order), height = the query's attention weight."""
    w = query_row(expl, layer, head)
    x = list(labels)[:len(w)]
    f = go.Figure(go.Bar(x=x, y=w, marker_color="#6a51a3",
                         hovertemplate="%{x}<br>weight %{y:.3f}<extra></extra>"))
    f.update_layout(title=dict(text=title, y=0.97), height=300, margin=dict(l=50, r=20, t=50, b=60),
                    yaxis_title="attention weight", showlegend=False)
    f.update_xaxes(showticklabels=len(x) <= 40)
    return f


def render_attention(expls: dict, labels: Sequence[str], config: dict) -> None:
    """The Attention tab body: layer / head pickers, the query row as bars (attention and
    rollout), and the full maps behind a toggle."""
    a = expls.get("attention")
    ro = expls.get("attention_rollout")
    if a is None and ro is None:
        st.info("No attention weights for this query.")
        return
    layer = head = None
    if a is not None:
        L, H = fig.attention_shape(a)
        c1, c2 = st.columns(2)
        layer = c1.selectbox("Layer", list(range(L)), index=L - 1, format_func=lambda i: f"layer {i + 1}",
                             key="attn_layer")
        head = c2.selectbox("Head", [None, *range(H)], key="attn_head",
                            format_func=lambda h: "mean over heads" if h is None else f"head {h + 1}")
        t = f"What the query attends to · layer {layer + 1} · " + ("mean over heads" if head is None
                                                                    else f"head {head + 1}")
        st.plotly_chart(row_figure(a, labels, t, layer, head), key="attn_row", config=config)
    if ro is not None:
        st.plotly_chart(row_figure(ro, labels, "Attention rollout (all layers), query row"),
                        key="attn_rollout_row", config=config)
    if st.toggle("Show the full transaction × transaction maps", value=False, key="attn_full",
                 help="Every transaction's attention over the earlier ones (rows attend to columns)."):
        if a is not None:
            st.plotly_chart(fig.attention_heatmap(a, layer, head, labels=labels), key="attn_heat", config=config)
        if ro is not None:
            st.plotly_chart(fig.attention_heatmap(ro, labels=labels, title="Attention rollout (all layers)"),
                            key="attn_rollout", config=config)


__all__ = ["query_row", "render_attention", "row_figure"]
