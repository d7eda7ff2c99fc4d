"""Occlusion equals re-scoring the history with the transaction actually deleted."""

import numpy as np
import pytest
from explain_helpers import context, frame, one_torch_thread, shared_bundle  # noqa: F401 (autouse fixture)

from engine.explain.context import build_context
from engine.explain.occlusion import OcclusionConfig, explain
from engine.model.scoring import score_frame


def test_equals_rescore_with_row_deleted_from_the_frame():
    bundle, fr = shared_bundle(), frame()
    ctx = context(12)  # first window: deleting a row of the file does not move the window
    e = explain(ctx)
    assert e.values.shape == (ctx.T,) and e.values[-1] == 0.0 and e.transaction_ids[-1] == ctx.query_transaction_id
    qid = ctx.query_transaction_id
    for j, tid in enumerate(ctx.transaction_ids[:-1]):
        deleted = fr[fr.transaction_id != tid].reset_index(drop=True)
        f_without = build_context(bundle, deleted, qid).score_logit()
        assert e.values[j] == pytest.approx(ctx.score_logit() - f_without, abs=1e-5), j
    # and once through whole-file scoring
    j = 4
    deleted = fr[fr.transaction_id != ctx.transaction_ids[j]].reset_index(drop=True)
    s = score_frame(bundle, deleted)
    f_without = float(s.loc[s.transaction_id == qid, "logit"].iloc[0])
    assert e.values[j] == pytest.approx(ctx.score_logit() - f_without, abs=1e-5)


def test_batch_size_and_tiny_context():
    ctx = context(9)
    np.testing.assert_allclose(explain(ctx, OcclusionConfig(batch_size=3)).values, explain(ctx).values, atol=1e-6)
    e = explain(context(0))
    np.testing.assert_array_equal(e.values, [0.0])
    assert e.units == "logit" and e.signed and e.reference_logit is None
    with pytest.raises(ValueError, match="batch_size"):
        OcclusionConfig(batch_size=0)
