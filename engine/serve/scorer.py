"""``fraudlens serve`` in two processes: the HTTP front and the scorer, with dynamic batching.

On one process the interpreter lock serialises everything a request costs: HTTP parsing and the
response write (uvicorn, the Guard, metrics; about 0.35 ms of CPU per transaction on the 2-core
bench machine) and the model step, the history append and the case bookkeeping (about 0.5-0.9 ms).
At 1,000 transactions/s that keeps one core ~100 % busy and requests queue in the socket
(bench/results/serve.md). Here the work is split, as model servers split a request path from
the model (Triton's and Ray Serve's dynamic batching):

* the **front** (this process: uvicorn, :func:`engine.serve.api.create_app` on a
  :class:`RemoteService`) reads and checks the request, parses the JSON, validates the row
  (:func:`engine.serve.record.canonical_row`: a malformed transaction is answered 422 here and
  never reaches the scorer) and writes the response;
* the **scorer** (a child process, :func:`scorer_main`) owns the :class:`~engine.serve.service.ScoringService`:
  the entity caches, the history store (its lock, the durable append before each answer), the
  thresholds and the case worker.

**Dynamic batching**: the front keeps at most one batch of rows at the scorer. A request that
arrives while a batch is being scored waits in the front's queue; when the batch's answers come
back, everything queued (at most :data:`MAX_DYNAMIC_BATCH` rows) goes as the next batch, which
:meth:`ScoringService.score_rows` scores under one lock with one durable commit. A lone request is
sent at once (no waiting window: batching never adds latency at low load).

Channel: a Unix socket pair between the two processes, frames of a 4-byte big-endian length and
one JSON document (ASCII; NaN allowed, as rows carry NaN for a missing numeric field). Only these
two processes hold the socket (created by the front, inherited by the child through
``pass_fds``); nothing on it is ever unpickled, so even a peer that wrote arbitrary bytes could
only send wrong values. Scored rows travel without their ``timestamp`` (a ``pd.Timestamp``, not
JSON): the scorer rebuilds it from ``ts_ns`` (:func:`_wire_rows`, :func:`_unwire_rows`).
Checkpoints never travel: the scorer loads and validates the checkpoint itself
(:func:`engine.model.checkpoint.load_checkpoint`).

Lifetimes: the scorer is killed by the kernel when the front dies (``PR_SET_PDEATHSIG``, Linux), so
a ``kill -9`` of the server takes the whole service down and frees the history lock; a new
scorer waits up to :data:`LOCK_WAIT_S` for the lock a dying one still holds. If the scorer dies,
every waiting request is answered 503 and the front shuts down (``on_broken``; ``fraudlens
serve`` exits with status 3) for its supervisor to restart it. SIGTERM to the front stops both (the scorer closes the history store
and the case worker).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from engine.serve.service import DEFAULT_MAX_AHEAD_S, ServiceError

log = logging.getLogger("fraudlens.serve")
FRAME = struct.Struct("!I")
#: most rows of separate requests scored together
MAX_DYNAMIC_BATCH = 64
#: seconds a starting scorer waits for a history lock still held by a dying scorer
LOCK_WAIT_S = 10.0
#: exit status of the front when its scorer died
SCORER_DIED_EXIT = 3


class ScorerStartError(RuntimeError):
    """The scoring process could not start (the message says why: checkpoint, history store, warm file)."""


# ------------------------------------------------------------------------------------- framing
def _refuse(obj: Any) -> Any:
    raise TypeError(f"the scorer channel carries JSON values only, got {type(obj).__name__}")


def _pack(obj: Any) -> bytes:
    """One frame: a 4-byte big-endian length, then ``obj`` as JSON (tuples become lists).
    Raises TypeError for a value JSON cannot hold (a bug: everything sent is built from JSON)."""
    data = json.dumps(obj, separators=(",", ":"), default=_refuse).encode("ascii")
    return FRAME.pack(len(data)) + data


def _unpack(body: bytes) -> Any:
    return json.loads(body)


def _wire_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical rows (:func:`engine.serve.record.canonical_row`) without their ``timestamp``
    (a ``pd.Timestamp``; ``ts_ns`` holds the same instant in int nanoseconds)."""
    return [{k: v for k, v in r.items() if k != "timestamp"} for r in rows]


def _unwire_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The inverse of :func:`_wire_rows`: ``timestamp`` rebuilt from ``ts_ns`` (naive UTC)."""
    import pandas as pd

    for r in rows:
        r["timestamp"] = pd.Timestamp(r["ts_ns"], unit="ns")
    return rows


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _recv(sock: socket.socket) -> Any:
    """One frame from a blocking socket; None at end of stream (the other process is gone)."""
    head = _recv_exact(sock, FRAME.size)
    if head is None:
        return None
    body = _recv_exact(sock, FRAME.unpack(head)[0])
    return None if body is None else _unpack(body)


# ------------------------------------------------------------------------------------- scorer side
def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent (the front) dies (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _stop_on_sigterm(*_) -> None:
    """SIGTERM: leave the message loop (its ``finally`` closes the service, ignoring later SIGTERMs:
    one arriving while the service closed raised SystemExit inside the case worker's join, so the
    history store was never closed and its WAL was left; the front closes the socket, which also
    ends the loop, and then terminates the scorer)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(0)


def _open_service(opts: dict[str, Any]):
    from engine.model.checkpoint import load_checkpoint
    from engine.serve.history import HistoryLocked
    from engine.serve.service import ScoringService

    try:
        bundle = load_checkpoint(opts["model"])
    except (FileNotFoundError, ValueError) as e:
        raise ScorerStartError(f"checkpoint refused: {e}") from None
    if bundle.sha256 != opts["sha256"]:
        raise ScorerStartError(f"the checkpoint changed on disk while starting (sha256 {bundle.sha256[:12]}, the "
                               f"front loaded {opts['sha256'][:12]})")
    deadline = time.monotonic() + opts.get("lock_wait_s", LOCK_WAIT_S)
    while True:
        try:
            return ScoringService(bundle, opts["history"], cache_bytes=opts["cache_bytes"], shadow=opts["shadow"],
                                  case_db=opts["case_db"], explain=opts["explain"], sync=opts["sync"],
                                  explain_cpu=opts["explain_cpu"], max_ahead_s=opts.get("max_ahead_s", DEFAULT_MAX_AHEAD_S))
        except HistoryLocked as e:
            if time.monotonic() > deadline:
                raise ScorerStartError(f"cannot open the history store {opts['history']}: {e}") from None
            time.sleep(0.05)
        except Exception as e:  # noqa: BLE001 - one line naming the store
            raise ScorerStartError(f"cannot open the history store {opts['history']}: {e}") from None


def _dispatch(service, kind: str, payload: Any) -> Any:
    if kind == "score":
        return service.score_rows(_unwire_rows(payload))
    if kind == "batch":
        return service.score_batch(payload)
    if kind == "health":
        return service.health()
    if kind == "explanation":
        return service.explanation(payload)
    if kind == "metrics":
        return service.metrics_state()
    raise ValueError(f"unknown message {kind!r}")


def scorer_main(fd: int, opts: dict[str, Any]) -> int:
    """The scoring process: open the service (and warm it), answer ``("ready", info)`` or
    ``("error", message)``, then answer each message in order until the front closes the socket
    or SIGTERM. Returns the exit status."""
    _die_with_parent()
    import torch

    torch.set_num_threads(1)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    sock = socket.socket(fileno=fd)
    try:
        service = _open_service(opts)
    except ScorerStartError as e:
        sock.sendall(_pack(("error", str(e))))
        return 2
    try:
        info: dict[str, Any] = {"pid": os.getpid()}
        if opts.get("warm"):
            from engine.serve.warm import warm_start

            try:
                warm = warm_start(service, opts["warm"], log=lambda m: print(m, flush=True))
                # the counts only: the front uses none of it, and the log above names the first rejected rows
                info["warm"] = {k: v for k, v in warm.items() if k != "rejected_rows"}
            except (FileNotFoundError, ValueError) as e:
                sock.sendall(_pack(("error", f"--warm {opts['warm']}: {e}")))
                return 2
        sock.sendall(_pack(("ready", info)))
        while True:
            msg = _recv(sock)
            if msg is None:  # the front is gone
                return 0
            kind, payload = msg
            try:
                out = ("ok", _dispatch(service, kind, payload))
            except ServiceError as e:
                out = ("service_error", (e.status, e.detail))
            except Exception as e:  # noqa: BLE001 - answered as a 500 naming the error; logged with its traceback
                log.exception("scorer: unexpected error in %s", kind)
                out = ("error", f"{type(e).__name__}: {e}")
            sock.sendall(_pack(out))
    finally:
        # the front's SIGTERM may arrive while the service closes (after it closed the socket, or a
        # second one): it must not cut the close short (the history store's WAL would be left)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        service.close()


# ------------------------------------------------------------------------------------- front side
class _Waiting:
    __slots__ = ("score", "futures")

    def __init__(self, score: bool, futures: list):
        self.score, self.futures = score, futures


class RemoteService:
    """The front's stand-in for :class:`~engine.serve.service.ScoringService` (what
    :func:`engine.serve.api.create_app` needs of it), backed by a scoring child process.

    Starting blocks until the scorer has loaded the checkpoint, opened the history store and
    applied ``warm`` (its ``("ready", ...)``), then the asyncio side is set up lazily in the event
    loop of the first request (all requests must come from that one loop: uvicorn's).

    Args:
        bundle: the checkpoint the front validated (its ``path`` is handed to the scorer, which
            loads and validates it again and checks the sha256).
        history_path, cache_bytes, shadow, case_db, explain, sync, explain_cpu, max_ahead_s: as
            :class:`~engine.serve.service.ScoringService`.
        warm: a transactions file appended to the history store before serving (or None).
        start_timeout_s: most seconds to wait for the scorer to be ready.
    Raises:
        ScorerStartError: the scorer refused the checkpoint, the history store or the warm file,
            or exited / timed out before it was ready.
    """

    remote = True

    def __init__(self, bundle, history_path, *, cache_bytes: int, shadow: bool, case_db, explain: str, sync: str,
                 explain_cpu: float, warm: str | Path | None = None, start_timeout_s: float = 600.0,
                 max_ahead_s: float | None = DEFAULT_MAX_AHEAD_S):
        if bundle.path is None:
            raise ScorerStartError("the scoring process loads the checkpoint from disk: the bundle has no path")
        self.bundle, self.spec, self.sync, self.shadow = bundle, bundle.spec, sync, shadow
        self.history_path = Path(history_path)
        opts = {"model": str(bundle.path), "sha256": bundle.sha256, "history": str(history_path),
                "cache_bytes": int(cache_bytes), "shadow": bool(shadow),
                "case_db": None if case_db is None else str(case_db), "explain": explain, "sync": sync,
                "explain_cpu": float(explain_cpu), "warm": None if warm is None else str(warm),
                "max_ahead_s": max_ahead_s}
        front, child = socket.socketpair()
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "engine.serve.scorer", str(child.fileno()), json.dumps(opts)],
                pass_fds=[child.fileno()], env={**os.environ, "OMP_NUM_THREADS": "1"})
        finally:
            child.close()
        front.settimeout(start_timeout_s)
        try:
            msg = _recv(front)
        except socket.timeout:
            msg = ("error", f"the scoring process was not ready after {start_timeout_s:.0f} s")
        if msg is None or msg[0] != "ready":
            self.process.kill()
            self.process.wait(10)
            front.close()
            raise ScorerStartError(msg[1] if msg else f"the scoring process exited (status {self.process.returncode}) "
                                   "before it was ready; its output says why")
        front.setblocking(False)
        self.sock, self.info = front, msg[1]
        self.rejected_here = 0  # 422s answered by the front (never sent to the scorer)
        self.broken: str | None = None
        self.on_broken = None  # called (in the event loop) once the scorer is gone; fraudlens serve stops uvicorn
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer = None
        self._opened: asyncio.Future | None = None
        self._queue: list[tuple[dict, asyncio.Future]] = []
        self._waiting: deque[_Waiting] = deque()
        self._score_busy = False
        self.batches = 0  # dynamic batches sent
        self.batched_rows = 0

    # -------------------------------------------------------------- channel
    async def _ensure(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            if self._writer is None:  # another request is setting the channel up
                await asyncio.shield(self._opened)
            return
        if self._loop is not None:
            raise RuntimeError("RemoteService: every request must come from the event loop of the first one")
        self._loop, self._opened = loop, loop.create_future()
        reader, writer = await asyncio.open_connection(sock=self.sock)
        self._writer = writer
        loop.create_task(self._read_loop(reader))
        self._opened.set_result(None)

    async def _read_loop(self, reader) -> None:
        try:
            while True:
                head = await reader.readexactly(FRAME.size)
                kind, payload = _unpack(await reader.readexactly(FRAME.unpack(head)[0]))
                w = self._waiting.popleft()
                if w.score and kind == "ok":
                    for fut, res in zip(w.futures, payload):
                        if not fut.done():
                            fut.set_result(res)
                else:
                    for fut in w.futures:
                        if fut.done():
                            continue
                        if kind == "ok":
                            fut.set_result(payload)
                        elif kind == "service_error":
                            fut.set_exception(ServiceError(*payload))
                        else:
                            fut.set_exception(ServiceError(500, [{"loc": [], "msg": f"internal error ({payload}); "
                                                                  "see the service log", "type": "internal_error"}]))
                if w.score:
                    self._score_busy = False
                    self._flush()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            self._fail_all("the scoring process exited")

    def _fail_all(self, why: str) -> None:
        self.broken = why
        err = ServiceError(503, [{"loc": [], "msg": f"{why}; the service is restarting", "type": "scorer_unavailable"}])
        futs = [f for w in self._waiting for f in w.futures] + [f for _, f in self._queue]
        self._waiting.clear()
        self._queue.clear()
        for f in futs:
            if not f.done():
                f.set_exception(err)
        log.error("fraudlens serve: %s (status %s); shutting down", why, self.process.poll())
        # the front cannot score without it: stop (after answering the waiting requests), for the
        # supervisor to restart the whole service
        if self.on_broken is not None:
            self._loop.call_later(0.2, self.on_broken)

    def _check(self) -> None:
        if self.broken:
            raise ServiceError(503, [{"loc": [], "msg": f"{self.broken}; the service is restarting",
                                      "type": "scorer_unavailable"}])

    def _flush(self) -> None:
        if not self._queue or self.broken:
            return
        batch, self._queue = self._queue[:MAX_DYNAMIC_BATCH], self._queue[MAX_DYNAMIC_BATCH:]
        self._score_busy = True
        self.batches += 1
        self.batched_rows += len(batch)
        self._waiting.append(_Waiting(True, [f for _, f in batch]))
        self._writer.write(_pack(("score", _wire_rows([r for r, _ in batch]))))

    # -------------------------------------------------------------- what create_app calls
    async def score_row(self, row: dict[str, Any]) -> tuple:
        """Score one canonical row (dynamic batching, module docstring): ``("ok", body, flagged)``
        or ``("err", status, detail)`` as :meth:`ScoringService.score_rows` answers."""
        await self._ensure()
        self._check()
        fut = self._loop.create_future()
        self._queue.append((row, fut))
        if not self._score_busy:
            self._flush()
        return await fut

    async def call(self, kind: str, payload: Any = None) -> Any:
        """One message to the scorer (``batch``, ``health``, ``explanation``, ``metrics``), answered
        in order with the scores. Raises ServiceError as the service would (503 when the scorer is gone)."""
        await self._ensure()
        self._check()
        fut = self._loop.create_future()
        self._waiting.append(_Waiting(False, [fut]))
        self._writer.write(_pack((kind, payload)))
        return await fut

    def count_rejected(self, n: int) -> None:
        self.rejected_here += n

    def close(self, timeout: float = 30.0) -> None:
        """Stop the scorer (SIGTERM: it closes the history store and the case worker) and wait for it."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        try:
            self.sock.close()
        except OSError:
            pass


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s fraudlens scorer %(levelname)s %(message)s")
    sys.exit(scorer_main(int(sys.argv[1]), json.loads(sys.argv[2])))
