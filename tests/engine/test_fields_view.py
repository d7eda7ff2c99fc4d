"""engine.cases.fields_view + the report: the history effect and the validated per-field values of
the query, from the engine to the JSON and PDF exports."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pandas as pd
import pytest

from engine.cases import fields_view as fv
from engine.cases import report as rp
from engine.cases import view as cv
from tiny_models import demo_slice, tiny_checkpoint


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("fields")
    src = cv.load_source(demo_slice(d / "tx.csv", 300), cv.demo_spec_name())
    tiny_checkpoint(src.frame, src.spec, d / "model", {"thresholds": {"review": 0.5, "decline": 0.8}},
                    context_length=8, min_history=4)
    bundle = cv.load_model(d / "model")
    frame = src.frame.copy()
    scores = cv.score_source(bundle, frame)
    entity = cv.rank_entities(scores, bundle.threshold)["entity_id"].iloc[0]
    tl = cv.entity_timeline(frame, scores, entity, bundle.threshold)
    query = str(tl["transaction_id"].iloc[6])  # a query with history
    fields = fv.query_fields(bundle, frame, query, currency=src.currency)
    return {"bundle": bundle, "frame": frame, "query": query, "fields": fields, "tl": tl, "src": src,
            "entity": entity}


def test_history_effect_numbers_equal_direct_rescoring(world):
    h = world["fields"]["history_effect"]
    f = world["frame"]
    q = world["query"]
    alone = cv.score_source(world["bundle"], f[f.transaction_id == q].reset_index(drop=True))
    assert h["alone"] == pytest.approx(float(alone["probability"].iloc[0]), abs=1e-5)
    row = world["tl"][world["tl"].transaction_id == q]
    assert h["with_history"] == pytest.approx(float(row["probability"].iloc[0]), abs=1e-5)
    assert h["difference"] == pytest.approx(h["with_history"] - h["alone"])
    assert (h["alone"] >= h["threshold"]) == h["alone_flagged"]
    assert ("own fields drive" in h["sentence"]) == h["alone_flagged"]
    assert f"{h['alone']:.3f}" in fv.history_caption(world["fields"])


def test_field_block_shows_only_validated_values(world):
    fa = world["fields"]["field_attribution"]
    F = len(fa["field_names"])
    assert len(fa["values"]) == len(fa["shown_values"]) == len(fa["ablation"]) == F
    v = fa["validation"]
    if fa["shown"] == "integrated_gradients":
        assert v["integrated_gradients"]["ok"] and fa["shown_values"] == pytest.approx(fa["integrated_gradients"])
    elif fa["shown"] == "field_shapley":
        assert not v["integrated_gradients"]["ok"] and v["field_shapley"]["ok"]
    else:
        assert fa["shown_values"] == pytest.approx(fa["ablation"])
    assert "×" in fa["values"][fa["field_names"].index("amount_vs_history")]
    assert abs(fa["ig_convergence_delta"]) < 5e-3
    fig = fv.field_figure(world["fields"])
    assert list(fig.data[0].x) == pytest.approx(fa["shown_values"])
    assert all("typical:" in y for y in fig.data[0].y)
    c = fa["cells"]
    assert c is not None and sum(c["values"]) + (c["other"] or 0.0) == pytest.approx(c["total"], abs=1e-5)
    cf = fv.cells_figure(world["fields"])
    assert cf is not None and len(cf.data[0].x) == len(c["cells"]) + (c["other"] is not None)


def test_report_json_and_pdf_carry_the_block(world, tmp_path):
    from pypdf import PdfReader

    from engine.cases.store import CaseStore

    b, tl, q = world["bundle"], world["tl"], world["query"]
    expls = cv.explain_query(b, world["frame"], q)
    store = CaseStore(tmp_path / "cases.sqlite3", four_eyes=False)
    store.upsert_cases(b.sha256, pd.DataFrame([{
        "entity_id": world["entity"], "max_probability": float(tl["probability"].max()), "max_transaction_id": q,
        "first_ts": tl["timestamp"].min(), "last_ts": tl["timestamp"].max(), "max_amount": float(tl["amount"].max()),
        "n_transactions": len(tl), "n_known_fraud": 0}]))
    case = store.get_case(int(store.queue(b.sha256, 0.0).case_id.iloc[0]))
    kw = dict(case=case, entity_id=world["entity"], model=b, dataset={"spec": "demo", "currency": "USD"},
              expls=expls, context=cv.context_rows(expls, world["frame"]),
              thresholds={"review": 0.5, "decline": 0.8, "source": "checkpoint"}, salt="s")
    report = rp.build_report(**kw, fields=world["fields"])
    doc = json.loads(rp.to_json(report))  # validated against the schema on the way
    assert doc["history_effect"]["sentence"] == world["fields"]["history_effect"]["sentence"]
    assert doc["field_attribution"]["shown_values"] == pytest.approx(world["fields"]["field_attribution"]["shown_values"])
    assert "history_effect" not in rp.build_report(**kw)  # optional
    flat = " ".join("\n".join(p.extract_text() for p in PdfReader(io.BytesIO(rp.to_pdf(report))).pages).split())
    assert "Does the history matter?" in flat and "The query's own fields" in flat
    assert "Fields: " not in flat  # unvalidated per-field sums of the explanations are not printed
    assert world["fields"]["history_effect"]["sentence"].split(":")[0] in flat
    # a block whose shown value is not one of the known methods is refused by the schema
    bad = json.loads(json.dumps(report))
    bad["field_attribution"]["shown"] = "zero_baseline_ig"
    with pytest.raises(Exception, match="zero_baseline_ig"):
        rp.validate(bad)


def test_usual_amount_text_follows_the_model_deviation(world):
    from engine.explain.context import build_context

    ctx = build_context(world["bundle"], world["frame"], world["query"])
    rows = ctx.rows
    la = np.log1p(np.abs(rows["amount"].to_numpy(float)))
    want = math.exp(la[-1] - la[:-1].mean())
    assert fv.usual_amount_text(ctx) == f"{want:.1f}× the usual amount"
    first = build_context(world["bundle"], world["frame"], str(world["tl"]["transaction_id"].iloc[0]))
    assert fv.usual_amount_text(first) == "no history"


def test_activity_field_texts_follow_the_context(world):
    from engine.explain.context import build_context

    ctx = build_context(world["bundle"], world["frame"], world["query"])
    assert "recent_activity" in ctx.field_names and "first_seen" in ctx.field_names  # activity model
    ts = pd.to_datetime(ctx.rows["timestamp"])
    gap = (ts.iloc[-1] - ts.iloc[:-1]).dt.total_seconds()
    texts = fv.activity_texts(ctx)
    assert texts["recent_activity"] == f"{int((gap <= 3600).sum())} earlier in 1 h, {int((gap <= 86400).sum())} in 24 h"
    new = [f for f in ("merchant", "mcc") if f in ctx.rows and ctx.rows[f].iloc[-1] not in set(ctx.rows[f].iloc[:-1])]
    for f in new:  # a value never seen earlier in the context is named
        if ctx.bundle.config.first_seen_cols and f in [ctx.field_names[ctx.bundle.config.cat_field_index[j]]
                                                       for j in ctx.bundle.config.first_seen_cols]:
            assert f in texts["first_seen"]
    fa = world["fields"]["field_attribution"]
    assert fa["values"][fa["field_names"].index("recent_activity")] == texts["recent_activity"]
    assert fa["reference"]["first_seen"] == "values seen before on this history"
