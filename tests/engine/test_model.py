"""Tiny-config tester for the FraudTransformer: causality, padding, attention, removal rule."""

import json

import numpy as np
import pytest
import torch

from engine.model.checkpoint import ModelBundle, build_model, load_checkpoint, save_checkpoint
from engine.explain.context import build_context
from engine.data.features import FeatureEncoder
from engine.model.sequences import TransactionBatch
from engine.model.scoring import score_frame
from engine.model.sequences import build_windows, make_batch


from tiny_models import tiny_frame, tiny_spec  # noqa: E402,F401  (re-exported for other tests)


@pytest.fixture(scope="module")
def bundle():
    spec = tiny_spec()
    fr = tiny_frame()
    enc = FeatureEncoder.fit(fr, spec)
    model = build_model(enc, seed=3, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0,
                        context_length=16, min_history=6)
    # make the random init less trivial: large weights so every input matters
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    model.eval()
    return ModelBundle(model=model, encoder=enc, spec=spec, meta={"thresholds": {"review": 0.5}})


def _batch(bundle, fr, rows):
    enc = bundle.encoder.transform(fr)
    return make_batch(enc, np.asarray(rows)[None, :], np.array([0]))


def test_single_row_encoding_equals_frame_encoding(bundle):
    fr = tiny_frame(2, 30, seed=4)
    full = bundle.encoder.transform(fr)
    for i in [0, 5, 17, 44]:
        one = bundle.encoder.transform_row(fr.iloc[i].to_dict())
        np.testing.assert_array_equal(one.cat[0], full.cat[i])
        np.testing.assert_allclose(one.num[0], full.num[i], rtol=1e-6)
        np.testing.assert_array_equal(one.multi[0], full.multi[i])
        assert one.time_s[0] == pytest.approx(full.time_s[i])


def test_batch_validates_shapes():
    with pytest.raises(ValueError, match="expected dtype torch.float64, got torch.float32"):
        TransactionBatch(
            torch.zeros(1, 3, 2, dtype=torch.int64), torch.zeros(1, 3, 1), torch.zeros(1, 3, 0),
            torch.zeros(1, 3), torch.ones(1, 3, dtype=torch.bool), torch.zeros(1, dtype=torch.float64),
        )


def test_appending_or_changing_later_never_changes_earlier_scores(bundle):
    fr = tiny_frame(1, 12)
    b = _batch(bundle, fr, np.arange(12))
    base = bundle.model(b).logits[0]
    # change the last transaction's amount and merchant
    fr2 = fr.copy()
    fr2.loc[11, "amount"] = 9999.0
    fr2.loc[11, "merchant"] = "new"
    b2 = _batch(bundle, fr2, np.arange(12))
    out2 = bundle.model(b2).logits[0]
    torch.testing.assert_close(out2[:11], base[:11])
    assert not torch.allclose(out2[11], base[11])
    # appending: scores of the first 8 unchanged when scoring only 8
    b8 = _batch(bundle, fr, np.arange(8))
    torch.testing.assert_close(bundle.model(b8).logits[0], base[:8])


def test_padding_never_changes_a_score(bundle):
    fr = tiny_frame(1, 10)
    b = _batch(bundle, fr, np.arange(10))
    padded = _batch(bundle, fr, np.concatenate([np.arange(10), -np.ones(6, dtype=int)]))
    torch.testing.assert_close(bundle.model(padded).logits[0, :10], bundle.model(b).logits[0])


def test_attention_rows_sum_to_one_over_allowed_positions(bundle):
    fr = tiny_frame(1, 10)
    b = _batch(bundle, fr, np.concatenate([np.arange(10), -np.ones(3, dtype=int)]))
    present = b.present.clone()
    present[0, 4] = False  # a removed transaction
    b = b.with_present(present)
    out = bundle.model(b, output_attentions=True)
    assert len(out.attentions) == bundle.config.n_layers
    for w in out.attentions:
        assert w.shape == (1, bundle.config.n_heads, 13, 13)
        torch.testing.assert_close(w.sum(-1), torch.ones(1, bundle.config.n_heads, 13))
        # no weight on future keys or on removed/padded keys (for real queries)
        assert torch.all(torch.triu(w[0], diagonal=1) == 0)
        assert torch.all(w[0, :, 5:10, 4] == 0)
        assert torch.all(w[0, :, :10, 10:] == 0)


def test_fused_attention_equals_explicit(bundle):
    fr = tiny_frame(1, 14)
    b = _batch(bundle, fr, np.arange(14))
    torch.testing.assert_close(
        bundle.model(b, output_attentions=True).logits, bundle.model(b).logits, rtol=1e-5, atol=1e-5
    )


def test_fused_row_sum_equals_per_field_embeddings(bundle):
    fr = tiny_frame(1, 14)
    b = _batch(bundle, fr, np.concatenate([np.arange(14), -np.ones(2, dtype=int)]))
    torch.testing.assert_close(bundle.model.rows.summed(b), bundle.model.embed(b).sum(dim=2), rtol=1e-5, atol=1e-5)
    full = bundle.model(b, output_field_embeddings=True)
    assert full.field_embeddings.shape == (1, 16, len(bundle.config.field_names), bundle.config.d_model)
    assert bundle.config.field_names[-2:] == ["recent_activity", "first_seen"]
    torch.testing.assert_close(full.logits, bundle.model(b).logits, rtol=1e-5, atol=1e-5)


def test_query_logits_fast_path_equals_full_forward(bundle):
    fr = tiny_frame(1, 15)
    b = _batch(bundle, fr, np.arange(15))
    gen = torch.Generator().manual_seed(0)
    present = torch.rand(6, 15, generator=gen) > 0.4
    present[:, -1] = True
    full = bundle.model(b.repeat(6).with_present(present)).logits[:, -1]
    torch.testing.assert_close(bundle.model.query_logits(b, present), full, rtol=1e-5, atol=1e-5)
    fe = bundle.model.embed(b) * torch.linspace(0.1, 1.0, 4).view(4, 1, 1, 1)  # IG-style path points
    torch.testing.assert_close(
        bundle.model.query_logits(b, field_embeddings=fe), bundle.model.forward_from_embeddings(fe, b)[0][:, -1],
        rtol=1e-5, atol=1e-5,
    )


@pytest.mark.parametrize("start", [0, 6, 15])
def test_logits_from_equals_full_forward(bundle, start):
    fr = tiny_frame(2, 16)
    enc = bundle.encoder.transform(fr)
    b = make_batch(enc, np.stack([np.arange(16), np.r_[np.arange(16, 29), -1, -1, -1]]), np.array([0, 16]))
    full = bundle.model(b).logits[:, start:]
    got = bundle.model.logits_from(b, start)
    assert got.shape == (2, 16 - start)
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="start"):
        bundle.model.logits_from(b, 16)


def test_removing_by_mask_equals_deleting_the_row(bundle):
    fr = tiny_frame(1, 12)
    b = _batch(bundle, fr, np.arange(12))
    present = b.present.clone()
    present[0, 5] = False
    masked = bundle.model(b.with_present(present)).logits[0]
    deleted_fr = fr.drop(index=5).reset_index(drop=True)
    deleted = bundle.model(_batch(bundle, deleted_fr, np.arange(11))).logits[0]
    torch.testing.assert_close(masked[[i for i in range(12) if i != 5]], deleted, rtol=1e-5, atol=1e-5)


def test_windows_cover_every_row_once_and_respect_min_history():
    ents = np.repeat(["a", "b", "c"], [3, 40, 16])
    win = build_windows(ents, 16, 6)
    scored = np.zeros(len(ents), int)
    for w in range(win.n_windows):
        for pos in range(win.scored_from[w], win.length[w]):
            scored[win.rows[w, pos]] += 1
    assert (scored == 1).all()
    assert (win.rows[win.row_window, win.row_pos] == np.arange(len(ents))).all()
    # every row after the first window has >= min_history earlier rows in its window
    starts = {"a": 0, "b": 3, "c": 43}
    for r in range(len(ents)):
        if r - starts[ents[r]] >= 16:
            assert win.row_pos[r] >= 6


def test_whole_file_scores_equal_per_query_context(bundle):
    fr = tiny_frame(3, 40)
    s = score_frame(bundle, fr)
    assert s["probability"].between(0, 1).all() and len(s) == len(fr)
    for tid in ["t0", "t17", "t39", fr["transaction_id"].iloc[-1]]:
        ctx = build_context(bundle, fr, tid)
        assert ctx.transaction_ids[-1] == tid
        want = float(s.loc[s.transaction_id == tid, "logit"].iloc[0])
        assert ctx.score_logit() == pytest.approx(want, abs=1e-4)


def test_checkpoint_roundtrip_and_tamper_detection(bundle, tmp_path):
    sha = save_checkpoint(bundle, tmp_path / "ck")
    loaded = load_checkpoint(tmp_path / "ck")
    assert loaded.sha256 == sha and len(sha) == 64
    fr = tiny_frame(2, 20)
    np.testing.assert_allclose(score_frame(loaded, fr)["logit"], score_frame(bundle, fr)["logit"], rtol=1e-6)
    meta = (tmp_path / "ck" / "checkpoint.json").read_text().replace('"review": 0.5', '"review": 0.1')
    (tmp_path / "ck" / "checkpoint.json").write_text(meta)
    with pytest.raises(ValueError, match="sha256 mismatch"):
        load_checkpoint(tmp_path / "ck")


def test_history_deviation_gets_piecewise_linear_bins(bundle):
    """``amount_vs_history`` enters as the deviation plus its piecewise-linear code over
    ``cfg.history_edges``; a checkpoint config without the field loads with the linear form only."""
    from engine.model.transformer import DEFAULT_HISTORY_EDGES, ModelConfig

    rows = bundle.model.rows
    e = list(bundle.model.cfg.history_edges)
    assert e == list(DEFAULT_HISTORY_EDGES) and rows.hist_lin.in_features == len(e)
    dev = torch.tensor([-5.0, e[3] + 0.25 * (e[4] - e[3]), 10.0])
    got = rows.history_embedding(dev, torch.tensor([True, True, True]))
    code = torch.zeros(3, len(e) - 1)
    code[1, :3] = 1.0
    code[1, 3] = 0.25
    code[2, :] = 1.0
    want = rows.hist_lin(torch.cat([dev[:, None], code], dim=1))
    torch.testing.assert_close(got, want)
    none = rows.history_embedding(dev, torch.tensor([False, True, True]))
    torch.testing.assert_close(none[0], rows.hist_none)

    legacy = {k: v for k, v in bundle.model.cfg.to_dict().items() if k != "history_edges"}
    cfg = ModelConfig.from_dict(legacy)
    assert cfg.history_edges == []
    from engine.model.transformer import FraudTransformer
    assert FraudTransformer(cfg).rows.hist_lin.in_features == 1


def test_config_checks_one_edge_list_per_num_column(bundle):
    from engine.model.transformer import ModelConfig

    d = bundle.model.cfg.to_dict()
    n = len(d["num_field_index"])
    with pytest.raises(ValueError, match=f"num_ple_edges: expected {n} lists"):
        ModelConfig(**{**d, "num_ple_edges": [[0.0, 1.0]] * (n + 1)})
    assert ModelConfig(**{**d, "num_ple_edges": [[]] * n}).num_ple_edges == [[]] * n
    with pytest.raises(ValueError, match="history_edges: expected strictly increasing edges"):
        ModelConfig(**{**d, "history_edges": [0.0, 1.0, 1.0, 2.0]})
    bad = [[] for _ in range(n)]
    bad[-1] = [0.5, 0.2]
    with pytest.raises(ValueError, match=f"num_ple_edges: expected strictly increasing edges \\(list {n - 1}\\)"):
        ModelConfig(**{**d, "num_ple_edges": bad})


def test_expected_state_shapes_are_the_built_models(bundle):
    """The loader checks a checkpoint's tensors against shapes computed from the config alone; they
    must be exactly the built model's (with and without piecewise-linear codes and history edges)."""
    from engine.model.checkpoint import ASSET_MODEL_DIR
    from engine.model.checkpoint_checks import expected_state_shapes
    from engine.model.transformer import FraudTransformer, ModelConfig

    d = bundle.model.cfg.to_dict()
    n = len(d["num_field_index"])
    ple = [[] for _ in range(n)]
    ple[0], ple[-1] = [-1.0, 0.0, 1.0], [0.0, 0.5, 1.0, 2.0, 3.0]
    demo = json.loads((ASSET_MODEL_DIR / "checkpoint.json").read_text())["model_config"]
    from engine.model.ensemble import model_from_config

    for cfg in (bundle.model.cfg, ModelConfig(**{**d, "num_ple_edges": ple, "n_layers": 3}),
                ModelConfig(**{**d, "history_edges": []}), ModelConfig.from_dict(demo),
                ModelConfig(**{**d, "n_members": 2})):
        want = {k: tuple(v.shape) for k, v in model_from_config(cfg).state_dict().items()}
        assert expected_state_shapes(cfg) == want
    assert FraudTransformer(bundle.model.cfg).state_dict().keys() == expected_state_shapes(bundle.model.cfg).keys()
    assert ModelConfig.from_dict(demo).n_members == 3  # the shipped demo model is a 3-member ensemble
    assert "rows.ple_w" in expected_state_shapes(ModelConfig(**{**d, "num_ple_edges": ple}))


def test_save_refuses_non_finite_weights_and_bad_thresholds(bundle, tmp_path):
    from engine.model.checkpoint import CheckpointError, ModelBundle

    bad = ModelBundle(model=bundle.model, encoder=bundle.encoder, spec=bundle.spec,
                      meta={"thresholds": {"review": 0.7, "decline": 0.3}})
    with pytest.raises(CheckpointError, match="thresholds: expected review <= decline, got review 0.7 > decline 0.3"):
        save_checkpoint(bad, tmp_path / "a")
    import copy

    m = copy.deepcopy(bundle.model)
    with torch.no_grad():
        m.head.bias.fill_(float("nan"))
    with pytest.raises(CheckpointError, match=r"b: not written: tensor\(s\) \['head.bias'\] hold NaN or inf values"):
        save_checkpoint(ModelBundle(model=m, encoder=bundle.encoder, spec=bundle.spec), tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
