"""kill -9 of the real server mid-run loses no acknowledged transaction; after a restart a
retried transaction is not appended twice and scores continue as whole-file scoring."""

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from engine.data.io import read_transactions
from engine.model.checkpoint import load_checkpoint
from engine.model.scoring import score_frame
from serve_helpers import id_spec, make_checkpoint, raw_records, write_raw

ROOT = Path(__file__).resolve().parents[3]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(ck: Path, tmp: Path, port: int, *extra: str) -> subprocess.Popen:
    """``fraudlens serve`` (``--explain none`` plus ``extra`` options) in a subprocess, once it prints ``ready``."""
    cmd = [sys.executable, "-m", "engine.cli", "serve", "--model", str(ck), "--port", str(port), "--history",
           str(tmp / "history.sqlite3"), "--cases", str(tmp / "cases.sqlite3"), "--explain", "none", *extra]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 120
    lines = []
    while time.time() < deadline:
        line = p.stdout.readline()
        lines.append(line)
        if line.strip() == "ready":
            threading.Thread(target=p.stdout.read, daemon=True).start()  # drain
            return p
        if not line and p.poll() is not None:
            break
    p.kill()
    pytest.fail("server did not start: " + "".join(lines))


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's exit may stay unreaped in a container)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _stored(tmp: Path) -> list[str]:
    with sqlite3.connect(tmp / "history.sqlite3") as con:
        return [r[0] for r in con.execute("SELECT transaction_id FROM transactions ORDER BY seq")]


def test_kill_9_loses_no_acknowledged_transaction(tmp_path):
    ck = make_checkpoint(tmp_path)
    records = raw_records()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = _start(ck, tmp_path, port)
    acked: list[str] = []
    probs: dict[str, float] = {}
    stop = threading.Event()

    def client():
        with httpx.Client(base_url=url, timeout=10) as c:
            for rec in records:
                if stop.is_set():
                    return
                try:
                    r = c.post("/v1/score", json=rec)
                except httpx.HTTPError:
                    return  # the server died mid-request: not acknowledged
                assert r.status_code == 200, r.text
                acked.append(rec["tid"])
                probs[rec["tid"]] = r.json()["probability"]

    t = threading.Thread(target=client)
    worker_pid = httpx.get(f"{url}/healthz", timeout=10).json()["case_worker"]["pid"]
    assert worker_pid and worker_pid != server.pid and _running(worker_pid)
    try:
        t.start()
        while len(acked) < 40 and t.is_alive():
            time.sleep(0.005)
        os.kill(server.pid, signal.SIGKILL)  # mid-run: the client is still posting
        server.wait(10)
        stop.set()
        t.join(20)
    finally:
        if server.poll() is None:
            server.kill()
    # the case worker process notices its service is gone and exits (no orphan explaining on)
    deadline = time.time() + 30
    while time.time() < deadline and _running(worker_pid):
        time.sleep(0.1)
    assert not _running(worker_pid)
    n_acked = len(acked)
    assert 40 <= n_acked < len(records)
    stored = _stored(tmp_path)
    assert set(acked) <= set(stored)  # every acknowledged transaction is in the history store
    assert len(stored) <= n_acked + 1  # at most the one in flight was stored without its answer

    server = _start(ck, tmp_path, port)
    try:
        with httpx.Client(base_url=url, timeout=10) as c:
            retry = c.post("/v1/score", json=records[n_acked - 1])  # a client retrying its last POST
            assert retry.status_code == 200 and retry.json()["duplicate"] is True
            assert retry.json()["probability"] == probs[acked[-1]]
            for rec in records[len(stored):]:
                r = c.post("/v1/score", json=rec)
                assert r.status_code == 200, r.text
                probs[rec["tid"]] = r.json()["probability"]
            assert c.get("/healthz").json()["history_transactions"] == len(records)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(20)
    stored = _stored(tmp_path)
    assert len(stored) == len(set(stored)) == len(records)
    # the scores across the kill and restart equal whole-file scoring of the same sequence
    bundle = load_checkpoint(ck)
    frame = read_transactions(write_raw(records, tmp_path / "all.parquet"), id_spec()).frame
    want = dict(zip(frame["transaction_id"], score_frame(bundle, frame)["probability"]))
    assert max(abs(probs[t] - want[t]) for t in probs) < 1e-5


@pytest.mark.parametrize("processes", ["one", "two"])
def test_sigterm_stops_cleanly_and_closes_the_stores(tmp_path, processes):
    """SIGTERM: uvicorn shuts down gracefully and raises the signal again once done; the server
    must still close its stores (exit status 0, the SQLite WAL checkpointed and removed, the case
    worker stopped), not die of the re-raised signal."""
    ck = make_checkpoint(tmp_path)
    port = _free_port()
    server = _start(ck, tmp_path, port, "--processes", processes, "--explain", "occlusion")
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/v1/score", json=raw_records()[0], timeout=10)
        assert r.status_code == 200, r.text
        assert (tmp_path / "history.sqlite3-wal").exists()  # open: the write-ahead log is in use
    finally:
        server.send_signal(signal.SIGTERM)
        rc = server.wait(30)
    assert rc == 0
    assert not (tmp_path / "history.sqlite3-wal").exists()
    assert _stored(tmp_path) == [raw_records()[0]["tid"]]
