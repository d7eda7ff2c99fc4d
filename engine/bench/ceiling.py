"""``fraudlens bench ceiling``: the best AUC ROC, average precision and Card Precision@100 any
model can expect on the Handbook protocol, computed from the simulator's labels (no model).

Why there is a ceiling. The Handbook simulator (Le Borgne et al., *Reproducible Machine
Learning for Credit Card Fraud Detection - Practical Handbook*, chapter 3.2, ``add_frauds``)
makes scenario-2 frauds by picking 2 terminals a day uniformly at random and marking every
transaction there as fraud for the next 28 days, amounts and times unchanged. Under the
protocol's 7-day label delay, a scenario-2 fraud is only recognisable through an *earlier,
already known* fraud of the same compromise: a scenario-2 fraud at the same terminal within
the last 28 days and at least 7 days before it. Without one ("silent"), the transaction is
exchangeable with a genuine one: the terminal was drawn at random, and nothing about the
transaction changed. Any model's ranking of the silent frauds among the genuine transactions
is therefore, in expectation, a random one.

The oracle (:func:`oracle_scores`) ranks every other fraud (scenario 1, scenario 3, and
scenario-2 frauds with evidence) above everything, perfectly: optimistic. Below them it orders
the rest by the customer's number of transactions that day (a customer with more transactions
is more likely to have touched a silently compromised terminal, which is what Card
Precision@100 counts) with random ties. Per transaction, that order is independent of the
label, so the expected AUC ROC and average precision are those of a random order. Its metrics,
averaged over random draws, bound the *expected* metrics of any model from above; a single run
can still exceed them by luck (the silent frauds are about 1 in 250 test transactions).

``TX_FRAUD_SCENARIO`` is read here for evaluation only, never as a model input.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from .gbt import evaluate_scores
from .handbook_protocol import fold_sets, folds

ROOT = Path(__file__).resolve().parents[2]
DAY_S = 86400
#: the simulator's compromise length (days) and the protocol's label delay (days)
COMPROMISE_DAYS = 28
DELAY_DAYS = 7
METRICS = ("AUC ROC", "Average precision", "Card Precision@100")
#: the issue's targets (mean of the 4 test folds)
TARGETS = {"Average precision": 0.72, "AUC ROC": 0.89, "Card Precision@100": 0.32}


def _seconds(ts: pd.Series) -> np.ndarray:
    return ts.to_numpy("datetime64[s]").astype(np.int64)


def compromise_evidence(df: pd.DataFrame, history: pd.DataFrame, *, delay_days: int = DELAY_DAYS,
                        compromise_days: int = COMPROMISE_DAYS) -> np.ndarray:
    """``[len(df)]`` bool: whether ``history`` holds a scenario-2 fraud at the row's terminal
    with a time in ``(t - compromise_days, t - delay_days]`` (seconds), i.e. a fraud of the same
    compromise whose label is known when the row is scored.

    Args:
        df: rows to judge; needs ``TERMINAL_ID`` and ``TX_DATETIME``.
        history: every labelled transaction (the raw Handbook frame); needs ``TERMINAL_ID``,
            ``TX_DATETIME``, ``TX_FRAUD`` and ``TX_FRAUD_SCENARIO``.
    """
    s2 = history[(history["TX_FRAUD"].to_numpy() == 1) & (history["TX_FRAUD_SCENARIO"].to_numpy() == 2)]
    t_hist = _seconds(s2["TX_DATETIME"])
    t = _seconds(df["TX_DATETIME"])
    base = min(int(t_hist.min()) if len(t_hist) else 0, int(t.min()) if len(t) else 0) - compromise_days * DAY_S
    span = max(int(t_hist.max()) if len(t_hist) else 0, int(t.max()) if len(t) else 0) - base + 1
    sk = np.sort(s2["TERMINAL_ID"].to_numpy().astype(np.int64) * span + (t_hist - base))
    key = df["TERMINAL_ID"].to_numpy().astype(np.int64) * span + (t - base)
    lo = np.searchsorted(sk, key - compromise_days * DAY_S, side="right")
    hi = np.searchsorted(sk, key - delay_days * DAY_S, side="right")
    return hi > lo


def silent_frauds(df: pd.DataFrame, history: pd.DataFrame, **kw) -> np.ndarray:
    """``[len(df)]`` bool: scenario-2 frauds without :func:`compromise_evidence` (nothing known
    under the label delay points at them). ``kw`` as :func:`compromise_evidence`."""
    s2 = (df["TX_FRAUD"].to_numpy() == 1) & (df["TX_FRAUD_SCENARIO"].to_numpy() == 2)
    return s2 & ~compromise_evidence(df, history, **kw)


def oracle_scores(df: pd.DataFrame, history: pd.DataFrame, rng: np.random.Generator | None,
                  by_activity: bool = False) -> np.ndarray:
    """``[len(df)]`` float64 scores of the oracle (module docstring).

    Every fraud except the silent ones scores in ``[2, 3)``. The rest score: ``0`` when ``rng``
    is None (ties: AUC ROC then equals its expectation over random orders); else a uniform
    ``[0, 1)`` draw; with ``by_activity``, the customer's number of transactions that day in
    ``df`` (plus the draw) divided by 1000. Needs the columns of :func:`silent_frauds` plus
    ``CUSTOMER_ID`` and ``TX_TIME_DAYS``.
    """
    known = (df["TX_FRAUD"].to_numpy() == 1) & ~silent_frauds(df, history)
    if rng is None:
        return known.astype(np.float64)
    u = rng.random(len(df))
    rest = u
    if by_activity:
        per_day = df.groupby(["CUSTOMER_ID", "TX_TIME_DAYS"], sort=False)["TX_FRAUD"].transform("size").to_numpy()
        rest = (per_day + u) / 1000.0
    return np.where(known, 2.0 + u, rest)


def information_ceiling(raw: pd.DataFrame, kind: str = "test", *, draws: int = 10, seed: int = 0) -> pd.DataFrame:
    """Per fold of ``kind`` (``"test"`` or ``"validation"``), the oracle's expected metrics and
    ``"Silent fraud share"`` (silent frauds / frauds).

    AUC ROC: exact, from tied scores below the known frauds (the mean over random orders).
    Average precision: mean over ``draws`` random orders below the known frauds. Card
    Precision@100 and the per-scenario recall@100: mean over ``draws`` of the activity order
    (:func:`oracle_scores` with ``by_activity``), which can only raise them.

    Args:
        raw: the Handbook frame of :func:`engine.bench.handbook_features.load_handbook_dataset`.
    Returns:
        one row per fold: ``fold``, the :func:`engine.bench.gbt.evaluate_scores` metrics, the share.
    Raises:
        ValueError: ``draws`` < 1.
    """
    if draws < 1:
        raise ValueError(f"draws: expected >= 1, got {draws}")
    rng = np.random.default_rng(seed)
    rows = []
    for f in folds(kind):
        _, test_df = fold_sets(raw, f)
        test_df = test_df.copy()
        fraud = test_df["TX_FRAUD"].to_numpy() == 1
        share = float(silent_frauds(test_df, raw).sum() / max(1, int(fraud.sum())))
        test_df["predictions"] = oracle_scores(test_df, raw, None)
        auc = evaluate_scores(test_df)["AUC ROC"]
        ap, act = [], []
        for _ in range(draws):
            test_df["predictions"] = oracle_scores(test_df, raw, rng)
            ap.append(evaluate_scores(test_df)["Average precision"])
            test_df["predictions"] = oracle_scores(test_df, raw, rng, by_activity=True)
            act.append(evaluate_scores(test_df))
        mean = pd.DataFrame(act).mean(numeric_only=True).to_dict()
        mean.update({"AUC ROC": auc, "Average precision": float(np.mean(ap))})
        rows.append({"fold": f.name, **mean, "Silent fraud share": share})
    return pd.DataFrame(rows)


def report(test: pd.DataFrame, validation: pd.DataFrame | None = None, *, draws: int, data: str = "") -> str:
    """Markdown tables of :func:`information_ceiling` (per fold, mean ± std) and the targets."""
    def table(df: pd.DataFrame, title: str) -> list[str]:
        out = [f"{title}:", "", "| fold | AUC ROC | average precision | Card Precision@100 | silent fraud share |",
               "|---|---|---|---|---|"]
        for _, r in df.iterrows():
            out.append(f"| {r['fold']} | {r['AUC ROC']:.3f} | {r['Average precision']:.3f} | "
                       f"{r['Card Precision@100']:.3f} | {r['Silent fraud share']:.1%} |")
        out.append("| mean ± std | " + " | ".join(f"{df[m].mean():.3f} ± {df[m].std(ddof=0):.3f}" for m in METRICS)
                   + f" | {df['Silent fraud share'].mean():.1%} |")
        return out + [""]

    lines = ["# Information ceiling of the Handbook protocol", "",
             f"Run {datetime.now(timezone.utc).isoformat(timespec='seconds')} on `{data}`; no model, "
             f"mean of {draws} random tie-breaks per fold (`engine.bench.ceiling`).", "",
             "A scenario-2 fraud is *silent* when no scenario-2 fraud of the same compromise (same terminal, "
             f"within the last {COMPROMISE_DAYS} days) is at least {DELAY_DAYS} days older: under the label delay "
             "nothing points at it, and the simulator left it unchanged, so no model ranks it above chance in "
             "expectation. The oracle ranks every other fraud first, perfectly (optimistic); below them it ties the rest "
             "(AUC ROC: the mean over random orders), orders them at random (average precision) or by the customer's "
             "number of transactions that day (Card Precision@100, which that can only raise). Its metrics bound the "
             "expected metrics of any model from above; a single run can exceed them by a lucky order of the silent "
             "frauds.", ""]
    lines += table(test, "Test folds (training starts 2018-08-15, 08-08, 08-01, 07-25)")
    if validation is not None:
        lines += table(validation, "Validation folds (14 days earlier)")
    lines += ["| target (mean of 4 test folds) | ceiling | reachable in expectation |", "|---|---|---|"]
    for m, tgt in TARGETS.items():
        c = test[m].mean()
        lines.append(f"| {m} >= {tgt} | {c:.3f} | {'yes' if c >= tgt else '**no**'} |")
    return "\n".join(lines) + "\n"


def run(data: str, *, out: Path = ROOT / "bench" / "results" / "ceiling.md", draws: int = 10, log=print) -> str:
    """Compute the ceiling on the test and validation folds; print and write the markdown."""
    from .handbook_features import load_handbook_dataset

    raw = load_handbook_dataset(data)
    text = report(information_ceiling(raw, "test", draws=draws), information_ceiling(raw, "validation", draws=draws),
                  draws=draws, data=data)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    log(text)
    return text
