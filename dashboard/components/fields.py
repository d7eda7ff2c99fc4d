"""Case page: "does the history matter?" and the query's validated per-field attributions.

Computed by :func:`engine.cases.fields_view.query_fields` (cached per data sha, spec, model sha and
transaction; read first from the explanation cache, where the background precompute stores it with the
case's explanations, and stored there when computed here); the same dict goes into the compliance
export (:func:`export_payload`). No torch here.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import state
from dashboard.components.safe import md
from engine.cases import fields_view as fv

PLOTLY_CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": ["lasso2d", "toImage"]}


@st.cache_data(show_spinner="Scoring the transaction alone and measuring its fields…", max_entries=64)
def _fields(data_sha: str, spec: str, max_rows: int | None, model_sha: str, transaction_id: str,
            _path: str, _model_path: str) -> dict[str, Any]:
    source = state._source(_path, spec, data_sha, max_rows)
    try:  # stored by the background precompute with the case's explanations (engine/cases/precompute_job.py)
        cache = state._cache()
    except Exception as e:  # noqa: BLE001 - an unreadable cache is a miss, never an error page
        state.log.warning("explanation cache unavailable: %s", e)
        cache = None
    sid, cparams = state._cache_ids(source, max_rows, ())
    if cache is None:
        return fv.query_fields(state.get_bundle(_model_path), source.frame, transaction_id, currency=source.currency)
    out, how = fv.cached_query_fields(cache, state.get_bundle(_model_path), source.frame, sid, transaction_id,
                                      cparams, currency=source.currency)
    state.log.info("fields of %s: %s", transaction_id, how)
    return out


def case_fields(loaded: "state.Loaded", transaction_id: str) -> dict[str, Any]:
    """History effect and per-field attributions of one query (cached; JSON-able)."""
    path, spec, sha, max_rows, model_path, model_sha = loaded.key
    return _fields(sha, spec, max_rows, model_sha, str(transaction_id), path, model_path)


def export_payload(loaded: "state.Loaded", transaction_id: str) -> dict[str, Any] | None:
    """The ``fields`` argument of the report (None if it cannot be computed)."""
    try:
        return case_fields(loaded, transaction_id)
    except Exception:  # noqa: BLE001 - the export goes on without this block
        return None


def render_history_effect(loaded: "state.Loaded", query: str) -> None:
    """The plain sentence (alone vs with history) and its numbers, under the score metrics."""
    try:
        f = case_fields(loaded, query)
    except Exception as e:  # noqa: BLE001
        st.caption(f"The transaction could not be scored alone: {md(type(e).__name__)}.")
        return
    h = f["history_effect"]
    box = st.warning if h["alone_flagged"] else st.info
    box(md(h["sentence"]), icon=":material/history:")
    st.caption(md(fv.history_caption(f)))


def render_history_note(loaded: "state.Loaded", query: str) -> None:
    """Above the per-transaction bars: when the query alone already reaches the review threshold
    and its history changes the score by less than ``engine.trust.history_effect.LITTLE``, say that the bars cannot explain
    the flag (nothing otherwise)."""
    try:
        h = case_fields(loaded, query)["history_effect"]
    except Exception:  # noqa: BLE001 - the box under the score already reports the failure
        return
    if h["alone_flagged"] and h.get("adds_little"):
        st.warning(md(f"The history adds little to this {h['word']} ({h['difference']:+.3f}): the transaction is "
                      f"flagged on its own fields (see Fields). The bars below share out a small change."),
                   icon=":material/info:")


def render_fields(loaded: "state.Loaded", query: str) -> None:
    """The query's own fields (what passed validation) and the cell-level values of the top
    earlier transactions."""
    try:
        f = case_fields(loaded, query)
    except Exception as e:  # noqa: BLE001
        st.info(f"No per-field attributions for this query ({md(type(e).__name__)}).")
        return
    fa = f["field_attribution"]
    st.caption(f"Each field of the query compared with a typical transaction, {fv.UNITS_NOTE}.")
    st.plotly_chart(fv.field_figure(f), key="fields_query_validated", config=PLOTLY_CONFIG)
    st.caption(md(fa["caption"]))
    st.caption(md(fv.reference_caption(f)))
    with st.expander("Checks against field ablation"):
        rows = []
        for name, v in fa["validation"].items():
            rows.append({"method": name, "passes": v["ok"],
                         "sign agreement": v["sign_agreement"], "fields counted": v["n_counted"],
                         "size / ablation size": v["magnitude_ratio"], "why not": v["reason"]})
        st.dataframe(rows, hide_index=True)
        st.caption(f"Field ablation = score change when one field of the query is replaced by its typical value; an "
                   f"attribution is shown only if its signs agree with it on at least 90% of the fields that move the "
                   f"score and its total size is on the score's scale. IG convergence delta: "
                   f"{fa['ig_convergence_delta']:+.2e} logit.")
    cf = fv.cells_figure(f)
    if cf is not None:
        st.plotly_chart(cf, key="fields_cells", config=PLOTLY_CONFIG)
        c = fa["cells"]
        st.caption(md(f"Exact Shapley values of (transaction, field) cells of the {len(c['positions'])} earlier "
                      f"transactions whose removal moves the score most (TimeSHAP cell level), each cell replaced by "
                      f"its typical value in the input, so an earlier amount is credited for how unusual it makes "
                      f"the query's amount; they add up to {c['total']:+.3f} logit."))
