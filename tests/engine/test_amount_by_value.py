"""The amount-by-value input (engine.data.features): the amount's z-score against the training
amounts of each embedded categorical value, shrunk towards the whole training period; stored in
the encoder state, equal on the batch and the one-row path, validated when a checkpoint loads."""

import copy
import json

import numpy as np
import pytest
import torch

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
    (lambda a: a["mcc"]["std"].__setitem__(2, -1.0), r"amount_by_value.mcc: expected std >= 0.001"),
    (lambda a: a["mcc"]["std"].__setitem__(0, 5e-324), r"amount_by_value.mcc: expected std >= 0.001"),
    (lambda a: a["mcc"]["mean"].__setitem__(0, 10 ** 400), "amount_by_value.mcc.mean: expected"),
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


def test_fields_get_columns_while_their_codes_fit_the_total_budget():
    """The per-code tables go into the checkpoint's JSON: fields beyond AMOUNT_BY_VALUE_MAX_CODES codes
    in all get no column, so a spec with many large hashed fields still saves a loadable checkpoint."""
    from engine.data.features import AMOUNT_BY_VALUE_MAX_CODES
    from engine.data.spec import DatasetSpec

    d = tiny_spec().model_dump()
    big = AMOUNT_BY_VALUE_MAX_CODES // 2  # two fit (2 x (big + 2) > budget? no: the third does not)
    d["fields"] = [f for f in d["fields"] if f["name"] != "merchant"] + [
        {"name": f"m{k}", "column": f"m{k}", "kind": "categorical", "hashed_buckets": big - 2} for k in range(3)]
    spec = DatasetSpec.model_validate(d)
    fr = tiny_frame(3, 30, seed=1)
    for k in range(3):
        fr[f"m{k}"] = fr["merchant"]
    enc = FeatureEncoder.fit(fr, spec, amount_by_value=True)
    abv = enc.state["amount_by_value"]
    assert sum(len(st["mean"]) for st in abv.values()) <= AMOUNT_BY_VALUE_MAX_CODES
    assert list(abv) == ["mcc", "m0"]  # spec order; m1 would pass the budget, m2 too
    tampered = copy.deepcopy(enc.state)
    tampered["amount_by_value"]["m1"] = copy.deepcopy(abv["m0"])
    with pytest.raises(ValueError, match=r"amount_by_value: expected at most 65,538 codes in all"):
        FeatureEncoder.from_state_dict(spec, tampered).num_columns()


def test_replacing_the_amount_or_the_value_recomputes_the_column(fitted):
    """Explainers that set cells to the typical transaction (engine.explain.reference.replace_cells):
    the amount-by-value column follows the amount and the MCC now in place, as re-encoding would."""
    from engine.data.field_reference import FieldReference
    from engine.explain.context import build_context
    from engine.explain.reference import replace_cells

    spec, fr, enc = fitted
    bundle = perturbed_bundle(enc, spec, seed=3)
    tid = fr.loc[fr.entity_id == "c1", "transaction_id"].iloc[30]
    ctx = build_context(bundle, fr, tid)
    cfg = bundle.config
    names = [c for c, _ in enc.num_columns()]
    j = names.index("amount_z_in_mcc")
    amount_f, mcc_f = cfg.field_names.index("amount"), cfg.field_names.index("mcc")
    t = ctx.T - 1
    base = dict(amount=1000.0, hour=12, weekday=0, time_since_prev_s=3600.0,
                categorical={"merchant": "3", "mcc": "5999"}, numeric={"risk": 0.0}, aggregates={},
                multi_valued={"errors": ""}, sources={})
    ref = FieldReference(**base)
    cells = [(t, amount_f), (t, mcc_f)]
    b = replace_cells(ctx, np.array([[True, False], [False, True], [True, True]]), cells, ref)
    query = fr.loc[fr.transaction_id == tid].iloc[0]

    def encoded(**edit):
        row = query.copy()
        for k, v in edit.items():
            row[k] = v
        return float(enc.transform_row(row).num[0, j])

    got = b.num[:, t, j].numpy()
    want = [encoded(amount=1000.0), encoded(mcc="5999"), encoded(amount=1000.0, mcc="5999")]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert len({round(float(x), 3) for x in want + [float(ctx.batch.num[0, t, j])]}) == 4  # four distinct values
    # untouched transactions keep their encoded value exactly
    torch.testing.assert_close(b.num[:, : t, j], ctx.batch.num[:, : t, j].expand(3, -1))
