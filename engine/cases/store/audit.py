"""Case store audit log: the append-only record of every action, written with the change it describes."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pandas as pd

from engine.cases.store.common import (
    AUDIT_COLUMNS,
    _check_sha,
    _json,
)


class AuditMixin:
    """Writes and reads the append-only ``audit_log`` table (mixin of :class:`CaseStore`)."""

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
