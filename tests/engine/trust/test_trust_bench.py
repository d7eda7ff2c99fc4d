"""Explanation bench over flagged test-period cases of the trained tiny model, with the
synthetic "Fraud Episode" ground truth; main() end to end (checkpoint + raw file -> markdown)."""

import re
import dataclasses

import numpy as np
import pandas as pd
import pytest
from trust_helpers import frame, one_torch_thread, to_raw, trained_bundle  # noqa: F401

from engine.model.checkpoint import save_checkpoint
from engine.explain.context import build_context
from engine.model.scoring import score_frame
from engine.trust.bench import ground_truth, main, precision_at_k, run_explanation_bench

METHODS = ("attention", "shap", "occlusion")


@pytest.fixture(scope="module")
def bench():
    return run_explanation_bench(trained_bundle(), frame(), max_cases=6, methods=METHODS, seed=0,
                                 k=3, k_max=4, n_random=3, shap_samples=64)


def test_bench_table(bench):
    bundle, fr = trained_bundle(), frame()
    assert list(bench.method) == [*METHODS, "recency", "largest_amount"]  # + the model-free baselines
    info, pc = bench.attrs["info"], bench.attrs["per_case"]
    s = score_frame(bundle, fr)
    test = fr.timestamp >= pd.Timestamp(bundle.meta["split"]["val_end"])
    assert info["n_period_rows"] == int(test.sum())
    assert info["n_flagged"] == int((test & (s.probability >= bundle.threshold)).sum()) > 6
    assert info["n_cases"] == 6 and (bench.n_cases == 6).all() and len(pc) == 6 * (len(METHODS) + 2)
    flagged_ids = set(fr.transaction_id[test & (s.probability >= bundle.threshold)])
    assert set(pc.case) <= flagged_ids
    for c in ("aopc", "aopc_random", "sufficiency", "precision_at_k", "seconds_per_case"):
        assert bench[c].notna().all(), c
    assert ((bench.precision_at_k >= 0) & (bench.precision_at_k <= 1)).all()
    assert (bench.n_truth_cases > 0).all() and info["truth_rules"] == ["demo Fraud Episode"]
    # per-method means are the means of the per-case rows
    occ = pc[pc.method == "occlusion"]
    assert bench.set_index("method").loc["occlusion", "aopc"] == pytest.approx(occ.aopc.mean())
    # removal-based methods point at the episode (the trigger) far better than chance
    b = bench.set_index("method")
    for m in ("shap", "occlusion"):
        assert b.loc[m, "precision_at_k"] > b.loc[m, "precision_random"] + 0.2, bench
        assert b.loc[m, "aopc"] > b.loc[m, "aopc_random"]
    assert np.isnan(b.loc["attention", "completeness_gap"]) and np.isnan(b.loc["shap", "completeness_gap"])
    # every method is compared with "most recent first", case by case
    rec = pc[pc.method == "recency"].set_index("case")
    for m in METHODS:
        d = pc[pc.method == m].set_index("case")
        assert b.loc[m, "aopc_recency"] == pytest.approx(rec.aopc.mean())
        assert b.loc[m, "beats_recency"] == pytest.approx(float((d.aopc > rec.loc[d.index].aopc).mean()))
        below = b.loc[m, "aopc"] <= rec.aopc.mean() or b.loc[m, "precision_at_k"] <= b.loc[m, "precision_recency"]
        assert bool(b.loc[m, "below_recency"]) == bool(below)
    # the recency order is what its name says: the latest earlier transactions first
    ctx = build_context(bundle, fr, pc.case.iloc[0])
    from engine.trust.baselines import baseline_orders
    from engine.trust.faithfulness import ranking_order

    orders = baseline_orders(ctx)
    assert ranking_order(orders["recency"]).tolist() == list(range(ctx.T - 2, -1, -1))
    amt = np.abs(ctx.rows.amount.to_numpy()[:-1])
    assert amt[ranking_order(orders["largest_amount"])].tolist() == sorted(amt, reverse=True)


def test_ground_truth_and_precision():
    fr, bundle = frame(), trained_bundle()
    ep = fr["Fraud Episode"]
    qid = fr.loc[(fr.label == 1) & (fr.groupby("entity_id").cumcount() > 3), "transaction_id"].iloc[0]
    ctx = build_context(bundle, fr, qid)
    g, rule = ground_truth(ctx)
    q_ep = ep[fr.transaction_id == qid].iloc[0]
    expected = [i for i, t in enumerate(ctx.transaction_ids[:-1]) if ep[fr.transaction_id == t].iloc[0] == q_ep]
    assert g.tolist() == expected and len(expected) >= 1 and rule == "demo Fraud Episode"
    legit = fr.loc[fr.label == 0, "transaction_id"].iloc[5]
    assert ground_truth(build_context(bundle, fr, legit))[0].size == 0
    assert precision_at_k(np.array([4, 1, 2, 0]), np.array([1, 0]), 5) == 0.5  # k' = |truth| = 2
    assert precision_at_k(np.array([1, 0, 2]), np.array([1, 0]), 1) == 1.0
    assert np.isnan(precision_at_k(np.array([1, 0]), np.array([], dtype=int), 3))


def test_handbook_scenarios():
    class Ctx:  # ground_truth only reads rows and T
        def __init__(self, rows):
            self.rows, self.T = rows, len(rows)

    rows = pd.DataFrame({"terminal": ["a", "b", "a", "a", "a"], "TX_FRAUD_SCENARIO": [2, 3, 0, 2, 2]})
    assert ground_truth(Ctx(rows))[0].tolist() == [0, 3]
    rows["TX_FRAUD_SCENARIO"] = [3, 2, 3, 0, 3]
    assert ground_truth(Ctx(rows))[0].tolist() == [0, 2]
    rows["TX_FRAUD_SCENARIO"] = [3, 2, 3, 0, 1]
    g, rule = ground_truth(Ctx(rows))
    assert g.size == 0 and rule == ""


def test_main_end_to_end(tmp_path):
    bundle = dataclasses.replace(trained_bundle())  # a copy: saving sets sha256 / path on it
    save_checkpoint(bundle, tmp_path / "model")
    data = tmp_path / "tx.csv"
    to_raw(frame()).drop(columns="tid").to_csv(data, index=False)
    out = tmp_path / "explanations.md"
    logs = []
    res = main(data, None, tmp_path / "model", out, 2, methods=("attention", "occlusion"), log=logs.append)
    text = out.read_text()
    assert list(res.method) == ["attention", "occlusion", "recency", "largest_amount"]
    assert "| occlusion | 2 |" in text or "| occlusion (does not beat most recent first) | 2 |" in text
    assert "| baseline: most recent first (no model) | 2 |" in text
    assert "torch" in text and "cpu_count" in text and "deletion AOPC@10" in text
    main(data, None, tmp_path / "model", out, 2, methods=("attention", "occlusion"), log=logs.append)
    text2 = out.read_text()  # each section (main table, per-field section) is replaced, not appended
    assert len(re.findall(r"<!-- bench:tx\.csv\|\w+ -->", text2)) == 1
    assert len(re.findall(r"<!-- bench:tx\.csv\|\w+\|fields -->", text2)) <= 1
    assert any("written to" in s for s in logs)


def test_bench_cases_are_the_ones_the_queue_flags_calibrated_probability():
    """The review threshold is chosen on calibrated probabilities: the benches' flagged cases are
    those whose calibrated probability reaches it (as the case queue), not sigmoid(logit) >= it."""
    from engine.model.calibration import CALIBRATION_KEY
    from engine.model.scoring import score_encoded, sigmoid
    from engine.trust.bench import flagged_period_rows

    base = trained_bundle()
    fr = frame().reset_index(drop=True)
    enc = base.encoder.transform(fr)
    rows, _, _ = flagged_period_rows(base, fr, enc)
    lg = score_encoded(base.model, enc, fr["entity_id"].to_numpy(), rows=rows)[rows].astype(np.float64)
    thr = float(np.quantile(sigmoid(lg), 0.5))
    meta = {**base.meta, "thresholds": {"review": thr, "decline": 0.99},
            CALIBRATION_KEY: {"method": "platt", "a": 1.0, "b": -2.0, "input": "logit"}}
    cal = dataclasses.replace(base, meta=meta)
    _, flagged, _ = flagged_period_rows(cal, fr, enc)
    want = rows[cal.probability(lg) >= thr]
    assert np.array_equal(flagged, want) and 0 < len(want) < int((sigmoid(lg) >= thr).sum())
