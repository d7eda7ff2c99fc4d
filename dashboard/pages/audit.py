"""Audit: the case store's append-only audit log, filtered by case, analyst and action, with the
hash-chain verdict (verified now, on this page run) and a CSV export (card numbers masked, every
text cell neutralised against formula injection: engine.cases.store.audit_csv).

Text from the log (names, notes, JSON) is shown in a table as plain text, never as markdown."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from dashboard import components as comp
from dashboard import state
from engine.cases import view as cv
from engine.cases.store import audit_csv
from engine.serve import access as ac

state.ensure_entrypoint()
st.title("Audit log")
if comp.access.deny(ac.VIEW_AUDIT):  # supervisors, auditors and admins
    st.stop()
store = comp.get_store()

verdict = store.verify_audit_chain()
if verdict.ok:
    st.success(verdict.message, icon=":material/verified:")
else:
    st.error(f"{verdict.message}. The log was changed outside fraudlens; keep this file for the "
             "investigation and restore the store from a verified copy.", icon=":material/gpp_bad:")
st.caption("Every action on a case is written, in the same transaction, to an append-only log; each "
           "row carries the hash of the previous one, so a changed, removed or reordered row is named "
           "here. Verified again on every visit of this page.")

full = store.audit_log()
actions = sorted(full["action"].unique().tolist()) if len(full) else []
f = st.columns([2, 3, 4])
case_text = f[0].text_input("Case id", key="audit_case", placeholder="any case")
analyst = f[1].text_input("Analyst", key="audit_analyst", placeholder="anyone", max_chars=128,
                          help="Lookalike spellings (case, zero-width or Cyrillic/Greek letters) find the "
                               "same person.")
chosen = f[2].multiselect("Action", actions, key="audit_actions", placeholder="any action")

kw: dict = {}
if case_text.strip():
    try:
        kw["case_id"] = int(case_text.strip())
    except ValueError:
        st.error(f"Case id: expected a whole number, got {case_text.strip()[:40]!r}.")
        st.stop()
if analyst.strip():
    kw["actor"] = analyst.strip()
if chosen:
    kw["action"] = chosen
log = store.audit_log(**kw) if kw else full

m = st.columns(3)
m[0].metric("Rows shown", f"{len(log):,}")
m[1].metric("Rows in the log", f"{len(full):,}")
m[2].metric("Chain", "intact" if verdict.ok else f"broken at row {verdict.first_broken_id}")


def _text(v: object) -> str | None:
    return None if v is None else json.dumps(v, sort_keys=True, ensure_ascii=False)


view = pd.DataFrame({
    "id": log["id"], "ts": log["ts"], "actor": log["actor"], "action": log["action"],
    "case_id": log["case_id"].astype("Int64"),
    "model": log["model_sha256"].map(lambda s: s[:12] if isinstance(s, str) else None),
    "before": log["before"].map(_text), "after": log["after"].map(_text),
    "row_hash": log["row_hash"].map(lambda s: s[:16] if isinstance(s, str) else None),
})
st.dataframe(
    cv.mask_frame(view, skip=("ts", "model", "row_hash")), hide_index=True, key="audit_table", height=480,
    column_config={
        "id": st.column_config.NumberColumn("Row", format="%d"),
        "ts": st.column_config.TextColumn("Time (UTC)"),
        "actor": st.column_config.TextColumn("Analyst"),
        "action": st.column_config.TextColumn("Action"),
        "case_id": st.column_config.NumberColumn("Case", format="%d"),
        "model": st.column_config.TextColumn("Model"),
        "before": st.column_config.TextColumn("Before"),
        "after": st.column_config.TextColumn("After"),
        "row_hash": st.column_config.TextColumn("Row hash", help="first 16 hex digits of the row's SHA-256"),
    },
)
st.download_button("Download as CSV", data=audit_csv(log), file_name="fraudlens-audit-log.csv",
                   mime="text/csv", key="audit_csv", icon=":material/download:",
                   help="The rows shown; card numbers masked, cells neutralised against formula injection.")
