"""Case page panel: score against the model's thresholds, decision band, disposition form
(note required), four-eyes approval, disposition history and notes, and the exports.

Called from ``dashboard/pages/case.py`` (one block) as
``render_case_panel(loaded, entity, expls, tl)``.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import components as comp
from dashboard.components.safe import md
from engine.cases import view as cv
from engine.serve import access as ac
from engine.cases.store import DISPOSITIONS, CaseStoreError, ConflictError
from engine.cases.thresholds import decision_band

DISPOSITION_LABELS = {"confirmed_fraud": "Confirmed fraud", "false_positive": "False positive",
                      "escalate": "Escalate"}
MSG = "disposition_msg"


def _flash(kind: str, text: str) -> None:
    st.session_state[MSG] = (kind, text)


def _record(store, case: dict) -> None:
    ss = st.session_state
    disp, note = ss.get("disp_choice"), (ss.get("disp_note") or "").strip()
    try:  # the role is checked here, at the action, not only by hiding the form
        who = ac.require(comp.signed_in(), ac.DISPOSITION).name
    except ac.AccessDenied as e:
        return _flash("error", str(e))
    if not note:
        return _flash("error", "A note is required: say why.")
    try:
        new = store.record_disposition(case["id"], disp, note, analyst=who, expected_version=case["version"])
    except ConflictError as e:
        return _flash("warning", md(e))
    except CaseStoreError as e:
        return _flash("error", md(e))
    ss["disp_note"] = ""
    _flash("success", f"Recorded {DISPOSITION_LABELS[disp].lower()} by {md(who)}: case is now "
                      f"{comp.STATE_LABELS.get(new, new)}.")


def _approve(store, case: dict) -> None:
    ss = st.session_state
    note = (ss.get("approve_note") or "").strip()
    try:
        who = ac.require(comp.signed_in(), ac.APPROVE).name
    except ac.AccessDenied as e:
        return _flash("error", str(e))
    if not note:
        return _flash("error", "A note is required to approve.")
    try:
        store.approve(case["id"], note, analyst=who, expected_version=case["version"])
    except CaseStoreError as e:
        return _flash("error", md(e))
    ss["approve_note"] = ""
    _flash("success", f"Approved by {md(who)}: confirmed fraud.")


def render_case_panel(loaded: Any, entity: str, expls: dict, tl: Any, trust: dict | None = None,
                      fields: Any = None) -> None:
    """The disposition panel of one case (entity) and the exports of the explained query."""
    ident = comp.signed_in()
    who = ident.name if ident is not None else None
    store = comp.get_store()
    synced = comp.sync_cases(loaded)
    case = comp.case_for_entity(loaded, entity)
    st.divider()
    st.subheader("Disposition")
    if case is None:
        st.info("This entity has no case in the case store.")
        return
    thr = loaded.thresholds  # in force (engine.cases.thresholds.thresholds_in_force): one source
    e = next(iter(v for v in expls.values() if hasattr(v, "score_logit")), None)
    prob = float(e.score_probability) if e is not None else float(case["max_probability"])
    band = decision_band(prob, thr["review"], thr["decline"])
    m = st.columns(5)
    m[0].metric("Query fraud probability", f"{prob:.3f}")
    m[1].metric("Review threshold", f"{thr['review']:.3f}", help=md(thr["source"]))
    m[2].metric("Decline threshold", f"{thr['decline']:.3f}", help=md(thr["source"]))
    m[3].metric("Decision band", comp.BAND_LABELS[band],
                help="below review: p < review · review: review ≤ p < decline · decline: p ≥ decline")
    m[4].metric("Case state", comp.STATE_LABELS.get(case["state"], case["state"]))
    st.caption(f"Case {case['id']} · version {case['version']} · assignee "
               f"{md(cv.mask(case['assignee'])) if case['assignee'] else 'nobody'} · thresholds: {md(thr['source'])} · "
               f"four-eyes {'on' if store.four_eyes else 'off'}")

    msg = st.session_state.pop(MSG, None)
    if msg:
        getattr(st, msg[0])(msg[1])

    if case["state"] == "pending_approval":
        st.warning(f"Confirmed fraud proposed by **{md(cv.mask(case['pending_by']))}**, waiting for a second analyst "
                   "(four-eyes).")
        if who is not None and who == case["pending_by"]:
            st.caption("You proposed this disposition: a different signed-in supervisor must approve it.")
        elif ac.can(ident, ac.APPROVE):
            with st.form("approve_form"):
                st.text_area("Approval note", key="approve_note", placeholder="Why you agree (required)")
                st.form_submit_button("Approve", type="primary", on_click=_approve, args=(store, case))
        else:
            st.caption("A supervisor approves four-eyes dispositions.")

    if ac.can(ident, ac.DISPOSITION):
        with st.form("disposition_form"):
            st.radio("Disposition", list(DISPOSITIONS), key="disp_choice", horizontal=True,
                     format_func=DISPOSITION_LABELS.get)
            st.text_area("Note (required)", key="disp_note", placeholder="What you found and why")
            st.form_submit_button("Record disposition", type="primary", on_click=_record, args=(store, case))
    else:
        st.caption(f"Your role ({ident.role if ident else 'none'}) reads cases: it does not record dispositions.")

    case = store.get_case(case["id"])  # after a callback's write
    hist, notes = store.history(case["id"]), store.notes(case["id"])
    c1, c2 = st.columns(2)
    with c1:
        st.markdown("**Disposition history**")
        if len(hist):
            st.dataframe(cv.mask_frame(hist.drop(columns=["id", "case_id"]), skip=()), hide_index=True,
                         key="disp_history")
        else:
            st.caption("No disposition yet.")
    with c2:
        st.markdown("**Notes**")
        if len(notes):
            st.dataframe(cv.mask_frame(notes.drop(columns=["id", "case_id"]), skip=()), hide_index=True,
                         key="disp_notes")
        else:
            st.caption("No notes yet.")

    from dashboard.components.export import render_exports

    render_exports(loaded, case, entity, expls, tl, thr, synced.get("scored_at"), who, trust=trust, fields=fields)
