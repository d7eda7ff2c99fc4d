"""Case store connection, schema and migrations: ``connect``, ``MIGRATIONS``, ``migrate``."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterable

from engine.cases.store.common import (
    STATES,
    CaseStoreError,
    SchemaError,
    _utcnow,
)

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
    states = ", ".join(f"'{s}'" for s in STATES)
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


#: Ordered migrations; ``MIGRATIONS[i]`` upgrades schema version ``i`` to ``i + 1``.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _migration_1_initial,
    _migration_2_versions_thresholds,
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
