"""The background precompute as its own low-priority process.

The dashboard explains the flagged transactions of a loaded file ahead of time
(:func:`engine.cases.explain_cache.precompute`). Run as a thread of the Streamlit server it
competed with the analyst's page for the GIL: the thread was niced, so the OS often descheduled it
while it held the GIL and the page's script waited for it (priority inversion). With it running,
the reasons of a switched-to case left the server up to 1.9 s after the click instead of 0.37 to
0.64 s (bench/results/browser.md). In its own process at niceness :data:`NICENESS` it takes only
CPU the page does not use.

The server writes a job file (JSON, in the fraudlens data dir, mode 0600) and starts::

    python -m engine.cases.precompute_job JOB.json

Job fields: ``data`` (absolute file path), ``spec`` (built-in name or absolute TOML path),
``spec_sha256`` (the TOML file's sha256, null for a built-in name), ``max_rows`` (int or null),
``data_sha256`` (the file's sha256 the server loaded), ``model`` (absolute checkpoint dir, "" =
the demo model), ``model_sha256``, ``cache`` (the explanation cache's sqlite path), ``source_id``,
``params`` (cache params), ``ids`` (transaction ids, most risky first), ``budget_s`` (finite
seconds), ``status`` (path of the status file). The process re-reads the file, the spec and the
model with the same functions as the server and refuses to run (status ``error``) when a sha256
differs: it never explains other data than the page shows. It deletes the job file once read.

Status file (JSON, small, rewritten atomically): ``state`` (``"running"``, ``"done"``,
``"error"``), ``current`` (the id being explained now, else null; cleared after each
transaction, failed or not), ``n_done``, ``counts`` (:func:`engine.cases.explain_cache.precompute`'s),
``error`` (text, on error), ``pid`` and ``niceness`` of the process. The ids handled, in job order,
are appended one per line to the **done file** (the status path + ``.done``), which the server
reads from its last offset to build what the case page shows from each stored result
(dashboard/precompute.py).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: niceness of the process (Linux: 0 normal .. 19 lowest); ``$FRAUDLENS_PRECOMPUTE_NICENESS`` overrides it
NICENESS = 15
ENV_NICENESS = "FRAUDLENS_PRECOMPUTE_NICENESS"


def niceness() -> int:
    """The niceness increment of the process: ``$FRAUDLENS_PRECOMPUTE_NICENESS`` (0-19) when set
    to an integer there, else :data:`NICENESS`."""
    try:
        v = int(os.environ.get(ENV_NICENESS, NICENESS))
    except ValueError:
        return NICENESS
    return min(19, max(0, v))


#: job fields the process needs
JOB_FIELDS = ("data", "spec", "spec_sha256", "max_rows", "data_sha256", "model", "model_sha256", "cache",
              "source_id", "params", "ids", "budget_s", "status")


#: largest status file read (bytes); a bigger one is treated as unreadable
MAX_STATUS_BYTES = 64 * 1024


def _open_new(path: Path, flags: int) -> int:
    """``os.open`` of a file this process creates or owns (mode 0600), never through a symlink."""
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o600)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` (mode 0600) through a temporary file created exclusively
    (never following a symlink) and ``os.replace``, so a reader sees the old or the new content,
    never a partial one.

    Raises:
        OSError: the folder is not writable. ValueError: ``obj`` holds NaN or infinity.
    """
    import secrets

    p = Path(path)
    tmp = p.with_name(f"{p.name}.tmp{os.getpid()}-{secrets.token_hex(4)}")
    payload = json.dumps(obj, allow_nan=False)
    fd = _open_new(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(payload)
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_status(path: str | Path) -> dict[str, Any] | None:
    """The status file's content, or None while it does not exist, is larger than
    :data:`MAX_STATUS_BYTES` or cannot be parsed as a JSON object."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_STATUS_BYTES + 1)
        if len(raw) > MAX_STATUS_BYTES:
            return None
        out = json.loads(raw.decode("utf-8"))
        return out if isinstance(out, dict) else None
    except (OSError, ValueError, RecursionError):
        return None


def done_path(status_path: str | Path) -> Path:
    """The done file of a status file: the ids handled, one per line, in job order."""
    return Path(f"{status_path}.done")


def read_done(status_path: str | Path, offset: int = 0) -> tuple[list[str], int]:
    """``(ids, new offset)``: the complete lines of the done file after byte ``offset`` (a line
    still being written is left for the next read); ``([], offset)`` while there is none."""
    try:
        with open(done_path(status_path), "rb") as f:
            f.seek(offset)
            raw = f.read()
    except OSError:
        return [], offset
    end = raw.rfind(b"\n") + 1
    lines = raw[:end].decode("utf-8", errors="replace").splitlines()
    return [t for t in lines if t], offset + end


def run_job(job: dict[str, Any], stop: threading.Event | None = None) -> dict[str, Any]:
    """Explain ``job["ids"]`` into the explanation cache, updating the status and done files;
    returns the final status.

    Raises:
        KeyError: a job field of :data:`JOB_FIELDS` is missing.
        OSError: the status file cannot be written (then nothing is explained).
    """
    from engine.cases import fields_view as fv
    from engine.cases import view as cv
    from engine.cases.explain_cache import ExplanationCache, precompute
    from engine.data.io import file_sha256

    missing = [k for k in JOB_FIELDS if k not in job]
    if missing:
        raise KeyError(f"precompute job: missing fields {missing}")
    status_path = job["status"]
    try:
        nice = os.getpriority(os.PRIO_PROCESS, 0)
    except (AttributeError, OSError):
        nice = None
    status: dict[str, Any] = {"state": "running", "current": None, "n_done": 0, "counts": None, "error": "",
                              "pid": os.getpid(), "niceness": nice}
    write_json_atomic(status_path, status)
    dfd = _open_new(done_path(status_path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
    try:
        spec = job["spec"]
        if job.get("spec_sha256") and file_sha256(spec) != job["spec_sha256"]:
            raise ValueError(f"{spec}: the spec changed since the server loaded it (sha256 differs)")
        source = cv.load_source(job["data"], spec, max_rows=job["max_rows"])
        if source.file_sha256 != job["data_sha256"]:
            raise ValueError(f"{job['data']}: the file changed since the server loaded it (sha256 differs)")
        bundle = cv.load_model(job["model"] or None)
        if bundle.sha256 != job["model_sha256"]:
            raise ValueError(f"{job['model'] or 'demo model'}: the checkpoint differs from the server's (sha256)")
        cache = ExplanationCache(job["cache"])

        def explain(tid: str):
            status["current"] = tid  # a page asking for it waits for this result (dashboard/precompute.py)
            write_json_atomic(status_path, status)
            t0 = time.perf_counter()
            try:
                return cv.explain_query(bundle, source.frame, tid)
            finally:
                status["current"] = None
                write_json_atomic(status_path, status)
                # one line per transaction in the job's log (0600): when each case became ready
                print(f"{time.strftime('%H:%M:%S')} explained {str(tid)[:80]!r} in {time.perf_counter() - t0:.2f} s",
                      file=sys.stderr, flush=True)

        def after(tid: str, _out: Any) -> None:
            # the Case page's "does the history matter?" box and Fields tab (engine/cases/fields_view.py):
            # ~0.5-1 s per case on 2 cores that a case open no longer waits for; stored before the
            # transaction is announced done, so a page that sees it done finds both
            try:  # stored unless it is already (fv.cached_query_fields, the read the page and the CLI make)
                fv.cached_query_fields(cache, bundle, source.frame, job["source_id"], tid, job["params"],
                                       currency=source.currency)
            except (KeyError, ValueError, RuntimeError, TypeError) as e:  # the page computes it on open
                print(f"fields of {str(tid)[:80]!r} not stored: {type(e).__name__}: {e}", file=sys.stderr,
                      flush=True)
            os.write(dfd, (str(tid).replace("\n", " ") + "\n").encode("utf-8"))
            status["n_done"] += 1
            write_json_atomic(status_path, status)

        status["counts"] = precompute(explain, job["ids"], cache,
                                      model_sha=job["model_sha256"], source_id=job["source_id"],
                                      params=job["params"], budget_s=float(job["budget_s"]), stop=stop,
                                      after=after, log=lambda m: print(m, file=sys.stderr, flush=True))
        status.update(state="done", current=None)
    except Exception as e:  # noqa: BLE001 - reported in the status file; the page computes on a miss
        status.update(state="error", current=None, error=f"{type(e).__name__}: {e}")
    finally:
        os.close(dfd)
    write_json_atomic(status_path, status)
    return status


def main(argv: list[str] | None = None) -> int:
    """``python -m engine.cases.precompute_job JOB.json``: lower this process's priority
    (:func:`niceness`), watch the
    parent (the server), read and delete the job file, set one torch thread, run the job. Exit
    status 0 when done, 1 on error (see the status file), 2 on bad usage or an unreadable job file."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m engine.cases.precompute_job JOB.json", file=sys.stderr)
        return 2
    stop, parent = threading.Event(), os.getppid()

    def watch_parent() -> None:  # the server went away: stop after the transaction in hand
        while not stop.wait(1.0):
            if os.getppid() != parent:
                stop.set()

    threading.Thread(target=watch_parent, daemon=True).start()
    try:
        os.nice(niceness())
    except (AttributeError, OSError):
        pass
    try:
        with open(args[0], encoding="utf-8") as f:
            job = json.load(f)
        if not isinstance(job, dict):
            raise ValueError("expected a JSON object")
    except (OSError, ValueError, RecursionError) as e:
        print(f"precompute job {args[0]}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    Path(args[0]).unlink(missing_ok=True)  # it lists every flagged id: not left in the data dir
    import torch

    torch.set_num_threads(1)
    return 0 if run_job(job, stop)["state"] == "done" else 1


if __name__ == "__main__":
    raise SystemExit(main())
