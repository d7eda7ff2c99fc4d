"""Work queue: the analyst's work list. Cases whose highest fraud probability reaches the review
threshold, highest priority first (priority and SLA: engine.cases.store.priority), "my open
cases" by default, closed cases hidden unless asked for; claim the next case (atomically), tick
rows to assign them in bulk or open one; per-model review/decline thresholds with their
precision/recall."""

from __future__ import annotations


import pandas as pd
import streamlit as st

from dashboard import components as comp
from dashboard import state
from dashboard.components.safe import csv_download, md
from engine.cases.fmt import format_threshold
from engine.cases import fmt
from engine.cases import view as cv
from engine.cases.store import OPEN_STATES, STATES, CaseStoreError, person_key, priority_level, sla_status
from engine.cases.report import threshold_metrics
from engine.serve import access as ac
from engine.serve.casework import service_source_id

state.ensure_entrypoint()
ss = st.session_state
st.title("Work queue")
st.caption("Your work list: the cases that need a decision, highest priority first. To look at any entity of a "
           "data file, or to choose the data and the model, use **Open a case from data**.")
ident = comp.signed_in()
who = ident.name if ident is not None else None
if comp.access.deny(ac.VIEW_CASES):
    st.stop()

try:
    loaded = state.load_all()
except Exception as e:  # noqa: BLE001
    st.error(md(state.load_or_explain_error(e)), icon=":material/error:")
    st.page_link("pages/cases.py", label="Choose data and model (Open a case from data)",
                 icon=":material/folder_open:")
    st.stop()

store = comp.get_store()
synced = comp.sync_cases(loaded)
sha = loaded.bundle.sha256
thr = loaded.thresholds  # in force (engine.cases.thresholds.thresholds_in_force): the same on every page

# --------------------------------------------------------------------------------- thresholds
with st.expander(f"Thresholds · review **{format_threshold(thr['review'])}** · decline **{format_threshold(thr['decline'])}** "
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

# ------------------------------------------------------------------------------------ actions
FLASH = "work_flash"
# cases of this file, or the ones `fraudlens serve` opened for this model (no file behind them)
source = st.radio("Cases from", ["file", "service"], horizontal=True, key="q_source",
                  format_func={"file": "this file", "service": "the scoring service (fraudlens serve, this model)"}.get)
from_service = source == "service"
src_id = service_source_id(loaded.bundle) if from_service else comp.data_source_id(loaded)
may_assign = ac.can(ident, ac.ASSIGN)


def _flash(kind: str, text: str) -> None:
    ss[FLASH] = (kind, text)


def _claim() -> None:
    try:  # checked at the action, not only by hiding the button
        actor = ac.require(comp.signed_in(), ac.ASSIGN).name
        got = store.claim_next(sha, thr["review"], source_id=src_id, analyst=actor)
    except (CaseStoreError, ac.AccessDenied) as e:
        return _flash("error", md(e))
    if got is None:
        return _flash("info", "Nothing to claim: every open case above the review threshold has an assignee.")
    ss["work_view"] = "mine"
    ss["work_claimed"] = int(got["id"])
    ss["work_nonce"] = ss.get("work_nonce", 0) + 1
    _flash("success", f"Claimed case {got['id']} ({md(cv.mask(got['entity_id']))}, priority "
                      f"{priority_level(got['priority'])}): it is yours now.")


def _bulk_assign(ids: list[int], versions: dict[int, int], choices: list[str]) -> None:
    target = ss.get("q_assign_to")
    try:
        actor = ac.require(comp.signed_in(), ac.ASSIGN).name
        if target not in choices:
            raise ac.AccessDenied(f"{ascii(target)[:60]} is not a user who works cases")
        if not ids:
            raise ValueError("tick at least one case first")
        store.bulk_assign(ids, target, actor=actor, expected_versions=versions)
    except (CaseStoreError, ValueError, ac.AccessDenied) as e:
        return _flash("error", md(e))
    ss["work_nonce"] = ss.get("work_nonce", 0) + 1  # a fresh table: the ticks pointed at rows that moved
    _flash("success", f"Assigned {len(ids)} case{'s' if len(ids) != 1 else ''} to {md(target)} "
                      f"(case {', '.join(map(str, ids))}).")


c_claim, c_msg = st.columns([1, 3], vertical_alignment="center")
if may_assign:
    c_claim.button("Claim next case", type="primary", key="q_claim", on_click=_claim, icon=":material/front_hand:",
                   help="Assigns you the highest-priority unassigned open case (no one else can claim it at the "
                        "same moment).")
else:
    c_claim.caption(f"Your role ({ident.role if ident else 'none'}) reads the queue: it does not claim or assign.")
msg = ss.pop(FLASH, None)
if msg:
    getattr(c_msg, msg[0])(msg[1])
    if msg[0] == "success":
        st.toast(msg[1], icon=":material/check_circle:")

# ------------------------------------------------------------------------------------ filters
st.caption(f"Model `{loaded.bundle.short_sha}` · {loaded.source.summary()} · at "
           f"{fmt.format_ts(synced['scored_at'])}: {synced['created']:,} cases created, {synced['updated']:,} updated "
           "(one case per entity scored; the open views list those with a transaction at or above the review "
           "threshold)")
VIEWS = {"mine": "My open cases", "unassigned": "Unassigned open cases", "open": "All open cases",
         "all": "All cases, closed included"}
may_approve = ac.can(ident, ac.APPROVE)
if may_approve:  # a supervisor's work: the four-eyes proposals of others (their own wait for someone else)
    VIEWS = {"approve": "Waiting for my approval", **VIEWS}
    waiting = store.queue(sha, 0.0, source_id=src_id, state=["pending_approval"])
    n_waiting = int((waiting["pending_by"].fillna("").map(person_key) != person_key(who or "")).sum())
if "work_view" not in ss:
    ss["work_view"] = ("approve" if may_approve and n_waiting else "mine") if may_assign else "open"
view = st.segmented_control("Show", list(VIEWS), format_func=VIEWS.get, key="work_view",
                            selection_mode="single") or "mine"
lo = pd.Timestamp(loaded.scores["timestamp"].min()).date()
hi = pd.Timestamp(loaded.scores["timestamp"].max()).date()
with st.expander("More filters"):
    f = st.columns([3, 2, 2, 3])
    dates = None if from_service else f[0].date_input("Activity between", value=(lo, hi), min_value=lo,
                                                      max_value=hi, key="q_dates")
    min_amount = f[1].number_input("Min amount", min_value=0.0, value=0.0, step=10.0, key="q_min_amount")
    label = f[2].selectbox("Known label", ["any", "fraud", "not_fraud"], key="q_label",
                           format_func={"any": "any", "fraud": "has known fraud", "not_fraud": "no known fraud"}.get)
    allowed = list(STATES) if view == "all" else list(OPEN_STATES)
    states = f[3].multiselect("State", allowed, default=[], key=f"q_states_{view}",
                              format_func=comp.STATE_LABELS.get, placeholder="any state shown")

kw: dict = {"order": "priority"}
if isinstance(dates, (tuple, list)) and len(dates) == 2:
    kw["date_from"], kw["date_to"] = dates[0], dates[1]
if min_amount:
    kw["min_amount"] = float(min_amount)
if label != "any":
    kw["label"] = label
kw["state"] = states or (list(STATES) if view == "all" else list(OPEN_STATES))
if view == "approve":
    kw["state"] = ["pending_approval"]
if view == "mine":
    kw["assignee"] = who or ""
elif view == "unassigned":
    kw["assignee"] = ""
q = store.queue(sha, 0.0 if view == "approve" else thr["review"], source_id=src_id, **kw)
if view == "approve":  # not the proposals of the supervisor signed in (four-eyes: another must approve them)
    q = q[q["pending_by"].fillna("").map(person_key) != person_key(who or "")].reset_index(drop=True)
now = pd.Timestamp.now(tz="UTC").tz_localize(None)
q["band"] = [cv.decision_band(p, thr["review"], thr["decline"]) for p in q["max_probability"]]
q["entity"] = q["entity_id"].map(cv.mask)
q["state_label"] = q["state"].map(comp.STATE_LABELS)
q["priority_label"] = [f"{priority_level(p)} · {p:.2f}" for p in q["priority"]]
created = pd.to_datetime(q["created_at"], utc=True, format="ISO8601").dt.tz_localize(None)
q["age"] = [fmt.format_duration((now - c).total_seconds() / 3600) for c in created]
q["sla"] = [sla_status(d, s, now) for d, s in zip(q["sla_due_at"], q["state"])]
q["sla_text"] = [
    ("closed" if st_ == "closed" else
     f"{st_} · {'overdue by' if st_ == 'overdue' else 'due in'} {fmt.format_duration((d - now).total_seconds() / 3600)}")
    for st_, d in zip(q["sla"], q["sla_due_at"])]
q["amount_text"] = [fmt.format_amount(a, loaded.source.currency) for a in q["max_amount"]]
q["last_seen"] = q["last_ts"].map(fmt.format_ts)
q["assignee_text"] = q["assignee"].fillna("")

m = st.columns(4)
m[0].metric("Cases shown", f"{len(q):,}")
m[1].metric("Overdue", f"{int((q['sla'] == 'overdue').sum()):,}")
m[2].metric("Due soon", f"{int((q['sla'] == 'due soon').sum()):,}")
m[3].metric("Unassigned", f"{int(q['assignee'].isna().sum()):,}")

#: the columns shown; only these are sent (security review: a column hidden with column_order still travels to
#: the browser, and q's raw entity_id is a card number, max_transaction_id a raw id): they stay here, in q
COLS = ["case_id", "priority_label", "entity", "max_probability", "band", "state_label", "assignee_text", "age",
        "sla_text", "amount_text", "n_transactions", "n_known_fraud", "last_seen"]
ids = [int(i) for i in q["case_id"]]  # a ticked row is mapped to its case by position: q[COLS] has q's rows, in order
table_key = f"work_{source}_{loaded.bundle.short_sha}_{view}_{ss.get('work_nonce', 0)}"
ss["work_table_key"] = table_key
event = st.dataframe(
    q[COLS], key=table_key, on_select="rerun", selection_mode="multi-row", hide_index=True, height=380,
    column_config={
        "case_id": st.column_config.NumberColumn("Case", format="%d", width="small"),
        "priority_label": st.column_config.TextColumn("Priority", width="small",
                                                      help="P1/P2/P3 · score from the fraud probability and the "
                                                           "largest amount (docs: engine.cases.store.priority)"),
        "entity": st.column_config.TextColumn("Entity", help="card numbers masked"),
        "max_probability": st.column_config.ProgressColumn("Max fraud probability", min_value=0.0, max_value=1.0,
                                                           format="%.3f"),
        "band": st.column_config.TextColumn("Band", width="small"),
        "state_label": st.column_config.TextColumn("State", width="medium"),
        "assignee_text": st.column_config.TextColumn("Assignee"),
        "age": st.column_config.TextColumn("Age", help="since the case was created"),
        "sla_text": st.column_config.TextColumn("SLA", width="medium", help="P1 24 h, P2 72 h, P3 7 days from creation"),
        "amount_text": st.column_config.TextColumn("Max amount"),
        "n_transactions": st.column_config.NumberColumn("Transactions", format="%d"),
        "n_known_fraud": st.column_config.NumberColumn("Known frauds", format="%d"),
        "last_seen": st.column_config.TextColumn("Last seen"),
    },
)
csv_download(q[COLS], "work-queue.csv", key="dl_queue_csv")
rows = list(getattr(getattr(event, "selection", None), "rows", None) or
            state._get(state._get(ss.get(table_key), "selection"), "rows", []) or [])
picked = [ids[int(r)] for r in rows if 0 <= int(r) < len(ids)]
if not ids:
    st.info({"mine": "You have no open cases. Claim the next case, or show the unassigned ones.",
             "unassigned": "Every open case has an assignee."}.get(
        view, "No case matches: the queue holds entities whose highest fraud probability reaches the review "
              "threshold."))

# ------------------------------------------------------------------------------ on the ticked rows
st.markdown(f"**{len(picked)} case{'s' if len(picked) != 1 else ''} ticked**" if picked else
            "Tick one or more rows to act on them.")
c1, c2, c3 = st.columns([3, 1.3, 1.3], vertical_alignment="bottom")
if may_assign:
    users = ac.assignable_users(ac.users_path()) or []
    choices = sorted(set(users) | ({who} if who else set()))
    c1.selectbox("Assign to", choices, index=choices.index(who) if who in choices else 0, key="q_assign_to",
                 help="a signed-in user who works cases (from the credentials file); you by default",
                 disabled=not picked)
    versions = {int(r.case_id): int(r.version) for r in q.itertuples() if int(r.case_id) in picked}
    c2.button(f"Assign {len(picked) or ''} ticked".replace("  ", " "), key="q_assign", width="stretch",
              disabled=not picked, on_click=_bulk_assign, args=(picked, versions, choices))
one = picked[0] if len(picked) == 1 else ss.get("work_claimed") if not picked and ss.get("work_claimed") in ids else None
if from_service:
    c3.caption("A service case's history is in the service's history store: its explanation is at "
               "GET /v1/explanations/<transaction id> (the case page opens file cases).")
elif c3.button("Open case →" if one is None else f"Open case {one} →", type="primary", key="q_open", width="stretch",
               disabled=one is None, help="tick exactly one case"):
    case = store.get_case(int(one))
    state.set_entity(case["entity_id"])
    state.set_query(case["max_transaction_id"])
    st.switch_page("pages/case.py")
