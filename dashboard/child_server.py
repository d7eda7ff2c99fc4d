"""The dashboard in a child process, for the browser tests and the browser benchmark.

One copy of "start ``streamlit run dashboard/app.py`` on a free port of 127.0.0.1 and wait until
``/_stcore/health`` answers", and of "sign in through the page's form", shared by
``tests/browser/conftest.py`` and ``bench/browser_case_bench.py``. Imports neither streamlit
nor torch (the child process does); Playwright pages are passed in.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
#: variables of this process's environment that a child server never inherits (a test or a bench
#: sets them explicitly when it wants them)
DROPPED_ENV = ("FRAUDLENS_FOUR_EYES", "FRAUDLENS_ANALYST", "FRAUDLENS_DEMO")


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def streamlit_server(env: dict[str, str], log_path: Path, args: tuple[str, ...] = (),
                     timeout_s: float = 60.0) -> Iterator[str]:
    """``streamlit run dashboard/app.py`` (extra command-line ``args``) on a free port, with
    ``env`` over this process's environment (minus :data:`DROPPED_ENV` unless ``env`` sets them;
    usage statistics off), its stdout and stderr in ``log_path``. Yields the URL once
    ``/_stcore/health`` answers 200; stops the process afterwards (SIGTERM, then SIGKILL after
    10 s).

    Raises:
        RuntimeError: the process exited or was not healthy within ``timeout_s`` seconds (the
            message carries the last 2,000 characters of its log).
    """
    port = free_port()
    full = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    full.update({"STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false", **env})
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "dashboard/app.py", "--server.headless", "true",
         "--server.port", str(port), "--server.fileWatcherType", "none", *args],
        cwd=ROOT, env=full, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(url + "/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"streamlit did not start: {log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def sign_in(page, url: str, user: str, password: str, path: str = "", timeout_ms: float = 30_000) -> None:
    """Open ``url + path`` in the Playwright ``page`` and sign in through the form (a new page
    load is a new Streamlit session: sign in again after one). Waits (at most ``timeout_ms``
    milliseconds per step) until the sign-in page is gone."""
    page.goto(url + path)
    page.get_by_role("heading", name="Sign in to fraudlens").wait_for(timeout=timeout_ms)
    page.get_by_role("textbox", name="User name").fill(user)
    page.get_by_role("textbox", name="Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name="Sign in to fraudlens").wait_for(state="detached", timeout=timeout_ms)


__all__ = ["DROPPED_ENV", "free_port", "sign_in", "streamlit_server"]
