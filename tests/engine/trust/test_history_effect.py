"""The query alone versus with its history: numbers equal direct re-scoring, and the plain
sentence appears exactly when the query alone reaches the review threshold."""

import math

import pytest
import torch

from engine.explain.context import build_context
from engine.trust.history_effect import history_effect, history_sentence, score_word

from trust_helpers import context, frame, one_torch_thread, trained_bundle  # noqa: F401 (autouse fixture)


def _tid(position: int, entity_index: int = 0) -> str:
    fr = frame()
    ent = sorted(fr["entity_id"].unique())[entity_index]
    return fr.loc[fr.entity_id == ent, "transaction_id"].iloc[position]


@pytest.mark.parametrize("position", [5, 30])  # 30: a later window (a transaction before it)
def test_alone_and_with_history_equal_direct_rescoring(position):
    ctx = context(_tid(position))
    assert ctx.T > 1
    h = history_effect(ctx)
    # alone = a file holding only the query transaction, scored from scratch
    fr = frame()
    only = fr[fr.transaction_id == ctx.query_transaction_id].reset_index(drop=True)
    alone_ctx = build_context(trained_bundle(), only, ctx.query_transaction_id)
    assert alone_ctx.T == 1
    assert h.alone_logit == pytest.approx(alone_ctx.score_logit(), abs=1e-5)
    assert h.with_logit == pytest.approx(ctx.score_logit(), abs=1e-5)
    assert h.alone == pytest.approx(1 / (1 + math.exp(-h.alone_logit)))
    assert h.difference == pytest.approx(h.with_history - h.alone)
    assert h.n_history == ctx.T - 1 and h.word == "score"
    assert h.adds_little == (abs(h.difference) < 0.05)
    assert h.threshold == pytest.approx(trained_bundle().threshold)


def test_calibrated_model_reports_probabilities():
    import dataclasses

    b = trained_bundle()
    cal = dataclasses.replace(b, meta={**b.meta, "calibration": {"method": "platt", "a": 2.0, "b": -1.0}})
    h = history_effect(context(_tid(9), bundle=cal))
    assert h.word == "probability"
    assert h.alone == pytest.approx(1 / (1 + math.exp(-(2.0 * h.alone_logit - 1.0))))
    assert h.with_history == pytest.approx(1 / (1 + math.exp(-(2.0 * h.with_logit - 1.0))))
    assert "probability" in h.sentence


def test_sentence_says_own_fields_drive_the_score_only_when_alone_is_flagged():
    ctx = context(_tid(12))
    h = history_effect(ctx)
    above = history_effect(ctx, threshold=h.alone - 1e-6)  # alone at/above the threshold
    below = history_effect(ctx, threshold=h.alone + 1e-6)
    assert above.alone_flagged and "own fields drive this score" in above.sentence
    assert not below.alone_flagged and "own fields drive" not in below.sentence
    s = history_sentence(0.6, 0.63, 0.5, 10)
    assert "own fields drive this score" in s and "adds little (+0.030)" in s
    assert "raises it further (+0.200)" in history_sentence(0.6, 0.8, 0.5, 10)
    assert "The history matters here" in history_sentence(0.2, 0.7, 0.5, 10)
    assert "both below" in history_sentence(0.1, 0.2, 0.5, 10)
    assert "first transaction" in history_sentence(0.1, 0.1, 0.5, 0)
    assert score_word({}) == "score"
    assert score_word({"calibration": {"method": "platt", "a": 1.0, "b": 0.0}}) == "probability"
    with torch.no_grad():
        assert "first transaction" in history_effect(context(_tid(0))).sentence
