"""``fraudlens bench ray``: Ray batch scoring throughput at 1 and 2 workers against the
single-process scorer, and Ray Train (2 workers) against one process; writes bench/results/ray.md.

Scoring: the first ``rows`` records of the file are read once through the spec (reading is not
timed: it is the same driver-side step for every engine), then scored by

* ``local``: :func:`engine.model.scoring.score_frame` in this process (torch threads = 1);
* ``ray`` with 1 and 2 actors: :func:`engine.distributed.ray_score.score_with_ray` on one local
  Ray started with ``num_cpus=2`` (timed: partitioning, actor start and model load, scoring,
  writing the Parquet parts, the accounting read-back).

Every Ray output is compared with the local scores (max absolute logit difference).

Training (``train=True``): :func:`engine.model.train.train` on the same records, one process vs
:func:`engine.distributed.ray_train.fit_on_ray` with 2 workers, default dropout; the metrics
difference is the tolerance README.md documents.

The machine's load average is printed with the table: on a shared machine the figures measure the
contention as much as the engine.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow.parquet as pq


def _model(model: Path | None, frame, spec, tmp: Path):
    """The checkpoint at ``model``, or an untrained model of the default configuration fitted to
    ``frame``'s feature statistics, saved in ``tmp`` (throughput does not depend on training)."""
    from engine.data.features import FeatureEncoder
    from engine.model.checkpoint import ModelBundle, build_model, load_checkpoint, save_checkpoint

    if model is not None:
        return load_checkpoint(model), str(model)
    enc = FeatureEncoder.fit(frame, spec)
    save_checkpoint(ModelBundle(model=build_model(enc, seed=0).eval(), encoder=enc, spec=spec,
                                meta={"name": "bench-untrained"}), tmp / "model")
    return load_checkpoint(tmp / "model"), "untrained, default configuration"


#: transactions of the small run that estimates Ray's fixed cost per run (actor start, model load)
SMALL_ROWS = 2_000


def _first_entities(res, n: int):
    """``res`` cut to its first entities (whole histories) holding about ``n`` transactions."""
    from dataclasses import replace

    ents = res.frame["entity_id"].to_numpy()
    keep = set(ents[: min(n, len(ents))])
    frame = res.frame[res.frame["entity_id"].isin(keep)].reset_index(drop=True)
    return replace(res, frame=frame, rejected=res.rejected.iloc[:0], rows_read=len(frame))


def _score_rows(bundle, res, tmp: Path, log) -> list[dict]:
    import torch

    from engine.distributed.ray_score import score_with_ray
    from engine.distributed.runtime import ray_session
    from engine.model.scoring import score_frame

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    local = score_frame(bundle, res.frame)
    rows = [{"engine": "local (one process)", "workers": 1, "seconds": time.perf_counter() - t0, "diff": 0.0}]
    log(f"local: {rows[0]['seconds']:.1f} s")
    want = local.set_index("row_number")["logit"]
    t0 = time.perf_counter()
    with ray_session(2) as _:
        start = time.perf_counter() - t0
        log(f"Ray started in {start:.1f} s")
        small = _first_entities(res, SMALL_ROWS)
        for w in (1, 2):
            t_small = score_with_ray(bundle, small, tmp / f"ray-small-{w}", workers=w).seconds
            run = score_with_ray(bundle, res, tmp / f"ray-{w}", workers=w)
            got = pq.read_table(tmp / f"ray-{w}", columns=["row_number", "logit", "status"]).to_pandas()
            got = got[got["status"] == "scored"].set_index("row_number")["logit"]
            diff = float(np.abs(got.reindex(want.index).to_numpy() - want.to_numpy()).max())
            rows.append({"engine": "ray", "workers": w, "seconds": run.seconds, "diff": diff,
                         "partitions": run.partitions, "accounting": run.accounting(),
                         "small_s": t_small, "small_n": len(small.frame)})
            log(f"ray {w} worker(s): {run.seconds:.1f} s; max |logit diff| {diff:.2e}; {run.accounting()}")
    for r in rows:
        r["ray_start_s"] = start
    return rows


def _train_rows(res, spec, log) -> list[dict]:
    from engine.distributed.ray_train import ray_fitter
    from engine.model.train import TrainConfig, train

    cfg = TrainConfig(d_model=32, n_heads=4, n_layers=1, d_ff=64, context_length=32, min_history=16, epochs=2,
                      windows_per_epoch=1500, batch_size=64, patience=2, threads=1,
                      min_steps_per_epoch=0, activity_ple=False,
                      amount_by_value=False, row_ff=0, ema_epochs=0.0, members=1)  # batch 64, no activity codes: as in the earlier runs
    out = []
    for name, fitter in (("one process", None), ("Ray Train, 2 workers", ray_fitter(2))):
        t0 = time.perf_counter()
        _, rep = train(res.frame, spec, cfg, log=lambda s: None, progress=False, fitter=fitter)
        out.append({"engine": name, "seconds": time.perf_counter() - t0, "test": rep["test"], "val": rep["validation"]})
        log(f"train {name}: {out[-1]['seconds']:.0f} s; test AP {rep['test'].get('average_precision', float('nan')):.4f}")
    return out


def run(data: str, spec_name: str, model: Path | None, rows: int, out: Path, *, train: bool = True,
        log: Callable[[str], None] = print) -> str:
    """Run the benchmark (see the module doc) and write the markdown table to ``out``.

    Raises:
        RuntimeError: Ray is missing. ValueError / FileNotFoundError: from reading ``data``.
    """
    from engine.data.io import read_transactions
    from engine.data.spec import load_spec
    from engine.distributed.runtime import require_ray

    require_ray()
    spec = load_spec(spec_name)
    load0 = os.getloadavg()
    res = read_transactions(data, spec, max_rows=rows)
    with tempfile.TemporaryDirectory(prefix="fraudlens-bench-ray-") as tmp:
        bundle, model_name = _model(model, res.frame, spec, Path(tmp))
        score = _score_rows(bundle, res, Path(tmp), log)
    trained = _train_rows(res, spec, log) if train else []
    load1 = os.getloadavg()
    n = len(res.frame)
    one = next(r for r in score if r["engine"] == "ray" and r["workers"] == 1)["seconds"]
    lines = [
        "# Ray scale-out benchmark", "",
        f"Run {datetime.now(timezone.utc).isoformat(timespec='seconds')} on `{data}` (first {res.rows_read:,} records: "
        f"{n:,} transactions scored, {len(res.rejected):,} rejected), spec `{spec_name}`, model: {model_name}. "
        f"Command: `fraudlens bench ray --data {data} --rows {rows}{'' if train else ' --no-train'}`.", "",
        f"Machine: {os.cpu_count()} cores ({platform.processor() or platform.machine()}), shared: load average "
        f"{load0[0]:.1f} at the start and {load1[0]:.1f} at the end (the cores were contended by other work, so "
        "these figures are lower bounds and the scaling is not the engine's alone).", "",
        "## Batch scoring", "",
        "Reading and validation (driver, not timed) are the same for every row. Ray times include partitioning, "
        f"actor start and model load, scoring, writing the Parquet parts and the accounting check; Ray itself "
        f"(num_cpus=2) started once in {score[0]['ray_start_s']:.1f} s, not included.", "",
        "Fixed cost: the same run on the first entities' ~2,000 transactions; marginal rate: "
        "(transactions - those) / (seconds - that run's seconds), the rate once the actors are up "
        "(n/a: on a contended machine the small run can take longer than the large one).", "",
        "| engine | workers | seconds | transactions/s | speed-up vs Ray 1 worker | fixed cost (s) | marginal transactions/s | max abs logit diff vs local |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in score:
        sp = f"{one / r['seconds']:.2f}x" if r["engine"] == "ray" else ""
        fixed = marginal = ""
        if "small_s" in r:
            fixed = f"{r['small_s']:.1f}"
            dt = r["seconds"] - r["small_s"]
            marginal = f"{(n - r['small_n']) / dt:,.0f}" if dt > 0 else "n/a"
        lines.append(f"| {r['engine']} | {r['workers']} | {r['seconds']:.1f} | {n / r['seconds']:,.0f} | {sp} | {fixed} | "
                     f"{marginal} | {r['diff']:.1e} |")
    acc = [r["accounting"] for r in score if "accounting" in r]
    lines += ["", f"Row accounting of each Ray run: {acc[0]}."]
    if trained:
        lines += ["", "## Training (Ray Train vs one process, same records, default dropout 0.1)", "",
                  "Config: d_model 32, 1 layer, context 32, 2 epochs of 1,500 windows, batch 64, seed 0, 1 thread a worker.", "",
                  "| engine | seconds | validation AP | test AP | test AUC ROC |", "|---|---|---|---|---|"]
        for t in trained:
            lines.append(f"| {t['engine']} | {t['seconds']:.0f} | {t['val'].get('average_precision', float('nan')):.4f} | "
                         f"{t['test'].get('average_precision', float('nan')):.4f} | {t['test'].get('auc_roc', float('nan')):.4f} |")
        a, b = trained
        d_ap = abs(a["test"].get("average_precision", np.nan) - b["test"].get("average_precision", np.nan))
        d_auc = abs(a["test"].get("auc_roc", np.nan) - b["test"].get("auc_roc", np.nan))
        lines += ["", f"Difference, 2 workers vs one process: test AP {d_ap:.4f}, test AUC ROC {d_auc:.4f} "
                  "(dropout masks differ between the runs; with dropout 0 the runs agree to float rounding, "
                  "tests/distributed/test_ray_train.py)."]
    text = "\n".join(lines) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return text
