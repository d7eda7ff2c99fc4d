"""Serve the dashboard in this process, warmed: ``python -m dashboard.launch --address A --port P
[--no-headless]`` (what ``fraudlens dashboard`` execs after its checks; data, spec and model come
from the ``FRAUDLENS_*`` environment as for ``streamlit run``).

Before the server starts, the slow parts of the first page are done here, in the process that
will serve it: the imports (torch, the engine, plotly) and the cached model bundle, data source,
scores and ranking of the launch settings (``dashboard.state``'s ``st.cache_resource`` entries,
shared by every session). Only then does Streamlit start listening, so ``/_stcore/health``
answers ok when the first page can be served; a watcher thread then prints ``ready``.
Streamlit runs in this process (same PID): SIGTERM or SIGINT to it stops the server.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "dashboard" / "app.py"


def warm() -> float:
    """Import the heavy modules and fill the shared caches for the launch settings; seconds taken.
    A failure (say a missing model) is only logged: the page reports it to the user."""
    t0 = time.perf_counter()
    import streamlit  # noqa: F401 - creates the loggers quieted below

    for name in ("streamlit.runtime.caching.cache_data_api", "streamlit.runtime.scriptrunner_utils.script_run_context",
                 "streamlit.runtime.caching.cache_resource_api"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from dashboard import state

    import engine.cases.figures  # noqa: F401 - the Cases page's figures (plotly)
    try:
        state.warm(state.parse_settings([]))
    except Exception as e:  # noqa: BLE001 - shown in the page on first use
        print(f"fraudlens: warm-up failed ({type(e).__name__}); the page will report it", flush=True)
    return time.perf_counter() - t0


def _announce_when_healthy(host: str, port: int, shown: str, timeout: float = 600.0) -> None:
    url = f"http://{host}:{port}/_stcore/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    print(f"fraudlens dashboard ready: {shown}", flush=True)
                    return
        except OSError:
            pass
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    """Warm, then run ``streamlit run dashboard/app.py`` in this process; its exit status."""
    ap = argparse.ArgumentParser(prog="python -m dashboard.launch")
    ap.add_argument("--address", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8501)
    ap.add_argument("--no-headless", action="store_true")
    ns = ap.parse_args(argv)
    secs = warm()
    print(f"fraudlens: model and data loaded in {secs:.1f} s; starting the server", flush=True)
    probe = "127.0.0.1" if ns.address in ("0.0.0.0", "::", "") else ns.address
    shown = f"http://{'localhost' if probe == '127.0.0.1' else ns.address}:{ns.port}"
    threading.Thread(target=_announce_when_healthy, args=(probe, ns.port, shown), daemon=True).start()
    from streamlit.web import cli as stcli

    sys.argv = ["streamlit", "run", str(APP), "--server.address", ns.address, "--server.port", str(ns.port),
                "--server.headless", "false" if ns.no_headless else "true", "--server.fileWatcherType", "none",
                "--browser.gatherUsageStats", "false", "--client.showErrorDetails", "type"]
    try:
        return stcli.main()
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1


if __name__ == "__main__":
    sys.exit(main())
