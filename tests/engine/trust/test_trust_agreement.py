"""Method agreement: symmetric matrices with a unit diagonal, equal to scipy on the earlier
transactions; disagreement flagged below the bound."""

import numpy as np
import pytest
from scipy.stats import kendalltau, spearmanr
from trust_helpers import context, one_torch_thread, positive_queries  # noqa: F401

from engine.explain import explain_all
from engine.trust.agreement import DISAGREE_BOUND, method_agreement


def test_matrix_of_real_explanations_is_symmetric_with_unit_diagonal():
    ctx = context(positive_queries(15)[3])
    ex = explain_all(ctx, ["attention", "attention_rollout", "integrated_gradients", "shap", "occlusion"],
                     shap_samples=128, ig_steps=20)
    res = method_agreement(ex)
    names = list(ex)
    for mat, fn in ((res.spearman, spearmanr), (res.kendall, kendalltau)):
        z = mat.to_numpy()
        assert list(mat.index) == list(mat.columns) == names
        np.testing.assert_array_equal(np.diag(z), 1.0)
        np.testing.assert_allclose(z, z.T, atol=0, equal_nan=True)
        assert np.nanmax(np.abs(z)) <= 1.0 + 1e-12
        a, b = ex["shap"].values[:-1], ex["occlusion"].values[:-1]  # the query is not ranked
        assert mat.loc["shap", "occlusion"] == pytest.approx(fn(a, b).statistic)
    assert len(res.pairs) == len(names) * (len(names) - 1) // 2
    assert res.n_transactions == ctx.T - 1 and res.bound == DISAGREE_BOUND
    assert res.query_transaction_id == ctx.query_transaction_id
    flagged = res.pairs[res.pairs.spearman < DISAGREE_BOUND]
    assert (flagged.status == "methods disagree").all()
    assert len(res.disagreements) == len(flagged)


def test_flags_and_undefined():
    v = np.arange(8.0)
    res = method_agreement({"a": v, "b": v[::-1].copy(), "c": 2 * v + 1, "flat": np.ones(8)})
    s = res.spearman
    assert s.loc["a", "b"] == pytest.approx(-1.0) and s.loc["a", "c"] == pytest.approx(1.0)
    st = {(r.method_a, r.method_b): r.status for r in res.pairs.itertuples()}
    assert st[("a", "b")] == "methods disagree" and st[("a", "c")] == "agree" and st[("a", "flat")] == "undefined"
    assert np.isnan(s.loc["a", "flat"]) and s.loc["flat", "flat"] == 1.0
    with pytest.raises(ValueError, match="same context"):
        method_agreement({"a": np.arange(5.0), "b": np.arange(6.0)})
    with pytest.raises(ValueError, match="at least one"):
        method_agreement({})
