"""The Audit page (dashboard/pages/audit.py) through Streamlit's AppTest: the chain verdict, the
filters by case, analyst and action, and the neutralised CSV export (issue 12, item 9)."""

from __future__ import annotations

import csv
import io
import sqlite3

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from engine.cases.store import CaseStore, audit_csv

from test_app import _ok, signed_in, users_file  # noqa: F401 - users_file: a fixture

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
SHA = "d" * 64


@pytest.fixture
def audit_env(monkeypatch, tmp_path, users_file):
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FRAUDLENS_USERS", str(users_file))
    monkeypatch.delenv("FRAUDLENS_FOUR_EYES", raising=False)
    db = tmp_path / "cases.sqlite3"
    rows = pd.DataFrame({"entity_id": ["4111111111111111", "e2"], "max_probability": [0.9, 0.7],
                         "max_transaction_id": ["t1", "t2"], "first_ts": pd.Timestamp("2024-01-01"),
                         "last_ts": pd.Timestamp("2024-01-02"), "max_amount": 5.0, "n_transactions": 2,
                         "n_known_fraud": 0})
    with CaseStore(db, four_eyes=False) as s:
        s.upsert_cases(SHA, rows)                                                   # rows 1, 2
        s.add_note(1, '=HYPERLINK("http://evil.example","verify your card")', analyst="alice")  # 3
        s.record_disposition(2, "escalate", "odd", analyst="\u0430lice")           # 4 (Cyrillic а)
        s.assign(2, "bob", actor="bob")                                             # 5
    return db


def _audit(at: AppTest | None = None, user: str = "bob") -> AppTest:
    """The Audit page, signed in as ``user`` (bob: supervisor; erin: auditor; both may view it)."""
    at = at or signed_in(user)
    at.switch_page("pages/audit.py")
    at.run()
    return at


def test_audit_page_lists_filters_and_verifies(audit_env):
    at = _audit()
    _ok(at)
    assert at.title[0].value == "Audit log"
    assert "intact (5 rows" in at.success[0].value
    table = at.dataframe[0].value
    assert table["id"].tolist() == [5, 4, 3, 2, 1]  # newest first: the latest actions open the page
    assert "4111111111111111" not in " ".join(table["after"].dropna())  # card numbers masked
    at.text_input(key="audit_analyst").set_value("ALICE").run()  # lookalikes are one person
    assert at.dataframe[0].value["id"].tolist() == [4, 3]
    at.text_input(key="audit_analyst").set_value("").run()
    at.text_input(key="audit_case").set_value("2").run()
    assert at.dataframe[0].value["id"].tolist() == [5, 4, 2]
    at.multiselect(key="audit_actions").set_value(["assigned"]).run()
    assert at.dataframe[0].value["id"].tolist() == [5]
    at.text_input(key="audit_case").set_value("two").run()
    assert "whole number" in at.error[0].value


def test_audit_page_names_the_tampered_row(audit_env):
    conn = sqlite3.connect(audit_env, isolation_level=None)
    conn.execute("DROP TRIGGER audit_log_no_update")
    conn.execute("UPDATE audit_log SET actor = 'mallory' WHERE id = 4")
    conn.close()
    at = _audit(user="erin")
    assert not at.exception
    assert "tampered with at row 4" in at.error[0].value
    assert {m.label: m.value for m in at.metric}["Chain"] == "broken at row 4"
    assert "tampered with at row 4" in at.sidebar.error[0].value  # on every page


@pytest.mark.parametrize("edit", [
    "UPDATE audit_log SET actor = CAST(x'ff' AS TEXT) WHERE id = 4",  # text that is not UTF-8
    "UPDATE audit_log SET actor = x'6d616c6c6f7279' WHERE id = 4",    # a BLOB where text belongs
])
def test_an_unreadable_value_still_raises_the_alarm_on_every_page(audit_env, edit):
    """Security review: one such value (no trigger to drop for the untriggered tables) made the
    verification raise, and the alarm caught it and showed nothing."""
    conn = sqlite3.connect(audit_env, isolation_level=None)
    conn.execute("DROP TRIGGER audit_log_no_update")
    conn.execute(edit)
    conn.close()
    at = _audit(user="erin")
    assert not at.exception
    assert "tampered with" in at.sidebar.error[0].value
    assert {m.label: m.value for m in at.metric}["Chain"].startswith("broken")


def test_audit_csv_is_neutralised_and_masked(audit_env):
    with CaseStore(audit_env) as s:
        log = s.audit_log()
    rows = list(csv.DictReader(io.StringIO(audit_csv(log).decode("utf-8"))))
    assert [r["id"] for r in rows] == ["1", "2", "3", "4", "5"]
    note = rows[2]["after"]
    assert '"note":"=HYPERLINK' in note  # inside JSON text: not a formula ...
    assert rows[2]["action"] == "note_added"
    assert all(not v.startswith(("=", "+", "-", "@")) for r in rows for v in r.values())
    assert "4111111111111111" not in audit_csv(log).decode("utf-8")
    forged = log.assign(actor="=cmd|' /C calc'!A0")
    assert {r["actor"] for r in csv.DictReader(io.StringIO(audit_csv(forged).decode()))} == {
        "'=cmd|' /C calc'!A0"
    }


def test_audit_page_who_what_when_for_work_queue_actions(audit_env):
    import re

    with CaseStore(audit_env, four_eyes=False) as s:
        s.claim_next(SHA, 0.0, analyst="carol")                                      # 6 (case 1)
        s.bulk_assign([1, 2], "alice", actor="bob")                                  # 7, 8
        s.record_disposition(1, "confirmed_fraud", "tested", analyst="alice", fraud_type="card_testing",
                             loss_amount=1234.5, currency="USD")                     # 9
        s.save_narrative(1, "Card tested at 3 merchants", analyst="alice")           # 10
    with CaseStore(audit_env, four_eyes=True) as s:
        s.record_disposition(2, "confirmed_fraud", "skimmed", analyst="alice", fraud_type="card_testing",
                             loss_amount=99.5, currency="USD")                       # 12 (11: four-eyes on)
        s.approve(2, "agreed", analyst="bob")                                        # 13
        s.record_export(2, report_id="0f1e2d3c-aaaa", report_sha256="ab" * 32, fmt="pdf", analyst="erin")  # 14
        s.record_disposition(2, "false_positive", "was the customer", analyst="carol")  # 15 (a reversal: pending)
        s.send_back(2, "chargeback evidence stands", analyst="bob")                   # 16
    at = _audit()
    _ok(at)
    t = at.dataframe[0].value
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", x) for x in t["ts"])  # no raw ISO
    what = dict(zip(t["id"], t["summary"]))
    assert what[6] == "claimed to carol"
    assert what[7] == "assigned in bulk to alice (2 cases at once), was carol"
    assert what[9] == "confirmed fraud recorded, case now confirmed fraud, card testing, loss 1,234.50 USD, four-eyes off"
    assert what[12] == ("confirmed fraud recorded, case now pending approval, card testing, loss 99.50 USD, "
                        "under four-eyes")
    assert what[10] == "report narrative saved"
    # the approval row says what was approved (the analyst trial: it named only the proposer)
    assert what[11].startswith("four-eyes switched on for this store")
    assert what[13] == "approved confirmed fraud proposed by alice, card testing, loss 99.50 USD"
    assert what[14] == "report 0f1e2d3c exported as PDF (sha256 abababababab)"
    assert what[16] == "sent back false positive proposed by carol, case now confirmed fraud"
    assert t["id"].tolist() == list(range(16, 0, -1))
    at.multiselect(key="audit_actions").set_value(["claimed", "bulk_assigned"]).run()
    assert at.dataframe[0].value["id"].tolist() == [8, 7, 6]
    at.text_input(key="audit_analyst").set_value("bob").run()
    assert at.dataframe[0].value["id"].tolist() == [8, 7]
    assert "intact (16 rows" in at.success[0].value
    # the export is the rows shown, through the one CSV writer
    with CaseStore(audit_env) as s:
        shown = s.audit_log(actor="bob", action=["claimed", "bulk_assigned"])
    rows = list(csv.DictReader(io.StringIO(audit_csv(shown).decode())))
    assert [r["id"] for r in rows] == ["7", "8"] and {r["action"] for r in rows} == {"bulk_assigned"}
    dl = [b for b in at.get("download_button") if b.label == "Download as CSV"]
    assert dl


def test_audit_page_refused_for_analysts(audit_env):
    at = _audit(user="alice")
    assert not at.dataframe
    assert any("may not view the audit log" in e.value for e in at.error)


def test_audit_page_shows_the_anchor_and_checks_pasted_ones(audit_env):
    with CaseStore(audit_env) as s:
        head = s.audit_anchor()
    at = _audit(user="erin")
    _ok(at)
    assert head.line() in [c.value for c in at.code]  # the anchor to copy off the host
    at.text_area(key="audit_anchors").set_value(f"# from the SIEM\n{head.line()}\n").run()
    assert any("1 anchor(s) match" in m.value and "up to row 5" in m.value for m in at.success)
    # the log rewritten (row 5 changed, its hash recomputed): the chain verifies, the anchor does not
    from engine.cases.store.chain import HASHED_COLUMNS, row_hash

    conn = sqlite3.connect(audit_env, isolation_level=None)
    conn.execute("DROP TRIGGER audit_log_no_update")
    conn.execute("UPDATE audit_log SET actor = 'mallory' WHERE id = 5")
    vals = conn.execute(f"SELECT {', '.join(HASHED_COLUMNS)} FROM audit_log WHERE id = 5").fetchone()
    conn.execute("UPDATE audit_log SET row_hash = ? WHERE id = 5", (row_hash(vals),))
    conn.execute("UPDATE audit_head SET last_hash = ? WHERE id = 1", (row_hash(vals),))
    conn.close()
    at.run()
    errors = [e.value for e in at.error]
    assert any("row 5 no longer has the hash" in e for e in errors), errors
    at.text_area(key="audit_anchors").set_value("row=5 **bold**").run()
    # the error names the line; the pasted text is escaped (shown as text, never as markdown)
    assert any("line 1" in e.value and "\\*\\*bold\\*\\*" in e.value for e in at.error), [e.value for e in at.error]
