"""Case store work list: claim the next case, assign many cases at once (schema v4).

Both run in one ``BEGIN IMMEDIATE`` transaction, so two analysts claiming at the same moment get
two different cases, and a bulk assignment is written whole or not at all. Every case they change
gets its own chained audit row (``claimed`` / ``bulk_assigned``) whose ``after`` holds the case's
state, assignee, pending_by and version, as every case-level audit row does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from engine.cases.store.common import (
    _check_sha,
    _check_source,
    _utcnow,
    resolve_analyst,
)


class WorkMixin:
    """:meth:`get_case`, :meth:`find_case`, :meth:`claim_next` and :meth:`bulk_assign` (mixin
    of :class:`CaseStore`)."""

    def get_case(self, case_id: int) -> dict[str, Any]:
        """One case as a dict (all ``cases`` columns, ``id`` is the case id).

        Raises :class:`CaseNotFoundError`.
        """
        with self._lock:
            return dict(self._case_row(self._conn, case_id))

    def find_case(self, model_sha256: str, source_id: str, entity_id: str) -> dict[str, Any] | None:
        """The case of ``entity_id`` from ``source_id`` under the model, or ``None``.

        Raises ``ValueError`` for a malformed sha256 or source id.
        """
        rows = self._read(
            "SELECT * FROM cases WHERE model_sha256 = ? AND source_id = ? AND entity_id = ?",
            (_check_sha(model_sha256), _check_source(source_id), str(entity_id)),
        )
        return dict(rows[0]) if rows else None

    def claim_next(
        self,
        model_sha256: str,
        review_threshold: float,
        *,
        source_id: str | None = None,
        analyst: str | None = None,
    ) -> dict[str, Any] | None:
        """Assign the highest-priority unassigned ``open`` case to ``analyst``; return it.

        Chooses among the model's cases (of ``source_id`` when given) with ``max_probability
        >= review_threshold`` (a probability), state ``open`` and no assignee, by ``priority``
        descending, then the earliest SLA due time, then case id (the order of
        ``queue(order="priority")``). The choice and the assignment are one write
        transaction: concurrent claims never get the same case. Audited as ``claimed``.
        Returns the case (as :meth:`get_case`) after the claim, or ``None`` when nothing is
        left to claim. Raises :class:`MissingAnalystError`, ``ValueError`` (bad sha / source).
        """
        _check_sha(model_sha256)
        analyst = resolve_analyst(analyst)
        where = ["model_sha256 = ?", "max_probability >= ?", "state = 'open'", "assignee IS NULL"]
        params: list[Any] = [model_sha256, float(review_threshold)]
        if source_id is not None:
            where.append("source_id = ?")
            params.append(_check_source(source_id))
        with self._write() as conn:
            row = conn.execute(
                f"SELECT * FROM cases WHERE {' AND '.join(where)} "
                "ORDER BY priority DESC, sla_due_at ASC, id ASC LIMIT 1", params,
            ).fetchone()
            if row is None:
                return None
            ts = _utcnow()
            after = self._set_state(conn, row, ts, state="assigned", assignee=analyst,
                                    pending_by=row["pending_by"])
            conn.execute("UPDATE cases SET assigned_at = ? WHERE id = ?", (ts, row["id"]))
            self._audit(conn, ts, analyst, "claimed", case_id=row["id"],
                        model_sha256=row["model_sha256"], before=self._snapshot(row),
                        after={**after, "priority": row["priority"]})
            return dict(self._case_row(conn, row["id"]))

    def bulk_assign(
        self,
        case_ids: Iterable[int],
        assignee: str | None,
        *,
        actor: str | None = None,
        expected_versions: Mapping[int, int] | None = None,
    ) -> dict[int, int]:
        """Assign every case of ``case_ids`` to ``assignee`` (``None`` = unassign) at once.

        All or nothing, in one transaction: an unknown id raises :class:`CaseNotFoundError`
        and a stale version (``expected_versions``: case id -> the version the caller showed)
        :class:`ConflictError`, and nothing is written. State rules as :meth:`assign` (``open``
        <-> ``assigned``). One ``bulk_assigned`` audit row per case (``after`` adds the batch
        size). Returns case id -> new version. Raises ``ValueError`` for no ids or duplicates,
        :class:`MissingAnalystError`.
        """
        ids = [int(i) for i in case_ids]
        if not ids:
            raise ValueError("bulk_assign: no case ids")
        if len(set(ids)) != len(ids):
            raise ValueError("bulk_assign: duplicate case ids")
        actor = resolve_analyst(actor)
        new_assignee = resolve_analyst(assignee) if assignee is not None else None
        versions = dict(expected_versions or {})
        out: dict[int, int] = {}
        with self._write() as conn:
            ts = _utcnow()
            rows = []
            for cid in ids:
                row = self._case_row(conn, cid)  # CaseNotFoundError -> rollback
                self._check_version(conn, row, versions.get(cid))
                rows.append(row)
            for row in rows:
                state = row["state"]
                if state == "open" and new_assignee is not None:
                    state = "assigned"
                elif state == "assigned" and new_assignee is None:
                    state = "open"
                after = self._set_state(conn, row, ts, state=state, assignee=new_assignee,
                                        pending_by=row["pending_by"])
                conn.execute("UPDATE cases SET assigned_at = ? WHERE id = ?",
                             (ts if new_assignee is not None else None, row["id"]))
                self._audit(conn, ts, actor, "bulk_assigned", case_id=row["id"],
                            model_sha256=row["model_sha256"], before=self._snapshot(row),
                            after={**after, "batch_size": len(rows)})
                out[int(row["id"])] = after["version"]
        return out
