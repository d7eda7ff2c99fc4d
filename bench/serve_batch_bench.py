"""CPU per transaction of the scoring process's batched path, in process: one table row per batch size.

``ScoringService.score_rows`` (what the scoring process of ``fraudlens serve --processes two`` runs
for each dynamic batch: waves, ``EntityCache.score_many`` -> ``IncrementalScorer.add_many``, the
cheap reasons, one durable history commit with ``--sync normal``) on batches of ``b`` rows, one row
from each of ``b`` lanes; lane ``k`` replays the first ``n`` TabFormer transactions under its own
card and transaction ids, so each batch holds ``b`` distinct cards whose histories grow past the
model's context. Rows are validated (``canonical_row``) before the clock starts: the front does
that in the served path. Shadow mode, no case worker. Prints process CPU ms per transaction
(``time.process_time``) and wall ms per transaction; nothing is asserted. Results:
bench/results/serve.md.

Usage (repository root)::

    python bench/serve_batch_bench.py [--model DIR] [--batches 1,4,8,16] [--rows 1500] [--repeats 2]
"""
import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("FRAUDLENS_DATA_DIR", tempfile.mkdtemp(prefix="fraudlens-serve-batch-"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.bench.serve_load import tabformer_records  # noqa: E402
from engine.bench.speed import machine_info  # noqa: E402
from engine.model.checkpoint import load_checkpoint  # noqa: E402
from engine.serve.record import canonical_row  # noqa: E402
from engine.serve.service import ScoringService  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", default=None, help="checkpoint folder (default: the demo model)")
ap.add_argument("--tabformer", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "tabformer"
                                          / "User0_credit_card_transactions.csv"))
ap.add_argument("--batches", default="1,4,8,16")
ap.add_argument("--rows", type=int, default=1500, help="batches per size (each lane replays this many rows)")
ap.add_argument("--repeats", type=int, default=2)
a = ap.parse_args()

bundle = load_checkpoint(a.model)
recs, card = tabformer_records(Path(a.tabformer), a.rows)
print(f"model {bundle.short_sha} ({bundle.config.n_members} member(s)), {machine_info()}")
print("| batch rows | repeat | CPU ms / transaction | wall ms / transaction |")
print("|---|---|---|---|")
for b in [int(x) for x in a.batches.split(",")]:
    for rep in range(a.repeats):
        with tempfile.TemporaryDirectory() as d:
            svc = ScoringService(bundle, Path(d) / "history.sqlite3", start_worker=False, shadow=True, sync="normal")
            try:
                lanes = [[canonical_row({**r, card: f"L{k}-{r[card]}", "transaction_id": f"L{k}-{r['transaction_id']}"},
                                        svc.spec) for r in recs] for k in range(b)]
                c0, w0 = time.process_time(), time.perf_counter()
                for i in range(len(recs)):
                    out = svc.score_rows([lane[i] for lane in lanes])
                    if any(o[0] != "ok" for o in out):
                        raise SystemExit(f"batch {i} of size {b}: {out}")
                cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            finally:
                svc.close()
        n = len(recs) * b
        print(f"| {b} | {rep + 1} | {1000 * cpu / n:.3f} | {1000 * wall / n:.3f} |", flush=True)
