"""Generated tampering attacks on the case store's append-only tables and audit hash chain
(issue 12, item 9). Each attack runs on a raw ``sqlite3`` connection, as someone who can write
the file would (no ``PRAGMA recursive_triggers``). Either the database refuses it (triggers, rows
unchanged) or, once the attacker has dropped the triggers, the chain verification names the
first broken row - when the store opens and on demand - and keeps naming it after the store
writes on."""

from __future__ import annotations

import sqlite3
import warnings
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from engine.cases.store import AuditTamperWarning, CaseStore, verify_chain

SHA = "c" * 64
TABLES = ("audit_log", "dispositions", "notes", "cases")


def _summary(n: int) -> pd.DataFrame:
    return pd.DataFrame({
        "entity_id": [f"e{i}" for i in range(n)], "max_probability": [0.9 - 0.1 * i for i in range(n)],
        "max_transaction_id": [f"t{i}" for i in range(n)], "first_ts": pd.Timestamp("2024-01-01"),
        "last_ts": pd.Timestamp("2024-01-02"), "max_amount": 10.0, "n_transactions": 3,
        "n_known_fraud": 0,
    })


@pytest.fixture
def db(tmp_path) -> Path:
    """A store with 3 cases, dispositions, notes and 9 audit rows."""
    path = tmp_path / "cases.sqlite3"
    with CaseStore(path, four_eyes=False) as s:
        s.upsert_cases(SHA, _summary(3))                                     # audit rows 1-3
        s.assign(1, "alice", actor="alice")                                  # 4
        s.record_disposition(1, "false_positive", "legit", analyst="alice")  # 5
        s.add_note(2, "customer called", analyst="bob")                      # 6
        s.record_disposition(2, "escalate", "odd merchant", analyst="bob")   # 7
        s.add_note(2, "card blocked", analyst="bob")                         # 8
        s.set_thresholds(SHA, 0.5, 0.8, actor="carol")                       # 9
        assert len(s.audit_log()) == 9 and s.verify_audit_chain().ok
    return path


def _raw(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(db, isolation_level=None)


def _dump(conn: sqlite3.Connection) -> dict[str, list[tuple]]:
    return {t: conn.execute(f"SELECT * FROM {t} ORDER BY id").fetchall() for t in TABLES}


# ------------------------------------------------------------------------------- refused outright
def _cols(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]


def _replace_existing(verb: str) -> Callable[[sqlite3.Connection, str], None]:
    def attack(conn: sqlite3.Connection, table: str) -> None:
        cols = _cols(conn, table)
        row = list(conn.execute(f"SELECT * FROM {table} WHERE id = 1").fetchone())
        for i, c in enumerate(cols):  # a forged value in the first text column after id
            if isinstance(row[i], str) and c != "state":
                row[i] = "forged"
                break
        conn.execute(f"{verb} INTO {table}({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                     row)
    return attack


def _upsert(conn: sqlite3.Connection, table: str) -> None:
    cols = _cols(conn, table)
    row = conn.execute(f"SELECT * FROM {table} WHERE id = 1").fetchone()
    conn.execute(f"INSERT INTO {table}({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
                 f"ON CONFLICT(id) DO UPDATE SET id = excluded.id", row)


def _replace_case_key(conn: sqlite3.Connection, table: str) -> None:
    """REPLACE a case through its (model, source, entity) key with a fresh id."""
    conn.execute("REPLACE INTO cases(id, model_sha256, source_id, entity_id, max_probability, state, "
                 "created_at, updated_at) SELECT 99, model_sha256, source_id, entity_id, 0.01, 'open', "
                 "created_at, updated_at FROM cases WHERE id = 1")


def _update(conn: sqlite3.Connection, table: str) -> None:
    col = {"audit_log": "actor", "dispositions": "analyst", "notes": "text", "cases": "id"}[table]
    conn.execute(f"UPDATE {table} SET {col} = 'mallory' WHERE id = 1")


def _update_or_replace(conn: sqlite3.Connection, table: str) -> None:
    conn.execute(f"UPDATE OR REPLACE {table} SET id = 1 WHERE id = 2")


def _delete(conn: sqlite3.Connection, table: str) -> None:
    conn.execute(f"DELETE FROM {table} WHERE id = (SELECT max(id) FROM {table})")


REFUSED = {
    "insert_or_replace": (_replace_existing("INSERT OR REPLACE"), TABLES),
    "replace": (_replace_existing("REPLACE"), TABLES),
    "upsert_on_conflict": (_upsert, ("audit_log", "dispositions", "notes")),
    "replace_case_key": (_replace_case_key, ("cases",)),
    "update": (_update, ("audit_log", "dispositions", "notes")),
    "update_or_replace": (_update_or_replace, ("audit_log", "dispositions", "notes")),
    "delete": (_delete, TABLES),
}


@pytest.mark.parametrize(("attack", "table"), [(a, t) for a, (_, ts) in REFUSED.items() for t in ts])
def test_append_only_tables_refuse(db, attack, table):
    conn = _raw(db)
    before = _dump(conn)
    with pytest.raises(sqlite3.DatabaseError, match="append-only|cannot be"):
        REFUSED[attack][0](conn, table)
    assert _dump(conn) == before
    assert verify_chain(conn).ok
    conn.close()


def test_recursive_triggers_make_no_difference(db):
    conn = _raw(db)
    conn.execute("PRAGMA recursive_triggers = ON")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        _replace_existing("INSERT OR REPLACE")(conn, "audit_log")
    with pytest.raises(sqlite3.DatabaseError, match="cannot be deleted"):
        conn.execute("DELETE FROM audit_head")
    assert verify_chain(conn).ok
    conn.close()


# -------------------------------------------------------------- evident: triggers dropped first
def _drop_triggers(conn: sqlite3.Connection) -> None:
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")


def _edit(col: str, value: object, row: int = 4) -> Callable[[sqlite3.Connection], int]:
    def attack(conn: sqlite3.Connection) -> int:
        conn.execute(f"UPDATE audit_log SET {col} = ? WHERE id = ?", (value, row))
        return row
    return attack


def _delete_row(row: int | None) -> Callable[[sqlite3.Connection], int]:
    def attack(conn: sqlite3.Connection) -> int:
        rid = row or conn.execute("SELECT max(id) FROM audit_log").fetchone()[0]
        conn.execute("DELETE FROM audit_log WHERE id = ?", (rid,))
        return rid
    return attack


def _delete_last_and_rewind_head(conn: sqlite3.Connection) -> int:
    last, prev = conn.execute("SELECT id, prev_hash FROM audit_log ORDER BY id DESC LIMIT 1").fetchone()
    conn.execute("DELETE FROM audit_log WHERE id = ?", (last,))
    prev_row = conn.execute("SELECT id, row_hash FROM audit_log WHERE id = ?", (last - 1,)).fetchone()
    conn.execute("UPDATE audit_head SET last_id = ?, last_hash = ?", prev_row)
    return last  # sqlite_sequence still remembers row `last`


def _truncate(conn: sqlite3.Connection) -> int:
    conn.execute("DELETE FROM audit_log")
    return 1


def _swap(a: int, b: int, cols: str) -> Callable[[sqlite3.Connection], int]:
    """Reorder: rows a and b exchange their content (``cols``), ids stay."""
    def attack(conn: sqlite3.Connection) -> int:
        names = cols.split(", ")
        ra = conn.execute(f"SELECT {cols} FROM audit_log WHERE id = ?", (a,)).fetchone()
        rb = conn.execute(f"SELECT {cols} FROM audit_log WHERE id = ?", (b,)).fetchone()
        sets = ", ".join(f"{n} = ?" for n in names)
        conn.execute(f"UPDATE audit_log SET {sets} WHERE id = ?", (*rb, a))
        conn.execute(f"UPDATE audit_log SET {sets} WHERE id = ?", (*ra, b))
        return min(a, b)
    return attack


def _renumber(conn: sqlite3.Connection) -> int:
    conn.execute("UPDATE audit_log SET id = 100 WHERE id = 3")
    return 3


def _replace_without_triggers(conn: sqlite3.Connection) -> int:
    _replace_existing("INSERT OR REPLACE")(conn, "audit_log")
    return 1


def _forged_append(conn: sqlite3.Connection) -> int:
    conn.execute("INSERT INTO audit_log(id, ts, actor, action, prev_hash, row_hash) VALUES "
                 "(10, '2099-01-01', 'mallory', 'approved', 'x', 'y')")
    return 10


def _drop_head(conn: sqlite3.Connection) -> int:
    conn.execute("DELETE FROM audit_head")
    return 9


def _cut_tail_and_rewrite_head(keep: int) -> Callable[[sqlite3.Connection], int]:
    """Cut the log back to row ``keep`` and make the head and the id sequence agree: the chain
    itself is intact; the dispositions and notes written after row ``keep`` have no audit row."""
    def attack(conn: sqlite3.Connection) -> int:
        conn.execute("DELETE FROM audit_log WHERE id > ?", (keep,))
        if keep:
            conn.execute("UPDATE audit_head SET last_id = ?, last_hash = (SELECT row_hash FROM audit_log "
                         "WHERE id = ?)", (keep, keep))
            conn.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'audit_log'", (keep,))
        else:
            conn.execute("DELETE FROM audit_head")
            conn.execute("DELETE FROM sqlite_sequence WHERE name = 'audit_log'")
        return keep + 1
    return attack


ALL = "ts, actor, action, case_id, model_sha256, before_json, after_json, prev_hash, row_hash"
EVIDENT = {
    "edit_actor": _edit("actor", "mallory"),
    "edit_action": _edit("action", "note_added"),
    "edit_after_json": _edit("after_json", '{"state":"open"}', row=5),
    "edit_ts": _edit("ts", "2020-01-01T00:00:00+00:00", row=1),
    "edit_case_id": _edit("case_id", 3, row=7),
    "edit_null_hash": _edit("row_hash", None, row=6),
    "delete_middle_row": _delete_row(5),
    "delete_first_row": _delete_row(1),
    "delete_last_row": _delete_row(None),
    "delete_last_row_and_rewind_head": _delete_last_and_rewind_head,
    "delete_every_row": _truncate,
    "reorder_content": _swap(3, 6, "ts, actor, action, case_id, model_sha256, before_json, after_json"),
    "reorder_whole_rows": _swap(2, 5, ALL),
    "renumber_row": _renumber,
    "replace_without_triggers": _replace_without_triggers,
    "forged_row_appended": _forged_append,
    "head_removed": _drop_head,
    "tail_cut_with_head_and_sequence_rewritten": _cut_tail_and_rewrite_head(4),
    "every_row_head_and_sequence_removed": _cut_tail_and_rewrite_head(0),
}


#: where the first break is once the store has written on, if not where it was: with the head
#: gone, the next row starts a new chain that does not follow the last row
AFTER_WRITE = {"head_removed": 10, "tail_cut_with_head_and_sequence_rewritten": 6,
               "every_row_head_and_sequence_removed": 2}


@pytest.mark.parametrize("attack", list(EVIDENT))
def test_tampering_is_named_by_the_chain(db, attack):
    conn = _raw(db)
    _drop_triggers(conn)
    broken = EVIDENT[attack](conn)
    conn.close()
    with pytest.warns(AuditTamperWarning, match=f"row {broken}\\b"):  # verified when it opens
        s = CaseStore(db, four_eyes=False)
    with s:
        assert (s.audit_verdict.ok, s.audit_verdict.first_broken_id) == (False, broken)
        assert s.audit_verdict.reason
        # the store writes on; the evidence stays (the new row chains from the recorded head)
        if s.get_case(3)["state"] == "open":
            s.add_note(3, "written after the tampering", analyst="dave")
        v = s.verify_audit_chain()
        assert (v.ok, v.first_broken_id) == (False, AFTER_WRITE.get(attack, broken)), v


def test_untouched_store_opens_without_warning(db):
    with warnings.catch_warnings():
        warnings.simplefilter("error", AuditTamperWarning)
        with CaseStore(db) as s:
            assert s.audit_verdict.ok and s.audit_verdict.rows_checked == 9
            assert "intact" in s.audit_verdict.message


def test_tail_cut_names_the_record_left_without_its_audit_row(db):
    conn = _raw(db)
    _drop_triggers(conn)
    _cut_tail_and_rewrite_head(4)(conn)
    # the chain alone is intact: ids 1-4, links, head and sequence agree
    rows = conn.execute("SELECT id FROM audit_log ORDER BY id").fetchall()
    assert [r[0] for r in rows] == [1, 2, 3, 4]
    v = verify_chain(conn)
    conn.close()
    assert not v.ok and v.reason.startswith("dispositions row 1 (case 1, ")
    assert "has no audit row" in v.reason


def test_the_page_alarm_follows_a_log_changed_while_the_store_is_open(db):
    with CaseStore(db, four_eyes=False) as s:
        assert s.recent_audit_verdict(30.0).ok
        conn = _raw(db)
        _drop_triggers(conn)
        conn.execute("UPDATE audit_log SET actor = 'bob' WHERE id = 5")
        conn.close()
        assert s.recent_audit_verdict(3600.0).ok  # checked less than an hour ago: the open's verdict
        v = s.recent_audit_verdict(0.0)
        assert (v.ok, v.first_broken_id) == (False, 5)
        assert s.audit_verdict == v


# ------------------------------------------ records and cases edited, forged or removed (no audit row changed)
def _sql(*statements: str) -> Callable[[sqlite3.Connection], None]:
    def attack(conn: sqlite3.Connection) -> None:
        for s in statements:
            conn.execute(s)
    return attack


_FORGED_CASE = ("INSERT INTO cases(id, model_sha256, source_id, entity_id, max_probability, state, assignee, "
                "created_at, updated_at, version, priority) SELECT {id}, model_sha256, source_id, 'victim', 0.99, "
                "'assigned', 'alice', created_at, updated_at, 0, 0.5 FROM cases WHERE id = 1")
#: attack -> (statements, words of the reason); the triggers are dropped first
RECORD_ATTACKS = {
    "case moved to another entity": (_sql("UPDATE cases SET entity_id = 'e9' WHERE id = 1"), "entity_id"),
    "case moved to another source": (_sql("UPDATE cases SET source_id = 'x' || source_id WHERE id = 1"),
                                     "source_id"),
    "case moved to another model": (_sql(f"UPDATE cases SET model_sha256 = '{'d' * 64}' WHERE id = 1"),
                                    "model_sha256"),
    "case buried in the queue": (_sql("UPDATE cases SET priority = 0 WHERE id = 1"), "priority"),
    "SLA removed": (_sql("UPDATE cases SET sla_due_at = NULL WHERE id = 2"), "SLA due time"),
    "SLA moved later": (_sql("UPDATE cases SET sla_due_at = '2099-01-01T00:00:00.000000' WHERE id = 2"),
                        "SLA due time"),
    "creation time moved": (_sql("UPDATE cases SET created_at = '2030-01-01T00:00:00+00:00' WHERE id = 2"),
                            "created_at"),
    "case forged with id 0": (_sql(_FORGED_CASE.format(id=0)), "case 0 has no audit row"),
    "case forged with a later id": (_sql(_FORGED_CASE.format(id=9)), "case 9 has no audit row"),
    "case removed": (_sql("DELETE FROM cases WHERE id = 3"), "case 3 was removed"),
    "case and its disposition removed": (_sql("DELETE FROM dispositions WHERE case_id = 1",
                                              "DELETE FROM cases WHERE id = 1"), "removed"),
    "notes removed": (_sql("DELETE FROM notes"), "notes row audit row 6 wrote"),
    "disposition note rewritten": (_sql("UPDATE dispositions SET note = 'nothing odd' WHERE id = 2"),
                                   "dispositions row 2"),
    "disposition value rewritten": (_sql("UPDATE dispositions SET disposition = 'false_positive', "
                                         "state_after = 'false_positive' WHERE id = 2"), "dispositions row 2"),
    "note text rewritten": (_sql("UPDATE notes SET text = 'all fine' WHERE id = 1"), "notes row 1"),
    "notes renumbered": (_sql("UPDATE notes SET id = 99 WHERE id = 1", "UPDATE notes SET id = 1 WHERE id = 2",
                              "UPDATE notes SET id = 2 WHERE id = 99"), "notes rows 1 and 2 of case 2 are not in the order"),
    "disposition duplicated": (_sql("INSERT INTO dispositions(case_id, ts, kind, disposition, state_after, analyst, "
                                    "note) SELECT case_id, ts, kind, disposition, state_after, analyst, note "
                                    "FROM dispositions WHERE id = 1"), "dispositions row 3"),
    "everything but the cases wiped": (_sql(
        "DELETE FROM audit_log", "DELETE FROM audit_head", "DELETE FROM sqlite_sequence WHERE name = 'audit_log'",
        "DELETE FROM dispositions", "DELETE FROM notes", "DELETE FROM narratives", "DELETE FROM model_thresholds",
        "UPDATE cases SET state = 'open', assignee = NULL"), "case 1 has no audit row"),
}


@pytest.mark.parametrize("attack", list(RECORD_ATTACKS))
def test_cases_and_records_changed_outside_the_store_are_named(db, attack):
    """The chain is intact in each: only the cases or record tables are written (the helper's
    attacks of session 32). Each was verified ``ok`` before the cross-check covered it."""
    edit, words = RECORD_ATTACKS[attack]
    conn = _raw(db)
    _drop_triggers(conn)
    edit(conn)
    v = verify_chain(conn)
    conn.close()
    assert not v.ok, attack
    assert words in v.reason, v.reason


def test_renumbered_dispositions_cannot_change_what_an_approval_applies(tmp_path):
    """Security review: swapping two dispositions' ids (content and audit rows untouched) made a
    pending confirmed-fraud proposal read as false positive, and the approval applied that."""
    db = tmp_path / "cases.sqlite3"
    with CaseStore(db, four_eyes=True) as s:
        s.upsert_cases(SHA, _summary(1))
        s.record_disposition(1, "false_positive", "first look", analyst="alice")
        s.record_disposition(1, "confirmed_fraud", "skimmed", analyst="alice")
        assert s.pending_disposition(1) == "confirmed_fraud"
    conn = _raw(db)
    _drop_triggers(conn)
    for stmt in ("UPDATE dispositions SET id = 99 WHERE id = 1", "UPDATE dispositions SET id = 1 WHERE id = 2",
                 "UPDATE dispositions SET id = 2 WHERE id = 99"):
        conn.execute(stmt)
    v = verify_chain(conn)
    conn.close()
    assert not v.ok
    assert "dispositions rows 1 and 2 of case 1 are not in the order their audit rows" in v.reason, v.reason


@pytest.mark.parametrize("edit", [
    "UPDATE schema_version SET applied_at = CAST(x'ff' AS TEXT) WHERE version = 4",  # no triggers on it
    "UPDATE notes SET text = CAST(x'ff' AS TEXT) WHERE id = 1",
    "UPDATE audit_log SET after_json = x'7b7d' WHERE id = 5",  # a BLOB in a hashed column
])
def test_a_value_the_store_never_writes_is_a_broken_chain_not_a_crash(db, edit):
    conn = _raw(db)
    _drop_triggers(conn)
    conn.execute(edit)
    v = verify_chain(conn)
    conn.close()
    assert not v.ok, edit
    assert "tampered with" in v.message


def test_a_whole_working_day_verifies(tmp_path):
    """What the store itself writes never trips the cross-check: rescoring up and down (the SLA
    keeps its earliest due time), claims, bulk assignment, four-eyes approval with fraud details,
    a refused self-approval, notes, narratives and thresholds."""
    path = tmp_path / "day.sqlite3"
    with CaseStore(path, four_eyes=True) as s:
        s.upsert_cases(SHA, _summary(4))
        up = _summary(4).assign(max_probability=[0.95, 0.1, 0.75, 0.65], max_amount=[20_000.0, 5.0, 10.0, 0.0])
        s.upsert_cases(SHA, up)
        s.upsert_cases(SHA, up.assign(max_probability=[0.2, 0.05, 0.3, 0.65]))
        s.claim_next(SHA, 0.0, analyst="alice")
        s.bulk_assign([2, 3], "bob", actor="carol")
        s.record_disposition(1, "confirmed_fraud", "skimmed card", analyst="alice", fraud_type="card_testing",
                             loss_amount=120.5, exposure_amount=900.0, currency="USD")
        with pytest.raises(Exception, match="four-eyes"):
            s.approve(1, "my own", analyst="alice")
        s.approve(1, "checked the merchant", analyst="bob")
        s.record_disposition(2, "false_positive", "travel", analyst="bob")
        s.add_note(3, "called the customer", analyst="bob")
        s.save_narrative(1, "Card used at three merchants within minutes.", analyst="alice")
        s.save_narrative(1, "Second version.", analyst="alice")
        s.set_thresholds(SHA, 0.4, 0.9, actor="carol")
        s.set_thresholds(SHA, 0.5, 0.9, actor="carol")
        s.record_export(1, report_id="r-1", report_sha256="ab" * 32, fmt="pdf", analyst="dave")
        v = s.verify_audit_chain()
        assert v.ok, v
        assert s.get_case(1)["state"] == "confirmed_fraud"


def test_rerunning_migration_5_does_not_adopt_a_forged_case(db):
    """Review finding: a case written into a v5 store, then user_version rewound to 4, was adopted by
    migration 5 at the next open and verified ok."""
    conn = _raw(db)
    conn.execute(_FORGED_CASE.format(id=9))
    conn.execute("DELETE FROM schema_version WHERE version = 5")
    conn.execute("PRAGMA user_version = 4")
    conn.close()
    with pytest.warns(AuditTamperWarning, match="case 9 has no audit row"):
        s = CaseStore(db, four_eyes=False)
    with s:
        assert s.schema_version == 5 and not s.audit_verdict.ok
        assert "case_adopted" not in set(s.audit_log().action)


def test_the_due_time_is_exact_for_a_case_made_since_schema_4(tmp_path):
    """Review finding: after a rescoring from P1 to P3 the due time could be moved from +24 h to
    +168 h unseen (the check allowed the range up to the current level's SLA)."""
    path = tmp_path / "sla.sqlite3"
    with CaseStore(path, four_eyes=False) as s:
        s.upsert_cases(SHA, _summary(1))                                   # 0.9: P1, due in 24 h
        s.upsert_cases(SHA, _summary(1).assign(max_probability=0.1))       # P3 now; the due time stays
        assert s.verify_audit_chain().ok
    conn = _raw(path)
    conn.execute("UPDATE cases SET sla_due_at = strftime('%Y-%m-%dT%H:%M:%f000', created_at, '+168 hours')")
    v = verify_chain(conn)
    conn.close()
    assert not v.ok and "SLA due time" in v.reason, v


@pytest.mark.parametrize("edit", ["UPDATE cases SET state = 'closed_no_action' WHERE id = 1",
                                  "UPDATE cases SET assignee = 'mallory' WHERE id = 1",
                                  "UPDATE cases SET version = version + 5 WHERE id = 1"])
def test_a_report_download_does_not_certify_a_tampered_case(db, edit):
    """Review finding: the report_exported row carried a snapshot of the case, which the verifier
    took as the case's recorded state, so one download (an auditor may make one) turned a cases
    row edited outside the store back into "intact"."""
    conn = _raw(db)
    conn.execute(edit)
    conn.close()
    with pytest.warns(AuditTamperWarning):
        s = CaseStore(db, four_eyes=False)
    with s:
        assert not s.verify_audit_chain().ok
        s.record_export(1, report_id="r-1", report_sha256="ab" * 32, fmt="pdf", analyst="erin")
        v = s.verify_audit_chain()
        assert not v.ok and "case 1's" in v.reason, v
