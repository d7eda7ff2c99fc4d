"""``fraudlens bench ceiling``: how far any model can go on the Handbook protocol, from the
simulator's labels (no model): AUC ROC, average precision and Card Precision@100 of an oracle.

Why there is a ceiling. The Handbook simulator (Le Borgne et al., *Reproducible Machine
Learning for Credit Card Fraud Detection - Practical Handbook*, chapter 3.2, ``add_frauds``)
makes scenario-2 frauds by drawing 2 of the 10,000 terminals each day (``sample(n=2,
random_state=day)``: a public seed, not a legitimate model input) and marking every transaction
there as fraud from that midnight for 28 days, amounts and times unchanged. Under the
protocol's 7-day label delay, a scenario-2 fraud is recognisable only through an *earlier,
already known* scenario-2 fraud at its terminal (within the last 28 days, at least 7 days
older). Without one it is *silent*: nothing about the transaction changed, and the only
observable that bears on it is how long the terminal's known history has been quiet
(:func:`compromise_prior_days`: a compromise could have begun on any day after the terminal's
last known transaction, so the chance is about ``2e-4`` per such day).

The oracle (:func:`oracle_scores`) ranks every other fraud (scenario 1, scenario 3, scenario-2
frauds with evidence) first and perfectly, which is optimistic (scenario-3 frauds, x5 amounts,
can look normal), and the rest by that prior: per transaction for AUC ROC and average
precision, and per customer and day (the sum over the day's transactions, the chance of having
met a silently compromised terminal) for Card Precision@100. That is the best order of the
silent frauds we know of given what a model may see; its metrics are what a model with
perfect knowledge of everything else would score on these folds with that order. The silent
frauds come in clusters (about 7 per compromised terminal), so a model can beat the ceiling on
one fold by a lucky order.

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


#: seconds per terminal block of the (terminal, time) sort keys: times are offset to be >= 0 and
#: must stay below it (2**40 s is 34,000 years)
_SPAN = 1 << 40


def _terminal_time_keys(history: pd.DataFrame, df: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """int64 sort keys ``terminal * _SPAN + seconds`` (seconds from a common origin 1 year
    before either frame starts): ``(sorted history keys, their order in history, df keys)``.

    Raises:
        ValueError: a ``TERMINAL_ID`` outside ``[0, 2**22)`` (the keys would overflow or mix).
    """
    ht, t = _seconds(history["TX_DATETIME"]), _seconds(df["TX_DATETIME"])
    origin = min(int(ht.min()) if len(ht) else 0, int(t.min()) if len(t) else 0) - 366 * DAY_S
    keys = []
    for frame, secs in ((history, ht), (df, t)):
        term = frame["TERMINAL_ID"].to_numpy().astype(np.int64)
        if len(term) and (term.min() < 0 or term.max() >= 1 << 22):
            raise ValueError(f"TERMINAL_ID: expected integers in [0, 2**22), got {term.min()}..{term.max()}")
        keys.append(term * _SPAN + (secs - origin))
    order = np.argsort(keys[0], kind="stable")
    return keys[0][order], order, keys[1]


def compromise_evidence(df: pd.DataFrame, history: pd.DataFrame, *, delay_days: int = DELAY_DAYS,
                        compromise_days: int = COMPROMISE_DAYS) -> np.ndarray:
    """``[len(df)]`` bool: whether ``history`` holds a scenario-2 fraud at the row's terminal
    with a time in ``(t - compromise_days, t - delay_days]`` (seconds; known at ``t`` under the
    delay, as the Handbook's delayed terminal features count it): a known fraud of the same
    compromise, or (optimistically) of one that ended less than ``compromise_days`` ago.

    Args:
        df: rows to judge; needs ``TERMINAL_ID`` and ``TX_DATETIME``.
        history: every labelled transaction (the raw Handbook frame); needs ``TERMINAL_ID``,
            ``TX_DATETIME``, ``TX_FRAUD`` and ``TX_FRAUD_SCENARIO``.
    """
    s2 = history[(history["TX_FRAUD"].to_numpy() == 1) & (history["TX_FRAUD_SCENARIO"].to_numpy() == 2)]
    sk, _, q = _terminal_time_keys(s2, df)
    lo = np.searchsorted(sk, q - compromise_days * DAY_S, side="right")
    hi = np.searchsorted(sk, q - delay_days * DAY_S, side="right")
    return hi > lo


def silent_frauds(df: pd.DataFrame, history: pd.DataFrame, **kw) -> np.ndarray:
    """``[len(df)]`` bool: scenario-2 frauds without :func:`compromise_evidence` (nothing known
    under the label delay points at them). ``kw`` as :func:`compromise_evidence`."""
    s2 = (df["TX_FRAUD"].to_numpy() == 1) & (df["TX_FRAUD_SCENARIO"].to_numpy() == 2)
    return s2 & ~compromise_evidence(df, history, **kw)


def compromise_prior_days(df: pd.DataFrame, history: pd.DataFrame, *, delay_days: int = DELAY_DAYS,
                          compromise_days: int = COMPROMISE_DAYS) -> np.ndarray:
    """``[len(df)]`` int64: on how many days a compromise of the row's terminal could have
    begun without any known label showing it, ``c = min(compromise_days, D - g)``; ``D`` is
    the row's day (``TX_TIME_DAYS``) and ``g`` the day of the terminal's last transaction in
    ``history`` known at the row's time (``t_j <= t - delay_days``), or ``c = compromise_days``
    when there is none.

    A compromise begins at midnight and marks every later transaction of its terminal, and each
    day draws 2 of the 10,000 terminals, so when that last known transaction is genuine the
    chance that the row is a silent fraud is about ``2e-4 * c``: terminals whose known
    transactions are older are more likely to be silently compromised. ``c`` needs only the
    terminal's transaction times and "no known fraud", which a model may use.
    """
    sk, order, q = _terminal_time_keys(history, df)
    hday = history["TX_TIME_DAYS"].to_numpy().astype(np.int64)[order]
    hi = np.searchsorted(sk, q - delay_days * DAY_S, side="right")  # one past the last known transaction
    last = np.maximum(hi - 1, 0)
    has = (hi > 0) & (sk[last] // _SPAN == q // _SPAN)  # ... and it is the same terminal's
    day = df["TX_TIME_DAYS"].to_numpy().astype(np.int64)
    c = np.where(has, np.minimum(compromise_days, day - hday[last]), compromise_days)
    return c.astype(np.int64)


def oracle_scores(df: pd.DataFrame, history: pd.DataFrame, rng: np.random.Generator | None,
                  per_customer_day: bool = False) -> np.ndarray:
    """``[len(df)]`` float64 scores of the oracle (module docstring).

    Every fraud except the silent ones scores ``2 + u``. The rest score by the observable
    prior of a silent fraud, :func:`compromise_prior_days` ``c`` (or, with
    ``per_customer_day``, the sum of ``c`` over the customer's transactions that day in
    ``df``: the chance that the customer met a silently compromised terminal that day, which
    Card Precision@100 counts), scaled into ``[0, 1)``, plus ``u / 1000`` to break ties.
    ``u`` is uniform ``[0, 1)`` from ``rng``, or 0 when ``rng`` is None (ties kept: AUC ROC
    then equals its mean over random tie-breaks). Needs the columns of :func:`silent_frauds`
    plus ``CUSTOMER_ID`` and ``TX_TIME_DAYS``.
    """
    known = (df["TX_FRAUD"].to_numpy() == 1) & ~silent_frauds(df, history)
    c = compromise_prior_days(df, history).astype(np.float64)
    if per_customer_day:
        c = pd.Series(c, index=df.index).groupby([df["CUSTOMER_ID"], df["TX_TIME_DAYS"]], sort=False).transform("sum").to_numpy()
    u = rng.random(len(df)) if rng is not None else np.zeros(len(df))
    rest = (c + u / 1000.0) / (c.max() + 1.0)
    return np.where(known, 2.0 + u, rest)


def information_ceiling(raw: pd.DataFrame, kind: str = "test", *, draws: int = 10, seed: int = 0) -> pd.DataFrame:
    """Per fold of ``kind`` (``"test"`` or ``"validation"``), the oracle's expected metrics and
    ``"Silent fraud share"`` (silent frauds / frauds).

    AUC ROC: exact, ties within the same prior kept (the mean over random tie-breaks).
    Average precision: mean over ``draws`` random tie-breaks. Card Precision@100 and the
    per-scenario recall@100: mean over ``draws`` of the per-customer-day order
    (:func:`oracle_scores` with ``per_customer_day``).

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
            test_df["predictions"] = oracle_scores(test_df, raw, rng, per_customer_day=True)
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
             f"Run {datetime.now(timezone.utc).isoformat(timespec='seconds')} on `{data}`; no model "
             f"(`engine.bench.ceiling`). AUC ROC exact; average precision and Card Precision@100 the mean of "
             f"{draws} random tie-breaks per fold.", "",
             "A scenario-2 fraud (compromised terminal) is *silent* when no scenario-2 fraud at its terminal within "
             f"the last {COMPROMISE_DAYS} days is at least {DELAY_DAYS} days older: under the label delay nothing "
             "points at it, and the simulator left the transaction unchanged. The one observable that bears on it is "
             "how long the terminal's known history has been quiet (a compromise could have begun on any day since "
             "its last known transaction). The oracle ranks every other fraud first, perfectly (optimistic: "
             "scenario-3 frauds can look normal), and the rest by that prior: per transaction (AUC ROC, average "
             "precision), per customer and day (Card Precision@100). It is the best order of the silent frauds we "
             "know of given what a model may see. They come in clusters (about 7 per compromised terminal), so one "
             "fold can beat it by a lucky order.", ""]
    lines += table(test, "Test folds (training starts 2018-08-15, 08-08, 08-01, 07-25)")
    if validation is not None:
        lines += table(validation, "Validation folds (training starts 2018-07-11, 07-04, 06-27, 06-20)")
    lines += ["| target (mean of 4 test folds) | ceiling | target below the ceiling |", "|---|---|---|"]
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
