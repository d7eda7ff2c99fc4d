"""Case queue page and the case page's disposition panel through Streamlit's AppTest (tiny
model + demo-data slice from tests/dashboard/test_app.py's ``world`` fixture; a temp case store
via FRAUDLENS_DATA_DIR)."""

from __future__ import annotations

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


def test_queue_lists_flagged_entities_ranked(qenv):
    at = _queue(qenv)
    _ok(at)
    assert at.title[0].value == "Case queue"
    table = at.dataframe[1].value  # [0] is the threshold quality table
    expected = _flagged(qenv)
    assert table["entity_id"].tolist() == expected
    assert table["max_probability"].is_monotonic_decreasing
    assert (table["max_probability"] >= 0.5).all()
    assert {m.label: m.value for m in at.metric}["Cases in queue"] == f"{len(expected):,}"
    assert any(t.value == "alice · analyst" for t in at.sidebar.text)  # the signed-in user, not a typed name
    assert not at.sidebar.text_input  # no name box
    with CaseStore(qenv["db"]) as s:  # every entity upserted under the model's sha
        assert len(s.queue(qenv["bundle"].sha256, 0.0)) == len(qenv["ranking"])


def test_queue_filters_and_thresholds(qenv):
    at = _queue(qenv, "bob")
    at.selectbox(key="q_label").set_value("fraud").run()
    _ok(at)
    t = at.dataframe[1].value
    assert (t["n_known_fraud"].fillna(0) > 0).all()
    at.selectbox(key="q_label").set_value("any").run()
    at.number_input(key="thr_review").set_value(0.9)
    at.number_input(key="thr_decline").set_value(0.95)
    at.button[0].click().run()  # "Save thresholds for this model" (first button: the form)
    _ok(at)
    with CaseStore(qenv["db"]) as s:
        t = s.get_thresholds(qenv["bundle"].sha256)
        assert (t.review, t.decline, t.updated_by) == (0.9, 0.95, "bob")
        audit = s.audit_log(model_sha256=qenv["bundle"].sha256)
        assert "thresholds_set" in audit["action"].tolist()
    assert at.dataframe[1].value["entity_id"].tolist() == _flagged(qenv, 0.9)


def test_assign_and_identity(qenv):
    at = _queue(qenv, "bob")
    _ok(at)
    assert at.selectbox(key="q_assign_to").options == ["alice", "bob", "carol"]  # users who work cases
    at.selectbox(key="q_assign_to").set_value("carol")
    at.button(key="q_assign").click().run()
    _ok(at)
    first = _flagged(qenv)[0]
    with CaseStore(qenv["db"]) as s:
        q = s.queue(qenv["bundle"].sha256, 0.0)
        row = q.loc[q["entity_id"] == first].iloc[0]
        assert (row["assignee"], row["state"]) == ("carol", "assigned")
        a = s.audit_log(int(row["case_id"]))
        assert a["actor"].iloc[-1] == "bob" and a["action"].iloc[-1] == "assigned"
    at.selectbox(key="q_assignee").set_value("(unassigned)").run()
    assert first not in at.dataframe[1].value["entity_id"].tolist()


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
    assert not at.exception
    assert {m.label: m.value for m in at.metric}["Case state"] == "pending approval"
    assert not [b for b in at.button if b.label == "Approve"]  # the proposer cannot approve
    _as(at, "bob").run()  # another signed-in user, a supervisor
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
    assert "live-card-1" not in at.dataframe[1].value["entity_id"].tolist()
    at.radio(key="q_source").set_value("service").run()
    _ok(at)
    assert at.dataframe[1].value["entity_id"].tolist() == ["live-card-1"]  # the one at or above review
    assert not [x for x in at.button if x.key == "q_open"]
