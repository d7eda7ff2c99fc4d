"""The analyst case store: case queue, assignment, dispositions, four-eyes approval, audit log.

One SQLite file holds every case of every model. A *case* is one (model, entity) pair: the
entity's highest fraud probability under that model and a few facts about its history. Scoring
calls :meth:`CaseStore.upsert_cases`; analysts work the queue (:meth:`CaseStore.queue`), assign
cases, add notes and record dispositions. Every action is written, in the same transaction as
the change it describes, to an append-only audit log.

Where the file lives
    ``CaseStore(path)`` if a path is given, else ``$FRAUDLENS_DATA_DIR/cases.sqlite3``, else
    ``platformdirs.user_data_dir("fraudlens")/cases.sqlite3`` (see :func:`default_db_path`).
    Missing folders are created. The file must be on a local disk (WAL mode needs shared
    memory; network file systems are not supported by SQLite's WAL).

Schema and migrations
    ``PRAGMA user_version`` is the schema version; the ``schema_version`` table logs when each
    version was applied. :data:`MIGRATIONS` is the ordered list of migration functions;
    migration *i* (1-based) moves version *i-1* to *i*. Opening a store applies the missing ones,
    each in its own ``BEGIN IMMEDIATE`` transaction together with the version bump, so a crash
    mid-migration leaves the previous version intact. A database newer than this code raises
    :class:`SchemaError`. To change the schema, append a function to :data:`MIGRATIONS`; never
    edit a released one.

Case states
    ``open`` (new) -> ``assigned`` (someone owns it) -> a disposition:

    ===================  ===========================================================
    disposition          resulting state
    ===================  ===========================================================
    ``confirmed_fraud``  ``confirmed_fraud``; with four-eyes on: ``pending_approval``
                         until a *different* analyst calls :meth:`CaseStore.approve`
    ``false_positive``   ``false_positive``
    ``escalate``         ``escalated``
    ===================  ===========================================================

    A disposition can be recorded in any state (a later disposition revises an earlier one;
    both stay in :meth:`CaseStore.history`). A new disposition on a ``pending_approval`` case
    replaces the pending proposal. Every disposition and approval requires a non-empty note.
    A pending case always needs a different analyst to approve it, even if four-eyes has since
    been switched off, because it was proposed under the rule.

Analyst identity
    There is no login. Every action takes the acting analyst's name (``analyst=`` / ``actor=``);
    when omitted, ``$FRAUDLENS_ANALYST`` is used (:func:`resolve_analyst`), else
    :class:`MissingAnalystError`. Names are compared case-insensitively for the four-eyes rule.
    System actions (scoring) use ``actor="system"``.

Audit log (append-only, enforced in the database)
    Columns: ``id``, ``ts`` (UTC, ISO 8601 with ``+00:00``), ``actor``, ``action``,
    ``case_id``, ``model_sha256``, ``before_json``, ``after_json``. Triggers ``RAISE(ABORT)``
    on any ``UPDATE`` or ``DELETE`` of ``audit_log``, ``dispositions`` and ``notes`` rows and on
    ``DELETE`` of cases; there is no API to edit or delete them. For every case-level row,
    ``after_json`` holds the case's ``state``, ``assignee``, ``pending_by`` and ``version``
    after the action, so the case row always equals its last audit row (checked by tests,
    including after killing a writer mid-transaction). Refused self-approvals are logged too
    (action ``approval_refused``, state unchanged).

    The triggers stop accidental or application-level edits; anyone who can write the file can
    still drop them. Tamper evidence against a hostile file owner (hash chaining, off-host
    copies) is out of scope here.

Concurrency
    WAL journal, ``busy_timeout`` (``timeout_s``), ``synchronous=FULL`` and every write in a
    ``BEGIN IMMEDIATE`` transaction: concurrent writers (threads with their own store, or
    processes) queue up instead of failing, and none loses an update. ``cases.version`` is
    incremented by every state change (assign, disposition, approval); pass the version you
    displayed as ``expected_version=`` and a stale write raises :class:`ConflictError` instead
    of overwriting someone else's decision. One :class:`CaseStore` may be shared by threads
    (calls are serialised by a lock); separate processes each open their own.

Example::

    store = CaseStore()                                  # user data dir, env settings
    store.set_thresholds(sha, review=0.5, decline=0.9, actor="alice")
    store.upsert_cases(sha, entity_summary)              # after scoring
    q = store.queue(sha, state="open")                   # ranked, highest score first
    case = store.get_case(int(q.case_id.iloc[0]))
    store.assign(case["id"], "alice", actor="alice")
    store.record_disposition(case["id"], "confirmed_fraud", "3 cards, same merchant",
                             analyst="alice")            # -> "pending_approval" (four-eyes)
    store.approve(case["id"], "Agreed, chargebacks filed", analyst="bob")  # -> "confirmed_fraud"
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import platformdirs

# ------------------------------------------------------------------------------------------------
# Constants

DB_FILENAME = "cases.sqlite3"
ENV_DATA_DIR = "FRAUDLENS_DATA_DIR"
ENV_ANALYST = "FRAUDLENS_ANALYST"
ENV_FOUR_EYES = "FRAUDLENS_FOUR_EYES"
SYSTEM_ACTOR = "system"

STATES = ("open", "assigned", "pending_approval", "confirmed_fraud", "false_positive", "escalated")
#: disposition -> resulting state (four-eyes turns ``confirmed_fraud`` into ``pending_approval``)
DISPOSITIONS = {
    "confirmed_fraud": "confirmed_fraud",
    "false_positive": "false_positive",
    "escalate": "escalated",
}

#: Columns :meth:`CaseStore.upsert_cases` needs, one row per entity.
CASE_INPUT_COLUMNS = (
    "entity_id",
    "max_probability",
    "max_transaction_id",
    "first_ts",
    "last_ts",
    "max_amount",
    "n_transactions",
    "n_known_fraud",
)
_SCORE_COLUMNS = CASE_INPUT_COLUMNS[1:]

QUEUE_COLUMNS = [
    "case_id",
    "model_sha256",
    "entity_id",
    "max_probability",
    "recommendation",
    "max_transaction_id",
    "first_ts",
    "last_ts",
    "max_amount",
    "n_transactions",
    "n_known_fraud",
    "state",
    "assignee",
    "pending_by",
    "version",
    "created_at",
    "updated_at",
]
_QUEUE_DTYPES = {
    "case_id": "int64",
    "max_probability": "float64",
    "max_amount": "float64",
    "n_transactions": "Int64",
    "n_known_fraud": "Int64",
    "version": "int64",
}
HISTORY_COLUMNS = ["id", "case_id", "ts", "kind", "disposition", "state_after", "analyst", "note"]
NOTE_COLUMNS = ["id", "case_id", "ts", "analyst", "text"]
AUDIT_COLUMNS = ["id", "ts", "actor", "action", "case_id", "model_sha256", "before", "after"]

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_TS_FORMAT = "%Y-%m-%dT%H:%M:%S.%f"  # naive UTC, fixed width so text order == time order
_MAX_NAME_LEN = 128


# ------------------------------------------------------------------------------------------------
# Errors


class CaseStoreError(Exception):
    """Base class of the case store's own errors."""


class SchemaError(CaseStoreError):
    """The database's schema version is newer than this code (or the file is not a case store)."""


class CaseNotFoundError(CaseStoreError, LookupError):
    """No case with that id."""


class MissingAnalystError(CaseStoreError, ValueError):
    """No analyst name given and ``$FRAUDLENS_ANALYST`` unset, or the name is invalid."""


class NoteRequiredError(CaseStoreError, ValueError):
    """A disposition or approval was attempted without a non-empty note."""


class InvalidTransitionError(CaseStoreError, ValueError):
    """The action is not allowed in the case's current state (e.g. approving an open case)."""


class FourEyesError(CaseStoreError, PermissionError):
    """The analyst who proposed a confirmed-fraud disposition tried to approve it."""


class ConflictError(CaseStoreError):
    """The case changed since the caller read it (``expected_version`` is stale).

    Attributes:
        case_id: the case.
        expected_version: the version the caller based its change on.
        actual_version: the version in the database now.
    """

    def __init__(self, case_id: int, expected_version: int, actual_version: int, detail: str = ""):
        self.case_id = case_id
        self.expected_version = expected_version
        self.actual_version = actual_version
        msg = (
            f"case {case_id} was changed by someone else since you loaded it "
            f"(you had version {expected_version}, it is now version {actual_version}"
            f"{'; last change: ' + detail if detail else ''}). Reload the case and retry."
        )
        super().__init__(msg)


# ------------------------------------------------------------------------------------------------
# Settings helpers


def default_db_path() -> Path:
    """Where the case store lives when no path is given.

    Returns ``$FRAUDLENS_DATA_DIR/cases.sqlite3`` if that variable is set and non-empty, else
    ``platformdirs.user_data_dir("fraudlens")/cases.sqlite3`` (Linux: ``~/.local/share/
    fraudlens`` or ``$XDG_DATA_HOME/fraudlens``). Nothing is created.
    """
    env = os.environ.get(ENV_DATA_DIR, "").strip()
    base = Path(env).expanduser() if env else Path(platformdirs.user_data_dir("fraudlens"))
    return base / DB_FILENAME


def four_eyes_from_env() -> bool:
    """True if ``$FRAUDLENS_FOUR_EYES`` is ``1``, ``true``, ``yes`` or ``on`` (any case)."""
    return os.environ.get(ENV_FOUR_EYES, "").strip().lower() in {"1", "true", "yes", "on"}


def resolve_analyst(name: str | None = None) -> str:
    """The acting analyst's name: ``name`` if given, else ``$FRAUDLENS_ANALYST``.

    Leading/trailing whitespace is removed. Raises :class:`MissingAnalystError` if both are
    empty, the name is longer than 128 characters, or it contains control characters.
    """
    raw = name if name is not None else os.environ.get(ENV_ANALYST, "")
    if not isinstance(raw, str):
        raise MissingAnalystError(f"analyst name must be text, got {type(raw).__name__}")
    value = raw.strip()
    if not value:
        raise MissingAnalystError(
            f"no analyst name: enter your name or set the {ENV_ANALYST} environment variable"
        )
    if len(value) > _MAX_NAME_LEN or _CONTROL_RE.search(value):
        raise MissingAnalystError(
            f"invalid analyst name {value[:40]!r}: at most {_MAX_NAME_LEN} printable characters"
        )
    return value


def _same_person(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and a.strip().casefold() == b.strip().casefold()


def _utcnow() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")


def _check_sha(model_sha256: str) -> str:
    if not isinstance(model_sha256, str) or not _SHA256_RE.match(model_sha256):
        raise ValueError(f"model_sha256: expected 64 lowercase hex digits, got {model_sha256!r}")
    return model_sha256


def _require_text(text: Any, what: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise NoteRequiredError(f"{what} is required and must not be empty")
    return text.strip()


def _ts_text(value: Any) -> str | None:
    """Timestamp -> fixed-width naive-UTC text (None for missing). Aware values are converted."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    ts = pd.Timestamp(value)
    if ts.tzinfo is not None:
        ts = ts.tz_convert("UTC").tz_localize(None)
    return ts.strftime(_TS_FORMAT)


def _is_date_only(value: Any) -> bool:
    if isinstance(value, dt.datetime | pd.Timestamp):
        return False
    if isinstance(value, dt.date):
        return True
    return isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value.strip()) is not None


def _json(obj: Any) -> str | None:
    return None if obj is None else json.dumps(obj, sort_keys=True, separators=(",", ":"))


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


# ------------------------------------------------------------------------------------------------
# The store


@dataclass(frozen=True)
class Thresholds:
    """Per-model score thresholds (probabilities in [0, 1], ``review <= decline``).

    Cases with ``max_probability >= review`` enter the queue; ``>= decline`` are recommended for
    decline.
    """

    model_sha256: str
    review: float
    decline: float
    updated_at: str
    updated_by: str


@dataclass(frozen=True)
class UpsertResult:
    """Counts from :meth:`CaseStore.upsert_cases`."""

    created: int
    updated: int
    unchanged: int


class CaseStore:
    """The analyst case store in one SQLite file (see the module docstring for the rules).

    Args:
        path: database file; ``None`` -> :func:`default_db_path`. Parent folders are created.
        four_eyes: require a second analyst to approve confirmed fraud; ``None`` ->
            ``$FRAUDLENS_FOUR_EYES`` (:func:`four_eyes_from_env`).
        timeout_s: seconds a write waits for another writer before
            ``sqlite3.OperationalError`` ("database is locked").

    Raises:
        SchemaError: the file's schema is newer than this code, or it is not a case store.
        sqlite3.DatabaseError: the file is not a SQLite database.

    Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        four_eyes: bool | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.four_eyes = four_eyes_from_env() if four_eyes is None else bool(four_eyes)
        self._lock = threading.RLock()
        self._conn = connect(self.path, timeout_s=timeout_s)
        try:
            migrate(self._conn)
        except BaseException:
            self._conn.close()
            raise

    # -- plumbing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> CaseStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        """The open database's schema version."""
        with self._lock:
            return schema_version(self._conn)

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction; rolled back on any exception."""
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            else:
                conn.execute("COMMIT")

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, tuple(params)).fetchall()

    @staticmethod
    def _case_row(conn: sqlite3.Connection, case_id: int) -> sqlite3.Row:
        row = conn.execute("SELECT * FROM cases WHERE id = ?", (int(case_id),)).fetchone()
        if row is None:
            raise CaseNotFoundError(f"no case with id {case_id}")
        return row

    @staticmethod
    def _snapshot(row: sqlite3.Row | dict[str, Any]) -> dict[str, Any]:
        return {
            "state": row["state"],
            "assignee": row["assignee"],
            "pending_by": row["pending_by"],
            "version": row["version"],
        }

    @staticmethod
    def _audit(
        conn: sqlite3.Connection,
        ts: str,
        actor: str,
        action: str,
        *,
        case_id: int | None = None,
        model_sha256: str | None = None,
        before: dict[str, Any] | None = None,
        after: dict[str, Any] | None = None,
    ) -> None:
        conn.execute(
            "INSERT INTO audit_log(ts, actor, action, case_id, model_sha256, before_json, "
            "after_json) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (ts, actor, action, case_id, model_sha256, _json(before), _json(after)),
        )

    @staticmethod
    def _check_version(
        conn: sqlite3.Connection, row: sqlite3.Row, expected_version: int | None
    ) -> None:
        if expected_version is None or int(expected_version) == row["version"]:
            return
        last = conn.execute(
            "SELECT action, actor, ts FROM audit_log WHERE case_id = ? ORDER BY id DESC LIMIT 1",
            (row["id"],),
        ).fetchone()
        detail = f"{last['action']} by {last['actor']} at {last['ts']}" if last else ""
        raise ConflictError(row["id"], int(expected_version), row["version"], detail)

    def _set_state(
        self,
        conn: sqlite3.Connection,
        row: sqlite3.Row,
        ts: str,
        *,
        state: str,
        assignee: str | None,
        pending_by: str | None,
    ) -> dict[str, Any]:
        """Apply a state change guarded by the row's version; return the new snapshot."""
        cur = conn.execute(
            "UPDATE cases SET state = ?, assignee = ?, pending_by = ?, version = version + 1, "
            "updated_at = ? WHERE id = ? AND version = ?",
            (state, assignee, pending_by, ts, row["id"], row["version"]),
        )
        if cur.rowcount != 1:  # cannot happen under BEGIN IMMEDIATE; belt and braces
            now = self._case_row(conn, row["id"])["version"]
            raise ConflictError(row["id"], row["version"], now)
        return {"state": state, "assignee": assignee, "pending_by": pending_by,
                "version": row["version"] + 1}

    # -- thresholds -----------------------------------------------------------------------------

    def set_thresholds(
        self, model_sha256: str, review: float, decline: float, *, actor: str | None = None
    ) -> Thresholds:
        """Set a model's review and decline thresholds (probabilities, ``0<=review<=decline<=1``).

        Audited as ``thresholds_set`` with the previous values. Raises ``ValueError`` for bad
        values, :class:`MissingAnalystError` without an actor.
        """
        _check_sha(model_sha256)
        actor = resolve_analyst(actor)
        review, decline = float(review), float(decline)
        if not (math.isfinite(review) and math.isfinite(decline) and 0 <= review <= decline <= 1):
            raise ValueError(
                f"thresholds: need 0 <= review <= decline <= 1, got review={review}, "
                f"decline={decline}"
            )
        with self._write() as conn:
            ts = _utcnow()
            old = conn.execute(
                "SELECT review, decline FROM model_thresholds WHERE model_sha256 = ?",
                (model_sha256,),
            ).fetchone()
            conn.execute(
                "INSERT INTO model_thresholds(model_sha256, review, decline, updated_at, "
                "updated_by) VALUES (?, ?, ?, ?, ?) ON CONFLICT(model_sha256) DO UPDATE SET "
                "review = excluded.review, decline = excluded.decline, "
                "updated_at = excluded.updated_at, updated_by = excluded.updated_by",
                (model_sha256, review, decline, ts, actor),
            )
            self._audit(
                conn, ts, actor, "thresholds_set", model_sha256=model_sha256,
                before=dict(old) if old else None, after={"review": review, "decline": decline},
            )
        return Thresholds(model_sha256, review, decline, ts, actor)

    def get_thresholds(self, model_sha256: str) -> Thresholds | None:
        """The model's thresholds, or ``None`` if never set."""
        rows = self._read(
            "SELECT * FROM model_thresholds WHERE model_sha256 = ?", (_check_sha(model_sha256),)
        )
        if not rows:
            return None
        r = rows[0]
        return Thresholds(r["model_sha256"], r["review"], r["decline"], r["updated_at"],
                          r["updated_by"])

    # -- cases from scoring ---------------------------------------------------------------------

    def upsert_cases(
        self, model_sha256: str, rows: pd.DataFrame, *, actor: str = SYSTEM_ACTOR
    ) -> UpsertResult:
        """Create or refresh one case per (model, entity) from a per-entity score summary.

        ``rows`` has one row per entity with :data:`CASE_INPUT_COLUMNS`: ``entity_id`` (text),
        ``max_probability`` (highest fraud probability of the entity, in [0, 1]),
        ``max_transaction_id`` (the transaction that scored it), ``first_ts`` / ``last_ts``
        (the entity's first/last transaction, naive UTC or tz-aware), ``max_amount`` (largest
        amount, file currency), ``n_transactions``, ``n_known_fraud`` (transactions with a known
        fraud label). Extra columns are ignored. New entities become ``open`` cases
        (audited ``case_created``); existing cases get their score fields refreshed (audited
        ``score_updated`` when something changed). State, assignee, version, dispositions and
        notes are never touched. All rows go in one transaction.

        Pass every entity you want reviewable; the queue applies the review threshold.

        Raises ``ValueError`` for missing columns, duplicate entity ids, or probabilities that
        are missing or outside [0, 1].
        """
        _check_sha(model_sha256)
        missing = [c for c in CASE_INPUT_COLUMNS if c not in rows.columns]
        if missing:
            raise ValueError(f"upsert_cases: missing columns {missing}")
        dup = rows["entity_id"].astype(str)
        if dup.duplicated().any():
            raise ValueError(
                f"upsert_cases: duplicate entity_id {dup[dup.duplicated()].iloc[0]!r}"
            )
        prob = pd.to_numeric(rows["max_probability"], errors="coerce")
        if prob.isna().any() or ((prob < 0) | (prob > 1)).any():
            raise ValueError("upsert_cases: max_probability must be numbers in [0, 1]")

        def _opt(v: Any, kind: type) -> Any:
            if v is None or (not isinstance(v, str) and pd.isna(v)):
                return None
            return kind(v)

        records = []
        for rec in rows[list(CASE_INPUT_COLUMNS)].itertuples(index=False):
            records.append(
                {
                    "entity_id": str(rec.entity_id),
                    "max_probability": float(rec.max_probability),
                    "max_transaction_id": _opt(rec.max_transaction_id, str),
                    "first_ts": _ts_text(rec.first_ts),
                    "last_ts": _ts_text(rec.last_ts),
                    "max_amount": _opt(rec.max_amount, float),
                    "n_transactions": _opt(rec.n_transactions, int),
                    "n_known_fraud": _opt(rec.n_known_fraud, int),
                }
            )
        created = updated = unchanged = 0
        cols = ", ".join(_SCORE_COLUMNS)
        with self._write() as conn:
            ts = _utcnow()
            existing = {
                r["entity_id"]: r
                for r in conn.execute(
                    f"SELECT id, entity_id, state, assignee, pending_by, version, {cols} "
                    "FROM cases WHERE model_sha256 = ?",
                    (model_sha256,),
                )
            }
            for rec in records:
                old = existing.get(rec["entity_id"])
                scores = {c: rec[c] for c in _SCORE_COLUMNS}
                if old is None:
                    cur = conn.execute(
                        f"INSERT INTO cases(model_sha256, entity_id, {cols}, state, created_at, "
                        f"updated_at) VALUES (?, ?, {', '.join('?' * len(_SCORE_COLUMNS))}, "
                        "'open', ?, ?)",
                        (model_sha256, rec["entity_id"], *scores.values(), ts, ts),
                    )
                    after = {"state": "open", "assignee": None, "pending_by": None, "version": 0}
                    self._audit(
                        conn, ts, actor, "case_created", case_id=cur.lastrowid,
                        model_sha256=model_sha256,
                        after={**after, "entity_id": rec["entity_id"], **scores},
                    )
                    created += 1
                    continue
                old_scores = {c: old[c] for c in _SCORE_COLUMNS}
                if old_scores == scores:
                    unchanged += 1
                    continue
                conn.execute(
                    f"UPDATE cases SET {', '.join(c + ' = ?' for c in _SCORE_COLUMNS)}, "
                    "updated_at = ? WHERE id = ?",
                    (*scores.values(), ts, old["id"]),
                )
                snap = self._snapshot(old)
                self._audit(
                    conn, ts, actor, "score_updated", case_id=old["id"],
                    model_sha256=model_sha256,
                    before={**snap, **old_scores}, after={**snap, **scores},
                )
                updated += 1
        return UpsertResult(created, updated, unchanged)

    # -- reading --------------------------------------------------------------------------------

    def get_case(self, case_id: int) -> dict[str, Any]:
        """One case as a dict (all ``cases`` columns, ``id`` is the case id).

        Raises :class:`CaseNotFoundError`.
        """
        with self._lock:
            return dict(self._case_row(self._conn, case_id))

    def queue(
        self,
        model_sha256: str,
        review_threshold: float | None = None,
        *,
        date_from: Any = None,
        date_to: Any = None,
        min_amount: float | None = None,
        max_amount: float | None = None,
        label: str | None = None,
        state: str | Iterable[str] | None = None,
        assignee: str | None = None,
        limit: int | None = None,
    ) -> pd.DataFrame:
        """The review queue of one model: cases with ``max_probability >= review_threshold``.

        Ranked by ``max_probability`` descending (ties: latest ``last_ts`` first, then case id).

        Args:
            model_sha256: the model's sha256.
            review_threshold: probability; ``None`` -> the model's stored review threshold
                (``ValueError`` if none is stored).
            date_from, date_to: keep cases whose activity ``[first_ts, last_ts]`` overlaps this
                range (naive UTC or tz-aware; both ends inclusive; a date without time for
                ``date_to`` includes that whole day).
            min_amount, max_amount: bounds on the case's largest transaction amount.
            label: ``"fraud"`` = the entity has at least one known-fraud-labelled transaction,
                ``"not_fraud"`` = it has none.
            state: one state or several (:data:`STATES`).
            assignee: analyst name (case-insensitive); ``""`` = unassigned cases only.
            limit: at most this many rows.

        Returns:
            DataFrame with :data:`QUEUE_COLUMNS`; ``recommendation`` is ``"decline"`` when the
            model has a stored decline threshold and the score reaches it, else ``"review"``.
            ``first_ts`` / ``last_ts`` are naive-UTC ``datetime64``.
        """
        _check_sha(model_sha256)
        thr = self.get_thresholds(model_sha256)
        if review_threshold is None:
            if thr is None:
                raise ValueError(
                    f"no review threshold given and none stored for model {model_sha256[:12]}"
                )
            review_threshold = thr.review
        where = ["model_sha256 = ?", "max_probability >= ?"]
        params: list[Any] = [model_sha256, float(review_threshold)]
        if date_from is not None:
            where.append("last_ts >= ?")
            params.append(_ts_text(date_from))
        if date_to is not None:
            if _is_date_only(date_to):
                end = pd.Timestamp(date_to) + pd.Timedelta(days=1)
                where.append("first_ts < ?")
                params.append(_ts_text(end))
            else:
                where.append("first_ts <= ?")
                params.append(_ts_text(date_to))
        if min_amount is not None:
            where.append("max_amount >= ?")
            params.append(float(min_amount))
        if max_amount is not None:
            where.append("max_amount <= ?")
            params.append(float(max_amount))
        if label is not None:
            if label == "fraud":
                where.append("n_known_fraud > 0")
            elif label == "not_fraud":
                where.append("coalesce(n_known_fraud, 0) = 0")
            else:
                raise ValueError(f"label: expected 'fraud', 'not_fraud' or None, got {label!r}")
        if state is not None:
            states = [state] if isinstance(state, str) else list(state)
            bad = [s for s in states if s not in STATES]
            if bad or not states:
                raise ValueError(f"state: expected some of {STATES}, got {states}")
            where.append(f"state IN ({', '.join('?' * len(states))})")
            params.extend(states)
        if assignee is not None:
            if assignee.strip() == "":
                where.append("assignee IS NULL")
            else:
                where.append("assignee = ? COLLATE NOCASE")
                params.append(assignee.strip())
        decline = thr.decline if thr is not None else None
        sql = (
            "SELECT id AS case_id, model_sha256, entity_id, max_probability, "
            "CASE WHEN ? IS NOT NULL AND max_probability >= ? THEN 'decline' ELSE 'review' END "
            "AS recommendation, max_transaction_id, first_ts, last_ts, max_amount, "
            "n_transactions, n_known_fraud, state, assignee, pending_by, version, created_at, "
            f"updated_at FROM cases WHERE {' AND '.join(where)} "
            "ORDER BY max_probability DESC, last_ts DESC, id ASC"
        )
        params = [decline, decline, *params]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        rows = self._read(sql, params)
        df = pd.DataFrame([tuple(r) for r in rows], columns=QUEUE_COLUMNS)
        for c in ("first_ts", "last_ts"):
            df[c] = pd.to_datetime(df[c], format=_TS_FORMAT)
        return df.astype(_QUEUE_DTYPES)

    def history(self, case_id: int) -> pd.DataFrame:
        """The case's dispositions and approvals, oldest first (:data:`HISTORY_COLUMNS`).

        ``kind`` is ``"disposition"`` or ``"approval"``; ``state_after`` the state it produced.
        Raises :class:`CaseNotFoundError`.
        """
        self.get_case(case_id)
        rows = self._read(
            f"SELECT {', '.join(HISTORY_COLUMNS)} FROM dispositions WHERE case_id = ? ORDER BY id",
            (int(case_id),),
        )
        return pd.DataFrame([tuple(r) for r in rows], columns=HISTORY_COLUMNS)

    def notes(self, case_id: int) -> pd.DataFrame:
        """The case's notes, oldest first (:data:`NOTE_COLUMNS`). Raises CaseNotFoundError."""
        self.get_case(case_id)
        rows = self._read(
            f"SELECT {', '.join(NOTE_COLUMNS)} FROM notes WHERE case_id = ? ORDER BY id",
            (int(case_id),),
        )
        return pd.DataFrame([tuple(r) for r in rows], columns=NOTE_COLUMNS)

    def audit_log(
        self, case_id: int | None = None, *, model_sha256: str | None = None
    ) -> pd.DataFrame:
        """Audit rows, oldest first (:data:`AUDIT_COLUMNS`), optionally for one case / model.

        ``before`` / ``after`` are the decoded JSON (dicts, or ``None``); ``ts`` is UTC ISO 8601
        text.
        """
        where, params = [], []
        if case_id is not None:
            where.append("case_id = ?")
            params.append(int(case_id))
        if model_sha256 is not None:
            where.append("model_sha256 = ?")
            params.append(_check_sha(model_sha256))
        sql = (
            "SELECT id, ts, actor, action, case_id, model_sha256, before_json, after_json "
            f"FROM audit_log {'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY id"
        )
        rows = self._read(sql, params)
        data = [
            (*tuple(r)[:6], json.loads(r[6]) if r[6] else None, json.loads(r[7]) if r[7] else None)
            for r in rows
        ]
        return pd.DataFrame(data, columns=AUDIT_COLUMNS)

    # -- analyst actions ------------------------------------------------------------------------

    def assign(
        self,
        case_id: int,
        assignee: str | None,
        *,
        actor: str | None = None,
        expected_version: int | None = None,
    ) -> int:
        """Assign the case to ``assignee`` (``None`` = unassign); return the new version.

        An ``open`` case becomes ``assigned`` (and back to ``open`` when unassigned); other
        states keep their state. ``actor`` is who does it (default ``$FRAUDLENS_ANALYST``).
        Raises :class:`CaseNotFoundError`, :class:`ConflictError` (stale ``expected_version``),
        :class:`MissingAnalystError`.
        """
        actor = resolve_analyst(actor)
        new_assignee = resolve_analyst(assignee) if assignee is not None else None
        with self._write() as conn:
            ts = _utcnow()
            row = self._case_row(conn, case_id)
            self._check_version(conn, row, expected_version)
            state = row["state"]
            if state == "open" and new_assignee is not None:
                state = "assigned"
            elif state == "assigned" and new_assignee is None:
                state = "open"
            after = self._set_state(
                conn, row, ts, state=state, assignee=new_assignee, pending_by=row["pending_by"]
            )
            self._audit(
                conn, ts, actor, "assigned", case_id=row["id"], model_sha256=row["model_sha256"],
                before=self._snapshot(row), after=after,
            )
        return after["version"]

    def record_disposition(
        self,
        case_id: int,
        disposition: str,
        note: str,
        *,
        analyst: str | None = None,
        expected_version: int | None = None,
    ) -> str:
        """Record a disposition with its (required) note; return the case's new state.

        ``disposition`` is one of :data:`DISPOSITIONS`. With four-eyes on, ``confirmed_fraud``
        leaves the case ``pending_approval`` until another analyst calls :meth:`approve`.

        Raises :class:`NoteRequiredError` (empty note), ``ValueError`` (unknown disposition),
        :class:`CaseNotFoundError`, :class:`ConflictError` (stale ``expected_version``),
        :class:`MissingAnalystError`. Nothing is written when it raises.
        """
        if disposition not in DISPOSITIONS:
            raise ValueError(
                f"disposition: expected one of {list(DISPOSITIONS)}, got {disposition!r}"
            )
        note = _require_text(note, "a note explaining the disposition")
        analyst = resolve_analyst(analyst)
        state = DISPOSITIONS[disposition]
        pending_by = None
        if state == "confirmed_fraud" and self.four_eyes:
            state, pending_by = "pending_approval", analyst
        with self._write() as conn:
            ts = _utcnow()
            row = self._case_row(conn, case_id)
            self._check_version(conn, row, expected_version)
            after = self._set_state(
                conn, row, ts, state=state, assignee=row["assignee"], pending_by=pending_by
            )
            conn.execute(
                "INSERT INTO dispositions(case_id, ts, kind, disposition, state_after, analyst, "
                "note) VALUES (?, ?, 'disposition', ?, ?, ?, ?)",
                (row["id"], ts, disposition, state, analyst, note),
            )
            self._audit(
                conn, ts, analyst, "disposition", case_id=row["id"],
                model_sha256=row["model_sha256"], before=self._snapshot(row),
                after={**after, "disposition": disposition, "note": note},
            )
        return state

    def approve(
        self,
        case_id: int,
        note: str,
        *,
        analyst: str | None = None,
        expected_version: int | None = None,
    ) -> str:
        """Approve a pending confirmed-fraud disposition (four-eyes); return ``"confirmed_fraud"``.

        The approver must differ (case-insensitively) from the analyst who proposed it; a
        self-approval raises :class:`FourEyesError` and is logged as ``approval_refused``
        without changing the case. Raises :class:`NoteRequiredError` (empty note),
        :class:`InvalidTransitionError` (case not ``pending_approval``),
        :class:`CaseNotFoundError`, :class:`ConflictError`, :class:`MissingAnalystError`.
        """
        note = _require_text(note, "a note explaining the approval")
        analyst = resolve_analyst(analyst)
        refused: FourEyesError | None = None
        with self._write() as conn:
            ts = _utcnow()
            row = self._case_row(conn, case_id)
            self._check_version(conn, row, expected_version)
            if row["state"] != "pending_approval":
                raise InvalidTransitionError(
                    f"case {row['id']} is {row['state']!r}; only 'pending_approval' cases can be "
                    "approved"
                )
            snap = self._snapshot(row)
            if _same_person(analyst, row["pending_by"]):
                refused = FourEyesError(
                    f"four-eyes rule: {analyst!r} proposed confirmed fraud on case {row['id']} "
                    "and cannot approve it; another analyst must approve"
                )
                self._audit(
                    conn, ts, analyst, "approval_refused", case_id=row["id"],
                    model_sha256=row["model_sha256"], before=snap,
                    after={**snap, "reason": "same analyst as proposer", "note": note},
                )
            else:
                after = self._set_state(
                    conn, row, ts, state="confirmed_fraud", assignee=row["assignee"],
                    pending_by=None,
                )
                conn.execute(
                    "INSERT INTO dispositions(case_id, ts, kind, disposition, state_after, "
                    "analyst, note) VALUES (?, ?, 'approval', 'confirmed_fraud', "
                    "'confirmed_fraud', ?, ?)",
                    (row["id"], ts, analyst, note),
                )
                self._audit(
                    conn, ts, analyst, "approved", case_id=row["id"],
                    model_sha256=row["model_sha256"], before=snap,
                    after={**after, "proposed_by": row["pending_by"], "note": note},
                )
        if refused is not None:
            raise refused
        return "confirmed_fraud"

    def add_note(self, case_id: int, text: str, *, analyst: str | None = None) -> int:
        """Append a note to the case; return the note id. The case's state is unchanged.

        Raises :class:`NoteRequiredError` (empty text), :class:`CaseNotFoundError`,
        :class:`MissingAnalystError`.
        """
        text = _require_text(text, "note text")
        analyst = resolve_analyst(analyst)
        with self._write() as conn:
            ts = _utcnow()
            row = self._case_row(conn, case_id)
            cur = conn.execute(
                "INSERT INTO notes(case_id, ts, analyst, text) VALUES (?, ?, ?, ?)",
                (row["id"], ts, analyst, text),
            )
            snap = self._snapshot(row)
            self._audit(
                conn, ts, analyst, "note_added", case_id=row["id"],
                model_sha256=row["model_sha256"], before=snap,
                after={**snap, "note_id": cur.lastrowid, "note": text},
            )
            return int(cur.lastrowid)
