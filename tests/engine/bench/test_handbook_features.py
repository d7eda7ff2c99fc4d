"""Handbook baseline features (Chapter 3.3) against brute-force recomputation."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.bench.handbook_features import (
    INPUT_FEATURES,
    add_handbook_features,
    load_transactions,
)

DATA = Path("/work/shared/data/handbook/transactions.parquet")
DAY = pd.Timedelta(days=1)

needs_data = pytest.mark.skipif(not DATA.exists(), reason="handbook data not available")


@pytest.fixture(scope="module")
def real():
    raw = load_transactions(DATA)
    t0 = time.perf_counter()
    feats = add_handbook_features(raw)
    return raw, feats, time.perf_counter() - t0


# ---------------------------------------------------------------- brute force


def brute_customer(sub: pd.DataFrame, i: int, w: int) -> tuple[int, float]:
    """Customer window (t - w, t], rows up to and including i (TRANSACTION_ID order).

    ``sub``: all transactions of the customer, indexed like the full frame."""
    t = sub.at[i, "TX_DATETIME"]
    same = sub[sub.index <= i]
    win = same[(same.TX_DATETIME > t - w * DAY) & (same.TX_DATETIME <= t)]
    return len(win), float(win.TX_AMOUNT.sum() / len(win))


def brute_terminal(sub: pd.DataFrame, i: int, w: int, delay: int = 7) -> tuple[int, float]:
    """Terminal window (t - delay - w, t - delay]; risk 0 if empty.

    ``sub``: all transactions of the terminal, indexed like the full frame."""
    t = sub.at[i, "TX_DATETIME"]
    same = sub
    win = same[(same.TX_DATETIME > t - (delay + w) * DAY) & (same.TX_DATETIME <= t - delay * DAY)]
    n = len(win)
    return n, (float(win.TX_FRAUD.sum() / n) if n else 0.0)


# ---------------------------------------------------------------- real data


@needs_data
def test_columns_and_speed(real):
    raw, feats, seconds = real
    assert len(feats) == len(raw) == 1_754_155
    assert list(feats.columns[: len(raw.columns)]) == list(raw.columns)
    for c in INPUT_FEATURES:
        assert c in feats.columns
        assert feats[c].notna().all()
    assert "TX_FRAUD_SCENARIO" not in INPUT_FEATURES
    assert seconds < 60
    # rows are in TRANSACTION_ID order, as the handbook's read_from_files
    assert feats.TRANSACTION_ID.is_monotonic_increasing


@needs_data
def test_weekend_and_night_flags(real):
    raw, feats, _ = real
    # handbook's own check: 2018-05-01 (Tuesday) just after midnight, 2018-09-30 (Sunday) at 23:59
    first_may = feats[feats.TX_DATETIME >= "2018-05-01"].iloc[0]
    assert (first_may.TX_DURING_WEEKEND, first_may.TX_DURING_NIGHT) == (0, 1)
    last = feats.iloc[-1]
    assert str(last.TX_DATETIME) == "2018-09-30 23:59:57"
    assert (last.TX_DURING_WEEKEND, last.TX_DURING_NIGHT) == (1, 0)
    hour = feats.TX_DATETIME.dt.hour
    assert (feats.TX_DURING_NIGHT[hour == 6] == 1).all()  # "hour <= 6"
    assert (feats.TX_DURING_NIGHT[hour == 7] == 0).all()
    wd = feats.TX_DATETIME.dt.day_of_week
    assert (feats.TX_DURING_WEEKEND == (wd >= 5)).all()


@needs_data
def test_customer_features_match_brute_force(real):
    raw, feats, _ = real
    rng = np.random.default_rng(7)
    customers = rng.choice(raw.CUSTOMER_ID.unique(), 6, replace=False)
    # plus a customer with two transactions in the same second (tie handling)
    tie_cust = raw[raw.duplicated(["CUSTOMER_ID", "TX_DATETIME"], keep=False)].CUSTOMER_ID.iloc[0]
    checked = 0
    for c in [*customers, tie_cust]:
        sub = raw[raw.CUSTOMER_ID == c]
        picks = rng.choice(sub.index, min(15, len(sub)), replace=False)
        if c == tie_cust:
            dup = sub[sub.duplicated("TX_DATETIME", keep=False)].index
            assert len(dup) >= 2
            picks = np.concatenate([picks, dup])
        for i in picks:
            for w in (1, 7, 30):
                nb, avg = brute_customer(sub, i, w)
                assert feats.at[i, f"CUSTOMER_ID_NB_TX_{w}DAY_WINDOW"] == nb
                assert feats.at[i, f"CUSTOMER_ID_AVG_AMOUNT_{w}DAY_WINDOW"] == pytest.approx(
                    avg, rel=1e-9, abs=1e-6
                )
                checked += 1
    assert checked > 250


@needs_data
def test_terminal_features_match_brute_force_and_respect_delay(real):
    raw, feats, _ = real
    rng = np.random.default_rng(11)
    fraud_terms = raw.loc[raw.TX_FRAUD == 1, "TERMINAL_ID"].unique()
    terminals = [*rng.choice(fraud_terms, 6, replace=False), *rng.choice(raw.TERMINAL_ID.unique(), 3)]
    delay_cases = 0
    for term in terminals:
        sub = raw[raw.TERMINAL_ID == term]
        frauds = sub[sub.TX_FRAUD == 1]
        picks = list(rng.choice(sub.index, min(12, len(sub)), replace=False))
        # transactions that follow a fraud on the same terminal within the 7-day delay
        for _, f in frauds.head(3).iterrows():
            after = sub[(sub.TX_DATETIME > f.TX_DATETIME) & (sub.TX_DATETIME < f.TX_DATETIME + 7 * DAY)]
            picks += list(after.index[:2])
        for i in picks:
            t = raw.at[i, "TX_DATETIME"]
            for w in (1, 7, 30):
                nb, risk = brute_terminal(sub, i, w)
                assert feats.at[i, f"TERMINAL_ID_NB_TX_{w}DAY_WINDOW"] == nb
                assert feats.at[i, f"TERMINAL_ID_RISK_{w}DAY_WINDOW"] == pytest.approx(risk, abs=1e-12)
            # a fraud inside the delay window (t - 7d, t] is not known yet
            in_delay = sub[(sub.TX_DATETIME > t - 7 * DAY) & (sub.TX_DATETIME <= t) & (sub.TX_FRAUD == 1)]
            if len(in_delay):
                delay_cases += 1
                # the 1-day window (t-8d, t-7d] and the delay (t-7d, t] are disjoint: the
                # feature's fraud count is the wide count minus every fraud in the delay
                nb1 = feats.at[i, "TERMINAL_ID_NB_TX_1DAY_WINDOW"]
                fr1 = round(feats.at[i, "TERMINAL_ID_RISK_1DAY_WINDOW"] * nb1)
                wide = sub[(sub.TX_DATETIME > t - 8 * DAY) & (sub.TX_DATETIME <= t)]
                assert fr1 == wide.TX_FRAUD.sum() - len(in_delay)
                assert nb1 < len(wide)
    assert delay_cases >= 5


# ---------------------------------------------------------------- synthetic boundaries


def _frame(rows):
    df = pd.DataFrame(rows, columns=["TX_DATETIME", "CUSTOMER_ID", "TERMINAL_ID", "TX_AMOUNT", "TX_FRAUD"])
    df["TX_DATETIME"] = pd.to_datetime(df["TX_DATETIME"])
    df.insert(0, "TRANSACTION_ID", np.arange(len(df)))
    return df


def test_window_boundaries_on_hand_made_frame():
    t0 = pd.Timestamp("2018-06-01 12:00:00")
    df = _frame(
        [
            (t0, 1, 9, 10.0, 1),  # terminal 9 fraud
            (t0 + 1 * DAY, 1, 9, 30.0, 0),  # exactly one day later
            (t0 + 3 * DAY, 2, 9, 50.0, 1),  # second fraud, inside delay for the rows below
            (t0 + 7 * DAY, 2, 9, 70.0, 0),  # exactly 7 days after the first fraud
            (t0 + 8 * DAY, 2, 9, 90.0, 0),  # exactly 8 days after the first fraud
        ]
    )
    f = add_handbook_features(df)
    # customer 1: the 1-day window (t-1d, t] excludes the transaction exactly 1 day before
    assert f.loc[1, "CUSTOMER_ID_NB_TX_1DAY_WINDOW"] == 1
    assert f.loc[1, "CUSTOMER_ID_AVG_AMOUNT_1DAY_WINDOW"] == 30.0
    assert f.loc[1, "CUSTOMER_ID_NB_TX_7DAY_WINDOW"] == 2
    assert f.loc[1, "CUSTOMER_ID_AVG_AMOUNT_7DAY_WINDOW"] == 20.0
    # terminal at t0+7d: window (t0-1d, t0] holds the first fraud only (fraud at t0+3d is in the delay)
    assert f.loc[3, "TERMINAL_ID_NB_TX_1DAY_WINDOW"] == 1
    assert f.loc[3, "TERMINAL_ID_RISK_1DAY_WINDOW"] == 1.0
    # terminal at t0+8d: 1-day window (t0, t0+1d] holds the legit row only -> risk 0
    assert f.loc[4, "TERMINAL_ID_NB_TX_1DAY_WINDOW"] == 1
    assert f.loc[4, "TERMINAL_ID_RISK_1DAY_WINDOW"] == 0.0
    # 7-day window (t0-6d, t0+1d]: fraud + legit -> 0.5; the fraud at t0+3d is not counted
    assert f.loc[4, "TERMINAL_ID_NB_TX_7DAY_WINDOW"] == 2
    assert f.loc[4, "TERMINAL_ID_RISK_7DAY_WINDOW"] == 0.5
    # nothing is known before the delay has passed: empty window, risk 0 (handbook fillna(0))
    assert f.loc[0, "TERMINAL_ID_NB_TX_30DAY_WINDOW"] == 0
    assert f.loc[2, "TERMINAL_ID_RISK_30DAY_WINDOW"] == 0.0


def test_matches_pandas_rolling_like_the_handbook():
    """Same values as the handbook's per-entity pandas time-based rolling."""
    rng = np.random.default_rng(3)
    n = 3000
    t = pd.Timestamp("2018-04-01") + pd.to_timedelta(np.sort(rng.integers(0, 90 * 86400, n)), unit="s")
    df = _frame(
        list(
            zip(
                t,
                rng.integers(0, 20, n),
                rng.integers(0, 15, n),
                rng.gamma(2.0, 30.0, n).round(2),
                (rng.random(n) < 0.1).astype(int),
            )
        )
    )
    f = add_handbook_features(df)
    for c, g in df.groupby("CUSTOMER_ID"):
        g = g.set_index("TX_DATETIME")
        for w in (1, 7, 30):
            roll = g.TX_AMOUNT.rolling(f"{w}D")
            np.testing.assert_array_equal(f.loc[g.TRANSACTION_ID, f"CUSTOMER_ID_NB_TX_{w}DAY_WINDOW"], roll.count())
            np.testing.assert_allclose(
                f.loc[g.TRANSACTION_ID, f"CUSTOMER_ID_AVG_AMOUNT_{w}DAY_WINDOW"],
                roll.sum() / roll.count(),
                rtol=1e-9,
            )
    for c, g in df.groupby("TERMINAL_ID"):
        g = g.set_index("TX_DATETIME")
        nd = g.TX_FRAUD.rolling("7D").count()
        fd = g.TX_FRAUD.rolling("7D").sum()
        for w in (1, 7, 30):
            nb = g.TX_FRAUD.rolling(f"{7 + w}D").count() - nd
            fr = g.TX_FRAUD.rolling(f"{7 + w}D").sum() - fd
            np.testing.assert_array_equal(f.loc[g.TRANSACTION_ID, f"TERMINAL_ID_NB_TX_{w}DAY_WINDOW"], nb)
            np.testing.assert_allclose(
                f.loc[g.TRANSACTION_ID, f"TERMINAL_ID_RISK_{w}DAY_WINDOW"], (fr / nb).fillna(0.0)
            )
