"""The audit log's hash chain: how a row's hash is computed and how the chain is verified.

Every ``audit_log`` row carries ``prev_hash`` (the ``row_hash`` of the row before it; 64 zeros
for row 1) and ``row_hash`` = SHA-256 of ``b"fraudlens-audit-v1\\n"`` + the canonical JSON of
``[id, ts, actor, action, case_id, model_sha256, before_json, after_json, prev_hash]`` (values
as stored: text, integer or null; UTF-8; no spaces; see :func:`row_hash`). The one-row table
``audit_head`` holds the id and hash of the last row written, and SQLite's ``sqlite_sequence``
the highest id ever used. Ids are consecutive from 1.

:func:`verify_chain` recomputes all of it. A row changed afterwards (even with its triggers
dropped) no longer matches its hash; a row removed leaves a gap (or, at the end, a head and a
sequence that point past the last row); rows swapped or renumbered break the hash (the id is
hashed) or the link. The first such row is named. A log cut back to an earlier row with ``audit_head`` and the
sequence rewritten to match is still seen: every disposition, note and narrative must have its
audit row (:func:`unaudited_record`). The chain makes tampering *evident*; it
cannot stop someone who can write the file from rewriting every hash after an edit: keep
off-host copies of the head (``audit_head``) for that.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from engine.cases.store.common import ChainVerdict

GENESIS = "0" * 64
_DOMAIN = b"fraudlens-audit-v1\n"
#: the stored columns a row's hash covers, in this order (``prev_hash`` last)
HASHED_COLUMNS = ("id", "ts", "actor", "action", "case_id", "model_sha256", "before_json",
                  "after_json", "prev_hash")
_SELECT = f"SELECT {', '.join(HASHED_COLUMNS)}, row_hash FROM audit_log ORDER BY id"


def row_hash(values: Sequence[Any]) -> str:
    """SHA-256 (hex) of one audit row: ``values`` are the :data:`HASHED_COLUMNS` in order.

    Raises ``ValueError`` if there are not exactly 9 values.
    """
    if len(values) != len(HASHED_COLUMNS):
        raise ValueError(f"row_hash: expected {len(HASHED_COLUMNS)} values, got {len(values)}")
    body = json.dumps(list(values), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(_DOMAIN + body.encode("utf-8")).hexdigest()


def chain_head(conn: sqlite3.Connection) -> tuple[int, str]:
    """``(next id, prev_hash)`` for the next audit row, from ``audit_head`` (not from the last
    row, so that writing on after a removed row keeps the gap visible)."""
    head = conn.execute("SELECT last_id, last_hash FROM audit_head WHERE id = 1").fetchone()
    top = conn.execute("SELECT coalesce(max(id), 0) FROM audit_log").fetchone()[0]
    seq = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'audit_log'").fetchone()
    next_id = max(head[0] if head else 0, int(top), int(seq[0]) if seq else 0) + 1
    return next_id, (head[1] if head else GENESIS)


def set_head(conn: sqlite3.Connection, last_id: int, last_hash: str) -> None:
    """Record the last row written (inside the writer's transaction)."""
    conn.execute(
        "INSERT INTO audit_head(id, last_id, last_hash) VALUES (1, ?, ?) ON CONFLICT(id) DO "
        "UPDATE SET last_id = excluded.last_id, last_hash = excluded.last_hash",
        (int(last_id), last_hash),
    )


def _broken(n: int, row_id: int, reason: str) -> ChainVerdict:
    return ChainVerdict(ok=False, rows_checked=n, first_broken_id=int(row_id), reason=reason)


def verify_chain(conn: sqlite3.Connection) -> ChainVerdict:
    """Check every audit row, its link to the previous row, the head and the id sequence.

    Returns a :class:`ChainVerdict`: ``ok``, or the id of the first row that was changed,
    removed or moved and why (one line). Reads only; never raises for a broken chain.
    """
    n, expected_id, prev = 0, 1, GENESIS
    for r in conn.execute(_SELECT):
        n += 1
        rid = r[0]
        if rid != expected_id:
            if isinstance(rid, int) and rid > expected_id:
                gap = (f"row {expected_id} is missing" if rid == expected_id + 1
                       else f"rows {expected_id}..{rid - 1} are missing")
                return _broken(n, expected_id, f"{gap} (removed from the log)")
            return _broken(n, expected_id, f"row id {rid!r} is out of sequence")
        if r[8] != prev:
            return _broken(n, rid, f"row {rid} does not follow row {rid - 1} (the link to the "
                                   "previous row does not match: rows were changed, moved or "
                                   "inserted)")
        if r[9] != row_hash(tuple(r)[:9]):
            return _broken(n, rid, f"row {rid} was changed after it was written (its content "
                                   "does not match its hash)")
        prev, expected_id = r[9], expected_id + 1
    last = expected_id - 1
    head = conn.execute("SELECT last_id, last_hash FROM audit_head WHERE id = 1").fetchone()
    if head is None:
        if n:
            return _broken(n, last, "the chain head record (audit_head) is missing")
    elif head[0] > last:
        return _broken(n, last + 1, f"the log ends at row {last} but row {head[0]} was written "
                                    "(rows removed from the end)")
    elif head[0] < last:
        return _broken(n, head[0] + 1, f"rows {head[0] + 1}..{last} were not written by the "
                                       f"store (the chain head is at row {head[0]})")
    elif head[1] != prev:
        return _broken(n, last, f"row {last} is not the row the chain head recorded")
    seq = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'audit_log'").fetchone()
    if seq is not None and int(seq[0]) > last:
        return _broken(n, last + 1, f"the log ends at row {last} but ids up to {seq[0]} were "
                                    "used (rows removed from the end)")
    orphan = unaudited_record(conn)
    if orphan is not None:
        table, rid, case_id, ts = orphan
        return _broken(n, last + 1, f"{table} row {rid} (case {case_id}, {ts}) has no audit row: the log was "
                                    "cut back and its head rewritten, or the row was added outside the store")
    return ChainVerdict(ok=True, rows_checked=n)


#: the tables whose every row the store writes with an audit row (same case, time and actor)
AUDITED_RECORDS = (("dispositions", "('disposition', 'approved')"), ("notes", "('note_added')"),
                   ("narratives", "('narrative_saved')"))


def unaudited_record(conn: sqlite3.Connection) -> tuple[str, int, int, str] | None:
    """The earliest disposition, note or narrative without its audit row, as ``(table, id,
    case_id, ts)``, else None. The store writes each in the same transaction as an audit row
    with the same ``case_id``, ``ts`` and actor, so a log cut back to an earlier row (with
    ``audit_head`` and ``sqlite_sequence`` rewritten to match, which the chain alone cannot see)
    leaves the later records without theirs."""
    have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    parts = [f"SELECT '{t}', r.id, r.case_id, r.ts FROM {t} r WHERE NOT EXISTS (SELECT 1 FROM audit_log a "
             f"WHERE a.case_id = r.case_id AND a.ts = r.ts AND a.actor = r.analyst AND a.action IN {acts})"
             for t, acts in AUDITED_RECORDS if t in have]
    if not parts:
        return None
    row = conn.execute(" UNION ALL ".join(parts) + " ORDER BY 4 LIMIT 1").fetchone()
    return None if row is None else (row[0], int(row[1]), int(row[2]), str(row[3]))
