"""What a seed ensemble costs at scoring and explanation time: one table row per checkpoint.

For each checkpoint directory: members ``K`` (``ModelConfig.n_members``), whole-file scoring
throughput (rows/s, ``score_frame`` on the file, torch default threads), the incremental scorer's
p50 / p99 latency per transaction (``engine.bench.speed.incremental_latency``, 1 thread, the
path ``fraudlens serve`` runs) and the case-open time (attention, rollout, Integrated Gradients
50 steps, SHAP, occlusion for queries with ``T - 1`` earlier transactions;
``engine.bench.speed.case_open_times``). A probe that prints a table (results:
bench/results/ensemble_cost.md); nothing is asserted.

Usage (repository root; FRAUDLENS_DATA_DIR set to a scratch folder)::

    python bench/ensemble_cost.py demo_data/transactions.csv demo assets/demo_model /tmp/demo3
"""
import os
import sys
import time

os.environ.setdefault("FRAUDLENS_DATA_DIR", "/tmp/fraudlens-ensemble-cost")

from engine.bench.speed import case_open_times, incremental_latency, machine_info  # noqa: E402
from engine.data.io import read_transactions  # noqa: E402
from engine.data.spec import load_spec  # noqa: E402
from engine.model.checkpoint import load_checkpoint  # noqa: E402
from engine.model.scoring import score_frame  # noqa: E402

data, spec_name, dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
spec = load_spec(spec_name)
frame = read_transactions(data, spec).frame
m = machine_info()
print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {m.get('cpu', '?')}, {m.get('cores', '?')} cores; "
      f"file {data} ({len(frame):,} rows)\n")
print("| checkpoint | sha256 | members | parameters | whole-file scoring rows/s | incremental p50 ms | "
      "incremental p99 ms | case open p50 s | case open p95 s |")
print("|---|---|---|---|---|---|---|---|---|")
for d in dirs:
    b = load_checkpoint(d)
    score_frame(b, frame.iloc[:2000])  # warm-up
    t0 = time.perf_counter()
    score_frame(b, frame)
    rate = len(frame) / (time.perf_counter() - t0)
    p50, p99, _ = incremental_latency(b, frame)
    c50, c95, n, _ = case_open_times(b, frame, n=8)
    print(f"| `{d}` | {b.short_sha} | {b.config.n_members} | {b.model.n_parameters():,} | {rate:,.0f} | "
          f"{p50:.2f} | {p99:.2f} | {c50:.2f} | {c95:.2f} |", flush=True)
