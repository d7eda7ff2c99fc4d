"""The case store class: one SQLite file, its concerns composed from one mixin per file."""

from __future__ import annotations

from engine.cases.store.audit import AuditMixin
from engine.cases.store.connection import StoreConnection
from engine.cases.store.decisions import DecisionsMixin
from engine.cases.store.notes import NotesMixin
from engine.cases.store.queue import QueueMixin
from engine.cases.store.work import WorkMixin


class CaseStore(QueueMixin, WorkMixin, DecisionsMixin, NotesMixin, AuditMixin, StoreConnection):
    """The analyst case store in one SQLite file (see the module docstring for the rules).

    Args:
        path: database file; ``None`` -> :func:`default_db_path`. Parent folders are created.
        four_eyes: require a second analyst to approve confirmed fraud; ``None`` ->
            ``$FRAUDLENS_FOUR_EYES`` (:func:`four_eyes_from_env`).
        timeout_s: seconds a write waits for another writer before
            ``sqlite3.OperationalError`` ("database is locked").
        strict_audit: raise :class:`AuditChainError` if the audit chain is broken when the
            store opens (default: warn with ``AuditTamperWarning``; :attr:`audit_verdict`).

    Raises:
        SchemaError: the file's schema is newer than this code, or it is not a case store.
        AuditChainError: ``strict_audit`` and the audit log was tampered with.
        sqlite3.DatabaseError: the file is not a SQLite database.
        OSError: the file or its folder cannot be created.

    Use as a context manager or call :meth:`close`.
    """
