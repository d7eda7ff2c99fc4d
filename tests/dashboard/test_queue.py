"""Case queue page and the case page's disposition panel through Streamlit's AppTest (tiny
model + demo-data slice from tests/dashboard/test_app.py's ``world`` fixture; a temp case store
via FRAUDLENS_DATA_DIR)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.cases.store import CaseStore

from dashboard.components.access import SESSION_KEY
from engine.serve import access as ac
from test_app import APP, TIMEOUT, USERS, _ok, signed_in, users_file, world  # noqa: F401 - the shared fixtures

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def qenv(world, monkeypatch, tmp_path, users_file):  # noqa: F811
    monkeypatch.setenv("FRAUDLENS_USERS", str(users_file))
    monkeypatch.delenv("FRAUDLENS_DEMO", raising=False)
    monkeypatch.setenv("FRAUDLENS_DATA", str(world["data"]))
    monkeypatch.setenv("FRAUDLENS_SPEC", world["spec"])
    monkeypatch.setenv("FRAUDLENS_MODEL", str(world["model"]))
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("FRAUDLENS_ANALYST", raising=False)
    monkeypatch.setenv("FRAUDLENS_PSEUDONYM_SALT", "test")
    monkeypatch.delenv("FRAUDLENS_FOUR_EYES", raising=False)
    monkeypatch.delenv("FRAUDLENS_MAX_ROWS", raising=False)
    return {**world, "db": tmp_path / "cases.sqlite3"}


def _as(at: AppTest, user: str) -> AppTest:
    at.session_state[SESSION_KEY] = ac.Identity(user, USERS[user], "password")
    return at


def _queue(env, user: str = "alice") -> AppTest:
    at = signed_in(user)
    at.switch_page("pages/queue.py")
    at.run()
    return at


def _flagged(env, thr=0.5):
    rk = env["ranking"]
    return rk.loc[rk["max_probability"] >= thr, "entity_id"].tolist()


def _table(at):
    """The work table as sent ([0] is the threshold quality table), with the case's raw entity_id,
    priority and assignee joined by case id from the store: the page sends only the columns it
    shows (the raw ids stay on the server, see test_raw_ids_stay_on_server.py)."""
    t = at.dataframe[1].value
    with CaseStore(Path(os.environ["FRAUDLENS_DATA_DIR"]) / "cases.sqlite3") as s:
        cases = [s.get_case(int(c)) for c in t["case_id"]]
    return t.assign(**{c: [case[c] for case in cases] for c in ("entity_id", "priority", "assignee")})


def _tick(at: AppTest, rows: list[int]) -> AppTest:
    """Tick rows of the work table (as the browser's row checkboxes do) and rerun."""
    at.session_state[at.session_state["work_table_key"]] = {"selection": {"rows": rows, "columns": []}}
    return at.run()


def _priority_order(env, thr=0.5):
    with CaseStore(env["db"]) as s:
        return s.queue(env["bundle"].sha256, thr, order="priority")["entity_id"].tolist()


def test_work_queue_lists_open_cases_by_priority(qenv):
    at = _queue(qenv)
    _ok(at)
    assert at.title[0].value == "Work queue"
    assert "work list" in at.caption[0].value and "Open a case from data" in at.caption[0].value
    assert at.session_state["work_view"] == "mine"  # the default: my open cases
    assert _table(at).empty and any("no open cases" in i.value for i in at.info)
    at.segmented_control(key="work_view").set_value("open").run()
    _ok(at)
    table = _table(at)
    expected = _priority_order(qenv)
    assert set(expected) == set(_flagged(qenv))
    assert table["entity_id"].tolist() == expected
    assert table["priority"].is_monotonic_decreasing
    assert (table["max_probability"] >= 0.5).all()
    assert {m.label: m.value for m in at.metric}["Cases shown"] == f"{len(expected):,}"
    assert table["state_label"].tolist() == ["open"] * len(expected)  # full labels, not cut
    assert all(t.startswith(("on time", "due soon", "overdue")) for t in table["sla_text"])
    assert all(re.fullmatch(r"P[123] · \d\.\d\d", p) for p in table["priority_label"])
    assert all(re.fullmatch(r"[\d,]+\.\d\d( [A-Z]{3})?", a) for a in table["amount_text"])
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", t) for t in table["last_seen"])
    assert any(t.value == "alice · analyst" for t in at.sidebar.text)  # the signed-in user, not a typed name
    assert not at.sidebar.text_input  # no name box
    # nothing ticked: the actions are off, and nothing is acted on
    assert at.button(key="q_assign").disabled and at.button(key="q_open").disabled
    assert any("Tick one or more rows" in m.value for m in at.markdown)
    with CaseStore(qenv["db"]) as s:  # every entity upserted under the model's sha
        assert len(s.queue(qenv["bundle"].sha256, 0.0)) == len(qenv["ranking"])


def test_claim_next_case(qenv):
    at = _queue(qenv, "alice")
    at.button(key="q_claim").click().run()
    _ok(at)
    top = _priority_order(qenv)[0]
    assert any("Claimed case" in m.value for m in at.success)
    assert at.session_state["work_view"] == "mine"
    assert _table(at)["entity_id"].tolist() == [top]  # my open cases: the one just claimed
    assert _table(at)["assignee"].tolist() == ["alice"]
    assert not at.button(key="q_open").disabled  # the claimed case can be opened at once
    with CaseStore(qenv["db"]) as s:
        a = s.audit_log(action="claimed")
        assert a["actor"].tolist() == ["alice"] and s.verify_audit_chain().ok
    at.button(key="q_claim").click().run()  # the next one goes to the next priority
    assert _table(at)["entity_id"].tolist() == sorted(_priority_order(qenv)[:2], key=_priority_order(qenv).index)


def test_claim_refused_for_auditor(qenv):
    at = _queue(qenv, "erin")
    _ok(at)
    assert not [b for b in at.button if b.key == "q_claim"]
    assert at.session_state["work_view"] == "open"


def test_bulk_assign_with_confirmation(qenv):
    at = _queue(qenv, "bob")
    at.segmented_control(key="work_view").set_value("unassigned").run()
    assert at.selectbox(key="q_assign_to").value == "bob"  # prefilled with the signed-in user
    assert at.selectbox(key="q_assign_to").options == ["alice", "bob", "carol"]  # users who work cases
    _tick(at, [0, 2])
    _ok(at)
    assert not at.button(key="q_assign").disabled
    assert at.button(key="q_open").disabled  # two ticked: open needs exactly one
    ticked = [_table(at)["entity_id"].iloc[i] for i in (0, 2)]
    at.selectbox(key="q_assign_to").set_value("carol")
    at.button(key="q_assign").click().run()
    _ok(at)
    assert any("Assigned 2 cases to carol" in m.value for m in at.success)
    assert any("Assigned 2 cases to carol" in t.value for t in at.toast)
    with CaseStore(qenv["db"]) as s:
        q = s.queue(qenv["bundle"].sha256, 0.0)
        got = q.loc[q["entity_id"].isin(ticked)]
        assert set(got["assignee"]) == {"carol"} and set(got["state"]) == {"assigned"}
        a = s.audit_log(action="bulk_assigned")
        assert len(a) == 2 and set(a["actor"]) == {"bob"}
    assert not set(ticked) & set(_table(at)["entity_id"])  # no longer unassigned
    assert any("Tick one or more rows" in m.value for m in at.markdown)  # the ticks do not move to other rows
    assert at.button(key="q_assign").disabled


def test_closed_cases_hidden_by_default(qenv):
    at = _queue(qenv, "bob")
    at.segmented_control(key="work_view").set_value("open").run()
    first = _table(at)["entity_id"].iloc[0]
    with CaseStore(qenv["db"]) as s:
        cid = int(s.queue(qenv["bundle"].sha256, 0.0).set_index("entity_id").loc[first, "case_id"])
        s.record_disposition(cid, "closed_no_action", "reviewed: regular customer", analyst="bob")
    at.run()
    assert first not in _table(at)["entity_id"].tolist()
    at.segmented_control(key="work_view").set_value("all").run()
    t = _table(at)
    assert t.set_index("entity_id").loc[first, "state_label"] == "closed, no action"
    assert t.set_index("entity_id").loc[first, "sla_text"] == "closed"


def test_queue_filters_and_thresholds(qenv):
    at = _queue(qenv, "bob")
    at.segmented_control(key="work_view").set_value("open").run()
    at.selectbox(key="q_label").set_value("fraud").run()
    _ok(at)
    t = _table(at)
    assert (t["n_known_fraud"].fillna(0) > 0).all()
    at.selectbox(key="q_label").set_value("any").run()
    at.number_input(key="thr_review").set_value(0.9)
    at.number_input(key="thr_decline").set_value(0.95)
    at.button(key="FormSubmitter:thresholds_form-Save thresholds for this model").click().run()
    _ok(at)
    with CaseStore(qenv["db"]) as s:
        t = s.get_thresholds(qenv["bundle"].sha256)
        assert (t.review, t.decline, t.updated_by) == (0.9, 0.95, "bob")
        audit = s.audit_log(model_sha256=qenv["bundle"].sha256)
        assert "thresholds_set" in audit["action"].tolist()
    assert set(_table(at)["entity_id"]) == set(_flagged(qenv, 0.9))


def test_case_page_disposition_requires_note_and_four_eyes(qenv, monkeypatch):
    monkeypatch.setenv("FRAUDLENS_FOUR_EYES", "1")
    first = _flagged(qenv)[0]
    at = signed_in("alice")
    at.session_state["entity_id"] = first
    at.switch_page("pages/case.py")
    at.run()
    _ok(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Decision band"] in {"review", "decline", "below review"}
    assert metrics["Case state"] == "open"
    at.radio(key="disp_choice").set_value("confirmed_fraud")
    at.button(key="FormSubmitter:disposition_form-Record disposition").click().run()
    assert any("note is required" in e.value for e in at.error)
    at.radio(key="disp_choice").set_value("confirmed_fraud")
    at.text_area(key="disp_note").set_value("=HYPERLINK(\"x\") same merchant burst")
    at.button(key="FormSubmitter:disposition_form-Record disposition").click().run()
    assert any("fraud type" in e.value for e in at.error)  # confirmed fraud needs its type
    at.radio(key="disp_choice").set_value("confirmed_fraud")
    at.selectbox(key="disp_fraud_type").set_value("card_testing")
    at.number_input(key="disp_loss").set_value(1234.5)
    at.text_area(key="disp_note").set_value("=HYPERLINK(\"x\") same merchant burst")
    at.button(key="FormSubmitter:disposition_form-Record disposition").click().run()
    assert not at.exception
    assert {m.label: m.value for m in at.metric}["Case state"] == "pending approval"
    assert not [b for b in at.button if b.label == "Approve"]  # the proposer cannot approve
    # a recorded disposition clears the form (no outcome preselected): a second click proposes nothing
    assert (at.radio(key="disp_choice").value, at.selectbox(key="disp_fraud_type").value,
            at.number_input(key="disp_loss").value, at.text_area(key="disp_note").value) == (None, "", None, "")
    # recording on the pending case would replace the proposal: refused unless "Replace" is ticked
    at.radio(key="disp_choice").set_value("escalate")
    at.text_area(key="disp_note").set_value("second attempt")
    at.button(key="FormSubmitter:disposition_form-Record disposition").click().run()
    assert any("Replace the pending proposal" in e.value for e in at.error)
    with CaseStore(qenv["db"]) as s:
        q = s.queue(qenv["bundle"].sha256, 0.0)
        h = s.history(int(q.loc[q["entity_id"] == first, "case_id"].iloc[0]))
        assert h["note"].tolist() == ["=HYPERLINK(\"x\") same merchant burst"]  # the proposal stands
    _as(at, "bob").run()  # another signed-in user, a supervisor
    # the supervisor reads the proposal before approving it (as text: the formula stays literal)
    table = next(d.value for d in at.dataframe if "proposal" in d.value.columns)
    prop = dict(zip(table.iloc[:, 0], table["proposal"]))
    assert (prop["Outcome"], prop["Fraud type"], prop["Proposed by"], prop["Note"]) == (
        "Confirmed fraud", "Card testing", "alice", "=HYPERLINK(\"x\") same merchant burst")
    assert prop["Loss"].startswith("1,234.50") and prop["Exposure"] == "not recorded"
    at.text_area(key="approve_note").set_value("agreed")
    at.button(key="FormSubmitter:approve_form-Approve").click().run()
    _ok(at)
    assert {m.label: m.value for m in at.metric}["Case state"] == "confirmed fraud"
    with CaseStore(qenv["db"]) as s:
        q = s.queue(qenv["bundle"].sha256, 0.0)
        cid = int(q.loc[q["entity_id"] == first, "case_id"].iloc[0])
        h = s.history(cid)
        assert h["analyst"].tolist() == ["alice", "bob"] and h["kind"].tolist() == ["disposition", "approval"]
    exports = ["Download PDF", "Download JSON", "Download CSV"]
    assert not [b for b in at.get("download_button") if b.label in exports]  # built on request, in the run
    at.button(key="dl_prepare").click().run()
    _ok(at)
    assert [b.label for b in at.get("download_button") if b.label in exports] == exports

    # undoing the approved fraud takes two people as well
    _as(at, "alice").run()
    at.radio(key="disp_choice").set_value("false_positive")
    at.selectbox(key="disp_fraud_type").set_value("")
    at.number_input(key="disp_loss").set_value(None)
    at.text_area(key="disp_note").set_value("customer confirmed the purchases")
    at.button(key="FormSubmitter:disposition_form-Record disposition").click().run()
    _ok(at)
    assert {m.label: m.value for m in at.metric}["Case state"] == "pending approval"
    assert any(w.value.startswith("False positive proposed by **alice**") for w in at.warning)
    _as(at, "bob").run()
    # the supervisor may send a proposal back instead: the case stays confirmed fraud (its last applied one)
    at.text_area(key="approve_note").set_value("")
    at.button(key="FormSubmitter:approve_form-Send back").click().run()
    assert any("note is required to send a proposal back" in e.value for e in at.error)
    at.text_area(key="approve_note").set_value("the chargeback evidence stands")
    at.button(key="FormSubmitter:approve_form-Send back").click().run()
    _ok(at)
    assert {m.label: m.value for m in at.metric}["Case state"] == "confirmed fraud"
    assert any("Sent back by bob" in s.value for s in at.success)
    _as(at, "alice").run()  # alice proposes the reversal again; bob approves it this time
    at.radio(key="disp_choice").set_value("false_positive")
    at.text_area(key="disp_note").set_value("customer confirmed the purchases, with receipts")
    at.button(key="FormSubmitter:disposition_form-Record disposition").click().run()
    _as(at, "bob").run()
    at.text_area(key="approve_note").set_value("call recording checked")
    at.button(key="FormSubmitter:approve_form-Approve").click().run()
    _ok(at)
    assert {m.label: m.value for m in at.metric}["Case state"] == "false positive"
    assert any("Approved by bob: false positive." in s.value for s in at.success)


def test_queue_lists_the_scoring_services_cases_without_their_file(qenv):
    """Cases the scoring service opened (source "<model sha>/service:<spec>") are listed when the
    queue's source is switched to the service; the file's cases are not mixed in."""
    import pandas as pd

    from engine.serve.casework import service_source_id

    b = qenv["bundle"]
    with CaseStore(qenv["db"]) as s:
        s.upsert_cases(b.sha256, pd.DataFrame([
            {"entity_id": "live-card-1", "max_probability": 0.97, "max_transaction_id": "tx-9",
             "first_ts": pd.Timestamp("2031-01-01"), "last_ts": pd.Timestamp("2031-01-02"), "max_amount": 12.0,
             "n_transactions": 3, "n_known_fraud": 0},
            {"entity_id": "live-card-2", "max_probability": 0.01, "max_transaction_id": "tx-1",
             "first_ts": pd.Timestamp("2031-01-01"), "last_ts": pd.Timestamp("2031-01-01"), "max_amount": 5.0,
             "n_transactions": 1, "n_known_fraud": 0}]), source_id=service_source_id(b))
    at = _queue(qenv)
    at.segmented_control(key="work_view").set_value("open").run()
    assert "live-card-1" not in _table(at)["entity_id"].tolist()
    at.radio(key="q_source").set_value("service").run()
    _ok(at)
    assert _table(at)["entity_id"].tolist() == ["live-card-1"]  # the one at or above review
    assert not [x for x in at.button if x.key == "q_open"]


def _frame(at, which):
    """The Notes (``"notes"``) or Disposition history (``"history"``) table of the case page."""
    for d in at.dataframe:
        cols = set(d.value.columns)
        if which == "history" and {"outcome", "note"} <= cols:
            return d.value
        if which == "notes" and {"kind", "note"} <= cols and "outcome" not in cols:
            return d.value
    raise AssertionError(f"no {which} table")


def _case_page(env, user="alice"):
    first = _flagged(env)[0]
    at = signed_in(user)
    at.session_state["entity_id"] = first
    at.switch_page("pages/case.py")
    at.run()
    _ok(at)
    return at, first


def _case_id(env, entity):
    with CaseStore(env["db"]) as s:
        q = s.queue(env["bundle"].sha256, 0.0)
        return int(q.loc[q["entity_id"] == entity, "case_id"].iloc[0])


def test_notes_without_disposition_and_close_no_action(qenv):
    at, first = _case_page(qenv)
    assert at.radio(key="disp_choice").options == ["Confirmed fraud", "False positive", "Escalate",
                                                   "Close, no action"]
    assert at.selectbox(key="disp_fraud_type").options[1:] == [
        "Card testing", "Account takeover", "Lost or stolen card", "Card not present",
        "Compromised terminal or merchant", "First-party fraud", "Other"]
    # a note on its own: no disposition, and the Notes panel shows it at once
    at.text_area(key="note_text").set_value("called the card holder, no answer")
    at.button(key="FormSubmitter:note_form-Add note").click().run()
    _ok(at)
    notes = _frame(at, "notes")
    assert notes["note"].tolist() == ["called the card holder, no answer"] and notes["kind"].tolist() == ["note"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", notes["time"].iloc[0])
    assert {m.label: m.value for m in at.metric}["Case state"] == "open"
    # a disposition with a note: the note is in the Notes panel right away too
    at.radio(key="disp_choice").set_value("closed_no_action")
    at.text_area(key="disp_note").set_value("regular customer, nothing to do")
    at.button(key="FormSubmitter:disposition_form-Record disposition").click().run()
    _ok(at)
    assert {m.label: m.value for m in at.metric}["Case state"] == "closed, no action"
    notes = _frame(at, "notes")
    assert notes["note"].tolist() == ["called the card holder, no answer", "regular customer, nothing to do"]
    hist = _frame(at, "history")
    assert hist["outcome"].tolist() == ["Close, no action"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", hist["time"].iloc[0])  # no raw ISO
    assert not any("No notes yet" in c.value for c in at.caption)
    # a fraud type on a closed-no-action outcome is refused; a negative loss cannot be entered
    at.radio(key="disp_choice").set_value("closed_no_action")
    at.selectbox(key="disp_fraud_type").set_value("other")
    at.text_area(key="disp_note").set_value("x")
    at.button(key="FormSubmitter:disposition_form-Record disposition").click().run()
    assert any("has no fraud type" in e.value for e in at.error)
    assert at.number_input(key="disp_loss").min == 0.0
    with CaseStore(qenv["db"]) as s:
        cid = _case_id(qenv, first)
        assert s.history(cid)["disposition"].tolist() == ["closed_no_action"]
        assert s.notes(cid)["analyst"].tolist() == ["alice"]


def test_disposition_amounts_and_narrative_reach_the_report(qenv):
    import io
    import json

    at, first = _case_page(qenv, "bob")
    at.radio(key="disp_choice").set_value("escalate")
    at.selectbox(key="disp_fraud_type").set_value("account_takeover")
    at.number_input(key="disp_loss").set_value(250.0)
    at.number_input(key="disp_exposure").set_value(1234.5)
    at.text_area(key="disp_note").set_value("new device, password reset, 3 transfers")
    at.button(key="FormSubmitter:disposition_form-Record disposition").click().run()
    _ok(at)
    assert any("account takeover" in m.value and "1,234.50" in m.value for m in at.success)
    cid = _case_id(qenv, first)
    k = f"narrative_text_{cid}"
    at.text_area(key=k).set_value("Account taken over on 2 Jan; 3 transfers to a new payee.")
    at.button(key=f"FormSubmitter:narrative_form_{cid}-Save narrative").click().run()
    _ok(at)
    with CaseStore(qenv["db"]) as s:
        h = s.history(cid).iloc[-1]
        assert (h["fraud_type"], h["loss_amount"], h["exposure_amount"]) == ("account_takeover", 250.0, 1234.5)
        a = s.audit_log(cid, action="narrative_saved")
        assert a["actor"].tolist() == ["bob"] and a["after"].iloc[0]["narrative"].startswith("Account taken over")
    at.button(key="dl_prepare").click().run()
    _ok(at)
    exports = ["Download PDF", "Download JSON", "Download CSV"]
    assert [b.label for b in at.get("download_button") if b.label in exports] == exports
    from engine.cases import report as rp
    from dashboard.components import export as ex

    rep = [v for key, v in ex._CACHE.items() if key[0] == "report" and key[1] == cid and isinstance(v, dict)][-1]
    n = rep["narrative"]
    assert n["analyst_narrative"]["text"] == "Account taken over on 2 Jan; 3 transfers to a new payee."
    assert (n["disposition"]["fraud_type"], n["disposition"]["exposure_amount"]) == ("account_takeover", 1234.5)
    assert rp.report_filename(rep, "pdf").startswith(f"fraudlens-case{cid}-")
    doc = json.loads(rp.to_json(rep))
    assert doc["narrative"]["disposition"]["loss_amount"] == 250.0
    from pypdf import PdfReader

    pdf = [v for key, v in ex._CACHE.items() if key[-1] == "pdf" and key[1] == cid][-1]
    text = " ".join(" ".join(p.extract_text() for p in PdfReader(io.BytesIO(pdf)).pages).split())
    assert text.index("Account taken over on 2 Jan") < text.index("2. Evidence")
    assert "1,234.50" in text and "Account takeover" in text


def test_a_supervisor_opens_on_the_proposals_waiting_for_them(qenv):
    """Analyst trial: a supervisor landed on "My open cases" (0) with nothing pointing at the
    proposal waiting for them. With one waiting, the queue opens on "Waiting for my approval",
    which lists the others' proposals, never the supervisor's own."""
    _queue(qenv, "alice")  # creates the cases
    first, second = _flagged(qenv)[:2]
    with CaseStore(qenv["db"], four_eyes=True) as s:
        q = s.queue(qenv["bundle"].sha256, 0.0)
        ids = {e: int(q.loc[q["entity_id"] == e, "case_id"].iloc[0]) for e in (first, second)}
        s.record_disposition(ids[first], "confirmed_fraud", "skimmed", analyst="alice", fraud_type="card_testing")
        s.record_disposition(ids[second], "confirmed_fraud", "mine", analyst="bob", fraud_type="card_testing")
    at = _queue(qenv, "bob")
    _ok(at)
    assert at.session_state["work_view"] == "approve"
    assert _table(at)["case_id"].tolist() == [ids[first]]  # alice's, not bob's own proposal
    at = _queue(qenv, "alice")  # an analyst approves nothing: no such view
    assert at.session_state["work_view"] == "mine"
    opts = at.segmented_control(key="work_view").options
    assert "My open cases" in opts and "Waiting for my approval" not in opts
