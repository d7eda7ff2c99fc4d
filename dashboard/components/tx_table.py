"""Case page: the entity's transaction table, whose order survives a row selection.

Selecting a row reruns the page. The table used to be drawn under a new widget key on every
query (``tx_<entity>_<query>``) with the query's row styled: each selection made a new table and
the analyst's column sort was lost (and styling 9,391 rows cost ~3 s of CPU per run). Now:

* the order is a server-side choice, "Sort rows by" (:data:`engine.cases.timeline_table.TX_SORTS`),
  kept in session state (``tx_sort``, not a widget key, so it survives other pages) and applied
  before drawing; the rows' ids are taken in that display order, so a selected row position is
  converted to its transaction id at once (:func:`apply_selection`, at the top of the page run);
* the data passed is the same frame on every rerun (no per-query styling; the query is the
  selected row) and the widget key (:func:`table_key`) changes only with the entity, the sort or
  the table generation, which :func:`dashboard.state.set_query` bumps when the query is chosen
  elsewhere (chart, picker): a selection made in the table keeps the table, so a sort made by
  clicking a column header in the browser is kept as well; a query chosen elsewhere redraws the
  table with that query's row selected (never a stale selection);
* the default selection of a key is fixed when the key is first drawn (the element is identical
  across the reruns a selection causes); a selection counts as the analyst's only when it differs
  from the one the table was drawn with, so a query set directly in session state is never
  overridden by the table's stale selection (the table is drawn anew with that query selected).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import state
from engine.cases import timeline_table as tt

#: widget key of the "Sort rows by" control (the choice itself is kept under state.TX_SORT)
PICK_KEY = "tx_sort_pick"
_DEFAULTS = "_tx_table_defaults"
_SEEN = "_tx_table_seen"  # (key, selected rows) the table was drawn with in the last run


def current_sort() -> str:
    """The sort choice in force (a key of ``TX_SORTS``; default ``"time"``)."""
    s = st.session_state.get(state.TX_SORT)
    return s if s in tt.TX_SORTS else "time"


def table_key(entity_id: str) -> str:
    """The table's widget key: ``tx_<entity>_<sort>_<generation>`` (module docstring)."""
    return f"tx_{entity_id}_{current_sort()}_{int(st.session_state.get(state.TX_GEN, 0))}"


def table_view(timeline: pd.DataFrame) -> pd.DataFrame:
    """The timeline in the display order in force."""
    return tt.sort_timeline(timeline, current_sort())


def _rows(key: str) -> list[int]:
    return [int(r) for r in state._get(state._get(st.session_state.get(key), "selection"), "rows", []) or []]


def apply_selection(entity_id: str, timeline: pd.DataFrame) -> str | None:
    """At the top of the Case page run, before anything is computed: a row newly selected in the
    current table (its selection differs from the one it was drawn with last run), converted to
    its transaction id (display order) and made the query (the table is kept); returns that id,
    or None when the analyst selected nothing new."""
    ss = st.session_state
    key = table_key(entity_id)
    rows, seen = _rows(key), ss.get(_SEEN)
    if not rows or seen is None or seen[0] != key or list(seen[1]) == rows:
        return None
    ids = table_view(timeline)["transaction_id"].tolist()
    t = state.selected_row_id(key, ids)
    if t is not None and t != ss.get(state.QUERY):
        state.set_query(t, from_table=True)
    return t


def _on_sort() -> None:
    st.session_state[state.TX_SORT] = st.session_state[PICK_KEY]


def render_sort_control(container: Any, word: str) -> None:
    """The "Sort rows by" select box in ``container`` (``word``: "probability" or "score")."""
    ss = st.session_state
    ss[PICK_KEY] = current_sort()
    container.selectbox("Sort rows by", list(tt.TX_SORTS), key=PICK_KEY, on_change=_on_sort,
                        format_func=lambda k: tt.TX_SORTS[k][0].format(word=word))


def render_table(entity_id: str, timeline: pd.DataFrame, query: str, currency: str, word: str) -> str:
    """The table of ``timeline`` in the order in force, ``query``'s row selected when the table
    is new; returns the widget key."""
    ss = st.session_state
    key = table_key(entity_id)
    view = table_view(timeline)
    ids = view["transaction_id"].tolist()
    sel = state.selected_row_id(key, ids)
    if sel is not None and sel != query:  # the query was set elsewhere: a new table with it selected
        ss[state.TX_GEN] = int(ss.get(state.TX_GEN, 0)) + 1
        key = table_key(entity_id)
    defaults = ss.get(_DEFAULTS) or {}
    default = defaults.get(key, ids.index(query) if query in ids else None)
    ss[_DEFAULTS] = {key: default}  # only the table drawn now
    ss[_SEEN] = (key, _rows(key) or ([default] if default is not None else []))
    st.dataframe(
        view.drop(columns=["transaction_id", "logit"]),
        key=key, on_select="rerun", selection_mode="single-row",
        selection_default={"selection": {"rows": [default] if default is not None else []}},
        hide_index=True, height=280,
        column_config={
            "transaction": st.column_config.TextColumn("Transaction"),
            "when": None,
            "timestamp": st.column_config.DatetimeColumn("Time (UTC)", format="YYYY-MM-DD HH:mm"),
            "amount": st.column_config.NumberColumn(f"Amount ({currency})", format="%.2f"),
            "probability": st.column_config.ProgressColumn(f"Fraud {word}", min_value=0.0, max_value=1.0,
                                                           format="%.3f"),
            "flagged": st.column_config.CheckboxColumn("Flagged"),
            "label": st.column_config.NumberColumn("Known fraud", format="%d"),
        },
    )
    return key


__all__ = ["PICK_KEY", "apply_selection", "current_sort", "render_sort_control", "render_table", "table_key",
           "table_view"]
