"""Case store connection, schema and migrations: ``connect``, ``MIGRATIONS``, ``migrate``."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterable

from engine.cases.store.common import (
    lenient_text,
    FRAUD_TYPES,
    LEGACY_SOURCE,
    STATES,
    CaseStoreError,
    SchemaError,
    _utcnow,
)

#: the case states of schema versions 1-3 (released migrations keep their own list)
_STATES_V1 = ("open", "assigned", "pending_approval", "confirmed_fraud", "false_positive", "escalated")

# ------------------------------------------------------------------------------------------------
# Schema and migrations


def _exec_all(conn: sqlite3.Connection, statements: Iterable[str]) -> None:
    # One statement per execute(): executescript() would COMMIT the surrounding transaction.
    for stmt in statements:
        conn.execute(stmt)


def _append_only(table: str, *, allow_update: bool = False) -> list[str]:
    stmts = [
        f"""CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table}
            BEGIN SELECT RAISE(ABORT, '{table} is append-only: rows cannot be deleted'); END"""
    ]
    if not allow_update:
        stmts.append(
            f"""CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table}
                BEGIN SELECT RAISE(ABORT, '{table} is append-only: rows cannot be changed'); END"""
        )
    return stmts


def _migration_1_initial(conn: sqlite3.Connection) -> None:
    """v1: cases, disposition history, notes, append-only audit log, schema log."""
    states = ", ".join(f"'{s}'" for s in _STATES_V1)
    _exec_all(
        conn,
        [
            """CREATE TABLE schema_version (
                version INTEGER PRIMARY KEY,
                applied_at TEXT NOT NULL,
                description TEXT NOT NULL)""",
            f"""CREATE TABLE cases (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                model_sha256 TEXT NOT NULL,
                entity_id TEXT NOT NULL,
                max_probability REAL NOT NULL CHECK (max_probability BETWEEN 0 AND 1),
                max_transaction_id TEXT,
                first_ts TEXT,
                last_ts TEXT,
                max_amount REAL,
                n_transactions INTEGER,
                n_known_fraud INTEGER,
                state TEXT NOT NULL DEFAULT 'open' CHECK (state IN ({states})),
                assignee TEXT,
                pending_by TEXT,
                created_at TEXT NOT NULL,
                updated_at TEXT NOT NULL,
                UNIQUE (model_sha256, entity_id),
                CHECK ((state = 'pending_approval') = (pending_by IS NOT NULL)))""",
            """CREATE TABLE dispositions (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                case_id INTEGER NOT NULL REFERENCES cases(id),
                ts TEXT NOT NULL,
                kind TEXT NOT NULL CHECK (kind IN ('disposition', 'approval')),
                disposition TEXT NOT NULL,
                state_after TEXT NOT NULL,
                analyst TEXT NOT NULL,
                note TEXT NOT NULL CHECK (length(trim(note)) > 0))""",
            "CREATE INDEX dispositions_case ON dispositions(case_id, id)",
            """CREATE TABLE notes (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                case_id INTEGER NOT NULL REFERENCES cases(id),
                ts TEXT NOT NULL,
                analyst TEXT NOT NULL,
                text TEXT NOT NULL CHECK (length(trim(text)) > 0))""",
            "CREATE INDEX notes_case ON notes(case_id, id)",
            """CREATE TABLE audit_log (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                ts TEXT NOT NULL,
                actor TEXT NOT NULL,
                action TEXT NOT NULL,
                case_id INTEGER,
                model_sha256 TEXT,
                before_json TEXT,
                after_json TEXT)""",
            "CREATE INDEX audit_case ON audit_log(case_id, id)",
            *_append_only("audit_log"),
            *_append_only("dispositions"),
            *_append_only("notes"),
            *_append_only("cases", allow_update=True),
        ],
    )


def _migration_2_versions_thresholds(conn: sqlite3.Connection) -> None:
    """v2: optimistic ``cases.version``, per-model review/decline thresholds, queue index."""
    _exec_all(
        conn,
        [
            "ALTER TABLE cases ADD COLUMN version INTEGER NOT NULL DEFAULT 0",
            """CREATE TABLE model_thresholds (
                model_sha256 TEXT PRIMARY KEY,
                review REAL NOT NULL,
                decline REAL NOT NULL,
                updated_at TEXT NOT NULL,
                updated_by TEXT NOT NULL,
                CHECK (0 <= review AND review <= decline AND decline <= 1))""",
            "CREATE INDEX cases_queue ON cases(model_sha256, max_probability DESC)",
        ],
    )


def _no_replace(table: str, unique_key: tuple[str, ...] = ()) -> str:
    """A BEFORE INSERT trigger refusing a row whose id (or unique key) exists already.

    ``INSERT OR REPLACE`` / ``REPLACE`` deletes the old row without firing DELETE triggers
    (unless ``PRAGMA recursive_triggers`` is on, which a raw connection will not set); a
    BEFORE INSERT trigger runs before the conflict is resolved, whatever the pragma.
    """
    cond = f"EXISTS (SELECT 1 FROM {table} WHERE id = NEW.id)"
    if unique_key:
        match = " AND ".join(f"{c} = NEW.{c}" for c in unique_key)
        cond += f" OR EXISTS (SELECT 1 FROM {table} WHERE {match})"
    return (f"""CREATE TRIGGER {table}_no_replace BEFORE INSERT ON {table} WHEN {cond}
                BEGIN SELECT RAISE(ABORT, '{table} is append-only: a row with this id or key exists (INSERT OR REPLACE is refused)'); END""")


_CASE_COLUMNS_V2 = ("id", "model_sha256", "entity_id", "max_probability", "max_transaction_id",
                    "first_ts", "last_ts", "max_amount", "n_transactions", "n_known_fraud",
                    "state", "assignee", "pending_by", "created_at", "updated_at", "version")


def _migration_3_sources_audit_chain(conn: sqlite3.Connection) -> None:
    """v3: cases keyed by (model, data source, entity), existing cases -> source 'legacy';
    REPLACE refused on append-only tables; audit log hash chain (prev_hash, row_hash,
    audit_head)."""
    from engine.cases.store.chain import GENESIS, row_hash

    states = ", ".join(f"'{s}'" for s in _STATES_V1)
    cols = ", ".join(_CASE_COLUMNS_V2)
    _exec_all(
        conn,
        [
            # cases: rebuilt, UNIQUE (model_sha256, entity_id) -> (model_sha256, source_id,
            # entity_id) (SQLite cannot alter a constraint; migrate() runs with FKs off)
            f"""CREATE TABLE cases_v3 (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                model_sha256 TEXT NOT NULL,
                source_id TEXT NOT NULL,
                entity_id TEXT NOT NULL,
                max_probability REAL NOT NULL CHECK (max_probability BETWEEN 0 AND 1),
                max_transaction_id TEXT,
                first_ts TEXT,
                last_ts TEXT,
                max_amount REAL,
                n_transactions INTEGER,
                n_known_fraud INTEGER,
                state TEXT NOT NULL DEFAULT 'open' CHECK (state IN ({states})),
                assignee TEXT,
                pending_by TEXT,
                created_at TEXT NOT NULL,
                updated_at TEXT NOT NULL,
                version INTEGER NOT NULL DEFAULT 0,
                UNIQUE (model_sha256, source_id, entity_id),
                CHECK ((state = 'pending_approval') = (pending_by IS NOT NULL)))""",
            f"INSERT INTO cases_v3 ({cols}, source_id) SELECT {cols}, '{LEGACY_SOURCE}' FROM cases",
            "DROP TABLE cases",
            "ALTER TABLE cases_v3 RENAME TO cases",
            "CREATE INDEX cases_queue ON cases(model_sha256, source_id, max_probability DESC)",
            *_append_only("cases", allow_update=True),
            _no_replace("cases", ("model_sha256", "source_id", "entity_id")),
            _no_replace("audit_log"),
            _no_replace("dispositions"),
            _no_replace("notes"),
            # audit hash chain
            "ALTER TABLE audit_log ADD COLUMN prev_hash TEXT",
            "ALTER TABLE audit_log ADD COLUMN row_hash TEXT",
            """CREATE TABLE audit_head (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                last_id INTEGER NOT NULL,
                last_hash TEXT NOT NULL)""",
            """CREATE TRIGGER audit_head_no_delete BEFORE DELETE ON audit_head
                BEGIN SELECT RAISE(ABORT, 'audit_head cannot be deleted'); END""",
            "DROP TRIGGER audit_log_no_update",  # the backfill below writes the new columns once
        ],
    )
    prev, last = GENESIS, None
    rows = conn.execute(
        "SELECT id, ts, actor, action, case_id, model_sha256, before_json, after_json "
        "FROM audit_log ORDER BY id"
    ).fetchall()
    for r in rows:
        h = row_hash((*tuple(r), prev))
        conn.execute("UPDATE audit_log SET prev_hash = ?, row_hash = ? WHERE id = ?",
                     (prev, h, r[0]))
        prev, last = h, r[0]
    if last is not None:
        conn.execute("INSERT INTO audit_head(id, last_id, last_hash) VALUES (1, ?, ?)", (last, prev))
    _exec_all(conn, [s for s in _append_only("audit_log") if "no_update" in s])


_CASE_COLUMNS_V3 = (*_CASE_COLUMNS_V2, "source_id")


def _migration_4_work_queue(conn: sqlite3.Connection) -> None:
    """v4: work queue and disposition details: state 'closed_no_action'; cases.priority,
    sla_due_at, assigned_at (backfilled); dispositions.fraud_type, loss_amount,
    exposure_amount, currency; append-only report narratives."""
    from engine.cases.store.priority import priority_score, sla_due

    states = ", ".join(f"'{s}'" for s in STATES)
    types = ", ".join(f"'{t}'" for t in FRAUD_TYPES)
    cols = ", ".join(_CASE_COLUMNS_V3)
    amount = "CHECK ({c} IS NULL OR ({c} >= 0 AND {c} <= 1e12))"
    _exec_all(
        conn,
        [
            f"""CREATE TABLE cases_v4 (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                model_sha256 TEXT NOT NULL,
                source_id TEXT NOT NULL,
                entity_id TEXT NOT NULL,
                max_probability REAL NOT NULL CHECK (max_probability BETWEEN 0 AND 1),
                max_transaction_id TEXT,
                first_ts TEXT,
                last_ts TEXT,
                max_amount REAL,
                n_transactions INTEGER,
                n_known_fraud INTEGER,
                state TEXT NOT NULL DEFAULT 'open' CHECK (state IN ({states})),
                assignee TEXT,
                pending_by TEXT,
                created_at TEXT NOT NULL,
                updated_at TEXT NOT NULL,
                version INTEGER NOT NULL DEFAULT 0,
                priority REAL NOT NULL DEFAULT 0 CHECK (priority BETWEEN 0 AND 1),
                sla_due_at TEXT,
                assigned_at TEXT,
                UNIQUE (model_sha256, source_id, entity_id),
                CHECK ((state = 'pending_approval') = (pending_by IS NOT NULL)))""",
            f"INSERT INTO cases_v4 ({cols}) SELECT {cols} FROM cases",
            "DROP TABLE cases",
            "ALTER TABLE cases_v4 RENAME TO cases",
            "CREATE INDEX cases_queue ON cases(model_sha256, source_id, max_probability DESC)",
            "CREATE INDEX cases_work ON cases(model_sha256, source_id, state, priority DESC)",
            *_append_only("cases", allow_update=True),
            _no_replace("cases", ("model_sha256", "source_id", "entity_id")),
            f"ALTER TABLE dispositions ADD COLUMN fraud_type TEXT CHECK (fraud_type IS NULL OR "
            f"fraud_type IN ({types}))",
            f"ALTER TABLE dispositions ADD COLUMN loss_amount REAL {amount.format(c='loss_amount')}",
            f"ALTER TABLE dispositions ADD COLUMN exposure_amount REAL "
            f"{amount.format(c='exposure_amount')}",
            "ALTER TABLE dispositions ADD COLUMN currency TEXT",
            """CREATE TABLE narratives (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                case_id INTEGER NOT NULL REFERENCES cases(id),
                ts TEXT NOT NULL,
                analyst TEXT NOT NULL,
                text TEXT NOT NULL CHECK (length(trim(text)) > 0))""",
            "CREATE INDEX narratives_case ON narratives(case_id, id)",
            *_append_only("narratives"),
            _no_replace("narratives"),
        ],
    )
    rows = conn.execute(
        "SELECT id, max_probability, max_amount, created_at, assignee, updated_at FROM cases"
    ).fetchall()
    for r in rows:
        score = priority_score(r[1], r[2])
        try:
            due = sla_due(r[3], score).strftime("%Y-%m-%dT%H:%M:%S.%f")
        except ValueError:  # a created_at that is not a time: no due time
            due = None
        conn.execute("UPDATE cases SET priority = ?, sla_due_at = ?, assigned_at = ? WHERE id = ?",
                     (score, due, r[5] if r[4] is not None else None, r[0]))


#: the actor of the audit rows a migration writes (no person: the store's upgrade itself)
MIGRATION_ACTOR = "fraudlens schema migration"
#: the cases columns a ``case_adopted`` audit row records (its state, identity, scores, creation time)
_ADOPTED = ("state", "assignee", "pending_by", "version", "source_id", "entity_id", "max_probability",
            "max_transaction_id", "first_ts", "last_ts", "max_amount", "n_transactions", "n_known_fraud", "created_at")


def _migration_5_adopt_unlogged_cases(conn: sqlite3.Connection) -> None:
    """v5: every case has an audit row of its creation: a case made before the log recorded
    creations (schema < 3: an id below the first ``case_created`` case) gets one ``case_adopted``
    row with its state, identity, scores and creation time as they are now, so the verifier
    requires one for every case."""
    from engine.cases.store.audit import AuditMixin

    # only the cases made before the first one the log records the creation of (ids from 1 up,
    # below it): a case written into the table later, by anyone but the store, is never adopted,
    # even when the migration is made to run again (user_version rewound)
    first = conn.execute("SELECT min(case_id) FROM audit_log WHERE action = 'case_created'").fetchone()[0]
    rows = conn.execute(
        f"SELECT id, model_sha256, {', '.join(_ADOPTED)} FROM cases c WHERE id >= 1 AND id < ? AND NOT EXISTS "
        "(SELECT 1 FROM audit_log a WHERE a.case_id = c.id AND a.action IN ('case_created', 'case_adopted')) "
        "ORDER BY id", (int(first) if first is not None else 2**62,)).fetchall()
    ts = _utcnow()
    for r in rows:  # one chained row each, written as the store writes every audit row
        AuditMixin._audit(conn, ts, MIGRATION_ACTOR, "case_adopted", case_id=int(r[0]), model_sha256=r[1],
                          after=dict(zip(_ADOPTED, tuple(r)[2:])))


#: Ordered migrations; ``MIGRATIONS[i]`` upgrades schema version ``i`` to ``i + 1``.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _migration_1_initial,
    _migration_2_versions_thresholds,
    _migration_3_sources_audit_chain,
    _migration_4_work_queue,
    _migration_5_adopt_unlogged_cases,
]
LATEST_VERSION = len(MIGRATIONS)


def schema_version(conn: sqlite3.Connection) -> int:
    """The database's schema version (``PRAGMA user_version``; 0 for a new file)."""
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, target: int | None = None) -> int:
    """Bring the database to schema version ``target`` (default: the latest); return it.

    ``conn`` must be in autocommit mode (``isolation_level=None``). Each missing migration runs
    in its own ``BEGIN IMMEDIATE`` transaction with the ``user_version`` bump and a
    ``schema_version`` row, so concurrent openers and crashes are safe. Raises
    :class:`SchemaError` if the database is newer than ``target`` / this code, or if a file with
    user_version 0 already contains tables (it is not a case store).

    Foreign-key enforcement is off while migrating (SQLite's procedure for rebuilding a
    table) and restored afterwards; ``PRAGMA foreign_key_check`` must be clean before each
    migration commits, else it is rolled back and :class:`SchemaError` is raised.
    """
    target = LATEST_VERSION if target is None else target
    if not 0 <= target <= LATEST_VERSION:
        raise ValueError(f"target: expected 0..{LATEST_VERSION}, got {target}")
    current = schema_version(conn)
    if current > LATEST_VERSION:
        raise SchemaError(
            f"case store schema version {current} is newer than this fraudlens "
            f"(knows up to {LATEST_VERSION}); upgrade fraudlens"
        )
    if current > target:
        raise SchemaError(f"cannot downgrade case store schema from {current} to {target}")
    if current == target:
        return current
    fk = int(conn.execute("PRAGMA foreign_keys").fetchone()[0])
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
        return _migrate_steps(conn, current, target)
    finally:
        conn.execute(f"PRAGMA foreign_keys = {fk}")


def _migrate_steps(conn: sqlite3.Connection, current: int, target: int) -> int:
    while current < target:
        conn.execute("BEGIN IMMEDIATE")
        try:
            current = schema_version(conn)  # re-read under the write lock: another opener may
            if current >= target:  # have migrated in the meantime
                conn.execute("ROLLBACK")
                break
            if current == 0:
                n = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
                if n:
                    raise SchemaError("file has tables but no fraudlens schema version")
            step = MIGRATIONS[current]
            step(conn)
            bad = conn.execute("PRAGMA foreign_key_check").fetchall()
            if bad:
                raise SchemaError(f"migration to version {current + 1} broke foreign keys: "
                                  f"{[tuple(b) for b in bad[:3]]}")
            conn.execute(
                "INSERT INTO schema_version(version, applied_at, description) VALUES (?, ?, ?)",
                (current + 1, _utcnow(), (step.__doc__ or step.__name__).strip()),
            )
            conn.execute(f"PRAGMA user_version = {current + 1}")
            conn.execute("COMMIT")
            current += 1
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    return schema_version(conn)


def connect(path: str | os.PathLike[str], *, timeout_s: float = 30.0) -> sqlite3.Connection:
    """Open ``path`` with the store's settings (autocommit, WAL, busy timeout, FULL sync, FKs).

    Does not migrate; :class:`CaseStore` does. ``timeout_s`` is how long a writer waits for
    another writer's lock before ``sqlite3.OperationalError: database is locked``.
    """
    conn = sqlite3.connect(
        str(path), timeout=timeout_s, isolation_level=None, check_same_thread=False
    )
    try:
        conn.row_factory = sqlite3.Row
        # text that is not UTF-8 (only an edit outside the store writes it) reads as U+FFFD rather
        # than raising in every page that lists it; its audit row then fails its hash
        conn.text_factory = lenient_text
        conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise CaseStoreError(f"could not switch {path} to WAL journal mode (got {mode!r})")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
    except BaseException:
        conn.close()
        raise
    return conn
