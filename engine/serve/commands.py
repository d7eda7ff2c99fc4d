"""``fraudlens serve``: the HTTP scoring service (FastAPI + uvicorn) in this process.

Registered by :mod:`engine.cli`. Loads and validates the checkpoint, opens the history store,
optionally warms it from a file, checks the token rule (a non-loopback host needs one), then
serves until SIGTERM / Ctrl-C. Prints "ready" once listening.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

console = Console(width=None if sys.stdout.isatty() else 150)


def _fail(msg: str) -> None:
    console.print(f"[red]error:[/red] {escape(' '.join(str(msg).split()))}", soft_wrap=True)
    raise typer.Exit(2)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(0)


def default_history_path(bundle) -> Path:
    """``<data dir>/serve/history-<spec>-<model sha 12>.sqlite3`` (the case store's folder)."""
    from engine.cases.store import default_db_path

    return default_db_path().parent / "serve" / f"history-{bundle.spec.name}-{bundle.short_sha}.sqlite3"


def bind_port(host: str, port: int):
    """A TCP socket bound to ``host:port`` (not yet listening; uvicorn listens on it once the
    service is ready), so a taken port fails at once, before the checkpoint is loaded or a history
    store is created. Not inheritable: the scorer child does not hold it.

    Raises:
        OSError: the port is in use, or ``host`` is not an address of this machine.
    """
    import socket

    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                      flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart after kill -9 rebinds
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


def serve(
    model: Optional[Path] = typer.Option(None, help="checkpoint directory (default: the demo model)"),
    host: str = typer.Option("127.0.0.1", help="interface; anything but loopback needs a token"),
    port: int = typer.Option(8000, min=1, max=65535),
    history: Optional[Path] = typer.Option(None, help="history store (SQLite; default: "
                                           "$FRAUDLENS_DATA_DIR/serve/history-<spec>-<sha>.sqlite3)"),
    warm: Optional[Path] = typer.Option(None, exists=True, help="warm start: append this transactions file "
                                        "(the model's spec) to the history store and cache it"),
    cache_mb: float = typer.Option(256.0, min=0.01, help="memory cap of the per-entity caches (MiB)"),
    shadow: bool = typer.Option(False, "--shadow", help="score and log only: never write cases"),
    cases: Optional[Path] = typer.Option(None, help="case store file (default: $FRAUDLENS_DATA_DIR/cases.sqlite3)"),
    explain: str = typer.Option("occlusion", help="background explanation of flagged transactions: occlusion or none"),
    explain_cpu: float = typer.Option(0.25, min=0.01, max=1.0, help="CPU budget of the background explanations "
                                      "(fraction of one core; they lag behind a burst of flags instead of slowing "
                                      "scoring)"),
    token_file: Optional[Path] = typer.Option(None, help="file holding the bearer token (else $FRAUDLENS_SERVE_TOKEN)"),
    sync: str = typer.Option("full", help="history commits: full (fsync each commit group: survives power loss) or "
                             "normal (survives kill -9 and process crashes, not power loss)"),
    max_ahead_minutes: float = typer.Option(10.0, min=0.0, help="refuse (422) a transaction dated more than this "
                                            "many minutes after this machine's clock (timestamps are UTC); such a row "
                                            "would make every later transaction of its entity out of order. inf: no "
                                            "limit (to replay a future-dated file); 0 refuses a client clock even "
                                            "milliseconds ahead"),
    processes: str = typer.Option("auto", help="two: HTTP front and scorer in separate processes, with dynamic "
                                  "batching (engine/serve/scorer.py); one: everything in this process; auto: two "
                                  "when the machine has 2 or more cores"),
):
    """Serve POST /v1/score, /v1/score/batch, GET /healthz, /metrics (see engine/serve/api.py)."""
    import torch
    import uvicorn

    from engine.model.checkpoint import load_checkpoint
    from engine.serve.api import create_app
    from engine.serve.casework import EXPLAIN_METHODS
    from engine.serve.service import ScoringService
    from engine.serve.warm import TokenError, resolve_token, warm_start

    torch.set_num_threads(1)
    from engine.serve.history import SYNC_MODES

    if sync not in SYNC_MODES:
        _fail(f"--sync: expected one of {', '.join(SYNC_MODES)}, got {sync!r}")
    if explain not in EXPLAIN_METHODS:
        _fail(f"--explain: expected one of {', '.join(EXPLAIN_METHODS)}, got {explain!r}")
    try:
        token = resolve_token(token_file, host)
    except TokenError as e:
        _fail(str(e))
    try:
        listen_sock = bind_port(host, port)
    except OSError as e:
        _fail(f"cannot listen on {host}:{port}: {e.strerror or e} (stop what listens there or pass --port)")
    try:
        bundle = load_checkpoint(model)
    except (FileNotFoundError, ValueError) as e:
        _fail(f"checkpoint refused: {e}")
    hist = history or default_history_path(bundle)
    if processes not in ("auto", "one", "two"):
        _fail(f"--processes: expected auto, one or two, got {processes!r}")
    split = processes == "two" or (processes == "auto" and (os.cpu_count() or 1) >= 2)
    if split:
        from engine.serve.scorer import RemoteService, ScorerStartError

        try:
            service = RemoteService(bundle, hist, cache_bytes=int(cache_mb * 2**20), shadow=shadow, case_db=cases,
                                    explain=explain, sync=sync, explain_cpu=explain_cpu, warm=warm,
                                    max_ahead_s=max_ahead_minutes * 60.0)
        except ScorerStartError as e:
            _fail(str(e))
        warm = None  # applied by the scorer
    else:
        try:
            service = ScoringService(bundle, hist, cache_bytes=int(cache_mb * 2**20), shadow=shadow, case_db=cases,
                                     explain=explain, sync=sync, explain_cpu=explain_cpu,
                                     max_ahead_s=max_ahead_minutes * 60.0)
        except Exception as e:  # noqa: BLE001 - one line naming the store
            _fail(f"cannot open the history store {hist}: {e}")
    if warm is not None:
        try:
            warm_start(service, warm, log=lambda m: console.print(m, markup=False))
        except (FileNotFoundError, ValueError) as e:
            _fail(f"--warm {warm}: {e}")
    from engine.serve.access import is_loopback

    # bound to loopback: the Host header must name loopback and this port (DNS rebinding)
    app = create_app(service, token, loopback_port=port if is_loopback(host) else None)
    # proxy_headers=False: no X-Forwarded-* header is trusted (the service is not set up behind a proxy),
    # and uvicorn's ProxyHeadersMiddleware is off the per-request path
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=10, proxy_headers=False)
    server = uvicorn.Server(config)
    console.print(f"fraudlens serve: model {bundle.short_sha} (spec {bundle.spec.name}), history {hist}, "
                  f"sync {sync}, {'front + scorer processes, ' if split else 'one process, '}{'shadow mode, ' if shadow else ''}{'token required' if token else 'no token (loopback)'}; "
                  f"http://{host}:{port}", markup=False)
    orig = server.startup

    async def startup(sockets=None):
        await orig(sockets)
        if server.started:
            console.print("ready", markup=False)
            sys.stdout.flush()

    server.startup = startup
    if split:
        service.on_broken = lambda: setattr(server, "should_exit", True)
    # uvicorn handles SIGTERM (graceful shutdown), then restores this handler and raises the signal
    # again (uvicorn.Server.capture_signals): with the default handler the process would die
    # there, before the stores below are closed (their WAL files and the worker's semaphore left)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        server.run(sockets=[listen_sock])
    finally:
        service.close()
        listen_sock.close()
    if split and service.broken:
        console.print(f"error: {service.broken}; exiting for a restart", markup=False)
        raise typer.Exit(3)  # engine.serve.scorer.SCORER_DIED_EXIT
    if not server.started:
        _fail(f"could not listen on {host}:{port} (in use, or not an address of this machine)")
