"""Deletion / insertion curves equal direct re-scores of the frame with rows deleted; AOPC on a
trained model beats random orders for removal-based methods."""

import numpy as np
import pandas as pd
import pytest
from trust_helpers import context, frame, one_torch_thread, positive_queries, trained_bundle  # noqa: F401

from engine.explain.context import build_context
from engine.explain import explain_all
from engine.explain.base import Explanation
from engine.trust.faithfulness import aopc, curve, evaluate_faithfulness, faithfulness_table, ranking_order


def _rescore_without(ids_to_delete, qid) -> float:
    fr = frame()
    kept = fr[~fr["transaction_id"].isin(list(ids_to_delete))].reset_index(drop=True)
    return build_context(trained_bundle(), kept, qid).score_logit()


def test_curves_equal_rescoring_the_frame_with_rows_deleted():
    qid = positive_queries(max_position=15)[3]  # first window: deleting rows does not move the window
    ctx = context(qid)
    assert ctx.T >= 6
    e = explain_all(ctx, ["occlusion"])["occlusion"]
    res = evaluate_faithfulness(ctx, {"occlusion": e}, k_max=4, n_random=2)["occlusion"]
    P = ctx.T - 1
    order = ranking_order(e)
    assert res.order == [ctx.transaction_ids[j] for j in order]
    assert len(res.deletion) == len(res.insertion) == P + 1
    f_x = ctx.score_logit()
    assert res.full_logit == pytest.approx(f_x, abs=1e-6)
    earlier = ctx.transaction_ids[:-1]
    for k in range(P + 1):
        top = [ctx.transaction_ids[j] for j in order[:k]]
        assert res.deletion["logit"].iloc[k] == pytest.approx(_rescore_without(top, qid), abs=1e-5), k
        others = [t for t in earlier if t not in top]
        assert res.insertion["logit"].iloc[k] == pytest.approx(_rescore_without(others, qid), abs=1e-5), k
        assert res.deletion["transaction_id"].iloc[k] == (top[-1] if k else None)
    # AOPC = mean over k = 1..4 of f(x) - f(x without top-k), from the direct re-scores
    direct = [f_x - _rescore_without([ctx.transaction_ids[j] for j in order[:k]], qid) for k in range(1, 5)]
    assert res.aopc == pytest.approx(np.mean(direct), abs=1e-5)
    assert res.alone_logit == pytest.approx(_rescore_without(earlier, qid), abs=1e-5)
    assert res.insertion["logit"].iloc[P] == pytest.approx(f_x, abs=1e-5)
    np.testing.assert_allclose(res.deletion["probability"], 1 / (1 + np.exp(-res.deletion["logit"])))


def test_random_and_attention_references_are_real_orders():
    qid = positive_queries(max_position=15)[3]
    ctx = context(qid)
    ex = explain_all(ctx, ["attention", "shap"], shap_samples=128)
    res = evaluate_faithfulness(ctx, ex, k_max=3, n_random=3, seed=5)
    r = res["shap"]
    P = ctx.T - 1
    rand = [curve(ctx, np.random.default_rng([5, i]).permutation(P)) for i in range(3)]
    np.testing.assert_allclose(r.random_deletion["logit"], np.mean([c["logit"] for c in rand], axis=0), atol=1e-9)
    assert r.aopc_random == pytest.approx(np.mean([aopc(c, 3) for c in rand]), abs=1e-9)
    att = curve(ctx, ranking_order(ex["attention"]))
    np.testing.assert_allclose(r.attention_deletion["logit"], att["logit"], atol=1e-9)
    assert res["attention"].aopc == pytest.approx(res["attention"].aopc_attention)
    # the attention explanation is computed when not given
    alone = evaluate_faithfulness(ctx, ex["shap"], k_max=3, n_random=1)["shap"]
    np.testing.assert_allclose(alone.attention_deletion["logit"], att["logit"], atol=1e-9)


def test_removal_methods_beat_random_on_the_trained_model():
    rows = []
    for qid in positive_queries(max_position=15)[:8]:
        ctx = context(qid)
        ex = explain_all(ctx, ["shap", "occlusion"], shap_samples=256)
        rows.append(faithfulness_table(evaluate_faithfulness(ctx, ex, k_max=3, n_random=3)))
    t = pd.concat(rows).groupby("method")[["aopc", "aopc_random", "sufficiency", "sufficiency_random"]].mean()
    for m in ("shap", "occlusion"):
        assert t.loc[m, "aopc"] > t.loc[m, "aopc_random"] + 1.0, t
        assert t.loc[m, "sufficiency"] < t.loc[m, "sufficiency_random"] - 1.0, t


def test_ranking_order_by_value_and_by_magnitude():
    v = np.array([0.5, -2.0, 3.0, 0.5, np.nan, 9.0])  # last = query, ignored
    np.testing.assert_array_equal(ranking_order(v), [2, 3, 0, 1, 4])  # tie 0.5: later first; NaN last
    np.testing.assert_array_equal(ranking_order(v, rank_by="abs"), [2, 1, 3, 0, 4])
    with pytest.raises(ValueError, match="rank_by"):
        ranking_order(v, rank_by="x")


def test_errors_and_first_transaction():
    fr = frame()
    first = fr["transaction_id"].iloc[0]
    ctx = context(first)
    e = explain_all(ctx, ["occlusion"])["occlusion"]
    r = evaluate_faithfulness(ctx, e, n_random=1)["occlusion"]
    assert ctx.T == 1 and np.isnan(r.aopc) and len(r.deletion) == 1
    ctx2 = context(positive_queries(15)[0])
    with pytest.raises(ValueError, match="another context"):
        evaluate_faithfulness(ctx2, e)
    with pytest.raises(ValueError, match="permutation"):
        curve(ctx2, [0, 0])
    with pytest.raises(ValueError, match="k_max"):
        evaluate_faithfulness(ctx2, {}, k_max=0)
    assert isinstance(e, Explanation)
