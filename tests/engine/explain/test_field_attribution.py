"""Per-field attributions of the query: field ablation, exact field Shapley, validation, what is
shown, and cell-level Shapley values — against direct re-scoring and brute force."""

import itertools
import math

import numpy as np
import pytest
import torch
from explain_helpers import context, one_torch_thread  # noqa: F401 (autouse fixture)

from engine.explain.field_attribution import (
    cell_shapley,
    explain_fields,
    field_ablation,
    field_shapley,
    shapley_from_values,
    validate,
)
from engine.explain.integrated_gradients import IGConfig
from engine.explain.reference import field_columns, reference_row_embedding, replace_cells


def _score_with_query_fields(ctx, real: set[int]) -> float:
    """f(x) with the query's fields outside ``real`` at the reference, through forward_from_embeddings."""
    m = ctx.bundle.model
    with torch.no_grad():
        x = m.embed(ctx.batch)
        ref = reference_row_embedding(ctx)
        for f in range(x.shape[2]):
            if f not in real:
                x[0, -1, f] = ref[f]
        return float(m.forward_from_embeddings(x, ctx.batch)[0][0, -1])


def _brute_force_shapley(v, P: int) -> np.ndarray:
    """Mean marginal contribution over all P! orders (the definition), v: frozenset -> value."""
    phi = np.zeros(P)
    for order in itertools.permutations(range(P)):
        s: set[int] = set()
        for i in order:
            before = v(frozenset(s))
            s.add(i)
            phi[i] += v(frozenset(s)) - before
    return phi / math.factorial(P)


def test_validation_counts_signs_and_sizes_as_stated():
    a = np.array([2.0, 1.0, -0.3, 0.001, 0.5])  # the 4th moves the score by less than tol: not counted
    v = np.array([1.0, -1.0, -0.2, -5e-3, 0.4])  # 3 of the 4 counted agree
    r = validate(v, a, total=3.0, tol=0.01)
    assert r.n_counted == 4 and r.sign_agreement == pytest.approx(0.75)
    assert r.magnitude_ratio == pytest.approx(np.abs(v).sum() / np.abs(a).sum())
    assert not r.ok and "75%" in r.reason
    good = validate(a * 0.5, a, total=3.0, tol=0.01)
    assert good.ok and good.sign_agreement == 1.0 and good.reason == ""
    # same signs, but large cancelling values: off the score's scale
    big = validate(a * 40, a, total=3.0, tol=0.01)
    assert not big.ok and "cancel" in big.reason
    tiny = validate(a * 0.01, a, total=3.0, tol=0.01)
    assert not tiny.ok and "less than" in tiny.reason
    with pytest.raises(ValueError, match="shape"):
        validate(v[:3], a, 1.0)


def test_shapley_from_values_equals_brute_force_on_toy_games():
    rng = np.random.default_rng(0)
    P = 5
    table = rng.normal(size=1 << P)  # an arbitrary game
    v = lambda s: table[sum(1 << i for i in s)]  # noqa: E731
    np.testing.assert_allclose(shapley_from_values(table, P), _brute_force_shapley(v, P), atol=1e-12)
    # known answers: additive game -> its weights; "AND" of players 0 and 1 -> 1/2 each
    w = np.array([0.5, -1.0, 2.0])
    add = np.array([sum(w[i] for i in range(3) if m >> i & 1) for m in range(8)])
    np.testing.assert_allclose(shapley_from_values(add, 3), w, atol=1e-12)
    both = np.array([float((m & 3) == 3) for m in range(8)])
    np.testing.assert_allclose(shapley_from_values(both, 3), [0.5, 0.5, 0.0], atol=1e-12)
    with pytest.raises(ValueError, match="2\\^3"):
        shapley_from_values(np.zeros(7), 3)


@pytest.mark.parametrize("position", [4, 30])
def test_field_ablation_equals_direct_rescoring(position):
    ctx = context(position)
    abl, f_x, f_ref = field_ablation(ctx)
    F = len(ctx.field_names)
    assert abl.shape == (F,) and f_x == pytest.approx(ctx.score_logit(), abs=1e-5)
    every = set(range(F))
    for f in range(F):
        assert abl[f] == pytest.approx(f_x - _score_with_query_fields(ctx, every - {f}), abs=1e-5)
    assert f_ref == pytest.approx(_score_with_query_fields(ctx, set()), abs=1e-5)


def test_field_shapley_is_exact_on_the_model():
    """All 2^F coalitions re-scored independently, then Shapley's formula: equal; and efficient."""
    ctx = context(9)
    F = len(ctx.field_names)
    phi = field_shapley(ctx)
    table = np.array([_score_with_query_fields(ctx, {i for i in range(F) if m >> i & 1}) for m in range(1 << F)])
    np.testing.assert_allclose(phi, shapley_from_values(table, F), atol=1e-5)
    assert phi.sum() == pytest.approx(table[-1] - table[0], abs=1e-5)


def test_passing_ig_is_shown_and_a_failing_one_is_not():
    ctx = context(12)
    ok = explain_fields(ctx, cells=False)
    assert ok.reference_logit == pytest.approx(_score_with_query_fields(ctx, set()), abs=1e-5)
    v = ok.validation["integrated_gradients"]
    if v.ok:
        assert ok.shown == "integrated_gradients"
        np.testing.assert_allclose(ok.shown_values, ok.ig)
    # the zero embedding gives large cancelling values on this model: they must fail and be hidden
    bad = explain_fields(ctx, cells=False, ig_config=IGConfig(baseline="zero", n_steps=50, max_steps=400))
    assert not bad.validation["integrated_gradients"].ok
    assert bad.shown in ("field_shapley", "field_ablation")
    assert "integrated gradients" in bad.caption.lower() and bad.validation["integrated_gradients"].reason in bad.caption
    shown = bad.shown_values
    assert not np.allclose(shown, bad.ig)
    if bad.shown == "field_shapley":
        assert bad.validation["field_shapley"].ok
        np.testing.assert_allclose(shown, bad.shapley)
    d = bad.to_dict()
    assert d["shown"] == bad.shown and d["shown_values"] == pytest.approx(list(shown))


def test_cell_shapley_credits_an_earlier_amount_through_the_query_amount_vs_history():
    ctx = context(14)
    names = ctx.field_names
    # replacing an earlier transaction's amount in the input changes the query's computed
    # amount-vs-history embedding (what IG on embeddings cannot credit to that transaction)
    amount = names.index("amount")
    b = replace_cells(ctx, np.array([[True]]), [(ctx.T - 2, amount)])
    m = ctx.bundle.model
    with torch.no_grad():
        e0, e1 = m.embed(ctx.batch)[0, -1], m.embed(b)[0, -1]
    h = names.index("amount_vs_history")
    assert not torch.allclose(e0[h], e1[h]) and torch.allclose(e0[amount], e1[amount])
    with pytest.raises(ValueError, match="computed"):
        replace_cells(ctx, np.array([[True]]), [(0, h)])

    c = cell_shapley(ctx, k=2, max_cells=5)
    assert len(c.positions) == 2 and len(c.cells) == 5 and math.isfinite(c.other)
    assert c.values.sum() + c.other == pytest.approx(c.total, abs=1e-5)  # efficiency
    cols = field_columns(ctx)
    every = [(t, f) for t in c.positions for f in range(len(names)) if any(cols[f])]
    with torch.no_grad():  # total = f(x) - f(every cell of the top transactions at the reference)
        lo = float(m.query_logits(replace_cells(ctx, np.ones((1, len(every)), bool), every))[0])
    assert c.total == pytest.approx(ctx.score_logit() - lo, abs=1e-5)
    assert cell_shapley(context(0)) is None
    with pytest.raises(ValueError, match="max_cells"):
        cell_shapley(ctx, max_cells=40)
