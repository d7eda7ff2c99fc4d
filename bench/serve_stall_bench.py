"""How long one batch request stalls the other clients of `fraudlens serve`.

Starts `fraudlens serve` with the demo model (assets/demo_model, `--sync normal`, `--explain
none`, history and data dir in a temporary folder), then, for a small (~0.3 MiB) and a large
(~15.6 MiB, near the 16 MiB cap) batch of 1,000 TabFormer-style transactions, posts the batch
while a second client polls `GET /metrics` (which takes no service lock) every millisecond, and
prints one markdown table row per batch: the batch's time and the pollers' p50 / max latency
(milliseconds, client side). The ~15.6 MiB body pads every transaction with an unused 16,000
character key.

Run from the repository root: ``python bench/serve_stall_bench.py``.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch(tag: str, pad: int) -> bytes:
    items = [{"transaction_id": f"{tag}-{i}", "User": "7", "Card": str(i % 50), "Year": 2023, "Month": 1, "Day": 8,
              "Time": "19:06", "Amount": "$17.23", "Use Chip": "Swipe Transaction",
              "Merchant Name": "1831127981380885984", "Merchant City": "Hialeah", "Merchant State": "FL",
              "Zip": "33010.0", "MCC": "5912", "Errors?": "", "pad": "x" * pad} for i in range(1000)]
    return json.dumps({"transactions": items}).encode()


def _measure(port: int, body: bytes, path: str = "/metrics") -> tuple[int, float, float, float, int]:
    lat: list[float] = []
    stop = threading.Event()

    def poll():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while not stop.is_set():
            t = time.perf_counter()
            c.request("GET", path)
            c.getresponse().read()
            lat.append(time.perf_counter() - t)
            time.sleep(0.001)

    th = threading.Thread(target=poll)
    th.start()
    time.sleep(0.3)
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    t = time.perf_counter()
    c.request("POST", "/v1/score/batch", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    r.read()
    dt = time.perf_counter() - t
    time.sleep(0.3)
    stop.set()
    th.join()
    lat.sort()
    return r.status, dt * 1000, lat[len(lat) // 2] * 1000, lat[-1] * 1000, len(lat)


def main() -> None:
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="serve-stall-") as tmp:
        env = {**os.environ, "FRAUDLENS_DATA_DIR": tmp, "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "engine.cli", "serve", "--model", str(ROOT / "assets/demo_model"), "--port",
               str(port), "--sync", "normal", "--explain", "none", "--history", f"{tmp}/history.sqlite3"]
        p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for line in p.stdout:
                if line.strip() == "ready":
                    break
            print("| batch body | status | batch ms | /metrics p50 ms | /metrics max ms | polls |")
            print("|---|---|---|---|---|---|")
            for tag, pad in (("small", 0), ("large", 16000)):
                body = _batch(tag, pad)
                status, dt, p50, mx, n = _measure(port, body)
                print(f"| {len(body) / 2**20:.2f} MiB | {status} | {dt:.0f} | {p50:.1f} | {mx:.1f} | {n} |")
        finally:
            p.terminate()
            p.wait(10)


if __name__ == "__main__":
    main()
