"""Counterfactuals (engine/trust/counterfactual.py) with the tiny trained model of trust_helpers:
the change returned really clears the flag when re-scored by the what-if engine, and a smaller
one does not."""

from __future__ import annotations

import math

import pytest
from trust_helpers import frame, one_torch_thread, positive_queries, trained_bundle  # noqa: F401

from engine.explain import explain_all
from engine.explain.context import build_context
from engine.trust.counterfactual import amount_counterfactual, removal_counterfactual
from engine.trust.whatif import Edit, what_if

THR = 0.5


def prob(qid, edits) -> float:
    return 1 / (1 + math.exp(-what_if(trained_bundle(), frame(), qid, edits, methods=()).logit))


def removal(ids):
    return [Edit("remove", t) for t in ids]


def flagged_queries(n: int = 60):
    b, fr = trained_bundle(), frame()
    out = []
    for q in positive_queries()[:n]:
        ctx = build_context(b, fr, q)
        if 1 / (1 + math.exp(-ctx.score_logit())) >= THR:
            out.append((q, ctx))
    return out


def test_greedy_removal_clears_the_flag_and_each_removed_transaction_is_needed():
    b, fr = trained_bundle(), frame()
    checked = 0
    for q, ctx in flagged_queries():
        ex = explain_all(ctx, ("occlusion",))
        r = removal_counterfactual(b, fr, q, THR, ex, exact_budget=0)  # greedy + pruning only
        if not r.found or len(r.removed) < 2:
            continue
        assert r.original_probability >= THR and r.exact is False and r.method == "occlusion"
        assert set(r.removed) <= set(ctx.transaction_ids[:-1])
        p = prob(q, removal(r.removed))  # re-scored from scratch: it clears the flag
        assert p < THR and p == pytest.approx(r.probability, abs=1e-9)
        for t in r.removed:  # the set minus any one does not
            assert prob(q, removal([x for x in r.removed if x != t])) >= THR
            assert r.necessary[t] >= THR
        assert r.greedy_path[-1][1] < THR and all(pp >= THR for _, pp in r.greedy_path[:-1])
        assert "greedily" in r.text and f"{len(r.removed)} earlier transactions" in r.text
        checked += 1
        if checked == 3:
            break
    assert checked == 3


def test_exact_search_finds_no_smaller_set():
    b, fr = trained_bundle(), frame()
    exact_seen = 0
    for q, ctx in flagged_queries(120):
        ex = explain_all(ctx, ("occlusion",))
        greedy = removal_counterfactual(b, fr, q, THR, ex, exact_budget=0)
        r = removal_counterfactual(b, fr, q, THR, ex)
        if not r.found or not r.exact or len(r.removed) != 2:
            continue
        assert prob(q, removal(r.removed)) < THR
        # no single earlier transaction of the context clears it (what "exact" claims)
        for t in ctx.transaction_ids[:-1]:
            assert prob(q, removal([t])) >= THR
        assert len(r.removed) <= len(greedy.removed)  # never worse than greedy
        assert "the fewest" in r.text
        exact_seen += 1
        if exact_seen == 2:
            break
    assert exact_seen == 2


def test_amount_counterfactual_clears_the_flag_or_says_no_amount_does():
    b, fr = trained_bundle(), frame()
    found = none = 0
    for q, ctx in flagged_queries():
        a = amount_counterfactual(b, fr, q, THR)
        amount = float(ctx.rows["amount"].iloc[-1])
        assert a.original_amount == pytest.approx(amount)
        if a.found:
            assert 0 <= a.amount < amount
            p = prob(q, [Edit("change", q, {"amount": a.amount})])
            assert p < THR and p == pytest.approx(a.probability, abs=1e-9)
            assert f"{a.amount:,.2f}" in a.text
            found += 1
        else:
            # every grid amount, 0 included, was re-scored at or above the threshold
            assert a.amount is None and [x for x, _ in a.grid][-1] == 0.0
            assert all(p >= THR for _, p in a.grid)
            assert prob(q, [Edit("change", q, {"amount": 0.0})]) >= THR
            assert a.text.startswith("No amount clears it")
            none += 1
        if found >= 2 and none >= 1:
            break
    assert found >= 2 and none >= 1


def test_below_threshold_and_bad_input():
    b, fr = trained_bundle(), frame()
    low = next(t for t in fr["transaction_id"].iloc[10:] if prob(t, []) < 0.3)
    r = removal_counterfactual(b, fr, low, THR)
    assert r.found and r.removed == [] and r.text.startswith("Already below")
    assert amount_counterfactual(b, fr, low, THR).amount == pytest.approx(float(fr.set_index("transaction_id").loc[low, "amount"]))
    with pytest.raises(ValueError, match="threshold"):
        removal_counterfactual(b, fr, low, 1.5)
    with pytest.raises(ValueError, match="threshold"):
        amount_counterfactual(b, fr, low, 0.0)
    with pytest.raises(KeyError):
        removal_counterfactual(b, fr, "nope", THR)
    q, ctx = flagged_queries(10)[0]
    with pytest.raises(ValueError, match="method"):
        removal_counterfactual(b, fr, q, THR, explain_all(ctx, ("occlusion",)), method="shap")
