"""Case store audit log: the append-only record of every action, written with the change it describes."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Iterable
from typing import Any

import pandas as pd

from engine.cases.store.anchor import AuditAnchor, check_anchors, current_anchor
from engine.cases.store.chain import chain_head, row_hash, set_head, verify_chain
from engine.cases.store.common import (
    AUDIT_COLUMNS,
    READ_ACTIONS,
    ChainVerdict,
    _check_sha,
    _json,
    _require_text,
    _utcnow,
    person_key,
    resolve_analyst,
)

#: the report formats :meth:`AuditMixin.record_export` accepts
EXPORT_FORMATS = ("pdf", "json", "csv")


def audit_csv(frame: pd.DataFrame) -> bytes:
    """An :meth:`AuditMixin.audit_log` frame as CSV bytes (UTF-8, ``\n`` line ends, RFC 4180
    quoting): ``before`` / ``after`` as canonical JSON text, card-number-like digit runs masked
    and every text cell neutralised against formula injection by the project's one CSV writer
    (:func:`engine.data.csv_writer.csv_bytes`). Raises ``KeyError`` if a column of
    :data:`AUDIT_COLUMNS` is missing."""
    from engine.cases.redact import mask_card_number
    from engine.data.csv_writer import csv_bytes

    out = frame[AUDIT_COLUMNS].copy()
    for c in ("before", "after"):
        # not ASCII-escaped: "4111\u00a01111..." as escape text hid the number from the masking
        out[c] = [_json(v, ensure_ascii=False) for v in out[c]]
    for c in ("actor", "action", "before", "after"):
        out[c] = out[c].map(mask_card_number)
    return csv_bytes(out)


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
        """Append one chained audit row (inside the caller's write transaction)."""
        new_id, prev = chain_head(conn)
        values = (new_id, ts, actor, action, case_id, model_sha256, _json(before), _json(after),
                  prev)
        h = row_hash(values)
        conn.execute(
            "INSERT INTO audit_log(id, ts, actor, action, case_id, model_sha256, before_json, "
            "after_json, prev_hash, row_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*values, h),
        )
        set_head(conn, new_id, h)

    def verify_audit_chain(self) -> ChainVerdict:
        """Recompute the audit log's hash chain now (see :mod:`engine.cases.store.chain`).

        Returns a :class:`ChainVerdict` (``ok``, or ``first_broken_id`` and ``reason``); also
        kept as :attr:`audit_verdict`. Reads only.
        """
        with self._lock:
            verdict = verify_chain(self._conn)
            self.audit_verdict, self._verified_at = verdict, time.monotonic()
        return verdict

    def audit_anchor(self) -> AuditAnchor | None:
        """The anchor of the last audit row (id, ``row_hash``, time), to keep off this host
        (:mod:`engine.cases.store.anchor`); ``None`` for an empty log. Reads only."""
        with self._lock:
            return current_anchor(self._conn)

    def check_audit_anchors(self, anchors: list[AuditAnchor]) -> ChainVerdict:
        """Whether each anchor's audit row is still there with the hash it had
        (:func:`engine.cases.store.anchor.check_anchors`); together with
        :meth:`verify_audit_chain` this catches a log rewritten with every hash recomputed. Reads only."""
        with self._lock:
            return check_anchors(self._conn, list(anchors))

    def recent_audit_verdict(self, max_age_s: float = 30.0) -> ChainVerdict:
        """:attr:`audit_verdict`, verified again (:meth:`verify_audit_chain`) when the last
        check is older than ``max_age_s`` seconds: the alarm every page shows follows a log
        changed while the server runs, at the cost of one verification per ``max_age_s``."""
        if time.monotonic() - self._verified_at > max_age_s:
            return self.verify_audit_chain()
        return self.audit_verdict

    def case_audit_mark(self, case_id: int) -> int:
        """The id of the case's latest audit row (0 if none): it changes with every write to the
        case (disposition, assignment, note, narrative), notes included, which do not bump the
        case's ``version``; exports (:data:`READ_ACTIONS`) do not move it. A cache key for
        anything built from the case's record (the report)."""
        rows = self._read("SELECT coalesce(max(id), 0) FROM audit_log WHERE case_id = ? "
                          f"AND action NOT IN ({', '.join('?' * len(READ_ACTIONS))})", (int(case_id), *READ_ACTIONS))
        return int(rows[0][0])

    def record_export(self, case_id: int, *, report_id: str, report_sha256: str, fmt: str,
                      analyst: str | None = None, file_sha256: str | None = None) -> None:
        """Audit one download of a case report as ``report_exported``: who (``analyst``, default
        ``$FRAUDLENS_ANALYST``), when, the report's id and sha256 (which the PDF prints and the
        JSON carries, so a file handed outside the bank is traced to this row) and its format
        (one of :data:`EXPORT_FORMATS`), and ``file_sha256``, the sha256 of the bytes served (the
        PDF, JSON or CSV file itself: the report's sha256 is of its canonical JSON, so it is the
        same for the three files), when given. The case is unchanged.

        Raises :class:`CaseNotFoundError`, :class:`MissingAnalystError`,
        :class:`NoteRequiredError` (empty report id) and ``ValueError`` (unknown format, or a
        ``report_sha256`` that is not 64 hex digits)."""
        if fmt not in EXPORT_FORMATS:
            raise ValueError(f"format: expected one of {list(EXPORT_FORMATS)}, got {str(fmt)[:20]!r}")
        if not isinstance(report_sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", report_sha256):
            raise ValueError(f"report_sha256: expected 64 lowercase hex digits, got {str(report_sha256)[:80]!r}")
        sha = report_sha256
        if file_sha256 is not None and not (isinstance(file_sha256, str) and re.fullmatch(r"[0-9a-f]{64}", file_sha256)):
            raise ValueError(f"file_sha256: expected 64 lowercase hex digits, got {str(file_sha256)[:80]!r}")
        rid = _require_text(report_id, "report id")[:80]
        analyst = resolve_analyst(analyst)
        with self._write() as conn:
            ts = _utcnow()
            row = self._case_row(conn, case_id)
            # no case snapshot: a read states nothing about the case (a snapshot would make the
            # verifier accept a cases row edited outside the store as soon as anyone exported it)
            self._audit(conn, ts, analyst, "report_exported", case_id=row["id"], model_sha256=row["model_sha256"],
                        after={"report_id": rid, "report_sha256": sha, "format": fmt,
                               **({"file_sha256": file_sha256} if file_sha256 is not None else {})})

    def audit_log(
        self,
        case_id: int | None = None,
        *,
        model_sha256: str | None = None,
        actor: str | None = None,
        action: str | Iterable[str] | None = None,
    ) -> pd.DataFrame:
        """Audit rows, oldest first (:data:`AUDIT_COLUMNS`), optionally filtered.

        Args:
            case_id: one case. model_sha256: one model.
            actor: one person, compared by :func:`~engine.cases.store.identity.person_key`
                (``"Alice"`` also finds ``"аlice"`` with a Cyrillic ``а``).
            action: one action name or several (e.g. ``"disposition"``, ``"approved"``).

        ``before`` / ``after`` are the decoded JSON (dicts, or ``None``); ``ts`` is UTC ISO 8601
        text; ``prev_hash`` / ``row_hash`` the chain hashes (hex).
        Raises ``ValueError`` for a malformed ``model_sha256``.
        """
        where: list[str] = []
        params: list[Any] = []
        if case_id is not None:
            where.append("case_id = ?")
            params.append(int(case_id))
        if model_sha256 is not None:
            where.append("model_sha256 = ?")
            params.append(_check_sha(model_sha256))
        if action is not None:
            actions = [action] if isinstance(action, str) else list(action)
            where.append(f"action IN ({', '.join('?' * len(actions))})")
            params.extend(actions)
        sql = (
            "SELECT id, ts, actor, action, case_id, model_sha256, before_json, after_json, "
            "prev_hash, row_hash "
            f"FROM audit_log {'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY id"
        )
        rows = self._read(sql, params)
        key = person_key(actor) if actor is not None else None
        data = [
            (*tuple(r)[:6], json.loads(r[6]) if r[6] else None,
             json.loads(r[7]) if r[7] else None, r[8], r[9])
            for r in rows
            if key is None or person_key(str(r[2])) == key
        ]
        return pd.DataFrame(data, columns=AUDIT_COLUMNS)
