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
audit row (:func:`unaudited_record`); and the ``cases`` and ``model_thresholds`` rows must hold
what their latest audit rows recorded (a state, assignee, score or threshold edited in place
changes no audit row). The chain makes tampering *evident*; it
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
    removed or moved and why (one line). Reads only; never raises for a broken chain. All reads
    run in one read transaction (one WAL snapshot): a case claimed by another connection between
    reading the log and reading the cases table is not taken for an edit made outside the store.
    """
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        return _verify(conn)
    finally:
        if own:
            conn.execute("ROLLBACK")


def _verify(conn: sqlite3.Connection) -> ChainVerdict:
    n, expected_id, prev = 0, 1, GENESIS
    recorded = _Recorded()
    for r in conn.execute(_SELECT):
        n += 1
        rid = r[0]
        recorded.add(r)
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
    drift = recorded.mismatch(conn)
    if drift is not None:  # no audit row to name for a row written outside the store: the next one
        return _broken(n, last + 1 if drift[0] is None else drift[0], drift[1])
    return ChainVerdict(ok=True, rows_checked=n)


#: the ``cases`` columns an audit row's ``after`` snapshot records (each write records some)
CASE_RECORDED = ("state", "assignee", "pending_by", "version", "max_probability", "max_transaction_id",
                 "first_ts", "last_ts", "max_amount", "n_transactions", "n_known_fraud")


def _same(a: Any, b: Any) -> bool:
    if a == b:
        return True
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(a)), abs(float(b)))
    return a == b


class _Recorded:
    """What the audit log says the ``cases`` and ``model_thresholds`` rows hold now: per case and
    column the latest audit row's ``after`` value, per model the latest ``thresholds_set``. A row
    edited in place (``UPDATE cases SET state = 'closed_fraud'``, thresholds rewritten or deleted)
    no longer matches; the chain alone cannot see it, since no audit row changed."""

    def __init__(self) -> None:
        self.case: dict[int, dict[str, tuple[int, Any]]] = {}
        self.thresholds: dict[str, tuple[int, dict | None]] = {}
        self.first_created: int | None = None

    def add(self, r: Sequence[Any]) -> None:
        rid, action, case_id, model, after_json = r[0], r[3], r[4], r[5], r[7]
        try:
            after = json.loads(after_json) if after_json else None
        except (TypeError, ValueError):
            return  # the row's hash check names it
        if action == "thresholds_set" and isinstance(model, str):
            self.thresholds[model] = (int(rid), after if isinstance(after, dict) else None)
        if not isinstance(case_id, int) or not isinstance(after, dict):
            return
        if action == "case_created" and self.first_created is None:
            self.first_created = case_id
        cols = self.case.setdefault(case_id, {})
        for k in CASE_RECORDED:
            if k in after:
                cols[k] = (int(rid), after[k])

    def mismatch(self, conn: sqlite3.Connection) -> tuple[int | None, str] | None:
        """``(audit row id or None, reason)`` for the first current row the log does not account
        for (None: a row with no audit row at all), or None."""
        have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "cases" in have:
            cols = [c for c in CASE_RECORDED if c in {r[1] for r in conn.execute("PRAGMA table_info(cases)")}]
            for row in conn.execute(f"SELECT id, {', '.join(cols)} FROM cases ORDER BY id"):
                cid, got = int(row[0]), dict(zip(cols, row[1:]))
                rec = self.case.get(cid)
                if rec is None:
                    if self.first_created is not None and cid > self.first_created:
                        return None, (f"case {cid} has no audit row: it was added outside the store "
                                   "(the cases table was written directly)")
                    continue  # a case from before the log recorded creations (schema < 3)
                for k in cols:
                    if k in rec and not _same(got[k], rec[k][1]):
                        return rec[k][0], (f"case {cid}'s {k} is {got[k]!r} but its last audit row ({rec[k][0]}) "
                                           f"recorded {rec[k][1]!r}: the cases table was changed outside the store")
        if "model_thresholds" in have:
            now = {r[0]: (r[1], r[2]) for r in conn.execute("SELECT model_sha256, review, decline FROM model_thresholds")}
            for model, (rid, after) in self.thresholds.items():
                want = (after or {}).get("review"), (after or {}).get("decline")
                got = now.pop(model, None)
                if got is None:
                    return rid, (f"the thresholds of model {model[:12]} were removed outside the store (audit row "
                                 f"{rid} set review {want[0]!r}, decline {want[1]!r})")
                if not (_same(got[0], want[0]) and _same(got[1], want[1])):
                    return rid, (f"the thresholds of model {model[:12]} are review {got[0]!r}, decline {got[1]!r} but "
                                 f"audit row {rid} set {want[0]!r}, {want[1]!r}: changed outside the store")
            for model in sorted(now):
                return None, f"the thresholds of model {str(model)[:12]} have no audit row: set outside the store"
        return None


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
