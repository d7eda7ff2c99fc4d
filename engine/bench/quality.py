"""``fraudlens bench quality``: the fraudlens transformer, a GBT and the Handbook's published
numbers on the Handbook's own protocol, in one run.

Protocol (Le Borgne et al., *Reproducible Machine Learning for Credit Card Fraud Detection -
Practical Handbook*, chapters 3-5 and 7; :mod:`engine.bench.handbook_protocol`): a fold trains on
7 days, leaves a 7-day delay, tests on the next 7 days, with known-compromised customers removed
from each test day; 4 test folds (training starts 2018-08-15, -08, -01, 07-25) and 4 validation
folds before them. Metrics: AUC ROC, average precision, Card Precision@100; mean ± std.

The transformer reads each customer's whole earlier history as *input* (never labels), takes its
training labels from the fold's 7 training days only, and gets the delayed terminal risk
(``handbook`` spec aggregates: labels known 7 days late) — the information the GBT gets, under
the same delay rule. Model choices (the number of epochs) are made on the validation folds
only; the test folds train for that fixed number of epochs, without early stopping.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from ..io import read_transactions
from ..scoring import score_encoded, sigmoid
from ..spec import load_spec
from ..train import TrainConfig, fit
from . import published
from .gbt import evaluate_scores, run_gbt_bench
from .handbook_features import load_handbook_dataset
from .handbook_protocol import fold_sets, folds
from .speed import machine_info

ROOT = Path(__file__).resolve().parents[2]
METRICS = ("AUC ROC", "Average precision", "Card Precision@100")
BENCH_CONFIG = TrainConfig(context_length=64, min_history=32, epochs=5, windows_per_epoch=None, batch_size=64,
                           lr=2e-3, max_minutes=30.0, dropout=0.1)


def transformer_fold(frame: pd.DataFrame, spec, raw: pd.DataFrame, fold, cfg: TrainConfig, *,
                     early_stopping: bool, log=print):
    """Train on one fold and score its test set; returns (metrics dict, per-epoch history)."""
    train_start, train_end = fold.train_period
    test_start, test_end = fold.test_period
    sub = frame[frame["timestamp"] < test_end].reset_index(drop=True)
    _, test_df = fold_sets(raw, fold)
    split = np.full(len(sub), -1, np.int8)
    ts = sub["timestamp"]
    split[((ts >= train_start) & (ts < train_end)).to_numpy()] = 0
    test_ids = set(test_df["TRANSACTION_ID"].astype(str))
    is_test = sub["transaction_id"].isin(test_ids).to_numpy()
    split[is_test] = 1  # evaluated after each epoch (validation folds: to choose epochs)
    bundle, hist, enc = fit(sub, spec, split, cfg, log=log, progress=False, early_stopping=early_stopping)
    rows = np.flatnonzero(is_test)
    lg = score_encoded(bundle.model, enc, sub["entity_id"].to_numpy(), rows=rows)
    scores = pd.Series(sigmoid(lg[rows].astype(np.float64)), index=sub["transaction_id"].iloc[rows].to_numpy())
    test_df = test_df.copy()
    test_df["predictions"] = test_df["TRANSACTION_ID"].astype(str).map(scores).to_numpy()
    if test_df["predictions"].isna().any():
        raise RuntimeError(f"{fold.name}: {int(test_df['predictions'].isna().sum())} test rows were not scored")
    return evaluate_scores(test_df), hist


def run(data: str, *, out: Path = ROOT / "bench" / "results" / "quality.md", cfg: TrainConfig = BENCH_CONFIG,
        with_gbt: bool = True, gbt_grid: dict | None = None, log=print) -> str:
    """Run the whole benchmark; print and write the markdown table; returns it."""
    t0 = time.perf_counter()
    spec = load_spec("handbook")
    frame = read_transactions(data, spec).frame
    raw = load_handbook_dataset(data)

    # 1. model choice on validation folds: number of epochs with the best mean AP
    val_hist = []
    for f in folds("validation"):
        log(f"[transformer] {f.name} (training starts {f.train_period[0].date()})")
        _, h = transformer_fold(frame, spec, raw, f, cfg, early_stopping=False, log=log)
        val_hist.append([r.get("val_average_precision", 0.0) for r in h])
    ap_by_epoch = np.mean(np.array(val_hist), axis=0)
    best_epochs = int(np.argmax(ap_by_epoch)) + 1
    log(f"[transformer] validation AP by epoch {np.round(ap_by_epoch, 4).tolist()} -> {best_epochs} epochs")

    # 2. test folds with that fixed choice
    rows = []
    test_cfg = replace(cfg, epochs=best_epochs)
    for f in folds("test"):
        log(f"[transformer] {f.name} (training starts {f.train_period[0].date()})")
        m, _ = transformer_fold(frame, spec, raw, f, test_cfg, early_stopping=False, log=log)
        rows.append({"model": "fraudlens transformer", "fold": f.name, **m})
    tf = pd.DataFrame(rows)

    gbt_fold = None
    if with_gbt:
        g = run_gbt_bench(data, grid=gbt_grid, verbose=False)
        gbt_fold = g
    wall = time.perf_counter() - t0
    return _report(tf, gbt_fold, best_epochs, ap_by_epoch, test_cfg, wall, data, out, log)


def _fmt(x: pd.Series) -> str:
    return f"{x.mean():.3f} ± {x.std(ddof=0):.3f}"


def _report(tf, gbt, best_epochs, ap_by_epoch, cfg, wall, data, out, log) -> str:
    lines = ["# Detection quality on the Fraud Detection Handbook protocol", "",
             f"Run {datetime.now(timezone.utc).isoformat(timespec='seconds')} on `{data}`; {wall / 60:.1f} min in all.",
             "Mean ± std (ddof=0) over the 4 test folds (training starts 2018-08-15, 08-08, 08-01, 07-25).", "",
             "| model | AUC ROC | average precision | Card Precision@100 | source |", "|---|---|---|---|---|"]
    lines.append("| fraudlens transformer | " + " | ".join(_fmt(tf[m]) for m in METRICS) + " | this run |")
    gbt_ap = None
    if gbt is not None:
        gcol = {"AUC ROC": None, "Average precision": None, "Card Precision@100": None}
        per = gbt if "Average precision" in gbt.columns else None
        if per is not None:
            gbt_ap = per["Average precision"].mean()
            lines.append("| LightGBM on the Handbook features | " + " | ".join(_fmt(per[m]) for m in gcol) + " | this run |")
    for res in published.PUBLISHED_TEST_RESULTS:
        d = res.as_dict()
        lines.append(f"| {res.model} (published) | {d['AUC ROC']:.3f} | {d['Average precision']:.3f} | "
                     f"{d['Card Precision@100']:.3f} | Handbook {res.chapter} |")
    t = {m: tf[m].mean() for m in METRICS}
    targets = [("average precision >= 0.72", t["Average precision"] >= 0.72),
               ("AUC ROC >= 0.89", t["AUC ROC"] >= 0.89),
               ("Card Precision@100 >= 0.32", t["Card Precision@100"] >= 0.32)]
    if gbt_ap is not None:
        targets.append((f"average precision above the GBT of this run ({gbt_ap:.3f})", t["Average precision"] > gbt_ap))
    lines += ["", "| target (transformer, mean of 4 test folds) | met |", "|---|---|"]
    lines += [f"| {a} | {'yes' if b else '**no**'} |" for a, b in targets]
    lines += ["", "Per test fold (transformer):", "", "| fold | AUC ROC | AP | CP@100 | recall@100 by scenario 1/2/3 |",
              "|---|---|---|---|---|"]
    for _, r in tf.iterrows():
        rec = "/".join(f"{r.get(f'Recall@100 scenario {s}', float('nan')):.2f}" for s in (1, 2, 3))
        lines.append(f"| {r['fold']} | {r['AUC ROC']:.3f} | {r['Average precision']:.3f} | {r['Card Precision@100']:.3f} | {rec} |")
    lines += ["", f"Model choice on the validation folds only: mean validation AP by epoch "
              f"{[round(float(x), 4) for x in ap_by_epoch]} -> {best_epochs} epochs.",
              f"Configuration: context {cfg.context_length}, min_history {cfg.min_history}, d_model {cfg.d_model}, "
              f"{cfg.n_layers} layers, {cfg.n_heads} heads, lr {cfg.lr}, batch {cfg.batch_size}.", "",
              "Machine and packages:", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in machine_info().items()]
    text = "\n".join(lines) + "\n"
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    log(text)
    return text
