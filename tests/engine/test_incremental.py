"""The KV-cached incremental scorer gives exactly the whole-file windowed scores."""

import numpy as np
import pytest

from engine.model.incremental import IncrementalScorer
from engine.model.scoring import score_frame

from test_model import bundle, tiny_frame  # noqa: F401  (tiny-config fixtures)


def test_incremental_equals_whole_file_scoring(bundle):  # noqa: F811
    # 3 entities with 40, 47, 54 transactions: several windows each (T=16, min_history=6, S=10)
    fr = tiny_frame(3, 40, seed=5)
    want = score_frame(bundle, fr)["logit"].to_numpy()
    inc = IncrementalScorer(bundle)
    got = inc.add_frame(fr)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert inc.cached_entities() == 3
    # at most ceil(T / S) = 2 windows are cached per entity
    assert all(len(st.windows) <= 2 for st in inc.entities.values())


def test_interleaved_entities_and_time_order(bundle):  # noqa: F811
    fr = tiny_frame(2, 30, seed=1)
    want = score_frame(bundle, fr).set_index("transaction_id")["logit"]
    inc = IncrementalScorer(bundle)
    # feed in global time order (entities interleaved), as a live stream would
    for row in fr.sort_values("timestamp").to_dict("records"):
        got = inc.add(row["entity_id"], row)
        assert got == pytest.approx(float(want[row["transaction_id"]]), abs=1e-4)
    older = fr.iloc[0].to_dict()
    with pytest.raises(ValueError, match="older than the entity's previous"):
        inc.add(older["entity_id"], older)


def test_cache_grows_with_the_rows_it_holds(bundle):  # noqa: F811
    """A window's key/value buffers start small and double (capped at T): an entity with few
    transactions holds little memory; scores are unaffected (checked above)."""
    fr = tiny_frame(1, 12, seed=3)
    inc = IncrementalScorer(bundle)
    inc.add_frame(fr.iloc[:3])
    (w,) = inc.entities["c0"].windows
    assert w.n == 3 and w.keys.shape[2] == 8
    inc.add_frame(fr.iloc[3:12])
    w = inc.entities["c0"].windows[0]
    assert w.n == 12 and w.keys.shape[2] == min(16, bundle.config.context_length)
