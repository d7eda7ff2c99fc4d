"""The KV-cached incremental scorer gives exactly the whole-file windowed scores."""

import numpy as np
import pandas as pd
import pytest

from engine.model.incremental import IncrementalScorer
from engine.model.scoring import NonFiniteScoreError, score_frame

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
    assert w.n == 3 and w.keys.shape[3] == 8  # [M, L, H, capacity, dh]
    inc.add_frame(fr.iloc[3:12])
    w = inc.entities["c0"].windows[0]
    assert w.n == 12 and w.keys.shape[3] == min(16, bundle.config.context_length)


def test_resume_from_the_history_tail_equals_feeding_everything(bundle):  # noqa: F811
    """IncrementalScorer.resume rebuilds an entity from the rows of its first open window on
    (T=16, S=10: after n rows, windows start at k*10 > n - 17); later scores are unchanged."""
    fr = tiny_frame(1, 60, seed=7)
    rows = fr.to_dict("records")
    full = IncrementalScorer(bundle)
    want = full.add_frame(fr)
    S, T = full.S, bundle.config.context_length
    for n in (5, 16, 17, 26, 27, 33, 45):
        start = max(0, (n - 1 - T) // S + 1) * S
        inc = IncrementalScorer(bundle)
        prev = None if start == 0 else pd.Timestamp(rows[start - 1]["timestamp"]).value / 1e9
        inc.resume("c0", rows[start:n], start, prev)
        got = [inc.add("c0", r) for r in rows[n:]]
        np.testing.assert_allclose(got, want[n:], rtol=1e-5, atol=1e-5)
    late = IncrementalScorer(bundle)
    late.resume("c0", rows[20:25], 20, pd.Timestamp(rows[19]["timestamp"]).value / 1e9)
    # a start after the first open window misses window 10, which scores position 25
    with pytest.raises(NonFiniteScoreError):
        late.add("c0", rows[25])
    with pytest.raises(ValueError, match="not a window start"):
        IncrementalScorer(bundle).resume("c0", rows[:3], 3, None)


def _add_many_equals_add(b, fr, groups):
    """Feed ``fr`` in time order through add (one row at a time) and through add_many in groups
    of distinct entities; both give whole-file scoring's logits."""
    want = score_frame(b, fr).set_index("transaction_id")["logit"]
    one, many = IncrementalScorer(b), IncrementalScorer(b)
    rows = fr.sort_values(["timestamp", "row_number"]).to_dict("records")
    got_one = {r["transaction_id"]: one.add(r["entity_id"], r) for r in rows}
    got_many, wave, sizes = {}, [], []

    def flush():
        out = many.add_many([(r["entity_id"], r) for r in wave])
        got_many.update({r["transaction_id"]: x for r, x in zip(wave, out)})
        sizes.append(len(wave))
        wave.clear()

    for r in rows:
        if len(wave) == groups or any(w["entity_id"] == r["entity_id"] for w in wave):
            flush()
        wave.append(r)
    flush()
    assert max(sizes) > 1  # batches really formed
    for t, x in got_many.items():
        assert x == pytest.approx(got_one[t], abs=2e-5) and x == pytest.approx(float(want[t]), abs=1e-4)
    return many


def test_add_many_equals_add_across_windows(bundle):  # noqa: F811
    # 4 entities x 40-61 rows (T=16, S=10): first rows, window openings and closings inside batches
    fr = tiny_frame(4, 40, seed=11)
    many = _add_many_equals_add(bundle, fr, groups=4)
    assert all(len(st.windows) <= 2 for st in many.entities.values())
    r = fr.iloc[0].to_dict()
    with pytest.raises(ValueError, match="each entity at most once"):
        many.add_many([(r["entity_id"], r), (r["entity_id"], r)])


def test_add_many_of_an_ensemble():
    import dataclasses

    from engine.data.features import FeatureEncoder
    from engine.model.checkpoint import ModelBundle
    from engine.model.ensemble import SeedEnsemble
    from tiny_models import perturbed_bundle, tiny_spec
    from tiny_models import tiny_frame as tf

    spec, fr = tiny_spec(), tf(3, 30, seed=2)
    enc = FeatureEncoder.fit(fr, spec)
    singles = [perturbed_bundle(enc, spec, seed=s, row_ff=24) for s in (1, 2)]
    ens = SeedEnsemble(dataclasses.replace(singles[0].model.cfg, n_members=2), [s.model for s in singles]).eval()
    _add_many_equals_add(ModelBundle(model=ens, encoder=enc, spec=spec, meta={}), fr, groups=3)


def test_waves_keep_entity_order_and_ids_apart():
    from engine.serve.waves import waves as _waves

    rows = [{"entity_id": e, "transaction_id": t} for e, t in
            [("a", "1"), ("b", "2"), ("a", "3"), ("c", "4"), ("d", "4"), ("e", "5")]]
    assert _waves(rows) == [[0, 1], [2, 3], [4, 5]]  # a again -> new wave; id 4 again -> new wave
    assert _waves([]) == []


def _ple_bundle():
    import torch

    from engine.data.features import FeatureEncoder
    from engine.model.checkpoint import ModelBundle, build_model
    from tiny_models import tiny_frame as tf
    from tiny_models import tiny_spec

    spec = tiny_spec()
    enc = FeatureEncoder.fit(tf(), spec)
    model = build_model(enc, seed=4, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0, context_length=16,
                        min_history=6, activity_ple=True, row_ff=24)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return ModelBundle(model=model.eval(), encoder=enc, spec=spec, meta={})


def test_add_many_with_activity_codes_and_uneven_histories():
    """Batched row embeddings with windows of 0..15 cached rows side by side, activity codes and
    the feed-forward row layer: equal to one add per row and to whole-file scoring."""
    from tiny_models import tiny_frame as tf

    b = _ple_bundle()
    fr = tf(5, 12, seed=3)  # 5 entities of 12-28 rows: short and long windows in one batch
    # an MCC the encoder never saw (code 0, UNSEEN): padding must never pass for a seen value
    fr.loc[fr.index % 3 == 0, "mcc"] = "0000"
    many = _add_many_equals_add(b, fr, groups=5)
    assert sorted(st.n for st in many.entities.values()) != [many.entities["c0"].n] * 5


def test_add_many_refuses_an_older_row_before_touching_any_cache(bundle):  # noqa: F811
    fr = tiny_frame(2, 20, seed=4).sort_values(["timestamp", "row_number"])
    rows = fr.to_dict("records")
    a = [r for r in rows if r["entity_id"] == "c0"]
    c = [r for r in rows if r["entity_id"] == "c1"]
    inc, ref = IncrementalScorer(bundle), IncrementalScorer(bundle)
    for r in a[:10] + c[:10]:
        inc.add(r["entity_id"], r)
        ref.add(r["entity_id"], r)
    before = {e: (st.n, [w.n for w in st.windows]) for e, st in inc.entities.items()}
    with pytest.raises(ValueError, match="older than the entity's previous"):
        inc.add_many([("c0", a[10]), ("c1", c[3]), ("new", a[0])])
    assert {e: (st.n, [w.n for w in st.windows]) for e, st in inc.entities.items()} == before
    got = inc.add_many([("c0", a[10]), ("c1", c[10])])
    assert got == pytest.approx([ref.add("c0", a[10]), ref.add("c1", c[10])], abs=2e-5)


# ------------------------------------------------------------------ the compiled window step's guards
def test_the_kernel_refuses_weights_and_windows_of_other_shapes(bundle):  # noqa: F811
    """The compiled step runs without bounds checks, so every shape it indexes is checked in Python
    first: a mis-shaped weight, a full window or a wrong first-seen vector is a ValueError, never a
    read or write outside an array."""
    from engine.model.incremental_kernel import KernelWeights

    inc = IncrementalScorer(bundle)
    good = [blk["qkv_w"] for blk in inc.w.blocks]
    for blk in inc.w.blocks:
        blk["qkv_w"] = blk["qkv_w"][:, :, :-1]  # one output column short
    with pytest.raises(ValueError, match=r"qkv_w: expected shape .* got"):
        KernelWeights(inc.w)
    for blk, g in zip(inc.w.blocks, good):
        blk["qkv_w"] = g
    kw = KernelWeights(inc.w)
    M, D, L, H = kw.shape
    base, cats = np.zeros((M, D), np.float32), np.zeros(kw.C, np.int64)
    win = inc._new_window(0, capacity=4)
    win.n = 4  # full: row n would be written past the cache
    with pytest.raises(ValueError, match="0 <= n < capacity"):
        kw.step(base, win, 0.0, 0.0, cats, True)
    win.n = 0
    with pytest.raises(ValueError, match="first-seen values"):
        kw.step(base, win, 0.0, 0.0, np.zeros(kw.C + 1, np.int64), True)
    with pytest.raises(ValueError, match="expected base"):
        kw.step(np.zeros((M, D + 1), np.float32), win, 0.0, 0.0, cats, True)
    assert np.isfinite(kw.step(base, win, 0.0, 0.0, cats, True))  # the same window, right shapes


def test_the_kernel_compiles_once_and_refuses_other_argument_types(bundle):  # noqa: F811
    """One specialisation, compiled when the first scorer is built: a call with other types (which
    would compile for seconds in the middle of serving: a 2.5 s stall was measured when a row of a
    non-contiguous array reached it) is a TypeError."""
    from engine.model.incremental_kernel import window_step

    inc = IncrementalScorer(bundle)
    assert len(window_step.signatures) == 1
    fr = tiny_frame(4, 12, seed=3)
    rows = fr.to_dict("records")
    by_entity = {}
    for r in rows:
        by_entity.setdefault(r["entity_id"], []).append(r)
    for wave in zip(*by_entity.values()):  # add_many: rows of a batched embedding (strided views)
        inc.add_many([(r["entity_id"], r) for r in wave])
    assert len(window_step.signatures) == 1
    kw, win = inc.kernel, inc._new_window(0)
    M, D, _, _ = kw.shape
    with pytest.raises(TypeError):
        window_step(np.zeros((M, D), np.float64), win.keys, win.values, win.times, win.zs, win.cats, 0, 0.0, 0.0, 0.0,
                    np.zeros(kw.C, np.int64), True, kw.hist, kw.act, kw.ln_in, kw.row_ff, kw.blocks, kw.head)


def test_the_kernel_refuses_a_window_with_another_first_seen_width(bundle):  # noqa: F811
    """The window's own first-seen columns are checked too (the kernel writes ``wcats[n, j]`` for every
    ``j < C`` without bounds checks)."""
    inc = IncrementalScorer(bundle)
    kw = inc.kernel
    M, D, _, _ = kw.shape
    win = inc._new_window(0, capacity=4)
    win.cats = np.zeros((4, kw.C + 1), np.int64)
    with pytest.raises(ValueError, match="first-seen values"):
        kw.step(np.zeros((M, D), np.float32), win, 0.0, 0.0, np.zeros(kw.C, np.int64), True)
