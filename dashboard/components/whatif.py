"""Case page, What-if tab: edit the history of the query's entity, see the new score at once.

Change (amount, time, merchant, MCC, ...) or remove an earlier transaction, or add one; the query
is re-scored and re-explained with the same model (:func:`engine.trust.whatif.what_if`, no
retraining). Rendered by :func:`render_whatif` inside ``dashboard/components/trust.py``'s tabs.

An edit costs two things of very different size (demo model, demo data, measured with
``time.process_time`` on one thread): the new **score** (one forward pass of the original and of
the edited context, about 0.03 s of CPU) and the new **explanations** of every method in
:data:`engine.cases.view.METHODS` (2.3 to 5.1 s of CPU for contexts of 24 and 86 transactions).
So they are two caches: :func:`whatif_score` is drawn first (the metrics and the edit form), then
:func:`whatif_case` (the edited rows with each method's values, the bars, the reason codes). The
Trust tab's faithfulness checks of an edited history are built only for the export
(``dashboard/components/trust.py`` ``case_trust``, which reuses :func:`whatif_case`'s entry).

Session-state keys (documented contract, read by the export in ``dashboard/components/export.py``):

* ``st.session_state["whatif_edits"][query_transaction_id]``: list of edit dicts
  (:meth:`engine.trust.whatif.Edit.to_dict`: ``{"op", "transaction_id", "values"}``), in the order
  they are applied. Missing or ``[]`` = no edits.
* ``st.session_state["whatif_result"][query_transaction_id]``: ``{"logit", "probability",
  "original_logit", "original_probability", "edited_transaction_ids", "edits"}`` of the last
  rendered what-if (logits = log-odds of fraud).

Caching: ``st.cache_data`` keyed by (data sha256, spec, max_rows, model sha256, transaction id,
edits hash). Nothing here imports torch.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import state
from dashboard.components import lead
from dashboard.components.masking import edits_table, mask_card_fields
from dashboard.components.safe import error_text, md
from engine.cases import figures as fig
from engine.cases import view as cv

WHATIF_EDITS = "whatif_edits"
WHATIF_RESULT = "whatif_result"
WHATIF_ERROR = "whatif_error"
#: set when an edit dropped prepared exports: the what-if fragment then reruns the whole page once
FULL_RERUN = "whatif_full_rerun"
#: fields offered in the what-if form besides amount and time (the spec's, in this order)
WHATIF_FIELDS = ("merchant", "mcc", "use_chip", "merchant_city", "merchant_state", "terminal")
PLOTLY_CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": ["lasso2d", "toImage"]}
EDITED_BG, QUERY_BG = "#fff59d", "#ffe0b2"


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def edits_key(edits: list[dict[str, Any]]) -> str:
    """Stable hash of a list of edit dicts ("" = no edits): the cache key part of the edits."""
    if not edits:
        return ""
    return hashlib.sha256(json.dumps(edits, sort_keys=True, default=str).encode()).hexdigest()[:16]


def query_edits(query: str) -> list[dict[str, Any]]:
    """The what-if edits of ``query`` in session state (a copy; ``[]`` if none)."""
    return [dict(e) for e in (st.session_state.get(WHATIF_EDITS) or {}).get(str(query), [])]


def _set_edits(query: str, edits: list[dict[str, Any]]) -> None:
    """Store the edits of ``query``. Exports prepared before carry the old edits and their download
    buttons lie outside this fragment: drop them and ask for a whole-page run (:data:`FULL_RERUN`)."""
    from dashboard.components.export import PREPARED

    ss = st.session_state
    all_edits = dict(ss.get(WHATIF_EDITS) or {})
    all_edits[str(query)] = list(edits)
    ss[WHATIF_EDITS] = all_edits
    if ss.get(PREPARED) is not None:
        ss.pop(PREPARED, None)
        ss[FULL_RERUN] = True


# ------------------------------------------------------------------------------------ caches
@st.cache_data(show_spinner=False, max_entries=64)
def _whatif_score(data_sha: str, spec: str, max_rows: int | None, model_sha: str, transaction_id: str,
                  edits_hash: str, _path: str, _model_path: str, _edits: tuple = ()) -> dict[str, Any]:
    """The edited history's score only (one forward pass each for the original and the edited
    context, no explanation): logits, edited ids, context rows, T."""
    from engine.trust.whatif import what_if

    source = state._source(_path, spec, data_sha, max_rows)
    res = what_if(state.get_bundle(_model_path), source.frame, transaction_id, [dict(e) for e in _edits], methods=())
    return {"logit": float(res.logit), "original_logit": float(res.original_logit),
            "edited_ids": list(res.edited_transaction_ids), "rows": res.context.rows.reset_index(drop=True).copy(),
            "transaction_ids": [str(t) for t in res.context.transaction_ids], "T": int(res.context.T)}


@st.cache_data(show_spinner="Re-explaining the edited history…", max_entries=64)
def _whatif_case(data_sha: str, spec: str, max_rows: int | None, model_sha: str, transaction_id: str,
                 edits_hash: str, _path: str, _model_path: str, _edits: tuple = ()) -> dict[str, Any]:
    """What the What-if tab shows below the score for one edited history: the explanations
    (:data:`engine.cases.view.METHODS`, IG re-run when incomplete), the reason codes, the rows;
    none of the Trust tab's faithfulness checks (those are built for the export only)."""
    from engine.cases.links import case_reason_codes
    from engine.trust.sanity import completeness_checks
    from engine.trust.whatif import what_if

    source = state._source(_path, spec, data_sha, max_rows)
    res = what_if(state.get_bundle(_model_path), source.frame, transaction_id, [dict(e) for e in _edits],
                  methods=cv.METHODS)
    ctx = res.context
    checks, expls = completeness_checks(ctx, dict(res.explanations), warn=False)
    try:
        reasons = case_reason_codes(ctx, expls, source.frame) if ctx.T > 1 else []  # + common point of compromise
    except ValueError:
        reasons = []
    return {"logit": float(res.logit), "original_logit": float(res.original_logit), "explanations": expls,
            "completeness": checks, "reasons": reasons, "rows": ctx.rows.reset_index(drop=True).copy(),
            "transaction_ids": [str(t) for t in ctx.transaction_ids], "edited_ids": list(res.edited_transaction_ids),
            "T": int(ctx.T)}


def _whatif_args(loaded: "state.Loaded", transaction_id: str, edits: list[dict[str, Any]]) -> tuple:
    path, spec, sha, max_rows, model_path, model_sha = loaded.key
    return (sha, spec, max_rows, model_sha, str(transaction_id), edits_key(edits), path, model_path, tuple(edits))


def whatif_score(loaded: "state.Loaded", transaction_id: str, edits: list[dict[str, Any]]) -> dict[str, Any]:
    """The score of the history with ``edits`` (non-empty) applied: ``{"logit", "original_logit",
    "edited_ids", "rows", "transaction_ids", "T"}`` (logits = log-odds of fraud), cached per (data
    sha256, spec, model sha256, transaction id, edits hash). Raises KeyError / ValueError like
    :func:`engine.trust.whatif.apply_edits`."""
    return _whatif_score(*_whatif_args(loaded, transaction_id, list(edits)))


def whatif_case(loaded: "state.Loaded", transaction_id: str, edits: list[dict[str, Any]]) -> dict[str, Any]:
    """The explanations, reason codes and rows of the history with ``edits`` (non-empty) applied
    (see :func:`_whatif_case`), cached like :func:`whatif_score`."""
    return _whatif_case(*_whatif_args(loaded, transaction_id, list(edits)))


def _rows_table(rows: pd.DataFrame, labels: list[str], currency: str) -> pd.DataFrame:
    """Display-safe context rows: when, amount and the editable fields present."""
    cols = [c for c in WHATIF_FIELDS if c in rows]
    out = pd.DataFrame({"when": labels, "amount": rows["amount"].to_numpy()})
    for c in cols:
        out[c] = rows[c].astype(str).to_numpy()
    return mask_card_fields(out)  # merchant ids are not PANs: only card fields are masked


# -------------------------------------------------------------------------------------- what-if
def _edit_fields(loaded) -> list[str]:
    names = [f.name for f in loaded.source.spec.fields]
    return [f for f in WHATIF_FIELDS if f in names]


def _try_append(loaded, query: str, edit: dict[str, Any]) -> None:
    """Validate ``edit`` on the entity's rows (engine.trust.whatif.apply_edits) and append it."""
    from engine.trust.whatif import apply_edits

    ss = st.session_state
    edits = query_edits(query) + [edit]
    try:
        apply_edits(cv.entity_rows(loaded.source.frame, query), query, edits, loaded.source.spec)
    except (KeyError, ValueError) as e:
        ss[WHATIF_ERROR] = f"That edit cannot be applied: {e}"
        return
    ss.pop(WHATIF_ERROR, None)
    _set_edits(query, edits)


def _on_apply(loaded, query: str, target: str, fields: list[str], current: dict[str, Any], prefix: str) -> None:
    ss = st.session_state
    if ss.get(f"{prefix}_action") == "remove":
        _try_append(loaded, query, {"op": "remove", "transaction_id": target, "values": {}})
        return
    values: dict[str, Any] = {}
    amt = ss.get(f"{prefix}_amount")
    if amt is not None and not math.isclose(float(amt), float(current["amount"]), abs_tol=1e-9):
        values["amount"] = float(amt)
    ts = (ss.get(f"{prefix}_time") or "").strip()
    if ts:
        try:
            t = pd.Timestamp(ts)
        except (ValueError, TypeError):
            ss[WHATIF_ERROR] = f"Not a time: {ts!r} (use YYYY-MM-DD HH:MM:SS)"
            return
        if t != pd.Timestamp(current["timestamp"]):
            values["timestamp"] = t.isoformat()
    for f in fields:
        v = ss.get(f"{prefix}_{f}")
        if v is not None and str(v) != str(current.get(f, "")):
            values[f] = str(v)
    if not values:
        ss[WHATIF_ERROR] = "Nothing changed: edit a value first."
        return
    _try_append(loaded, query, {"op": "change", "transaction_id": target, "values": values})


def _on_add(loaded, query: str, fields: list[str], prefix: str) -> None:
    ss = st.session_state
    try:
        t = pd.Timestamp((ss.get(f"{prefix}_time") or "").strip())
    except (ValueError, TypeError):
        ss[WHATIF_ERROR] = "Not a time (use YYYY-MM-DD HH:MM:SS)"
        return
    values: dict[str, Any] = {"timestamp": t.isoformat(), "amount": float(ss.get(f"{prefix}_amount") or 0.0)}
    for f in fields:
        v = (ss.get(f"{prefix}_{f}") or "").strip()
        if v:
            values[f] = v
    n = len(query_edits(query)) + 1
    _try_append(loaded, query, {"op": "add", "transaction_id": f"whatif-{n}", "values": values})


def reset_whatif(query: str) -> None:
    """Drop every what-if edit of ``query``."""
    _set_edits(query, [])
    st.session_state.pop(WHATIF_ERROR, None)


def _undo_last(query: str) -> None:
    _set_edits(query, query_edits(query)[:-1])
    st.session_state.pop(WHATIF_ERROR, None)


def _whatif_failed(query: str, e: Exception) -> None:
    st.warning(f"The what-if could not be computed: {error_text(e)}. Reset the edits to start again.")
    st.button("Reset", key="whatif_reset_err", on_click=reset_whatif, args=(query,), icon=":material/restart_alt:")


@st.fragment
def render_whatif(loaded: "state.Loaded", query: str, expls: dict) -> None:
    """Edit the history of ``query``'s entity, see the new score and explanations (no retraining).

    A Streamlit fragment (https://docs.streamlit.io/develop/concepts/architecture/fragments): a
    widget of the tab (target, values, Apply, Undo, Reset) reruns only this function, not the whole
    Case page (about 2 s on the shared 2-core machine with every result cached). Nothing outside
    shows the edits while the tab is open (the toggle counts them only when off); prepared
    exports are dropped by an edit and the page is rerun whole once (:func:`_set_edits`)."""
    from dashboard.components.trust import _title, case_trust, render_reasons  # trust imports this module

    ss = st.session_state
    if ss.pop(FULL_RERUN, False):
        st.rerun(scope="app")
    currency, thr = loaded.source.currency, loaded.threshold
    edits = query_edits(query)
    try:  # the score first (one forward pass, cached): the explanations of an edit come after the form
        base = case_trust(loaded, query)
        cur = whatif_score(loaded, query, edits) if edits else base
    except Exception as e:  # noqa: BLE001
        _whatif_failed(query, e)
        return
    # the model's output (calibrated when the checkpoint is): what the thresholds apply to and what the
    # rest of the page shows (review finding: sigmoid(logit) here gave 0.731 beside 0.525)
    p0, p1 = lead.output(loaded, base["logit"]), lead.output(loaded, cur["logit"])
    w = lead.word(loaded)
    results = dict(ss.get(WHATIF_RESULT) or {})
    results[str(query)] = {"logit": cur["logit"], "probability": p1, "original_logit": base["logit"],
                           "original_probability": p0, "edited_transaction_ids": list(cur["edited_ids"]),
                           "edits": edits}
    ss[WHATIF_RESULT] = results

    st.caption("Change, remove or add earlier transactions of this entity: the query is re-scored and re-explained "
               "with the same model (no retraining). Edits stay until Reset and are included in the export.")
    m = st.columns(4)
    m[0].metric(f"Original {w}", f"{p0:.3f}")
    m[1].metric(f"What-if {w}", f"{p1:.3f}", delta=f"{p1 - p0:+.3f}" if edits else None, delta_color="inverse")
    m[2].metric("What-if score (logit)", f"{cur['logit']:+.3f}")
    m[3].metric("What-if decision", cv.BAND_LABELS[cv.decision_band(p1, thr, loaded.thresholds["decline"])])

    if ss.get(WHATIF_ERROR):
        st.warning(md(ss[WHATIF_ERROR]), icon=":material/warning:")

    # ---- current edits ------------------------------------------------------------------------
    c1, c2, c3 = st.columns([4, 1, 1], vertical_alignment="bottom")
    if edits:  # the count, drawn after the metrics above: when it shows, so do the edited scores
        c1.caption(f"{len(edits)} edit{'s' if len(edits) != 1 else ''} in force: the scores above are the edited "
                   "history's.")
        c1.dataframe(edits_table(loaded, edits), key="whatif_edits_table", hide_index=True,
                     column_config={"time": st.column_config.DatetimeColumn("Time (UTC)", format="YYYY-MM-DD HH:mm"),
                                    "amount": st.column_config.NumberColumn(f"Amount ({loaded.source.currency})",
                                                                            format="%.2f")})
    else:
        c1.caption("No edits yet: the scores above are the original ones.")
    c2.button("Undo last", key="whatif_undo", on_click=_undo_last, args=(query,), disabled=not edits,
              icon=":material/undo:")
    c3.button("Reset", key="whatif_reset", on_click=reset_whatif, args=(query,), disabled=not edits,
              icon=":material/restart_alt:", help="drop every edit and go back to the original history")

    # ---- edit form -------------------------------------------------------------------------------
    rows = cur["rows"]
    ids = [str(t) for t in rows["transaction_id"]]
    labels = cv.context_labels(rows, currency)  # the edited rows' (the rows table below)
    # the picker's labels from the ORIGINAL rows (time, amount): an edit must not change the label of the selected
    # transaction, since Streamlit keeps a selectbox's choice by its label, and a label that vanished
    # came back as the label text instead of a transaction id (found by the browser bench)
    base_rows = base["rows"]
    lab = dict(zip((str(t) for t in base_rows["transaction_id"]), cv.context_labels(base_rows, currency)))
    fields = _edit_fields(loaded)
    target_key = f"whatif_target_{query}"
    if target_key in ss and ss[target_key] not in ids:  # the chosen transaction was removed: start over
        del ss[target_key]
    with st.expander("Change or remove a transaction", expanded=not edits):
        target = st.selectbox("Transaction", ids[::-1], key=target_key,
                              format_func=lambda t: cv.mask(lab.get(t, t)))
        r = rows.iloc[ids.index(target)]
        prefix = f"whatif_{query}_{target}"
        is_query = target == str(query)
        st.radio("Action", ["change"] if is_query else ["change", "remove"], key=f"{prefix}_action", horizontal=True)
        cols = st.columns(2 + len(fields))
        cols[0].number_input(f"Amount ({currency})", value=float(r["amount"]), key=f"{prefix}_amount", format="%.2f")
        cols[1].text_input("Time (UTC)", value=str(pd.Timestamp(r["timestamp"])), key=f"{prefix}_time")
        for i, f in enumerate(fields):
            cols[2 + i].text_input(md(f), value=str(r[f]), key=f"{prefix}_{f}")
        current = {"amount": r["amount"], "timestamp": r["timestamp"], **{f: str(r[f]) for f in fields}}
        st.button("Apply edit", key="whatif_apply", on_click=_on_apply,
                  args=(loaded, query, target, fields, current, prefix), icon=":material/edit:")
    with st.expander("Add a transaction"):
        prefix = f"whatif_{query}_add"
        qts = pd.Timestamp(rows["timestamp"].iloc[-1])
        cols = st.columns(2 + len(fields))
        cols[0].number_input(f"Amount ({currency})", value=100.0, key=f"{prefix}_amount", format="%.2f")
        cols[1].text_input("Time (UTC)", value=str(qts - pd.Timedelta(minutes=10)), key=f"{prefix}_time",
                           help="at or before the query's time")
        for i, f in enumerate(fields):
            cols[2 + i].text_input(md(f), value="", key=f"{prefix}_{f}", placeholder="missing")
        st.button("Add transaction", key="whatif_add", on_click=_on_add, args=(loaded, query, fields, prefix),
                  icon=":material/add:")

    # ---- edited context + explanations (the slow part of an edit: every method on the edited history) ----
    if edits:
        try:
            cur = whatif_case(loaded, query, edits)
        except Exception as e:  # noqa: BLE001
            _whatif_failed(query, e)
            return
    edited = set(cur["edited_ids"])
    table = _rows_table(rows, labels, currency)
    table.insert(0, "edited", [t in edited for t in ids])
    e_sel = cur["explanations"]
    for mth in ("integrated_gradients", "shap", "occlusion"):
        if mth in e_sel:
            table[cv.METHOD_COLUMNS[mth]] = e_sel[mth].values
    qpos = len(ids) - 1
    st.markdown("**The history the model sees** (edited rows highlighted, query last)")
    st.dataframe(table.style.apply(
        lambda row: [f"background-color: {EDITED_BG}" if row["edited"] else
                     (f"background-color: {QUERY_BG}" if row.name == qpos else "") for _ in row], axis=1),
        key="whatif_rows", hide_index=True, height=min(36 * (len(table) + 1), 360),
        column_config={"edited": st.column_config.CheckboxColumn("Edited"),
                       "amount": st.column_config.NumberColumn(f"Amount ({currency})", format="%.2f")})
    removed = [e["transaction_id"] for e in edits if e["op"] == "remove"]
    if removed:
        st.caption("Removed: " + md(", ".join(cv.mask(t) for t in removed)))
    methods = [mth for mth in ("integrated_gradients", "shap", "occlusion") if mth in e_sel]
    if methods and cur["T"] > 1:
        mth = st.segmented_control("Explanation", methods, default=methods[0], key="whatif_method",
                                   format_func=_title) or methods[0]
        st.plotly_chart(fig.attribution_bars(e_sel[mth], labels=labels, include_query=False), key="whatif_bars",
                        config=PLOTLY_CONFIG)
        st.caption(cv.method_caption(e_sel[mth]))
    render_reasons(cur, currency, key=f"whatif_reason_{query}")


__all__ = ["FULL_RERUN", "WHATIF_EDITS", "WHATIF_ERROR", "WHATIF_FIELDS", "WHATIF_RESULT", "edits_key", "query_edits",
           "render_whatif", "reset_whatif", "whatif_case", "whatif_score"]
