"""Packed removal scoring: a mask's present rows scored as a shorter history give the masked logit."""

import numpy as np
import pytest
import torch
from explain_helpers import context, one_torch_thread  # noqa: F401 (autouse fixture)

from engine.explain.removal import pack_present, presence_masks, query_logits


@pytest.mark.parametrize("position,entity", [(15, "c0"), (30, "c1")])  # in the first window / a later one
def test_packed_logits_equal_masked_logits(position, entity):
    ctx = context(position, entity)
    P = ctx.T - 1
    rng = np.random.default_rng(position)
    keep = rng.random((40, P)) < rng.uniform(0.05, 0.95, (40, 1))  # coalitions of every size
    keep[0] = False  # only the query
    keep[1] = True  # everything
    present = presence_masks(ctx, keep)
    want = ctx.logits(present).double().numpy()  # masked, not packed
    got = query_logits(ctx, present, batch_size=7)  # packed, sorted by size, in chunks
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert got[1] == pytest.approx(ctx.score_logit(), abs=1e-5)


def test_pack_present_keeps_order_and_right_aligns_the_query():
    ctx = context(12, "c0")
    present = torch.ones(2, ctx.T, dtype=torch.bool)
    present[0, [1, 4, 5]] = False
    packed = pack_present(ctx.batch, present)
    assert packed.shape == (2, ctx.T)
    assert packed.present[0].tolist() == [False] * 3 + [True] * (ctx.T - 3)
    keep = [p for p in range(ctx.T) if p not in (1, 4, 5)]
    torch.testing.assert_close(packed.time_s[0, 3:], ctx.batch.time_s[0, keep])
    torch.testing.assert_close(packed.cat[1], ctx.batch.cat[0])
