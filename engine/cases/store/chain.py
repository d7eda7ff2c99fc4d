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
sequence rewritten to match is still seen, and so is any edit of the other tables made outside
the store (:class:`_Recorded`): every disposition, note and narrative must match, in content, the
audit row that wrote it (same case, time and actor), and every such audit row must still have its
record (none removed, none duplicated); every case must have the audit row of its creation
(``case_created``, or ``case_adopted`` from schema migration 5 for a case older than the log's
creation rows) and still exist; its source, entity, model and creation time must be the ones
recorded then; its state, assignee, scores and version the latest audit row's; its priority the
one its score and amount give, and its SLA due time within what its creation time and scores
allow; the ``model_thresholds`` rows must hold what the latest ``thresholds_set`` rows set. Not
covered: ``updated_at`` and ``assigned_at`` (display only). The chain makes tampering
*evident*; it cannot stop someone who can write the file from rewriting every hash after an edit:
keep off-host copies of the head (``audit_head``) for that.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from engine.cases.store.common import READ_ACTIONS, ChainVerdict, lenient_snapshot
from engine.cases.store.priority import priority_score, sla_hours

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
    removed or moved and why (one line; no id when a stored value is of a type the store never
    writes, e.g. a BLOB). Reads only; never raises for a broken chain or an unreadable value
    (text that is not UTF-8 is read with U+FFFD, so its row fails its hash). All reads
    run in one read transaction (one WAL snapshot): a case claimed by another connection between
    reading the log and reading the cases table is not taken for an edit made outside the store.
    """
    # a text value that is not UTF-8 (written outside the store) reads as U+FFFD, so its row no
    # longer matches its hash, instead of raising: a raise silenced the alarm on every page
    with lenient_snapshot(conn):
        try:
            return _verify(conn)
        except (TypeError, ValueError, OverflowError, KeyError, IndexError, AttributeError) as e:
            # a value of a type the store never writes (a BLOB in an audit column, a number where text
            # belongs) in the log or in a table it accounts for: tampering, not a crash
            return ChainVerdict(ok=False, rows_checked=0, first_broken_id=None,
                                reason=f"the audit log or a table it accounts for holds a value the store never "
                                       f"writes ({type(e).__name__}): it was changed outside the store")


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
    drift = recorded.mismatch(conn)
    if drift is not None:  # no audit row to name for a row written outside the store: the next one
        return _broken(n, last + 1 if drift[0] is None else drift[0], drift[1])
    return ChainVerdict(ok=True, rows_checked=n)


#: the ``cases`` columns an audit row's ``after`` snapshot records (each write records some)
CASE_RECORDED = ("state", "assignee", "pending_by", "version", "max_probability", "max_transaction_id",
                 "first_ts", "last_ts", "max_amount", "n_transactions", "n_known_fraud")
#: the ``cases`` columns fixed when a case is created (``case_created`` / ``case_adopted`` record them)
CASE_IDENTITY = ("source_id", "entity_id")
#: the actions that create a case's audit history: ``case_adopted`` is written by schema migration 5
#: for a case made before the log recorded creations (schema < 3)
CREATED_ACTIONS = ("case_created", "case_adopted")
#: per record table: the audit actions that write one row of it (same case, time and actor), and
#: ``(record column, after key)`` pairs the audit row records of it (compared when the key is there)
AUDITED = {
    "dispositions": ({"disposition": "disposition", "approved": "approval"},
                     (("disposition", "disposition"), ("note", "note"), ("state_after", "state"))),
    "notes": ({"note_added": None, "sent_back": None}, (("text", "note"),)),
    "narratives": ({"narrative_saved": None}, (("text", "narrative"),)),
}
#: dispositions columns written only when given; an audit row records them only then (absent = NULL)
DISPOSITION_EXTRAS = ("fraud_type", "loss_amount", "exposure_amount", "currency")


def _same(a: Any, b: Any) -> bool:
    if a == b:
        return True
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(a)), abs(float(b)))
    return a == b


def _naive_utc(text: Any) -> "dt.datetime | None":
    try:
        t = dt.datetime.fromisoformat(str(text))
    except (TypeError, ValueError):
        return None
    return t.astimezone(dt.timezone.utc).replace(tzinfo=None) if t.tzinfo is not None else t


class _Recorded:
    """What the audit log says the ``cases``, record and ``model_thresholds`` rows hold now: per
    case its creation row and, per column, the latest audit row's ``after`` value (and every score
    it was given, for its SLA); per disposition, note and narrative the audit row that wrote it;
    per model the latest ``thresholds_set``. A row edited in place, added or removed outside the
    store no longer matches; the chain alone cannot see that, since no audit row changed."""

    def __init__(self) -> None:
        self.case: dict[int, dict[str, tuple[int, Any]]] = {}
        self.created: dict[int, tuple[int, str, Any, dict]] = {}  # case -> (audit id, ts, model, after)
        self.sla_hours: dict[int, list[float]] = {}  # case -> SLA hours of every score it had
        self.records: dict[tuple, list[tuple[int, dict]]] = {}  # (table, case, ts, actor, kind) -> rows
        self.thresholds: dict[str, tuple[int, dict | None]] = {}

    def add(self, r: Sequence[Any]) -> None:
        rid, ts, actor, action, case_id, model, after_json = r[0], r[1], r[2], r[3], r[4], r[5], r[7]
        try:
            after = json.loads(after_json) if after_json else None
        except (TypeError, ValueError):
            return  # the row's hash check names it
        if action == "thresholds_set" and isinstance(model, str):
            self.thresholds[model] = (int(rid), after if isinstance(after, dict) else None)
        if not isinstance(case_id, int) or not isinstance(after, dict) or action in READ_ACTIONS:
            return  # a read (a report download) states nothing about what the case holds
        if action in CREATED_ACTIONS:  # its creation time: the audit row's (adopted: the one it had)
            self.created.setdefault(case_id, (int(rid), after.get("created_at", ts), model, after))
        for table, (actions, _) in AUDITED.items():
            if action in actions:
                self.records.setdefault((table, case_id, ts, actor, actions[action]), []).append((int(rid), after))
        if "max_probability" in after:
            self.sla_hours.setdefault(case_id, []).append(
                sla_hours(priority_score(after["max_probability"], after.get("max_amount"))))
        cols = self.case.setdefault(case_id, {})
        for k in CASE_RECORDED:
            if k in after:
                cols[k] = (int(rid), after[k])

    def mismatch(self, conn: sqlite3.Connection) -> tuple[int | None, str] | None:
        """``(audit row id or None, reason)`` for the first current row the log does not account
        for (None: a row with no audit row at all), or for the first recorded row that is gone;
        else None."""
        have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for check in (self._records, self._cases, self._thresholds):
            found = check(conn, have)
            if found is not None:
                return found
        return None

    def _cases(self, conn: sqlite3.Connection, have: set) -> tuple[int | None, str] | None:
        if "cases" not in have:
            return None
        present = {r[1] for r in conn.execute("PRAGMA table_info(cases)")}
        cols = [c for c in (*CASE_RECORDED, *CASE_IDENTITY, "model_sha256", "created_at", "priority", "sla_due_at")
                if c in present]
        seen: set[int] = set()
        v4 = None  # cases created since migration 4 have their due time from creation on: exact
        if "schema_version" in have:
            r4 = conn.execute("SELECT applied_at FROM schema_version WHERE version = 4").fetchone()
            v4 = _naive_utc(r4[0]) if r4 else None
            if r4 and v4 is None:  # the store writes an ISO time: an edit would loosen the due-time check
                return None, (f"schema_version 4's time is {r4[0]!r}, not a time the store writes: the "
                              "schema_version table was changed outside the store")
        for row in conn.execute(f"SELECT id, {', '.join(cols)} FROM cases ORDER BY id"):
            cid, got = int(row[0]), dict(zip(cols, row[1:]))
            seen.add(cid)
            made = self.created.get(cid)
            if made is None:
                return None, (f"case {cid} has no audit row of its creation: it was added outside the store "
                              "(the cases table was written directly)")
            found = self._case_row(cid, got, made, v4)
            if found is not None:
                return found
        for cid in sorted(set(self.created) - seen):
            return self.created[cid][0], (f"case {cid} was removed outside the store (audit row {self.created[cid][0]} "
                                          "created it)")
        return None

    def _case_row(self, cid: int, got: dict, made: tuple, v4: "dt.datetime | None") -> tuple[int | None, str] | None:
        rec = self.case.get(cid, {})
        rid, created_at, model, after = made
        fixed = {k: (rid, after[k]) for k in CASE_IDENTITY if k in after}
        fixed.update(model_sha256=(rid, model), created_at=(rid, created_at))
        for k, (arid, want) in {**rec, **fixed}.items():
            if k in got and not _same(got[k], want):
                return arid, (f"case {cid}'s {k} is {got[k]!r} but its audit row ({arid}) recorded {want!r}: the "
                              "cases table was changed outside the store")
        if "priority" in got:
            prio = priority_score(got.get("max_probability"), got.get("max_amount"))
            if not _same(round(float(got["priority"]), 6), prio):
                return None, (f"case {cid}'s priority is {got['priority']!r} but its score and amount give {prio!r}: "
                              "the cases table was changed outside the store")
            created, due = _naive_utc(got.get("created_at")), _naive_utc(got.get("sla_due_at"))
            if created is not None:  # due = creation + the shortest SLA of any score it had (never later)
                hours = None if due is None else (due - created).total_seconds() / 3600.0
                lo = min(self.sla_hours.get(cid, [sla_hours(prio)]), default=sla_hours(prio))
                exact = v4 is not None and created >= v4
                hi = lo if exact else sla_hours(prio)  # before v4: backfilled from the score it had then
                if hours is None or not lo - 1e-6 <= hours <= hi + 1e-6:
                    return None, (f"case {cid}'s SLA due time is {got.get('sla_due_at')!r}, not what its creation "
                                  f"({got.get('created_at')}) and its scores give: the cases table was changed "
                                  "outside the store")
        return None

    def _records(self, conn: sqlite3.Connection, have: set) -> tuple[int | None, str] | None:
        left = {k: list(v) for k, v in self.records.items()}
        order: dict[tuple, list[tuple[int, int]]] = {}  # (table, case) -> (record id, audit id that wrote it)
        for table, (actions, pairs) in AUDITED.items():
            if table not in have:
                continue
            present = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
            kind = "kind" if "kind" in present else "NULL"
            extra = [c for c in DISPOSITION_EXTRAS if c in present] if table == "dispositions" else []
            cols = [c for c, _ in pairs if c in present] + extra
            sql = f"SELECT id, case_id, ts, analyst, {kind}, {', '.join(cols)} FROM {table} ORDER BY ts, id"
            for row in conn.execute(sql):
                rid, case_id, ts, analyst, k = row[:5]
                vals = dict(zip(cols, row[5:]))
                k = k if table == "dispositions" else None
                cands = left.get((table, case_id, ts, analyst, k), [])
                keys = [(c, a) for c, a in pairs if c in vals] + [(c, c) for c in extra]

                def fits(after: dict) -> bool:
                    return all(_same(vals[c], after.get(a)) for c, a in keys
                               if a in after or c in DISPOSITION_EXTRAS)

                hit = next((i for i, (_, after) in enumerate(cands) if fits(after)), None)
                if hit is None:
                    how = ("its audit row records other content: it was changed outside the store" if cands else
                           "it has no audit row: the log was cut back and its head rewritten, or the row was "
                           "added outside the store")
                    return (cands[0][0] if cands else None), f"{table} row {rid} (case {case_id}, {ts}): {how}"
                order.setdefault((table, case_id), []).append((rid, cands.pop(hit)[0]))
        # the store reads a case's records in id order (its pending proposal is its latest
        # disposition): ids renumbered outside the store would change what an approval applies
        for (table, case_id), pairs in order.items():
            pairs.sort()
            for (r1, a1), (r2, a2) in zip(pairs, pairs[1:]):
                if a2 < a1:
                    return a2, (f"{table} rows {r1} and {r2} of case {case_id} are not in the order their audit rows "
                                f"({a1}, {a2}) wrote them: renumbered outside the store")
        gone = sorted((rows[0][0], key) for key, rows in left.items() if rows and key[0] in have)
        if gone:
            aid, (table, case_id, ts, _actor, _kind) = gone[0]
            return aid, f"the {table} row audit row {aid} wrote (case {case_id}, {ts}) was removed outside the store"
        return None

    def _thresholds(self, conn: sqlite3.Connection, have: set) -> tuple[int | None, str] | None:
        if "model_thresholds" not in have:
            return None
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
