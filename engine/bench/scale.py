"""``fraudlens bench scale``: throughput and peak memory of ``fraudlens score`` from 1.75M to 50M rows.

Each measurement runs the real command (``python -m engine.cli score ...``) as a child process
and reads its resource usage from ``os.wait4`` (wall seconds, CPU seconds user + system, peak
resident set size of that process; the scorer is one process, DuckDB's threads included). The
files: the Handbook file (1.75M rows) scored in memory and with ``--partitions``, and files of
``fraudlens simulate --rows N`` (Handbook-like, :mod:`engine.data.simulate.handbook`) scored with
``--partitions``. The 1-minute load average before and after each run is printed too: on a
shared machine the wall time depends on the other work, the CPU time much less.

Results are kept per case in ``bench/results/scale.json`` (a later run with other ``--rows``
replaces only its own cases) and written as the table ``bench/results/scale.md``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
#: rows per partition the bench uses (peak memory grows with it, not with the file)
ROWS_PER_PARTITION = 1_500_000


def partitions_for(rows: int, rows_per_partition: int = ROWS_PER_PARTITION) -> int:
    """The number of entity partitions the bench uses for ``rows`` records (>= 1)."""
    return max(1, math.ceil(rows / rows_per_partition))


def measure(args: list[str], log_path: Path | None = None) -> dict:
    """Run ``python -m engine.cli`` with ``args`` in a child process; its wall seconds, CPU
    seconds (user + system), peak RSS (MiB, ``ru_maxrss``), exit status and load averages.

    Raises:
        RuntimeError: the command failed (names its exit status and the end of its output).
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with open(log_path or os.devnull, "w") as log:
        p = subprocess.Popen([sys.executable, "-m", "engine.cli", *args], cwd=ROOT, env=env, stdout=log,
                             stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        tail = Path(log_path).read_text()[-800:] if log_path else ""
        raise RuntimeError(f"fraudlens {' '.join(args)} exited with {code}: {tail}")
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "peak_rss_mib": ru.ru_maxrss / 1024,
            "load_before": load0, "load_after": os.getloadavg()[0]}


def _case(name: str, data: Path, rows: int, model: Path, partitions: int, tmp: Path, memory_limit: str) -> dict:
    slug = name.replace(" ", "_")
    out = tmp / f"scores_{slug}.parquet"
    args = ["score", "--data", str(data), "--model", str(model), "--out", str(out)]
    if partitions:
        args += ["--partitions", str(partitions), "--memory-limit", memory_limit, "--tmp-dir", str(tmp)]
    r = measure(args, tmp / f"score_{slug}.log")
    import pyarrow.parquet as pq

    written = pq.ParquetFile(out).metadata.num_rows
    out.unlink()
    if written != rows:
        raise RuntimeError(f"{name}: {written:,} rows written for {rows:,} input rows")
    from engine.model.checkpoint import load_checkpoint

    r.update(case=name, rows=rows, partitions=partitions, memory_limit=memory_limit if partitions else "",
             model_sha256=load_checkpoint(model).sha256,
             rows_per_s=rows / r["wall_s"], rows_per_cpu_s=rows / r["cpu_s"],
             finished=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    return r


def run(model: Path, handbook: Path, rows: list[int], tmp: Path, *, seed: int = 0, memory_limit: str = "1GB",
        keep_files: bool = False, in_memory: bool = True, log=print) -> str:
    """Measure the Handbook file (in memory and partitioned) and generated files of ``rows``
    records; write ``bench/results/scale.{json,md}``; returns the markdown."""
    import pyarrow.parquet as pq

    tmp.mkdir(parents=True, exist_ok=True)
    store = RESULTS / "scale.json"
    from engine.model.checkpoint import load_checkpoint

    sha = load_checkpoint(model).sha256
    # cases of another model are dropped: throughput depends on the architecture (a table mixing
    # models would compare unlike things)
    done = {r["case"]: r for r in json.loads(store.read_text()) if r.get("model_sha256") == sha} if store.exists() else {}

    def keep(r: dict) -> None:
        if store.exists():  # another bench run may have added cases meanwhile
            done.update({x["case"]: x for x in json.loads(store.read_text()) if x.get("model_sha256") == sha})
        done[r["case"]] = r
        store.parent.mkdir(parents=True, exist_ok=True)
        store.write_text(json.dumps(sorted(done.values(), key=lambda x: (x["rows"], x["partitions"])), indent=1))
        log(f"{r['case']}: {r['rows']:,} rows, {r['partitions']} partitions: {r['wall_s']:.0f} s wall, "
            f"{r['cpu_s']:.0f} s CPU, {r['rows_per_s']:,.0f} rows/s, peak RSS {r['peak_rss_mib']:,.0f} MiB, "
            f"load {r['load_before']:.1f} -> {r['load_after']:.1f}")

    hb_rows = pq.ParquetFile(handbook).metadata.num_rows
    if in_memory:
        keep(_case("handbook in memory", handbook, hb_rows, model, 0, tmp, memory_limit))
        keep(_case("handbook partitioned", handbook, hb_rows, model, partitions_for(hb_rows), tmp, memory_limit))
    for n in rows:
        f = tmp / f"handbook_like_{n}.parquet"
        if not f.exists():
            t0 = time.perf_counter()
            measure(["simulate", "--rows", str(n), "--seed", str(seed), "--out", str(f)], tmp / f"simulate_{n}.log")
            log(f"generated {n:,} rows in {time.perf_counter() - t0:.0f} s: {f}")
        try:
            keep(_case(f"generated {n / 1e6:g}M partitioned", f, n, model, partitions_for(n), tmp, memory_limit))
        finally:
            if not keep_files:
                f.unlink(missing_ok=True)
    return write_markdown(list(done.values()), model)


def unfinished(folders: list[Path], results: list[dict]) -> list[tuple[str, str, str]]:
    """Runs that did not finish: (case, the last line its log reached, the log's time) for every
    ``score_*.log`` in ``folders`` whose case has no result."""
    done = {r["case"].replace(" ", "_") for r in results}
    out = []
    for d in folders:
        for f in sorted(Path(d).glob("score_*.log")):
            case = f.stem[len("score_"):].replace(" ", "_")
            if case in done:
                continue
            lines = [x for x in f.read_text(errors="replace").splitlines() if x.strip()]
            stamp = datetime.fromtimestamp(f.stat().st_mtime, timezone.utc).isoformat(timespec="seconds")
            out.append((case.replace("_", " "), lines[-1] if lines else "(no output yet)", stamp))
    return out


def report(model: Path, folders: list[Path]) -> str:
    """Write ``bench/results/scale.md`` from ``scale.json`` and the logs of unfinished runs."""
    store = RESULTS / "scale.json"
    results = json.loads(store.read_text()) if store.exists() else []
    return write_markdown(results, model, unfinished(folders, results))


def write_markdown(results: list[dict], model: Path, running: list[tuple[str, str, str]] = ()) -> str:
    """The table of ``results`` (see :func:`run`) as ``bench/results/scale.md``; ``running``:
    see :func:`unfinished`."""
    from engine.bench.speed import machine_info

    results = sorted(results, key=lambda x: (x["rows"], x["partitions"]))
    ref = next((r for r in results if r["case"] == "handbook in memory"), None)
    ref_p = next((r for r in results if r["case"] == "handbook partitioned"), None)
    md = ["# fraudlens scale benchmark: files larger than memory", "",
          f"`fraudlens score` with model `{model}` (spec handbook: terminal aggregates over the whole file, so "
          "the partitioned scorer makes two passes). Each row is one run of the command in a child process: "
          "wall and CPU seconds and peak RSS from `os.wait4`. Partitions: "
          f"ceil(rows / {ROWS_PER_PARTITION:,}). Generated files: `fraudlens simulate --rows N --seed 0`.", "",
          "| case | rows | partitions | wall s | rows/s | CPU s | rows per CPU s | peak RSS MiB | load (1 min) | finished |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        md.append(f"| {r['case']} | {r['rows']:,} | {r['partitions'] or 'in memory'} | {r['wall_s']:,.0f} | "
                  f"{r['rows_per_s']:,.0f} | {r['cpu_s']:,.0f} | {r['rows_per_cpu_s']:,.0f} | "
                  f"{r['peak_rss_mib']:,.0f} | {r['load_before']:.1f} -> {r['load_after']:.1f} | {r['finished']} |")
    big = [r for r in results if r["rows"] >= 50_000_000]
    md += ["", "Targets (issue 16, item 4):", ""]
    for r in big:
        md.append(f"* peak RSS <= 4 GB at {r['rows']:,} rows: {r['peak_rss_mib']:,.0f} MiB "
                  f"({'met' if r['peak_rss_mib'] <= 4096 else '**not met**'})")
        for lab, base in (("in-memory", ref), ("partitioned", ref_p)):
            if base:
                for k, unit in (("rows_per_s", "rows/s"), ("rows_per_cpu_s", "rows per CPU s")):
                    ratio = r[k] / base[k]
                    md.append(f"* throughput within 20 % of the 1.75M-row {lab} figure ({unit}): "
                              f"{r[k]:,.0f} vs {base[k]:,.0f} = {ratio:.0%} "
                              f"({'met' if ratio >= 0.8 else '**not met**'})")
    if not big:
        md.append("* no 50M-row run finished")
    if running:
        md += ["", "Runs stopped before the end (the last line each logged; each line gives the seconds since "
               "the command started and its peak RSS so far):", ""]
        md += [f"* {case} (log at {stamp}): `{line}`" for case, line, stamp in running]
    md += ["", "Machine and packages:", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in machine_info().items()]
    text = "\n".join(md) + "\n"
    (RESULTS / "scale.md").write_text(text)
    return text
