"""``fraudlens bench links``: links between cases on the Handbook, and counterfactuals on the demo.

1. **Common point of compromise** (:func:`engine.cases.links.rank_points`) on the Fraud Detection
   Handbook file: the terminals are ranked for each window (days before the first fraud) with and
   without the first fraud's own day; precision@k of the ranked terminals against the terminals
   the simulator compromised (``TX_FRAUD_SCENARIO == 2``, read for this evaluation only, never by
   the ranking), the time the ranking took, and the time of one case's links
   (:func:`engine.cases.links.case_links`).
2. **Counterfactuals** (:mod:`engine.trust.counterfactual`) with the demo model on the demo data:
   over the highest-scored flagged transactions (one per entity), how often each search clears the
   flag, how many removals, how often the removal result is exact, re-scores and time per case.

Writes one markdown file (default ``bench/results/links.md``) and prints it.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

WINDOWS = (0, 1, 3, 7, 14, 30)
TOP_K = (20, 100, 357)


def rank_table(frame: pd.DataFrame, spec, compromised: set[str], windows: Sequence[int] = WINDOWS,
               log: Callable[[str], None] = print) -> pd.DataFrame:
    """One row per (window, include_onset): ranked points, precision@k (k in :data:`TOP_K`), seconds."""
    from engine.cases.links import rank_points

    rows = []
    for w in windows:
        for inc in (True, False):
            if w == 0 and not inc:
                continue
            t0 = time.perf_counter()
            r = rank_points(frame, spec, window_days=w, include_onset=inc)
            s = time.perf_counter() - t0
            row = {"window_days": w, "first_fraud_day": "counted" if inc else "left out", "ranked": len(r.table)}
            for k in TOP_K:
                row[f"precision@{k}"] = float(np.mean([p in compromised for p in r.top(k)])) if len(r.table) else 0.0
            row["seconds"] = s
            rows.append(row)
            log(f"[links] window {w} d, first fraud day {row['first_fraud_day']}: "
                f"precision@20 {row['precision@20']:.2f} ({s:.1f} s)")
    return pd.DataFrame(rows)


def counterfactual_table(n_cases: int, log: Callable[[str], None] = print) -> tuple[pd.DataFrame, dict]:
    """Counterfactuals of the ``n_cases`` highest-scored flagged demo transactions (one per entity)
    with the demo model: per case found / removals / exact / re-scores / seconds, and a summary."""
    import torch

    from engine.cases import view as cv
    from engine.trust.counterfactual import amount_counterfactual, removal_counterfactual

    torch.set_num_threads(1)
    src = cv.load_source(cv.DEMO_DATA, cv.demo_spec_name())
    bundle = cv.load_model(None)
    thr = float(bundle.threshold)
    scores = cv.score_source(bundle, src.frame, thr)
    flagged = scores[scores["flagged"]].sort_values("probability", ascending=False)
    flagged = flagged.drop_duplicates("entity_id").head(int(n_cases))
    rows = []
    for q in flagged["transaction_id"].astype(str):
        ex = cv.explain_query(bundle, src.frame, q, methods=("shap",))
        t0 = time.perf_counter()
        r = removal_counterfactual(bundle, src.frame, q, thr, ex)
        t1 = time.perf_counter()
        a = amount_counterfactual(bundle, src.frame, q, thr)
        t2 = time.perf_counter()
        rows.append({"transaction_id": q, "probability": r.original_probability, "removal_found": r.found,
                     "removals": len(r.removed) if r.found else None, "exact": r.exact if r.found else None,
                     "removal_rescores": r.evaluations, "removal_seconds": t1 - t0, "amount_found": a.found,
                     "amount_ratio": (a.amount / a.original_amount) if a.found else None,
                     "amount_rescores": a.evaluations, "amount_seconds": t2 - t1})
        log(f"[counterfactual] {q}: removal {'found ' + str(len(r.removed)) if r.found else 'none'}, "
            f"amount {'found' if a.found else 'none'} ({t2 - t0:.1f} s)")
    df = pd.DataFrame(rows)
    summary = {"threshold": thr, "cases": len(df), "model": str(bundle.path), "sha256": bundle.sha256}
    return df, summary


def _md(df: pd.DataFrame, floats: str = "{:.2f}") -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        lines.append("| " + " | ".join(floats.format(v) if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(lines)


def run(data: str | Path, out: Path, windows: Sequence[int] = WINDOWS, cf_cases: int = 20,
        log: Callable[[str], None] = print) -> str:
    """Both benchmarks; writes ``out`` and returns its markdown."""
    from engine.bench.speed import machine_info
    from engine.cases.links import case_links, rank_points
    from engine.data.io import read_transactions
    from engine.data.spec import load_spec

    spec = load_spec("handbook")
    t0 = time.perf_counter()
    frame = read_transactions(data, spec).frame
    t_read = time.perf_counter() - t0
    compromised = set(frame.loc[frame["TX_FRAUD_SCENARIO"] == 2, "terminal"].astype(str))
    table = rank_table(frame, spec, compromised, windows, log)
    r = rank_points(frame, spec)
    ents = r.onsets.sort_values().index[:: max(1, len(r.onsets) // 10)][:10]
    t0 = time.perf_counter()
    n_linked = [len(case_links(frame, spec, e, onsets=r.onsets, ranking=r).linked) for e in ents]
    t_case = (time.perf_counter() - t0) / len(ents)
    share = len(compromised) / frame["terminal"].nunique()
    parts = [
        "# Links between cases and counterfactuals",
        "",
        f"Run {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')} (`fraudlens bench links`, "
        "`engine.bench.links`).",
        "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in machine_info().items()) + ".",
        "",
        "## Common point of compromise on the Handbook",
        "",
        f"`{data}`: {len(frame):,} transactions, {frame['entity_id'].nunique():,} customers, "
        f"{frame['terminal'].nunique():,} terminals, of which {len(compromised):,} compromised by the simulator "
        f"(scenario 2, {100 * share:.1f} %: the precision of a random ranking). {r.n_fraud_entities:,} fraud "
        f"entities (labelled). Read in {t_read:.1f} s. Precision@k: the share of compromised terminals among the k "
        "first ranked; TX_FRAUD_SCENARIO is read for this evaluation only.",
        "",
        _md(table),
        "",
        f"One case's links (default window, {len(ents)} fraud entities spread over the onset dates): "
        f"{t_case:.2f} s each, {np.mean(n_linked):.0f} linked entities on average.",
        "",
    ]
    if cf_cases:
        cf, s = counterfactual_table(cf_cases, log)
        found = cf[cf["removal_found"]]
        parts += [
            "## Counterfactuals with the demo model",
            "",
            f"The {s['cases']} highest-scored flagged transactions of the demo data (one per entity), demo model "
            f"(sha256 {s['sha256'][:12]}), review threshold {s['threshold']:.3f}; removal candidates in SHAP order.",
            "",
            _md(pd.DataFrame([{
                "cases": s["cases"],
                "removal clears it": f"{int(cf['removal_found'].sum())} of {len(cf)}",
                "removals (median, max)": (f"{found['removals'].median():.0f}, {found['removals'].max():.0f}"
                                           if len(found) else "-"),
                "exact": f"{int(found['exact'].sum())} of {len(found)}" if len(found) else "-",
                "amount clears it": f"{int(cf['amount_found'].sum())} of {len(cf)}",
                "re-scores per case (removal + amount)": f"{(cf['removal_rescores'] + cf['amount_rescores']).mean():.1f}",
                "seconds per case": f"{(cf['removal_seconds'] + cf['amount_seconds']).mean():.2f}",
            }])),
            "",
        ]
    text = "\n".join(parts)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    log(text)
    return text


__all__ = ["TOP_K", "WINDOWS", "counterfactual_table", "rank_table", "run"]
