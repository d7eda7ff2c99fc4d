"""SHAP error against exact / high-sample references (engine.trust.shap_accuracy) and its section
of the explanation bench."""

import numpy as np
import pandas as pd
import pytest
from trust_helpers import context, frame, one_torch_thread, positive_queries, trained_bundle  # noqa: F401

from engine.explain.shap_values import ShapConfig, explain
from engine.trust.bench import run_explanation_bench, shap_accuracy_section
from engine.trust.shap_accuracy import accuracy_markdown, compare, shap_accuracy


def test_compare_metrics():
    ref = np.array([0.5, -0.4, 0.3, 0.2, 0.1, 0.05, 0.01, 0.0])
    m = compare(ref, ref)
    assert m["rmse"] == 0.0 and m["spearman"] == pytest.approx(1.0) and m["top6_overlap"] == 1.0
    est = ref.copy()
    est[[0, 7]] = est[[7, 0]]  # the largest value moved to the smallest position
    m = compare(est, ref)
    assert m["rmse"] == pytest.approx(np.sqrt(2 * 0.5**2 / 8)) and m["top6_overlap"] == pytest.approx(5 / 6)
    assert m["spearman"] < 0.5


def test_exact_case_has_no_error_and_sampled_case_is_measured():
    q = positive_queries(max_position=15)
    ctxs = [context(t) for t in q[:12]]
    small = min((c for c in ctxs if c.T - 1 >= 3), key=lambda c: c.T)
    row = shap_accuracy(small, explain(small))
    assert row["reference"] == "exact" and row["estimator"] == "exact"
    assert row["rmse"] < 1e-6 and row["mean_se"] == 0.0 and row["coverage_2se"] == 1.0
    big = max(ctxs, key=lambda c: c.T)
    assert big.T - 1 > 12 and small.T - 1 <= 12
    e = explain(big, ShapConfig(prune_tolerance=None, min_rounds=3, stop_when_stable=False, nsamples=200))
    row = shap_accuracy(big, e, reference_samples=4000, reference_rounds=8)
    assert row["reference"] == "kernel 8x500" and row["estimator"] == "kernel" and row["rounds"] == 3
    assert 0 < row["rmse"] < 0.5 and row["ref_mean_se"] > 0 and row["mean_se"] > 0
    assert 0 <= row["coverage_2se"] <= 1 and np.isfinite(row["single_rmse"])
    with pytest.raises(ValueError, match="SHAP explanation"):
        shap_accuracy(small, e)
    text = accuracy_markdown(pd.DataFrame([row, row]))
    assert text.count("\n| ") == 3 and "| **mean** |" in text


def test_bench_reports_shap_error_per_case():
    res = run_explanation_bench(trained_bundle(), frame(), max_cases=3, methods=("shap",), seed=0, k=3, k_max=4,
                                n_random=2, shap_reference_samples=2000)
    acc = res.attrs["shap_accuracy"]
    assert len(acc) == res.attrs["info"]["n_cases"] == 3
    assert set(acc.case) == set(res.attrs["per_case"].case)
    assert (acc.rmse >= 0).all() and acc.seconds.gt(0).all()
    exact = acc[acc.reference == "exact"]
    assert (exact.rmse < 1e-6).all()  # float32 model, batches grouped differently
    sec = shap_accuracy_section(res)
    assert sec.startswith("### SHAP error") and "2,000-coalition" in sec
    off = run_explanation_bench(trained_bundle(), frame(), max_cases=1, methods=("shap",), seed=0, k=3, k_max=4,
                                n_random=2, shap_reference_samples=None)
    assert off.attrs["shap_accuracy"].empty and shap_accuracy_section(off) == ""
