"""Tests for engine.cases.store: storage location, schema migration, audit log, four-eyes,
notes, queue, optimistic locking, concurrent writers and crash consistency."""

from __future__ import annotations

import datetime as dt
import os
import queue as queue_mod
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

import engine.cases.store.common as cases_mod
import engine.cases.store.schema as schema_mod
from engine.cases.store import (
    LATEST_VERSION,
    STATES,
    CaseNotFoundError,
    CaseStore,
    ConflictError,
    FourEyesError,
    InvalidTransitionError,
    MissingAnalystError,
    NoteRequiredError,
    SchemaError,
    connect,
    default_db_path,
    migrate,
)

SHA = "a" * 64
SHA2 = "b" * 64
REPO_ROOT = Path(cases_mod.__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("FRAUDLENS_DATA_DIR", "FRAUDLENS_ANALYST", "FRAUDLENS_FOUR_EYES"):
        monkeypatch.delenv(var, raising=False)


def summary(probs: dict[str, float], **overrides) -> pd.DataFrame:
    """A per-entity score summary as scoring would produce it."""
    n = len(probs)
    df = pd.DataFrame(
        {
            "entity_id": list(probs),
            "max_probability": list(probs.values()),
            "max_transaction_id": [f"t-{e}" for e in probs],
            "first_ts": pd.to_datetime(["2024-01-01 00:00:00"] * n),
            "last_ts": pd.to_datetime(["2024-01-31 12:00:00"] * n),
            "max_amount": [100.0] * n,
            "n_transactions": [10] * n,
            "n_known_fraud": [0] * n,
        }
    )
    for col, values in overrides.items():
        df[col] = values
    return df


@pytest.fixture
def db(tmp_path) -> Path:
    return tmp_path / "data" / "cases.sqlite3"


@pytest.fixture
def store(db):
    s = CaseStore(db, four_eyes=False)
    s.upsert_cases(SHA, summary({"e1": 0.9, "e2": 0.6, "e3": 0.2}))
    yield s
    s.close()


def case_id(s: CaseStore, entity: str, model: str = SHA) -> int:
    q = s.queue(model, 0.0)
    return int(q.loc[q.entity_id == entity, "case_id"].iloc[0])


_RAW: list[sqlite3.Connection] = []


def raw(db: Path) -> sqlite3.Connection:
    """A plain sqlite3 connection that bypasses the store (closed after the test)."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.row_factory = sqlite3.Row
    _RAW.append(conn)
    return conn


@pytest.fixture(autouse=True)
def _close_raw():
    yield
    while _RAW:
        _RAW.pop().close()


# ----------------------------------------------------------------------------------------------
# Where the file lives


def test_path_explicit_beats_env_beats_platformdirs(tmp_path, monkeypatch):
    calls = []

    def fake_user_data_dir(appname):
        calls.append(appname)
        return str(tmp_path / "platform" / appname)

    monkeypatch.setattr(cases_mod.platformdirs, "user_data_dir", fake_user_data_dir)
    assert default_db_path() == tmp_path / "platform" / "fraudlens" / "cases.sqlite3"
    assert calls == ["fraudlens"]
    with CaseStore() as s:
        assert s.path == tmp_path / "platform" / "fraudlens" / "cases.sqlite3"
    assert (tmp_path / "platform" / "fraudlens" / "cases.sqlite3").is_file()

    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "envdir"))
    assert default_db_path() == tmp_path / "envdir" / "cases.sqlite3"
    with CaseStore() as s:
        assert s.path == tmp_path / "envdir" / "cases.sqlite3"
    assert (tmp_path / "envdir" / "cases.sqlite3").is_file()

    explicit = tmp_path / "a" / "b" / "mine.db"
    with CaseStore(explicit) as s:
        assert s.path == explicit
    assert explicit.is_file()


# ----------------------------------------------------------------------------------------------
# Schema creation and migration


def test_new_database_is_at_latest_version_in_wal(db):
    with CaseStore(db) as s:
        assert s.schema_version == LATEST_VERSION == len(schema_mod.MIGRATIONS)
    conn = raw(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    logged = [r[0] for r in conn.execute("SELECT version FROM schema_version ORDER BY version")]
    assert logged == list(range(1, LATEST_VERSION + 1))
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"cases", "dispositions", "notes", "audit_log", "model_thresholds"} <= tables
    # reopening does not re-run migrations
    with CaseStore(db) as s:
        assert s.schema_version == LATEST_VERSION
    assert conn.execute("SELECT count(*) FROM schema_version").fetchone()[0] == LATEST_VERSION


def test_migrate_v1_database_to_latest(db):
    db.parent.mkdir(parents=True)
    conn = connect(db)
    assert migrate(conn, target=1) == 1
    cols_v1 = {r[1] for r in conn.execute("PRAGMA table_info(cases)")}
    assert "version" not in cols_v1
    # a v1-era case with a disposition and its audit row
    conn.execute(
        "INSERT INTO cases(model_sha256, entity_id, max_probability, state, assignee, "
        "created_at, updated_at) VALUES (?, 'old', 0.95, 'assigned', 'carol', 't0', 't0')",
        (SHA,),
    )
    conn.execute(
        "INSERT INTO audit_log(ts, actor, action, case_id, model_sha256, after_json) "
        "VALUES ('2024-01-01T00:00:00+00:00', 'carol', 'assigned', 1, ?, "
        "'{\"state\": \"assigned\"}')",
        (SHA,),
    )
    conn.close()

    with CaseStore(db, four_eyes=False) as s:
        assert s.schema_version == LATEST_VERSION
        old = s.get_case(1)
        assert (old["entity_id"], old["state"], old["assignee"], old["version"]) == (
            "old", "assigned", "carol", 0
        )
        # v1 audit rows survive; migration 5 records the case it finds without a creation row
        from engine.cases.store.schema import MIGRATION_ACTOR

        log = s.audit_log(1)
        assert log.actor.tolist() == ["carol", MIGRATION_ACTOR]
        assert log.action.tolist() == ["assigned", "case_adopted"]
        assert s.audit_verdict.ok, s.audit_verdict
        # v2 features work on the migrated file
        s.set_thresholds(SHA, 0.5, 0.9, actor="carol")
        assert s.get_thresholds(SHA).review == 0.5
        assert s.record_disposition(1, "false_positive", "legit travel", analyst="carol") == (
            "false_positive"
        )
        assert s.get_case(1)["version"] == 1
    conn = raw(db)
    rows = conn.execute("SELECT version, description FROM schema_version ORDER BY version")
    assert [r[0] for r in rows] == list(range(1, LATEST_VERSION + 1))
    # append-only triggers from v1 still hold after migrating
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("DELETE FROM audit_log")


def test_failed_migration_rolls_back_to_previous_version(db, monkeypatch):
    with CaseStore(db):
        pass

    def broken(conn):
        conn.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("boom")

    monkeypatch.setattr(schema_mod, "MIGRATIONS", [*schema_mod.MIGRATIONS, broken])
    monkeypatch.setattr(schema_mod, "LATEST_VERSION", LATEST_VERSION + 1)
    with pytest.raises(RuntimeError, match="boom"):
        CaseStore(db)
    conn = raw(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LATEST_VERSION
    assert conn.execute(
        "SELECT count(*) FROM sqlite_master WHERE name = 'half_done'"
    ).fetchone()[0] == 0


def test_newer_or_foreign_database_is_refused(tmp_path):
    newer = tmp_path / "newer.db"
    with CaseStore(newer):
        pass
    raw(newer).execute(f"PRAGMA user_version = {LATEST_VERSION + 5}")
    with pytest.raises(SchemaError, match="newer"):
        CaseStore(newer)
    foreign = tmp_path / "foreign.db"
    raw(foreign).execute("CREATE TABLE something (x)")
    with pytest.raises(SchemaError, match="no fraudlens schema"):
        CaseStore(foreign)


# ----------------------------------------------------------------------------------------------
# Audit log is append-only in the database


def test_audit_rows_cannot_be_updated_or_deleted(store, db):
    cid = case_id(store, "e1")
    store.assign(cid, "alice", actor="alice")
    store.add_note(cid, "looks odd", analyst="alice")
    store.record_disposition(cid, "escalate", "needs L2", analyst="alice")
    conn = raw(db)
    snapshot = [tuple(r) for r in conn.execute("SELECT * FROM audit_log ORDER BY id")]
    assert len(snapshot) >= 4
    for sql in (
        "UPDATE audit_log SET actor = 'mallory'",
        "UPDATE audit_log SET after_json = NULL WHERE id = 1",
        "DELETE FROM audit_log",
        "DELETE FROM audit_log WHERE id = 1",
        "UPDATE dispositions SET note = 'changed'",
        "DELETE FROM dispositions",
        "UPDATE notes SET text = 'changed'",
        "DELETE FROM notes",
        "DELETE FROM cases",
    ):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            conn.execute(sql)
    # also inside an explicit transaction: the trigger aborts the statement
    conn.execute("BEGIN")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("UPDATE audit_log SET action = 'nothing'")
    conn.execute("COMMIT")
    assert [tuple(r) for r in conn.execute("SELECT * FROM audit_log ORDER BY id")] == snapshot
    assert conn.execute("SELECT count(*) FROM notes").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM dispositions").fetchone()[0] == 1
    # and no public API edits or deletes anything
    public = [n for n in dir(CaseStore) if not n.startswith("_")]
    assert not [n for n in public if re.search(r"delete|remove|edit|purge|clear|drop", n)]


def test_audit_rows_record_who_what_when_case_model_before_after(store):
    cid = case_id(store, "e1")
    before = pd.Timestamp.now(tz="UTC")
    store.assign(cid, "bob", actor="alice")
    log = store.audit_log(cid)
    row = log.iloc[-1]
    assert (row.actor, row.action, row.case_id, row.model_sha256) == ("alice", "assigned", cid, SHA)
    ts = dt.datetime.fromisoformat(row.ts)
    assert ts.utcoffset() == dt.timedelta(0)
    assert before - pd.Timedelta(seconds=1) <= pd.Timestamp(ts) <= pd.Timestamp.now(tz="UTC")
    assert row.before == {"state": "open", "assignee": None, "pending_by": None, "version": 0}
    assert row.after == {"state": "assigned", "assignee": "bob", "pending_by": None, "version": 1}
    # creation by scoring was audited too, with the system actor
    assert log.iloc[0].action == "case_created" and log.iloc[0].actor == "system"


# ----------------------------------------------------------------------------------------------
# Analyst identity


def test_analyst_from_environment_and_required(store, monkeypatch):
    cid = case_id(store, "e1")
    with pytest.raises(MissingAnalystError, match="FRAUDLENS_ANALYST"):
        store.add_note(cid, "who am I")
    with pytest.raises(MissingAnalystError):
        store.add_note(cid, "blank name", analyst="   ")
    with pytest.raises(MissingAnalystError):
        store.add_note(cid, "control chars", analyst="eve\nadmin")
    assert store.notes(cid).empty
    monkeypatch.setenv("FRAUDLENS_ANALYST", "  dana ")
    store.add_note(cid, "from env")
    store.assign(cid, "dana")
    store.record_disposition(cid, "escalate", "to L2")
    assert store.notes(cid).analyst.tolist() == ["dana"]
    assert store.history(cid).analyst.tolist() == ["dana"]
    assert store.audit_log(cid).actor.tolist()[1:] == ["dana", "dana", "dana"]


# ----------------------------------------------------------------------------------------------
# Dispositions, notes, four-eyes


@pytest.mark.parametrize("bad", ["", "   ", "\n\t", None])
def test_disposition_requires_a_note_and_writes_nothing_without_one(store, bad):
    cid = case_id(store, "e1")
    n_audit = len(store.audit_log())
    for disposition in ("confirmed_fraud", "false_positive", "escalate"):
        with pytest.raises(NoteRequiredError):
            store.record_disposition(cid, disposition, bad, analyst="alice")
    with pytest.raises(NoteRequiredError):
        store.add_note(cid, bad, analyst="alice")
    assert store.history(cid).empty and store.notes(cid).empty
    assert len(store.audit_log()) == n_audit
    assert store.get_case(cid)["state"] == "open" and store.get_case(cid)["version"] == 0


def test_disposition_history_is_kept_and_unknown_disposition_refused(store):
    cid = case_id(store, "e2")
    assert store.record_disposition(cid, "escalate", "odd pattern", analyst="alice") == "escalated"
    assert store.record_disposition(cid, "false_positive", "customer confirmed",
                                    analyst="bob") == "false_positive"
    assert store.record_disposition(cid, "confirmed_fraud", "chargeback arrived",
                                    analyst="bob") == "confirmed_fraud"  # four-eyes off
    h = store.history(cid)
    assert h.disposition.tolist() == ["escalate", "false_positive", "confirmed_fraud"]
    assert h.state_after.tolist() == ["escalated", "false_positive", "confirmed_fraud"]
    assert h.note.tolist() == ["odd pattern", "customer confirmed", "chargeback arrived"]
    assert h.analyst.tolist() == ["alice", "bob", "bob"]
    with pytest.raises(ValueError, match="disposition"):
        store.record_disposition(cid, "fraud", "typo", analyst="bob")
    with pytest.raises(CaseNotFoundError):
        store.record_disposition(99999, "escalate", "x", analyst="bob")
    with pytest.raises(InvalidTransitionError):
        store.approve(cid, "nothing pending", analyst="carol")


def test_four_eyes_confirmed_fraud_needs_a_second_analyst(db):
    with CaseStore(db, four_eyes=True) as s:
        s.upsert_cases(SHA, summary({"e1": 0.95}))
        cid = case_id(s, "e1")
        s.assign(cid, "alice", actor="alice")
        assert s.record_disposition(cid, "confirmed_fraud", "card testing burst",
                                    analyst="alice") == "pending_approval"
        case = s.get_case(cid)
        assert (case["state"], case["pending_by"]) == ("pending_approval", "alice")

        for same in ("alice", "ALICE", " Alice "):
            with pytest.raises(FourEyesError, match="another analyst"):
                s.approve(cid, "I approve my own", analyst=same)
        assert s.get_case(cid)["state"] == "pending_approval"
        assert s.get_case(cid)["version"] == case["version"]
        with pytest.raises(NoteRequiredError):
            s.approve(cid, "", analyst="bob")

        assert s.approve(cid, "agreed: same BIN, 40 declines", analyst="bob") == "confirmed_fraud"
        case = s.get_case(cid)
        assert (case["state"], case["pending_by"]) == ("confirmed_fraud", None)

        h = s.history(cid)
        assert h[["kind", "analyst", "state_after"]].values.tolist() == [
            ["disposition", "alice", "pending_approval"],
            ["approval", "bob", "confirmed_fraud"],
        ]
        log = s.audit_log(cid)
        acts = log[["action", "actor"]].values.tolist()
        assert acts[-5:] == [
            ["disposition", "alice"],
            ["approval_refused", "alice"],
            ["approval_refused", "ALICE"],
            ["approval_refused", " Alice ".strip()],
            ["approved", "bob"],
        ]
        assert log.iloc[-1].after["proposed_by"] == "alice"
        assert log.iloc[-1].before["state"] == "pending_approval"
        with pytest.raises(InvalidTransitionError):
            s.approve(cid, "again", analyst="carol")


def test_four_eyes_setting_from_environment(db, monkeypatch):
    monkeypatch.setenv("FRAUDLENS_FOUR_EYES", "1")
    with CaseStore(db) as s:
        assert s.four_eyes
        s.upsert_cases(SHA, summary({"e1": 0.9}))
        cid = case_id(s, "e1")
        assert s.record_disposition(cid, "confirmed_fraud", "x", analyst="a") == "pending_approval"
    monkeypatch.setenv("FRAUDLENS_FOUR_EYES", "0")
    with CaseStore(db) as s:
        # a process started without the setting keeps the store's rule (security test: it let an analyst
        # apply dispositions alone, pending ones included)
        assert s.four_eyes
        with pytest.raises(FourEyesError):
            s.approve(cid, "mine", analyst="a")
        assert s.approve(cid, "ok", analyst="b") == "confirmed_fraud"
        s.upsert_cases(SHA, summary({"e2": 0.9}))
        cid2 = case_id(s, "e2")
        assert s.record_disposition(cid2, "confirmed_fraud", "x", analyst="a") == "pending_approval"
        s.switch_four_eyes_off(actor="sup")  # only an audited action lifts it
        assert not s.four_eyes
        s.upsert_cases(SHA, summary({"e3": 0.9}))
        assert s.record_disposition(case_id(s, "e3"), "confirmed_fraud", "x", analyst="a") == "confirmed_fraud"
        assert s.audit_log(action=["four_eyes_on", "four_eyes_off"])["actor"].tolist() == ["system", "sup"]
        assert s.verify_audit_chain().ok
    with CaseStore(db) as s:
        assert not s.four_eyes  # off in the store and not asked for


def test_four_eyes_switched_on_by_another_process_holds_in_an_open_store(db, monkeypatch):
    """A long-running process (the dashboard's cached store) opened before another process
    switched four-eyes on applies the rule from then on, and every disposition's audit row
    records the rule it was recorded under (before: the open store kept its setting from the
    open, so an analyst applied confirmed fraud alone)."""
    monkeypatch.setenv("FRAUDLENS_FOUR_EYES", "0")
    with CaseStore(db) as early:
        assert not early.four_eyes
        early.upsert_cases(SHA, summary({"e1": 0.9, "e2": 0.9}))
        assert early.record_disposition(case_id(early, "e1"), "confirmed_fraud", "x", analyst="a") == "confirmed_fraud"
        with CaseStore(db, four_eyes=True) as later:  # e.g. a supervisor's process started with the setting
            assert later.four_eyes
        assert early.four_eyes
        assert early.record_disposition(case_id(early, "e2"), "confirmed_fraud", "x", analyst="a") == "pending_approval"
        rows = early.audit_log(action="disposition")
        assert [r["four_eyes"] for r in rows["after"]] == [False, True]
        early.switch_four_eyes_off(actor="sup")
        assert not early.four_eyes
        assert early.verify_audit_chain().ok


def test_switching_four_eyes_off_lifts_it_for_the_process_that_asked(db):
    with CaseStore(db, four_eyes=True) as s:
        s.upsert_cases(SHA, summary({"e1": 0.9}))
        s.switch_four_eyes_off(actor="sup")
        assert not s.four_eyes
        assert s.record_disposition(case_id(s, "e1"), "confirmed_fraud", "x", analyst="a") == "confirmed_fraud"


def test_assignment_states_and_notes(store):
    cid = case_id(store, "e1")
    assert store.assign(cid, "alice", actor="lead") == 1
    assert store.get_case(cid)["state"] == "assigned"
    assert store.assign(cid, None, actor="lead") == 2
    assert (store.get_case(cid)["state"], store.get_case(cid)["assignee"]) == ("open", None)
    store.assign(cid, "bob", actor="lead")
    store.record_disposition(cid, "escalate", "L2", analyst="bob")
    store.assign(cid, "carol", actor="lead")  # reassigning keeps a disposed state
    assert (store.get_case(cid)["state"], store.get_case(cid)["assignee"]) == ("escalated", "carol")
    n1 = store.add_note(cid, "called customer", analyst="carol")
    n2 = store.add_note(cid, "no answer", analyst="bob")
    notes = store.notes(cid)
    assert notes.id.tolist() == [n1, n2]
    assert notes.text.tolist() == ["called customer", "no answer"]
    assert store.get_case(cid)["version"] == 5  # notes do not change the state version


# ----------------------------------------------------------------------------------------------
# Queue, thresholds, upsert


def test_queue_ranking_and_filters(db):
    with CaseStore(db, four_eyes=False) as s:
        df = summary(
            {"a": 0.99, "b": 0.80, "c": 0.70, "d": 0.55, "e": 0.30},
            first_ts=pd.to_datetime(["2024-01-01", "2024-02-01", "2024-03-01", "2024-03-10",
                                     "2024-01-01"]),
            last_ts=pd.to_datetime(["2024-01-10 00:00", "2024-02-10 00:00", "2024-03-05 23:00",
                                    "2024-03-20 00:00", "2024-01-02 00:00"]),
            max_amount=[5000.0, 20.0, 700.0, -50.0, 9999.0],
            n_known_fraud=[2, 0, 1, 0, 3],
        )
        assert s.upsert_cases(SHA, df).created == 5
        s.upsert_cases(SHA2, summary({"a": 0.1, "z": 0.97}))
        ids = {e: case_id(s, e) for e in "abcde"}

        q = s.queue(SHA, 0.5)
        assert q.entity_id.tolist() == ["a", "b", "c", "d"]  # e is below the review threshold
        assert q.max_probability.is_monotonic_decreasing
        assert set(q.model_sha256) == {SHA}
        assert list(q.columns) == cases_mod.QUEUE_COLUMNS
        assert q.max_amount.dtype == "float64" and str(q.first_ts.dtype).startswith("datetime64")

        assert s.queue(SHA, 0.5, date_from="2024-03-01").entity_id.tolist() == ["c", "d"]
        assert s.queue(SHA, 0.5, date_to="2024-02-01").entity_id.tolist() == ["a", "b"]
        assert s.queue(SHA, 0.5, date_from=pd.Timestamp("2024-02-05"),
                       date_to=pd.Timestamp("2024-03-01 12:00")).entity_id.tolist() == ["b", "c"]
        # tz-aware bounds are converted to UTC: 22:00-02:00 is 2024-03-06 00:00 UTC, after c
        assert s.queue(SHA, 0.5, date_from=pd.Timestamp("2024-03-05T22:00:00-02:00")
                       ).entity_id.tolist() == ["d"]
        assert s.queue(SHA, 0.5, min_amount=600).entity_id.tolist() == ["a", "c"]
        assert s.queue(SHA, 0.5, max_amount=0).entity_id.tolist() == ["d"]
        assert s.queue(SHA, 0.5, label="fraud").entity_id.tolist() == ["a", "c"]
        assert s.queue(SHA, 0.5, label="not_fraud").entity_id.tolist() == ["b", "d"]

        s.assign(ids["b"], "Alice", actor="lead")
        s.assign(ids["d"], "bob", actor="lead")
        s.record_disposition(ids["d"], "escalate", "L2", analyst="bob")
        assert s.queue(SHA, 0.5, assignee="alice").entity_id.tolist() == ["b"]
        assert s.queue(SHA, 0.5, assignee="").entity_id.tolist() == ["a", "c"]
        assert s.queue(SHA, 0.5, state="open").entity_id.tolist() == ["a", "c"]
        assert s.queue(SHA, 0.5, state=["assigned", "escalated"]).entity_id.tolist() == ["b", "d"]
        assert s.queue(SHA, 0.5, state="open", label="fraud", min_amount=1000
                       ).entity_id.tolist() == ["a"]
        assert s.queue(SHA, 0.5, limit=2).entity_id.tolist() == ["a", "b"]
        assert s.queue(SHA, 0.999).empty
        with pytest.raises(ValueError, match="state"):
            s.queue(SHA, 0.5, state="closed")
        with pytest.raises(ValueError, match="label"):
            s.queue(SHA, 0.5, label="maybe")


def test_thresholds_are_per_model_and_drive_the_queue(db):
    with CaseStore(db) as s:
        s.upsert_cases(SHA, summary({"a": 0.95, "b": 0.7, "c": 0.4}))
        s.upsert_cases(SHA2, summary({"a": 0.95, "b": 0.7, "c": 0.4}))
        assert s.get_thresholds(SHA) is None
        with pytest.raises(ValueError, match="threshold"):
            s.queue(SHA)
        s.set_thresholds(SHA, 0.6, 0.9, actor="lead")
        s.set_thresholds(SHA2, 0.3, 0.5, actor="lead")
        assert (s.get_thresholds(SHA).review, s.get_thresholds(SHA).decline) == (0.6, 0.9)
        q1, q2 = s.queue(SHA), s.queue(SHA2)
        assert q1.entity_id.tolist() == ["a", "b"]
        assert q1.recommendation.tolist() == ["decline", "review"]
        assert q2.entity_id.tolist() == ["a", "b", "c"]
        assert q2.recommendation.tolist() == ["decline", "decline", "review"]
        s.set_thresholds(SHA, 0.5, 0.8, actor="lead2")
        log = s.audit_log(model_sha256=SHA)
        changes = log[log.action == "thresholds_set"]
        assert changes.actor.tolist() == ["lead", "lead2"]
        assert changes.iloc[1].before == {"review": 0.6, "decline": 0.9}
        assert changes.iloc[1].after == {"review": 0.5, "decline": 0.8}
        for bad in ((0.9, 0.5), (-0.1, 0.5), (0.5, 1.5), (float("nan"), 0.9)):
            with pytest.raises(ValueError):
                s.set_thresholds(SHA, *bad, actor="lead")
        assert s.get_thresholds(SHA).review == 0.5


def test_upsert_refreshes_scores_and_never_touches_dispositions(store):
    cid = case_id(store, "e1")
    store.assign(cid, "alice", actor="alice")
    store.record_disposition(cid, "false_positive", "known customer", analyst="alice")
    before = store.get_case(cid)
    res = store.upsert_cases(SHA, summary({"e1": 0.97, "e2": 0.6, "e3": 0.2, "e4": 0.8}))
    assert (res.created, res.updated, res.unchanged) == (1, 1, 2)
    after = store.get_case(cid)
    assert after["max_probability"] == 0.97
    for k in ("state", "assignee", "pending_by", "version"):
        assert after[k] == before[k]
    assert store.history(cid).disposition.tolist() == ["false_positive"]
    last = store.audit_log(cid).iloc[-1]
    assert last.action == "score_updated"
    assert (last.before["max_probability"], last.after["max_probability"]) == (0.9, 0.97)
    assert last.after["state"] == "false_positive"
    with pytest.raises(ValueError, match="missing columns"):
        store.upsert_cases(SHA, summary({"x": 0.5}).drop(columns="last_ts"))
    with pytest.raises(ValueError, match="duplicate"):
        store.upsert_cases(SHA, pd.concat([summary({"x": 0.5})] * 2))
    with pytest.raises(ValueError, match="max_probability"):
        store.upsert_cases(SHA, summary({"x": 1.5}))
    with pytest.raises(ValueError, match="sha256"):
        store.upsert_cases("not-a-sha", summary({"x": 0.5}))


# ----------------------------------------------------------------------------------------------
# Concurrency


def test_stale_version_raises_conflict_instead_of_overwriting(store, db):
    cid = case_id(store, "e1")
    with CaseStore(db, four_eyes=False) as other:
        seen_by_a = store.get_case(cid)["version"]
        seen_by_b = other.get_case(cid)["version"]
        other.record_disposition(cid, "escalate", "B was first", analyst="bob",
                                 expected_version=seen_by_b)
        n_audit = len(store.audit_log(cid))
        with pytest.raises(ConflictError, match="Reload") as err:
            store.record_disposition(cid, "false_positive", "A is stale", analyst="alice",
                                     expected_version=seen_by_a)
        assert (err.value.expected_version, err.value.actual_version) == (0, 1)
        assert "bob" in str(err.value)
        with pytest.raises(ConflictError):
            store.assign(cid, "alice", actor="alice", expected_version=seen_by_a)
        with pytest.raises(ConflictError):
            store.approve(cid, "x", analyst="alice", expected_version=seen_by_a)
    case = store.get_case(cid)
    assert (case["state"], case["assignee"], case["version"]) == ("escalated", None, 1)
    assert store.history(cid).note.tolist() == ["B was first"]
    assert len(store.audit_log(cid)) == n_audit
    # with the fresh version it goes through
    assert store.record_disposition(cid, "false_positive", "A after reload", analyst="alice",
                                    expected_version=1) == "false_positive"


def _check_writes(db: Path, cid: int, analysts: list[str], n: int) -> None:
    with CaseStore(db) as s:
        notes, hist = s.notes(cid), s.history(cid)
        assert len(notes) == len(hist) == n * len(analysts)
        for a in analysts:
            assert sorted(notes[notes.analyst == a].text) == sorted(
                f"{a} note {i}" for i in range(n)
            )
            assert sorted(hist[hist.analyst == a].note) == sorted(
                f"{a} disposition {i}" for i in range(n)
            )
        case = s.get_case(cid)
        assert case["version"] == n * len(analysts)  # every state change counted once
        last = s.audit_log(cid).iloc[-1]
        assert last.after["version"] == case["version"]
        assert last.after["state"] == case["state"]


def _writes(s: CaseStore, cid: int, analyst: str, n: int) -> None:
    for i in range(n):
        s.add_note(cid, f"{analyst} note {i}", analyst=analyst)
        disposition = "escalate" if i % 2 else "false_positive"
        s.record_disposition(cid, disposition, f"{analyst} disposition {i}", analyst=analyst)


def test_two_threads_with_own_stores_lose_no_update(store, db):
    cid = case_id(store, "e1")
    n = 40
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def worker(analyst):
        try:
            with CaseStore(db, four_eyes=False) as s:
                start.wait()
                _writes(s, cid, analyst, n)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(a,)) for a in ("t1", "t2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    _check_writes(db, cid, ["t1", "t2"], n)


def test_one_store_shared_by_threads_loses_no_update(store, db):
    cid = case_id(store, "e2")
    n = 30
    threads = [threading.Thread(target=_writes, args=(store, cid, a, n)) for a in ("s1", "s2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    _check_writes(db, cid, ["s1", "s2"], n)


WRITER = r"""
import os, sys, time
from engine.cases.store import CaseStore
db, analyst, n, cid, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
s = CaseStore(db, four_eyes=False)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.001)
for i in range(n):
    s.add_note(cid, f"{analyst} note {i}", analyst=analyst)
    s.record_disposition(cid, "escalate" if i % 2 else "false_positive",
                         f"{analyst} disposition {i}", analyst=analyst)
s.close()
"""


def _python(script: str, *args: object, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT),
                                                        os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, **kw,
    )


def test_two_processes_lose_no_update(store, db, tmp_path):
    cid = case_id(store, "e1")
    n = 30
    go = tmp_path / "go"
    procs = [_python(WRITER, db, a, n, cid, go) for a in ("p1", "p2")]
    for p in procs:  # both opened the store and wait at the start line
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
    go.touch()
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    _check_writes(db, cid, ["p1", "p2"], n)


# ----------------------------------------------------------------------------------------------
# A writer killed mid-write leaves a consistent database


CRASHER = r"""
import itertools, random, sys, time
from engine.cases.store import CaseStore

class Stalling(CaseStore):
    stall_at = int(sys.argv[2])
    n_audit = 0
    def _audit(self, conn, *args, **kwargs):
        CaseStore._audit(conn, *args, **kwargs)
        Stalling.n_audit += 1
        if Stalling.n_audit == self.stall_at:
            print("stall", flush=True)   # inside BEGIN IMMEDIATE, nothing committed yet
            time.sleep(600)

s = Stalling(sys.argv[1], four_eyes=True)
ids = [int(x) for x in sys.argv[3].split(",")]
rng = random.Random(int(sys.argv[4]))
for i in itertools.count():
    cid = rng.choice(ids)
    me, other = ("w1", "w2") if i % 2 else ("w2", "w1")
    case = s.get_case(cid)
    r = rng.random()
    if case["state"] == "pending_approval":
        approver = other if case["pending_by"] == me else me
        s.approve(cid, f"approve {i}", analyst=approver)
    elif r < 0.25:
        s.assign(cid, rng.choice([me, other, None]), actor=me)
    elif r < 0.5:
        s.add_note(cid, f"note {i}", analyst=me)
    else:
        d = rng.choice(["confirmed_fraud", "false_positive", "escalate"])
        s.record_disposition(cid, d, f"disposition {i}", analyst=me,
                             expected_version=case["version"])
    print("ok", flush=True)  # the call returned: its transaction is committed
"""


def _assert_consistent(db: Path) -> int:
    """integrity_check ok, and every case equals its last audit row; returns #audit rows."""
    conn = raw(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    with CaseStore(db) as s:
        log = s.audit_log()
        for cid in conn.execute("SELECT id FROM cases").fetchall():
            case = s.get_case(cid[0])
            last = log[log.case_id == case["id"]].iloc[-1].after
            for k in ("state", "assignee", "pending_by", "version"):
                assert case[k] == last[k], (case, last)
            # the disposition history agrees with the audit log
            hist = s.history(case["id"])
            kinds = log[(log.case_id == case["id"])
                        & log.action.isin(["disposition", "approved"])]
            assert len(hist) == len(kinds)
            assert len(s.notes(case["id"])) == int(
                ((log.case_id == case["id"]) & (log.action == "note_added")).sum()
            )
    return len(log)


def _kill(proc: subprocess.Popen, lines: queue_mod.Queue) -> int:
    """SIGKILL the writer, reap it, drain its output; return the further "ok" lines."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    more = 0
    while (line := lines.get(timeout=30)) is not None:
        more += line == "ok"
    proc.stdout.close()
    proc.stderr.close()
    return more


def _read_lines(proc: subprocess.Popen) -> queue_mod.Queue:
    q: queue_mod.Queue = queue_mod.Queue()

    def pump():
        for line in proc.stdout:
            q.put(line.strip())
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_writer_killed_inside_a_transaction_leaves_db_consistent(store, db):
    ids = ",".join(str(case_id(store, e)) for e in ("e1", "e2", "e3"))
    CaseStore(db, four_eyes=True).close()  # the store's four-eyes policy row, written once, before the count
    n_before = _assert_consistent(db)
    stall_at = 40
    proc = _python(CRASHER, db, stall_at, ids, 1)
    lines = _read_lines(proc)
    committed = 0
    while True:
        line = lines.get(timeout=120)
        assert line is not None, proc.stderr.read()
        if line == "stall":
            break
        committed += line == "ok"
    assert Path(str(db) + "-wal").exists()  # the WAL is live
    assert _kill(proc, lines) == 0
    n_after = _assert_consistent(db)
    # every call that returned is there; the one killed mid-transaction left no trace
    assert committed == stall_at - 1
    assert n_after - n_before == committed


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
@pytest.mark.parametrize("seed", [2, 3, 4])
def test_writer_killed_at_a_random_moment_leaves_db_consistent(store, db, seed):
    ids = ",".join(str(case_id(store, e)) for e in ("e1", "e2", "e3"))
    CaseStore(db, four_eyes=True).close()  # the store's four-eyes policy row, written once, before the count
    n_before = _assert_consistent(db)
    proc = _python(CRASHER, db, 10**9, ids, seed)
    lines = _read_lines(proc)
    committed = 0
    target = 10 + 7 * seed
    while committed < target:
        line = lines.get(timeout=120)
        assert line is not None, proc.stderr.read()
        committed += line == "ok"
    time.sleep(0.001 * seed)
    committed += _kill(proc, lines)
    n_after = _assert_consistent(db)
    # each committed call wrote exactly one audit row; at most one more committed unreported
    assert committed <= n_after - n_before <= committed + 1
    # the database still takes writes afterwards
    with CaseStore(db, four_eyes=False) as s:
        s.add_note(int(ids.split(",")[0]), "after the crash", analyst="alice")
    _assert_consistent(db)


def test_states_constant_matches_schema(db):
    with CaseStore(db):
        pass
    sql = raw(db).execute("SELECT sql FROM sqlite_master WHERE name = 'cases'").fetchone()[0]
    for st in STATES:
        assert f"'{st}'" in sql


# ----------------------------------------------------------------------------------------------
# Cases belong to a data source (issue 12, item 6)

SRC_A = cases_mod.source_id("1" * 64, "demo")
SRC_B = cases_mod.source_id("2" * 64, "tabformer")


def test_same_entity_in_two_sources_is_two_cases(db):
    with CaseStore(db, four_eyes=False) as s:
        assert s.upsert_cases(SHA, summary({"0:1": 0.9, "0:2": 0.7}), source_id=SRC_A) == (
            cases_mod.UpsertResult(created=2, updated=0, unchanged=0)
        )
        a = s.find_case(SHA, SRC_A, "0:1")
        s.record_disposition(a["id"], "false_positive", "demo card, legit", analyst="alice")
        s.add_note(a["id"], "called the customer", analyst="alice")
        n_audit = len(s.audit_log())
        # another file with the same entity ids: new cases, the demo case untouched
        res = s.upsert_cases(SHA, summary({"0:1": 0.3, "0:2": 0.95}, max_amount=[5.0, 6.0]),
                             source_id=SRC_B)
        assert res == cases_mod.UpsertResult(created=2, updated=0, unchanged=0)
        b = s.find_case(SHA, SRC_B, "0:1")
        assert b["id"] != a["id"]
        assert (b["state"], b["max_probability"], b["source_id"]) == ("open", 0.3, SRC_B)
        assert s.history(b["id"]).empty and s.notes(b["id"]).empty
        a_now = s.get_case(a["id"])
        assert (a_now["state"], a_now["max_probability"], a_now["max_amount"]) == (
            "false_positive", 0.9, 100.0
        )
        # switching back and forth writes nothing and never a score_updated row
        for src, probs in [(SRC_A, {"0:1": 0.9, "0:2": 0.7}), (SRC_B, {"0:1": 0.3, "0:2": 0.95})] * 2:
            amounts = [100.0, 100.0] if src == SRC_A else [5.0, 6.0]
            r = s.upsert_cases(SHA, summary(probs, max_amount=amounts), source_id=src)
            assert r == cases_mod.UpsertResult(created=0, updated=0, unchanged=2)
        log = s.audit_log()
        assert len(log) == n_audit + 2
        assert "score_updated" not in set(log.action)
        assert {r["source_id"] for r in log.loc[log.action == "case_created", "after"]} == {
            SRC_A, SRC_B
        }
        # the queue of one source holds only its cases; without a source, both, with the column
        qa = s.queue(SHA, 0.0, source_id=SRC_A)
        assert set(qa.case_id) == {a["id"], s.find_case(SHA, SRC_A, "0:2")["id"]}
        assert set(qa.source_id) == {SRC_A}
        assert sorted(s.queue(SHA, 0.0).source_id) == sorted([SRC_A, SRC_A, SRC_B, SRC_B])
        assert list(qa.columns) == cases_mod.QUEUE_COLUMNS
        assert s.find_case(SHA, SRC_A, "nope") is None


def test_source_id_is_file_hash_and_spec(db):
    assert SRC_A == "1" * 64 + "/demo"
    with pytest.raises(ValueError, match="model_sha256"):
        cases_mod.source_id("xyz", "demo")
    with pytest.raises(ValueError, match="source_id"):
        cases_mod.source_id("1" * 64, "")
    with CaseStore(db) as s, pytest.raises(ValueError, match="source_id"):
        s.upsert_cases(SHA, summary({"e": 0.5}), source_id="../etc")
    with CaseStore(db) as s:
        assert s.upsert_cases(SHA, summary({"e": 0.5})).created == 1  # default: legacy source
        assert s.find_case(SHA, cases_mod.LEGACY_SOURCE, "e")["source_id"] == "legacy"


def test_migrate_v2_cases_to_the_legacy_source(db):
    db.parent.mkdir(parents=True)
    conn = connect(db)
    assert migrate(conn, target=2) == 2
    conn.execute(
        "INSERT INTO cases(model_sha256, entity_id, max_probability, state, created_at, "
        "updated_at, version) VALUES (?, '0:1', 0.9, 'false_positive', 't0', 't0', 1)", (SHA,)
    )
    conn.execute(
        "INSERT INTO dispositions(case_id, ts, kind, disposition, state_after, analyst, note) "
        "VALUES (1, 't1', 'disposition', 'false_positive', 'false_positive', 'carol', 'legit')"
    )
    conn.execute("INSERT INTO notes(case_id, ts, analyst, text) VALUES (1, 't1', 'carol', 'hi')")
    # the audit rows the store wrote with them (same case, time and actor; chain._Recorded)
    for i, action in enumerate(("case_created", "disposition", "note_added")):
        conn.execute(
            "INSERT INTO audit_log(ts, actor, action, case_id, model_sha256, after_json) "
            f"VALUES ('t{min(i, 1)}', 'carol', '{action}', 1, ?, '{{\"n\": {i}}}')", (SHA,)
        )
    conn.close()
    with CaseStore(db, four_eyes=False) as s:
        assert s.audit_verdict.ok and s.audit_verdict.rows_checked == 3
        old = s.get_case(1)
        assert (old["source_id"], old["entity_id"], old["state"], old["version"]) == (
            "legacy", "0:1", "false_positive", 1
        )
        assert s.history(1).note.tolist() == ["legit"] and s.notes(1).text.tolist() == ["hi"]
        assert s.upsert_cases(SHA, summary({"0:1": 0.2}), source_id=SRC_A).created == 1
        assert s.get_case(1)["max_probability"] == 0.9
        s.add_note(1, "after the migration", analyst="carol")
        assert s.verify_audit_chain().ok
    conn = raw(db)
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 0  # a raw connection's default
    with pytest.raises(sqlite3.IntegrityError):  # the dispositions FK still points at cases
        c2 = connect(db)
        try:
            c2.execute("INSERT INTO dispositions(case_id, ts, kind, disposition, state_after, "
                       "analyst, note) VALUES (999, 't', 'disposition', 'escalate', 'escalated', "
                       "'x', 'n')")
        finally:
            c2.close()


# ----------------------------------------------------------------------------------------------
# Files are private (issue 12, item 9)


def _mode(p: Path) -> int:
    return p.stat().st_mode & 0o777


def test_database_and_key_files_are_private(tmp_path, monkeypatch):
    from engine.cases.report.model import pseudonym_salt

    old = os.umask(0o022)
    try:
        d = tmp_path / "new" / "dir"
        with CaseStore(d / "cases.sqlite3") as s:
            s.set_thresholds(SHA, 0.5, 0.9, actor="alice")  # writes the WAL
            assert _mode(d) == 0o700
            assert _mode(d / "cases.sqlite3") == 0o600
            for extra in ("cases.sqlite3-wal", "cases.sqlite3-shm"):
                if (d / extra).exists():
                    assert _mode(d / extra) == 0o600, extra
        loose = tmp_path / "loose.db"
        loose.touch(mode=0o644)
        os.chmod(loose, 0o644)
        with CaseStore(loose):
            assert _mode(loose) == 0o600
        monkeypatch.delenv("FRAUDLENS_PSEUDONYM_SALT", raising=False)
        kd = tmp_path / "keys" / "here"
        pseudonym_salt(kd)
        assert _mode(kd) == 0o700 and _mode(kd / "pseudonym_salt") == 0o600
        os.chmod(kd / "pseudonym_salt", 0o644)
        pseudonym_salt(kd)
        assert _mode(kd / "pseudonym_salt") == 0o600
    finally:
        os.umask(old)


# ----------------------------------------------------------------------------------------------
# Who is the same person (issue 12, item 2, store side)

LOOKALIKES = ["alice", "Alice", "ALICE", " alice ", "ali\u200bce", "\u200dalice\ufeff",
              "\u0430lice", "\u0410LICE", "\uff41\uff4c\uff49\uff43\uff45", "al\u0456ce"]


@pytest.mark.parametrize("approver", LOOKALIKES)
def test_lookalike_names_cannot_approve_their_own_proposal(db, approver):
    with CaseStore(db, four_eyes=True) as s:
        s.upsert_cases(SHA, summary({"e": 0.9}))
        cid = case_id(s, "e")
        assert s.record_disposition(cid, "confirmed_fraud", "same merchant", analyst="alice") == (
            "pending_approval"
        )
        with pytest.raises(FourEyesError):
            s.approve(cid, "agreed", analyst=approver)
        assert s.get_case(cid)["state"] == "pending_approval"
        assert s.audit_log(cid).action.tolist()[-1] == "approval_refused"
        assert s.approve(cid, "agreed", analyst="bob") == "confirmed_fraud"


@pytest.mark.parametrize("name", ["system", "System", " SYSTEM ", "sys\u200btem",
                                  "\u0455\u0443\u0455t\u0435m", "\uff53\uff59\uff53\uff54\uff45\uff4d",
                                  "\u200b\u200c"])
def test_reserved_or_invisible_names_cannot_act(store, name):
    cid = case_id(store, "e1")
    with pytest.raises(MissingAnalystError):
        store.record_disposition(cid, "escalate", "look", analyst=name)
    with pytest.raises(MissingAnalystError):
        store.assign(cid, "bob", actor=name)
    with pytest.raises(MissingAnalystError):
        store.assign(cid, name, actor="bob")
    with pytest.raises(MissingAnalystError):
        store.add_note(cid, "hi", analyst=name)
    with pytest.raises(MissingAnalystError):
        store.set_thresholds(SHA, 0.1, 0.2, actor=name)
    assert store.get_case(cid)["version"] == 0


def test_person_key_drives_assignee_and_actor_filters(store):
    from engine.cases.store import person_key, same_person

    assert person_key("\u0410li\u200bce") == person_key("alice") == "alice"
    assert not same_person("alice", "bob") and not same_person("alice", None)
    cid = case_id(store, "e1")
    store.assign(cid, "\u0430lice", actor="bob")  # Cyrillic а
    assert store.queue(SHA, 0.0, assignee="ALICE").case_id.tolist() == [cid]
    assert store.queue(SHA, 0.0, assignee="bob").empty
    assert store.audit_log(actor="BOB").action.tolist() == ["assigned"]
    assert store.audit_log(action=["case_created"]).shape[0] == 3


# ----------------------------------------------------------------------------------------------
# Audit hash chain (issue 12, item 9; the attacks are in tests/hostile/test_audit_tampering.py)


def test_audit_rows_are_chained_and_verified_on_open(store, db):
    from engine.cases.store import AuditChainError, AuditTamperWarning
    from engine.cases.store.chain import GENESIS, row_hash

    cid = case_id(store, "e1")
    store.record_disposition(cid, "escalate", "look closer", analyst="alice")
    log = store.audit_log()
    assert log.prev_hash.iloc[0] == GENESIS
    assert log.prev_hash.iloc[1:].tolist() == log.row_hash.iloc[:-1].tolist()
    assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in log.row_hash)
    first = raw(db).execute("SELECT id, ts, actor, action, case_id, model_sha256, before_json, "
                            "after_json, prev_hash, row_hash FROM audit_log WHERE id = 1").fetchone()
    assert row_hash(tuple(first)[:9]) == first[9]
    assert store.audit_verdict.ok and store.verify_audit_chain().ok
    assert store.verify_audit_chain().rows_checked == 4
    conn = raw(db)
    conn.execute("DROP TRIGGER audit_log_no_update")
    conn.execute("UPDATE audit_log SET actor = 'mallory' WHERE id = 2")
    with pytest.warns(AuditTamperWarning, match="row 2"):
        with CaseStore(db) as s:
            assert (s.audit_verdict.ok, s.audit_verdict.first_broken_id) == (False, 2)
    with pytest.raises(AuditChainError, match="row 2") as ei:
        CaseStore(db, strict_audit=True)
    assert ei.value.verdict.first_broken_id == 2


@pytest.mark.parametrize("edit, names", [
    ("UPDATE cases SET state = 'false_positive', version = version + 1 WHERE entity_id = 'e1'", "state"),
    ("UPDATE cases SET assignee = 'mallory', state = 'assigned' WHERE entity_id = 'e2'", "state"),
    ("UPDATE cases SET assignee = 'mallory' WHERE entity_id = 'e1'", "assignee"),
    ("UPDATE cases SET max_probability = 0.999 WHERE entity_id = 'e3'", "max_probability"),
    ("UPDATE model_thresholds SET review = 0.7", "thresholds"),
    ("DELETE FROM model_thresholds", "removed"),
    (f"INSERT INTO model_thresholds VALUES ('{'b' * 64}', 0.1, 0.2, '2026-01-01', 'mallory')", "no audit row"),
])
def test_rows_edited_in_place_no_longer_match_the_audit_log(store, db, edit, names):
    """No audit row changes when the cases or thresholds tables are edited directly: the current
    rows must still hold what their latest audit rows recorded."""
    cid = case_id(store, "e1")
    store.assign(cid, "alice", actor="alice")
    store.record_disposition(cid, "escalate", "look closer", analyst="alice")
    store.set_thresholds(SHA, 0.3, 0.8, actor="sam")
    store.set_thresholds(SHA, 0.35, 0.8, actor="sam")
    assert store.verify_audit_chain().ok  # the store's own writes match
    raw(db).execute(edit)
    v = store.verify_audit_chain()
    assert not v.ok and names in v.reason, v.reason
    assert "outside the store" in v.reason and v.first_broken_id >= 1


def test_a_case_inserted_outside_the_store_is_seen(store, db):
    raw(db).execute("INSERT INTO cases(model_sha256, source_id, entity_id, max_probability, max_transaction_id, "
                    "first_ts, last_ts, max_amount, n_transactions, n_known_fraud, state, created_at, updated_at) "
                    "SELECT model_sha256, source_id, 'ghost', max_probability, max_transaction_id, first_ts, last_ts, "
                    "max_amount, n_transactions, n_known_fraud, 'open', created_at, updated_at FROM cases LIMIT 1")
    v = store.verify_audit_chain()
    assert not v.ok and "has no audit row" in v.reason and "case 4" in v.reason, v.reason


def test_four_eyes_undoing_an_approved_fraud_takes_a_second_person_too(db):
    """With four-eyes on, one analyst cannot turn an approved confirmed fraud into a false
    positive alone, nor re-record a pending reversal to apply it: each waits for another
    person, whose approval applies the proposed disposition."""
    with CaseStore(db, four_eyes=True) as s:
        s.upsert_cases(SHA, summary({"e1": 0.95}))
        cid = case_id(s, "e1")
        s.record_disposition(cid, "confirmed_fraud", "burst", analyst="sam")
        assert s.approve(cid, "agreed", analyst="sue") == "confirmed_fraud"
        assert s.pending_disposition(cid) is None
        assert s.record_disposition(cid, "false_positive", "customer confirmed", analyst="bob") == "pending_approval"
        assert (s.get_case(cid)["pending_by"], s.pending_disposition(cid)) == ("bob", "false_positive")
        assert s.record_disposition(cid, "false_positive", "again", analyst="bob") == "pending_approval"
        with pytest.raises(FourEyesError):
            s.approve(cid, "mine", analyst="bob")
        assert s.approve(cid, "call recording checked", analyst="sam") == "false_positive"
        case = s.get_case(cid)
        assert (case["state"], case["pending_by"]) == ("false_positive", None)
        h = s.history(cid)
        assert h[["kind", "disposition", "state_after"]].values.tolist()[-3:] == [
            ["disposition", "false_positive", "pending_approval"],
            ["disposition", "false_positive", "pending_approval"],
            ["approval", "false_positive", "false_positive"],
        ]
        assert s.audit_log(cid).iloc[-1].after["disposition"] == "false_positive"
    with CaseStore(db, four_eyes=False) as s:  # without the rule one person revises it
        assert s.record_disposition(cid, "escalate", "new evidence", analyst="bob") == "escalated"
