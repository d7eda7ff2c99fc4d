"""Planted-cause evaluation: the queries are the first frauds after each planted cause, and
precision@|G| is computed against the tagged cause rows (recency must not find them)."""

import numpy as np
import pytest

from engine.data.features import FeatureEncoder
from engine.data.io import read_transactions
from engine.data.simulate import simulate, write_csv
from engine.data.spec import load_spec
from engine.model.checkpoint import ModelBundle, build_model
from engine.trust.planted import planted_cause_bench, planted_markdown, planted_queries, precision_at


@pytest.fixture(scope="module")
def frame(tmp_path_factory):
    p = write_csv(simulate(60, 3, days=120), tmp_path_factory.mktemp("planted") / "sim.csv")
    return read_transactions(p, load_spec("demo")).frame


def test_planted_queries_are_the_first_frauds_after_the_cause(frame):
    pq = planted_queries(frame)
    assert len(pq) >= 2 and set(pq["kind"]) <= {"tested_then_cnp", "compromised_merchant"}
    for _, r in pq.iterrows():
        q = frame.set_index("transaction_id").loc[r["query"]]
        assert q["Fraud Episode"] == r["episode"] and q["Fraud Cause"] == "" and q["label"] == 1
        cause = frame[frame["Fraud Cause"] == r["episode"]]
        assert len(cause) == r["n_cause"] and cause["timestamp"].max() < q["timestamp"]
        later = frame[(frame["Fraud Episode"] == r["episode"]) & (frame["Fraud Cause"] == "")]
        assert q["timestamp"] == later["timestamp"].min()
    with pytest.raises(ValueError, match="Fraud Cause"):
        planted_queries(frame.drop(columns=["Fraud Cause"]))


def test_precision_at_truth_size():
    assert precision_at(np.array([4, 2, 9]), np.array([2, 9])) == 0.5
    assert precision_at(np.array([9, 2]), np.array([2, 9])) == 1.0
    assert np.isnan(precision_at(np.array([1]), np.array([], np.int64)))


def test_bench_rows_and_recency_misses_the_cause(frame):
    enc = FeatureEncoder.fit(frame, load_spec("demo"))
    model = build_model(enc, seed=0, d_model=8, n_heads=2, n_layers=1, d_ff=8, dropout=0.0,
                        context_length=64, min_history=16).eval()
    res = planted_cause_bench(ModelBundle(model=model, encoder=enc, spec=load_spec("demo")), frame,
                              methods=["occlusion"])
    assert set(res["method"]) == {"occlusion", "recency", "largest_amount"}
    rec = res[res["method"] == "recency"]
    # the tests sit 3-8 legitimate rows before the query, so the |G| most recent rows never hold them
    assert (rec.loc[rec["kind"] == "tested_then_cnp", "precision"] == 0).all()
    assert res["precision"].between(0, 1).all() and res["reason_top2"].isin([0.0, 1.0]).all()
    md = planted_markdown(res)
    assert "| tested_then_cnp | recency |" in md and "top-2 reason codes name the planted pattern" in md


def test_control_queries_are_unplanted_first_frauds_and_flagged_legit(frame):
    from engine.trust.planted import control_bench, control_markdown, control_queries

    enc = FeatureEncoder.fit(frame, load_spec("demo"))
    model = build_model(enc, seed=0, d_model=8, n_heads=2, n_layers=1, d_ff=8, dropout=0.0,
                        context_length=64, min_history=16).eval()
    bundle = ModelBundle(model=model, encoder=enc, spec=load_spec("demo"))
    cq = control_queries(bundle, frame, n_legit=5)
    by = frame.set_index("transaction_id")
    fraud = cq[cq["kind"] != "flagged legitimate"]
    assert len(fraud) and not set(fraud["kind"]) & {"tested_then_cnp", "compromised_merchant", "fraud_refund"}
    for _, r in fraud.iterrows():  # the first row of its episode
        ep = by.loc[r["query"], "Fraud Episode"]
        assert by.loc[r["query"], "timestamp"] == frame.loc[frame["Fraud Episode"] == ep, "timestamp"].min()
    legit = cq[cq["kind"] == "flagged legitimate"]
    assert len(legit) <= 5 and (by.loc[legit["query"], "label"] == 0).all()
    ctl = control_bench(bundle, frame.reset_index(drop=True), methods=["occlusion"], n_legit=2)
    assert {"false_tested_then_cnp", "false_compromised_merchant"} <= set(ctl.columns)
    assert ctl["false_tested_then_cnp"].isin([0.0, 1.0]).all()
    assert "must not name a planted pattern" in control_markdown(ctl)
