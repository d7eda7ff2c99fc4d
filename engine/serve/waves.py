"""The scoring service's dynamic batches: rows of separate requests scored together.

:func:`score_rows` is :meth:`engine.serve.service.ScoringService.score_rows` (``self`` is the
service; its lock, caches, staging and commit are used as they are). It keeps every row's answer
as if the row had been posted alone (idempotency, order, 409 / 500 per row) while running the
model step once per wave of distinct entities and committing the batch once.
"""

from __future__ import annotations

import logging
from typing import Any

from engine.serve.record import RecordError, canonical_row
from engine.serve.service import MAX_BATCH, Outcome, ServiceError, refusal_status

log = logging.getLogger("fraudlens.serve")


def waves(rows: list[dict[str, Any]]) -> list[list[int]]:
    """Positions of ``rows`` cut, in order, into waves with at most one row per entity and per
    transaction id (a row waits for the next wave when its entity or id is already in this one), so
    a wave's rows can be scored together and an entity's rows stay in arrival order."""
    waves: list[list[int]] = []
    seen: set = set()
    for i, r in enumerate(rows):
        keys = (("e", r["entity_id"]), ("t", r["transaction_id"]))
        if not waves or any(k in seen for k in keys):
            waves.append([])
            seen = set()
        waves[-1].append(i)
        seen.update(keys)
    return waves


def score_rows(self, rows: list[dict[str, Any]]) -> list[tuple]:
    """Score the canonical rows of separate requests together (the dynamic batches of
    :mod:`engine.serve.scorer`): in order, under one lock, with one durable commit; each row
    keeps its own answer, as if posted alone. The rows are cut into waves of distinct entities
    (:func:`waves`); each wave's model step runs once for all its entities
    (:meth:`engine.serve.state.EntityCache.score_many`).

    Returns:
        one tuple per row: ``("ok", body, flagged)`` (body as :meth:`ScoringService.score_one`'s, without
        ``latency_ms``) or ``("err", status, detail)`` (409 out of order / reused id, 500
        non-finite score or refused rows, 503 history store unavailable). If anything but a
        409 fails while the rows are scored together, nothing of the batch is kept (its
        entities are rebuilt from history) and each row is scored again alone, so only the
        failing row gets the error; a failed commit answers every row of the batch 503/500
        (nothing of it was accepted).
    """
    try:
        self._check_open()
    except ServiceError as e:
        return [("err", e.status, e.detail)] * len(rows)
    results: list[tuple | None] = [None] * len(rows)
    outs: list[tuple[int, Outcome]] = []
    pending: dict[str, tuple] = {}
    failed = False
    with self.lock:
        entities: set[str] = set()
        try:
            with self.cache.holding():  # none of the batch's entities is evicted until it is staged
                for wave in waves(rows):
                    todo = []
                    for i in wave:
                        row = rows[i]
                        entities.add(row["entity_id"])
                        hit = row["entity_id"] in self.cache.sizes
                        try:
                            dup = self._prepare(row, pending)
                        except RecordError as err:  # before any cache step: this row alone is refused
                            results[i] = ("err", refusal_status(err), [err.detail()])
                            continue
                        if dup is not None:
                            outs.append((i, dup))
                        else:
                            todo.append((i, row, hit))
                    if todo:  # one model step for the wave's entities together
                        scored = self.cache.score_many([(r["entity_id"], r) for _, r, _ in todo])
                        for (i, row, hit), (logit, reasons) in zip(todo, scored):
                            outs.append((i, self._finish(row, logit, reasons, hit, pending)))
            ticket = self._submit(pending)
        except BaseException:  # undo the whole batch, then score each row alone (below)
            self._forget(entities, pending)
            failed = True
    if failed:
        return [_alone(self, row) for row in rows]
    try:
        self._durable(ticket, pending)
    except ServiceError as e:
        return [("err", e.status, e.detail)] * len(rows)
    with self.lock:
        for _, out in outs:
            self._count(out)
        self.counts["rejected"] += sum(r is not None for r in results)
    if any(o.flagged for _, o in outs) and self.worker is not None:
        self.worker.notify()
    for i, out in outs:
        results[i] = ("ok", out.body, out.flagged)
    return results


def _alone(self, row: dict[str, Any]) -> tuple:
    try:
        out = self._score_canonical(row)
    except ServiceError as e:
        return ("err", e.status, e.detail)
    except Exception as e:  # noqa: BLE001 - this row's 500; logged with its traceback
        import logging

        logging.getLogger("fraudlens.serve").exception("unexpected error scoring %s", row.get("transaction_id"))
        return ("err", 500, [{"loc": [], "msg": f"internal error ({type(e).__name__}); see the service log",
                              "type": "internal_error"}])
    return ("ok", out.body, out.flagged)


def score_batch(self, recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Score posted transactions in order; one durable commit for all accepted ones.

    Returns:
        ``{"results": [score body per accepted or duplicate transaction, with "index"],
        "rejected": [{"index", "loc", "msg", "type", "input"}], "accepted", "rejected_count"}``;
        every item is in exactly one of the two lists.
    Raises:
        ServiceError: 413 more than :data:`MAX_BATCH` items; 500 / 503 as :meth:`score_one`
            (then nothing of the batch is accepted).
    """
    if len(recs) > MAX_BATCH:
        raise ServiceError(413, [{"loc": ["body", "transactions"], "msg": f"{len(recs):,} transactions; at most "
                                  f"{MAX_BATCH:,} per batch", "type": "too_many"}])
    rows: list[tuple[int, dict]] = []
    rejected: list[dict[str, Any]] = []
    for i, rec in enumerate(recs):
        try:
            rows.append((i, canonical_row(rec, self.spec)))
        except RecordError as err:
            rejected.append({"index": i, **err.detail()})
    results, outs = [], []
    pending: dict[str, tuple] = {}
    with self.lock:
        self._check_open()
        entities: set[str] = set()
        try:
            with self.cache.holding():  # none of the batch's entities is evicted until it is staged
                for i, row in rows:
                    entities.add(row["entity_id"])
                    try:
                        out = self._score_row(row, pending)
                    except RecordError as err:  # before the row's cache step: the item alone is refused
                        rejected.append({"index": i, **err.detail(),
                                         **({"type": "conflict"} if refusal_status(err) == 409 else {})})
                        continue
                    outs.append(out)
                    results.append({"index": i, **out.body})
            ticket = self._submit(pending)
        except BaseException:  # any failure: nothing of the batch is accepted, its entities rebuilt
            self._forget(entities, pending)
            raise
    self._durable(ticket, pending)
    with self.lock:
        for out in outs:
            self._count(out)
        self.counts["rejected"] += len(rejected)
    if any(o.flagged for o in outs) and self.worker is not None:
        self.worker.notify()
    rejected.sort(key=lambda r: r["index"])
    return {"results": results, "rejected": rejected, "accepted": sum(not o.duplicate for o in outs),
            "rejected_count": len(rejected)}
