"""engine.model.baseline (LightGBM over causal entity features) and engine.model.compare."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.data.io import read_transactions
from engine.data.spec import load_spec, spec_from_dict
from engine.model.baseline import BaselineConfig, TabularBaseline
from engine.model.compare import paired_bootstrap
from engine.model.train import binary_metrics, time_split

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "demo_data" / "transactions.csv"


# ---------------------------------------------------------------------------------- bootstrap
def _clustered(n_ent=200, per=20, seed=0):
    rng = np.random.default_rng(seed)
    ents = np.repeat(np.arange(n_ent), per)
    y = (rng.random(n_ent * per) < 0.05).astype(int)
    return rng, ents, y


def test_bootstrap_of_a_scorer_against_itself_is_exactly_zero():
    rng, ents, y = _clustered()
    s = rng.random(len(y))
    r = paired_bootstrap(y, s, s, ents, n_boot=50)
    assert r["diff"] == 0 and r["ci_low"] == 0 and r["ci_high"] == 0 and r["n_entities"] == 200


def test_bootstrap_separates_a_good_scorer_from_noise():
    rng, ents, y = _clustered()
    good = y + 0.8 * rng.random(len(y))
    noise = rng.random(len(y))
    r = paired_bootstrap(y, good, noise, ents, n_boot=200)
    assert r["ci_low"] > 0.5 and r["share_diff_le_0"] == 0.0
    r_auc = paired_bootstrap(y, good, noise, ents, metric="auc_roc", n_boot=200)
    assert r_auc["a"] == pytest.approx(1.0) and r_auc["ci_low"] > 0.3


def test_bootstrap_interval_covers_zero_for_two_equally_noisy_scorers():
    """The check can fail: two unrelated noise scorers must rarely look different (a 95 %
    interval excludes 0 in about 5 % of independent trials)."""
    covered = 0
    for seed in range(20):
        rng, ents, y = _clustered(n_ent=100, seed=seed)
        r = paired_bootstrap(y, rng.random(len(y)), rng.random(len(y)), ents, n_boot=100, seed=seed)
        covered += r["ci_low"] <= 0 <= r["ci_high"]
    assert covered >= 16, covered


def test_entity_bootstrap_is_wider_than_a_row_bootstrap_on_clustered_labels():
    rng = np.random.default_rng(2)
    ents = np.repeat(np.arange(60), 30)
    y = np.repeat(rng.random(60) < 0.2, 30).astype(int)  # a whole entity is fraud or not
    a = 0.5 * y + rng.random(60)[ents] + 0.1 * rng.random(len(y))  # per-entity score effect
    b = rng.random(len(y))
    by_entity = paired_bootstrap(y, a, b, ents, n_boot=300)
    by_row = paired_bootstrap(y, a, b, np.arange(len(y)), n_boot=300)
    assert by_entity["ci_high"] - by_entity["ci_low"] > 1.5 * (by_row["ci_high"] - by_row["ci_low"])


def test_bootstrap_refuses_bad_input():
    with pytest.raises(ValueError, match="one class only"):
        paired_bootstrap(np.zeros(5), np.ones(5), np.ones(5), np.arange(5))
    with pytest.raises(ValueError, match="lengths differ"):
        paired_bootstrap(np.array([0, 1]), np.ones(3), np.ones(2), np.arange(2))
    with pytest.raises(ValueError, match="metric"):
        paired_bootstrap(np.array([0, 1]), np.ones(2), np.ones(2), np.arange(2), metric="f1")


# ----------------------------------------------------------------------------------- baseline
def _planted(n_ent=150, per=60, seed=0):
    """Fraud = a first visit to a merchant with an amount 6x the card's usual: only causal
    per-entity features can see it (the amount alone overlaps the legit range across cards)."""
    rng = np.random.default_rng(seed)
    rows = []
    for e in range(n_ent):
        scale = rng.lognormal(3, 1)
        t = pd.Timestamp("2024-01-01") + pd.to_timedelta(np.sort(rng.integers(0, 120 * 86400, per)), unit="s")
        merch = rng.choice([f"m{e}_{k}" for k in range(4)], size=per)
        amt = scale * rng.lognormal(0, 0.2, per)
        fraud = np.zeros(per, dtype=int)
        for i in rng.choice(np.arange(20, per), size=2, replace=False):
            merch[i], amt[i], fraud[i] = f"new{e}_{i}", scale * 6, 1
        rows.append(pd.DataFrame({"entity_id": str(e), "timestamp": t, "amount": amt, "merchant": merch,
                                  "label": pd.array(fraud, dtype="Int8")}))
    fr = pd.concat(rows, ignore_index=True).sort_values(["entity_id", "timestamp"], ignore_index=True)
    fr["row_number"] = np.arange(1, len(fr) + 1)
    fr["transaction_id"] = "r" + fr.row_number.astype(str)
    spec = spec_from_dict({
        "name": "planted", "entity": {"columns": ["e"]}, "timestamp": {"column": "t"},
        "amount": {"column": "a"}, "label": {"column": "y"},
        "fields": [{"name": "merchant", "column": "m", "kind": "categorical", "hashed_buckets": 64}],
    })
    return fr, spec


def test_baseline_finds_a_pattern_only_causal_entity_features_show():
    fr, spec = _planted()
    split, _, _ = time_split(fr.timestamp)
    m = TabularBaseline.fit(fr, spec, split, BaselineConfig(threads=1, n_estimators=300))
    lab = fr.label.to_numpy(dtype=float)
    te = np.flatnonzero(split == 2)
    got = binary_metrics(lab[te], m.predict(fr, te))
    by_amount = binary_metrics(lab[te], fr.amount.to_numpy()[te])
    assert got["average_precision"] > 0.9, got
    assert by_amount["average_precision"] < 0.5, by_amount  # the raw amount alone cannot
    assert next(iter(m.describe()["top_gain"])).startswith("ef_")  # a causal entity feature


def test_baseline_takes_field_values_lightgbm_refuses_as_feature_names():
    """A multi-valued item is part of a feature name; LightGBM refuses names with JSON characters,
    which ended a whole `train` run in a traceback (new-user trial: a merchant "Uber, Trip: NYC")."""
    fr, _ = _planted(n_ent=60)
    odd = ['Uber, Trip: NYC', 'say "hi"', "{a}[b]"]
    fr["merchant"] = fr["merchant"].where(fr.index % 3 != 0, odd[0] + "|" + fr["merchant"])
    fr.loc[fr.index % 5 == 0, "merchant"] = odd[1] + "|" + odd[2]
    spec = spec_from_dict({
        "name": "odd", "entity": {"columns": ["e"]}, "timestamp": {"column": "t"}, "amount": {"column": "a"},
        "label": {"column": "y"},
        "fields": [{"name": "merchant", "column": "m", "kind": "multi_valued", "separator": ";"}],
    })
    split, _, _ = time_split(fr.timestamp)
    m = TabularBaseline.fit(fr, spec, split, BaselineConfig(threads=1, n_estimators=30, early_stopping_rounds=0))
    assert {f"multi_merchant={v}" for v in odd} <= set(m.feature_names)
    p = m.predict(fr)
    assert p.shape == (len(fr),) and np.isfinite(p).all()
    assert set(m.describe()["top_gain"]) <= set(m.feature_names)  # the real names, not f0, f1, ...


def test_baseline_reads_every_model_input_of_the_spec():
    spec = load_spec("demo")
    fr = read_transactions(DEMO, spec).frame
    split, _, _ = time_split(fr.timestamp)
    m = TabularBaseline.fit(fr, spec, split, BaselineConfig(threads=1, n_estimators=40, early_stopping_rounds=0))
    names = set(m.feature_names)
    for f in spec.fields:
        if not f.model_input:
            continue
        prefix = {"categorical": "cat_", "numeric": "num_", "multi_valued": "multi_"}[f.kind.value]
        assert any(n.startswith(prefix + f.name) for n in names), (f.name, sorted(names))
    assert {"amount", "log_abs_amount", "ef_amount_z", "ef_dt_prev_s"} <= names
    p = m.predict(fr)
    assert p.shape == (len(fr),) and np.isfinite(p).all() and ((p >= 0) & (p <= 1)).all()


def test_baseline_reads_the_aggregate_columns_of_a_handbook_like_spec():
    spec = load_spec("handbook")
    cols = [c for agg in spec.aggregates for c in agg.columns()]
    assert cols, "the handbook spec has delayed-label aggregates"
    rng = np.random.default_rng(0)
    n = 600
    fr = pd.DataFrame({
        "row_number": np.arange(1, n + 1), "transaction_id": [f"t{i}" for i in range(n)],
        "entity_id": rng.choice(["c1", "c2", "c3"], n),
        "timestamp": pd.Timestamp("2018-04-01") + pd.to_timedelta(np.sort(rng.integers(0, 90 * 86400, n)), unit="s"),
        "amount": rng.lognormal(3, 1, n), "label": pd.array((rng.random(n) < 0.1).astype(int), dtype="Int8"),
    })
    for f in spec.fields:
        fr[f.name] = rng.choice(["a", "b"], n) if f.kind.value == "categorical" else rng.random(n)
    for c in cols:
        fr[c] = rng.random(n)
    fr = fr.sort_values(["entity_id", "timestamp"], ignore_index=True)
    split, _, _ = time_split(fr.timestamp)
    m = TabularBaseline.fit(fr, spec, split, BaselineConfig(threads=1, n_estimators=5, early_stopping_rounds=0))
    assert {f"agg_{c}" for c in cols} <= set(m.feature_names)


def test_baseline_needs_a_fraud_in_training():
    fr, spec = _planted(n_ent=5)
    fr["label"] = pd.array(np.zeros(len(fr), dtype=int), dtype="Int8")
    with pytest.raises(ValueError, match="no fraud-labelled"):
        TabularBaseline.fit(fr, spec, time_split(fr.timestamp)[0])


def test_fit_predict_equals_fit_then_predict():
    """fit_predict reuses the fit's inputs instead of computing the entity features again: the same
    probabilities as predict() on a freshly computed input frame."""
    fr, spec = _planted(n_ent=40)
    split, _, _ = time_split(fr.timestamp)
    te = np.flatnonzero(split == 2)
    cfg = BaselineConfig(threads=1, n_estimators=30, early_stopping_rounds=0)
    m, p = TabularBaseline.fit_predict(fr, spec, split, te, cfg)
    np.testing.assert_array_equal(p, m.predict(fr, te))
    np.testing.assert_array_equal(p, TabularBaseline.fit(fr, spec, split, cfg).predict(fr, te))


def test_a_seed_gives_the_same_baseline_whatever_thread_count_torch_set(shared_data):
    """LightGBM's model depends on its thread count even with ``deterministic``, and torch's
    set_num_threads moves the process's OpenMP count: the default config pins the threads, so the
    same seed gives the same probabilities after torch ran on 1 or 2 threads (with threads=None
    the TabFormer probabilities differed, and with 10 test frauds among tied scores the test AUC
    ROC moved from 0.567 to 0.629)."""
    import torch

    spec = load_spec("tabformer")
    fr = read_transactions(shared_data / "tabformer" / "User0_credit_card_transactions.csv", spec).frame
    split, _, _ = time_split(fr.timestamp)
    te = np.flatnonzero(split == 2)
    before = torch.get_num_threads()
    got = []
    try:
        for th in (1, 2):
            torch.set_num_threads(th)
            got.append(TabularBaseline.fit_predict(fr, spec, split, te, BaselineConfig(n_estimators=60,
                                                                                       early_stopping_rounds=0))[1])
    finally:
        torch.set_num_threads(before)
    assert BaselineConfig().threads == 2
    np.testing.assert_array_equal(got[0], got[1])
