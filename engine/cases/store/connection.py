"""Case store plumbing: the open connection, write transactions, row reads, version checks.

The base class of :class:`~engine.cases.store.CaseStore`; the concerns (queue, decisions, notes,
audit) are mixins over it."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from engine.cases.store.common import (
    CaseNotFoundError,
    ConflictError,
    default_db_path,
    four_eyes_from_env,
)
from engine.cases.store.schema import connect, migrate, schema_version


class StoreConnection:
    """One SQLite connection with the store's settings, migrated to the latest schema on open.

    Args:
        path: database file; ``None`` -> :func:`default_db_path`. Parent folders are created.
        four_eyes: require a second analyst to approve confirmed fraud; ``None`` ->
            ``$FRAUDLENS_FOUR_EYES`` (:func:`four_eyes_from_env`).
        timeout_s: seconds a write waits for another writer before
            ``sqlite3.OperationalError`` ("database is locked").
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
