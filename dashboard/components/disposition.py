"""Case page panel: score against the model's thresholds, decision band, disposition form
(outcome incl. "close, no action", fraud type, loss and exposure amounts, note required),
a note form of its own (no disposition needed), four-eyes approval, disposition history and
notes (every note, disposition notes included, shown at once; times as "2026-12-01 14:05 UTC"),
and the exports.

Called from ``dashboard/pages/case.py`` (one block) as
``render_case_panel(loaded, entity, expls, tl)``.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import components as comp
from dashboard.components import lead
from dashboard.components.safe import md
import pandas as pd

from engine.cases.fmt import format_threshold
from engine.cases import fmt
from engine.cases import view as cv
from engine.serve import access as ac
from engine.cases.store import DISPOSITIONS, FRAUD_TYPES, CaseStoreError, ConflictError
from engine.cases.thresholds import decision_band

DISPOSITION_LABELS = {"confirmed_fraud": "Confirmed fraud", "false_positive": "False positive",
                      "escalate": "Escalate", "closed_no_action": "Close, no action"}
NO_TYPE = ""
MSG = "disposition_msg"


def _flash(kind: str, text: str) -> None:
    st.session_state[MSG] = (kind, text)


def _record(store, case: dict, currency: str = "") -> None:
    ss = st.session_state
    disp, note = ss.get("disp_choice"), (ss.get("disp_note") or "").strip()
    ftype = ss.get("disp_fraud_type") or None
    loss, exposure = ss.get("disp_loss"), ss.get("disp_exposure")
    try:  # the role is checked here, at the action, not only by hiding the form
        who = ac.require(comp.signed_in(), ac.DISPOSITION).name
    except ac.AccessDenied as e:
        return _flash("error", str(e))
    if disp not in DISPOSITIONS:
        return _flash("error", "Choose a disposition first.")
    if not note:
        return _flash("error", "A note is required: say why.")
    if case["state"] == "pending_approval" and not ss.get(f"disp_replace_{case['id']}"):
        # recording on a pending case replaces the proposal the supervisor is about to approve
        return _flash("error", "This case waits for the approval of the proposal shown above: tick \"Replace the "
                               "pending proposal\" to replace it with this one.")
    if disp == "confirmed_fraud" and ftype is None:
        return _flash("error", "Choose the fraud type of a confirmed fraud.")
    if disp in ("false_positive", "closed_no_action") and (ftype or loss or exposure):
        return _flash("error", f"{DISPOSITION_LABELS[disp]} has no fraud type, loss or exposure: clear them.")
    try:
        new = store.record_disposition(case["id"], disp, note, analyst=who, expected_version=case["version"],
                                       fraud_type=ftype, loss_amount=loss, exposure_amount=exposure,
                                       currency=currency or None)
    except ConflictError as e:
        return _flash("warning", md(e))
    except (CaseStoreError, ValueError) as e:
        return _flash("error", md(e))
    # a recorded disposition clears the form: a second click must not propose the same again
    ss["disp_note"], ss["disp_fraud_type"], ss["disp_loss"], ss["disp_exposure"] = "", NO_TYPE, None, None
    ss["disp_choice"], ss[f"disp_replace_{case['id']}"] = None, False  # no outcome preselected (confirmed fraud was)
    extra = "".join([f" · {FRAUD_TYPES[ftype].lower()}" if ftype else "",
                     f" · loss {fmt.format_amount(loss, currency)}" if loss is not None else "",
                     f" · exposure {fmt.format_amount(exposure, currency)}" if exposure is not None else ""])
    _flash("success", f"Recorded \"{DISPOSITION_LABELS[disp]}\" by {md(who)}{extra}: case is now "
                      f"{comp.STATE_LABELS.get(new, new)}.")


def _add_note(store, case: dict) -> None:
    ss = st.session_state
    text = (ss.get("note_text") or "").strip()
    try:
        who = ac.require(comp.signed_in(), ac.NOTE).name
    except ac.AccessDenied as e:
        return _flash("error", str(e))
    if not text:
        return _flash("error", "Write the note first.")
    try:
        store.add_note(case["id"], text, analyst=who)
    except CaseStoreError as e:
        return _flash("error", md(e))
    ss["note_text"] = ""
    _flash("success", f"Note added by {md(who)}.")


def notes_timeline(hist: pd.DataFrame, notes: pd.DataFrame) -> pd.DataFrame:
    """Every note of a case, oldest first: the free notes and the note of each disposition and
    approval (``time`` as "2026-12-01 14:05 UTC", ``analyst``, ``kind``, ``note``)."""
    rows = [(n.ts, n.analyst, "note", n.text) for n in notes.itertuples(index=False)]
    rows += [(h.ts, h.analyst, f"{h.kind}: {DISPOSITION_LABELS.get(h.disposition, h.disposition).lower()}", h.note)
             for h in hist.itertuples(index=False)]
    out = pd.DataFrame(sorted(rows, key=lambda r: str(r[0])), columns=["ts", "analyst", "kind", "note"])
    out.insert(0, "time", out.pop("ts").map(fmt.format_ts))
    return out


def proposal_details(hist: pd.DataFrame, currency: str = "") -> None:
    """What a pending four-eyes approval would apply: the latest proposal's outcome, fraud type,
    loss, exposure, proposer, time and note (``hist``: :meth:`CaseStore.history`), shown before
    the Approve button so the supervisor approves what they read. Names and the note are shown as
    text (masked card numbers), never as markdown."""
    props = hist[hist["kind"] == "disposition"]
    if not len(props):
        return
    p = props.iloc[-1]

    def money(a: Any, c: Any) -> str:
        return fmt.format_amount(a, c or currency) if a is not None and not pd.isna(a) else "not recorded"

    view = pd.DataFrame({"": ["Outcome", "Fraud type", "Loss", "Exposure", "Proposed by", "Proposed at", "Note"],
                         "proposal": [DISPOSITION_LABELS.get(p["disposition"], p["disposition"]),
                                      FRAUD_TYPES.get(p["fraud_type"], "not recorded") if p["fraud_type"] else
                                      "not recorded", money(p["loss_amount"], p["currency"]),
                                      money(p["exposure_amount"], p["currency"]), str(p["analyst"]),
                                      fmt.format_ts(p["ts"]), str(p["note"])]})
    st.dataframe(cv.mask_frame(view), hide_index=True, key="pending_proposal",
                 column_config={"proposal": st.column_config.TextColumn("Proposal to approve", width="large")})


def _decide(store, case: dict, send_back: bool = False) -> None:
    """The approval form's two buttons: approve the pending proposal, or send it back (both need
    the supervisor's note; the role is checked here, at the action)."""
    ss = st.session_state
    note = (ss.get("approve_note") or "").strip()
    try:
        who = ac.require(comp.signed_in(), ac.APPROVE).name
    except ac.AccessDenied as e:
        return _flash("error", str(e))
    if not note:
        return _flash("error", "A note is required to send a proposal back: say why." if send_back else
                      "A note is required to approve.")
    try:
        act = store.send_back if send_back else store.approve
        state = act(case["id"], note, analyst=who, expected_version=case["version"])
    except CaseStoreError as e:
        return _flash("error", md(e))
    ss["approve_note"] = ""
    label = comp.STATE_LABELS.get(state, state)
    _flash("success", f"Sent back by {md(who)}: the case is {label} again." if send_back else
           f"Approved by {md(who)}: {label.lower()}.")


def _approve(store, case: dict) -> None:
    _decide(store, case)


def _send_back(store, case: dict) -> None:
    _decide(store, case, send_back=True)


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
    # the model's output (calibrated when the checkpoint is): the number the thresholds apply to and
    # the transaction panel shows; e.score_probability is sigmoid(logit), the explainers' units
    prob = lead.output(loaded, e.score_logit) if e is not None else float(case["max_probability"])
    band = decision_band(prob, thr["review"], thr["decline"])
    m = st.columns(4)
    m[0].metric(f"Query fraud {lead.word(loaded)}", f"{prob:.3f}")
    m[1].metric("Review threshold", format_threshold(thr['review']), help=md(thr["source"]))
    m[2].metric("Decline threshold", format_threshold(thr['decline']), help=md(thr["source"]))
    m[3].metric("Decision band", comp.BAND_LABELS[band],
                help="below review: p < review · review: review ≤ p < decline · decline: p ≥ decline")
    # the state on a row of its own: as a fifth metric "pending approval" was cut off at 1400 px
    st.columns([2, 3])[0].metric("Case state", comp.STATE_LABELS.get(case["state"], case["state"]))
    st.caption(f"Case {case['id']} · version {case['version']} · assignee "
               f"{md(cv.mask(case['assignee'])) if case['assignee'] else 'nobody'} · thresholds: {md(thr['source'])} · "
               f"four-eyes {'on' if store.four_eyes else 'off'}")

    msg = st.session_state.pop(MSG, None)
    if msg:
        getattr(st, msg[0])(msg[1])
        if msg[0] == "success":  # also where the analyst is: the message above may be out of view
            st.toast(msg[1], icon=":material/check_circle:")

    if case["state"] == "pending_approval":
        proposed = store.pending_disposition(case["id"]) or "confirmed_fraud"
        st.warning(f"{DISPOSITION_LABELS.get(proposed, proposed)} proposed by **{md(cv.mask(case['pending_by']))}**, "
                   "waiting for a different supervisor to approve it (four-eyes).")
        proposal_details(store.history(case["id"]), currency=str(getattr(loaded.source, "currency", "") or ""))
        if who is not None and who == case["pending_by"]:
            st.caption("You proposed this disposition: a different signed-in supervisor must approve it.")
        elif ac.can(ident, ac.APPROVE):
            with st.form("approve_form"):
                st.text_area("Approval note", key="approve_note",
                             placeholder="Why you agree, or why you send it back (required)")
                b = st.columns([1, 1, 4])
                b[0].form_submit_button("Approve", type="primary", on_click=_approve, args=(store, case))
                b[1].form_submit_button("Send back", on_click=_send_back, args=(store, case),
                                        help="Refuse the proposal: the case returns to the state its last applied "
                                             "disposition gave it, and your note is kept on the case.")
        else:
            st.caption("A supervisor approves four-eyes dispositions.")

    currency = str(getattr(loaded.source, "currency", "") or "")
    if ac.can(ident, ac.DISPOSITION):
        with st.form("disposition_form"):
            st.radio("Disposition", list(DISPOSITIONS), key="disp_choice", horizontal=True, index=None,
                     format_func=DISPOSITION_LABELS.get)
            f = st.columns([2, 1, 1])
            f[0].selectbox("Fraud type", [NO_TYPE, *FRAUD_TYPES], key="disp_fraud_type",
                           format_func=lambda k: FRAUD_TYPES.get(k, "(none: not fraud, or not known yet)"),
                           help="required for confirmed fraud")
            f[1].number_input(f"Loss ({currency or 'amount'})", min_value=0.0, max_value=1e12, value=None, step=10.0,
                              format="%.2f", key="disp_loss", help="money lost (a number >= 0); empty if not known")
            f[2].number_input(f"Exposure ({currency or 'amount'})", min_value=0.0, max_value=1e12, value=None,
                              step=10.0, format="%.2f", key="disp_exposure",
                              help="money at risk (a number >= 0); empty if not known")
            st.text_area("Note (required)", key="disp_note", placeholder="What you found and why")
            if case["state"] == "pending_approval":
                st.checkbox("Replace the pending proposal", key=f"disp_replace_{case['id']}",  # per case
                            help="The case waits for a supervisor to approve the proposal shown above; recording "
                                 "now replaces it (the supervisor then approves or refuses this one).")
            st.form_submit_button("Record disposition", type="primary", on_click=_record,
                                  args=(store, case, currency))
    else:
        st.caption(f"Your role ({ident.role if ident else 'none'}) reads cases: it does not record dispositions.")
    if ac.can(ident, ac.NOTE):
        with st.form("note_form", clear_on_submit=False):
            st.text_area("Add a note (no disposition needed)", key="note_text",
                         placeholder="What you checked, who you called, what is next")
            st.form_submit_button("Add note", on_click=_add_note, args=(store, case))

    case = store.get_case(case["id"])  # after a callback's write
    hist, notes = store.history(case["id"]), store.notes(case["id"])
    c1, c2 = st.columns(2)
    with c1:
        st.markdown("**Disposition history**")
        if len(hist):
            view = pd.DataFrame({  # who, what and why first: the table is narrow (half the page)
                "time": hist["ts"].map(fmt.format_ts), "analyst": hist["analyst"],
                "kind": hist["kind"].map({"disposition": "recorded", "approval": "approved"}.get),
                "outcome": hist["disposition"].map(lambda d: DISPOSITION_LABELS.get(d, d)),
                "note": hist["note"],
                "fraud type": hist["fraud_type"].map(lambda t: FRAUD_TYPES.get(t, "") if t else ""),
                "loss": [fmt.format_amount(a, c or currency) if a is not None and not pd.isna(a) else ""
                         for a, c in zip(hist["loss_amount"], hist["currency"])],
                "exposure": [fmt.format_amount(a, c or currency) if a is not None and not pd.isna(a) else ""
                             for a, c in zip(hist["exposure_amount"], hist["currency"])],
                "state after": hist["state_after"].map(lambda s: comp.STATE_LABELS.get(s, s))})
            st.dataframe(cv.mask_frame(view, skip=("time",)), hide_index=True, key="disp_history",
                         column_config={"note": st.column_config.TextColumn("note", width="large")})
        else:
            st.caption("No disposition yet.")
    with c2:
        st.markdown("**Notes**")
        timeline = notes_timeline(hist, notes)
        if len(timeline):
            st.dataframe(cv.mask_frame(timeline, skip=("time",)), hide_index=True, key="disp_notes",
                         column_config={"note": st.column_config.TextColumn("note", width="large")})
        else:
            st.caption("No notes yet.")

    from dashboard.components.export import render_exports

    render_exports(loaded, case, entity, expls, tl, thr, synced.get("scored_at"), who, trust=trust, fields=fields)
