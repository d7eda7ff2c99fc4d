"""Cases and explanations for flagged transactions, off the hot path.

The request path only appends the scored transaction (with ``flagged = 1`` when its probability
is at or above the review threshold) to the history store and wakes this worker; the response
never waits for it. The worker reads the flagged transactions after its cursor (stored in
the history store's ``meta`` table, so a restart resumes where it stopped and a ``kill -9``
loses no case of an acknowledged transaction), and for each batch:

1. opens or refreshes one case per (model, service source, entity) in the case store
   (:meth:`engine.cases.store.CaseStore.upsert_cases`, actor ``system``) with the entity's facts
   from the history store (highest probability and its transaction, first/last time, largest
   amount, count, known frauds); the source id is ``"<model sha256>/service:<spec name>"``
   (:func:`service_source_id`), so the cases are listed by ``CaseStore.queue(sha,
   source_id=...)`` without any file;
2. explains each flagged transaction with occlusion (:mod:`engine.explain.occlusion`: the
   logit change when one earlier transaction of the window is removed) on the entity's history
   from the store, derives attribution-based reason codes (:func:`engine.trust.reasons.reason_codes`)
   and stores both in the history store's ``explanations`` table with the case id
   (``GET /v1/explanations/{transaction_id}``), with the service's (calibrated) probability,
   every number finite or ``null`` (:func:`explain_flagged`);
3. advances the cursor.

Explanations cost far more than scoring (occlusion: one forward pass per earlier transaction of
the window), so the worker keeps to a CPU budget: after each explanation it sleeps long enough
that its thread's CPU time stays at most ``explain_cpu`` (a fraction of one core, default
:data:`DEFAULT_EXPLAIN_CPU`) of the wall time. Cases are opened at once; explanations then lag
behind a burst of flags (the backlog is ``GET /healthz``'s ``case_worker.backlog`` and the
``fraudlens_serve_worker_backlog`` gauge) instead of slowing the scoring path, which shares the
cores.

The worker runs in a process of its own (:class:`CaseWorker`), so its Python work never holds the
scoring path's interpreter lock. The service re-reads the thresholds in force itself
(:mod:`engine.serve.supervisor`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections import OrderedDict
from pathlib import Path
import pandas as pd

from engine.model.checkpoint import ModelBundle
from engine.serve.history import HistoryStore

log = logging.getLogger("fraudlens.serve")
CURSOR_KEY = "case_cursor"
EXPLAIN_METHODS = ("occlusion", "none")
#: default CPU budget of the explanation worker, as a fraction of one core
DEFAULT_EXPLAIN_CPU = 0.25
#: seconds the worker waits after a batch before the next one, so the flags of that time share
#: one case upsert (a case then appears in the queue at most about this long after its flag)
CASE_BATCH_S = 0.25
#: flagged transactions per step (a full batch is followed by the next at once, not after CASE_BATCH_S)
BATCH = 100
#: niceness of the worker process (its CPU yields to the scoring path's)
WORKER_NICENESS = 10
#: entities whose running case summary the worker keeps (least recently used dropped; a dropped
#: entity's summary is read from its whole history again)
SUMMARY_CACHE = 20_000


def service_source_id(bundle: ModelBundle) -> str:
    """The case store source id of the service's cases: ``"<model sha256>/service:<spec name>"``."""
    from engine.cases.store import source_id

    return source_id(bundle.sha256, f"service:{bundle.spec.name}")


def explain_flagged(bundle: ModelBundle, frame: pd.DataFrame, transaction_id: str) -> dict:
    """Occlusion explanation and reason codes of one transaction of an entity's history frame.

    Returns:
        ``{"explanation": Explanation.to_dict() without extras, "reasons": [Reason.to_dict()],
        "probability": the fraud probability the service answered, "calibrated": bool}``, every
        number finite or ``None`` (JSON-compliant). ``explanation.score_probability`` is the
        sigmoid of the model's logit (uncalibrated, as in every explanation); ``probability`` is
        the service's: the checkpoint's calibration map of the logit when it has one
        (``calibrated`` true), the stored ``probability`` of the transaction when ``frame`` has
        that column (the history store's frame), so it equals the ``POST /v1/score`` response.
        A query reason with no measured weight has ``"weight": null`` (NaN in
        :class:`engine.trust.reasons.Reason`; :meth:`~engine.trust.reasons.Reason.to_dict`).
    """
    import numpy as np

    from engine.explain.context import build_context
    from engine.explain.occlusion import explain
    from engine.serve.record import json_finite
    from engine.trust.reasons import reason_codes

    ctx = build_context(bundle, frame, transaction_id)
    expl = explain(ctx)
    reasons = reason_codes(ctx, {"occlusion": expl})
    d = expl.to_dict()
    d.pop("extras", None)
    calibrated = bool(getattr(bundle, "calibrated", False))
    stored = frame.loc[frame["transaction_id"] == transaction_id, "probability"] if "probability" in frame else []
    # the stored answer, else the checkpoint's map of the logit (ModelBundle.probability: the
    # sigmoid for an uncalibrated checkpoint)
    prob = float(stored.iloc[-1]) if len(stored) else float(bundle.probability(np.array([expl.score_logit]))[0])
    return json_finite({"explanation": d, "reasons": [r.to_dict() for r in reasons], "probability": prob,
                        "calibrated": calibrated})


class _Shared:
    """What the service process and the worker process share (a ``spawn`` context's objects).
    Nothing here can block the service: the wake-up is a semaphore (``release`` never waits, and
    a process killed while waiting on it holds nothing: a ``multiprocessing.Event``'s ``set``
    waits for every waiter under a shared lock, so a worker killed while idle froze the service's
    next flag, and a service killed inside ``set`` left the worker stuck); the stop, idle and
    pending flags, the counters and the last error are plain shared memory (one writer each)."""

    COUNTERS = ("cases_written", "explained", "errors", "backlog")
    STOP, IDLE, PENDING = 0, 1, 2

    def __init__(self, ctx):
        self.wake = ctx.Semaphore(0)
        self.flags = ctx.RawArray("b", 3)
        self.counts = {k: ctx.RawValue("q", 0) for k in self.COUNTERS}  # one writer: the worker
        self.paused_s = ctx.RawValue("d", 0.0)
        self.last_error = ctx.RawArray("c", 512)

    def record_error(self, text: str) -> None:
        """Count one error and keep ``text`` (UTF-8, at most 500 bytes) as the last one."""
        self.counts["errors"].value += 1
        self.last_error.value = text.encode("utf-8")[:500]


def _counter(name: str):
    def get(self) -> int:
        return int(self.shared.counts[name].value)

    def put(self, value: int) -> None:
        self.shared.counts[name].value = int(value)

    return property(get, put, doc=f"{name} (shared with the worker process)")


class CaseWorker:
    """Cases and explanations of flagged transactions, in a process of its own (module docstring).

    :meth:`start` spawns the process (:func:`_worker_main`: it loads the checkpoint from
    ``bundle.path``, checks its sha256 and runs :meth:`run`). A thread of the service would share
    the service's interpreter lock: the explanations' Python work (pandas, the context build) then
    delayed requests by up to the interpreter's 5 ms switch interval. The process is niced
    (:data:`WORKER_NICENESS`) and ends with the service process (Linux: ``PR_SET_PDEATHSIG``;
    elsewhere it watches the parent's sentinel before each explanation and at least once a
    second), so a ``kill -9`` of the service leaves no worker behind. It shares only state that
    cannot block either side (:class:`_Shared`: a wake-up semaphore, the stop flag, counters, last
    error; read by ``GET /healthz`` and ``/metrics``). A worker that died is restarted by
    :class:`engine.serve.supervisor.Supervisor`.
    :meth:`step` can also be run in the calling process (tests).

    Args:
        bundle: the model (its ``path`` is reloaded by the worker process).
        history_path: the history store file (the worker opens its own connection).
        case_db: the case store file (``None``: :func:`engine.cases.store.default_db_path`).
        explain_method: ``"occlusion"`` or ``"none"`` (cases only).
        explain_cpu: CPU budget of the explanations, a fraction of one core in (0, 1]
            (module docstring; 1 = no pause).
        shared: the wake-up, flags and counters to use (the worker process gets the service's).

    Raises:
        ValueError: an unknown explain method or a budget outside (0, 1].
    """

    cases_written = _counter("cases_written")
    explained = _counter("explained")
    errors = _counter("errors")
    backlog = _counter("backlog")  # flagged transactions after the cursor at the last step

    def __init__(self, bundle: ModelBundle, history_path: Path, case_db: Path | None, explain_method: str,
                 explain_cpu: float = DEFAULT_EXPLAIN_CPU, shared: _Shared | None = None):
        if explain_method not in EXPLAIN_METHODS:
            raise ValueError(f"explain method: expected one of {EXPLAIN_METHODS}, got {explain_method!r}")
        if not 0.0 < explain_cpu <= 1.0:
            raise ValueError(f"explain CPU budget: expected a fraction of one core in (0, 1], got {explain_cpu!r}")
        self.explain_cpu = float(explain_cpu)
        self.bundle, self.history_path, self.case_db = bundle, Path(history_path), case_db
        self.explain_method = explain_method
        self.source = service_source_id(bundle)
        self.shared = shared if shared is not None else _Shared(multiprocessing.get_context("spawn"))
        self.process = None
        self.started = False  # start() was called: a dead process is then a failure (restarted)
        self.restarts = 0
        self._watch_parent = False  # set in the worker process
        # entity -> its case summary so far (HistoryStore.entity_summary(since=...)), LRU order
        self.summaries: OrderedDict[str, dict] = OrderedDict()

    @property
    def paused_s(self) -> float:
        """Seconds slept to keep to the CPU budget."""
        return float(self.shared.paused_s.value)

    @paused_s.setter
    def paused_s(self, value: float) -> None:
        self.shared.paused_s.value = float(value)

    @property
    def last_error(self) -> str:
        return self.shared.last_error.value.decode("utf-8", "replace")

    def start(self) -> None:
        """Spawn the worker process.

        Raises:
            ValueError: the bundle was not loaded from a checkpoint directory (``path`` is None).
        """
        if self.bundle.path is None:
            raise ValueError("the case worker process loads the checkpoint from disk: the bundle has no path")
        ctx = multiprocessing.get_context("spawn")
        self.shared.flags[_Shared.STOP] = 0
        self.process = ctx.Process(
            target=_worker_main, name="fraudlens-cases", daemon=True,
            args=(str(self.bundle.path), self.bundle.sha256, str(self.history_path),
                  None if self.case_db is None else str(self.case_db), self.explain_method, self.explain_cpu,
                  self.shared, os.getpid()))
        self.process.start()
        self.started = True

    def is_alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    @property
    def pid(self) -> int | None:
        """The worker process's id (None before :meth:`start`)."""
        return None if self.process is None else self.process.pid

    @property
    def failed(self) -> bool:
        """Started, not asked to stop, and its process is gone (crashed, killed, refused the checkpoint)."""
        return self.started and not self.shared.flags[_Shared.STOP] and not self.is_alive()

    @property
    def idle(self) -> bool:
        """The worker had caught up with the history at its last step."""
        return bool(self.shared.flags[_Shared.IDLE])

    def notify(self) -> None:
        """Wake the worker (flagged transactions were appended). Never blocks; one wake-up per
        batch of calls (the pending flag), not one per flagged request."""
        f = self.shared.flags
        if not f[_Shared.PENDING]:
            f[_Shared.PENDING] = 1
            self.shared.wake.release()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the process to stop after its current transaction; killed after ``timeout`` s."""
        self.shared.flags[_Shared.STOP] = 1
        self.shared.wake.release()
        if self.process is not None:
            self.process.join(timeout)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)

    def should_stop(self) -> bool:
        """Asked to stop, or (in the worker process) the service process is gone."""
        if self.shared.flags[_Shared.STOP]:
            return True
        if self._watch_parent:
            parent = multiprocessing.parent_process()
            return parent is not None and not parent.is_alive()
        return False

    def _sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, returning early when :meth:`should_stop` (checked every 0.1 s)."""
        end = time.monotonic() + seconds
        while not self.should_stop():
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.1))

    def _wait_for_work(self, seconds: float) -> None:
        """Wait for :meth:`notify` (at most ``seconds``), then clear the pending wake-ups."""
        sh = self.shared
        sh.wake.acquire(timeout=seconds)
        sh.flags[_Shared.PENDING] = 0
        while sh.wake.acquire(block=False):
            pass

    def run(self, watch_parent: bool = False) -> None:
        """The worker loop (in the worker process): steps until stopped or, with
        ``watch_parent``, until the service process is gone (checked at least once a second and
        before each explanation)."""
        import torch

        from engine.cases.store import CaseStore

        self._watch_parent = watch_parent
        torch.set_num_threads(1)
        history = HistoryStore(self.history_path)
        store = CaseStore(self.case_db)
        try:
            while not self.should_stop():
                try:
                    n = self.step(history, store)
                except Exception as e:  # noqa: BLE001 - logged, counted, retried on the next wake
                    self.shared.record_error(f"{type(e).__name__}: {e}")
                    log.exception("case worker step failed")
                    n = 0
                    self._sleep(1.0)
                if not n:
                    self.shared.flags[_Shared.IDLE] = 1
                    self._wait_for_work(1.0)
                elif n < BATCH:  # let the next flags gather: one upsert per CASE_BATCH_S, not per request
                    self._sleep(CASE_BATCH_S)
        finally:
            history.close()
            store.close()

    def _keep_budget(self, cpu_s: float) -> None:
        """Sleep so that ``cpu_s`` of work is at most ``explain_cpu`` of the time it occupies."""
        pause = cpu_s * (1.0 / self.explain_cpu - 1.0)
        if pause > 0:
            self.paused_s += pause
            self._sleep(pause)

    def _summary(self, history: HistoryStore, entity_id: str) -> dict:
        """The entity's case summary, reading only its history rows since the last call."""
        out = history.entity_summary(entity_id, since=self.summaries.pop(entity_id, None))
        self.summaries[entity_id] = out
        while len(self.summaries) > SUMMARY_CACHE:
            self.summaries.popitem(last=False)
        return out

    def step(self, history: HistoryStore, store) -> int:
        """One batch of at most :data:`BATCH` flagged transactions; how many (0: none)."""
        cursor = int(history.meta(CURSOR_KEY) or 0)
        items = history.flagged_after(cursor, BATCH)
        self.backlog = history.flagged_count_after(cursor)
        if not items:
            return 0
        self.shared.flags[_Shared.IDLE] = 0
        sha = self.bundle.sha256
        entities = list(dict.fromkeys(e for _, _, e in items))
        store.upsert_cases(sha, pd.DataFrame([self._summary(history, e) for e in entities]), source_id=self.source)
        self.cases_written += len(entities)
        if self.explain_method != "none":
            frames: dict[str, pd.DataFrame] = {}
            for _, tid, e in items:
                if self.should_stop():
                    return len(items)  # cursor not advanced: the rest is explained after a restart
                if e not in frames:
                    frames[e] = history.entity_frame(e)
                case = store.find_case(sha, self.source, e)
                cpu0 = time.thread_time()
                out = explain_flagged(self.bundle, frames[e], tid)
                history.put_explanation(tid, e, None if case is None else int(case["id"]), self.explain_method, out)
                self.explained += 1
                self._keep_budget(time.thread_time() - cpu0)
        history.set_meta(CURSOR_KEY, str(items[-1][0]))
        return len(items)


def _die_with_parent(parent_pid: int) -> None:
    """Linux: ask the kernel to SIGTERM this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``),
    so a ``kill -9`` of the service ends the worker at once even mid-explanation. Best effort:
    elsewhere (and if the call fails) :meth:`CaseWorker.should_stop` watches the parent."""
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # died before the call
        os._exit(0)


def _worker_main(model_path: str, sha256: str, history_path: str, case_db: str | None, explain_method: str,
                 explain_cpu: float, shared: _Shared, parent_pid: int) -> None:
    """Entry point of the worker process: load and check the checkpoint, then :meth:`CaseWorker.run`.
    Any failure is recorded in the shared state (``errors``, ``last_error``) before it exits; the
    service restarts it (:class:`engine.serve.supervisor.Supervisor`)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s fraudlens case worker %(levelname)s %(message)s")
    try:
        _die_with_parent(parent_pid)
        if hasattr(os, "nice"):  # not on Windows
            try:
                os.nice(WORKER_NICENESS)
            except OSError:
                pass
        from engine.model.checkpoint import load_checkpoint

        bundle = load_checkpoint(Path(model_path))
        if bundle.sha256 != sha256:
            raise ValueError(f"the checkpoint at {model_path} changed since the service loaded it "
                             f"(sha256 {bundle.sha256[:12]}, expected {sha256[:12]})")
        w = CaseWorker(bundle, Path(history_path), None if case_db is None else Path(case_db), explain_method,
                       explain_cpu, shared=shared)
        w.run(watch_parent=True)
    except Exception as e:  # noqa: BLE001 - reported through the shared state (healthz, metrics)
        shared.record_error(f"worker process: {type(e).__name__}: {e}")
        log.exception("case worker process failed")
