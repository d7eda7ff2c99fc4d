"""engine.bench.datasets: the table's metrics on hand-computed cases, and the split rule."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from engine.bench.datasets import (
    DATASETS,
    choose_split,
    detection_at_fp_ratio,
    expected_calibration_error,
    recall_at_alert_rate,
    report,
)
from engine.model.train import TrainConfig


def test_detection_at_5_to_1_false_positive_ratio_by_hand():
    # scores high -> low: F L L F, 20 x L, F  (F = fraud)
    y = np.array([1, 0, 0, 1] + [0] * 20 + [1])
    p = np.linspace(1, 0, len(y))
    amount = np.array([100, 5, 5, 300] + [5] * 20 + [600.0])
    r = detection_at_fp_ratio(y, p, amount, ratio=5)
    # after 12 alerts: TP 2, FP 10 (= 5 x 2, allowed); 13: FP 11 > 10; all 25: TP 3, FP 22 > 15
    assert r["alerts"] == 12
    assert r["detection_rate"] == pytest.approx(2 / 3)
    assert r["value_detection_rate"] == pytest.approx(400 / 1000)


def test_detection_is_zero_when_the_top_alerts_are_all_false():
    y = np.array([0] * 6 + [1])
    r = detection_at_fp_ratio(y, np.linspace(1, 0, 7), np.ones(7))
    assert r == {"detection_rate": 0.0, "value_detection_rate": 0.0, "alerts": 0}


def test_recall_at_alert_rate():
    y = np.zeros(1000, dtype=int)
    y[[0, 5, 500]] = 1
    p = -np.arange(1000.0)  # row 0 highest
    assert recall_at_alert_rate(y, p, 0.01) == pytest.approx(2 / 3)  # top 10 rows hold 0 and 5


def test_expected_calibration_error_separates_calibrated_from_overconfident():
    rng = np.random.default_rng(0)
    p = rng.random(200_000)
    y = (rng.random(len(p)) < p).astype(int)
    assert expected_calibration_error(y, p) < 0.005
    y10 = (rng.random(len(p)) < 0.1).astype(int)
    assert expected_calibration_error(y10, np.full(len(p), 0.9)) == pytest.approx(0.8, abs=0.005)


def _frame(n_fraud_late: int, n_fraud_early: int = 100, seed: int = 0):
    rng = np.random.default_rng(seed)
    n = 6000
    t = pd.Timestamp("2024-01-01") + pd.to_timedelta(np.sort(rng.integers(0, 200 * 86400, n)), unit="s")
    fr = pd.DataFrame({"entity_id": rng.choice([f"e{i}" for i in range(50)], n), "timestamp": t,
                       "label": pd.array(np.zeros(n, dtype=int), dtype="Int8")})
    early = np.flatnonzero(t < pd.Timestamp("2024-04-01"))
    late = np.flatnonzero(t >= pd.Timestamp("2024-06-20"))
    fr.loc[rng.choice(early, n_fraud_early, replace=False), "label"] = 1
    fr.loc[rng.choice(late, n_fraud_late, replace=False), "label"] = 1
    return fr


def test_split_rule_default_then_proposed_then_thin():
    rich = _frame(n_fraud_late=0, n_fraud_early=0)
    rich.loc[rich.index[::20], "label"] = 1  # 300 frauds spread evenly
    _, rule, warn = choose_split(rich)
    assert rule.startswith("default 70/85 % rule") and warn == []
    late_only = _frame(n_fraud_late=80)  # nothing in the default validation period
    split, rule, warn = choose_split(late_only)
    assert rule.startswith("proposed dates") and warn == []
    thin = _frame(n_fraud_late=5, n_fraud_early=10)
    split, rule, warn = choose_split(thin)
    assert rule.startswith("thin") and warn


def test_report_states_each_dataset_and_model():
    seed = {"seed": 0, "transformer_s": 1.0, "baseline_s": 0.5, "best_epoch": 3,
            "transformer": {"auc_roc": 0.9, "average_precision": 0.5, "recall_at_1pct": 0.3, "detection_rate": 0.4,
                            "value_detection_rate": 0.45, "ece": 0.1, "alerts": 10},
            "baseline": {"auc_roc": 0.95, "average_precision": 0.7, "recall_at_1pct": 0.5, "detection_rate": 0.6,
                         "value_detection_rate": 0.65, "ece": 0.05, "alerts": 12}}
    res = [{"dataset": "demo", "rows_read": 10, "rows_rejected": 0, "split_rule": "default", "split_warnings": [],
            "test_rows": 5, "test_frauds": 1, "test_fraud_entities": 1, "seeds": [seed]}]
    text = report(res, {"cpu": "x", "cores": 2}, 60.0)
    assert "| demo | transformer | 0.900 | 0.500 | 0.300 | 0.400 | 0.450 | 0.100 |" in text
    assert "| demo | LightGBM baseline | 0.950 | 0.700 |" in text
    assert "one class in test" in text
    assert "pretraining" not in text
    assert "Next-transaction pretraining: 2 min per training run" in report(res, {}, 60.0, TrainConfig(pretrain_minutes=2))
    assert set(DATASETS) == {"demo", "tabformer", "banksim", "handbook"}


def test_bench_datasets_benches_the_default_recipe_unless_told(monkeypatch, tmp_path):
    """`fraudlens bench datasets` trains what `fraudlens train` trains (its members) by default."""
    from typer.testing import CliRunner

    import engine.bench.datasets as ds
    from engine.cli import app
    from engine.model.train import TrainConfig

    seen = []
    monkeypatch.setattr(ds, "main", lambda names, seeds, out, log, train_config: seen.append(train_config))
    for extra in ([], ["--members", "1"], ["--pretrain-minutes", "1.5"]):
        r = CliRunner().invoke(app, ["bench", "datasets", "--datasets", "demo", "--seeds", "1",
                                     "--out", str(tmp_path / "d.md"), *extra])
        assert r.exit_code == 0, r.output
    assert seen[0] == TrainConfig() and seen[0].members == TrainConfig().members
    assert seen[1].members == 1 and seen[1].pretrain_minutes == 0.0
    assert seen[2].pretrain_minutes == 1.5 and seen[2].members == TrainConfig().members
