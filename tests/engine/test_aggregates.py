"""Delayed-label aggregates equal a brute-force recomputation, and never see the delay period."""

import numpy as np
import pandas as pd
import pytest

from engine.data.aggregates import delayed_aggregates
from engine.data.spec import DelayedAggregateSpec


def brute(frame, agg):
    out = {c: [] for c in agg.columns()}
    for _, r in frame.iterrows():
        same = frame[frame["terminal"] == r["terminal"]]
        end = r["timestamp"] - pd.Timedelta(days=agg.delay_days)
        for w in agg.windows_days:
            win = same[(same["timestamp"] >= end - pd.Timedelta(days=w)) & (same["timestamp"] < end)]
            n = len(win)
            fr = win["label"].fillna(0).sum()
            out[f"{agg.name}_count_{w}d"].append(float(n))
            out[f"{agg.name}_fraud_rate_{w}d"].append(fr / n if n else 0.0)
        known = same[same["timestamp"] < end].sort_values("timestamp", kind="stable")
        y = known["label"].fillna(0).astype(float).tolist()
        for k in agg.recent_labels:
            last = y[-k:]
            out[f"{agg.name}_recent_fraud_share_{k}"].append(sum(last) / len(last) if last else 0.0)
        if agg.fraud_run:
            run = 0
            while run < len(y) and y[len(y) - 1 - run] == 1:
                run += 1
            first = known["timestamp"].iloc[len(y) - run] if run else None
            out[f"{agg.name}_fraud_run_length"].append(float(run))
            out[f"{agg.name}_fraud_run_days"].append((r["timestamp"] - first).total_seconds() / 86400 if run else 0.0)
    return pd.DataFrame(out)


@pytest.mark.parametrize("seed", [0, 1])
def test_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = 150
    frame = pd.DataFrame({
        "timestamp": (pd.Timestamp("2024-01-01") + pd.to_timedelta(rng.uniform(0, 60 * 86400, n), unit="s")).floor("s"),
        "terminal": rng.integers(0, 6, n).astype(str),
        "label": pd.array(np.where(rng.random(n) < 0.05, pd.NA, rng.random(n) < 0.2), dtype="Int8"),
    })
    agg = DelayedAggregateSpec(name="terminal_risk", key="terminal", windows_days=[1, 7, 30], delay_days=7,
                               recent_labels=[1, 3], fraud_run=True)
    got = delayed_aggregates(frame, agg)
    want = brute(frame, agg)
    assert want["terminal_risk_fraud_run_length"].max() >= 2  # the data has runs to find
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want, check_exact=False, rtol=1e-12)


def test_fraud_run_of_a_compromised_terminal():
    """A terminal whose transactions became frauds 10 days ago (every day since), seen 7 days late."""
    t0 = pd.Timestamp("2024-03-20 12:00")
    days = list(range(-20, 1))
    frame = pd.DataFrame({
        "timestamp": [t0 + pd.Timedelta(days=d) for d in days],
        "terminal": ["T1"] * len(days),
        "label": pd.array([int(d >= -10) for d in days], dtype="Int8"),
    })
    agg = DelayedAggregateSpec(name="r", key="terminal", windows_days=[7], delay_days=7, recent_labels=[3], fraud_run=True)
    got = delayed_aggregates(frame, agg).iloc[-1]
    # known at t0: days -20..-8; frauds since day -10 -> run of 3 (days -10, -9, -8), began 10 days ago
    assert got["r_fraud_run_length"] == 3.0
    assert got["r_fraud_run_days"] == pytest.approx(10.0)
    assert got["r_recent_fraud_share_3"] == 1.0


def test_recent_labels_must_be_positive_and_distinct():
    with pytest.raises(ValueError, match="recent_labels"):
        DelayedAggregateSpec(name="r", key="terminal", recent_labels=[3, 3])


def test_a_fraud_inside_the_delay_period_is_not_counted():
    t0 = pd.Timestamp("2024-03-01 12:00")
    frame = pd.DataFrame({
        "timestamp": [t0 - pd.Timedelta(days=9), t0 - pd.Timedelta(days=3), t0],
        "terminal": ["T1", "T1", "T1"],
        "label": pd.array([0, 1, 0], dtype="Int8"),
    })
    agg = DelayedAggregateSpec(name="r", key="terminal", windows_days=[7], delay_days=7)
    got = delayed_aggregates(frame, agg)
    # for the last row the window is [t0-14d, t0-7d): only the legit row 9 days back
    assert got["r_count_7d"].tolist() == [0.0, 0.0, 1.0]
    assert got["r_fraud_rate_7d"].tolist() == [0.0, 0.0, 0.0]
