"""Case page Trust and What-if tabs through Streamlit's AppTest (dashboard/components/trust.py).

Same set-up as tests/dashboard/test_app.py: a slice of the demo data and a tiny untrained model
(noise on the weights) in a temp folder, passed through the FRAUDLENS_* environment variables.
Every number shown is checked against the engine (engine.trust, engine.model.scoring.score_frame)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from engine.cases import view as cv
from engine.cases.redact import escape_markdown
from engine.explain.context import build_context
from engine.model.scoring import score_frame
from engine.trust.agreement import method_agreement
from engine.trust.figures import METHOD_TITLES as TITLES
from engine.trust.faithfulness import evaluate_faithfulness
from engine.trust.reasons import reason_codes
from engine.trust.sanity import completeness_checks
from engine.trust.whatif import Edit, apply_edits
from tiny_models import demo_slice, tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "dashboard" / "app.py")
TIMEOUT = 120


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("trust-dash")
    data = demo_slice(d / "tx.csv", 1500)
    spec = cv.demo_spec_name()
    src = cv.load_source(data, spec)
    tiny_checkpoint(src.frame, src.spec, d / "model", {"name": "tiny-trust", "thresholds": {"review": 0.5}})
    bundle = cv.load_model(d / "model")
    scores = cv.score_source(bundle, src.frame)
    # the query: the highest-scored flagged transaction with at least 8 earlier ones
    pos = scores.groupby("entity_id", sort=False).cumcount()
    cand = scores[(pos >= 8) & scores["flagged"]].sort_values("probability", ascending=False)
    assert len(cand), "the tiny model flags nothing with history; change the seed"
    q = str(cand["transaction_id"].iloc[0])
    ent = str(cand["entity_id"].iloc[0])
    return {"data": data, "spec": spec, "model": d / "model", "bundle": bundle, "scores": scores,
            "frame": src.frame, "query": q, "entity": ent}


@pytest.fixture
def env(world, monkeypatch, tmp_path):
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "store"))  # never the user's real case store
    monkeypatch.setenv("FRAUDLENS_DATA", str(world["data"]))
    monkeypatch.setenv("FRAUDLENS_SPEC", world["spec"])
    monkeypatch.setenv("FRAUDLENS_MODEL", str(world["model"]))
    monkeypatch.delenv("FRAUDLENS_MAX_ROWS", raising=False)
    torch.set_num_threads(1)
    return world


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _case(env, edits=None) -> AppTest:
    from dashboard.components.access import SESSION_KEY
    from engine.serve.access import Identity

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state[SESSION_KEY] = Identity("alice", "analyst", "password")  # as the sign-in form does
    at.session_state["entity_id"] = env["entity"]
    at.session_state["query_id"] = env["query"]
    at.session_state["trust_show"] = True
    if edits is not None:
        at.session_state["whatif_edits"] = {env["query"]: [e.to_dict() for e in edits]}
    at.switch_page("pages/case.py")
    at.run()
    _ok(at)
    return at


def _chart(at: AppTest, key: str) -> dict:
    for c in at.get("plotly_chart"):
        if c.key == key:
            return json.loads(c.proto.spec)
    raise AssertionError(f"no chart {key!r}; have {[c.key for c in at.get('plotly_chart')]}")


def _arr(v) -> np.ndarray:
    """A plotted array from the chart JSON (plotly writes numpy arrays as base64 typed arrays)."""
    if isinstance(v, dict) and "bdata" in v:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        shape = v.get("shape")
        return a.reshape([int(x) for x in str(shape).split(",")]) if shape else a
    return np.asarray(v, dtype=float)


def _frame(at: AppTest, column: str):
    """The displayed table with ``column`` (non-selectable st.dataframe elements carry no key)."""
    for d in at.dataframe:
        v = d.value
        if hasattr(v, "data"):  # a Styler
            v = v.data
        if column in v.columns:
            return v
    raise AssertionError(f"no table with column {column!r}")


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _engine_trust(env):
    """What the Trust tab must show, computed with the engine directly."""
    bundle, fr, q = env["bundle"], env["frame"], env["query"]
    expls = cv.explain_query(bundle, fr, q)
    ctx = build_context(bundle, fr[fr.entity_id == env["entity"]].reset_index(drop=True), q)
    _, expls = completeness_checks(ctx, expls, warn=False)
    faith = evaluate_faithfulness(ctx, expls, k_max=10, curve_max=20, n_random=5)
    return ctx, expls, faith, method_agreement(expls), reason_codes(ctx, expls)


def test_trust_tab_shows_faithfulness_agreement_and_reasons(env):
    at = _case(env)
    assert [t.label for t in at.tabs][-2:] == ["Trust", "What-if"]
    ctx, expls, faith, agree, reasons = _engine_trust(env)
    full = _frame(at, "aopc_minus_random")
    n = len(faith)
    table = full.iloc[:n]
    assert table["method"].tolist() == [TITLES.get(m, m) for m in faith]
    np.testing.assert_allclose(table["aopc"].to_numpy(float), [f.aopc for f in faith.values()], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(table["aopc_random"].to_numpy(float), [f.aopc_random for f in faith.values()],
                               rtol=1e-5, atol=1e-6)
    assert table["beats_random"].tolist() == [bool(f.aopc > f.aopc_random) for f in faith.values()]
    # the model-free orders every method must beat, computed on the same context
    from engine.trust.baselines import baseline_orders

    base = evaluate_faithfulness(ctx, baseline_orders(ctx), k_max=10, curve_max=20, n_random=5,
                                 attention=expls.get("attention"))
    assert full["method"].iloc[n:].tolist() == ["Most recent first (no model)", "Largest amount first (no model)"]
    np.testing.assert_allclose(full["aopc"].iloc[n:].to_numpy(float), [f.aopc for f in base.values()],
                               rtol=1e-5, atol=1e-6)
    assert table["beats_recency"].tolist() == [bool(f.aopc > base["recency"].aopc) for f in faith.values()]
    assert set(table["sanity"]) <= {"not run", "not checked"}  # the randomisation check waits for its button
    # one deletion curve per method: the method's own order is the last trace
    for m, f in faith.items():
        spec = _chart(at, f"trust_curve_{m}")
        np.testing.assert_allclose(_arr(spec["data"][-1]["y"]), f.deletion["logit"].to_numpy(), rtol=1e-5, atol=1e-6)
    # the agreement matrix
    z = _arr(_chart(at, "trust_agreement")["data"][0]["z"]).astype(float)
    np.testing.assert_allclose(z, agree.spearman.to_numpy(), rtol=1e-6, atol=1e-9)
    n_dis = len(agree.disagreements)
    # agreement stated once: one box naming every disagreeing pair, none when all agree
    boxes = [w.value for w in at.info if "disagree on this case" in w.value]
    assert len(boxes) == (1 if n_dis else 0)
    if n_dis:
        assert boxes[0].startswith(f"{n_dis} method pair")
    # reason codes, each with its cited transactions
    md = [m.value for m in at.markdown]
    if reasons:
        for i, r in enumerate(reasons):
            assert any(v.startswith(f"{i + 1}\\. **{escape_markdown(cv.mask(r.text))}** — cites {len(r.transaction_ids)}")
                       for v in md), md
        cited = _frame(at, "cited")
        assert cited["cited"].sum() == len(reasons[0].transaction_ids)
    else:
        assert any("No reason code" in c.value for c in at.caption)


def test_randomisation_check_runs_behind_its_button(env):
    at = _case(env)
    at.button(key="trust_sanity_run").click().run()
    _ok(at)
    table = _frame(at, "aopc_minus_random")
    verdicts = dict(zip(table["method"], table["sanity"]))
    for m in ("Attention", "Integrated gradients", "SHAP", "Occlusion"):
        assert verdicts[m] in ("evidence", "not evidence", "undetermined"), verdicts
    assert _chart(at, "trust_randomisation")["data"]
    assert env["bundle"].sha256 in at.session_state["trust_sanity_models"]


def _expected_whatif(env, edits) -> float:
    edited, _ = apply_edits(env["frame"], env["query"], edits, env["bundle"].spec)
    s = score_frame(env["bundle"], edited)
    return float(s.loc[s.transaction_id == env["query"], "logit"].iloc[0])


def _earlier(env, n: int) -> list[str]:
    fr = env["frame"]
    ent = fr[fr.entity_id == env["entity"]]
    ids = ent["transaction_id"].astype(str).tolist()
    i = ids.index(env["query"])
    return ids[max(0, i - n):i]


def test_whatif_edits_rescore_and_reset_restores(env):
    e1, e2 = _earlier(env, 3)[-1], _earlier(env, 3)[0]
    edits = [Edit("change", e1, {"amount": 4321.5, "mcc": "7995"}), Edit("remove", e2)]
    at = _case(env, edits)
    expected = _expected_whatif(env, edits)
    res = at.session_state["whatif_result"][env["query"]]
    assert res["logit"] == pytest.approx(expected, abs=1e-5)
    original = float(env["scores"].loc[env["scores"].transaction_id == env["query"], "logit"].iloc[0])
    assert res["original_logit"] == pytest.approx(original, abs=1e-5)
    assert abs(res["logit"] - original) > 1e-4, "the edits did not change the score"
    metrics = _metrics(at)
    assert not env["bundle"].calibrated  # its output is sigmoid(logit), called a score (words rule)
    assert metrics["What-if score"] == f"{1 / (1 + np.exp(-expected)):.3f}"
    assert metrics["Original score"] == f"{1 / (1 + np.exp(-original)):.3f}"
    assert set(res["edited_transaction_ids"]) == {e1, e2}
    rows = _frame(at, "edited")
    assert rows["edited"].sum() == 1  # the changed row; the removed one is gone
    assert _chart(at, "whatif_bars")["data"]
    # the edits stay in session state (for the export) as Edit dicts
    assert at.session_state["whatif_edits"][env["query"]] == [e.to_dict() for e in edits]
    at.button(key="whatif_reset").click().run()
    _ok(at)
    assert at.session_state["whatif_edits"][env["query"]] == []
    res = at.session_state["whatif_result"][env["query"]]
    assert res["logit"] == pytest.approx(original, abs=1e-5)
    assert _metrics(at)["What-if score"] == f"{1 / (1 + np.exp(-original)):.3f}"


def test_whatif_widgets_add_an_edit(env):
    at = _case(env)
    q = env["query"]
    target = _earlier(env, 1)[0]
    at.selectbox(key=f"whatif_target_{q}").select(target).run()
    _ok(at)
    at.number_input(key=f"whatif_{q}_{target}_amount").set_value(9999.0).run()
    at.button(key="whatif_apply").click().run()
    _ok(at)
    edits = at.session_state["whatif_edits"][q]
    assert edits == [{"op": "change", "transaction_id": target, "values": {"amount": 9999.0}}]
    expected = _expected_whatif(env, edits)
    assert at.session_state["whatif_result"][q]["logit"] == pytest.approx(expected, abs=1e-5)
    assert _metrics(at)["What-if score"] == f"{1 / (1 + np.exp(-expected)):.3f}"


def _count_reason_builds(monkeypatch) -> list:
    """Patch engine.cases.links.case_reason_codes (the reason-code builder the lead box and the
    Trust tab call) to record each call's query transaction id; clears the in-memory caches."""
    import streamlit as st

    import engine.cases.links as links

    calls, real = [], links.case_reason_codes

    def counting(ctx, *a, **k):
        calls.append(str(ctx.transaction_ids[-1]))
        return real(ctx, *a, **k)

    monkeypatch.setattr(links, "case_reason_codes", counting)
    st.cache_data.clear()  # a reason list cached by an earlier test would hide a build
    return calls


def test_reason_codes_built_once_per_page_run_for_the_lead_box_and_the_trust_tab(env, monkeypatch):
    calls = _count_reason_builds(monkeypatch)
    at = _case(env)  # trust_show on: the lead box and the Trust tab both list the query's reasons
    assert calls == [env["query"]], calls
    # the Trust tab lists the lead box's reasons (the same cache entry), in the same order
    lead = [m.value for m in at.markdown if m.value[:1].isdigit() and "\\. " in m.value and " — cites " not in m.value]
    trust = [m.value for m in at.markdown if " — cites " in m.value]
    assert lead and trust == trust[:len(lead)] * 2  # Trust tab, then What-if tab (no edits: the same list)
    for a, b in zip(lead, trust):
        n, text = a.split("\\. ", 1)
        assert b.startswith(f"{n}\\. **{text.split(' *(')[0]}** — cites "), (a, b)
    at.run()  # a rerun builds nothing
    _ok(at)
    assert calls == [env["query"]], calls


def test_reason_codes_of_an_edited_history_are_built_for_it(env, monkeypatch):
    calls = _count_reason_builds(monkeypatch)
    _case(env, [Edit("remove", _earlier(env, 2)[0])])
    # the original history once (lead box + Trust tab), the edited one once (What-if tab)
    assert calls == [env["query"], env["query"]], calls


def _count_whatif_work(monkeypatch) -> dict:
    """Patch the engine's what-if and faithfulness functions (imported at call time by the
    dashboard) to count calls: what-if with no methods (score only), with methods (re-explained),
    and faithfulness evaluations."""
    import engine.trust.faithfulness as faith
    import engine.trust.whatif as wi

    n = {"score_only": 0, "explained": 0, "faithfulness": 0}
    real_wi, real_f = wi.what_if, faith.evaluate_faithfulness

    def what_if(*a, methods=(), **k):
        n["explained" if list(methods) else "score_only"] += 1
        return real_wi(*a, methods=methods, **k)

    def evaluate_faithfulness(*a, **k):
        n["faithfulness"] += 1
        return real_f(*a, **k)

    monkeypatch.setattr(wi, "what_if", what_if)
    monkeypatch.setattr(faith, "evaluate_faithfulness", evaluate_faithfulness)
    return n


def test_an_edit_rescores_once_and_runs_no_faithfulness_check(env, monkeypatch):
    import streamlit as st

    st.cache_data.clear()
    at = _case(env)  # the original history: trust checks and what-if tab drawn, cached
    n = _count_whatif_work(monkeypatch)
    q, target = env["query"], _earlier(env, 1)[0]
    at.selectbox(key=f"whatif_target_{q}").select(target).run()
    assert n == {"score_only": 0, "explained": 0, "faithfulness": 0}, n  # picking a row computes nothing
    at.number_input(key=f"whatif_{q}_{target}_amount").set_value(7777.0).run()
    at.button(key="whatif_apply").click().run()
    _ok(at)
    # one score-only pass for the metrics, one re-explanation for the rows, bars and reasons; the Trust
    # tab's faithfulness curves (method + model-free orders) are not rebuilt for the edited history
    assert n == {"score_only": 1, "explained": 1, "faithfulness": 0}, n
    edits = at.session_state["whatif_edits"][q]
    expected = _expected_whatif(env, edits)
    assert at.session_state["whatif_result"][q]["logit"] == pytest.approx(expected, abs=1e-5)
    assert _metrics(at)["What-if score"] == f"{1 / (1 + np.exp(-expected)):.3f}"
    assert any(c.value.startswith("1 edit in force") for c in at.caption)
    at.run()  # a rerun with the same edit: all cached
    assert n == {"score_only": 1, "explained": 1, "faithfulness": 0}, n
    at.button(key="whatif_undo").click().run()  # back to the original history: cached too
    _ok(at)
    assert n == {"score_only": 1, "explained": 1, "faithfulness": 0}, n
    assert any(c.value.startswith("No edits yet") for c in at.caption)


def test_whatif_target_survives_an_edit_of_its_amount_and_its_removal(env):
    """The target picker's labels come from the original rows: after an amount edit the picker
    still holds the edited transaction's id (the browser bench found the label text returned
    instead of an id once the edited amount changed the label, and the tab crashed); after the
    target is removed, the picker starts over on a transaction still in the history."""
    at = _case(env)
    q = env["query"]
    target = _earlier(env, 1)[0]
    box = f"whatif_target_{q}"
    at.selectbox(key=box).select(target).run()
    before = at.selectbox(key=box).format_func(target)
    at.number_input(key=f"whatif_{q}_{target}_amount").set_value(31337.0).run()
    at.button(key="whatif_apply").click().run()
    _ok(at)
    assert at.selectbox(key=box).value == target
    assert at.selectbox(key=box).format_func(target) == before  # the label did not follow the edit
    at.radio(key=f"whatif_{q}_{target}_action").set_value("remove").run()
    at.button(key="whatif_apply").click().run()
    _ok(at)
    assert [e["op"] for e in at.session_state["whatif_edits"][q]] == ["change", "remove"]
    picked = at.selectbox(key=box).value
    assert picked != target and picked in _earlier(env, 10**6) + [q]  # an id still in the edited history
