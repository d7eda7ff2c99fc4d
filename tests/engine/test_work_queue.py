"""Case store schema v4: the work list (priority, SLA, claim next, bulk assign), disposition
details (fraud type, loss and exposure, close with no action), report narratives, the audit
chain over the new actions, a v3 store migrated, and the display formatters."""

from __future__ import annotations

import sqlite3
import threading

import pandas as pd
import pytest

from engine.cases import fmt
from engine.cases.store import (
    FRAUD_TYPES,
    LATEST_VERSION,
    CaseNotFoundError,
    CaseStore,
    ConflictError,
    connect,
    migrate,
    priority_level,
    priority_score,
    sla_status,
)
from engine.cases.store.audit import AuditMixin

SHA = "c" * 64
SRC = "d" * 64 + "/demo"


def _rows(specs):
    """specs: (entity, probability, amount)."""
    return pd.DataFrame([{
        "entity_id": e, "max_probability": p, "max_transaction_id": f"t-{e}",
        "first_ts": "2024-01-01 10:00", "last_ts": "2024-01-02 10:00", "max_amount": a,
        "n_transactions": 5, "n_known_fraud": 0} for e, p, a in specs])


@pytest.fixture
def store(tmp_path):
    s = CaseStore(tmp_path / "cases.sqlite3", four_eyes=False)
    s.upsert_cases(SHA, _rows([("low", 0.55, 10.0), ("big", 0.7, 9000.0), ("top", 0.95, 50.0),
                               ("below", 0.2, 99999.0)]), source_id=SRC)
    yield s
    s.close()


def _id(s, entity):
    return s.find_case(SHA, SRC, entity)["id"]


def test_priority_formula_and_levels():
    assert priority_score(0.8, 0) == pytest.approx(0.4)            # no amount: half the score
    assert priority_score(0.8, 10_000) == pytest.approx(0.8)       # full weight
    assert priority_score(0.8, 1e9) == pytest.approx(0.8)          # capped
    assert priority_score(0.8, 99) == pytest.approx(0.8 * 0.75, abs=1e-4)  # log10(100)/log10(10001) ~ 0.5
    assert priority_score(0.8, -5) == pytest.approx(0.4)
    assert [priority_level(x) for x in (0.6, 0.59, 0.3, 0.29)] == ["P1", "P2", "P2", "P3"]
    now = pd.Timestamp("2026-12-01 12:00")
    assert sla_status(pd.Timestamp("2026-12-01 11:59"), "open", now) == "overdue"
    assert sla_status(pd.Timestamp("2026-12-01 15:00"), "assigned", now) == "due soon"
    assert sla_status(pd.Timestamp("2026-12-03 15:00"), "escalated", now) == "on time"
    assert sla_status(pd.Timestamp("2026-11-01"), "false_positive", now) == "closed"


def test_queue_priority_order_and_sla(store):
    q = store.queue(SHA, 0.5, source_id=SRC, order="priority")
    # big: 0.7 * (0.5 + 0.5*log10(9001)/log10(10001)) = 0.6916 > top: 0.95 * 0.7134 = 0.6777
    assert q["entity_id"].tolist() == ["big", "top", "low"]
    assert q["priority"].is_monotonic_decreasing
    by_score = store.queue(SHA, 0.5, source_id=SRC)
    assert by_score["entity_id"].tolist() == ["top", "big", "low"]
    row = q.iloc[0]
    created = pd.Timestamp(store.get_case(int(row["case_id"]))["created_at"]).tz_convert(None)
    assert row["sla_due_at"] - created == pd.Timedelta(hours=24)  # P1
    low = q.loc[q["entity_id"] == "low"].iloc[0]
    # low: 0.55 * (0.5 + 0.5 * log10(11) / log10(10001)) = 0.347 -> P2, 72 h
    assert priority_level(low["priority"]) == "P2" and low["sla_due_at"] - created == pd.Timedelta(hours=72)
    with pytest.raises(ValueError, match="order"):
        store.queue(SHA, 0.5, order="age")


def test_rescoring_moves_due_time_earlier_never_later(store):
    cid = _id(store, "low")
    due0 = store.get_case(cid)["sla_due_at"]
    store.upsert_cases(SHA, _rows([("low", 0.99, 20000.0)]), source_id=SRC)  # now P1
    c = store.get_case(cid)
    assert c["priority"] == pytest.approx(0.99) and c["sla_due_at"] < due0
    due1 = c["sla_due_at"]
    store.upsert_cases(SHA, _rows([("low", 0.51, 1.0)]), source_id=SRC)  # back to P3
    assert store.get_case(cid)["sla_due_at"] == due1


def test_claim_next_takes_highest_priority_and_is_audited(store):
    got = store.claim_next(SHA, 0.5, source_id=SRC, analyst="alice")
    assert got["entity_id"] == "big" and (got["state"], got["assignee"]) == ("assigned", "alice")
    assert got["assigned_at"] is not None
    assert store.claim_next(SHA, 0.5, source_id=SRC, analyst="bob")["entity_id"] == "top"
    assert store.claim_next(SHA, 0.5, source_id=SRC, analyst="bob")["entity_id"] == "low"
    assert store.claim_next(SHA, 0.5, source_id=SRC, analyst="bob") is None  # "below" is under review
    a = store.audit_log(action="claimed")
    assert a["actor"].tolist() == ["alice", "bob", "bob"]
    assert a["after"].iloc[0]["assignee"] == "alice" and a["after"].iloc[0]["state"] == "assigned"
    assert store.verify_audit_chain().ok


def test_a_claim_committed_while_the_log_is_verified_is_not_tampering(tmp_path):
    """Another connection claims a case after the verifier read the audit log and before it reads
    the cases table: the verifier reads one snapshot, so that case is not 'changed outside the
    store' (it was a false alarm when each read took its own snapshot)."""
    from engine.cases.store.chain import verify_chain

    db = tmp_path / "c.sqlite3"
    with CaseStore(db, four_eyes=False) as s, CaseStore(db, four_eyes=False) as other:
        s.upsert_cases(SHA, _rows([(f"e{i}", 0.5 + i / 100, 100.0 * i) for i in range(3)]), source_id=SRC)
        fired = []

        def between(sql: str) -> None:  # runs just before the verifier's read of the cases table
            if not fired and "FROM cases ORDER BY id" in sql:
                fired.append(other.claim_next(SHA, 0.0, source_id=SRC, analyst="bob")["id"])

        s._conn.set_trace_callback(between)
        try:
            verdict = verify_chain(s._conn)
        finally:
            s._conn.set_trace_callback(None)
        assert fired, "the claim did not run during the verification"
        assert verdict.ok, verdict.reason
        assert s.get_case(fired[0])["state"] == "assigned"
        assert s.verify_audit_chain().ok  # and the next snapshot, with the claim and its audit row


def test_claim_next_concurrent_claims_never_share_a_case(tmp_path):
    db = tmp_path / "c.sqlite3"
    with CaseStore(db, four_eyes=False) as s:
        s.upsert_cases(SHA, _rows([(f"e{i}", 0.5 + i / 100, 100.0 * i) for i in range(20)]), source_id=SRC)
    got: dict[str, list[int]] = {"a1": [], "a2": [], "a3": []}

    def work(name):
        with CaseStore(db, four_eyes=False) as s:
            while (c := s.claim_next(SHA, 0.0, source_id=SRC, analyst=name)) is not None:
                got[name].append(c["id"])

    ts = [threading.Thread(target=work, args=(n,)) for n in got]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    claimed = [i for v in got.values() for i in v]
    assert sorted(claimed) == list(range(1, 21))  # each case once, none lost
    with CaseStore(db, four_eyes=False) as s:
        q = s.queue(SHA, 0.0)
        owner = {i: n for n, v in got.items() for i in v}
        assert all(q.set_index("case_id")["assignee"][i] == owner[i] for i in owner)
        assert s.verify_audit_chain().ok


def test_bulk_assign_all_or_nothing(store):
    ids = [_id(store, e) for e in ("low", "big", "top")]
    vers = {i: store.get_case(i)["version"] for i in ids}
    store.assign(ids[0], "carol", actor="bob")  # someone else changes one case meanwhile
    with pytest.raises(ConflictError):
        store.bulk_assign(ids, "alice", actor="bob", expected_versions=vers)
    assert [store.get_case(i)["assignee"] for i in ids] == ["carol", None, None]  # nothing written
    with pytest.raises(CaseNotFoundError):
        store.bulk_assign([ids[1], 999], "alice", actor="bob")
    assert store.get_case(ids[1])["assignee"] is None
    with pytest.raises(ValueError, match="duplicate"):
        store.bulk_assign([ids[1], ids[1]], "alice", actor="bob")
    new = store.bulk_assign(ids, "alice", actor="bob")
    assert set(new) == set(ids)
    assert all(store.get_case(i)["assignee"] == "alice" and store.get_case(i)["state"] == "assigned" for i in ids)
    a = store.audit_log(action="bulk_assigned")
    assert len(a) == 3 and set(a["actor"]) == {"bob"} and {x["batch_size"] for x in a["after"]} == {3}
    # every case row equals its last audit row
    for i in ids:
        last = store.audit_log(i).iloc[-1]["after"]
        c = store.get_case(i)
        assert (last["state"], last["assignee"], last["version"]) == (c["state"], c["assignee"], c["version"])
    assert store.verify_audit_chain().ok


def test_disposition_details_and_close_no_action(store):
    cid = _id(store, "top")
    st = store.record_disposition(cid, "confirmed_fraud", "3 card-testing attempts", analyst="alice",
                                  fraud_type="card_testing", loss_amount=1234.5, exposure_amount=5000,
                                  currency="USD")
    assert st == "confirmed_fraud"
    h = store.history(cid).iloc[-1]
    assert (h["fraud_type"], h["loss_amount"], h["exposure_amount"], h["currency"]) == (
        "card_testing", 1234.5, 5000.0, "USD")
    after = store.audit_log(cid, action="disposition").iloc[-1]["after"]
    assert after["fraud_type"] == "card_testing" and after["loss_amount"] == 1234.5
    for bad in ({"loss_amount": -1}, {"exposure_amount": float("nan")}, {"loss_amount": "12x"},
                {"exposure_amount": 2e12}, {"fraud_type": "phishing"}):
        with pytest.raises(ValueError):
            store.record_disposition(cid, "confirmed_fraud", "x", analyst="alice", **bad)
    assert len(store.history(cid)) == 1  # nothing written by the refused ones
    other = _id(store, "low")
    assert store.record_disposition(other, "closed_no_action", "reviewed, nothing", analyst="bob") == "closed_no_action"
    assert store.queue(SHA, 0.5, state="closed_no_action")["entity_id"].tolist() == ["low"]
    assert set(FRAUD_TYPES) >= {"card_testing", "account_takeover", "lost_stolen", "card_not_present",
                                "compromised_terminal_merchant", "first_party", "other"}


def test_database_refuses_negative_loss_even_past_the_api(store):
    conn = sqlite3.connect(store.path)
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("INSERT INTO dispositions(case_id, ts, kind, disposition, state_after, analyst, note, "
                     "loss_amount) VALUES (1, 't', 'disposition', 'escalate', 'escalated', 'x', 'n', -5)")
    conn.close()


def test_narratives_append_only_and_audited(store):
    cid = _id(store, "big")
    assert store.narrative(cid) is None
    store.save_narrative(cid, "First draft", analyst="alice")
    store.save_narrative(cid, "Subject used the card at 3 merchants", analyst="bob")
    assert store.narrative(cid)["text"] == "Subject used the card at 3 merchants"
    assert store.narratives(cid)["analyst"].tolist() == ["alice", "bob"]
    a = store.audit_log(cid, action="narrative_saved")
    assert a["after"].iloc[-1]["narrative"] == "Subject used the card at 3 merchants"
    conn = sqlite3.connect(store.path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("UPDATE narratives SET text = 'x'")
    conn.close()


def test_report_exports_are_audited_without_moving_the_case_mark(store):
    cid = _id(store, "top")
    store.add_note(cid, "called the card holder", analyst="alice")
    mark = store.case_audit_mark(cid)
    store.record_export(cid, report_id="r-1", report_sha256="ab" * 32, fmt="pdf", analyst="sam")
    store.record_export(cid, report_id="r-1", report_sha256="ab" * 32, fmt="csv", analyst="sam")
    assert store.case_audit_mark(cid) == mark  # an export changes nothing a report is built from
    a = store.audit_log(cid, action="report_exported")
    assert a["actor"].tolist() == ["sam", "sam"]
    assert [(x["report_id"], x["report_sha256"], x["format"]) for x in a["after"]] == [
        ("r-1", "ab" * 32, "pdf"), ("r-1", "ab" * 32, "csv")]
    assert store.verify_audit_chain().ok
    store.add_note(cid, "next step", analyst="alice")
    assert store.case_audit_mark(cid) > mark  # a write still moves it
    for bad, err in (({"fmt": "docx"}, "format"), ({"report_sha256": "AB" * 32}, "report_sha256"),
                     ({"report_sha256": "ab" * 31}, "report_sha256"), ({"file_sha256": "x"}, "file_sha256")):
        kw = {"report_id": "r-2", "report_sha256": "ab" * 32, "fmt": "pdf", "analyst": "sam", **bad}
        with pytest.raises(ValueError, match=err):
            store.record_export(cid, **kw)
    with pytest.raises(CaseNotFoundError):
        store.record_export(99_999, report_id="r-3", report_sha256="ab" * 32, fmt="pdf", analyst="sam")
    assert len(store.audit_log(cid, action="report_exported")) == 2  # nothing written when it raises
    assert store.audit_log(cid, action="report_exported")["before"].tolist() == [None, None]  # no case snapshot
    # a version conflict names the last change, never a download
    v = store.get_case(cid)["version"]
    store.assign(cid, "bob", actor="carol")
    store.record_export(cid, report_id="r-4", report_sha256="ab" * 32, fmt="json", analyst="dave")
    with pytest.raises(ConflictError, match="assigned by carol") as e:
        store.record_disposition(cid, "escalate", "late", analyst="alice", expected_version=v)
    assert "report_exported" not in str(e.value)


def test_v3_store_migrates_to_v4(tmp_path):
    db = tmp_path / "v3.sqlite3"
    conn = connect(db)
    assert migrate(conn, target=3) == 3
    conn.execute("BEGIN IMMEDIATE")
    for ent, p, amt, state, who in (("a", 0.9, 20000.0, "assigned", "carol"), ("b", 0.6, 0.0, "open", None)):
        cur = conn.execute(
            "INSERT INTO cases(model_sha256, source_id, entity_id, max_probability, max_amount, state, assignee, "
            "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, '2026-01-01T00:00:00+00:00', "
            "'2026-01-02T00:00:00+00:00')", (SHA, SRC, ent, p, amt, state, who))
        AuditMixin._audit(conn, "2026-01-01T00:00:00+00:00", "system", "case_created", case_id=cur.lastrowid,
                          model_sha256=SHA, after={"state": state, "assignee": who, "pending_by": None, "version": 0})
    conn.execute("INSERT INTO dispositions(case_id, ts, kind, disposition, state_after, analyst, note) "
                 "VALUES (1, 't', 'disposition', 'escalate', 'escalated', 'carol', 'old note')")
    conn.execute("UPDATE cases SET state = 'escalated' WHERE id = 1")  # as the v3 store did with its audit row
    AuditMixin._audit(conn, "t", "carol", "disposition", case_id=1, model_sha256=SHA,
                      after={"state": "escalated", "disposition": "escalate", "note": "old note"})
    conn.execute("COMMIT")
    with pytest.raises(sqlite3.IntegrityError):  # v3 does not know the new state
        conn.execute("UPDATE cases SET state = 'closed_no_action' WHERE id = 2")
    conn.close()

    with CaseStore(db, four_eyes=False) as s:
        assert s.schema_version == LATEST_VERSION == 5
        assert s.audit_verdict.ok  # the chain written at v3 verifies after the rebuild
        a, b = s.get_case(1), s.get_case(2)
        assert a["priority"] == pytest.approx(0.9) and b["priority"] == pytest.approx(0.3)
        assert a["sla_due_at"] == "2026-01-02T00:00:00.000000"  # P1: created + 24 h
        assert b["sla_due_at"] == "2026-01-04T00:00:00.000000"  # P2: created + 72 h
        assert a["assigned_at"] == "2026-01-02T00:00:00+00:00" and b["assigned_at"] is None
        h = s.history(1)
        assert h["note"].tolist() == ["old note"] and h["fraud_type"].isna().all()
        assert s.record_disposition(2, "closed_no_action", "nothing to do", analyst="carol") == "closed_no_action"
        assert s.claim_next(SHA, 0.0, analyst="dan") is None  # b is closed, a is escalated
        assert s.verify_audit_chain().ok
    conn = sqlite3.connect(db)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("DELETE FROM cases WHERE id = 1")  # the rebuilt table keeps its triggers
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("INSERT OR REPLACE INTO cases(id, model_sha256, source_id, entity_id, max_probability, "
                     "created_at, updated_at) VALUES (1, ?, ?, 'a', 0.1, 't', 't')", (SHA, SRC))
    conn.close()


def test_formatters():
    assert [fmt.format_gap(v) for v in (-3.2e-6, 4e-5, 0.0, 0.01234, -0.5, None)] == [
        "-3.2e-06", "+4.0e-05", "0.0000", "+0.0123", "-0.5000", "-"]  # never "-0.0000"
    assert fmt.format_ts("2026-12-01T14:05:09.123456+00:00") == "2026-12-01 14:05 UTC"
    assert fmt.format_ts("2026-12-01T15:05:09+01:00") == "2026-12-01 14:05 UTC"
    assert fmt.format_ts(pd.Timestamp("2026-12-01 14:05:09")) == "2026-12-01 14:05 UTC"  # naive = UTC
    assert fmt.format_ts(None) == "-" and fmt.format_ts(float("nan")) == "-"
    assert fmt.format_amount(1234.5, "USD") == "1,234.50 USD"
    assert fmt.format_amount(2.1, "USD") == "2.10 USD" and fmt.format_amount(-25, "EUR") == "-25.00 EUR"
    assert fmt.format_amount(None, "USD") == "-" and fmt.format_amount(3) == "3.00"
    assert [fmt.format_signed(x) for x in (0.8, -0.2, 0.0, -0.001)] == ["+0.80", "-0.20", "0.00", "0.00"]
    assert [fmt.format_duration(h) for h in (0.5, 5.2, 50, 72)] == ["30 min", "5 h", "2 d 2 h", "3 d"]
    assert [fmt.format_threshold(p) for p in (0.2, 0.0, 1.0, 6.8e-06, 0.00099, None)] == [
        "0.200", "0.000", "1.000", "6.8e-06", "0.00099", "-"]
    assert [fmt.format_threshold(p) for p in (0.9996, 0.99951, 0.9994)] == ["0.9996", "0.99951", "0.999"]


def test_a_supervisor_sends_a_proposal_back(tmp_path):
    """Four-eyes without a refusal left a supervisor who disagreed only "approve" (analyst trial).
    send_back returns the case to the state its last applied disposition gave it, keeps the note as a
    case note, is audited with the proposal refused, and the proposer cannot send back their own."""
    from engine.cases.store import FourEyesError, InvalidTransitionError
    from engine.cases.report.narrative import disposition_summary

    s = CaseStore(tmp_path / "fe.sqlite3", four_eyes=True)
    s.upsert_cases(SHA, _rows([("a", 0.9, 10.0), ("b", 0.8, 20.0)]), source_id=SRC)
    a, b = _id(s, "a"), _id(s, "b")
    s.assign(a, "alice", actor="alice")
    s.record_disposition(a, "confirmed_fraud", "card holder denies", analyst="alice", fraud_type="card_testing",
                         loss_amount=12.0)
    with pytest.raises(FourEyesError):
        s.send_back(a, "mine", analyst="alice")
    with pytest.raises(Exception, match="required"):
        s.send_back(a, "  ", analyst="sam")
    assert s.send_back(a, "the merchant confirmed the order: not fraud", analyst="sam") == "assigned"
    case = s.get_case(a)
    assert (case["state"], case["pending_by"], case["assignee"]) == ("assigned", None, "alice")
    assert s.notes(a)["text"].tolist() == ["the merchant confirmed the order: not fraud"]
    row = s.audit_log(a, action="sent_back").iloc[0]
    assert row["actor"] == "sam" and row["after"]["proposed_by"] == "alice"
    assert row["after"]["proposal"]["disposition"] == "confirmed_fraud" and row["after"]["proposal"]["loss_amount"] == 12.0
    with pytest.raises(InvalidTransitionError):
        s.send_back(a, "again", analyst="sam")
    assert s.verify_audit_chain().ok
    hist = [dict(h._asdict()) for h in s.history(a).itertuples(index=False)]
    d = disposition_summary(hist, case["state"])
    assert d["outcome"] is None and d["refused"]["outcome"] == "confirmed_fraud" and d["refused"]["analyst"] == "alice"

    # a refused reversal of an approved fraud leaves it confirmed fraud, with its approval
    s.record_disposition(b, "confirmed_fraud", "skimmed", analyst="alice", fraud_type="card_testing")
    s.approve(b, "agreed", analyst="sam")
    s.record_disposition(b, "false_positive", "customer says it was them", analyst="bob")
    assert s.send_back(b, "the chargeback evidence stands", analyst="sam") == "confirmed_fraud"
    hist = [dict(h._asdict()) for h in s.history(b).itertuples(index=False)]
    d = disposition_summary(hist, s.get_case(b)["state"])
    assert (d["outcome"], d["analyst"], d["approval"]["analyst"], d["refused"]["outcome"]) == (
        "confirmed_fraud", "alice", "sam", "false_positive")
    assert s.verify_audit_chain().ok
    # the refusal note is a record the verifier holds to its audit row
    conn = sqlite3.connect(s.path, isolation_level=None)
    conn.execute("DROP TRIGGER IF EXISTS notes_no_update")
    conn.execute("UPDATE notes SET text = 'edited' WHERE case_id = ?", (b,))
    conn.close()
    assert not s.verify_audit_chain().ok
    s.close()
