"""Case page: reasons and key evidence at the top, the words rule, the explanation cache
(dashboard/components/lead.py, dashboard/state.py) through Streamlit's AppTest.

Set-up as tests/dashboard/test_trust.py: a demo-data slice and a tiny untrained model. Every
number shown is recomputed with the engine (engine.trust.reasons / evidence) from the explanations
the page stored in the explanation cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from engine.cases import view as cv
from engine.cases.explain_cache import ExplanationCache
from engine.cases.store import source_id
from engine.explain.context import build_context
from engine.trust.evidence import key_evidence
from engine.trust.reasons import reason_codes
from tiny_models import demo_slice, tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "dashboard" / "app.py")
TIMEOUT = 180


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("lead-dash")
    data = demo_slice(d / "tx.csv", 1500)
    spec = cv.demo_spec_name()
    src = cv.load_source(data, spec)
    # a calibration map (Platt), so a panel that shows sigmoid(logit) instead of the model's output differs
    tiny_checkpoint(src.frame, src.spec, d / "model", {"name": "tiny-lead", "thresholds": {"review": 0.5},
                                                       "calibration": {"method": "platt", "a": 0.7, "b": -0.6}})
    bundle = cv.load_model(d / "model")
    scores = cv.score_source(bundle, src.frame)
    pos = scores.groupby("entity_id", sort=False).cumcount()
    cand = scores[(pos >= 8) & scores["flagged"]].sort_values("probability", ascending=False)
    assert len(cand), "the tiny model flags nothing with history; change the seed"
    return {"data": data, "spec": spec, "model": d / "model", "bundle": bundle, "scores": scores, "src": src,
            "frame": src.frame, "query": str(cand["transaction_id"].iloc[0]),
            "entity": str(cand["entity_id"].iloc[0])}


@pytest.fixture
def env(world, monkeypatch, tmp_path):
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("FRAUDLENS_DATA", str(world["data"]))
    monkeypatch.setenv("FRAUDLENS_SPEC", world["spec"])
    monkeypatch.setenv("FRAUDLENS_MODEL", str(world["model"]))
    monkeypatch.delenv("FRAUDLENS_MAX_ROWS", raising=False)
    torch.set_num_threads(1)
    import streamlit as st

    st.cache_data.clear()  # each test's data dir starts empty: no explanation from a memory cache
    from dashboard import precompute as pc

    pc.lead_store.clear()  # nor a lead built ahead by another test's precompute
    return {**world, "store": tmp_path / "store"}


def _case(env) -> AppTest:
    from dashboard.components.access import SESSION_KEY
    from engine.serve.access import Identity

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state[SESSION_KEY] = Identity("alice", "analyst", "password")
    at.session_state["entity_id"] = env["entity"]
    at.session_state["query_id"] = env["query"]
    at.switch_page("pages/case.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def _walk(node, out):
    """Every element of the page in document order (AppTest tree, depth first)."""
    kids = getattr(node, "children", None)
    out.append(node)
    if isinstance(kids, dict):
        for k in sorted(kids):
            _walk(kids[k], out)
    return out


def _texts(at) -> list[str]:
    out = []
    for el in _walk(at.main, []):
        for attr in ("value", "label", "body"):
            v = getattr(el, attr, None)
            if isinstance(v, str):
                out.append(v)
    return out


def _stored(env):
    """The explanations the page stored in the explanation cache (the data dir's sqlite)."""
    cache = ExplanationCache(env["store"] / "explanations.sqlite")
    sid = source_id(env["src"].file_sha256, env["src"].spec.name)
    got = cache.get(env["bundle"].sha256, sid, env["query"], {"max_rows": None})
    assert got is not None, "the page did not store the query's explanations"
    return got


def test_reasons_and_key_evidence_come_first_with_engine_numbers(env):
    at = _case(env)
    texts = _texts(at)
    lead_i = next(i for i, t in enumerate(texts) if t.startswith("#### Why it was flagged"))
    # above the per-method detail (the Attributions tab) and the trust toggle, without a toggle
    tab_i = next(i for i, t in enumerate(texts) if t == "Attributions")
    assert lead_i < tab_i
    expls = _stored(env)
    fr = env["frame"]
    ctx = build_context(env["bundle"], fr[fr.entity_id == env["entity"]].reset_index(drop=True), env["query"])
    reasons = reason_codes(ctx, expls)
    for i, r in enumerate(reasons):
        assert any(t.startswith(f"{i + 1}\\. ") and cv.mask(r.text)[:30] in t.replace("\\", "") for t in texts), r.text
    ev = key_evidence(ctx, expls["shap"], top_k=8)
    assert ev.word == ("probability" if env["bundle"].calibrated else "score")
    if ev.transaction_ids:
        n = len(ev.transaction_ids)
        these = "this earlier transaction" if n == 1 else f"these {n} earlier transactions"
        want = f"Without {these} the {ev.word} would be "
        assert any(want in t.replace("\\", "") for t in texts), [t for t in texts if "Key evidence" in t]
        tab = next(d.value for d in at.dataframe if "amount" in getattr(d.value, "columns", []) and
                   "time" in d.value.columns)
        rows = ctx.rows.set_index(ctx.rows["transaction_id"].astype(str))
        np.testing.assert_allclose(tab["amount"].to_numpy(float),
                                   rows.loc[ev.transaction_ids, "amount"].to_numpy(float))
        assert tab["rank"].tolist() == list(range(1, len(ev.transaction_ids) + 1))  # importance order, numbered
    else:
        assert any("no earlier transaction pushed" in t for t in texts)


def test_words_rule_follows_calibration(env):
    at = _case(env)
    labels = [m.label for m in at.metric]
    w = "probability" if env["bundle"].calibrated else "score"
    other = "score" if w == "probability" else "probability"
    assert f"Fraud {w}" in labels and f"Max fraud {w}" in labels
    assert f"Fraud {other}" not in labels and f"Max fraud {other}" not in labels
    # the shown number is the model's output (calibrated or sigmoid), not a hand-made sigmoid
    q = env["scores"].set_index("transaction_id").loc[env["query"]]
    shown = float(next(m.value for m in at.metric if m.label == f"Fraud {w}"))
    assert abs(shown - float(q["probability"])) < 1.5e-3
    # the disposition panel shows the same number (it showed sigmoid(logit), 0.999 beside 1.000)
    assert env["bundle"].calibrated
    sig = 1.0 / (1.0 + np.exp(-float(q["logit"])))
    assert abs(sig - float(q["probability"])) > 0.01  # the two differ for this model
    panel = float(next(m.value for m in at.metric if m.label == f"Query fraud {w}"))
    assert abs(panel - float(q["probability"])) < 1.5e-3


def test_second_open_reads_the_cache(env):
    """A stored entry is what the page shows: a tampered cached logit shows up as the query's logit."""
    at = _case(env)
    expls = _stored(env)
    logit = next(m.value for m in at.metric if m.label == "Logit")
    assert float(logit) == pytest.approx(float(next(iter(expls.values())).score_logit), abs=1e-3)
    # write a changed entry: a new session (memory caches cleared) must read it, not recompute
    cache = ExplanationCache(env["store"] / "explanations.sqlite")
    sid = source_id(env["src"].file_sha256, env["src"].spec.name)
    for e in expls.values():
        e.score_logit = 7.25
    cache.put(env["bundle"].sha256, sid, env["query"], {"max_rows": None}, expls)
    import streamlit as st

    st.cache_data.clear()
    at2 = _case(env)
    assert next(m.value for m in at2.metric if m.label == "Logit") == "+7.250"


def test_precompute_thread_fills_the_cache_most_risky_first(env, monkeypatch):
    from dashboard import state
    from dashboard import precompute as pc

    monkeypatch.setenv("FRAUDLENS_PRECOMPUTE_S", "0")
    assert state.precompute_budget_s() == 0.0
    order = pc.flagged_order(env["scores"])
    s = env["scores"].set_index("transaction_id").loc[order]
    flagged_ids = set(env["scores"].loc[env["scores"]["flagged"], "transaction_id"].astype(str))
    assert flagged_ids <= set(order) and len(set(order)) == len(order)
    extra = [t for t in order if t not in flagged_ids]  # opening transactions of unflagged entities
    assert len(extra) <= pc.OPEN_AHEAD and set(extra) <= set(order[:pc.OPEN_AHEAD])
    # first each case's top transaction (most risky case first), then the second of each, ...
    n_ent = s["entity_id"].nunique()
    tops = s.iloc[:n_ent]
    assert tops["entity_id"].is_unique and np.all(np.diff(tops["probability"].to_numpy()) <= 0)
    assert (tops.groupby("entity_id")["probability"].max() ==
            s.groupby("entity_id")["probability"].max().loc[tops.groupby("entity_id")["probability"].max().index]).all()
    data_dir = env["store"]
    data_dir.mkdir(parents=True, exist_ok=True)
    job = pc.precompute_job.__wrapped__(env["src"].file_sha256, env["spec"], None, env["bundle"].sha256, 0.5,
                                            5.0, str(env["data"]), str(env["model"]), str(data_dir))
    job["thread"].join(120)
    c = job["counts"]
    assert c is not None and "error" not in c, c
    assert c["computed"] >= 1 and c["computed"] + c["cached"] + c["failed"] + c["left"] == len(order)
    cache = ExplanationCache(data_dir / "explanations.sqlite")
    sid = source_id(env["src"].file_sha256, env["src"].spec.name)
    assert cache.get(env["bundle"].sha256, sid, order[0], {"max_rows": None}) is not None  # most risky first
    assert cache.get(env["bundle"].sha256, sid, order[-1], {"max_rows": None}) is None or c["left"] == 0
    # the lead (reasons, key evidence) of each explained transaction is built ahead, as the page builds it
    from dashboard.components.lead import build_lead

    leads = pc.lead_store(env["src"].file_sha256, env["spec"], None, env["bundle"].sha256)
    assert len(leads) == c["computed"] + c["cached"] > 0
    ahead = leads.get(order[0])
    now = build_lead(env["bundle"], env["frame"], order[0],
                     dict(cache.get(env["bundle"].sha256, sid, order[0], {"max_rows": None})))
    assert [r.text for r in ahead.reasons] == [r.text for r in now.reasons]
    assert ahead.logit == pytest.approx(now.logit, abs=1e-6)
    assert (ahead.evidence is None) == (now.evidence is None)
    if now.evidence is not None:
        assert list(ahead.evidence.transaction_ids) == list(now.evidence.transaction_ids)


def test_a_new_precompute_stops_the_previous_one_and_leaves_only_its_log(env):
    """One precompute process per server: starting one for another review threshold stops the
    running one; a stopped job's thread ends its process and removes its job, status and done
    files (only the log stays, mode 0600, in a 0700 folder)."""
    import stat

    from dashboard import precompute as pc

    data_dir = env["store"]
    data_dir.mkdir(parents=True, exist_ok=True)
    args = (env["src"].file_sha256, env["spec"], None, env["bundle"].sha256)
    tail = (600.0, str(env["data"]), str(env["model"]), str(data_dir))
    first = pc.precompute_job.__wrapped__(*args, 0.0, *tail)  # review 0: every transaction, a long job
    second = pc.precompute_job.__wrapped__(*args, 0.01, *tail)
    first["thread"].join(60)
    assert not first["thread"].is_alive() and first["process"].returncode is not None
    assert second["process"].poll() is None and not second["stop"].is_set()
    second["stop"].set()
    second["thread"].join(60)
    assert not second["thread"].is_alive() and second["process"].returncode is not None
    assert second["counts"] is not None
    work = data_dir / "precompute"
    assert stat.S_IMODE(work.stat().st_mode) == 0o700
    left = sorted(p.name for p in work.iterdir())
    assert left and all(n.endswith(".log") for n in left), left
    assert all(stat.S_IMODE((work / n).stat().st_mode) == 0o600 for n in left)


def test_the_page_draws_the_lead_built_ahead(env):
    """A lead in the lead store (built by the precompute thread) is what the page shows, without
    building it again: a marked reason put there appears in the lead box."""
    from dashboard import precompute as pc
    from dashboard.components import lead as lead_ui
    from engine.trust.reasons import Reason

    at = _case(env)
    before = [t for t in _texts(at) if "Planted marker reason" in t]
    assert not before
    leads = pc.lead_store(env["src"].file_sha256, env["spec"], None, env["bundle"].sha256)
    built = lead_ui.build_lead(env["bundle"], env["frame"], env["query"], dict(_stored(env)))
    r0 = Reason(kind="marker", text="Planted marker reason", transaction_ids=[], fields=[], weight=float("nan"))
    leads.put(env["query"], lead_ui.Lead(logit=built.logit, reasons=[r0], evidence=built.evidence,
                                         agreement=built.agreement, rows=built.rows))
    import streamlit as st

    st.cache_data.clear()
    at2 = _case(env)
    assert any("Planted marker reason" in t for t in _texts(at2))


def test_only_card_fields_are_masked_and_edits_show_time_and_amount(env):
    import pandas as pd

    from dashboard.components.masking import edits_table

    df = pd.DataFrame({"merchant": ["3527213246127876953"], "card_number": ["4111111111111111"],
                       "mcc": ["5300"]})
    from engine.cases.redact import luhn_valid

    out = cv.mask_card_fields(df)
    assert out["merchant"].iloc[0] == "3527213246127876953"  # a merchant id that fails the Luhn check
    assert out["card_number"].iloc[0] == "411111******1111"  # a PAN-like card value is masked
    # the case page's tables: a demo merchant id is shown in full unless it could be a card number
    tl = cv.entity_timeline(env["frame"], env["scores"], env["entity"], 0.5, "USD")
    merch = [c for c in tl.columns if "merchant" in c.lower()]
    raw = env["frame"].loc[env["frame"].entity_id == env["entity"]].sort_values("timestamp", kind="stable")[
        merch[0]].astype(str).to_numpy()
    shown = tl[merch[0]].astype(str).to_numpy()
    assert merch and [a == b for a, b in zip(shown, raw)] == [not luhn_valid(r) for r in raw]
    assert any(a == b for a, b in zip(shown, raw))  # most are whole

    class L:  # what edits_table reads of dashboard.state.Loaded
        source = env["src"]

    fr = env["frame"]
    row = fr.loc[fr.entity_id == env["entity"]].iloc[2]
    edits = [{"op": "remove", "transaction_id": str(row["transaction_id"]), "values": {}},
             {"op": "change", "transaction_id": str(row["transaction_id"]), "values": {"amount": 12.5}}]
    t = edits_table(L, edits)
    assert t.columns.tolist() == ["edit", "time", "amount", "transaction", "values"]
    assert t["time"].iloc[0] == pd.Timestamp(row["timestamp"]).tz_localize("UTC") or \
        t["time"].iloc[0] == pd.Timestamp(row["timestamp"])
    assert t["amount"].tolist() == [float(row["amount"]), 12.5]
    # a transaction id is shown as every table shows ids (the review: the raw id went to the browser)
    t = edits_table(L, [{"op": "remove", "transaction_id": "4111111111111111", "values": {}}])
    assert t["transaction"].tolist() == ["411111******1111"]


def test_attention_is_the_query_row_and_the_full_map_is_optional(env):
    import base64
    import json

    from engine.cases import figures as fig

    at = _case(env)
    assert "attn_row" not in {c.key for c in at.get("plotly_chart")}  # lazy tabs: Attributions is open
    at.session_state["case_tabs"] = "Attention"
    at.run()
    charts = {c.key: json.loads(c.proto.spec) for c in at.get("plotly_chart")}
    assert "attn_row" in charts and "attn_heat" not in charts  # the T x T map only on request
    y = charts["attn_row"]["data"][0]["y"]
    if isinstance(y, dict):
        y = np.frombuffer(base64.b64decode(y["bdata"]), dtype=np.dtype(y["dtype"]))
    expls = _stored(env)
    a = expls["attention"]
    L, _ = fig.attention_shape(a)
    want = np.asarray(fig.attention_matrix(a, L - 1, None), dtype=float)[-1, :-1]
    np.testing.assert_allclose(np.asarray(y, dtype=float), want, rtol=1e-6, atol=1e-9)
    assert len(want) == len(a.transaction_ids) - 1
    at.toggle(key="attn_full").set_value(True).run()
    assert "attn_heat" in {c.key for c in at.get("plotly_chart")}


def test_field_references_have_no_question_mark_and_merchants_in_full(env):
    from engine.cases.fields_view import field_figure, query_fields

    got = query_fields(env["bundle"], env["frame"], env["query"], cells=False)
    fa = got["field_attribution"]
    assert "amount_vs_history" in fa["field_names"]
    assert fa["reference"]["amount_vs_history"] not in ("", "?")
    row = env["frame"].iloc[0]
    v = cv.field_value_texts(row, ["amount_vs_history", "merchant", "no_such_field"], "USD")
    assert v[0].endswith(" vs earlier") and v[2] == "—" and "?" not in v
    from engine.cases.redact import luhn_valid

    assert v[1] == cv.mask_field_value("merchant", str(row["merchant"])[:24]) or v[1].endswith("…")
    assert ("*" in v[1]) == luhn_valid(str(row["merchant"]))  # masked only when it could be a card number
    names = list(field_figure(got).data[0].y)
    assert not any("(typical: ?)" in n for n in names), names
    merch = [k for k in fa["reference"] if "merchant" in k.lower()]
    import re

    for k in merch:  # a merchant reference never shows a run that could be a card number (Luhn-valid)
        assert not any(luhn_valid(m) for m in re.findall(r"\d{13,19}", fa["reference"][k])), fa["reference"][k]


def test_precompute_starts_with_the_transaction_the_case_page_opens_first():
    """The page opens the top-ranked entity on its highest-scored transaction, the LATEST one on
    ties (cv.default_query); the precompute must explain exactly that one first, flagged or not."""
    import pandas as pd

    from dashboard import precompute as pc

    ts = pd.date_range("2024-01-01", periods=5, freq="h")
    scores = pd.DataFrame({"entity_id": ["e1", "e1", "e1", "e2", "e2"],
                           "transaction_id": ["a1", "a2", "a3", "b1", "b2"],
                           "probability": [0.9, 0.5, 0.9, 0.3, 0.7], "timestamp": ts})
    scores["flagged"] = scores["probability"] >= 0.6
    ranking = cv.rank_entities(scores, 0.6)
    top = ranking["entity_id"].iloc[0]
    opened = cv.default_query(scores[scores["entity_id"] == top].reset_index(drop=True))
    assert opened == "a3"  # the tie goes to the latest
    order = pc.flagged_order(scores, ranking)
    assert order == ["a3", "b2", "a1"]  # each case's opening transaction, most risky case first, then the rest
    assert pc.flagged_order(scores) == order  # without a ranking: by highest probability
    # nothing flagged: still the opening transactions of the first entities of the page's order
    none = scores.assign(flagged=False)
    assert pc.flagged_order(none, cv.rank_entities(none, 0.99)) == ["a3", "b2"]
    assert pc.flagged_order(none, cv.rank_entities(none, 0.99), open_ahead=1) == ["a3"]
    # an entity below the threshold is opened ahead of the other flagged transactions
    low = scores.assign(flagged=scores["transaction_id"].isin(["a1", "a3"]))
    assert pc.flagged_order(low, cv.rank_entities(low, 0.8)) == ["a3", "b2", "a1"]
    assert pc.flagged_order(low, cv.rank_entities(low, 0.8), open_ahead=1) == ["a3", "a1"]


def test_the_pause_after_the_reasons_box_reads_its_environment_variable(monkeypatch):
    from dashboard import timing as state

    assert state.lead_pause_s() == 0.0  # the test suite's setting (tests/conftest.py)
    for raw, want in [("0.25", 0.25), ("5", 1.0), ("-1", 0.0), ("nan", state.LEAD_PAUSE_S_DEFAULT),
                      ("soon", state.LEAD_PAUSE_S_DEFAULT)]:
        monkeypatch.setenv("FRAUDLENS_LEAD_PAUSE_S", raw)
        assert state.lead_pause_s() == want, raw
    monkeypatch.delenv("FRAUDLENS_LEAD_PAUSE_S")
    assert state.lead_pause_s() == state.LEAD_PAUSE_S_DEFAULT == 0.1


def test_evidence_sentence_tells_the_two_numbers_apart_and_says_what_the_flag_does():
    """'would be 0.00 (now 0.00)' and 'would be 1.00 (now 1.00)' said nothing (new-user trial)."""
    from types import SimpleNamespace as NS

    from dashboard.components.lead import evidence_sentence

    ev = NS(transaction_ids=["a", "b"], output_without=0.0000412, output_with=0.000231)
    s = evidence_sentence(ev, "probability", 0.989)
    assert "would be 0.000041 (now 0.000231)" in s and "(review threshold 0.989: not flagged either way)" in s
    ev = NS(transaction_ids=["a"], output_without=0.99712, output_with=0.99994)
    s = evidence_sentence(ev, "probability", 0.5)
    assert "this earlier transaction" in s and "would be 0.997 (now 1.000)" in s and "would still be flagged" in s
    ev = NS(transaction_ids=["a", "b", "c"], output_without=0.12, output_with=0.91)
    assert evidence_sentence(ev, "score", 0.5).endswith("would be 0.12 (now 0.91): below the review threshold "
                                                       "0.500, so it would not be flagged.")
    assert evidence_sentence(ev, "score") == "Without these 3 earlier transactions the score would be 0.12 (now 0.91)."
    # review findings: removing them raises the score above the threshold; NaN; a tiny number
    ev = NS(transaction_ids=["a", "b"], output_without=0.62, output_with=0.40)
    assert evidence_sentence(ev, "score", 0.5).endswith(": at or above the review threshold 0.500, so without them "
                                                        "it would be flagged.")
    ev = NS(transaction_ids=["a"], output_without=float("nan"), output_with=0.4)
    assert "would be nan (now 0.40)" in evidence_sentence(ev, "score")
    ev = NS(transaction_ids=["a"], output_without=1e-9, output_with=0.3)
    assert "would be 1e-09 (now 0.3)" in evidence_sentence(ev, "score")
    ev = NS(transaction_ids=["a"], output_without=0.99999991, output_with=0.99999996)  # analyst trial: "1 (now 1)"
    assert "would be 1.00 (now 1.00)" in evidence_sentence(ev, "probability")


def test_the_lead_heading_says_flagged_only_for_a_flagged_transaction():
    from types import SimpleNamespace as NS

    from dashboard.components.lead import flag_heading

    loaded = NS(threshold=0.5, bundle=NS(calibrated=True))
    assert flag_heading(loaded, 0.9) == "Why it was flagged"
    assert flag_heading(loaded, 0.5) == "Why it was flagged"  # at the threshold: flagged
    assert flag_heading(loaded, 0.0002) == "What drives its probability (not flagged: below the review threshold 0.500)"
    assert flag_heading(loaded, float("nan")).startswith("What drives")


def test_whatif_panel_shows_the_models_output_not_sigmoid(env):
    """Review finding: with a calibrated model the what-if panel showed sigmoid(logit) (0.731)
    beside the calibrated 0.525 of the disposition panel, and its decision used it."""
    from dashboard.components.access import SESSION_KEY
    from engine.serve.access import Identity

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state[SESSION_KEY] = Identity("alice", "analyst", "password")
    at.session_state["entity_id"], at.session_state["query_id"] = env["entity"], env["query"]
    at.session_state["trust_show"] = True
    at.switch_page("pages/case.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    m = {x.label: x.value for x in at.metric}
    q = env["scores"].set_index("transaction_id").loc[env["query"]]
    assert env["bundle"].calibrated
    assert m["Original probability"] == m["Query fraud probability"] == f"{float(q['probability']):.3f}"
    assert m["What-if decision"] == m["Decision"]  # no edit: the page's decision, on the model's output


def test_a_reason_with_its_own_without_value_gets_no_second_one(env):
    """Analyst trial: "... without them the fraud score would be 0.87 (now 1.00) (+9.93 logit:
    probability 0.08 → 1.00)": two "without" values in one sentence (the measured deletion, and the
    additive reading of a weight that also counts the query's fields)."""
    from types import SimpleNamespace

    from dashboard.components.lead import reason_reading

    loaded = SimpleNamespace(bundle=env["bundle"])
    pattern = SimpleNamespace(weight=9.93, numbers={"probability_without": 0.87, "probability_with": 1.0})
    plain = SimpleNamespace(weight=0.8, numbers={"n_transactions": 6})
    assert reason_reading(loaded, 3.0, pattern) == " · weight +9.93 logit"
    assert reason_reading(loaded, 3.0, plain).startswith(" · +0.80 logit: probability ")  # calibrated: probability
    assert reason_reading(loaded, 3.0, SimpleNamespace(weight=float("nan"), numbers={})) == ""
