"""engine.data.entity_features: every column against a brute-force loop, causality, real files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.data.entity_features import WINDOWS, causal_entity_features
from engine.data.io import read_transactions
from engine.data.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "demo_data" / "transactions.csv"


def _random_frame(n: int = 400, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    ent = rng.choice(["a", "b", "c", "d"], size=n)
    # clustered times so the 1 h / 24 h windows hold several rows; some exact ties
    t0 = pd.Timestamp("2024-01-01")
    secs = np.sort(rng.integers(0, 40 * 86400, size=n))
    secs[5:9] = secs[5]
    ts = t0 + pd.to_timedelta(secs, unit="s")
    frame = pd.DataFrame({
        "row_number": np.arange(1, n + 1), "transaction_id": [f"r{i}" for i in range(n)],
        "entity_id": ent, "timestamp": ts, "amount": np.round(rng.lognormal(3, 1, n), 2),
        "merchant": rng.choice(["m1", "m2", "m3", "m4", "m5"], size=n),
        "mcc": rng.choice(["5411", "5812"], size=n),
    })
    frame.loc[::17, "amount"] = 0.0  # zero amounts (a past mean of 0) and refunds
    frame.loc[::23, "amount"] *= -1
    return frame.sample(frac=1.0, random_state=seed)  # any row order


def _spec():
    from engine.data.spec import spec_from_dict

    return spec_from_dict({
        "name": "t", "entity": {"columns": ["e"]}, "timestamp": {"column": "t"},
        "amount": {"column": "a"},
        "fields": [{"name": "merchant", "column": "m", "kind": "categorical"},
                   {"name": "mcc", "column": "c", "kind": "categorical"}],
    })


def _brute(frame: pd.DataFrame) -> pd.DataFrame:
    """The module docstring's table, one row at a time."""
    rows = {}
    srt = frame.sort_values(["entity_id", "timestamp", "row_number"])
    for _, g in srt.groupby("entity_id", sort=False):
        g = g.reset_index()
        for i in range(len(g)):
            r, past = g.iloc[i], g.iloc[:i]
            f = {}
            for name, w in WINDOWS.items():
                win = past[past.timestamp > r.timestamp - pd.Timedelta(seconds=w)]
                f[f"ef_n_{name}"] = len(win)
                f[f"ef_amount_sum_{name}"] = win.amount.sum()
                f[f"ef_amount_mean_{name}"] = win.amount.mean() if len(win) else np.nan
            f["ef_n_past"] = len(past)
            sd = past.amount.std(ddof=0) if len(past) >= 2 else np.nan
            f["ef_amount_z"] = (r.amount - past.amount.mean()) / sd if len(past) >= 2 and sd > 0 else np.nan
            for c in ("merchant", "mcc"):
                same = past[past[c] == r[c]]
                m = same.amount.mean() if len(same) else np.nan
                f[f"ef_amount_vs_mean_{c}"] = r.amount / m if len(same) and abs(m) > 1e-9 else np.nan
                f[f"ef_new_{c}"] = float(len(same) == 0)
            f["ef_dt_prev_s"] = (r.timestamp - past.timestamp.iloc[-1]).total_seconds() if i >= 1 else np.nan
            f["ef_dt_prev2_s"] = (r.timestamp - past.timestamp.iloc[-2]).total_seconds() if i >= 2 else np.nan
            f["ef_hour"] = r.timestamp.hour
            f["ef_weekday"] = r.timestamp.weekday()
            rows[r["index"]] = f
    return pd.DataFrame.from_dict(rows, orient="index").loc[frame.index]


def test_every_column_equals_a_brute_force_loop():
    frame = _random_frame()
    got = causal_entity_features(frame, _spec())
    want = _brute(frame)[got.columns]
    assert got.index.equals(frame.index)
    np.testing.assert_allclose(got.to_numpy(), want.to_numpy(dtype=float), rtol=1e-9, atol=1e-9)
    # the windows really hold several rows, ties included (the check is not vacuous)
    assert got["ef_n_24h"].max() >= 3 and got["ef_new_merchant"].sum() < len(frame)
    assert np.isfinite(got.to_numpy()[~np.isnan(got.to_numpy())]).all()  # no inf from a zero mean


def causal_violations(fn, frame: pd.DataFrame, cutoff: pd.Timestamp, seed: int = 1) -> int:
    """Rows before ``cutoff`` whose features change when every later row is altered or dropped
    and new later rows are added. 0 for a causal feature function."""
    rng = np.random.default_rng(seed)
    base = fn(frame)
    later = frame.timestamp >= cutoff
    changed = frame.copy()
    changed.loc[later, "amount"] = changed.loc[later, "amount"] * rng.uniform(0.1, 10, later.sum())
    changed.loc[later, "merchant"] = "m_new"
    extra = frame[later].head(20).assign(row_number=lambda d: d.row_number + 10_000)
    changed = pd.concat([changed.drop(frame[later].index[::3]), extra.set_axis(extra.index + 10_000)])
    after = fn(changed)
    early = frame.index[~later]
    diff = ~np.isclose(base.loc[early].to_numpy(), after.loc[early].to_numpy(), equal_nan=True)
    return int(diff.any(axis=1).sum())


def test_changing_later_rows_never_changes_earlier_features():
    frame = _random_frame(seed=3)
    cutoff = frame.timestamp.quantile(0.6)
    assert causal_violations(lambda f: causal_entity_features(f, _spec()), frame, cutoff) == 0


def test_the_causality_check_catches_a_leaky_feature():
    frame = _random_frame(seed=3)
    cutoff = frame.timestamp.quantile(0.6)

    def leaky(f):  # entity mean over ALL rows, future included
        out = causal_entity_features(f, _spec())
        return out.assign(leak=f.groupby("entity_id").amount.transform("mean"))

    assert causal_violations(leaky, frame, cutoff) > 0


def test_demo_file_features_are_finite_where_defined():
    res = read_transactions(DEMO, load_spec("demo"), max_rows=3000)
    fr = res.frame
    ef = causal_entity_features(fr, load_spec("demo"))
    assert len(ef) == len(fr)
    first = fr.groupby("entity_id").cumcount().to_numpy() == 0
    assert np.isnan(ef["ef_dt_prev_s"].to_numpy()[first]).all()
    assert (ef["ef_n_past"].to_numpy()[first] == 0).all()
    assert np.isfinite(ef["ef_dt_prev_s"].to_numpy()[~first]).all()
    assert (ef["ef_dt_prev_s"].to_numpy()[~first] >= 0).all()
    merchant = next(f.name for f in load_spec("demo").fields if "merchant" in f.name.lower())
    assert ef[f"ef_new_{merchant}"].between(0, 1).all()


def test_overflowing_sort_key_is_a_clear_error():
    frame = pd.DataFrame({
        "row_number": [1, 2], "entity_id": ["a", "b"], "amount": [1.0, 2.0],
        "timestamp": pd.to_datetime(["1700-01-01", "2260-01-01"]), "merchant": ["x", "y"], "mcc": ["1", "2"],
    })
    import engine.data.entity_features as ef

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ef, "_INT63", 10**9)
        with pytest.raises(ValueError, match="overflow the int64 sort key"):
            causal_entity_features(frame, _spec())
