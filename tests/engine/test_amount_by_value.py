"""The amount-by-value input (engine.data.features): the amount's z-score against the training
amounts of each embedded categorical value, shrunk towards the whole training period; stored in
the encoder state, equal on the batch and the one-row path, validated when a checkpoint loads."""

import copy
import json

import numpy as np
import pytest

from engine.data.features import (AMOUNT_BY_VALUE_CLIP, AMOUNT_BY_VALUE_EDGES, AMOUNT_BY_VALUE_PRIOR_ROWS, categorical_codes,
                                  FeatureEncoder)
from engine.model.checkpoint import CheckpointError, ModelBundle, build_model, load_checkpoint, save_checkpoint
from engine.model.incremental import IncrementalScorer
from engine.model.scoring import score_frame

from tiny_models import perturbed_bundle, tiny_frame, tiny_spec


@pytest.fixture(scope="module")
def fitted():
    spec, fr = tiny_spec(), tiny_frame(5, 80, seed=4)
    fr["mcc"] = np.where(fr.index % 3 == 0, "5999", np.where(fr.index % 3 == 1, "5411", "5812"))
    big = fr["mcc"] == "5999"
    fr.loc[big, "amount"] = fr.loc[big, "amount"].abs() * 40  # 5999: large amounts
    return spec, fr, FeatureEncoder.fit(fr, spec, amount_by_value=True)


def _z(enc, amount):
    st = enc.state
    return (np.log1p(np.abs(amount)) - st["amount_log_mean"]) / st["amount_log_std"]


def test_statistics_are_the_shrunk_per_value_moments(fitted):
    spec, fr, enc = fitted
    abv = enc.state["amount_by_value"]
    assert set(abv) == {"merchant", "mcc"}  # every embedded categorical field
    z = _z(enc, fr["amount"].to_numpy())
    code = categorical_codes(enc, fr)["mcc"]
    m, mu, var = AMOUNT_BY_VALUE_PRIOR_ROWS, z.mean(), z.var()
    for value in ("5999", "5411"):
        c = int(code[(fr["mcc"] == value).to_numpy()][0])
        zk = z[code == c]
        want_mean = (zk.sum() + m * mu) / (len(zk) + m)
        want_sd = np.sqrt((np.sum(zk ** 2) + m * (var + mu ** 2)) / (len(zk) + m) - want_mean ** 2 + 1e-4)
        assert abv["mcc"]["mean"][c] == pytest.approx(want_mean, rel=1e-5)
        assert abv["mcc"]["std"][c] == pytest.approx(want_sd, rel=1e-5)
    # unseen (code 0) and missing (code 1): the whole period's moments
    assert abv["mcc"]["mean"][0] == pytest.approx(mu, rel=1e-5)
    assert abv["mcc"]["std"][0] == pytest.approx(np.sqrt(var + 1e-4), rel=1e-5)


def test_the_same_amount_reads_small_for_a_large_amount_value(fitted):
    spec, fr, enc = fitted
    names = [c for c, _ in enc.num_columns()]
    j = names.index("amount_z_in_mcc")
    row = fr.iloc[0].copy()
    row["amount"] = float(np.median(np.abs(fr["amount"])))
    got = {}
    for value in ("5999", "5411"):
        row["mcc"] = value
        got[value] = float(enc.transform_row(row).num[0, j])
    assert got["5999"] < -0.5 < 0.0 < got["5411"]  # small for the large-amount MCC, above its own usual
    # the column belongs to the amount field and carries the fixed piecewise-linear code
    cfg = build_model(enc, context_length=16, min_history=4, d_model=16, n_heads=2, n_layers=1, d_ff=16).cfg
    assert cfg.field_names[cfg.num_field_index[j]] == "amount"
    assert enc.num_ple_edges()[j] == AMOUNT_BY_VALUE_EDGES


def test_batch_and_one_row_encodings_are_equal_and_clipped(fitted):
    spec, fr, enc = fitted
    fr2 = fr.copy()
    fr2.loc[3, "amount"] = 1e12  # far outside every value's spread: clipped
    e = enc.transform(fr2)
    names = [c for c, _ in enc.num_columns()]
    cols = [names.index("amount_z_in_merchant"), names.index("amount_z_in_mcc")]
    assert np.all(np.abs(e.num[:, cols]) <= AMOUNT_BY_VALUE_CLIP)
    assert e.num[3, cols[1]] == AMOUNT_BY_VALUE_CLIP
    for i in (0, 3, 17, len(fr2) - 1):
        r = enc.transform_row(fr2.iloc[i])
        np.testing.assert_allclose(r.num[0], e.num[i], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(r.cat[0], e.cat[i])


def test_off_and_legacy_states_have_no_column(fitted):
    spec, fr, enc = fitted
    off = FeatureEncoder.fit(fr, spec)  # the default: off
    assert "amount_by_value" not in off.state
    legacy = copy.deepcopy(enc.state)
    del legacy["amount_by_value"]
    old = FeatureEncoder.from_state_dict(spec, legacy)
    assert old.num_columns() == off.num_columns()
    assert len(enc.num_columns()) == len(off.num_columns()) + 2
    assert enc.transform(fr).num.shape[1] == off.transform(fr).num.shape[1] + 2


def test_incremental_scoring_equals_whole_file_scoring(fitted):
    spec, fr, enc = fitted
    bundle = perturbed_bundle(enc, spec, seed=3)
    sub = fr[fr["entity_id"].isin(["c0", "c2"])].reset_index(drop=True)
    want = score_frame(bundle, sub)["logit"].to_numpy()
    np.testing.assert_allclose(IncrementalScorer(bundle).add_frame(sub), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("edit, message", [
    (lambda a: a["mcc"]["std"].__setitem__(2, -1.0), "amount_by_value.mcc.std: expected positive"),
    (lambda a: a["mcc"]["mean"].pop(), r"amount_by_value.mcc.mean: expected \d+ finite numbers"),
    (lambda a: a["mcc"].__setitem__("mean", ["x"] * len(a["mcc"]["mean"])), "amount_by_value.mcc.mean"),
    (lambda a: a.__setitem__("risk", {"mean": [0.0], "std": [1.0]}), "amount_by_value.risk: expected an embedded"),
])
def test_a_malformed_checkpoint_state_is_refused(fitted, tmp_path, edit, message):
    spec, fr, enc = fitted
    model = build_model(enc, d_model=16, n_heads=2, n_layers=1, d_ff=16, context_length=16, min_history=4)
    save_checkpoint(ModelBundle(model=model.eval(), encoder=enc, spec=spec, meta={"thresholds": {"review": 0.5}}),
                    tmp_path)
    load_checkpoint(tmp_path)  # valid as written
    meta = json.loads((tmp_path / "checkpoint.json").read_text())
    edit(meta["feature_state"]["amount_by_value"])
    meta.pop("sha256", None)
    (tmp_path / "checkpoint.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path)
