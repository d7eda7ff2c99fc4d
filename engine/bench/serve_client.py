"""The load generator of ``fraudlens bench serve``: concurrent HTTP/1.1 keep-alive clients on
asyncio (uvloop when installed), in a process of their own.

Why not ``http.client`` in threads of the bench process: on a 2-core machine the load generator
shares the cores with the server, and ``http.client`` parses every response's headers with the
``email`` package (~0.2 ms of CPU per request, under one GIL for all client threads), so the
clients, not the server, set the latency at a few hundred requests per second. Here each client
is a coroutine on one connection that writes a pre-built request and reads the status line,
the headers up to the blank line and ``Content-Length`` bytes of body (uvicorn always sends a
``Content-Length`` for these routes; a chunked or unparsable response counts as an error).

Run as ``python -m engine.bench.serve_client JOB.json OUT.json``. ``JOB`` holds ``port``,
``lanes`` (one list of JSON request bodies, as text, per client), ``rate`` (requests per second
per client, or null for unpaced), ``seconds`` (time limit after the start) and ``path``
(``/v1/score``). ``OUT`` receives, per client, ``client_ms`` (send of the request to the last
byte of its response, milliseconds, ``time.perf_counter``), ``server_ms`` (the response's
``latency_ms``), ``acked`` (transaction ids answered 200), ``errors`` (kind -> count), and
``wall_s`` (first send to last response, seconds) for the whole run. It prints ``started`` when
the clients start (after their connections are open).

Paced clients send request ``i`` at ``t0 + c / (n rate) + i / rate`` (client ``c`` of ``n``:
the clients' requests interleave evenly, one every ``1 / (n rate)`` s in all) or, when behind, at once; the latency is
measured from the actual send (a closed-loop client: if the server stalls, later requests are
sent late rather than queued, so the achieved throughput column shows when the rate was not met).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path


def _request(path: str, body: bytes, port: int) -> bytes:
    # Host with the port: the service bound to loopback refuses any other Host (engine/serve/guard.py)
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """``(status, body)`` of one HTTP/1.1 response with a ``Content-Length``.

    Raises:
        ValueError: no ``Content-Length`` (e.g. chunked) or a malformed status line.
        asyncio.IncompleteReadError: the connection closed mid-response.
    """
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = None
    for h in lines[1:]:
        k, _, v = h.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
            break
    if length is None:
        raise ValueError("response without Content-Length")
    return status, await reader.readexactly(length)


async def _client(port: int, bodies: list[bytes], path: str, rate: float | None, t_end: float,
                  start: asyncio.Event, offset: float = 0.0) -> dict:
    reqs = [_request(path, b, port) for b in bodies]
    cms, sms, acked, errors = [], [], [], {}

    def err(kind: str) -> None:
        errors[kind] = errors.get(kind, 0) + 1

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await start.wait()
    t0 = time.perf_counter() + offset
    for i, req in enumerate(reqs):
        if rate:
            wait = t0 + i / rate - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
        if time.perf_counter() >= t_end:
            break
        t = time.perf_counter()
        try:
            writer.write(req)
            status, data = await asyncio.wait_for(_read_response(reader), timeout=10)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as e:
            err(type(e).__name__)
            writer.close()
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                break  # the server is gone (a kill -9 run): stop this client
            continue
        dt = (time.perf_counter() - t) * 1000.0
        if status != 200:
            err(f"HTTP {status}")
            continue
        b = json.loads(data)
        cms.append(dt)
        sms.append(b["latency_ms"])
        acked.append(b["transaction_id"])
    writer.close()
    return {"client_ms": cms, "server_ms": sms, "acked": acked, "errors": errors}


async def _main(job: dict) -> dict:
    start = asyncio.Event()
    t_end = time.perf_counter() + float(job["seconds"]) + 1.0
    n, rate = len(job["lanes"]), job["rate"]
    # paced: client c starts c / (n * rate) s late, so the n clients' requests interleave evenly
    # (all starting together would send them in bursts of n at the same instants)
    tasks = [asyncio.ensure_future(_client(int(job["port"]), [b.encode() for b in lane], job.get("path", "/v1/score"),
                                           rate, t_end, start, c / (n * rate) if rate else 0.0))
             for c, lane in enumerate(job["lanes"])]
    await asyncio.sleep(0.2)  # connections open before the clock starts
    t0 = time.perf_counter()
    start.set()
    print("started", flush=True)  # the bench runner starts its CPU clock / kill timer here
    clients = await asyncio.gather(*tasks)
    return {"clients": clients, "wall_s": time.perf_counter() - t0}


def main(argv: list[str]) -> None:
    """Entry point: ``serve_client JOB.json OUT.json`` (module docstring)."""
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    try:
        import uvloop

        run = uvloop.run
    except ImportError:  # uvloop is Linux / macOS only
        run = asyncio.run
    out = run(_main(job))
    Path(argv[1]).write_text(json.dumps(out), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
