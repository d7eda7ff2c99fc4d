"""The scoring service's supervisor thread: restarts a case worker process that died, re-reads
the thresholds in force.

:class:`Supervisor` ticks once a second (:meth:`Supervisor.tick`, also callable by hand in tests):

* a case worker (:class:`engine.serve.casework.CaseWorker`) that died (crash, ``kill -9``, a
  checkpoint it refused) is restarted after a back-off that doubles from 1 s to
  :data:`RESTART_BACKOFF_MAX_S` while it keeps failing, and resets after a minute alive; until then
  ``GET /healthz`` says ``"degraded"`` (:attr:`CaseWorker.failed`);
* every :data:`THRESHOLD_REFRESH_S` seconds the service re-reads the
  thresholds (:meth:`engine.serve.service.ScoringService.refresh_thresholds`: set on the
  dashboard's Queue page apply without a restart).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger("fraudlens.serve")
#: longest wait before restarting a case worker process that keeps failing (seconds)
RESTART_BACKOFF_MAX_S = 300.0
#: seconds between two reads of the thresholds in force
THRESHOLD_REFRESH_S = 30.0


class Supervisor:
    """Supervision of one :class:`engine.serve.service.ScoringService` (module docstring)."""

    def __init__(self, service: Any):
        self.service = service
        self.state: dict[str, float] = {}
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="fraudlens-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._closing.set()

    def tick(self, now: float, state: dict[str, float] | None = None) -> None:
        """One step at monotonic time ``now`` (seconds); ``state`` carries the back-off between
        ticks (default: this supervisor's)."""
        state = self.state if state is None else state
        w = self.service.worker
        if w is not None and w.failed:
            if "restart_at" not in state:
                state["restart_at"] = now + state.get("backoff", 1.0)
                log.warning("case worker process %s is gone (exit code %s; last error: %s); restarting in %.0f s",
                            w.pid, w.process.exitcode if w.process else None, w.last_error or "-",
                            state["restart_at"] - now)
            elif now >= state["restart_at"]:
                del state["restart_at"]
                state["backoff"] = min(2.0 * state.get("backoff", 1.0), RESTART_BACKOFF_MAX_S)
                state["started_at"] = now
                w.restarts += 1
                w.start()
        elif w is not None and now - state.get("started_at", now) > 60.0:
            state["backoff"] = 1.0  # alive for a minute: the next failure starts the back-off again
        if now >= state.setdefault("thresholds_at", now + THRESHOLD_REFRESH_S):
            state["thresholds_at"] = now + THRESHOLD_REFRESH_S
            self.service.refresh_thresholds()

    def _loop(self) -> None:
        while not self._closing.wait(1.0):
            try:
                self.tick(time.monotonic())
            except Exception:  # noqa: BLE001 - logged; the next tick tries again
                log.exception("service supervision failed")
