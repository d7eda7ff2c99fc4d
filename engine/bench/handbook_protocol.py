"""The Fraud Detection Handbook's evaluation protocol.

Source: Le Borgne, Siblini, Lebichot, Bontempi, "Reproducible Machine Learning for Credit Card
Fraud Detection - Practical Handbook" (Université Libre de Bruxelles, 2022), and its
``Chapter_References/shared_functions`` notebook:

- ``get_train_test_set``  -- Chapter 3, Section 3.4 "Baseline fraud detection system";
- ``prequential_split`` / ``folds`` -- Chapter 5, Section 5.2 "Validation strategies" and
  Section 5.3 "Model selection" (reference start 2018-07-25; validation folds start 14 days
  before it, test folds 21 days after it, 4 folds each, one week apart);
- ``card_precision_top_k`` -- Chapter 4, Section 4.4 "Precision top-k metrics";
- ``performance_assessment`` -- AUC ROC, average precision (scikit-learn) and CP@k, as the
  handbook's ``performance_assessment`` (unrounded here).

Re-implemented from the handbook's description and code (not copied); behaviour is meant to be
identical, including which customers are removed from each test day.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn import metrics

#: Chapter 5.3: ``start_date_training = 2018-07-25``; validation and test folds are derived from it.
REFERENCE_START_DATE = pd.Timestamp("2018-07-25")
DELTA_TRAIN = 7
DELTA_DELAY = 7
DELTA_TEST = 7
N_FOLDS = 4
TOP_K = 100

#: Chapter 5.3: ``start_date_training_for_valid = start_date_training - (delta_delay + delta_valid)``.
VALIDATION_START_DATE = REFERENCE_START_DATE - pd.Timedelta(days=DELTA_DELAY + DELTA_TEST)
#: Chapter 5.3: ``start_date_training_for_test = start_date_training + (n_folds - 1) * delta_test``.
TEST_START_DATE = REFERENCE_START_DATE + pd.Timedelta(days=(N_FOLDS - 1) * DELTA_TEST)


@dataclass(frozen=True)
class Fold:
    """One prequential fold: train on ``[start, start+delta_train)``, wait ``delta_delay`` days,
    assess on the ``delta_test`` following days (Handbook Chapter 5, Section 5.2, Fig. 5)."""

    kind: str
    index: int
    start_date_training: pd.Timestamp
    delta_train: int = DELTA_TRAIN
    delta_delay: int = DELTA_DELAY
    delta_test: int = DELTA_TEST

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.index}"

    @property
    def train_period(self) -> tuple[pd.Timestamp, pd.Timestamp]:
        """Half-open ``[first, end)`` datetime range of the training set."""
        s = self.start_date_training
        return s, s + pd.Timedelta(days=self.delta_train)

    @property
    def test_period(self) -> tuple[pd.Timestamp, pd.Timestamp]:
        """Half-open ``[first, end)`` datetime range of the test (assessment) days."""
        s = self.start_date_training + pd.Timedelta(days=self.delta_train + self.delta_delay)
        return s, s + pd.Timedelta(days=self.delta_test)


def folds(
    kind: str = "test",
    n_folds: int = N_FOLDS,
    reference_start_date: pd.Timestamp | str = REFERENCE_START_DATE,
    delta_train: int = DELTA_TRAIN,
    delta_delay: int = DELTA_DELAY,
    delta_test: int = DELTA_TEST,
) -> list[Fold]:
    """The handbook's prequential validation or test folds, most recent first.

    Handbook Chapter 5, Section 5.3 "Model selection" (``model_selection_wrapper`` calling
    ``prequentialSplit``): with the reference start 2018-07-25,

    - ``kind="test"``: training starts 2018-08-15, 08-08, 08-01, 07-25 (start + 21 days, then
      one ``delta_test`` back per fold);
    - ``kind="validation"``: training starts 2018-07-11, 07-04, 06-27, 06-20 (start - 14 days,
      then one week back per fold). The most recent validation fold's test week
      (07-25..07-31) is the oldest test fold's training week: selection never sees test days.
    """
    ref = pd.Timestamp(reference_start_date)
    if kind == "test":
        first = ref + pd.Timedelta(days=(n_folds - 1) * delta_test)
    elif kind in ("validation", "valid"):
        kind = "validation"
        first = ref - pd.Timedelta(days=delta_delay + delta_test)
    else:
        raise ValueError(f"kind must be 'test' or 'validation', not {kind!r}")
    return [
        Fold(
            kind=kind,
            index=i,
            start_date_training=first - pd.Timedelta(days=i * delta_test),
            delta_train=delta_train,
            delta_delay=delta_delay,
            delta_test=delta_test,
        )
        for i in range(n_folds)
    ]


def get_train_test_set(
    transactions_df: pd.DataFrame,
    start_date_training: pd.Timestamp | str | _dt.datetime,
    delta_train: int = DELTA_TRAIN,
    delta_delay: int = DELTA_DELAY,
    delta_test: int = DELTA_TEST,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Training set and test set with known-compromised cards removed, as the handbook.

    Handbook Chapter 3, Section 3.4 (shared function ``get_train_test_set``):

    - train = transactions with ``start <= TX_DATETIME < start + delta_train``;
    - with ``d0 = min(train.TX_TIME_DAYS)``, test day ``j`` (0..delta_test-1) is
      ``TX_TIME_DAYS == d0 + delta_train + delta_delay + j``;
    - known compromised customers = customers with a fraud in the training set, plus, before
      test day ``j``, customers with a fraud on day ``d0 + delta_train + j - 1``
      (cumulative). So test day ``j`` drops every customer with a fraud on days
      ``d0 .. d0 + delta_train + j - 1``: all frauds up to ``delta_delay + 1`` days before the
      test day are known; the last ``delta_delay`` days' are not.

    Both sets are returned sorted by ``TRANSACTION_ID`` with the caller's index kept.
    ``sampling_ratio`` of the handbook (chapter 5 undersampling) is not supported.
    """
    start = pd.Timestamp(start_date_training)
    dt = transactions_df["TX_DATETIME"]
    train_df = transactions_df[(dt >= start) & (dt < start + pd.Timedelta(days=delta_train))]
    if train_df.empty:
        raise ValueError(f"no training transactions from {start}")

    days = transactions_df["TX_TIME_DAYS"]
    fraud = transactions_df["TX_FRAUD"] == 1
    cust = transactions_df["CUSTOMER_ID"]

    known = set(train_df.loc[train_df["TX_FRAUD"] == 1, "CUSTOMER_ID"])
    d0 = int(train_df["TX_TIME_DAYS"].min())
    parts = []
    for j in range(delta_test):
        day_df = transactions_df[days == d0 + delta_train + delta_delay + j]
        known |= set(cust[fraud & (days == d0 + delta_train + j - 1)])
        parts.append(day_df[~day_df["CUSTOMER_ID"].isin(known)])
    test_df = pd.concat(parts)

    train_df = train_df.sort_values("TRANSACTION_ID", kind="stable")
    test_df = test_df.sort_values("TRANSACTION_ID", kind="stable")
    return train_df, test_df


def prequential_split(
    transactions_df: pd.DataFrame,
    start_date_training: pd.Timestamp | str,
    n_folds: int = N_FOLDS,
    delta_train: int = DELTA_TRAIN,
    delta_delay: int = DELTA_DELAY,
    delta_assessment: int = DELTA_TEST,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Index arrays ``(train, test)`` per fold, as the handbook's ``prequentialSplit``.

    Handbook Chapter 5, Section 5.2 "Validation strategies": fold ``i`` starts training
    ``i * delta_assessment`` days before ``start_date_training``.
    """
    out = []
    start = pd.Timestamp(start_date_training)
    for i in range(n_folds):
        tr, te = get_train_test_set(
            transactions_df,
            start - pd.Timedelta(days=i * delta_assessment),
            delta_train=delta_train,
            delta_delay=delta_delay,
            delta_test=delta_assessment,
        )
        out.append((tr.index.to_numpy(), te.index.to_numpy()))
    return out


def fold_sets(transactions_df: pd.DataFrame, fold: Fold) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``get_train_test_set`` for a :class:`Fold`."""
    return get_train_test_set(
        transactions_df,
        fold.start_date_training,
        delta_train=fold.delta_train,
        delta_delay=fold.delta_delay,
        delta_test=fold.delta_test,
    )


def card_precision_top_k_day(
    df_day: pd.DataFrame, top_k: int, score_col: str = "predictions"
) -> tuple[list, float]:
    """CP@k for one day (Handbook Chapter 4, Section 4.4, ``card_precision_top_k_day``).

    Per customer, the maximum score and maximum label over the day's transactions; customers
    sorted by decreasing score (pandas ``sort_values`` default, as the handbook, so ties are
    broken the same way); the ``top_k`` first are the alerts. Returns the alerted customers that
    really had a fraud that day and their count divided by ``top_k`` (not by the number of
    alerts, even if fewer than ``top_k`` customers transacted).
    """
    per_card = (
        df_day[["CUSTOMER_ID", score_col, "TX_FRAUD"]]
        .groupby("CUSTOMER_ID")
        .max()
        .sort_values(by=score_col, ascending=False)
        .reset_index(drop=False)
    )
    top = per_card.head(top_k)
    detected = list(top.loc[top["TX_FRAUD"] == 1, "CUSTOMER_ID"])
    return detected, len(detected) / top_k


def card_precision_top_k(
    predictions_df: pd.DataFrame,
    top_k: int = TOP_K,
    remove_detected_compromised_cards: bool = True,
    score_col: str = "predictions",
) -> tuple[list[int], list[float], float]:
    """Card Precision@k averaged over the days (Handbook Chapter 4, Section 4.4).

    Days (``TX_TIME_DAYS``) are processed in increasing order; on each day, customers already
    detected as compromised on a previous day (true positives among earlier alerts) are
    removed before ranking. Returns ``(nb_compromised_cards_per_day, cp_per_day, mean_cp)``
    like the handbook's ``card_precision_top_k``.
    """
    detected_so_far: set = set()
    nb_compromised, cp_per_day = [], []
    for day in sorted(predictions_df["TX_TIME_DAYS"].unique()):
        df_day = predictions_df.loc[
            predictions_df["TX_TIME_DAYS"] == day, [score_col, "CUSTOMER_ID", "TX_FRAUD"]
        ]
        df_day = df_day[~df_day["CUSTOMER_ID"].isin(detected_so_far)]
        nb_compromised.append(int(df_day.loc[df_day["TX_FRAUD"] == 1, "CUSTOMER_ID"].nunique()))
        detected, cp = card_precision_top_k_day(df_day, top_k, score_col=score_col)
        cp_per_day.append(cp)
        if remove_detected_compromised_cards:
            detected_so_far.update(detected)
    mean_cp = float(np.mean(cp_per_day)) if cp_per_day else float("nan")
    return nb_compromised, cp_per_day, mean_cp


def performance_assessment(
    predictions_df: pd.DataFrame,
    score_col: str = "predictions",
    output_feature: str = "TX_FRAUD",
    top_k_list: Iterable[int] = (TOP_K,),
) -> dict[str, float]:
    """AUC ROC, average precision and Card Precision@k on one test set.

    Handbook ``performance_assessment`` (Chapter 3, Section 3.4; metrics of Chapter 4):
    ``sklearn.metrics.roc_auc_score``, ``average_precision_score`` and ``card_precision_top_k``
    (with removal of detected cards). Keys: ``"AUC ROC"``, ``"Average precision"``,
    ``"Card Precision@{k}"``. Not rounded.
    """
    y = predictions_df[output_feature].to_numpy()
    s = predictions_df[score_col].to_numpy()
    out = {
        "AUC ROC": float(metrics.roc_auc_score(y, s)),
        "Average precision": float(metrics.average_precision_score(y, s)),
    }
    for k in top_k_list:
        out[f"Card Precision@{k}"] = card_precision_top_k(predictions_df, k, score_col=score_col)[2]
    return out

