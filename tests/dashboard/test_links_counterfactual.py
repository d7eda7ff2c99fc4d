"""Case page: links between cases (dashboard/components/links.py) and the counterfactual beside the
reason codes (dashboard/components/counterfactual.py), through Streamlit's AppTest; every value
shown is checked against the engine (engine.cases.links, engine.trust.counterfactual)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from streamlit.testing.v1 import AppTest

from engine.cases import view as cv
from engine.cases.figures import transaction_labels
from engine.cases.links import case_links, rank_points
from engine.cases.redact import escape_markdown
from engine.explain.context import build_context
from engine.trust.counterfactual import amount_counterfactual, removal_counterfactual
from engine.trust.sanity import completeness_checks
from tiny_models import demo_slice, tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "dashboard" / "app.py")
TIMEOUT = 180


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("links-dash")
    data = demo_slice(d / "tx.csv", 6000)  # the first 6,000 demo rows hold a merchant shared by 2 fraud cards
    spec = cv.demo_spec_name()
    src = cv.load_source(data, spec)
    tiny_checkpoint(src.frame, src.spec, d / "model", {"name": "tiny-links", "thresholds": {"review": 0.5}})
    bundle = cv.load_model(d / "model")
    scores = cv.score_source(bundle, src.frame)
    pos = scores.groupby("entity_id", sort=False).cumcount()
    cand = scores[(pos >= 8) & scores["flagged"]].sort_values("probability", ascending=False)
    assert len(cand), "the tiny model flags nothing with history; change the seed"
    # the highest-scored one whose entity shares a merchant with another in its window
    onsets = rank_points(src.frame, src.spec, window_days=7).onsets
    for q, e, t in cand[["transaction_id", "entity_id", "timestamp"]].itertuples(index=False):
        if len(case_links(src.frame, src.spec, e, onsets=onsets, at=t, window_days=7).linked):
            break
    else:
        raise AssertionError("no flagged entity shares a merchant with another")
    return {"data": data, "spec": spec, "model": d / "model", "bundle": bundle, "scores": scores, "source": src,
            "query": str(q), "entity": str(e)}


@pytest.fixture
def env(world, monkeypatch, tmp_path):
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "store"))  # never the user's real case store
    monkeypatch.setenv("FRAUDLENS_DATA", str(world["data"]))
    monkeypatch.setenv("FRAUDLENS_SPEC", world["spec"])
    monkeypatch.setenv("FRAUDLENS_MODEL", str(world["model"]))
    monkeypatch.delenv("FRAUDLENS_MAX_ROWS", raising=False)
    torch.set_num_threads(1)
    return world


def _case(env, **flags) -> AppTest:
    from dashboard.components.access import SESSION_KEY
    from engine.serve.access import Identity

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state[SESSION_KEY] = Identity("alice", "analyst", "password")
    at.session_state["entity_id"] = env["entity"]
    at.session_state["query_id"] = env["query"]
    for k, v in flags.items():
        at.session_state[k] = v
    at.switch_page("pages/case.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def _frame(at: AppTest, column: str) -> pd.DataFrame:
    for d in at.dataframe:
        v = d.value.data if hasattr(d.value, "data") else d.value
        if column in v.columns:
            return v
    raise AssertionError(f"no table with column {column!r}")


def test_links_section_shows_the_engine_ranking_case_links_and_network(env):
    from engine.cases.store import CaseStore, default_db_path, source_id

    src = env["source"]
    r = rank_points(src.frame, src.spec, window_days=7)
    qt = src.frame.loc[src.frame["transaction_id"] == env["query"], "timestamp"].iloc[0]
    first = case_links(src.frame, src.spec, env["entity"], onsets=r.onsets, at=qt, window_days=7).linked
    # the linked entities have cases in the store; the first one was disposed a false positive
    rk = cv.rank_entities(env["scores"], 0.5)
    rk = rk[rk["entity_id"].isin(set(first["entity_id"]))]
    rows = pd.DataFrame({"entity_id": rk["entity_id"], "max_probability": rk["max_probability"],
                         "max_transaction_id": rk["top_transaction_id"], "first_ts": rk["first_seen"],
                         "last_ts": rk["last_seen"], "max_amount": 1.0, "n_transactions": rk["n_transactions"],
                         "n_known_fraud": 0})
    with CaseStore(default_db_path(), four_eyes=False) as store:
        sid = source_id(cv.file_identity(env["data"]), env["spec"])
        store.upsert_cases(env["bundle"].sha256, rows, source_id=sid)
        q = store.queue(env["bundle"].sha256, 0.0, source_id=sid).set_index("entity_id")
        store.record_disposition(int(q.loc[first["entity_id"].iloc[0], "case_id"]), "false_positive", "travel",
                                 analyst="alice")
    at = _case(env, links_show=True)
    assert r.point_field == "merchant" and len(r.table)  # the demo spec's link point
    shown = _frame(at, "fraud_visit_days")
    top = r.table.head(20)
    assert shown["point"].tolist() == [cv.mask(p) for p in top["point"]]
    np.testing.assert_allclose(shown["lift"].to_numpy(float), top["lift"].to_numpy(float), rtol=1e-9)
    cl = case_links(src.frame, src.spec, env["entity"], onsets=r.onsets, at=qt, window_days=7, ranking=r,
                    scores=env["scores"], max_entities=200)
    assert len(cl.linked), "the demo entity shares no merchant in its window; pick another query"
    linked = _frame(at, "shared_points")
    assert linked["entity"].tolist() == [cv.mask(e) for e in cl.linked["entity_id"]]
    assert linked["shared_points"].tolist() == cl.linked["shared_points"].tolist()
    np.testing.assert_allclose(linked["max_probability"].to_numpy(float), cl.linked["max_probability"].to_numpy(float))
    shown_state = dict(zip(linked["entity"], linked["case_state"]))
    fp = cv.mask(first["entity_id"].iloc[0])
    assert shown_state.pop(fp) == "false positive" and all(v == "open" for v in shown_state.values())
    chart = next(c for c in at.get("plotly_chart") if c.key == "links_network")
    data = json.loads(chart.proto.spec)["data"]
    n_nodes = sum(len(t["x"]) for t in data if t.get("mode") == "markers")
    assert n_nodes == 1 + min(len(cl.linked), 40) + len(cl.points)


def test_counterfactual_sentences_beside_the_reasons(env):
    at = _case(env, trust_show=True)
    bundle, fr, q = env["bundle"], env["source"].frame, env["query"]
    expls = cv.explain_query(bundle, fr, q)
    ctx = build_context(bundle, fr[fr.entity_id == env["entity"]].reset_index(drop=True), q)
    _, expls = completeness_checks(ctx, expls, warn=False)  # as the Trust tab does
    rows = fr[fr.entity_id == env["entity"]]
    labels = dict(zip(rows["transaction_id"].astype(str),
                      (str(cv.mask(x)) for x in transaction_labels(rows["timestamp"], rows["amount"], "USD"))))
    r = removal_counterfactual(bundle, fr, q, 0.5, expls, describe=lambda t: labels.get(t, t))
    a = amount_counterfactual(bundle, fr, q, 0.5)
    md = [m.value for m in at.markdown]
    assert "#### Smallest change that clears this flag" in md
    assert f"**Remove earlier transactions.** {escape_markdown(r.text)}" in md, md
    assert f"**Change the amount.** {escape_markdown(a.text)}" in md, md
    assert r.method == "shap" and r.original_probability >= 0.5
