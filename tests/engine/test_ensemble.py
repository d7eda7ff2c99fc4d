"""Seed ensembles (engine.model.ensemble): one checkpoint, one score (the members' mean logit) on
every scoring path (whole file, windowed queries, the explainers' query and embedding paths, the
incremental scorer, a saved and reloaded checkpoint); Integrated Gradients of the ensemble is the
mean of its members' (linearity); the randomisation cascade reaches every member; `fit` trains
the members from distinct seeds; a checkpoint whose weights do not match its member count is
refused."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from engine.cases.view import model_card
from engine.data.features import FeatureEncoder
from engine.explain.context import build_context
from engine.explain.integrated_gradients import IGConfig, explain as ig_explain
from engine.model.checkpoint import CheckpointError, ModelBundle, load_checkpoint, save_checkpoint
from engine.model.ensemble import SeedEnsemble, member_seed, members_of
from engine.model.incremental import IncrementalScorer
from engine.model.scoring import score_frame
from engine.model.sequences import make_batch
from engine.model.train import TrainConfig, fit, time_split
from engine.trust.sanity import cascade_steps, randomise_modules_

from tiny_models import perturbed_bundle, tiny_frame, tiny_spec


@pytest.fixture(scope="module")
def parts():
    torch.set_num_threads(1)
    spec, fr = tiny_spec(), tiny_frame(4, 60, seed=7)
    enc = FeatureEncoder.fit(fr, spec)
    singles = [perturbed_bundle(enc, spec, seed=s, row_ff=24) for s in (5, 6, 7)]
    cfg = dataclasses.replace(singles[0].model.cfg, n_members=3)
    ens = SeedEnsemble(cfg, [b.model for b in singles]).eval()
    bundle = ModelBundle(model=ens, encoder=enc, spec=spec, meta={"thresholds": {"review": 0.5}})
    return bundle, singles, fr


def test_members_differ_so_the_mean_is_a_real_check(parts):
    b, singles, fr = parts
    batch = make_batch(b.encoder.transform(fr), np.arange(16)[None, :], np.array([0]))
    with torch.no_grad():
        lg = [s.model(batch).logits for s in singles]
    assert float((lg[0] - lg[1]).abs().max()) > 0.1 and float((lg[1] - lg[2]).abs().max()) > 0.1


def test_every_scoring_path_is_the_members_mean_logit(parts):
    b, singles, fr = parts
    m = b.model
    batch = make_batch(b.encoder.transform(fr), np.arange(16)[None, :], np.array([0]))
    with torch.no_grad():
        want = torch.stack([s.model(batch).logits for s in singles]).mean(0)  # [1, 16]
        out = m(batch, output_attentions=True, output_field_embeddings=True)
        torch.testing.assert_close(out.logits, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m(batch).logits, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m.logits_from(batch, 6), want[:, 6:], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m.query_logits(batch), want[:, -1], rtol=1e-5, atol=1e-5)
        # joint embeddings [B, T, F, K*D]: the explainers' embedding path gives the same score
        D = b.config.d_model
        assert out.field_embeddings.shape[-1] == 3 * D
        torch.testing.assert_close(m.forward_from_embeddings(out.field_embeddings, batch)[0], want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m.query_logits(batch, field_embeddings=out.field_embeddings), want[:, -1],
                                   rtol=1e-5, atol=1e-5)
        # removal path: a presence mask gives the mean of the members' masked scores
        pres = batch.present.clone().repeat(2, 1)
        pres[1, 3] = False
        got = m.query_logits(batch, pres)
        each = torch.stack([s.model.query_logits(batch, pres) for s in singles]).mean(0)
        torch.testing.assert_close(got, each, rtol=1e-5, atol=1e-5)
        assert abs(float(got[0] - got[1])) > 1e-4  # removing a transaction moves the score
        # attention: per layer the members' mean, rows still summing to 1
        atts = [s.model(batch, output_attentions=True).attentions for s in singles]
        for layer, a in enumerate(out.attentions):
            torch.testing.assert_close(a, torch.stack([x[layer] for x in atts]).mean(0))
            torch.testing.assert_close(a.sum(-1), torch.ones_like(a.sum(-1)), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="expected last dimension 3 x"):
        m.query_logits(batch, field_embeddings=out.field_embeddings[..., :D])


def test_whole_file_and_incremental_scores_are_the_mean(parts):
    b, singles, fr = parts
    got = score_frame(b, fr)["logit"].to_numpy()
    want = np.mean([score_frame(s, fr)["logit"].to_numpy() for s in singles], axis=0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    sub = fr[fr["entity_id"].isin(["c1", "c3"])].reset_index(drop=True)
    inc = IncrementalScorer(b)
    np.testing.assert_allclose(inc.add_frame(sub), score_frame(b, sub)["logit"].to_numpy(), rtol=1e-4, atol=1e-4)
    st = inc.entities["c1"]
    assert all(w.keys.shape[0] == 3 for w in st.windows) and len(st.windows) <= 2  # members side by side
    # resume: rebuilt caches continue with the same scores as feeding the whole history
    rows = sub[sub["entity_id"] == "c1"].to_dict("records")
    S = inc.S
    late = IncrementalScorer(b)
    start = S  # a window start with that window still open after len(rows) - 1 rows
    late.resume("c1", rows[start:-1], start, rows[start - 1]["timestamp"].timestamp())
    fresh = IncrementalScorer(b)
    fresh.add_frame(sub[sub["entity_id"] == "c1"].iloc[:-1])
    assert late.add("c1", rows[-1]) == pytest.approx(fresh.add("c1", rows[-1]), abs=1e-4)


def test_integrated_gradients_of_the_ensemble_is_the_members_mean(parts):
    b, singles, fr = parts
    tid = fr.loc[fr.entity_id == "c0", "transaction_id"].iloc[30]
    cfg = IGConfig(target_delta=None, n_steps=64)
    e = ig_explain(build_context(b, fr, tid), cfg)
    each = [ig_explain(build_context(s, fr, tid), cfg) for s in singles]
    np.testing.assert_allclose(e.field_values, np.mean([x.field_values for x in each], axis=0), rtol=1e-3, atol=1e-3)
    assert e.score_logit == pytest.approx(np.mean([x.score_logit for x in each]), abs=1e-5)
    assert e.values.sum() == pytest.approx(e.score_logit - e.reference_logit, abs=5e-2)  # completeness, mean logit


def test_checkpoint_round_trip_and_member_count_check(parts, tmp_path):
    b, _, fr = parts
    save_checkpoint(b, tmp_path / "ok")
    back = load_checkpoint(tmp_path / "ok")
    assert isinstance(back.model, SeedEnsemble) and back.config.n_members == 3
    np.testing.assert_allclose(score_frame(back, fr)["logit"].to_numpy(), score_frame(b, fr)["logit"].to_numpy(),
                               rtol=1e-6, atol=1e-6)
    # a config that claims 2 members over 3 members' weights: refused before the model is built
    bad = tmp_path / "bad"
    save_checkpoint(b, bad)
    meta = json.loads((bad / "checkpoint.json").read_text())
    meta["model_config"]["n_members"] = 2
    meta.pop("sha256", None)
    (bad / "checkpoint.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="members.2"):
        load_checkpoint(bad)
    meta["model_config"]["n_members"] = 17
    (bad / "checkpoint.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="n_members"):
        load_checkpoint(bad)


def test_randomisation_cascade_reaches_every_member(parts):
    b, _, _ = parts
    steps = dict(cascade_steps(b.model))
    assert steps["head"] == [f"members.{k}.{m}" for k in range(3) for m in ("head", "ln_out")]
    assert all(any(n.startswith(f"members.{k}.") for n in steps["block 0"]) for k in range(3))
    model = __import__("copy").deepcopy(b.model)
    before = [m.head.weight.clone() for m in members_of(model)]
    randomise_modules_(model, steps["head"], torch.Generator().manual_seed(0))
    assert all(not torch.equal(m.head.weight, w) for m, w in zip(members_of(model), before))


def test_fit_trains_members_from_distinct_seeds():
    spec, fr = tiny_spec(), tiny_frame(6, 80, seed=11)
    split, _, _ = time_split(fr["timestamp"])
    cfg = TrainConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, context_length=16, min_history=6, epochs=2,
                      patience=2, windows_per_epoch=64, batch_size=16, min_steps_per_epoch=0, row_ff=16, seed=1,
                      members=2, threads=1)
    bundle, history, _ = fit(fr, spec, split, cfg, log=lambda m: None, progress=False)
    assert isinstance(bundle.model, SeedEnsemble) and bundle.config.n_members == 2
    assert [m["seed"] for m in bundle.meta["members"]] == [member_seed(1, 0, 2), member_seed(1, 1, 2)] == [2, 3]
    assert sorted({h["member"] for h in history}) == [0, 1] and len(bundle.meta["best_epoch"]) == 2
    a, c = members_of(bundle.model)
    assert float((a.head.weight - c.head.weight).detach().abs().max()) > 1e-3  # different initialisations
    assert not bundle.model.training
    card = model_card(bundle)
    assert card["best_epoch"] == " / ".join(str(e) for e in bundle.meta["best_epoch"])
    assert card["architecture"]["n_members"] == 2 and set(card["history"]["member"]) == {0, 1}
    assert TrainConfig().members == 3  # the default recipe is a 3-member ensemble
    with pytest.raises(ValueError, match="members: expected a whole number from 1 to 16"):
        fit(fr, spec, split, dataclasses.replace(cfg, members=0), log=lambda m: None, progress=False)
