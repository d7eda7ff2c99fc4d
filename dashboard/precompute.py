"""The Case page's background precompute, seen from the server (see docs/case-page.md).

* :func:`precompute_job`: one low-priority process (:mod:`engine.cases.precompute_job`) per
  loaded data + model + review threshold explains the flagged transactions, most risky first, into
  the explanation cache; a thread of the server builds each stored transaction's lead into
  :func:`lead_store`.
* :func:`wait_for_precompute`: the page asking for the transaction that process is explaining now
  waits for its result instead of computing it a second time.

Started by :func:`dashboard.state.start_precompute` (on a data load); nothing here calls ``st.*``
outside ``st.cache_resource``.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import streamlit as st

from dashboard import state

log = logging.getLogger("fraudlens.dashboard")

#: leads (reasons, key evidence, agreement) the background precompute builds ahead, per data + model
LEAD_STORE_MAX = 512


class LeadStore:
    """Thread-safe, bounded (least recently stored first out) ``transaction id -> Lead`` map that
    the precompute thread fills (:func:`precompute_job`) and the Case page reads
    (:func:`dashboard.components.lead.case_lead`). Entries are shared: read them, never mutate."""

    def __init__(self, max_entries: int = LEAD_STORE_MAX):
        import threading
        from collections import OrderedDict

        self._d: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = int(max_entries)

    def get(self, transaction_id: str):
        with self._lock:
            return self._d.get(str(transaction_id))

    def put(self, transaction_id: str, lead: Any) -> None:
        with self._lock:
            self._d[str(transaction_id)] = lead
            self._d.move_to_end(str(transaction_id))
            while len(self._d) > self.max_entries:
                self._d.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._d)


@st.cache_resource(show_spinner=False, max_entries=8)
def lead_store(data_sha: str, spec: str, max_rows: int | None, model_sha: str) -> LeadStore:
    """The :class:`LeadStore` of one (data sha256, spec, max_rows, model sha256), one per process."""
    return LeadStore()


@st.cache_resource(show_spinner=False, max_entries=4)
def precompute_job(data_sha: str, spec: str, max_rows: int | None, model_sha: str, review: float,
                    budget_s: float, _path: str, _model_path: str, _data_dir: str) -> dict[str, Any]:
    """ONE background precompute per (data, model, review threshold): a low-priority process
    (:mod:`engine.cases.precompute_job`) explains the flagged transactions, most risky first, into
    the explanation cache, and a thread of this process builds each stored result's lead (reasons,
    key evidence; :func:`dashboard.components.lead.build_lead`) into :func:`lead_store`, so the
    Case page only draws. Neither calls ``st.*``. The returned dict holds ``process``, ``thread``
    (the lead builder), ``status`` (path of the job's status file), ``stop`` and, when done,
    ``counts``."""
    import subprocess
    import threading

    from engine.cases import precompute_job as pj

    source = state._source(_path, spec, data_sha, max_rows)
    bundle = state.get_bundle(_model_path)
    scores = state._scores(_path, spec, data_sha, max_rows, _model_path, model_sha)
    flagged = scores.assign(flagged=scores["probability"].to_numpy() >= review)
    ids = state.flagged_order(flagged, state._ranking(_path, spec, data_sha, max_rows, _model_path, model_sha, review))
    sid, cparams = state._cache_ids(source, spec, max_rows, ())
    cache = state.explanation_cache(_data_dir)
    leads = lead_store(data_sha, spec, max_rows, model_sha)
    work = Path(_data_dir) / "precompute"
    work.mkdir(mode=0o700, parents=True, exist_ok=True)
    tag = f"{data_sha[:12]}-{model_sha[:12]}-{os.getpid()}-{abs(hash((spec, max_rows, review))) % 10**8}"
    status = work / f"{tag}.status.json"
    status.unlink(missing_ok=True)
    job_file = work / f"{tag}.job.json"
    pj.write_json_atomic(job_file, {
        "data": str(_path), "spec": str(spec), "max_rows": max_rows, "data_sha256": data_sha,
        "model": str(_model_path or ""), "model_sha256": model_sha, "cache": str(cache.path),
        "source_id": sid, "params": cparams, "ids": ids, "budget_s": float(budget_s), "status": str(status)})
    job: dict[str, Any] = {"stop": threading.Event(), "n": len(ids), "counts": None, "status": status,
                           "model_sha": model_sha, "source_id": sid}
    with open(work / f"{tag}.log", "ab") as err:
        job["process"] = subprocess.Popen(
            [sys.executable, "-m", "engine.cases.precompute_job", str(job_file)], stdin=subprocess.DEVNULL,
            stdout=err, stderr=err, cwd=str(Path(__file__).resolve().parents[1]),
            env={**os.environ, "OMP_NUM_THREADS": "1"})

    def build_leads() -> None:  # the Case page then only draws
        from dashboard.components.lead import build_lead

        n_done = 0
        while True:
            alive = job["process"].poll() is None
            st_ = pj.read_status(status) or {}
            done = list(st_.get("done") or [])
            for tid in done[n_done:]:
                if job["stop"].is_set():
                    break
                if leads.get(tid) is not None:
                    continue
                try:
                    expls = cache.get(model_sha, sid, tid, cparams)
                    if expls is not None:
                        leads.put(tid, build_lead(bundle, source.frame, tid, dict(expls)))
                except Exception as e:  # noqa: BLE001 - the page builds it on open and says why it failed
                    log.info("lead of %s not built ahead: %s: %s", tid, type(e).__name__, e)
            n_done = len(done)
            if job["stop"].is_set() and alive:
                job["process"].terminate()
                job["process"].wait(30)
                alive = False
            if not alive:
                if st_.get("state") == "done":
                    job["counts"] = st_.get("counts")
                    log.info("precompute: %s", job["counts"])
                else:  # error, or the process died without a final status
                    job["counts"] = {"error": st_.get("error") or f"exit status {job['process'].returncode}"}
                    log.warning("precompute stopped: %s", job["counts"]["error"])
                return
            job["stop"].wait(0.5)

    JOBS[:] = [j for j in JOBS if j["process"].poll() is None] + [job]
    job["thread"] = threading.Thread(target=build_leads, name="fraudlens-precompute-leads", daemon=True)
    job["thread"].start()
    return job


#: running precompute jobs of this process (:func:`precompute_job`), newest last
JOBS: list[dict[str, Any]] = []


def wait_for_precompute(cache: Any, model_sha: str, sid: str, transaction_id: str, cparams: dict,
                         wait_s: float | None = None) -> Any:
    """When a running precompute process is explaining ``transaction_id`` right now, wait (up to
    ``wait_s``, default :data:`engine.cases.explain_cache.WAIT_S`) for its result instead of
    computing it a second time; the stored explanations, or None (no such job, it moved on
    without storing it, or the wait ran out)."""
    import time

    from engine.cases import precompute_job as pj
    from engine.cases.explain_cache import WAIT_S

    jobs = [j for j in JOBS if j.get("model_sha") == model_sha and j.get("source_id") == sid
            and j["process"].poll() is None]
    for job in jobs:
        t0 = time.monotonic()
        while (pj.read_status(job["status"]) or {}).get("current") == transaction_id:
            if time.monotonic() - t0 > (WAIT_S if wait_s is None else wait_s) or job["process"].poll() is not None:
                break
            time.sleep(0.05)
        hit = cache.get(model_sha, sid, transaction_id, cparams)
        if hit is not None:
            return hit
    return None
