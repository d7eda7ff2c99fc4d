"""Audit: who did what and when. The case store's append-only audit log (times as
"2026-12-01 14:05:09 UTC", a plain-words summary of each action), newest first, filtered by case,
analyst and action, with the
hash-chain verdict (verified now, on this page run) and a CSV export (card numbers masked, every
text cell neutralised against formula injection: engine.cases.store.audit_csv).

Text from the log (names, notes, JSON) is shown in a table as plain text, never as markdown."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from dashboard import components as comp
from dashboard import state
from dashboard.components.safe import md
from engine.cases import fmt
from engine.cases import view as cv
from engine.cases.store import FRAUD_TYPES, audit_csv
from engine.serve import access as ac

state.ensure_entrypoint()
st.title("Audit log")
if comp.access.deny(ac.VIEW_AUDIT):  # supervisors and auditors (an admin sees no case data)
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
with st.expander("Anchors: a copy of the log's head kept off this host", icon=":material/anchor:"):
    st.caption("The chain is not keyed: someone who can write the store's file could change a row and recompute "
               "every later hash, and the chain above would still verify. Keep the anchor below (the last row's id "
               "and hash) where they cannot write, e.g. a ticket or a SIEM (`fraudlens audit head` in a cron job); "
               "every exported report carries one too. Paste kept anchors, or a report's JSON, to check them: "
               "each anchored row must still be in the log with its hash.")
    anchor = store.audit_anchor()
    if anchor is None:
        st.info("The log is empty: nothing to anchor yet.")
    else:
        st.code(anchor.line(), language=None)
    pasted = st.text_area("Anchors to check", key="audit_anchors", height=100, max_chars=200_000,
                          placeholder="fraudlens-audit-anchor/1 row=... sha256=...")
    if pasted.strip():
        from engine.cases.store.anchor import AnchorFileError, parse_anchors

        try:
            kept = parse_anchors(pasted, "the pasted text")
        except AnchorFileError as e:
            st.error(md(str(e)))
        else:
            check = store.check_audit_anchors(kept)
            if check.ok and not verdict.ok:
                st.warning(f"Each of the {len(kept)} anchored row(s) still has its recorded hash, but the chain above "
                           "is broken: the log is not vouched for.", icon=":material/gpp_maybe:")
            elif check.ok:
                st.success(f"{len(kept)} anchor(s) match: the log up to row {max(a.row_id for a in kept)} is as it "
                           "was when they were taken.", icon=":material/verified:")
            else:
                st.error(md(check.reason), icon=":material/gpp_bad:")

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
        st.error(f"Case id: expected a whole number, got {md(repr(case_text.strip()[:40]))}.")
        st.stop()
if analyst.strip():
    kw["actor"] = analyst.strip()
if chosen:
    kw["action"] = chosen
log = store.audit_log(**kw) if kw else full

m = st.columns(3)
m[0].metric("Rows shown", f"{len(log):,}")
m[1].metric("Rows in the log", f"{len(full):,}")
m[2].metric("Chain", "intact" if verdict.ok else
            f"broken at row {verdict.first_broken_id}" if verdict.first_broken_id is not None else "broken")


def _text(v: object) -> str | None:
    return None if v is None else json.dumps(v, sort_keys=True, ensure_ascii=False)


DISPOSITION_WORDS = {"confirmed_fraud": "confirmed fraud", "false_positive": "false positive", "escalate": "escalate",
                     "closed_no_action": "close, no action"}
STATE_WORDS = comp.STATE_LABELS


def _details(d: dict) -> list[str]:
    """A disposition's fraud type, loss and exposure in words (those recorded)."""
    out = [FRAUD_TYPES.get(d["fraud_type"], d["fraud_type"]).lower()] if d.get("fraud_type") else []
    return out + [f"{k.split('_')[0]} {fmt.format_amount(d[k], d.get('currency') or '')}"
                  for k in ("loss_amount", "exposure_amount") if d.get(k) is not None]


def summary(action: str, before: dict | None, after: dict | None) -> str:
    """One line in words of what an audit row did (the Before/After columns keep every value)."""
    a, b = after or {}, before or {}
    if action in ("assigned", "claimed", "bulk_assigned"):
        verb = {"assigned": "assigned", "claimed": "claimed", "bulk_assigned": "assigned in bulk"}[action]
        who = a.get("assignee")
        text = f"{verb} to {who}" if who else "unassigned"
        if action == "bulk_assigned":
            text += f" ({a.get('batch_size')} cases at once)"
        return text + (f", was {b.get('assignee')}" if b.get("assignee") and b.get("assignee") != who else "")
    if action == "disposition":
        return ", ".join([f"{DISPOSITION_WORDS.get(a.get('disposition'), a.get('disposition'))} recorded, case now "
                          f"{STATE_WORDS.get(a.get('state'), a.get('state'))}", *_details(a),
                          *({True: ["under four-eyes"], False: ["four-eyes off"]}.get(a.get("four_eyes"), []))])
    if action == "approved":
        d = a.get("disposition") or "confirmed_fraud"
        by = f" proposed by {a['proposed_by']}" if a.get("proposed_by") else ""
        return ", ".join([f"approved {DISPOSITION_WORDS.get(d, d)}{by}", *_details(a.get("proposal") or {})])
    if action == "sent_back":
        p = a.get("proposal") or {}
        d = p.get("disposition") or "confirmed_fraud"
        by = f" proposed by {a['proposed_by']}" if a.get("proposed_by") else ""
        return ", ".join([f"sent back {DISPOSITION_WORDS.get(d, d)}{by}, case now "
                          f"{STATE_WORDS.get(a.get('state'), a.get('state'))}", *_details(p)])
    if action in ("four_eyes_on", "four_eyes_off"):
        return ("four-eyes switched on for this store (kept on for every process until switched off)"
                if action == "four_eyes_on" else "four-eyes switched off for this store")
    if action == "approval_refused":
        return "self-approval refused (four-eyes)"
    if action == "report_exported":
        return (f"report {str(a.get('report_id') or '')[:8]} exported as {str(a.get('format') or '').upper()} "
                f"(sha256 {str(a.get('report_sha256') or '')[:12]})")
    if action == "note_added":
        return "note added"
    if action == "narrative_saved":
        return "report narrative saved"
    if action == "thresholds_set":
        return f"thresholds: review {a.get('review')}, decline {a.get('decline')}"
    if action == "case_created":
        return "case created from scoring"
    if action == "score_updated":
        return "score refreshed from scoring"
    return action.replace("_", " ")


log = log.iloc[::-1].reset_index(drop=True)  # newest first: the latest actions, not the first scoring run
view = pd.DataFrame({
    "id": log["id"], "ts": log["ts"].map(lambda t: fmt.format_ts(t, seconds=True)), "actor": log["actor"],
    "action": log["action"],
    "summary": [summary(a, b, c) for a, b, c in zip(log["action"], log["before"], log["after"])],
    "case_id": log["case_id"].astype("Int64"),
    "model": log["model_sha256"].map(lambda s: s[:12] if isinstance(s, str) else None),
    "before": log["before"].map(_text), "after": log["after"].map(_text),
    "row_hash": log["row_hash"].map(lambda s: s[:16] if isinstance(s, str) else None),
})
st.dataframe(
    cv.mask_frame(view, skip=("ts", "model", "row_hash")), hide_index=True, key="audit_table", height=480,
    column_config={
        "id": st.column_config.NumberColumn("Row", format="%d"),
        "ts": st.column_config.TextColumn("When"),
        "actor": st.column_config.TextColumn("Who"),
        "action": st.column_config.TextColumn("Action"),
        "summary": st.column_config.TextColumn("What", width="large"),
        "case_id": st.column_config.NumberColumn("Case", format="%d"),
        "model": st.column_config.TextColumn("Model"),
        "before": st.column_config.TextColumn("Before"),
        "after": st.column_config.TextColumn("After"),
        "row_hash": st.column_config.TextColumn("Row hash", help="first 16 hex digits of the row's SHA-256"),
    },
)
_stamp = pd.Timestamp.now(tz="UTC").strftime("%Y%m%dT%H%M%SZ")
_scope = "-".join(x for x in (f"case{kw['case_id']}" if "case_id" in kw else "",
                              "filtered" if ("actor" in kw or "action" in kw) else "") if x)
st.download_button("Download as CSV", data=audit_csv(log.iloc[::-1]),
                   file_name=f"fraudlens-audit-log{'-' + _scope if _scope else ''}-{_stamp}.csv",
                   mime="text/csv", key="audit_csv", icon=":material/download:",
                   help="The rows shown, oldest first (chain order); card numbers masked, cells neutralised against "
                        "formula injection.")
