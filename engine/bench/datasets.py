"""``fraudlens bench datasets``: the transformer against the LightGBM baseline on every dataset.

For each labelled dataset in ``../shared/data`` and the bundled demo data, and each seed:

1. read the file through its built-in spec (row accounting as everywhere);
2. split by time (:func:`choose_split`): the default 70 % / 85 % rule of ``fraudlens train``
   when both later periods hold at least 30 frauds on 5 entities, else the dates
   :func:`engine.model.split_checks.propose_split_dates` proposes, else the latest dates that
   give each period as many frauds as the file allows, up to a third of them (the table then
   says "thin");
3. train the transformer exactly as ``fraudlens train`` does (its default
   :class:`~engine.model.train.TrainConfig`, the seed changed) and the LightGBM baseline of
   :mod:`engine.model.baseline` on the same split;
4. score the same test rows with both and compute the metrics below.

Metrics, on the labelled test rows (probabilities as the models output them, uncalibrated):
AUC ROC; average precision; recall at an alert budget of 1 % of test transactions;
detection rate at a 5:1 false-positive ratio (the share of frauds caught at the largest
alert set with at most 5 false positives per true positive: the unit card issuers report, e.g.
the Nilson Report's "false positive ratio"); value detection rate (share of the fraud amount
caught at that same alert set); expected calibration error (10 equal-width bins, Naeini et al.,
AAAI 2015). Mean ± std over seeds, and for each seed the paired bootstrap over entities of
transformer minus baseline (:func:`engine.model.compare.paired_bootstrap`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from engine.data.io import read_transactions
from engine.data.spec import load_spec
from engine.model.baseline import BaselineConfig
from engine.model.split_checks import propose_split_dates, split_warnings
from engine.model.train import TrainConfig, binary_metrics, time_split
from engine.model.train import train as train_transformer

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
DEFAULT_OUT = ROOT / "bench" / "results" / "datasets.md"
FP_RATIO = 5.0
ALERT_RATE = 0.01


@dataclass(frozen=True)
class Dataset:
    """One benched file: ``name``, ``path``, built-in ``spec`` name."""

    name: str
    path: Path
    spec: str


DATASETS: dict[str, Dataset] = {
    "demo": Dataset("demo", ROOT / "demo_data" / "transactions.csv", "demo"),
    "tabformer": Dataset("tabformer", SHARED / "tabformer" / "User0_credit_card_transactions.csv", "tabformer"),
    "banksim": Dataset("banksim", SHARED / "banksim" / "banksim_sample.csv", "banksim"),
    "handbook": Dataset("handbook", SHARED / "handbook" / "transactions.parquet", "handbook"),
}


# ------------------------------------------------------------------------------------ metrics
def detection_at_fp_ratio(y: np.ndarray, p: np.ndarray, amount: np.ndarray,
                          ratio: float = FP_RATIO) -> dict[str, float]:
    """Detection rate and value detection rate at the largest alert set with FP <= ratio x TP.

    Alerts are the highest scores first (ties broken by row order). Returns ``detection_rate``
    (frauds caught / frauds), ``value_detection_rate`` (fraud amount caught / fraud amount, on
    ``|amount|``, file currency) and ``alerts`` (size of that set; 0 when even the top alert is
    a false positive beyond the ratio).
    """
    y = np.asarray(y).astype(int)
    order = np.argsort(-np.asarray(p, np.float64), kind="stable")
    tp = np.cumsum(y[order])
    fp = np.cumsum(1 - y[order])
    ok = np.flatnonzero(fp <= ratio * tp)
    k = int(ok[-1]) + 1 if len(ok) else 0
    value = np.abs(np.asarray(amount, np.float64))
    fraud_value = float((value * y).sum())
    caught = order[:k]
    return {
        "detection_rate": float(y[caught].sum() / max(1, y.sum())),
        "value_detection_rate": float((value[caught] * y[caught]).sum() / fraud_value) if fraud_value else float("nan"),
        "alerts": k,
    }


def recall_at_alert_rate(y: np.ndarray, p: np.ndarray, rate: float = ALERT_RATE) -> float:
    """Share of frauds among the top ``ceil(rate * N)`` scores."""
    y = np.asarray(y).astype(int)
    k = max(1, int(np.ceil(rate * len(y))))
    top = np.argsort(-np.asarray(p, np.float64), kind="stable")[:k]
    return float(y[top].sum() / max(1, y.sum()))


def expected_calibration_error(y: np.ndarray, p: np.ndarray, bins: int = 10) -> float:
    """ECE: sum over equal-width probability bins of (bin share) x |mean p - fraud rate|."""
    y = np.asarray(y, np.float64)
    p = np.clip(np.asarray(p, np.float64), 0.0, 1.0)
    idx = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for b in range(bins):
        m = idx == b
        if m.any():
            total += m.mean() * abs(p[m].mean() - y[m].mean())
    return float(total)


def all_metrics(y: np.ndarray, p: np.ndarray, amount: np.ndarray) -> dict[str, float]:
    """Every metric of the table for one scorer on one set of test rows."""
    m = binary_metrics(y, p)
    out = {"auc_roc": m.get("auc_roc", float("nan")), "average_precision": m.get("average_precision", float("nan")),
           "recall_at_1pct": recall_at_alert_rate(y, p), "ece": expected_calibration_error(y, p)}
    out.update(detection_at_fp_ratio(y, p, amount))
    return out


# -------------------------------------------------------------------------------------- split
def choose_split(frame: pd.DataFrame) -> tuple[np.ndarray, str, list[str]]:
    """``(split, rule, warnings)`` as the module docstring says; ``rule`` names the dates used."""
    split, a, b = time_split(frame["timestamp"])
    warnings = split_warnings(frame, split)
    if not warnings:
        return split, f"default 70/85 % rule: {a.date()} / {b.date()}", []
    dates = propose_split_dates(frame)
    if dates is not None:
        split, a, b = time_split(frame["timestamp"], *dates)
        return split, f"proposed dates (>= 30 frauds on 5 entities per period): {a.date()} / {b.date()}", []
    n_fraud = int((frame["label"].to_numpy(dtype="float64", na_value=np.nan) == 1).sum())
    for k in range(max(1, n_fraud // 3), 0, -1):  # the most frauds each period can get
        dates = propose_split_dates(frame, min_frauds=k, min_entities=1)
        if dates is not None:
            split, a, b = time_split(frame["timestamp"], *dates)
            warnings = split_warnings(frame, split)
            return split, (f"thin: at least {k} of the file's {n_fraud} frauds per period: "
                           f"{a.date()} / {b.date()}"), warnings
    return split, f"default 70/85 % rule: {a.date()} / {b.date()} (no better split exists)", warnings


# ---------------------------------------------------------------------------------------- run
def run_dataset(ds: Dataset, seeds: list[int], *, log: Callable[[str], None] = print,
                train_config: TrainConfig | None = None) -> dict[str, Any]:
    """Train and compare both models on one dataset for each seed; a JSON-able result dict."""
    spec = load_spec(ds.spec)
    res = read_transactions(ds.path, spec)
    frame = res.frame
    split, rule, warnings = choose_split(frame)
    log(f"[{ds.name}] rows read {res.rows_read:,} = accepted {len(frame):,} + rejected {len(res.rejected):,}; split {rule}")
    label = frame["label"].to_numpy(dtype="float64", na_value=np.nan)
    test_rows = np.flatnonzero((split == 2) & ~np.isnan(label))
    y = label[test_rows].astype(int)
    amount = frame["amount"].to_numpy()[test_rows]
    ents = frame["entity_id"].to_numpy()[test_rows]
    per_seed = []
    base_cfg = train_config or TrainConfig()
    train_end = str(frame["timestamp"][split == 1].min().normalize().date())
    val_end = str(frame["timestamp"][split == 2].min().normalize().date())
    for seed in seeds:
        t0 = time.perf_counter()
        cfg = replace(base_cfg, seed=seed, train_end=train_end, val_end=val_end)
        # train() fits the baseline on the same split and scores the same test rows with both
        bundle, report = train_transformer(frame, spec, cfg, log=lambda s: None, progress=False,
                                           baseline=BaselineConfig(seed=seed))
        if not np.array_equal(report["test_rows"], test_rows):
            raise RuntimeError(f"[{ds.name}] training scored other test rows than the bench's split")
        pt, pb = report["test_probability"], report["baseline_test_probability"]
        baseline_s = report["baseline"]["wall_s"]
        t2 = time.perf_counter()
        t1 = t2 - baseline_s
        rec: dict[str, Any] = {"seed": seed, "transformer": all_metrics(y, pt, amount),
                               "baseline": all_metrics(y, pb, amount),
                               "transformer_s": t1 - t0, "baseline_s": t2 - t1,
                               "best_epoch": bundle.meta.get("best_epoch")}
        if "bootstrap" in report["baseline"]:  # over entities, seed = the training seed
            rec["bootstrap"] = report["baseline"]["bootstrap"]
        per_seed.append(rec)
        log(f"[{ds.name}] seed {seed}: transformer AP {rec['transformer']['average_precision']:.3f} "
            f"AUC {rec['transformer']['auc_roc']:.3f} ({t1 - t0:.0f} s); baseline AP "
            f"{rec['baseline']['average_precision']:.3f} AUC {rec['baseline']['auc_roc']:.3f} ({t2 - t1:.0f} s)")
    return {"dataset": ds.name, "path": str(ds.path), "spec": ds.spec, "rows_read": res.rows_read,
            "rows_rejected": len(res.rejected), "split_rule": rule, "split_warnings": warnings,
            "test_rows": int(len(test_rows)), "test_frauds": int(y.sum()),
            "test_fraud_entities": int(len(set(ents[y == 1]))), "seeds": per_seed}


_COLS = [("auc_roc", "AUC ROC"), ("average_precision", "AP"), ("recall_at_1pct", "recall @1 % alerts"),
         ("detection_rate", "detection @5:1 FP"), ("value_detection_rate", "value detection @5:1 FP"),
         ("ece", "ECE")]


def _ms(vals: list[float]) -> str:
    v = np.asarray([x for x in vals if x == x], np.float64)
    if not len(v):
        return "–"
    return f"{v.mean():.3f} ± {v.std(ddof=1):.3f}" if len(v) > 1 else f"{v[0]:.3f}"


def report(results: list[dict[str, Any]], machine: dict[str, Any], wall_s: float,
           train_config: TrainConfig | None = None) -> str:
    """The markdown table of ``bench/results/datasets.md`` (``train_config``: the recipe, named
    in the header when it is a seed ensemble)."""
    k = (train_config or TrainConfig()).members
    lines = ["# Transformer vs LightGBM baseline on every dataset", "",
             f"Run {pd.Timestamp.now(tz='UTC').isoformat(timespec='seconds')}, {wall_s / 60:.1f} min, "
             f"machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores. Written by `engine.bench.datasets` "
             "(`fraudlens bench datasets`). Test rows only; probabilities uncalibrated; mean ± std over seeds "
             "(sample std)." + (f" Transformer: a {k}-member seed ensemble (`--members {k}`, members "
                                 f"seeds seed x {k} + 0..{k - 1}), one checkpoint." if k > 1 else "")
             + (f" Next-transaction pretraining: {pm:g} min per training run before fraud training "
                "(`--pretrain-minutes`)." if (pm := (train_config or TrainConfig()).pretrain_minutes) else ""), "",
             "| dataset | model | " + " | ".join(c[1] for c in _COLS) + " |",
             "|---|---|" + "---|" * len(_COLS)]
    for r in results:
        for key, name in (("transformer", "transformer"), ("baseline", "LightGBM baseline")):
            vals = [_ms([s[key][c] for s in r["seeds"]]) for c, _ in _COLS]
            lines.append(f"| {r['dataset']} | {name} | " + " | ".join(vals) + " |")
    lines += ["", "Paired bootstrap over entities, transformer minus baseline (95 % interval, 500 draws), per seed:", "",
              "| dataset | seed | AP difference [interval] | AUC ROC difference [interval] |", "|---|---|---|---|"]
    for r in results:
        for s in r["seeds"]:
            b = s.get("bootstrap")
            if not b:
                lines.append(f"| {r['dataset']} | {s['seed']} | – (one class in test) | – |")
                continue
            ap, auc = b["average_precision"], b["auc_roc"]
            lines.append(f"| {r['dataset']} | {s['seed']} | {ap['diff']:+.3f} [{ap['ci_low']:+.3f}, {ap['ci_high']:+.3f}]"
                         f" | {auc['diff']:+.3f} [{auc['ci_low']:+.3f}, {auc['ci_high']:+.3f}] |")
    lines += ["", "Splits and test sets:", ""]
    for r in results:
        lines.append(f"- {r['dataset']}: rows read {r['rows_read']:,} (rejected {r['rows_rejected']:,}); split "
                     f"{r['split_rule']}; test {r['test_rows']:,} labelled rows, {r['test_frauds']} frauds on "
                     f"{r['test_fraud_entities']} entities"
                     + ("; warnings: " + " / ".join(r["split_warnings"]) if r["split_warnings"] else ""))
        secs = [(s["transformer_s"], s["baseline_s"]) for s in r["seeds"]]
        lines.append(f"  - training time per seed: transformer {np.mean([a for a, _ in secs]):.0f} s, "
                     f"baseline {np.mean([b for _, b in secs]):.0f} s")
    return "\n".join(lines) + "\n"


def main(names: list[str], seeds: list[int], out: Path = DEFAULT_OUT, *,
         log: Callable[[str], None] = print, train_config: TrainConfig | None = None) -> list[dict[str, Any]]:
    """Run :func:`run_dataset` for each name (``train_config``: the transformer's recipe, default
    :class:`TrainConfig`'s), write the markdown and a JSON beside it."""
    from engine.bench.speed import machine_info

    unknown = [n for n in names if n not in DATASETS]
    if unknown:
        raise ValueError(f"datasets: unknown {unknown}; expected names from {sorted(DATASETS)}")
    t0 = time.perf_counter()
    results = []
    for n in names:
        ds = DATASETS[n]
        if not ds.path.exists():
            log(f"[{n}] skipped: {ds.path} not found")
            continue
        results.append(run_dataset(ds, seeds, log=log, train_config=train_config))
    text = report(results, machine_info(), time.perf_counter() - t0, train_config or TrainConfig())
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=float))
    log(text)
    log(f"written to {out}")
    return results
