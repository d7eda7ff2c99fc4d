"""Load test of ``fraudlens serve`` on loopback: throughput, latency and errors at 1, 8 and 32
concurrent clients, paced (a target rate) and unpaced (as fast as the clients can), plus a
``kill -9`` of the server mid-run (acknowledged transactions lost must be 0).

Each run starts from fresh entity ids (the run and client number are prefixed to the entity
and transaction ids), and each client replays its own copy of the dataset's transactions in
time order, so no two clients post to the same entity and every transaction is in order:
TabFormer user 0 (5 cards; each client replays the file from its start, so a card's history
grows past the model's context) and the first ``handbook_rows`` Handbook transactions in time
order (thousands of customers, a few transactions each; the delayed terminal aggregates are
computed by :func:`engine.data.io.read_transactions` and posted as the caller's feature-store
values). Every run is bounded by a request count and a time limit.

Latency is measured twice: client side (send to full response, ``time.perf_counter``; the
clients are :mod:`engine.bench.serve_client`: asyncio keep-alive connections in a child
process, on the same cores as the server) and server side (the response's ``latency_ms``: arrival to response).
"""

from __future__ import annotations

import csv
import http.client
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RunResult:
    """One load run: per-request client / server latencies (ms), errors, wall time."""

    dataset: str
    clients: int
    mode: str
    sync: str = "full"
    processes: str = "one"  # fraudlens serve --processes: one, or two (front + scorer)
    client_ms: list[float] = field(default_factory=list)
    server_ms: list[float] = field(default_factory=list)
    errors: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    server_cpu_s: float = float("nan")  # CPU seconds of the server (front + scorer process) during the run
    worker_cpu_s: float = float("nan")  # CPU seconds of its other descendants (the case worker) during the run
    acked: dict[int, list[str]] = field(default_factory=dict)  # client -> acknowledged transaction ids
    rate: float = float("nan")  # paced: the target rate in all (tx/s)

    def meets(self, p99_ms: float) -> bool:
        """A paced run that reached >= 95 % of its rate with 0 errors and client p99 <= ``p99_ms``."""
        n = len(self.client_ms)
        return bool(n and self.errors == 0 and self.wall_s and n / self.wall_s >= 0.95 * self.rate
                    and np.percentile(self.client_ms, 99) <= p99_ms)

    def row(self) -> list[str]:
        n = len(self.client_ms)
        c = np.percentile(self.client_ms, [50, 99, 99.9]) if n else [np.nan] * 3
        s = np.percentile(self.server_ms, [50, 99, 99.9]) if n else [np.nan] * 3
        cpu = f"{1000 * self.server_cpu_s / n:.2f}" if n and self.server_cpu_s == self.server_cpu_s else "-"
        wcpu = f"{1000 * self.worker_cpu_s / n:.2f}" if n and self.worker_cpu_s == self.worker_cpu_s else "-"
        return [self.dataset, self.sync, self.processes, str(self.clients), self.mode, f"{n + self.errors:,}", f"{self.errors:,}",
                f"{n / self.wall_s:,.0f}" if self.wall_s else "-", *(f"{x:.2f}" for x in c), *(f"{x:.2f}" for x in s),
                cpu, wcpu]


HEADER = ["dataset", "sync", "processes", "clients", "mode", "requests", "errors", "throughput (tx/s)", "client p50 ms", "client p99 ms",
          "client p99.9 ms", "server p50 ms", "server p99 ms", "server p99.9 ms", "server CPU ms/tx",
          "worker CPU ms/tx"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def serving_cpu_seconds(pid: int) -> tuple[float, float]:
    """``(serving, background)`` CPU seconds of the server ``pid`` and its descendants: serving =
    the server process plus its scoring process (``--processes two``: engine/serve/scorer.py), the
    processes every request passes through; background = every other descendant (the case worker,
    the multiprocessing resource tracker)."""
    serving, background = cpu_seconds(pid), 0.0
    stack = [(k, True) for k in _children(pid)]
    while stack:
        k, direct = stack.pop()
        try:
            cmd = Path(f"/proc/{k}/cmdline").read_bytes()
            c = cpu_seconds(k)
        except OSError:
            continue
        if direct and b"engine.serve.scorer" in cmd:
            serving += c
        else:
            background += c
        stack += [(g, False) for g in _children(k)]
    return serving, background


def children_cpu_seconds(pid: int) -> float:
    """CPU seconds of the live child processes of ``pid`` (the server's case worker and the
    multiprocessing resource tracker; Linux ``/proc/<pid>/task/*/children``)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = (task / "children").read_text().split()
        except OSError:
            continue
        for k in kids:
            try:
                total += cpu_seconds(int(k))
            except OSError:
                pass
    return total


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
def tabformer_records(path: Path, limit: int) -> tuple[list[dict], str]:
    """The first ``limit`` rows of the TabFormer file as posted JSON (raw cells, text)."""
    from engine.data.spec import load_spec

    spec = load_spec("tabformer")
    cols = spec.required_columns()
    out = []
    with open(path, newline="", encoding="utf-8") as f:
        for i, r in enumerate(csv.DictReader(f)):
            if i >= limit:
                break
            out.append({c: r[c] for c in cols if c != spec.label.column} | {"transaction_id": str(i)})
    return out, "User"


def handbook_records(path: Path, n_rows: int) -> tuple[list[dict], str]:
    """The first ``n_rows`` Handbook transactions in time order, with their delayed aggregates."""
    from engine.data.io import read_transactions
    from engine.data.spec import load_spec

    spec = load_spec("handbook")
    fr = read_transactions(path, spec, max_rows=n_rows).frame.sort_values(["timestamp", "row_number"])
    aggs = [c for a in spec.aggregates for c in a.columns()]
    out = []
    for r in fr.to_dict("records"):
        rec = {"TRANSACTION_ID": r["transaction_id"], "CUSTOMER_ID": r["entity_id"],
               "TX_DATETIME": r["timestamp"].isoformat(), "TX_AMOUNT": r["amount"], "TERMINAL_ID": r["terminal"],
               "TX_FRAUD_SCENARIO": r.get("TX_FRAUD_SCENARIO")}
        rec.update({c: float(r[c]) for c in aggs})
        out.append(rec)
    return out, "CUSTOMER_ID"


def _lane(records: list[dict], entity_key: str, id_key: str, prefix: str) -> list[bytes]:
    """The records with ``prefix`` on the entity and transaction ids, as JSON bodies."""
    return [json.dumps({**r, entity_key: f"{prefix}{r[entity_key]}", id_key: f"{prefix}{r[id_key]}"}).encode()
            for r in records]


# ---------------------------------------------------------------------------------------------
# server and clients
# ---------------------------------------------------------------------------------------------
def _server_stack() -> str:
    """The event loop and HTTP parser uvicorn picks (``auto``: uvloop / httptools when installed)."""
    import importlib.util

    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    return f"{loop}, HTTP parser {'httptools' if importlib.util.find_spec('httptools') else 'h11'}"


def target_rows(results: list[RunResult]) -> list[str]:
    """Markdown rows of the target table (see :func:`run`): per (dataset, sync, clients), the
    highest paced rate whose run reached >= 95 % of it with 0 errors and client p99 <= 5 ms."""
    groups: dict[tuple, list[RunResult]] = {}
    for r in results:
        if r.mode.startswith("paced"):
            groups.setdefault((r.dataset, r.sync, r.processes, r.clients), []).append(r)
    rows = []
    for (ds, sync, procs, c), runs in groups.items():
        ok = [r.rate for r in runs if r.meets(5.0)]
        best = f"{max(ok):,.0f} tx/s" if ok else "none"
        at_1000 = any(r.rate >= 1000 and r.meets(5.0) for r in runs)
        rows.append(f"| {ds} | {sync} | {procs} | {c} | {best} | {'yes' if at_1000 else 'no'} |")
    return rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path | None, work: Path, port: int, explain: str = "occlusion",
                 sync: str = "full", processes: str = "one") -> subprocess.Popen:
    """``fraudlens serve`` on 127.0.0.1:``port`` in a subprocess; returns once it prints ``ready``."""
    cmd = [sys.executable, "-m", "engine.cli", "serve", "--port", str(port), "--history", str(work / "history.sqlite3"),
           "--cases", str(work / "cases.sqlite3"), "--explain", explain, "--sync", sync,
           "--processes", processes]
    if model is not None:
        cmd += ["--model", str(model)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "FRAUDLENS_DATA_DIR": str(work / "data")}
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    deadline = time.time() + 180
    while time.time() < deadline:
        line = p.stdout.readline()
        lines.append(line)
        if line.strip() == "ready":
            threading.Thread(target=p.stdout.read, daemon=True).start()
            return p
        if not line and p.poll() is not None:
            break
    p.kill()
    raise RuntimeError("the server did not start:\n" + "".join(lines[-20:]))


def _alive(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def load_run(port: int, records: list[dict], entity_key: str, id_key: str, dataset: str, clients: int,
             rate: float | None, count: int, seconds: float, run_id: str, kill_after: float | None = None,
             server: subprocess.Popen | None = None, sync: str = "full", processes: str = "one") -> RunResult:
    """``clients`` concurrent clients (:mod:`engine.bench.serve_client`, in a child process) post
    their lanes (``count`` requests in all, at ``rate`` tx/s in all, or unpaced with
    ``rate=None``) for at most ``seconds``; with ``kill_after``, SIGKILL ``server`` then."""
    per = max(1, count // clients)
    lanes = [[b.decode() for b in _lane(records[:per], entity_key, id_key, f"{run_id}c{c}x")] for c in range(clients)]
    res = RunResult(dataset, clients, "unpaced" if rate is None else f"paced {rate:,.0f}/s", sync,
                    rate=float("nan") if rate is None else float(rate), processes=processes)
    with tempfile.TemporaryDirectory(prefix="fraudlens-load-") as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job.write_text(json.dumps({"port": port, "lanes": lanes, "rate": None if rate is None else rate / clients,
                                   "seconds": seconds}), encoding="utf-8")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        p = subprocess.Popen([sys.executable, "-m", "engine.bench.serve_client", str(job), str(out)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = p.stdout.readline()
        if line.strip() != "started":
            p.kill()
            raise RuntimeError(f"the load clients did not start: {line}{p.stderr.read()[-2000:]}")
        cpu0, wcpu0 = serving_cpu_seconds(server.pid) if server is not None and kill_after is None else (None, None)
        if kill_after is not None and server is not None:
            time.sleep(kill_after)
            os.kill(server.pid, signal.SIGKILL)
            server.wait(10)
        _, stderr = p.communicate(timeout=seconds + 60)
        if cpu0 is not None:
            cpu1, wcpu1 = serving_cpu_seconds(server.pid)
            res.server_cpu_s, res.worker_cpu_s = cpu1 - cpu0, wcpu1 - wcpu0
        if p.returncode != 0:
            raise RuntimeError(f"the load clients failed (exit {p.returncode}): {stderr[-2000:]}")
        data = json.loads(out.read_text(encoding="utf-8"))
    res.wall_s = data["wall_s"]
    for cid, c in enumerate(data["clients"]):
        res.client_ms += c["client_ms"]
        res.server_ms += c["server_ms"]
        res.acked[cid] = c["acked"]
        for k, v in c["errors"].items():
            res.error_kinds[k] = res.error_kinds.get(k, 0) + v
            res.errors += v
    return res


def lost_after_kill(work: Path, res: RunResult) -> tuple[int, int, int]:
    """(acknowledged, lost, stored) after a kill: acknowledged ids missing from the history store."""
    with sqlite3.connect(work / "history.sqlite3") as con:
        stored = {r[0] for r in con.execute("SELECT transaction_id FROM transactions")}
    acked = {t for ids in res.acked.values() for t in ids}
    return len(acked), len(acked - stored), len(stored)


def kill_check(model: Path | None, records: list[dict], entity_key: str, id_key: str, dataset: str, work: Path,
               clients: int, rate: float, log, sync: str = "full", processes: str = "one") -> dict:
    """Post at ``rate`` from ``clients`` clients, ``kill -9`` the server after 2 s, restart it, and
    count acknowledged transactions missing from the history store and duplicates appended by
    retrying each client's last acknowledged transaction."""
    port = free_port()
    server = start_server(model, work, port, sync=sync, processes=processes)
    res = load_run(port, records, entity_key, id_key, dataset, clients, rate, int(rate * 6), 6.0, "kill",
                   kill_after=2.0, server=server, sync=sync, processes=processes)
    acked, lost, stored = lost_after_kill(work, res)
    server = start_server(model, work, port, sync=sync, processes=processes)
    try:
        dups = 0
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        by_id = {json.loads(b)[id_key]: b for c in range(clients)
                 for b in _lane(records[: max(1, int(rate * 6) // clients)], entity_key, id_key, f"killc{c}x")}
        for ids in res.acked.values():
            if ids:
                conn.request("POST", "/v1/score", by_id[ids[-1]], {"Content-Type": "application/json"})
                r = conn.getresponse()
                dups += int(json.loads(r.read()).get("duplicate", False))
        conn.request("GET", "/healthz")
        after = json.loads(conn.getresponse().read())["history_transactions"]
        conn.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    out = {"dataset": dataset, "sync": sync, "processes": processes, "clients": clients, "acknowledged": acked, "lost": lost, "stored": stored,
           "retried": sum(1 for ids in res.acked.values() if ids), "answered_as_duplicate": dups,
           "appended_by_retries": after - stored}
    log(f"kill -9 check ({dataset}): {out}")
    return out


def run(tab_model: Path | None, hb_model: Path | None, tabformer: Path, handbook: Path | None, out: Path, *,
        clients=(1, 8, 32), rates=(250.0, 500.0, 1000.0), seconds: float = 5.0, handbook_rows: int = 30_000,
        max_unpaced: int = 20_000, syncs=("full", "normal"), processes=("two",), log=print) -> str:
    """All runs (module docstring); writes the markdown table to ``out`` and returns it."""
    datasets = [("TabFormer user 0 (demo model)" if tab_model is None else f"TabFormer user 0 ({tab_model.name})",
                 tab_model, *tabformer_records(tabformer, 20_000), "transaction_id")]
    if handbook is not None and hb_model is not None:
        recs, ek = handbook_records(handbook, handbook_rows)
        datasets.append((f"Handbook first {handbook_rows:,} ({hb_model.name})", hb_model, recs, ek, "TRANSACTION_ID"))
    results, kills = [], []
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fraudlens-serve-bench-") as tmp:
        for di, (name, model, records, ek, ik) in enumerate(datasets):
            for sync, procs in ((s, p) for s in syncs for p in processes):
                work = Path(tmp) / f"d{di}{sync}{procs}"
                work.mkdir()
                port = free_port()
                server = start_server(model, work, port, sync=sync, processes=procs)
                try:
                    for c in clients:
                        for mode_rate in (*rates, None):
                            count = int(mode_rate * seconds) if mode_rate else max_unpaced
                            r = load_run(port, records, ek, ik, name, c, mode_rate, count, seconds,
                                         f"r{len(results)}", server=server, sync=sync, processes=procs)
                            results.append(r)
                            log(" | ".join(r.row()) + (f"  errors: {r.error_kinds}" if r.errors else ""))
                finally:
                    server.send_signal(signal.SIGTERM)
                    server.wait(30)
                kwork = Path(tmp) / f"k{di}{sync}{procs}"
                kwork.mkdir()
                kills.append(kill_check(model, records, ek, ik, name, kwork, 8, max(rates), log, sync=sync,
                                        processes=procs))
    load1 = os.getloadavg()
    models = []
    from engine.model.checkpoint import load_checkpoint

    for name, model, *_ in datasets:
        b = load_checkpoint(model)
        m = b.meta.get("metrics", {}).get("test", {}) if isinstance(b.meta.get("metrics"), dict) else {}
        td = b.meta.get("training_data", {}) or {}
        cfg = b.config
        models.append(f"| {name} | `{model or 'assets/demo_model'}` | {b.short_sha} | d_model {cfg.d_model}, "
                      f"{cfg.n_layers} layers, context {cfg.context_length} | "
                      f"{td.get('rows_used', '-') if isinstance(td, dict) else '-'} | "
                      f"{b.meta.get('thresholds', {}).get('review', 0.5):.3f} | "
                      f"{m.get('auc_roc', float('nan')):.3f} / {m.get('average_precision', float('nan')):.3f} |")
    lines = ["# Scoring service load test (`fraudlens bench serve`)", "",
             f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on this machine: {os.cpu_count()} CPU "
             f"cores{' **shared with other jobs**' if load0[0] > 1.5 else ''} (1-minute load average {load0[0]:.1f} "
             f"before, {load1[0]:.1f} after), server and load clients (asyncio, one child process) on the same "
             "cores; loopback only. The server (uvicorn, one worker, event loop "
             f"{_server_stack()}; processes `one`: everything in one process; `two`: an HTTP front and a scoring "
             "process with dynamic batching, engine/serve/scorer.py; `--explain occlusion` in the case worker, a niced "
             "child process), history store on the "
             "local disk (SQLite WAL; sync `full`: one fsync per commit group, survives power loss; `normal`: no fsync "
             "per commit, survives kill -9 and process crashes, not power loss).", "",
             f"Each run: at most rate x {seconds:.0f} s requests paced at "
             f"{', '.join(f'{r:,.0f}' for r in rates)} tx/s in all, or at most "
             f"{max_unpaced:,} unpaced, for at most {seconds:.0f} s; fresh entity ids per run and client "
             "(module docstring of engine/bench/serve_load.py). Client latency: send to full response; server "
             "latency: the response's `latency_ms`. Throughput: successful responses / wall time. Server CPU "
             "ms/tx: CPU time of the server's front and scoring processes during the run / successful responses (less sensitive to "
             "the other jobs on the machine than wall-clock latency; 1,000 / it is the rate one free core "
             "could sustain); worker CPU ms/tx: the same for its child processes (the case worker: case upserts "
             "and occlusion explanations of flagged transactions, at most 0.25 of a core).", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(r.row()) + " |" for r in results]
    lines += ["", "## Target (issue 16: p99 <= 5 ms at 1,000 tx/s, 0 errors)", "",
              "Per dataset, sync mode and client count: the highest paced rate at which the run achieved at least 95 % "
              "of that rate with 0 errors and a client p99 <= 5 ms (`none`: not even the lowest).", "",
              "| dataset | sync | processes | clients | highest rate meeting p99 <= 5 ms | 1,000 tx/s met |",
              "|---|---|---|---|---|---|"]
    lines += target_rows(results)
    lines += ["", "Models (the latency depends on the architecture, not on the weights):", "",
              "| dataset | checkpoint | sha256 | architecture | training rows | review threshold | "
              "its test AUC ROC / AP |", "|---|---|---|---|---|---|---|", *models]
    lines += ["", "## kill -9 mid-run", "",
              f"8 clients paced at {max(rates):,.0f} tx/s in all, server killed with SIGKILL after 2 s, restarted; every "
              "client then retries its last acknowledged transaction.", "",
              "| dataset | sync | processes | acknowledged | lost | stored | retried | answered as duplicate | "
              "appended by retries |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {k['dataset']} | {k['sync']} | {k['processes']} | {k['acknowledged']:,} | {k['lost']} | {k['stored']:,} | {k['retried']} | "
              f"{k['answered_as_duplicate']} | {k['appended_by_retries']} |" for k in kills]
    errs = {k: v for r in results for k, v in r.error_kinds.items()}
    if errs:
        lines += ["", f"Errors by kind: {errs}"]
    text = "\n".join(lines) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return text
