"""Key evidence: the citable transactions, and the query re-scored without all of them."""

import numpy as np
import pytest
from trust_helpers import context, positive_queries  # noqa: F401

from engine.explain import explain_all
from engine.trust.evidence import key_evidence
from engine.trust.reasons import citable_positions


def test_score_without_the_evidence_is_the_model_on_the_history_without_it():
    qid = positive_queries(max_position=15)[0]
    ctx = context(qid)
    e = explain_all(ctx, ["occlusion"])["occlusion"]
    ev = key_evidence(ctx, e, top_k=3)
    pos = citable_positions(e, 3)
    assert ev.transaction_ids == [ctx.transaction_ids[p] for p in pos] and len(pos) >= 1
    assert ev.logit_with == pytest.approx(e.score_logit, abs=1e-5)
    # re-score the history with those rows deleted, independently of the removal helpers
    present = ctx.batch.present.clone()
    present[0, list(pos)] = False
    assert ev.logit_without == pytest.approx(float(ctx.logits(present)[0]), abs=1e-4)
    assert ev.score_without < ev.score_with  # removing the fraud-pushing rows lowers the score
    assert 0 <= ev.to_dict()["score_without"] <= 1


def test_nothing_citable_changes_nothing():
    qid = positive_queries(max_position=15)[0]
    ctx = context(qid)
    e = explain_all(ctx, ["occlusion"])["occlusion"]
    e.values = -np.abs(e.values)
    ev = key_evidence(ctx, e)
    assert ev.transaction_ids == [] and ev.logit_without == pytest.approx(ev.logit_with)
