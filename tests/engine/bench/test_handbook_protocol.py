"""Handbook protocol: folds, get_train_test_set on real data, Card Precision@k, constants."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn import metrics

from engine.bench import published
from engine.bench.gbt import evaluate_scores, per_scenario_recall
from engine.bench.handbook_features import load_transactions
from engine.bench.handbook_protocol import (
    card_precision_top_k,
    card_precision_top_k_day,
    fold_sets,
    folds,
    get_train_test_set,
    performance_assessment,
    prequential_split,
)

DATA = Path("/work/shared/data/handbook/transactions.parquet")
needs_data = pytest.mark.skipif(not DATA.exists(), reason="handbook data not available")


# ---------------------------------------------------------------- folds


def test_fold_dates_follow_chapter_5():
    test = folds("test")
    assert [f.start_date_training.strftime("%Y-%m-%d") for f in test] == [
        "2018-08-15",
        "2018-08-08",
        "2018-08-01",
        "2018-07-25",
    ]
    valid = folds("validation")
    assert [f.start_date_training.strftime("%Y-%m-%d") for f in valid] == [
        "2018-07-11",
        "2018-07-04",
        "2018-06-27",
        "2018-06-20",
    ]
    f = test[0]
    assert f.train_period == (pd.Timestamp("2018-08-15"), pd.Timestamp("2018-08-22"))
    assert f.test_period == (pd.Timestamp("2018-08-29"), pd.Timestamp("2018-09-05"))
    # validation never assesses on a day used for testing, and its last assessed week is the
    # oldest test fold's training week
    last_valid_test_end = max(v.test_period[1] for v in valid)
    assert last_valid_test_end <= min(t.train_period[1] for t in test)
    assert valid[0].test_period == test[-1].train_period
    with pytest.raises(ValueError):
        folds("train")


# ---------------------------------------------------------------- split on real data


@pytest.fixture(scope="module")
def raw():
    return load_transactions(DATA)


@needs_data
def test_train_test_split_real_fold(raw):
    fold = folds("test")[0]
    train, test = fold_sets(raw, fold)

    # training week: [2018-08-15, 2018-08-22)
    assert train.TX_DATETIME.min() >= pd.Timestamp("2018-08-15")
    assert train.TX_DATETIME.max() < pd.Timestamp("2018-08-22")
    in_week = raw[(raw.TX_DATETIME >= "2018-08-15") & (raw.TX_DATETIME < "2018-08-22")]
    assert len(train) == len(in_week)
    d0 = int(train.TX_TIME_DAYS.min())
    assert d0 == (pd.Timestamp("2018-08-15") - pd.Timestamp("2018-04-01")).days

    # test days: d0+14 .. d0+20 = 2018-08-29 .. 2018-09-04, 7 days between (delay)
    assert sorted(test.TX_TIME_DAYS.unique()) == list(range(d0 + 14, d0 + 21))
    assert test.TX_DATETIME.min() >= pd.Timestamp("2018-08-29")
    assert test.TX_DATETIME.max() < pd.Timestamp("2018-09-05")
    assert train.TRANSACTION_ID.is_monotonic_increasing
    assert test.TRANSACTION_ID.is_monotonic_increasing

    # brute force removal: on test day d0+14+j, drop customers with a fraud on days d0..d0+6+j
    expected = []
    fraud_days = raw[raw.TX_FRAUD == 1].groupby("CUSTOMER_ID").TX_TIME_DAYS.apply(set)
    still_there_with_recent_fraud = 0
    for j in range(7):
        day = raw[raw.TX_TIME_DAYS == d0 + 14 + j]
        known = {c for c, days in fraud_days.items() if any(d0 <= d <= d0 + 6 + j for d in days)}
        kept = day[~day.CUSTOMER_ID.isin(known)]
        expected.append(kept)
        # frauds during the last 7 days (the delay) are not known: those customers stay
        recent = {
            c for c, days in fraud_days.items() if any(d0 + 7 + j <= d < d0 + 14 + j for d in days)
        }
        still_there_with_recent_fraud += kept.CUSTOMER_ID.isin(recent - known).sum()
        removed = day.CUSTOMER_ID.isin(known).sum()
        assert removed > 0
    expected = pd.concat(expected).sort_values("TRANSACTION_ID")
    assert test.index.equals(expected.index)
    assert still_there_with_recent_fraud > 0

    # no customer with a training-week fraud is in the test set
    assert not test.CUSTOMER_ID.isin(train.loc[train.TX_FRAUD == 1, "CUSTOMER_ID"]).any()

    # pinned sizes for this fold (regression guard)
    assert (len(train), int(train.TX_FRAUD.sum())) == (67049, 594)
    assert (len(test), int(test.TX_FRAUD.sum())) == (57604, 422)


@needs_data
def test_prequential_split_matches_folds(raw):
    splits = prequential_split(raw, "2018-08-15", n_folds=4)
    for (tr_idx, te_idx), fold in zip(splits, folds("test")):
        tr, te = fold_sets(raw, fold)
        np.testing.assert_array_equal(tr_idx, tr.index.to_numpy())
        np.testing.assert_array_equal(te_idx, te.index.to_numpy())


def test_get_train_test_set_hand_made():
    start = pd.Timestamp("2018-04-01")
    rows = []
    # days 0..6 train, 7..13 delay, 14..20 test; customer 1: fraud on day 2 (train)
    # customer 2: fraud on day 8 (delay) -> removed from test day 16 onwards (8 <= 7 + j - 1 -> j>=2)
    # customer 3: fraud on day 12 -> removed from test day 20 (j=6) only
    # customer 4: fraud on day 13 (last delay day) -> never known during the test week
    for d in range(21):
        for c in (1, 2, 3, 4):
            fraud = int((c, d) in {(1, 2), (2, 8), (3, 12), (4, 13)})
            rows.append((start + pd.Timedelta(days=d, hours=c), c, d, fraud))
    df = pd.DataFrame(rows, columns=["TX_DATETIME", "CUSTOMER_ID", "TX_TIME_DAYS", "TX_FRAUD"])
    df.insert(0, "TRANSACTION_ID", np.arange(len(df)))
    train, test = get_train_test_set(df, start)
    assert sorted(train.TX_TIME_DAYS.unique()) == list(range(7))
    present = test.groupby("TX_TIME_DAYS").CUSTOMER_ID.apply(lambda s: sorted(s))
    assert present[14] == [2, 3, 4]  # day 14: knows frauds up to day 6
    assert present[15] == [2, 3, 4]  # day 15: knows up to day 7
    assert present[16] == [3, 4]  # day 16: knows up to day 8 -> customer 2 removed
    assert present[19] == [3, 4]
    assert present[20] == [4]  # day 20: knows up to day 12 -> customer 3 removed, 4 stays


# ---------------------------------------------------------------- Card Precision@k


def cp_frame():
    rows = [
        # day, customer, score, fraud
        (0, 1, 0.9, 1),
        (0, 1, 0.1, 0),
        (0, 2, 0.8, 0),
        (0, 3, 0.7, 1),
        (1, 1, 0.95, 1),  # already detected on day 0 -> removed
        (1, 3, 0.6, 1),
        (1, 4, 0.5, 0),
        (1, 2, 0.4, 0),
        (1, 2, 0.3, 1),  # customer 2: max score 0.4, max label 1
        (2, 5, 0.2, 1),  # only one card on day 2, precision still divided by k
    ]
    return pd.DataFrame(rows, columns=["TX_TIME_DAYS", "CUSTOMER_ID", "predictions", "TX_FRAUD"])


def test_card_precision_top_k_hand_computed():
    df = cp_frame()
    # day 0: cards by max score 1 (0.9, fraud), 2 (0.8), 3 (0.7, fraud); top-2 = {1, 2} -> 1/2
    detected, cp = card_precision_top_k_day(df[df.TX_TIME_DAYS == 0], 2)
    assert detected == [1] and cp == 0.5
    # with removal: day 1 ranks 3 (0.6, fraud), 4 (0.5), 2 (0.4, fraud) -> top-2 {3, 4} -> 1/2
    nb, per_day, mean = card_precision_top_k(df, 2)
    assert nb == [2, 2, 1]
    assert per_day == [0.5, 0.5, 0.5]
    assert mean == pytest.approx(0.5)
    # without removal: day 1 ranks 1 (0.95, fraud), 3 (0.6, fraud) -> 2/2
    nb, per_day, mean = card_precision_top_k(df, 2, remove_detected_compromised_cards=False)
    assert nb == [2, 3, 1]
    assert per_day == [0.5, 1.0, 0.5]
    assert mean == pytest.approx(2 / 3)


def test_performance_assessment_and_evaluate_scores():
    df = cp_frame()
    df["TX_FRAUD_SCENARIO"] = np.where(df.TX_FRAUD == 1, [1, 0, 0, 3, 2, 2, 0, 0, 3, 1], 0)
    m = performance_assessment(df, top_k_list=[2])
    assert m["AUC ROC"] == pytest.approx(metrics.roc_auc_score(df.TX_FRAUD, df.predictions))
    assert m["Average precision"] == pytest.approx(
        metrics.average_precision_score(df.TX_FRAUD, df.predictions)
    )
    assert m["Card Precision@2"] == pytest.approx(0.5)
    # per-day top-2 cards (no removal): day 0 {1, 2}; day 1 {1, 3}; day 2 {5}
    # scenario 1 frauds: (0,1) caught, (2,5) caught -> 1.0
    # scenario 2 frauds: (1,1) caught, (1,3) caught -> 1.0
    # scenario 3 frauds: (0,3) missed, (1,2) missed -> 0.0
    assert per_scenario_recall(df, top_k=2) == {1: 1.0, 2: 1.0, 3: 0.0}
    # threshold mode: scores >= 0.5 -> s1: 0.9 yes, 0.2 no; s2: 0.95, 0.6 yes; s3: 0.7 yes, 0.3 no
    assert per_scenario_recall(df, threshold=0.5) == {1: 0.5, 2: 1.0, 3: 0.5}
    e = evaluate_scores(df, top_k=2)
    assert e["Recall@2 scenario 3"] == 0.0
    assert e["n_test"] == 10 and e["n_test_frauds"] == 6


# ---------------------------------------------------------------- published constants


def test_published_constants():
    p = published
    assert (p.XGBOOST.auc_roc, p.XGBOOST.average_precision, p.XGBOOST.card_precision_100) == (
        0.869,
        0.687,
        0.303,
    )
    assert p.RANDOM_FOREST.as_dict() == {
        "AUC ROC": 0.870,
        "Average precision": 0.678,
        "Card Precision@100": 0.299,
    }
    assert (p.FEED_FORWARD_NN.auc_roc, p.FEED_FORWARD_NN.average_precision,
            p.FEED_FORWARD_NN.card_precision_100) == (0.876, 0.675, 0.303)
    assert (p.LSTM.auc_roc, p.LSTM.average_precision, p.LSTM.card_precision_100) == (
        0.876,
        0.665,
        0.297,
    )
    assert (p.LSTM_ATTENTION.auc_roc, p.LSTM_ATTENTION.average_precision,
            p.LSTM_ATTENTION.card_precision_100) == (0.874, 0.667, 0.295)
    assert {r.model for r in p.PUBLISHED_TEST_RESULTS} >= {"XGBoost", "Random forest", "LSTM"}
    assert "Chapter 7" in p.SOURCE and "Handbook" in p.SOURCE
