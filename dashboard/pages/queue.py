"""Case queue: entities whose highest fraud probability reaches the review threshold, ranked,
filtered, assigned; per-model review/decline thresholds with their precision/recall."""

from __future__ import annotations


import pandas as pd
import streamlit as st

from dashboard import components as comp
from dashboard import state
from dashboard.components.safe import csv_download, md
from engine.cases import view as cv
from engine.cases.store import STATES, CaseStoreError
from engine.cases.report import threshold_metrics
from engine.serve import access as ac
from engine.serve.casework import service_source_id

state.ensure_entrypoint()
ss = st.session_state
st.title("Case queue")
ident = comp.signed_in()
who = ident.name if ident is not None else None
if comp.access.deny(ac.VIEW_CASES):
    st.stop()

try:
    loaded = state.load_all()
except Exception as e:  # noqa: BLE001
    st.error(md(state.load_or_explain_error(e)), icon=":material/error:")
    st.page_link("pages/cases.py", label="Choose data and model on Cases", icon=":material/folder_open:")
    st.stop()

store = comp.get_store()
synced = comp.sync_cases(loaded)
sha = loaded.bundle.sha256
thr = loaded.thresholds  # in force (engine.cases.thresholds.thresholds_in_force): the same on every page

# --------------------------------------------------------------------------------- thresholds
with st.expander(f"Thresholds · review **{thr['review']:.3f}** · decline **{thr['decline']:.3f}** "
                 f"({md(thr['source'])})"):
    qual = threshold_metrics(loaded.scores, {"review": thr["review"], "decline": thr["decline"]},
                             loaded.bundle.meta)
    rows = [{"threshold": k, "value": v["threshold"], "precision": v["precision"], "recall": v["recall"],
             "alerts": v["alerts"]} for k, v in qual["by_threshold"].items()]
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="thr_quality",
                 column_config={"value": st.column_config.NumberColumn("Probability", format="%.3f"),
                                "precision": st.column_config.NumberColumn(format="%.3f"),
                                "recall": st.column_config.NumberColumn(format="%.3f")})
    st.caption(f"Precision / recall: {md(qual['source'])}"
               + (f" · {qual['n']:,} transactions, {qual['n_fraud']:,} known frauds" if qual["n"] else "")
               + ". Blank: not measured at that threshold.")
    if ac.can(ident, ac.SET_THRESHOLDS):
        with st.form("thresholds_form"):
            c1, c2 = st.columns(2)
            review = c1.number_input("Review threshold", 0.0, 1.0, float(thr["review"]), step=0.01,
                                     format="%.4f", key="thr_review")
            decline = c2.number_input("Decline threshold", 0.0, 1.0, float(thr["decline"]), step=0.01,
                                      format="%.4f", key="thr_decline")
            if st.form_submit_button("Save thresholds for this model"):
                try:  # checked at the action too, not only by hiding the form
                    actor = ac.require(comp.signed_in(), ac.SET_THRESHOLDS).name
                    store.set_thresholds(sha, review, decline, actor=actor)
                    st.success(f"Saved by {md(actor)}.")
                    st.rerun()
                except (ValueError, CaseStoreError, ac.AccessDenied) as e:
                    st.error(md(e))
    else:
        st.caption(f"Only a supervisor changes thresholds (you: {ident.role if ident else 'not signed in'}).")

# ------------------------------------------------------------------------------------ filters
st.caption(f"Model `{loaded.bundle.short_sha}` · {loaded.source.summary()} · cases created "
           f"{synced['created']}, updated {synced['updated']} at {synced['scored_at']}")
service_src = service_source_id(loaded.bundle)
source = st.radio("Cases from", ["file", "service"], horizontal=True, key="q_source",
                  format_func={"file": "this file", "service": "the scoring service (fraudlens serve, this model)"}.get)
from_service = source == "service"
lo = pd.Timestamp(loaded.scores["timestamp"].min()).date()
hi = pd.Timestamp(loaded.scores["timestamp"].max()).date()
f = st.columns([3, 2, 2, 3, 2])
dates = None if from_service else f[0].date_input("Activity between", value=(lo, hi), min_value=lo, max_value=hi,
                                                  key="q_dates")
min_amount = f[1].number_input("Min amount", min_value=0.0, value=0.0, step=10.0, key="q_min_amount")
label = f[2].selectbox("Known label", ["any", "fraud", "not_fraud"], key="q_label",
                       format_func={"any": "any", "fraud": "has known fraud", "not_fraud": "no known fraud"}.get)
states = f[3].multiselect("State", list(STATES), default=[], key="q_states",
                          format_func=comp.STATE_LABELS.get, placeholder="any state")
assignees = ["(anyone)", "(unassigned)"] + ([who] if who else [])
assignee = f[4].selectbox("Assignee", assignees, key="q_assignee")

kw: dict = {}
if isinstance(dates, (tuple, list)) and len(dates) == 2:
    kw["date_from"], kw["date_to"] = dates[0], dates[1]
if min_amount:
    kw["min_amount"] = float(min_amount)
if label != "any":
    kw["label"] = label
if states:
    kw["state"] = states
if assignee == "(unassigned)":
    kw["assignee"] = ""
elif assignee not in ("(anyone)", "(unassigned)"):
    kw["assignee"] = assignee
q = store.queue(sha, thr["review"], source_id=service_src if from_service else comp.data_source_id(loaded), **kw)
q["band"] = [cv.decision_band(p, thr["review"], thr["decline"]) for p in q["max_probability"]]
q["entity"] = q["entity_id"].map(cv.mask)
q["state_label"] = q["state"].map(comp.STATE_LABELS)

m = st.columns(4)
m[0].metric("Cases in queue", f"{len(q):,}")
m[1].metric("Decline band", f"{int((q['band'] == 'decline').sum()):,}")
m[2].metric("Unassigned", f"{int(q['assignee'].isna().sum()):,}")
m[3].metric("Pending approval", f"{int((q['state'] == 'pending_approval').sum()):,}")

ids = q["case_id"].tolist()
table_key = f"queue_{source}_{loaded.bundle.short_sha}_{hash(tuple(sorted(map(str, kw.items()))))}"
st.dataframe(
    q, key=table_key, on_select="rerun", selection_mode="single-row", hide_index=True, height=380,
    column_order=["case_id", "entity", "max_probability", "band", "state_label", "assignee", "n_transactions",
                  "n_known_fraud", "max_amount", "last_ts"],
    column_config={
        "case_id": st.column_config.NumberColumn("Case", format="%d"),
        "entity": st.column_config.TextColumn("Entity", help="card numbers masked"),
        "max_probability": st.column_config.ProgressColumn("Max fraud probability", min_value=0.0, max_value=1.0,
                                                           format="%.3f"),
        "band": st.column_config.TextColumn("Band"),
        "state_label": st.column_config.TextColumn("State"),
        "assignee": st.column_config.TextColumn("Assignee"),
        "n_transactions": st.column_config.NumberColumn("Transactions", format="%d"),
        "n_known_fraud": st.column_config.NumberColumn("Known frauds", format="%d"),
        "max_amount": st.column_config.NumberColumn("Max amount", format="%.2f"),
        "last_ts": st.column_config.DatetimeColumn("Last seen", format="YYYY-MM-DD HH:mm"),
    },
)
csv_download(q[["case_id", "entity", "max_probability", "band", "state_label", "assignee", "n_transactions",
              "n_known_fraud", "max_amount", "last_ts"]], "queue.csv", key="dl_queue_csv")
sel = state.selected_row_id(table_key, ids)
if sel is None and ids:
    sel = ids[0]
if sel is None:
    st.info("No case matches: the queue holds entities whose highest fraud probability reaches the review "
            "threshold.")
    st.stop()

case = store.get_case(int(sel))
st.markdown(f"Selected case **{case['id']}** · {md(cv.mask(case['entity_id']))} · max probability "
            f"**{case['max_probability']:.3f}** · {comp.STATE_LABELS.get(case['state'])} · assignee "
            f"**{md(case['assignee'] or 'nobody')}**")
c1, c2, c3 = st.columns([3, 1, 1], vertical_alignment="bottom")
may_assign = ac.can(ident, ac.ASSIGN)
if may_assign:
    users = ac.assignable_users(ac.users_path()) or []
    choices = sorted(set(users) | {who})
    target = c1.selectbox("Assign to", choices, index=choices.index(who), key="q_assign_to",
                          help="a signed-in user who works cases (from the credentials file)")
    if c2.button("Assign", key="q_assign", width="stretch"):
        try:  # checked at the action, not only by hiding the button
            actor = ac.require(comp.signed_in(), ac.ASSIGN).name
            if target not in choices:
                raise ac.AccessDenied(f"{ascii(target)[:60]} is not a user who works cases")
            store.assign(case["id"], target, actor=actor, expected_version=case["version"])
            st.rerun()
        except (CaseStoreError, ac.AccessDenied) as e:
            st.error(md(e))
if from_service:
    c3.caption("A service case's history is in the service's history store: its explanation is at "
               "GET /v1/explanations/<transaction id> (the case page opens file cases).")
elif c3.button("Open case →", type="primary", key="q_open", width="stretch"):
    state.set_entity(case["entity_id"])
    state.set_query(case["max_transaction_id"])
    st.switch_page("pages/case.py")
if not may_assign:
    st.caption(f"Your role ({ident.role if ident else 'none'}) reads the queue: it does not assign cases.")
