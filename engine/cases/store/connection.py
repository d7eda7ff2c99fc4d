"""Case store plumbing: the open connection, write transactions, row reads, version checks.

The base class of :class:`~engine.cases.store.CaseStore`; the concerns (queue, decisions, notes,
audit) are mixins over it."""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from engine.cases.store.chain import verify_chain
from engine.cases.store.common import (
    AuditChainError,
    CaseNotFoundError,
    ChainVerdict,
    ConflictError,
    READ_ACTIONS,
    default_db_path,
    four_eyes_from_env,
)
from engine.cases.store.identity import person_key
from engine.cases.store.schema import connect, migrate, schema_version

log = logging.getLogger(__name__)


class AuditTamperWarning(UserWarning):
    """Warned when a store opens on an audit log whose hash chain is broken."""


def private_file(path: Path) -> None:
    """Make ``path``'s folder (when it has to be created: mode 0700) and ``path`` itself (mode
    0600, created empty if missing; an existing file of ours is tightened to 0600).

    Folders that already exist keep their mode (``$FRAUDLENS_DATA_DIR`` may be shared).
    Raises ``OSError`` from the file system.
    """
    if not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
    except FileExistsError:
        st = path.stat()
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(path, 0o600)


class StoreConnection:
    """One SQLite connection with the store's settings, migrated to the latest schema on open.

    Args:
        path: database file; ``None`` -> :func:`default_db_path`. Parent folders are created.
        four_eyes: require a second analyst to approve confirmed fraud; ``None`` ->
            ``$FRAUDLENS_FOUR_EYES`` (:func:`four_eyes_from_env`).
        timeout_s: seconds a write waits for another writer before
            ``sqlite3.OperationalError`` ("database is locked").
        strict_audit: raise :class:`AuditChainError` when the audit chain is broken at open
            (default: warn with :class:`AuditTamperWarning`, log an error, and keep the verdict
            in :attr:`audit_verdict` for the audit screen).

    The database file is created with mode 0600 (its folder, when created, 0700); SQLite's
    ``-wal`` / ``-shm`` files take the database file's mode. The audit chain is verified on
    every open (:attr:`audit_verdict`).
    """

    audit_verdict: ChainVerdict

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        four_eyes: bool | None = None,
        timeout_s: float = 30.0,
        strict_audit: bool = False,
    ) -> None:
        self.path = Path(path).expanduser() if path is not None else default_db_path()
        private_file(self.path)
        self.four_eyes = four_eyes_from_env() if four_eyes is None else bool(four_eyes)
        self._lock = threading.RLock()
        self._conn = connect(self.path, timeout_s=timeout_s)
        try:
            self._conn.create_function("fraudlens_person_key", 1, _sql_person_key,
                                       deterministic=True)
            migrate(self._conn)
            self.audit_verdict = verify_chain(self._conn)
            self._verified_at = time.monotonic()
        except BaseException:
            self._conn.close()
            raise
        if not self.audit_verdict.ok:
            log.error("%s: %s", self.path, self.audit_verdict.message)
            if strict_audit:
                self._conn.close()
                raise AuditChainError(self.audit_verdict)
            warnings.warn(f"{self.path}: {self.audit_verdict.message}", AuditTamperWarning,
                          stacklevel=2)
        if hasattr(self, "_four_eyes_policy"):  # CaseStore: the store's policy, once switched on, holds
            self._four_eyes_policy(self.four_eyes)

    # -- plumbing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
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
    def _check_version(
        conn: sqlite3.Connection, row: sqlite3.Row, expected_version: int | None
    ) -> None:
        if expected_version is None or int(expected_version) == row["version"]:
            return
        last = conn.execute(
            "SELECT action, actor, ts FROM audit_log WHERE case_id = ? "
            f"AND action NOT IN ({', '.join('?' * len(READ_ACTIONS))}) ORDER BY id DESC LIMIT 1",
            (row["id"], *READ_ACTIONS),
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


def _sql_person_key(name: object) -> str | None:
    return person_key(name) if isinstance(name, str) else None
