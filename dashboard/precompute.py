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
import threading
from pathlib import Path
from typing import Any

import streamlit as st

from dashboard import state
from engine.cases import view as cv

log = logging.getLogger("fraudlens.dashboard")

#: leads (reasons, key evidence, agreement) the background precompute builds ahead, per data + model:
#: the first ones in job order (the most risky cases' opening transactions); later ones are built by
#: the page when it opens them
LEAD_STORE_MAX = 512
#: seconds a page waits for the transaction the precompute process is explaining now, at most,
#: before computing it itself (the process runs at niceness 15: under load it may get little CPU)
WAIT_PRECOMPUTE_S = 20.0
#: the lead builder sleeps this share of each build's time after it (it shares the GIL with pages)
LEAD_BUILD_PAUSE = 1.0


#: the precompute explains the opening transaction of this many entities of the page's order first,
#: flagged or not (an analyst also opens the cases just below the threshold)
OPEN_AHEAD = 10


def flagged_order(scores: Any, ranking: Any = None, open_ahead: int = OPEN_AHEAD) -> list[str]:
    """Transaction ids in the precompute's order: first the opening transaction (the one the
    Case page opens an entity on: highest score, ties by the higher logit, then the latest, as
    :func:`engine.cases.view.default_query`) of the first ``open_ahead`` entities, flagged or
    not; then every other flagged entity's opening transaction, then every entity's second flagged
    transaction, and so on. Entities in ``ranking``'s order (the Case page's entity order,
    :func:`engine.cases.view.rank_entities`; default: by descending highest probability), so the
    transaction the Case page opens first always comes first.

    ``scores``: frame order (entities contiguous, time order within an entity), with
    ``entity_id``, ``transaction_id``, ``probability``, ``flagged``."""

    f = scores[["entity_id", "transaction_id", "probability"]].assign(
        _flag=scores["flagged"].to_numpy(dtype=bool), _p=scores["probability"].fillna(-1.0).to_numpy())
    if ranking is not None and len(ranking):
        rank = {str(e): i for i, e in enumerate(ranking["entity_id"])}
    else:
        mx = f.groupby("entity_id", sort=False)["_p"].max().sort_values(ascending=False, kind="stable")
        rank = {str(e): i for i, e in enumerate(mx.index)}
    f = f.assign(_rank=f["entity_id"].astype(str).map(rank).fillna(len(rank)).to_numpy())
    f = f.iloc[cv.score_order(scores)]  # riskiest first, as default_query
    opening = f.drop_duplicates("entity_id").sort_values("_rank", kind="stable").head(max(int(open_ahead), 1))
    f = f.loc[f["_flag"]]
    f = f.assign(_nth=f.groupby("entity_id", sort=False).cumcount())
    ids = [str(t) for t in f.sort_values(["_nth", "_rank"], kind="stable")["transaction_id"]]
    lead = [str(t) for t in opening["transaction_id"]]
    seen = set(lead)
    return lead + [t for t in ids if t not in seen]


class LeadStore:
    """Thread-safe, bounded ``transaction id -> Lead`` map that the precompute's lead builder
    fills (:func:`precompute_job`) and the Case page reads
    (:func:`dashboard.components.lead.case_lead`). Once full it refuses new entries (nothing is
    evicted: the first ones, in job order, are the most risky cases). Entries are shared: read
    them, never mutate."""

    def __init__(self, max_entries: int = LEAD_STORE_MAX):
        self._d: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.max_entries = int(max_entries)

    def get(self, transaction_id: str):
        with self._lock:
            return self._d.get(str(transaction_id))

    def put(self, transaction_id: str, lead: Any) -> bool:
        """Store ``lead``; False (not stored) when the store is full and the id is new."""
        with self._lock:
            key = str(transaction_id)
            if key not in self._d and len(self._d) >= self.max_entries:
                return False
            self._d[key] = lead
            return True

    def full(self) -> bool:
        with self._lock:
            return len(self._d) >= self.max_entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._d)


@st.cache_resource(show_spinner=False, max_entries=8)
def lead_store(data_sha: str, spec: str, max_rows: int | None, model_sha: str) -> LeadStore:
    """The :class:`LeadStore` of one (data sha256, spec, max_rows, model sha256), one per process."""
    return LeadStore()


def _absolute(path: str) -> str:
    return str(Path(path).expanduser().resolve()) if path else ""


@st.cache_resource(show_spinner=False, max_entries=4)
def precompute_job(data_sha: str, spec: str, max_rows: int | None, model_sha: str, review: float,
                   budget_s: float, _path: str, _model_path: str, _data_dir: str) -> dict[str, Any]:
    """ONE background precompute per (data, model, review threshold): a low-priority process
    (:mod:`engine.cases.precompute_job`) explains the flagged transactions, most risky first, into
    the explanation cache, and a thread of this process builds each stored result's lead (reasons,
    key evidence; :func:`dashboard.components.lead.build_lead`) into :func:`lead_store`, so the
    Case page only draws. Neither calls ``st.*``. Starting a job stops every other job of this
    server (one precompute process at a time). The returned dict holds ``process``, ``thread`` (the
    lead builder), ``status`` (path of the status file), ``stop`` and, when done, ``counts``.

    Raises:
        OSError: the data dir's ``precompute`` folder cannot be made private or written.
        ValueError: ``budget_s`` is not finite.
    """
    import math
    import subprocess
    import time
    import uuid

    from engine.cases import precompute_job as pj
    from engine.data.io import file_sha256

    if not math.isfinite(budget_s):
        raise ValueError(f"precompute budget: expected a finite number of seconds, got {budget_s}")
    source = state._source(_path, spec, data_sha, max_rows)
    bundle = state.get_bundle(_model_path)
    scores = state._scores(_path, spec, data_sha, max_rows, _model_path, model_sha)
    flagged = scores.assign(flagged=scores["probability"].to_numpy() >= review)
    ids = flagged_order(flagged, state._ranking(_path, spec, data_sha, max_rows, _model_path, model_sha, review))
    sid, cparams = state._cache_ids(source, max_rows, ())
    cache = state.explanation_cache(_data_dir)
    leads = lead_store(data_sha, spec, max_rows, model_sha)
    work = Path(_data_dir).expanduser().resolve() / "precompute"
    work.mkdir(mode=0o700, parents=True, exist_ok=True)
    st_ = work.stat()
    if st_.st_uid != os.getuid() or st_.st_mode & 0o077:
        os.chmod(work, 0o700)  # raises OSError when not ours
    tag = f"{data_sha[:12]}-{model_sha[:12]}-{uuid.uuid4().hex[:12]}"
    status = work / f"{tag}.status.json"
    job_file = work / f"{tag}.job.json"
    spec_name, spec_sha = state.spec_parts(spec)
    spec_path = Path(spec_name).expanduser()
    spec_is_file = spec_path.suffix == ".toml" and spec_path.is_file()
    pj.write_json_atomic(job_file, {  # the spec content the source was read with (its ref's sha256)
        "data": _absolute(_path), "spec": _absolute(spec_name) if spec_is_file else spec_name,
        "spec_sha256": (spec_sha or file_sha256(spec_path)) if spec_is_file else None, "max_rows": max_rows,
        "data_sha256": data_sha, "model": _absolute(_model_path or ""), "model_sha256": model_sha,
        "cache": str(Path(cache.path).resolve()), "source_id": sid, "params": cparams, "ids": ids,
        "budget_s": float(budget_s), "status": str(status)})
    for old in list(JOBS):  # one precompute process per server: the newest data + model wins
        old["stop"].set()
    job: dict[str, Any] = {"stop": threading.Event(), "n": len(ids), "counts": None, "status": status,
                           "model_sha": model_sha, "source_id": sid}
    log_fd = os.open(work / f"{tag}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0),
                     0o600)
    try:
        job["process"] = subprocess.Popen(
            [sys.executable, "-m", "engine.cases.precompute_job", str(job_file)], stdin=subprocess.DEVNULL,
            stdout=log_fd, stderr=log_fd, cwd=str(Path(__file__).resolve().parents[1]),
            env={**os.environ, "OMP_NUM_THREADS": "1"})
    finally:
        os.close(log_fd)

    def build_leads() -> None:  # the Case page then only draws
        from dashboard.components.lead import build_lead

        offset = 0
        try:
            while True:
                alive = job["process"].poll() is None
                done, offset = pj.read_done(status, offset)
                for tid in done:
                    if job["stop"].is_set() or leads.full():
                        break
                    if leads.get(tid) is not None:
                        continue
                    t0 = time.perf_counter()
                    try:
                        expls = cache.get(model_sha, sid, tid, cparams)
                        if expls is not None:
                            leads.put(tid, build_lead(bundle, source.frame, tid, dict(expls)))
                    except Exception as e:  # noqa: BLE001 - the page builds it on open and says why it failed
                        log.info("lead of %s not built ahead: %s: %s", tid, type(e).__name__, e)
                    job["stop"].wait(LEAD_BUILD_PAUSE * (time.perf_counter() - t0))
                if job["stop"].is_set() and alive:
                    job["process"].terminate()
                    try:
                        job["process"].wait(30)
                    except subprocess.TimeoutExpired:
                        job["process"].kill()
                        job["process"].wait(30)
                    alive = False
                if not alive:
                    final = pj.read_status(status) or {}
                    if final.get("state") == "done":
                        job["counts"] = final.get("counts")
                        log.info("precompute: %s", job["counts"])
                    else:  # error, stopped, or the process died without a final status
                        job["counts"] = {"error": final.get("error") or f"exit status {job['process'].returncode}"}
                        log.warning("precompute stopped: %s", job["counts"]["error"])
                    return
                job["stop"].wait(0.5)
        finally:
            for f in (status, pj.done_path(status), job_file):
                f.unlink(missing_ok=True)

    with _JOBS_LOCK:
        JOBS[:] = [j for j in JOBS if j["process"].poll() is None] + [job]
    job["thread"] = threading.Thread(target=build_leads, name="fraudlens-precompute-leads", daemon=True)
    job["thread"].start()
    return job


#: running precompute jobs of this process (:func:`precompute_job`), newest last
JOBS: list[dict[str, Any]] = []
_JOBS_LOCK = threading.Lock()


def wait_for_precompute(cache: Any, model_sha: str, sid: str, transaction_id: str, cparams: dict,
                        wait_s: float | None = None) -> Any:
    """When a running precompute process is explaining ``transaction_id`` right now, wait (up to
    ``wait_s``, default :data:`WAIT_PRECOMPUTE_S`) for its result instead of computing it a second
    time; the stored explanations, or None (no such job, it moved on without storing it, the wait
    ran out, or the cache cannot be read)."""
    import time

    from engine.cases import precompute_job as pj

    with _JOBS_LOCK:
        jobs = [j for j in JOBS if j.get("model_sha") == model_sha and j.get("source_id") == sid
                and j["process"].poll() is None]
    limit = WAIT_PRECOMPUTE_S if wait_s is None else wait_s
    for job in jobs:
        t0 = time.monotonic()
        while (pj.read_status(job["status"]) or {}).get("current") == transaction_id:
            if time.monotonic() - t0 > limit or job["process"].poll() is not None:
                break
            time.sleep(0.05)
        try:
            hit = cache.get(model_sha, sid, transaction_id, cparams)
        except Exception as e:  # noqa: BLE001 - an unreadable cache is a miss, never an error page
            log.warning("explanation cache unavailable: %s", e)
            return None
        if hit is not None:
            return hit
    return None
