"""Calibration before / after, measured on one checkpoint trained by ``fraudlens train``.

*Before* is the uncalibrated score ``sigmoid(logit)`` with the previous threshold rule (review
threshold = maximum F1 on validation); *after* is the calibrated probability with the stored
operating point. Both are measured on the checkpoint's own test period (rows from its
``split.val_end``), re-scored from the data file:

* expected calibration error (10 equal-width bins), the sum of the outputs against the number of
  frauds, the fraud rate of the 0.8-0.9 bin;
* at the review threshold: validation precision, and test precision / recall with a 95 %
  bootstrap interval over entities (:func:`engine.model.operating_point.bootstrap_at_threshold`).

Run: ``python -m engine.bench.calibration CHECKPOINT DATA [MAX_ROWS] [--out bench/results/calibration.md]``
(MAX_ROWS as the checkpoint was trained with ``--max-rows``). Prints one markdown table.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.metrics import precision_recall_curve

from engine.data.io import read_transactions
from engine.model.calibration import calibration_summary
from engine.model.checkpoint import load_checkpoint
from engine.model.operating_point import bootstrap_at_threshold, period_days
from engine.model.scoring import score_frame


def _max_f1_threshold(y: np.ndarray, p: np.ndarray) -> float:
    prec, rec, thr = precision_recall_curve(y, p)
    f1 = 2 * prec[:-1] * rec[:-1] / np.maximum(prec[:-1] + rec[:-1], 1e-12)
    return float(thr[int(np.argmax(f1))])


def before_after(checkpoint: str | Path, data: str | Path, max_rows: int | None = None) -> dict[str, Any]:
    """The figures of the module doc for ``"before"`` and ``"after"``.

    Raises:
        ValueError: the checkpoint has no calibration map or no recorded split.
    """
    b = load_checkpoint(checkpoint)
    if not b.calibrated or "split" not in b.meta:
        raise ValueError(f"{checkpoint}: needs a calibrated checkpoint with its split (train it with this version)")
    kw = {"max_rows": max_rows} if max_rows else {}
    s = score_frame(b, read_transactions(data, b.spec, **kw).frame)
    ts = pd.to_datetime(s["timestamp"])
    a, c = pd.Timestamp(b.meta["split"]["train_end"]), pd.Timestamp(b.meta["split"]["val_end"])
    lab = pd.to_numeric(s["label"], errors="coerce")
    val, test = ((ts >= a) & (ts < c) & lab.notna()).to_numpy(), ((ts >= c) & lab.notna()).to_numpy()
    yv, yt = lab[val].astype(int).to_numpy(), lab[test].astype(int).to_numpy()
    ents = s.loc[test, "entity_id"].to_numpy()
    out: dict[str, Any] = {}
    for name, col in (("before", "score"), ("after", "probability")):
        pv, pt = s.loc[val, col].to_numpy(), s.loc[test, col].to_numpy()
        t = _max_f1_threshold(yv, pv) if name == "before" else float(b.meta["thresholds"]["review"])
        alerts = pv >= t
        bt = bootstrap_at_threshold(yt, pt, ents, t, period_days(c, ts.max()))
        cs = calibration_summary(yt, pt)
        out[name] = {"threshold": t, "val_precision": float((alerts & (yv == 1)).sum() / max(1, alerts.sum())),
                     "test": bt, "calibration": cs}
    out["method"] = b.meta["calibration"]["method"]
    out["target"] = (b.meta.get("operating_point") or {}).get("target")
    out["test_frauds"] = int(yt.sum())
    return out


def markdown(name: str, r: dict[str, Any]) -> str:
    """One table of :func:`before_after`'s figures."""
    def binrate(cs: dict) -> str:
        x = cs["reliability"][8]
        return f"{round(x['fraud_rate'] * x['n'])} of {x['n']}" if x["n"] else "empty"

    lines = [f"### {name} (map: {r['method']}, target {r['target']}, {r['test_frauds']} test frauds)", "",
             "| | test ECE | sum of outputs / frauds | frauds in the 0.8-0.9 bin | threshold | validation precision | "
             "test precision [95 %] | test recall [95 %] |", "|---|---|---|---|---|---|---|---|"]
    for k, label in (("before", "before: score, max-F1 threshold"), ("after", "after: calibrated, target threshold")):
        x = r[k]
        cs, te = x["calibration"], x["test"]
        iv = te["interval"]

        def ci(m: str) -> str:
            return "—" if te[m] is None else f"{te[m]:.3f} [{iv[m][0]:.3f}, {iv[m][1]:.3f}]" if iv[m] else f"{te[m]:.3f}"

        lines.append(f"| {label} | {cs['ece']:.4f} | {cs['sum_over_frauds']:.2f} | {binrate(cs)} | {x['threshold']:.4f} "
                     f"| {x['val_precision']:.3f} | {ci('precision')} | {ci('recall')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Command line of the module doc."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("data")
    ap.add_argument("max_rows", nargs="?", type=int, default=None)
    ap.add_argument("--name", default=None)
    ap.add_argument("--out", default=None, help="append the table to this markdown file")
    a = ap.parse_args(argv)
    text = markdown(a.name or Path(a.data).name, before_after(a.checkpoint, a.data, a.max_rows))
    print(text)
    if a.out:
        with open(a.out, "a", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
