"""The network of one case's links: entities and the points (merchants, terminals) they visited
in the case's window, laid out with networkx and drawn as a pure Plotly figure (no Streamlit).

Layout: :func:`networkx.spring_layout` (Fruchterman-Reingold force-directed placement;
networkx.org, ``spring_layout``) with a fixed seed, so the same links draw the same picture.
Every text from the data (entity ids, point values, case states) goes through
:func:`engine.cases.figures.plain_text` (HTML-escaped: Plotly renders a subset of HTML in hover
text) after card-number masking (:func:`engine.cases.redact.mask_card_number`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go

from engine.cases.figures import plain_text
from engine.cases.links import CaseLinks, link_graph
from engine.cases.redact import mask_card_number, mask_luhn_pans

#: node colours: the case's entity, a linked fraud entity, another entity, a point
COLOURS = {"case": "#6a1b9a", "fraud": "#c62828", "entity": "#1565c0", "point": "#757575"}
LAYOUT_SEED = 7


def _text(v: Any) -> str:
    return plain_text(mask_card_number(str(v)))


def network_positions(links: CaseLinks, seed: int = LAYOUT_SEED) -> tuple[Any, dict]:
    """``(graph, {node: (x, y)})``: :func:`engine.cases.links.link_graph` and its spring layout
    (``seed`` fixed; a graph of one node sits at the origin)."""
    import networkx as nx

    g = link_graph(links)
    pos = nx.spring_layout(g, seed=seed, weight="weight") if g.number_of_nodes() > 1 else {n: (0.0, 0.0) for n in g}
    return g, {n: (float(p[0]), float(p[1])) for n, p in pos.items()}


def link_network_figure(links: CaseLinks, point_label: str = "point", height: int = 460,
                        seed: int = LAYOUT_SEED) -> go.Figure:
    """Entities (circles) and points (squares) of a case's window, an edge per visit pair (width
    grows with the visits). The case's entity is purple, linked fraud entities red, other linked
    entities blue; hover names the entity, its case state and highest fraud probability, or the
    point, its rank and lift. ``point_label`` names the point field ("terminal", "merchant")."""
    g, pos = network_positions(links, seed)
    fig = go.Figure()
    ex, ey = [], []
    for a, b in g.edges():
        ex += [pos[a][0], pos[b][0], None]
        ey += [pos[a][1], pos[b][1], None]
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line=dict(color="#bdbdbd", width=1), hoverinfo="skip",
                             showlegend=False))
    groups: dict[str, list] = {k: [] for k in COLOURS}
    for n, d in g.nodes(data=True):
        if d["kind"] == "point":
            rank, lift = d.get("rank"), d.get("lift")
            extra = "" if rank is None or _isna(rank) else f"<br>rank {int(rank)} · lift {float(lift):.2f}"
            # a point (merchant, terminal) by the field rule the tables use: whole unless it could be a card number
            groups["point"].append((n, f"{plain_text(point_label)} {plain_text(mask_luhn_pans(str(n[1])))}{extra}"))
            continue
        key = "case" if d.get("case") else ("fraud" if d.get("fraud_entity") else "entity")
        state = d.get("state")
        prob = d.get("probability")
        txt = (f"{'this case' if d.get('case') else 'entity'} {_text(n[1])}"
               + ("<br>known or confirmed fraud" if d.get("fraud_entity") else "")
               + (f"<br>case state: {_text(state)}" if state else "")
               + (f"<br>max probability {prob:.3f}" if prob is not None else ""))
        groups[key].append((n, txt))
    names = {"case": "this case", "fraud": "fraud entity", "entity": "other entity", "point": point_label}
    for key, items in groups.items():
        if not items:
            continue
        deg = np.array([g.degree(n) for n, _ in items], dtype=float)
        fig.add_trace(go.Scatter(
            x=[pos[n][0] for n, _ in items], y=[pos[n][1] for n, _ in items], mode="markers",
            name=plain_text(names[key]), text=[t for _, t in items], hovertemplate="%{text}<extra></extra>",
            marker=dict(color=COLOURS[key], symbol="square" if key == "point" else "circle",
                        size=(18 if key == "case" else 8 + 2 * np.sqrt(deg)), line=dict(color="white", width=1)),
        ))
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=30, b=10), hovermode="closest",
                      xaxis=dict(visible=False), yaxis=dict(visible=False), legend=dict(orientation="h"),
                      title=dict(text=f"Entities and {plain_text(point_label)}s in the window", font=dict(size=14)))
    return fig


def _isna(x: Any) -> bool:
    import pandas as pd

    return x is None or bool(pd.isna(x))


__all__ = ["COLOURS", "LAYOUT_SEED", "link_network_figure", "network_positions"]
