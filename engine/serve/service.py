"""The scoring service's core (no HTTP): validate, order-check, score, append durably, answer.

:class:`ScoringService` is what :mod:`engine.serve.api` calls for ``POST /v1/score`` and
``POST /v1/score/batch``. Per transaction, under one lock (the scorer's caches and the history
connection are single-threaded; scoring is CPU-bound, so a lock costs no throughput on one core):

1. :func:`engine.serve.record.canonical_row` (the file rules; outside the lock);
2. idempotency: a transaction id already in the history store is answered from the stored row
   (``duplicate: true``), never scored or appended again; the same id with different content
   is a conflict (409);
3. order: a timestamp earlier than the entity's last accepted one is refused (409), as the
   incremental scorer requires (ties are accepted, in arrival order, as a file's row order); a
   timestamp more than ``max_ahead_s`` (default 10 min) after the server's clock is refused (422): accepted, it
   would make every later real transaction of that entity "out of order" (a lock-out);
4. the entity's caches (:class:`engine.serve.state.EntityCache`, rebuilt from history on a miss),
   one incremental step -> logit, probability = the checkpoint's calibration map of the logit
   (``ModelBundle.probability``; sigmoid for an uncalibrated checkpoint, and the response's
   ``calibrated`` says which), decision band
   (:func:`engine.cases.thresholds.decision_band` against the thresholds in force);
5. the row is appended to the history store and committed *before* the response: an
   acknowledged transaction is never lost. Commits are grouped
   (:class:`engine.serve.history.GroupCommitter`: the rows of all requests waiting at that moment
   in one transaction, one fsync, committed by the first of them); until its commit returns a row is "in flight" (a retry of it
   is answered as a duplicate; a cache rebuild first waits for in-flight commits). If a commit
   fails the request gets 503 and the service refuses every request until restarted.

The entity cache never holds a row the history store lacks: when anything fails after a
request's first cache step (any exception, not only a refusal), every entity the request touched
is evicted and rebuilt from the committed history on its next use. One server per history file:
the service holds :class:`engine.serve.history.HistoryLock` from construction to :meth:`close`.

Flagged transactions (probability >= review threshold) wake the :class:`engine.serve.casework.CaseWorker`
unless ``shadow``: in shadow mode transactions are scored and logged to the history store, the
response says ``"shadow": true``, and no case or explanation is ever written.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.cases.thresholds import decision_band, thresholds_in_force

#: the reason of a flagged transaction for which no cheap fact fired (:func:`engine.serve.state.cheap_reasons`)
NO_SIMPLE_FACT = {"code": "model_history_pattern",
                  "text": "no simple fact (large amount, new merchant, burst, errors) stands out: the score comes from "
                          "the model's reading of the earlier transactions; the case's attributions show which"}
from engine.model.checkpoint import ModelBundle
from engine.model.scoring import NonFiniteScoreError
from engine.serve.casework import DEFAULT_EXPLAIN_CPU, CaseWorker
from engine.serve.history import (GroupCommitter, HistoryLock, HistoryStore, RecordsRefused, private_dirs,
                                  row_json, utcnow)
from engine.serve.record import TRANSACTION_ID_KEY, RecordError, canonical_row
from engine.serve.state import EntityCache
from engine.serve.supervisor import Supervisor

#: default of ``ScoringService(max_ahead_s=...)`` and ``serve --max-ahead-minutes`` (10 minutes, in
#: seconds): an authorisation is scored as it happens; a day of tolerance let one post lock a card out for a day
DEFAULT_MAX_AHEAD_S = 600.0

#: most transactions in one batch request
MAX_BATCH = 1000


class ServiceError(Exception):
    """A request the service refuses: HTTP ``status`` and the FastAPI-style ``detail`` list."""

    def __init__(self, status: int, detail: list[dict[str, Any]]):
        super().__init__(detail[0]["msg"] if detail else str(status))
        self.status, self.detail = status, detail


@dataclass
class Outcome:
    """One transaction's answer: ``body`` (the JSON response) and what happened."""

    body: dict[str, Any]
    duplicate: bool = False
    flagged: bool = False
    cache_hit: bool = True


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


class ScoringService:
    """Scores posted transactions with a checkpoint's incremental scorer (module docstring).

    Args:
        bundle: the loaded, validated checkpoint (:func:`engine.model.checkpoint.load_checkpoint`).
        history_path: the history store (SQLite; created if missing).
        cache_bytes: memory cap of the per-entity caches.
        shadow: score and log only, never write cases.
        case_db: the case store (``None``: the default one in ``$FRAUDLENS_DATA_DIR``).
        explain: ``"occlusion"`` or ``"none"``: what the case worker computes per flagged transaction.
        start_worker: start the case worker (tests may drive it by hand).
        sync: ``"full"`` (fsync per commit) or ``"normal"`` (:data:`engine.serve.history.SYNC_MODES`).
        explain_cpu: CPU budget of the background explanations, a fraction of one core
            (:class:`engine.serve.casework.CaseWorker`).
        max_ahead_s: seconds a transaction's timestamp (naive UTC) may lie after this machine's
            clock (clock skew, a client's local time); later ones are refused with 422. ``None``:
            no limit (replaying a future-dated simulation), as is ``inf``.
    Raises:
        engine.serve.history.HistoryLocked: another server holds ``history_path``'s lock.
        sqlite3.DatabaseError: the file is not a SQLite database.
    """

    def __init__(self, bundle: ModelBundle, history_path: str | Path, *, cache_bytes: int = 256 * 2**20,
                 shadow: bool = False, case_db: str | Path | None = None, explain: str = "occlusion",
                 start_worker: bool = True, sync: str = "full", explain_cpu: float = DEFAULT_EXPLAIN_CPU,
                 max_ahead_s: float | None = DEFAULT_MAX_AHEAD_S):
        self.bundle, self.spec, self.shadow, self.sync = bundle, bundle.spec, shadow, sync
        if max_ahead_s is not None and not max_ahead_s >= 0:
            raise ValueError(f"max_ahead_s: expected seconds >= 0 or None, got {max_ahead_s!r}")
        self.max_ahead_ns = None if max_ahead_s is None or math.isinf(max_ahead_s) else int(max_ahead_s * 1e9)
        self.calibrated = bool(getattr(bundle, "calibrated", False))
        self.history_path = Path(history_path)
        private_dirs(self.history_path.parent)
        self.history_lock = HistoryLock(self.history_path)  # before any write: one server per file
        if not self.history_lock.supported:  # Windows
            warnings.warn(f"no lock on the history store {self.history_path}: this platform has no fcntl; run only "
                          "one server per history file", RuntimeWarning, stacklevel=2)
        try:
            self.history = HistoryStore(self.history_path, sync)
            self.committer = GroupCommitter(self.history_path, sync)
        except BaseException:
            self.history_lock.release()
            raise
        self.inflight: dict[str, dict] = {}  # transaction id -> staged row, until its commit returns
        try:
            self.cache = EntityCache(bundle, self.history, cache_bytes)  # builds (and compiles) the scorer
        except BaseException:  # close what was opened: the checkpoint thread and both connections
            self.committer.stop()
            self.history.close()
            self.history_lock.release()
            raise
        self.cache.before_rebuild = self.committer.flush  # a rebuild reads history: in-flight rows first
        self.lock = threading.Lock()
        self.case_db = Path(case_db) if case_db is not None else None
        # read only: a missing case store is not created here (nor ever in shadow mode)
        self.refresh_thresholds()
        self.id_column = self.spec.id or TRANSACTION_ID_KEY
        self.ts_column = self.spec.timestamp.column or "/".join(self.spec.timestamp.parts.values())
        self.counts = {"scored": 0, "duplicates": 0, "rejected": 0, "flagged": 0}
        self.worker: CaseWorker | None = None
        self.supervisor = Supervisor(self)  # restarts a dead case worker, refreshes the thresholds
        if not shadow:
            self.worker = CaseWorker(bundle, self.history_path, self.case_db, explain, explain_cpu=explain_cpu)
            if start_worker:
                self.worker.start()
                self.supervisor.start()
        self.started = time.time()

    def refresh_thresholds(self) -> dict:
        """Re-read the thresholds in force (:func:`engine.cases.thresholds.thresholds_in_force`: set on
        the dashboard's Queue page, else the checkpoint's); later requests use them. Returns them."""
        self.thresholds = thresholds_in_force(self.bundle, db_path=self.case_db)
        return self.thresholds

    def close(self) -> None:
        self.supervisor.stop()
        if self.worker is not None:
            self.worker.stop()
        self.committer.stop()
        self.history.close()
        self.history_lock.release()

    # ------------------------------------------------------------------ scoring
    def probability(self, logit: float) -> float:
        """The answered probability of a logit: the checkpoint's calibration map, else the sigmoid."""
        return float(self.bundle.probability(np.array([logit]))[0]) if self.calibrated else _sigmoid(logit)

    def _stored_body(self, stored: dict[str, Any]) -> dict[str, Any]:
        # reasons are not recomputed for a duplicate (docs/serving.md); calibrated is known for this model only
        return {"transaction_id": stored["transaction_id"], "entity_id": stored["entity_id"],
                "probability": stored["probability"], "logit": stored.get("logit"), "decision": stored["decision"],
                "reasons": [], "model_sha256": stored["model_sha256"], "duplicate": True, "shadow": self.shadow,
                "calibrated": self.calibrated if stored["model_sha256"] == self.bundle.sha256 else None}

    def _prepare(self, row: dict[str, Any], pending: dict[str, tuple]) -> Outcome | None:
        """Idempotency and order checks; an Outcome for a duplicate, None to score (lock held)."""
        tid = row["transaction_id"]
        stored = self.history.get(tid) or self.inflight.get(tid)
        if stored is None and tid in pending:
            stored = pending[tid][1]
        if stored is not None:
            if stored["row_json"] != row_json(row):
                raise RecordError(self.id_column, tid, "transaction id already used by a different transaction")
            return Outcome(self._stored_body(stored), duplicate=True)
        if self.max_ahead_ns is not None and row["ts_ns"] > time.time_ns() + self.max_ahead_ns:
            raise AheadOfClock(self.ts_column, str(row["timestamp"]), ahead_message(row["ts_ns"], self.max_ahead_ns))
        last = self.cache.last_time_ns(row["entity_id"])
        if last is not None and row["ts_ns"] < last:
            raise _OutOfOrder(self.ts_column, str(row["timestamp"]),
                              f"timestamp {row['timestamp']} is earlier than entity {row['entity_id']}'s last "
                              f"accepted transaction ({_ts(last)}); an entity's transactions must arrive in time order")
        return None

    def _score_row(self, row: dict[str, Any], pending: dict[str, tuple]) -> Outcome:
        """Score one validated row, staging its history record in ``pending`` (lock held)."""
        hit = row["entity_id"] in self.cache.sizes
        dup = self._prepare(row, pending)
        if dup is not None:
            return dup
        e, tid = row["entity_id"], row["transaction_id"]
        try:
            logit, reasons = self.cache.score(e, row)
        except NonFiniteScoreError as err:
            raise ServiceError(500, [{"loc": ["body"], "msg": str(err), "type": "non_finite_score",
                                      "input": tid}]) from None
        return self._finish(row, logit, reasons, hit, pending)

    def _finish(self, row: dict[str, Any], logit: float, reasons: list, hit: bool, pending: dict[str, tuple]) -> Outcome:
        """Probability, decision and the staged history record of a scored row (lock held)."""
        e, tid = row["entity_id"], row["transaction_id"]
        prob = self.probability(logit)
        thr = self.thresholds
        decision = decision_band(prob, thr["review"], thr["decline"])
        flagged = prob >= thr["review"]
        if flagged and not reasons:  # a flag never comes without a reason (docs/serving.md)
            reasons = [NO_SIMPLE_FACT]
        received = utcnow()
        rec = (tid, e, row["ts_ns"], row_json(row), logit, prob, decision, int(flagged), self.bundle.sha256, received)
        pending[tid] = (rec, {"transaction_id": tid, "entity_id": e, "row_json": rec[3], "logit": logit, "probability": prob,
                              "decision": decision, "model_sha256": self.bundle.sha256, "received_at": received})
        body = {"transaction_id": tid, "entity_id": e, "probability": prob, "logit": logit, "decision": decision,
                "reasons": reasons, "model_sha256": self.bundle.sha256, "duplicate": False, "shadow": self.shadow,
                "calibrated": self.calibrated}
        return Outcome(body, flagged=flagged, cache_hit=hit)

    def _submit(self, pending: dict[str, tuple]):
        """Stage ``pending`` as in flight and hand it to the group committer (lock held)."""
        if not pending:
            return None
        for tid, (_, stored) in pending.items():
            self.inflight[tid] = stored
        return self.committer.submit([rec for rec, _ in pending.values()])

    def _forget(self, entities, pending: dict[str, tuple]) -> None:
        """Undo a request that failed after its first cache step (lock held): evict the entities
        it touched (rebuilt from the committed history on next use) and drop its in-flight rows."""
        for e in entities:
            self.cache.evict(e)
        for tid in pending:
            self.inflight.pop(tid, None)

    def _durable(self, ticket, pending: dict[str, tuple]) -> None:
        """Wait for the commit of ``ticket``; 503 if it failed (the service then refuses all
        requests: :attr:`GroupCommitter.broken`), 500 if the store refused this request's rows.
        On any failure the request's entities are evicted (:meth:`_forget`)."""
        if ticket is None:
            return
        ok = False
        try:
            self.committer.wait(ticket)
            ok = True
        except RecordsRefused as err:
            raise ServiceError(500, [{"loc": ["body"], "msg": f"{err}; nothing was accepted",
                                      "type": "history_refused"}]) from None
        except OSError as err:
            raise ServiceError(503, [{"loc": ["body"], "msg": f"{err}; nothing was accepted; the service refuses "
                                      "requests until restarted", "type": "history_unavailable"}]) from None
        finally:
            with self.lock:
                if ok:
                    for tid in pending:
                        self.inflight.pop(tid, None)
                else:
                    self._forget({rec[1] for rec, _ in pending.values()}, pending)

    def _check_open(self) -> None:
        if self.committer.broken:
            raise ServiceError(503, [{"loc": ["body"], "msg": f"history store unavailable ({self.committer.broken}); "
                                      "restart the service", "type": "history_unavailable"}])

    def score_one(self, rec: dict[str, Any]) -> Outcome:
        """Score one posted transaction (raw column names -> values).

        Raises:
            ServiceError: 422 malformed (names the column and reason), 409 out of order or a
                reused transaction id, 500 non-finite score or rows the store refused, 503 history
                store unavailable. Any other exception propagates (HTTP 500) with the entity evicted.
        """
        try:
            row = canonical_row(rec, self.spec)
        except RecordError as err:
            self.counts["rejected"] += 1
            raise ServiceError(422, [err.detail()]) from None
        return self._score_canonical(row)

    def _score_canonical(self, row: dict[str, Any]) -> Outcome:
        """:meth:`score_one` after :func:`canonical_row` (same errors but the 422)."""
        pending: dict[str, tuple] = {}
        with self.lock:
            self._check_open()
            try:
                out = self._score_row(row, pending)
                ticket = self._submit(pending)
            except RecordError as err:  # raised before any cache step: nothing to undo
                self.counts["rejected"] += 1
                raise ServiceError(refusal_status(err), [err.detail()]) from None
            except BaseException:
                self._forget([row["entity_id"]], pending)
                raise
        self._durable(ticket, pending)
        with self.lock:
            self._count(out)
        if out.flagged and self.worker is not None:
            self.worker.notify()
        return out

    def score_batch(self, recs: list[dict[str, Any]]) -> dict[str, Any]:
        """Score posted transactions in order (``POST /v1/score/batch``); one durable commit for all
        accepted ones; every item in ``results`` or ``rejected``. See
        :func:`engine.serve.waves.score_batch` (returns and errors there)."""
        from engine.serve.waves import score_batch

        return score_batch(self, recs)

    def score_rows(self, rows: list[dict[str, Any]]) -> list[tuple]:
        """Score the canonical rows of separate requests together (the dynamic batches of
        :mod:`engine.serve.scorer`): one ``("ok", body, flagged)`` or ``("err", status, detail)``
        per row, each as if posted alone; see :func:`engine.serve.waves.score_rows`."""
        from engine.serve.waves import score_rows

        return score_rows(self, rows)

    def count_rejected(self, n: int) -> None:
        """Count ``n`` transactions refused before they reached the service (HTTP layer)."""
        with self.lock:
            self.counts["rejected"] += n

    def metrics_state(self) -> dict[str, Any]:
        """What ``GET /metrics`` reports of the service: ``cache`` (:meth:`EntityCache.stats`),
        ``counts`` (scored, duplicates, rejected, flagged) and ``worker`` (case worker counters, or
        None in shadow mode)."""
        with self.lock:
            cache, counts = self.cache.stats(), dict(self.counts)
        w = self.worker
        return {"cache": cache, "counts": counts,
                "worker": None if w is None else {k: getattr(w, k) for k in ("cases_written", "explained", "errors",
                                                                               "backlog")}}

    def _count(self, out: Outcome) -> None:
        c = self.counts
        if out.duplicate:
            c["duplicates"] += 1
        else:
            c["scored"] += 1
            c["flagged"] += int(out.flagged)

    # ------------------------------------------------------------------ reading
    def health(self) -> dict[str, Any]:
        """Liveness and state: model, history size, cache statistics, thresholds, worker state."""
        with self.lock:
            n = self.history.count()
            cache = self.cache.stats()
        w = self.worker
        return {"status": "degraded" if w is not None and w.failed else "ok", "model_sha256": self.bundle.sha256,
                "spec": self.spec.name, "shadow": self.shadow,
                "history_transactions": n, "history_commits": self.committer.commits,
                "history_broken": self.committer.broken, "cache": cache, "thresholds": self.thresholds,
                "case_worker": None if w is None else {"alive": w.is_alive(), "pid": w.pid, "restarts": w.restarts,
                                                       "cases_written": w.cases_written,
                                                       "explained": w.explained, "errors": w.errors,
                                                       "backlog": w.backlog, "explain": w.explain_method,
                                                       "explain_cpu": w.explain_cpu if w.explain_method != "none" else None,
                                                       "paused_s": round(w.paused_s, 1),
                                                       "last_error": w.last_error},
                "uptime_s": round(time.time() - self.started, 1)}

    def explanation(self, transaction_id: str) -> dict[str, Any] | None:
        with self.lock:
            return self.history.explanation(transaction_id)


class _OutOfOrder(RecordError):
    """A transaction older than its entity's last accepted one (HTTP 409)."""


class AheadOfClock(RecordError):
    """A transaction dated more than ``max_ahead_s`` after the server's clock (HTTP 422, error
    ``type`` ``timestamp_ahead`` on every path)."""

    def detail(self) -> dict[str, Any]:
        return {**super().detail(), "type": "timestamp_ahead"}



def ahead_message(ts_ns: int, max_ahead_ns: int) -> str:
    """Why a timestamp ``ts_ns`` (ns since the epoch, UTC) more than ``max_ahead_ns`` after this
    machine's clock is refused, with both in minutes."""
    ahead_min = (ts_ns - time.time_ns()) / 6e10
    return (f"timestamp (UTC) is {ahead_min:,.1f} min after this server's clock; at most {max_ahead_ns / 6e10:g} min "
            "ahead is accepted (serve --max-ahead-minutes; timestamps are UTC)")


def refusal_status(err: RecordError) -> int:
    """HTTP status of a refusal raised by the idempotency, clock and order checks: 422 for a
    timestamp ahead of the clock, else 409 (out of order, a reused transaction id)."""
    return 422 if isinstance(err, AheadOfClock) else 409


def _ts(ns: int) -> str:
    import pandas as pd

    return str(pd.Timestamp(ns, unit="ns"))
