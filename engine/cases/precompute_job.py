"""The background precompute as its own low-priority process.

The dashboard explains the flagged transactions of a loaded file ahead of time
(:func:`engine.cases.explain_cache.precompute`). Run as a thread of the Streamlit server it
competed with the analyst's page for the GIL: the thread was niced, so the OS often descheduled it
while it held the GIL and the page's script waited for it (priority inversion). With 2 cores, a
case switch then took 0.5 to 1.7 s instead of 0.4 to 0.9 s (bench/results/browser.md). In its
own process at niceness :data:`NICENESS` it takes only CPU the page does not use.

The server writes a job file (JSON, in the fraudlens data dir, mode 0600) and starts::

    python -m engine.cases.precompute_job JOB.json

Job fields: ``data`` (file path), ``spec`` (built-in name or TOML path), ``max_rows`` (int or
null), ``data_sha256`` (the file's sha256 the server loaded), ``model`` (checkpoint dir, "" = the
demo model), ``model_sha256``, ``cache`` (the explanation cache's sqlite path), ``source_id``,
``params`` (cache params), ``ids`` (transaction ids, most risky first), ``budget_s`` (seconds),
``status`` (path of the status file). The process re-reads the file and the model with the same
functions as the server and refuses to run (status ``error``) when either sha256 differs: it
never explains other data than the page shows.

Status file (JSON, rewritten after each transaction, atomically): ``state`` (``"running"``,
``"done"``, ``"error"``), ``done`` (ids handled so far, in job order), ``current`` (the id
being explained now, else null), ``counts``
(:func:`engine.cases.explain_cache.precompute`'s), ``error`` (text, on error), ``pid`` and
``niceness`` of the process. The server reads it to build what the case page shows from each stored result (dashboard/precompute.py).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

#: niceness of the process (Linux: 0 normal .. 19 lowest)
NICENESS = 15
#: job fields the process needs
JOB_FIELDS = ("data", "spec", "max_rows", "data_sha256", "model", "model_sha256", "cache", "source_id",
              "params", "ids", "budget_s", "status")


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` (mode 0600) through a temporary file and ``os.replace``,
    so a reader sees the old or the new content, never a partial one."""
    p = Path(path)
    tmp = p.with_name(p.name + f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(obj, f, allow_nan=False)
    os.replace(tmp, p)


def read_status(path: str | Path) -> dict[str, Any] | None:
    """The status file's content, or None while it does not exist or cannot be parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            out = json.load(f)
        return out if isinstance(out, dict) else None
    except (OSError, ValueError):
        return None


def run_job(job: dict[str, Any], stop: threading.Event | None = None) -> dict[str, Any]:
    """Explain ``job["ids"]`` into the explanation cache, updating the status file; returns the
    final status.

    Raises:
        KeyError: a job field of :data:`JOB_FIELDS` is missing.
    """
    from engine.cases import view as cv
    from engine.cases.explain_cache import ExplanationCache, precompute

    missing = [k for k in JOB_FIELDS if k not in job]
    if missing:
        raise KeyError(f"precompute job: missing fields {missing}")
    status_path = job["status"]
    try:
        nice = os.getpriority(os.PRIO_PROCESS, 0)
    except (AttributeError, OSError):
        nice = None
    status: dict[str, Any] = {"state": "running", "done": [], "current": None, "counts": None, "error": "",
                              "pid": os.getpid(), "niceness": nice}
    write_json_atomic(status_path, status)
    try:
        source = cv.load_source(job["data"], job["spec"], max_rows=job["max_rows"])
        if source.file_sha256 != job["data_sha256"]:
            raise ValueError(f"{job['data']}: the file changed since the server loaded it (sha256 differs)")
        bundle = cv.load_model(job["model"] or None)
        if bundle.sha256 != job["model_sha256"]:
            raise ValueError(f"{job['model'] or 'demo model'}: the checkpoint differs from the server's (sha256)")
        cache = ExplanationCache(job["cache"])

        def after(tid: str, _out: Any) -> None:
            status["done"].append(tid)
            write_json_atomic(status_path, status)

        def explain(tid: str):
            status["current"] = tid  # a page asking for it waits for this result (dashboard/precompute.py)
            write_json_atomic(status_path, status)
            return cv.explain_query(bundle, source.frame, tid)

        status["counts"] = precompute(explain, job["ids"], cache,
                                      model_sha=job["model_sha256"], source_id=job["source_id"],
                                      params=job["params"], budget_s=float(job["budget_s"]), stop=stop,
                                      after=after, log=lambda m: print(m, file=sys.stderr, flush=True))
        status.update(state="done", current=None)
    except Exception as e:  # noqa: BLE001 - reported in the status file; the page computes on a miss
        status.update(state="error", current=None, error=f"{type(e).__name__}: {e}")
    write_json_atomic(status_path, status)
    return status


def main(argv: list[str] | None = None) -> int:
    """``python -m engine.cases.precompute_job JOB.json``: lower this process's priority, set one
    torch thread, run the job. Exit status 0 when done, 1 on error (see the status file)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m engine.cases.precompute_job JOB.json", file=sys.stderr)
        return 2
    try:
        os.nice(NICENESS)
    except (AttributeError, OSError):
        pass
    import torch

    torch.set_num_threads(1)
    with open(args[0], encoding="utf-8") as f:
        job = json.load(f)
    stop, parent = threading.Event(), os.getppid()

    def watch_parent() -> None:  # the server went away: stop after the transaction in hand
        while not stop.wait(1.0):
            if os.getppid() != parent:
                stop.set()

    threading.Thread(target=watch_parent, daemon=True).start()
    return 0 if run_job(job, stop)["state"] == "done" else 1


if __name__ == "__main__":
    raise SystemExit(main())
