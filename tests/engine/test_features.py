"""Feature encoder: piecewise-linear bins of the delayed-label aggregates (fitted on training rows,
stored in the encoder state, equal on the batch and the one-row path; legacy states unchanged)."""

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from engine.data.aggregates import delayed_aggregates
from engine.model.checkpoint import ModelBundle, build_model
from engine.data.features import AGGREGATE_PLE_BINS, FeatureEncoder, _aggregate_edges, piecewise_linear
from engine.model.incremental import IncrementalScorer
from engine.model.scoring import score_frame
from engine.model.sequences import make_batch
from engine.data.spec import DatasetSpec

from tiny_models import tiny_frame, tiny_spec


def _spec_with_aggregate() -> DatasetSpec:
    d = tiny_spec().model_dump()
    d["aggregates"] = [{"name": "merchant_risk", "key": "merchant", "windows_days": [1, 7], "delay_days": 1,
                        "recent_labels": [3], "fraud_run": True}]
    return DatasetSpec.model_validate(d)


@pytest.fixture(scope="module")
def fitted():
    spec = _spec_with_aggregate()
    fr = tiny_frame(6, 120, seed=2)
    fr["merchant"] = (fr.index % 4).astype(str)  # few merchants: many labels known per merchant
    agg = delayed_aggregates(fr, spec.aggregates[0])
    fr = pd.concat([fr, agg.set_index(fr.index)], axis=1)
    return spec, fr, FeatureEncoder.fit(fr, spec)


def test_aggregate_edges_start_at_the_minimum_and_bin_the_values_above_it():
    x = np.array([0.0] * 90 + list(np.linspace(0.1, 1.0, 10)) + [np.nan])
    e = _aggregate_edges(x, 4)
    assert e[0] == 0.0 and e[1] == pytest.approx(0.1) and e[-1] == pytest.approx(1.0)
    assert len(e) == 6 and np.all(np.diff(e) > 0)
    assert _aggregate_edges(np.zeros(50), 4) == []  # nothing above the minimum: no bins
    assert _aggregate_edges(x, 0) == []


def test_every_aggregate_column_gets_standardised_bin_edges(fitted):
    """The encoded frame keeps one float per aggregate column (memory); the bin edges, fitted on
    the training rows, are handed to the model in the column's standardised units."""
    spec, fr, enc = fitted
    cols = enc.state["aggregates"]["merchant_risk"]
    st = cols["merchant_risk_fraud_rate_7d"]
    assert 2 < len(st["ple_edges"]) <= AGGREGATE_PLE_BINS + 2
    names = [c for c, _ in enc.num_columns()]
    assert [c for c, f in enc.num_columns() if f == "merchant_risk"] == spec.aggregates[0].columns()
    assert enc.transform(fr).num.shape == (len(fr), len(names))
    edges = enc.num_ple_edges()
    assert len(edges) == len(names)
    assert all(e == [] for c, e in zip(names, edges) if not c.startswith("merchant_risk"))
    assert all(len(e) == 0 or np.all(np.diff(e) > 0) for e in edges)


def test_model_codes_equal_the_code_of_the_raw_aggregate(fitted, agg_bundle):
    """End to end through the standardisation: the model's code of each aggregate column is the
    piecewise-linear code of the raw value (log1p for counts) over the raw-unit edges."""
    spec, fr, enc = fitted
    rows = agg_bundle.model.rows
    names = [c for c, _ in enc.num_columns()]
    num = torch.from_numpy(enc.transform(fr).num)  # [N, Fn]
    code = rows.num_ple_code(num)  # [N, P, K]
    cols = enc.state["aggregates"]["merchant_risk"]
    for p, j in enumerate(rows.ple_cols.tolist()):
        st = cols[names[j]]
        raw = fr[names[j]].to_numpy(np.float64)
        raw = np.log1p(raw) if st["log"] else raw
        want = piecewise_linear(raw, st["ple_edges"])  # [N, K_j]
        k = want.shape[1]
        np.testing.assert_allclose(code[:, p, :k].numpy(), want, atol=2e-5)
        assert torch.all(code[:, p, k:] == 0)  # padding bins never fire
        assert want[:, -1].max() == 1.0  # the column reaches its last bin in this data


def test_one_row_path_equals_the_batch_path_with_aggregates(fitted):
    _, fr, enc = fitted
    fr = fr.copy()
    fr.loc[3, "merchant_risk_fraud_run_days"] = np.nan  # a missing aggregate: standardised 0
    full = enc.transform(fr)
    for i in [0, 3, 57, len(fr) - 1]:
        one = enc.transform_row(fr.iloc[i].to_dict())
        np.testing.assert_allclose(one.num[0], full.num[i], rtol=1e-6, atol=1e-7)
    k = [c for c, _ in enc.num_columns()].index("merchant_risk_fraud_run_days")
    assert full.num[3, k] == 0.0


def test_a_state_without_bins_has_no_codes(fitted):
    """Checkpoints written before the bins existed have no ``ple_edges``: no codes, same layout."""
    spec, fr, enc = fitted
    state = copy.deepcopy(enc.state_dict())
    for st in state["aggregates"]["merchant_risk"].values():
        del st["ple_edges"]
    old = FeatureEncoder.from_state_dict(spec, state)
    assert old.num_columns() == enc.num_columns()
    assert all(e == [] for e in old.num_ple_edges())


@pytest.fixture(scope="module")
def agg_bundle(fitted):
    spec, fr, enc = fitted
    model = build_model(enc, seed=1, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0,
                        context_length=16, min_history=6)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return ModelBundle(model=model.eval(), encoder=enc, spec=spec, meta={"thresholds": {"review": 0.5}})


def test_model_adds_each_code_to_its_aggregate_field(fitted, agg_bundle):
    _, fr, enc = fitted
    rows = agg_bundle.model.rows
    cfg = agg_bundle.model.cfg
    names = [c for c, _ in enc.num_columns()]
    assert rows.ple_w is not None and len(rows.ple_cols) == len(enc.spec.aggregates[0].columns())
    e = enc.num_ple_edges()
    # 16 rows where every aggregate is above its minimum somewhere (late in the terminals' histories)
    late = np.flatnonzero(fr["merchant_risk_fraud_run_length"].to_numpy() > 0)[-16:]
    batch = make_batch(enc.transform(fr), late[None, :], np.array([0]))
    code = rows.num_ple_code(batch.num)  # [1, T, P, K]
    assert bool((code.amax(dim=(0, 1, 3)) > 0).all())  # every coded column contributes
    fields = rows(batch)  # [1, T, F, D]
    torch.testing.assert_close(fields.sum(2), rows.summed(batch), rtol=1e-4, atol=1e-4)
    # the aggregate field, by hand: linear term + bias + code embedding of each of its columns
    f = cfg.field_names.index("merchant_risk")
    want = rows.field_bias[f].clone().expand(16, -1).clone()
    for p, j in enumerate(rows.ple_cols.tolist()):
        x = batch.num[0, :, j]  # [T]
        lo, hi = torch.tensor(e[j][:-1]), torch.tensor(e[j][1:])
        code = ((x[:, None] - lo) / (hi - lo)).clamp(0, 1)  # [T, K_j]
        want = want + x[:, None] * rows.num_w[j] + rows.num_b[j] + code @ rows.ple_w[p, : len(lo)]
    torch.testing.assert_close(fields[0, :, f], want, rtol=1e-4, atol=1e-5)
    assert names[rows.ple_cols[0]].startswith("merchant_risk")


def test_incremental_equals_whole_file_scoring_with_coded_aggregates(fitted, agg_bundle):
    _, fr, _ = fitted
    sub = fr[fr["entity_id"].isin(["c0", "c1"])].reset_index(drop=True)
    want = score_frame(agg_bundle, sub)["logit"].to_numpy()
    got = IncrementalScorer(agg_bundle).add_frame(sub)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
