"""Case page: links between cases (common point of compromise).

Rendered by :func:`render_case_links` (one call from ``dashboard/pages/case.py``), behind a toggle
(``"links_show"``, off by default: the ranking reads the whole file, a few seconds on 1.75M rows):

* the points (the spec's ``link_points`` field: merchant, terminal) fraud entities shared in the
  days before their first fraud, ranked by lift (:func:`engine.cases.links.rank_points`; fraud
  entities = labelled frauds and the cases disposed "confirmed fraud" in the case store);
* from this case: its points in its window and the other entities that visited them in the same
  days, with their highest fraud probability and case state (:func:`engine.cases.links.case_links`);
* the network of those entities and points (:func:`engine.cases.link_figures.link_network_figure`).

Everything is computed by the engine and cached per (data sha256, spec, max_rows, model sha256,
settings, confirmed cases); data text is shown as text (tables, escaped figure labels, ``md()``).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import state
from dashboard.components.safe import error_text, md
from engine.cases import view as cv

SHOW_KEY = "links_show"
PLOTLY_CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": ["lasso2d", "toImage"]}
#: rows of the ranking table, linked entities listed and drawn
TOP_POINTS, MAX_LINKED, MAX_DRAWN = 20, 200, 40


def _store_views(loaded: "state.Loaded") -> tuple[dict[str, str], pd.DataFrame | None]:
    """Confirmed-fraud cases and every case state of this source and model, from the case store
    if it exists (never created here)."""
    from engine.cases.links import case_states, confirmed_from_store
    from engine.cases.store import default_db_path

    if not default_db_path().is_file():
        return {}, None
    from dashboard.components import data_source_id, get_store

    store, src = get_store(), data_source_id(loaded)
    return confirmed_from_store(store, loaded.bundle.sha256, src), case_states(store, loaded.bundle.sha256, src)


@st.cache_data(show_spinner="Ranking the points fraud entities share…", max_entries=16)
def _ranking(data_sha: str, spec: str, max_rows: int | None, point: str, window_days: int, include_onset: bool,
             confirmed: tuple, _path: str):
    from engine.cases.links import rank_points

    source = state._source(_path, spec, data_sha, max_rows)
    return rank_points(source.frame, source.spec, point=point, confirmed=dict(confirmed), window_days=window_days,
                       include_onset=include_onset)


def _links(loaded, entity: str, query_time, point: str, window_days: int, include_onset: bool, confirmed: dict,
           cases: pd.DataFrame | None):
    from engine.cases.links import case_links

    path, spec, sha, max_rows, model_path, model_sha = loaded.key
    ranking = _ranking(sha, spec, max_rows, point, window_days, include_onset, tuple(sorted(confirmed.items())), path)
    links = case_links(loaded.source.frame, loaded.source.spec, entity, point=point, onsets=ranking.onsets,
                       at=query_time, window_days=window_days, include_onset=include_onset, ranking=ranking,
                       scores=loaded.scores, cases=cases, max_entities=MAX_LINKED)
    return ranking, links


def point_choices(spec: Any) -> list[str]:
    """The spec's ``link_points`` first, then its other categorical fields."""
    cats = [f.name for f in spec.fields if getattr(f.kind, "value", f.kind) == "categorical"]
    first = [p for p in (getattr(spec, "link_points", []) or []) if p in cats]
    return first + [c for c in cats if c not in first]


def ranking_display(table: pd.DataFrame, k: int = TOP_POINTS) -> pd.DataFrame:
    """The first ``k`` ranked points, display-safe (point values masked)."""
    out = table.head(k).copy()
    out["point"] = out["point"].astype(str)
    return cv.mask_frame(out)


def linked_display(linked: pd.DataFrame) -> pd.DataFrame:
    """Linked entities, display-safe: ids masked, case states in words."""
    from dashboard.components import STATE_LABELS

    out = linked.copy()
    out.insert(0, "entity", out["entity_id"].map(cv.mask))
    out["case_state"] = out["case_state"].map(lambda s: STATE_LABELS.get(s, s) if isinstance(s, str) else "no case")
    return cv.mask_frame(out.drop(columns=["entity_id"]))


def render_case_links(loaded: "state.Loaded", entity: str, query: str | None) -> None:
    """The toggle and, when on, the ranking, this case's links and their network."""
    spec = loaded.source.spec
    if not st.toggle("Links between cases (common point of compromise)", key=SHOW_KEY,
                     help="The merchants or terminals fraud entities shared in the days before their first fraud, "
                          "and the other entities that visited this case's in the same days."):
        return
    choices = point_choices(spec)
    if not choices:
        st.info("This data has no categorical field (merchant, terminal) to look for links in.")
        return
    c1, c2, c3 = st.columns([2, 1, 2], vertical_alignment="bottom")
    point = c1.selectbox("Point", choices, key="links_point",
                         help="where entities meet: the spec's link_points first")
    window = int(c2.number_input("Window (days)", min_value=0, max_value=365, value=7, step=1, key="links_window",
                                 help="days before the first fraud (or before this transaction) that count"))
    include = c3.toggle("Count the first fraud's own day", value=True, key="links_onset",
                        help="on: a point where the fraud itself happened counts (a compromised terminal); "
                             "off: only the days before it (a skimmer visited earlier)")
    if window == 0 and not include:
        st.warning("A window of 0 days without the first fraud's day holds nothing: widen it.")
        return
    try:
        confirmed, cases = _store_views(loaded)
        qt = None
        if query is not None:
            hit = loaded.source.frame["transaction_id"].astype(str) == str(query)
            qt = loaded.source.frame.loc[hit, "timestamp"].iloc[0] if hit.any() else None
        ranking, links = _links(loaded, entity, qt, point, window, include, confirmed, cases)
    except Exception as e:  # noqa: BLE001
        st.warning(f"The links could not be computed: {error_text(e)}")
        return

    st.markdown(f"#### {md(point.capitalize())}s fraud entities shared before their first fraud")
    st.caption(f"{ranking.n_fraud_entities:,} fraud entities (known frauds and {len(confirmed):,} confirmed case(s)), "
               f"{ranking.n_other_entities:,} others. A point is ranked when at least {ranking.min_fraud_entities} "
               f"fraud entities visited it in the {window} day(s) before their first fraud"
               f"{' or that day' if include else ''}. Lift = (fraud visit-days + 1) / (expected + 1), expected = "
               "the visit-days had they used it like the entities without fraud on the same days; p-value: "
               "Poisson, one-sided.")
    if ranking.table.empty:
        st.info("No point is shared by enough fraud entities in their windows: nothing links the fraud cases here.")
    else:
        st.dataframe(ranking_display(ranking.table), key="links_ranking", hide_index=True, column_config={
            "rank": st.column_config.NumberColumn("Rank"), "point": st.column_config.TextColumn(point),
            "fraud_entities": st.column_config.NumberColumn("Fraud entities"),
            "fraud_visit_days": st.column_config.NumberColumn("Fraud visit-days"),
            "expected_visit_days": st.column_config.NumberColumn("Expected", format="%.2f"),
            "lift": st.column_config.NumberColumn("Lift", format="%.2f"),
            "p_value": st.column_config.NumberColumn("p-value", format="%.2e"),
            "first_onset": st.column_config.DatetimeColumn("First onset", format="YYYY-MM-DD"),
            "last_onset": st.column_config.DatetimeColumn("Last onset", format="YYYY-MM-DD"),
        })

    st.markdown("#### This case's links")
    anchor = "its first fraud" if links.anchor == "first fraud" else "the transaction explained"
    st.caption(f"Window: {links.window_start:%Y-%m-%d} to {links.window_end - pd.Timedelta(days=1):%Y-%m-%d} "
               f"(the {window} day(s) before {anchor}, and that day). {len(links.points):,} {md(point)}(s) visited, "
               f"{len(links.linked):,} other entities there in the same days"
               f"{f' (the first {MAX_LINKED} shown)' if len(links.linked) >= MAX_LINKED else ''}.")
    if links.points.empty:
        st.info("This entity visited no point in its window.")
        return
    c1, c2 = st.columns([2, 3])
    pts = cv.mask_frame(links.points.assign(point=links.points["point"].astype(str)))
    c1.dataframe(pts, key="links_points", hide_index=True, height=300, column_config={
        "point": st.column_config.TextColumn(point), "n_visits": st.column_config.NumberColumn("Visits"),
        "linked_entities": st.column_config.NumberColumn("Other entities"),
        "lift": st.column_config.NumberColumn("Lift", format="%.2f"),
        "p_value": st.column_config.NumberColumn("p-value", format="%.2e")})
    c2.dataframe(linked_display(links.linked), key="links_linked", hide_index=True, height=300, column_config={
        "entity": st.column_config.TextColumn("Entity"), "shared_points": st.column_config.NumberColumn("Shared"),
        "points": st.column_config.TextColumn(point.capitalize() + "s"),
        "n_visits": st.column_config.NumberColumn("Visits"),
        "first_visit": st.column_config.DatetimeColumn("First visit", format="YYYY-MM-DD HH:mm"),
        "last_visit": st.column_config.DatetimeColumn("Last visit", format="YYYY-MM-DD HH:mm"),
        "fraud_entity": st.column_config.CheckboxColumn("Fraud entity"),
        "onset": st.column_config.DatetimeColumn("First fraud", format="YYYY-MM-DD"),
        "max_probability": st.column_config.ProgressColumn("Max fraud probability", min_value=0.0, max_value=1.0,
                                                           format="%.3f"),
        "case_id": st.column_config.NumberColumn("Case"), "case_state": st.column_config.TextColumn("Case state")})
    from engine.cases.link_figures import link_network_figure
    from engine.cases.links import CaseLinks

    keep = set(links.linked["entity_id"].head(MAX_DRAWN))
    drawn = CaseLinks(**{**links.__dict__, "linked": links.linked[links.linked["entity_id"].isin(keep)],
                         "edges": links.edges[links.edges["entity_id"].isin(keep | {links.entity_id})]})
    st.plotly_chart(link_network_figure(drawn, point_label=point), key="links_network", config=PLOTLY_CONFIG)
    st.caption(f"The {len(keep)} most linked entities (most shared {md(point)}s first) and this case's {md(point)}s; "
               "spring layout (networkx, fixed seed). Purple: this case; red: known or confirmed fraud.")


__all__ = ["SHOW_KEY", "linked_display", "point_choices", "ranking_display", "render_case_links"]
