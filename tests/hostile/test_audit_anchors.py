"""Audit anchors (engine.cases.store.anchor, ``fraudlens audit head / verify``): a log rewritten
with every later hash, the head and the id sequence recomputed verifies as a chain, and only an
anchor kept elsewhere shows it. Each attack here is first shown to pass the chain check."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from engine.cases.store import CaseStore, verify_chain
from engine.cases.store.anchor import (
    ANCHOR_PREFIX,
    AnchorFileError,
    AuditAnchor,
    check_anchors,
    parse_anchors,
    read_anchor_file,
)
from engine.cases.store.chain import HASHED_COLUMNS, row_hash
from engine.cli import app

SHA = "c" * 64


def _summary(n: int) -> pd.DataFrame:
    return pd.DataFrame({
        "entity_id": [f"e{i}" for i in range(n)], "max_probability": [0.9 - 0.1 * i for i in range(n)],
        "max_transaction_id": [f"t{i}" for i in range(n)], "first_ts": pd.Timestamp("2024-01-01"),
        "last_ts": pd.Timestamp("2024-01-02"), "max_amount": 10.0, "n_transactions": 3, "n_known_fraud": 0,
    })


@pytest.fixture
def db(tmp_path) -> Path:
    """3 cases, an assignment, a disposition, a note, then two report downloads (rows 1-8)."""
    path = tmp_path / "cases.sqlite3"
    with CaseStore(path, four_eyes=False) as s:
        s.upsert_cases(SHA, _summary(3))                                          # rows 1-3
        s.assign(1, "alice", actor="alice")                                       # 4
        s.record_disposition(1, "false_positive", "legit", analyst="alice")       # 5
        s.add_note(2, "customer called", analyst="bob")                           # 6
        s.record_export(1, report_id="r1", report_sha256="a" * 64, fmt="pdf", analyst="alice")  # 7
        s.record_export(1, report_id="r1", report_sha256="a" * 64, fmt="json", analyst="carol")  # 8
        assert len(s.audit_log()) == 8 and s.verify_audit_chain().ok
    return path


def _raw(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(db, isolation_level=None)


def _rehash_from(conn: sqlite3.Connection, first: int) -> None:
    """What someone who can write the file does after an edit: every hash from ``first`` on, the
    head and the id sequence recomputed with the published algorithm."""
    cols = ", ".join(HASHED_COLUMNS)
    rows = conn.execute(f"SELECT {cols} FROM audit_log WHERE id >= ? ORDER BY id", (first,)).fetchall()
    prev = conn.execute("SELECT row_hash FROM audit_log WHERE id = ?", (first - 1,)).fetchone()
    prev = prev[0] if prev else "0" * 64
    last = (first - 1, prev)
    for r in rows:
        values = (*r[:-1], prev)
        h = row_hash(values)
        conn.execute("UPDATE audit_log SET prev_hash = ?, row_hash = ? WHERE id = ?", (prev, h, r[0]))
        prev, last = h, (r[0], h)
    conn.execute("UPDATE audit_head SET last_id = ?, last_hash = ?", last)
    conn.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'audit_log'", (last[0],))


def _drop_triggers(conn: sqlite3.Connection) -> None:
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")


def _rewrite_export_actor(conn: sqlite3.Connection) -> int:
    """Who downloaded the report (row 7) changed to mallory, every later hash recomputed."""
    conn.execute("UPDATE audit_log SET actor = 'mallory' WHERE id = 7")
    _rehash_from(conn, 7)
    return 7


def _cut_last_download(conn: sqlite3.Connection) -> int:
    """Row 8 (a download: it leaves no record elsewhere) removed, head and sequence rewound."""
    conn.execute("DELETE FROM audit_log WHERE id = 8")
    _rehash_from(conn, 8)  # nothing to rehash: the head and sequence go back to row 7
    return 8


@pytest.mark.parametrize("attack", [_rewrite_export_actor, _cut_last_download])
def test_a_rewrite_the_chain_accepts_is_caught_by_an_anchor_taken_before(db, attack):
    with CaseStore(db) as s:
        early, late = AuditAnchor(3, s.audit_log()["row_hash"].iloc[2]), s.audit_anchor()
    assert late.row_id == 8
    conn = _raw(db)
    _drop_triggers(conn)
    row = attack(conn)
    assert verify_chain(conn).ok  # the weakness an anchor exists for: the chain alone says intact
    v = check_anchors(conn, [early, late])
    assert not v.ok and v.first_broken_id == 8 and "row 8" in v.reason
    assert ("gone" in v.reason) if attack is _cut_last_download else ("no longer has the hash" in v.reason)
    assert check_anchors(conn, [early]).ok  # the log up to row 3 is untouched: that anchor still matches
    if row == 7:  # an anchor at the edited row names it, not a later one
        seven = AuditAnchor(7, "0" * 64)
        assert check_anchors(conn, [seven, late]).first_broken_id == 7
    conn.close()


def test_honest_writes_after_an_anchor_keep_it_matching(db):
    with CaseStore(db, four_eyes=False) as s:
        a = s.audit_anchor()
        s.add_note(3, "later note", analyst="bob")
        assert s.check_audit_anchors([a]).ok and s.audit_anchor().row_id == a.row_id + 1
        # a forged anchor (a hash the row never had) fails, so the check is not always ok
        forged = AuditAnchor(a.row_id, "f" * 64)
        assert not s.check_audit_anchors([forged]).ok


def test_an_empty_log_has_no_anchor(tmp_path):
    with CaseStore(tmp_path / "c.sqlite3", four_eyes=False) as s:
        assert s.audit_anchor() is None


def test_anchor_lines_and_report_json_parse_and_bad_ones_name_file_and_line(tmp_path):
    a = AuditAnchor(12, "ab" * 32, "2026-12-07T18:00:00+00:00")
    assert parse_anchors(a.line()) == [a]
    assert parse_anchors(f"# kept by the SIEM\n\n{a.line()}\n{AuditAnchor(3, 'cd' * 32).line()}\n")[1].row_id == 3
    report = {"report_id": "x", "audit_anchor": a.as_dict()}
    assert parse_anchors(json.dumps(report)) == [a]
    f = tmp_path / "anchors.txt"
    f.write_text(f"# a comment with a line separator \u2028 in it\n{a.line()}\n{ANCHOR_PREFIX} row=4 sha256=xyz\n",
                 encoding="utf-8")
    with pytest.raises(AnchorFileError, match=r"anchors.txt, line 3: expected"):
        read_anchor_file(f)
    # a pretty-printed report (several lines), `audit head --json` lines, and what must be refused
    assert parse_anchors(json.dumps(report, indent=2)) == [a]
    assert parse_anchors(json.dumps(a.as_dict()) + "\n" + json.dumps(a.as_dict())) == [a, a]
    for text, words in ((json.dumps({"report_id": "x"}), "without a valid row_id"),
                        (json.dumps({"report_id": "x"}, indent=2), "without an audit_anchor"),
                        (json.dumps({"audit_anchor": {**a.as_dict(), "row_id": 10**30}}), "without a valid"),
                        (json.dumps({"audit_anchor": {**a.as_dict(), "ts": "x\nanchors: all match\x1b[8m"}}),
                         "without a valid"),
                        (f"{ANCHOR_PREFIX} row=1 sha256={'a' * 64} at=\x1b]0;pwn\x07", "expected"),
                        ("{" * 100_000, "not valid JSON"), (f"{ANCHOR_PREFIX} row=\u0663 sha256={'a' * 64}", "expected"),
                        ("", "no anchor"),
                        ("{not json", "not valid JSON"), (f"{ANCHOR_PREFIX} row=0 sha256={'a' * 64}", "1 or more")):
        with pytest.raises(AnchorFileError, match=words):
            parse_anchors(text, "f")
    f.write_bytes(b"\xff\xfe" + a.line().encode())
    with pytest.raises(AnchorFileError, match="not UTF-8"):
        read_anchor_file(f)


def test_cli_head_then_verify_passes_and_a_rewrite_exits_1(db, tmp_path):
    runner = CliRunner()
    head = runner.invoke(app, ["audit", "head", "--cases", str(db)])
    assert head.exit_code == 0 and head.output.startswith(f"{ANCHOR_PREFIX} row=8 sha256="), head.output
    kept = tmp_path / "offhost.txt"
    kept.write_text(head.output, encoding="utf-8")
    as_json = json.loads(runner.invoke(app, ["audit", "head", "--cases", str(db), "--json"]).output)
    assert as_json["row_id"] == 8 and as_json["row_hash"] in head.output
    ok = runner.invoke(app, ["audit", "verify", "--cases", str(db), "--anchors", str(kept)])
    assert ok.exit_code == 0 and "chain: intact" in ok.output and "all match" in ok.output, ok.output
    bare = runner.invoke(app, ["audit", "verify", "--cases", str(db)])
    assert bare.exit_code == 0 and "anchors: none given" in bare.output
    conn = _raw(db)
    _drop_triggers(conn)
    _rewrite_export_actor(conn)
    conn.close()
    bad = runner.invoke(app, ["audit", "verify", "--cases", str(db), "--anchors", str(kept)])
    assert bad.exit_code == 1 and "chain: intact" in bad.output and "anchors: BROKEN" in bad.output, bad.output
    assert "row 8 no longer has the hash" in " ".join(bad.output.split())


def test_cli_verify_exits_1_on_a_broken_chain_and_2_without_a_store(db, tmp_path):
    conn = _raw(db)
    _drop_triggers(conn)
    conn.execute("UPDATE audit_log SET actor = 'mallory' WHERE id = 4")  # not rehashed
    conn.close()
    runner = CliRunner()
    bad = runner.invoke(app, ["audit", "verify", "--cases", str(db)])
    assert bad.exit_code == 1 and "chain: BROKEN" in bad.output and "row 4" in bad.output, bad.output
    missing = tmp_path / "none" / "cases.sqlite3"
    res = runner.invoke(app, ["audit", "verify", "--cases", str(missing)])
    assert res.exit_code == 2 and "no case store" in res.output and not missing.exists()
    junk = tmp_path / "anchors.txt"
    junk.write_text("hello\n", encoding="utf-8")
    res = runner.invoke(app, ["audit", "verify", "--cases", str(db), "--anchors", str(junk)])
    assert res.exit_code == 2 and "line 1" in res.output


def test_cli_reads_only_and_head_refuses_a_broken_chain(db, tmp_path):
    import hashlib

    runner = CliRunner()
    conn = _raw(db)
    conn.execute("PRAGMA journal_mode = DELETE")  # evidence as it was handed over: verify must not change it
    conn.close()
    sha = hashlib.sha256(db.read_bytes()).hexdigest()
    as_json = runner.invoke(app, ["audit", "head", "--cases", str(db), "--json"]).output
    kept = tmp_path / "kept.jsonl"
    kept.write_text(as_json + as_json, encoding="utf-8")  # a cron job appending `head --json` lines
    ok = runner.invoke(app, ["audit", "verify", "--cases", str(db), "--anchors", str(kept)])
    assert ok.exit_code == 0 and "2 checked, all match" in ok.output, ok.output
    assert hashlib.sha256(db.read_bytes()).hexdigest() == sha
    assert _raw(db).execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    empty = tmp_path / "empty.sqlite3"
    empty.write_bytes(b"")
    res = runner.invoke(app, ["audit", "verify", "--cases", str(empty)])
    assert res.exit_code == 2 and "not a case store" in res.output and empty.read_bytes() == b""
    conn = _raw(db)
    _drop_triggers(conn)
    conn.execute("UPDATE audit_log SET actor = 'mallory' WHERE id = 4")  # not rehashed: the chain names it
    conn.close()
    head = runner.invoke(app, ["audit", "head", "--cases", str(db)])
    assert head.exit_code == 1 and "no anchor taken" in head.output and "row 4" in head.output, head.output
    both = runner.invoke(app, ["audit", "verify", "--cases", str(db), "--anchors", str(kept)])
    assert both.exit_code == 1 and "chain: BROKEN" in both.output
    assert "all match" not in both.output and "nothing is vouched for" in " ".join(both.output.split())
