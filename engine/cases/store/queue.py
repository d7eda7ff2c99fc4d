"""Case store queue: thresholds per model, cases created from scoring, the ranked review queue."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import pandas as pd

from engine.cases.store.common import (
    _QUEUE_DTYPES,
    _SCORE_COLUMNS,
    _TS_FORMAT,
    CASE_INPUT_COLUMNS,
    LEGACY_SOURCE,
    QUEUE_COLUMNS,
    STATES,
    SYSTEM_ACTOR,
    Thresholds,
    UpsertResult,
    _check_sha,
    _check_source,
    _is_date_only,
    _ts_text,
    _utcnow,
    person_key,
    resolve_analyst,
)
from engine.cases.store.priority import priority_score, sla_due


class QueueMixin:
    """Thresholds, :meth:`upsert_cases` from scoring and :meth:`queue` (mixin of :class:`CaseStore`)."""

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
        self,
        model_sha256: str,
        rows: pd.DataFrame,
        *,
        source_id: str = LEGACY_SOURCE,
        actor: str = SYSTEM_ACTOR,
    ) -> UpsertResult:
        """Create or refresh one case per (model, data source, entity) from a per-entity summary.

        ``source_id`` is the data source the rows were scored from
        (:func:`~engine.cases.store.common.source_id`: file content sha256 + spec name); a case
        belongs to one source, so the same entity id from another file is another case, and
        refreshing one source never touches another source's cases. Callers that know the
        source must pass it; the default :data:`LEGACY_SOURCE` is the one source of the cases
        written before sources were recorded.

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

        Raises ``ValueError`` for missing columns, duplicate entity ids, probabilities that
        are missing or outside [0, 1], or a malformed ``source_id``.
        """
        _check_sha(model_sha256)
        _check_source(source_id)
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
                    f"SELECT id, entity_id, state, assignee, pending_by, version, created_at, "
                    f"sla_due_at, {cols} "
                    "FROM cases WHERE model_sha256 = ? AND source_id = ?",
                    (model_sha256, source_id),
                )
            }
            for rec in records:
                old = existing.get(rec["entity_id"])
                scores = {c: rec[c] for c in _SCORE_COLUMNS}
                prio = priority_score(rec["max_probability"], rec["max_amount"])
                if old is None:
                    cur = conn.execute(
                        f"INSERT INTO cases(model_sha256, source_id, entity_id, {cols}, state, "
                        f"created_at, updated_at, priority, sla_due_at) VALUES (?, ?, ?, "
                        f"{', '.join('?' * len(_SCORE_COLUMNS))}, 'open', ?, ?, ?, ?)",
                        (model_sha256, source_id, rec["entity_id"], *scores.values(), ts, ts,
                         prio, _ts_text(sla_due(ts, prio))),
                    )
                    after = {"state": "open", "assignee": None, "pending_by": None, "version": 0}
                    self._audit(
                        conn, ts, actor, "case_created", case_id=cur.lastrowid,
                        model_sha256=model_sha256,
                        after={**after, "source_id": source_id, "entity_id": rec["entity_id"],
                               **scores},
                    )
                    created += 1
                    continue
                old_scores = {c: old[c] for c in _SCORE_COLUMNS}
                if old_scores == scores:
                    unchanged += 1
                    continue
                due = _ts_text(sla_due(old["created_at"], prio))
                if old["sla_due_at"] is not None:  # the clock is never reset to a later due time
                    due = min(due, old["sla_due_at"])
                conn.execute(
                    f"UPDATE cases SET {', '.join(c + ' = ?' for c in _SCORE_COLUMNS)}, "
                    "updated_at = ?, priority = ?, sla_due_at = ? WHERE id = ?",
                    (*scores.values(), ts, prio, due, old["id"]),
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

    def queue(
        self,
        model_sha256: str,
        review_threshold: float | None = None,
        *,
        source_id: str | None = None,
        date_from: Any = None,
        date_to: Any = None,
        min_amount: float | None = None,
        max_amount: float | None = None,
        label: str | None = None,
        state: str | Iterable[str] | None = None,
        assignee: str | None = None,
        limit: int | None = None,
        order: str = "score",
    ) -> pd.DataFrame:
        """The review queue of one model: cases with ``max_probability >= review_threshold``.

        Ranked by ``max_probability`` descending (ties: latest ``last_ts`` first, then case id).

        Args:
            model_sha256: the model's sha256.
            review_threshold: probability; ``None`` -> the model's stored review threshold
                (``ValueError`` if none is stored).
            source_id: only the cases of this data source (``None``: every source; the
                ``source_id`` column says which).
            date_from, date_to: keep cases whose activity ``[first_ts, last_ts]`` overlaps this
                range (naive UTC or tz-aware; both ends inclusive; a date without time for
                ``date_to`` includes that whole day).
            min_amount, max_amount: bounds on the case's largest transaction amount.
            label: ``"fraud"`` = the entity has at least one known-fraud-labelled transaction,
                ``"not_fraud"`` = it has none.
            state: one state or several (:data:`STATES`).
            assignee: analyst name, compared by
                :func:`~engine.cases.store.identity.person_key` (case, NFKC, zero-width and
                lookalike characters do not matter); ``""`` = unassigned cases only.
            limit: at most this many rows.
            order: ``"score"`` (default, as above) or ``"priority"`` (the work list:
                ``priority`` descending, then the earliest ``sla_due_at``, then case id; see
                :mod:`engine.cases.store.priority`).

        Returns:
            DataFrame with :data:`QUEUE_COLUMNS`; ``recommendation`` is ``"decline"`` when the
            model has a stored decline threshold and the score reaches it, else ``"review"``.
            ``first_ts`` / ``last_ts`` / ``sla_due_at`` are naive-UTC ``datetime64``;
            ``priority`` the priority score in [0, 1].

        Raises ``ValueError`` for an unknown ``order``, state or label.
        """
        orders = {"score": "max_probability DESC, last_ts DESC, id ASC",
                  "priority": "priority DESC, sla_due_at ASC, id ASC"}
        if order not in orders:
            raise ValueError(f"order: expected one of {list(orders)}, got {order!r}")
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
        if source_id is not None:
            where.append("source_id = ?")
            params.append(_check_source(source_id))
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
                where.append("fraudlens_person_key(assignee) = ?")
                params.append(person_key(assignee))
        decline = thr.decline if thr is not None else None
        sql = (
            "SELECT id AS case_id, model_sha256, source_id, entity_id, max_probability, "
            "CASE WHEN ? IS NOT NULL AND max_probability >= ? THEN 'decline' ELSE 'review' END "
            "AS recommendation, max_transaction_id, first_ts, last_ts, max_amount, "
            "n_transactions, n_known_fraud, state, assignee, pending_by, version, created_at, "
            f"updated_at, priority, sla_due_at, assigned_at FROM cases WHERE {' AND '.join(where)} "
            f"ORDER BY {orders[order]}"
        )
        params = [decline, decline, *params]
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        rows = self._read(sql, params)
        df = pd.DataFrame([tuple(r) for r in rows], columns=QUEUE_COLUMNS)
        for c in ("first_ts", "last_ts", "sla_due_at"):
            df[c] = pd.to_datetime(df[c], format=_TS_FORMAT)
        return df.astype(_QUEUE_DTYPES)
