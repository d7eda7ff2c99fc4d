"""Cases and explanations for flagged transactions, off the hot path.

The request path only appends the scored transaction (with ``flagged = 1`` when its probability
is at or above the review threshold) to the history store and wakes this worker; the response
never waits for it. The worker thread reads the flagged transactions after its cursor (stored in
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
cores and the interpreter lock.

Every ``THRESHOLD_REFRESH_S`` seconds it also re-reads the thresholds in force
(:func:`engine.cases.thresholds.thresholds_in_force`: set on the dashboard's Queue page, else the
checkpoint's), so a threshold change applies to later requests without a restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable

import pandas as pd

from engine.model.checkpoint import ModelBundle
from engine.serve.history import HistoryStore

log = logging.getLogger("fraudlens.serve")
THRESHOLD_REFRESH_S = 30.0
CURSOR_KEY = "case_cursor"
EXPLAIN_METHODS = ("occlusion", "none")
#: default CPU budget of the explanation worker, as a fraction of one core
DEFAULT_EXPLAIN_CPU = 0.25
#: seconds the worker waits after a batch before the next one, so the flags of that time share
#: one case upsert (a case then appears in the queue at most about this long after its flag)
CASE_BATCH_S = 0.25
#: entities whose running case summary the worker keeps (least recently used dropped; a dropped
#: entity's summary is read from its whole history again)
SUMMARY_CACHE = 100_000


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


class CaseWorker(threading.Thread):
    """Background thread: cases and explanations of flagged transactions (module docstring).

    Args:
        bundle: the model.
        history_path: the history store file (the worker opens its own connection).
        case_db: the case store file (``None``: :func:`engine.cases.store.default_db_path`).
        explain_method: ``"occlusion"`` or ``"none"`` (cases only).
        on_thresholds: called with the thresholds dict whenever they are re-read.
        explain_cpu: CPU budget of the explanations, a fraction of one core in (0, 1]
            (module docstring; 1 = no pause).

    Raises:
        ValueError: an unknown explain method or a budget outside (0, 1].
    """

    def __init__(self, bundle: ModelBundle, history_path: Path, case_db: Path | None, explain_method: str,
                 on_thresholds: Callable[[dict], None], explain_cpu: float = DEFAULT_EXPLAIN_CPU):
        super().__init__(name="fraudlens-cases", daemon=True)
        if explain_method not in EXPLAIN_METHODS:
            raise ValueError(f"explain method: expected one of {EXPLAIN_METHODS}, got {explain_method!r}")
        if not 0.0 < explain_cpu <= 1.0:
            raise ValueError(f"explain CPU budget: expected a fraction of one core in (0, 1], got {explain_cpu!r}")
        self.explain_cpu = float(explain_cpu)
        self.paused_s = 0.0  # seconds slept to keep to the budget
        self.backlog = 0  # flagged transactions after the cursor at the last step
        self.bundle, self.history_path, self.case_db = bundle, history_path, case_db
        self.explain_method, self.on_thresholds = explain_method, on_thresholds
        self.source = service_source_id(bundle)
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.idle = threading.Event()  # set when the worker has caught up with the history
        self.cases_written = self.explained = self.errors = 0
        self.last_error = ""
        # entity -> its case summary so far (HistoryStore.entity_summary(since=...)), LRU order
        self.summaries: OrderedDict[str, dict] = OrderedDict()

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.wake.set()
        self.join(timeout)

    def run(self) -> None:
        import torch

        from engine.cases.store import CaseStore
        from engine.cases.thresholds import thresholds_in_force

        torch.set_num_threads(1)
        history = HistoryStore(self.history_path)
        store = CaseStore(self.case_db)
        next_refresh = time.monotonic() + THRESHOLD_REFRESH_S
        try:
            while not self.stopping.is_set():
                if time.monotonic() >= next_refresh:
                    self.on_thresholds(thresholds_in_force(self.bundle, store))
                    next_refresh = time.monotonic() + THRESHOLD_REFRESH_S
                try:
                    did = self.step(history, store)
                except Exception as e:  # noqa: BLE001 - logged, counted, retried on the next wake
                    self.errors += 1
                    self.last_error = f"{type(e).__name__}: {e}"
                    log.exception("case worker step failed")
                    did = False
                    self.stopping.wait(1.0)
                if not did:
                    self.idle.set()
                    self.wake.wait(1.0)
                    self.wake.clear()
                else:  # let the next flags gather: one upsert per CASE_BATCH_S, not per request
                    self.stopping.wait(CASE_BATCH_S)
        finally:
            history.close()
            store.close()

    def _keep_budget(self, cpu_s: float) -> None:
        """Sleep so that ``cpu_s`` of work is at most ``explain_cpu`` of the time it occupies."""
        pause = cpu_s * (1.0 / self.explain_cpu - 1.0)
        if pause > 0:
            self.paused_s += pause
            self.stopping.wait(pause)

    def _summary(self, history: HistoryStore, entity_id: str) -> dict:
        """The entity's case summary, reading only its history rows since the last call."""
        out = history.entity_summary(entity_id, since=self.summaries.pop(entity_id, None))
        self.summaries[entity_id] = out
        while len(self.summaries) > SUMMARY_CACHE:
            self.summaries.popitem(last=False)
        return out

    def step(self, history: HistoryStore, store) -> bool:
        """One batch of flagged transactions; False when there was none."""
        cursor = int(history.meta(CURSOR_KEY) or 0)
        items = history.flagged_after(cursor, 100)
        self.backlog = history.flagged_count_after(cursor)
        if not items:
            return False
        self.idle.clear()
        sha = self.bundle.sha256
        entities = list(dict.fromkeys(e for _, _, e in items))
        store.upsert_cases(sha, pd.DataFrame([self._summary(history, e) for e in entities]), source_id=self.source)
        self.cases_written += len(entities)
        if self.explain_method != "none":
            frames: dict[str, pd.DataFrame] = {}
            for _, tid, e in items:
                if self.stopping.is_set():
                    return True  # cursor not advanced: the rest is explained after a restart
                if e not in frames:
                    frames[e] = history.entity_frame(e)
                case = store.find_case(sha, self.source, e)
                cpu0 = time.thread_time()
                out = explain_flagged(self.bundle, frames[e], tid)
                history.put_explanation(tid, e, None if case is None else int(case["id"]), self.explain_method, out)
                self.explained += 1
                self._keep_budget(time.thread_time() - cpu0)
        history.set_meta(CURSOR_KEY, str(items[-1][0]))
        return True
