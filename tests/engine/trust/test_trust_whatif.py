"""What-if re-scores equal scoring the edited *raw file* from scratch (read -> encode -> score),
for a query in a later scoring window whose window moves when a row is removed."""

import json

import numpy as np
import pandas as pd
import pytest
from trust_helpers import TRIGGER, frame, one_torch_thread, spec, to_raw, trained_bundle  # noqa: F401

from engine.data.aggregates import add_aggregates
from engine.explain.context import build_context
from engine.data.io import read_transactions
from engine.model.scoring import score_file
from engine.data.spec import DatasetSpec
from engine.trust.whatif import Edit, WhatIfResult, apply_edits, what_if


def file_logit(bundle, path, qid) -> float:
    s = score_file(bundle, path, spec(with_id=True)).scores
    return float(s.loc[s.transaction_id == qid, "logit"].iloc[0])


def test_what_if_equals_scoring_the_edited_file_from_scratch(tmp_path):
    bundle = trained_bundle()
    sp = spec(with_id=True)
    raw = to_raw(frame())
    p0 = tmp_path / "orig.csv"
    raw.to_csv(p0, index=False)
    canon = read_transactions(p0, sp).frame
    ent = canon[canon.entity_id == "c03"].reset_index(drop=True)
    assert len(ent) >= 40
    qid = ent.transaction_id[30]  # scored in window k(30) = 2, which starts at position 20
    ctx0 = build_context(bundle, canon, qid)
    assert ctx0.transaction_ids[0] == ent.transaction_id[20]
    t_new = ent.timestamp[30] - pd.Timedelta(minutes=20)  # a trigger MCC 20 minutes before the query
    edits = [
        Edit("change", ent.transaction_id[25], {"amount": 5000.0}),
        {"op": "change", "transaction_id": ent.transaction_id[27], "values": {"merchant": "999", "mcc": "5999"}},
        Edit("remove", ent.transaction_id[22]),
        Edit("remove", ent.transaction_id[5]),  # outside the context: still moves the window start
        Edit("add", values={"timestamp": t_new, "amount": 12.5, "mcc": TRIGGER, "merchant": "7", "errors": ["Bad PIN"]}),
    ]
    res = what_if(bundle, canon, qid, edits, methods=("occlusion",))

    # the same edits made by hand on the raw file, then read + scored from scratch
    raw2 = raw.copy()
    raw2.loc[raw2.tid == ent.transaction_id[25], "amt"] = "5000.00"
    raw2.loc[raw2.tid == ent.transaction_id[27], ["m", "mcc"]] = ["999", "5999"]
    raw2 = raw2[~raw2.tid.isin([ent.transaction_id[22], ent.transaction_id[5]])]
    new = {"tid": "whatif-5", "card": "c03", "ts": t_new.strftime("%Y-%m-%dT%H:%M:%S"), "amt": "12.50", "y": "",
           "m": "7", "mcc": TRIGGER, "r": "", "e": "Bad PIN", "Fraud Episode": ""}
    raw2 = pd.concat([raw2, pd.DataFrame([new])], ignore_index=True)
    p1 = tmp_path / "edited.csv"
    raw2.to_csv(p1, index=False)

    assert res.original_logit == pytest.approx(file_logit(bundle, p0, qid), abs=1e-5)
    assert res.logit == pytest.approx(file_logit(bundle, p1, qid), abs=1e-5)
    assert abs(res.logit - res.original_logit) > 0.05  # the edits matter (measured 0.087): stale encodings would show
    scratch = build_context(bundle, read_transactions(p1, sp).frame, qid)
    assert res.context.transaction_ids == scratch.transaction_ids  # the window was re-cut
    assert res.context.transaction_ids[0] == ent.transaction_id[21]
    assert "whatif-5" in res.context.transaction_ids and ent.transaction_id[22] not in res.context.transaction_ids
    torch_equal = [np.array_equal(getattr(res.context.batch, a).numpy(), getattr(scratch.batch, a).numpy(), equal_nan=True)
                   for a in ("cat", "num", "multi", "time_s", "present", "prev_time_s")]
    assert all(torch_equal)
    e = res.explanations["occlusion"]
    assert e.transaction_ids == res.context.transaction_ids and e.score_logit == pytest.approx(res.logit, abs=1e-6)
    assert res.edited_transaction_ids == [*ent.transaction_id[[25, 27, 22, 5]], "whatif-5"]
    assert 0 < res.probability < 1 and res.probability == pytest.approx(1 / (1 + np.exp(-res.logit)))


def test_edits_serialise_and_validate():
    bundle = trained_bundle()
    fr = frame()
    ent = fr[fr.entity_id == "c01"].reset_index(drop=True)
    qid = ent.transaction_id[12]
    edits = [Edit("change", ent.transaction_id[3], {"timestamp": ent.timestamp[3] - pd.Timedelta(minutes=5),
                                                     "amount": np.float64(3.5)}),
             Edit("add", "extra", {"timestamp": "2024-01-01T00:00:00Z", "amount": 1})]
    res = what_if(bundle, fr, qid, edits, methods=())
    d = json.loads(res.to_json())
    assert d["edits"][0]["values"]["timestamp"] == (ent.timestamp[3] - pd.Timedelta(minutes=5)).isoformat()
    assert d["edits"][1]["transaction_id"] == "extra" and d["explanations"] == {}
    back = [Edit.from_dict(x) for x in d["edits"]]
    again = what_if(bundle, fr, qid, back, methods=())
    assert again.logit == res.logit and isinstance(again, WhatIfResult)
    assert what_if(bundle, fr, qid, [], methods=()).logit == pytest.approx(res.original_logit)
    later = ent.transaction_id[13]
    other = fr[fr.entity_id == "c02"].transaction_id.iloc[0]
    bad = [
        (Edit("remove", qid), "query itself"),
        (Edit("remove", later), "after the query"),
        (Edit("remove", other), "entity"),
        (Edit("change", ent.transaction_id[2], {"label": 1}), "cannot be edited"),
        (Edit("change", ent.transaction_id[2], {"timestamp": ent.timestamp[20]}), "after the query"),
        (Edit("add", values={"amount": 3}), "timestamp"),
        (Edit("add", ent.transaction_id[1], {"amount": 3, "timestamp": ent.timestamp[1]}), "already exists"),
    ]
    for ed, msg in bad:
        with pytest.raises(ValueError, match=msg):
            what_if(bundle, fr, qid, [ed], methods=())
    with pytest.raises(KeyError):
        what_if(bundle, fr, "nope", [], methods=())
    with pytest.raises(ValueError, match="op"):
        Edit("move", "t1")


def test_delayed_aggregates_are_recomputed_like_from_scratch():
    sp = DatasetSpec.model_validate({
        "name": "agg", "entity": {"columns": ["c"]}, "timestamp": {"column": "ts"}, "amount": {"column": "a"},
        "label": {"column": "y"},
        "fields": [{"name": "terminal", "column": "t", "kind": "categorical"}],
        "aggregates": [{"name": "terminal_risk", "key": "terminal", "windows_days": [1, 7], "delay_days": 1}],
    })
    rng = np.random.default_rng(1)
    n = 300
    base = pd.DataFrame({
        "row_number": np.arange(1, n + 1), "transaction_id": [f"r{i}" for i in range(1, n + 1)],
        "entity_id": rng.choice(["A", "B", "C"], n),
        "timestamp": pd.Timestamp("2024-01-01") + pd.to_timedelta(rng.uniform(0, 20 * 86400, n).round(), unit="s"),
        "amount": rng.uniform(1, 100, n).round(2), "terminal": rng.choice(["T1", "T2", "T3", "T4"], n),
        "label": pd.array((rng.random(n) < 0.2).astype(np.int8), dtype="Int8"),
    }).sort_values(["entity_id", "timestamp", "row_number"]).reset_index(drop=True)
    fr = add_aggregates(base, sp)
    a = base[base.entity_id == "A"].reset_index(drop=True)
    qid = a.transaction_id.iloc[-1]
    edits = [Edit("change", a.transaction_id[10], {"terminal": "T9"}), Edit("remove", a.transaction_id[20]),
             Edit("add", "new", {"timestamp": a.timestamp[30] + pd.Timedelta(seconds=1), "amount": 5, "terminal": "T2"})]
    edited, ids = apply_edits(fr, qid, edits, sp)
    # from scratch: the same edits on the aggregate-free frame, then every aggregate recomputed
    b = base.copy()
    b.loc[b.transaction_id == a.transaction_id[10], "terminal"] = "T9"
    b = b[b.transaction_id != a.transaction_id[20]]
    new = {"row_number": n + 1, "transaction_id": "new", "entity_id": "A", "timestamp": a.timestamp[30] + pd.Timedelta(seconds=1),
           "amount": 5.0, "terminal": "T2", "label": pd.NA}
    b = pd.concat([b, pd.DataFrame([new]).astype(b.dtypes.to_dict())], ignore_index=True)
    b = b.sort_values(["entity_id", "timestamp", "row_number"]).reset_index(drop=True)
    expected = add_aggregates(b, sp)
    assert ids == [a.transaction_id[10], a.transaction_id[20], "new"]
    pd.testing.assert_frame_equal(edited[expected.columns], expected, check_dtype=False)
    changed = (edited[sp.aggregates[0].columns()].to_numpy() != fr.set_index("transaction_id").reindex(
        edited.transaction_id)[sp.aggregates[0].columns()].to_numpy()).any(axis=1)
    assert changed.any()  # the edits did move some aggregates
