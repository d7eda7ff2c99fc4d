"""Dashboard pages through Streamlit's AppTest: each page renders; picking an entity and a
transaction shows the explanation views. A tiny untrained model and a slice of the demo data
are written to a temp folder and passed through the FRAUDLENS_* environment variables."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from dashboard.components.safe import md
from engine.cases import view as cv
from engine.serve import access as ac
from tiny_models import demo_slice, tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "dashboard" / "app.py")
TIMEOUT = 60
#: the users of the test credentials file (all with PASSWORD)
USERS = {"alice": "analyst", "bob": "supervisor", "carol": "analyst", "erin": "auditor", "dana": "admin"}
PASSWORD = "correct horse battery staple"
#: timeline, IG/SHAP/occlusion bars, validated query field bars, cell-level bars, IG field heat map (expander),
#: attention, rollout: over all four tabs of the Case page
N_CASE_CHARTS = 9
#: the charts drawn per open tab (lazy tabs: only the open one runs), besides the timeline
TAB_CHARTS = {"Attributions": {"bars_integrated_gradients", "bars_shap", "bars_occlusion"},
              "Fields": {"fields_query_validated", "fields_cells", "fields_ig"},
              "Attention": {"attn_row", "attn_rollout_row"}}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("dash")
    data = demo_slice(d / "tx.csv", 1500)
    spec = cv.demo_spec_name()
    src = cv.load_source(data, spec)
    tiny_checkpoint(src.frame, src.spec, d / "model",
                    {"name": "tiny-dash", "thresholds": {"review": 0.5, "decline": 0.8},
                     "metrics": {"validation": {"n": 100, "n_fraud": 3, "auc_roc": 0.6, "average_precision": 0.1}},
                     "history": [{"epoch": 1, "loss": 0.9, "val_average_precision": 0.1}]})
    bundle = cv.load_model(d / "model")
    scores = cv.score_source(bundle, src.frame)
    ranking = cv.rank_entities(scores, bundle.threshold)
    return {"data": data, "spec": spec, "model": d / "model", "bundle": bundle, "scores": scores,
            "ranking": ranking, "frame": src.frame}


@pytest.fixture(scope="session")
def users_file(tmp_path_factory):
    """A credentials file with :data:`USERS` (argon2 hashes of :data:`PASSWORD`)."""
    p = tmp_path_factory.mktemp("users") / "users.toml"
    for name, role in USERS.items():
        ac.add_user(p, name, role, PASSWORD)
    return p


def signed_in(user: str | None = "alice") -> AppTest:
    """An AppTest of the app whose session is signed in as ``user`` (as the sign-in form does)."""
    from dashboard.components.access import SESSION_KEY

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    if user is not None:
        at.session_state[SESSION_KEY] = ac.Identity(user, USERS[user], "password")
    return at


@pytest.fixture
def env(world, monkeypatch, users_file, tmp_path):
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "store"))  # never the user's real case store
    monkeypatch.setenv("FRAUDLENS_USERS", str(users_file))
    monkeypatch.delenv("FRAUDLENS_DEMO", raising=False)
    monkeypatch.delenv("FRAUDLENS_DATA_ROOTS", raising=False)
    monkeypatch.setenv("FRAUDLENS_DATA", str(world["data"]))
    monkeypatch.setenv("FRAUDLENS_SPEC", world["spec"])
    monkeypatch.setenv("FRAUDLENS_MODEL", str(world["model"]))
    monkeypatch.delenv("FRAUDLENS_MAX_ROWS", raising=False)
    return world


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def _charts(at: AppTest) -> list:
    return at.get("plotly_chart")


def _open_tab(at: AppTest, label: str) -> AppTest:
    """Open the Case page's tab ``label`` (lazy tabs, key ``case_tabs``: what a click does) and rerun."""
    at.session_state["case_tabs"] = label
    at.run()
    _ok(at)
    return at


def _charts_of_every_tab(at: AppTest) -> list[str]:
    """Keys of the charts drawn with each tab open in turn (then the first tab again); checks that
    a closed tab draws nothing of its own."""
    keys: list[str] = []
    for label in ["Attributions", "Fields", "Attention", "Context rows"]:
        _open_tab(at, label)
        drawn = {c.key for c in _charts(at)}
        for other, own in TAB_CHARTS.items():
            if other != label:
                assert not drawn & own, (label, drawn & own)
        keys += [k for k in drawn if k not in keys]
    _open_tab(at, "Attributions")
    return keys


def _case(env, entity: str | None = None) -> AppTest:
    at = signed_in()
    if entity is not None:
        at.session_state["entity_id"] = entity
    at.switch_page("pages/case.py")
    at.run()
    return at


def test_cases_page_lists_ranked_entities(env):
    at = signed_in()
    at.run()
    _ok(at)
    assert at.title[0].value == "Open a case from data"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Transactions scored"] == f"{len(env['scores']):,}"
    assert metrics["Entities"] == f"{len(env['ranking']):,}"
    assert metrics["Flagged transactions"] == f"{int(env['scores']['flagged'].sum()):,}"
    table = at.dataframe[0].value
    assert "entity_id" not in table  # only the shown columns are sent: the raw id may be a card number
    assert table["entity"].tolist() == [cv.mask(e) for e in env["ranking"]["entity_id"]]
    assert table["max_probability"].is_monotonic_decreasing
    assert at.session_state["source"]["path"] == str(env["data"])
    assert at.session_state["model_path"] == str(env["model"])


def test_cases_page_with_a_selected_entity_offers_to_open_it(env):
    ent = env["ranking"]["entity_id"].iloc[1]
    at = signed_in()
    at.session_state["entity_id"] = ent
    at.run()
    _ok(at)
    assert any(md(ent) in m.value and "Selected" in m.value for m in at.markdown)  # escaped: shown as text
    at.button(key="open_case").click().run()  # st.switch_page: AppTest does not follow it
    _ok(at)
    at.switch_page("pages/case.py").run()
    _ok(at)
    assert at.title[0].value == f"Case {md(cv.mask(ent))}"  # escaped: shown as the literal id
    assert at.session_state["entity_id"] == ent


def test_choosing_another_file_and_spec_on_cases_reloads(env, tmp_path, monkeypatch):
    monkeypatch.setenv("FRAUDLENS_DATA_ROOTS", str(tmp_path))
    small = tmp_path / "small.csv"
    with open(env["data"], encoding="utf-8") as f:
        small.write_text("".join(next(f) for _ in range(301)), encoding="utf-8")
    at = signed_in()
    at.session_state["entity_id"] = env["ranking"]["entity_id"].iloc[0]
    at.run()
    _ok(at)
    at.radio(key="src_kind").set_value("path").run()
    at.selectbox(key="src_path").select(str(small.resolve())).run()
    at.selectbox(key="src_spec").select(env["spec"]).run()
    at.button(key="src_apply").click().run()
    _ok(at)
    assert at.session_state["source"]["path"] == str(small)
    assert at.session_state["entity_id"] is None  # a new source closes the open case
    assert {m.label: m.value for m in at.metric}["Transactions scored"] == "300"


def test_a_spec_file_edited_in_place_is_read_again(env, tmp_path, monkeypatch):
    """Every cache is keyed by the spec file's content (state.spec_ref), not by its path only: an
    edit made while the server runs is read at the next rerun (it was served stale until restart)."""
    import os

    from engine.data.spec import load_spec

    monkeypatch.setenv("FRAUDLENS_DATA_ROOTS", str(tmp_path))
    text = load_spec(env["spec"]).to_toml()
    spec = tmp_path / "mine.toml"
    spec.write_text(text, encoding="utf-8")
    data = tmp_path / "tx.csv"
    data.write_bytes(Path(env["data"]).read_bytes())
    at = signed_in()
    at.run()
    at.radio(key="src_kind").set_value("path").run()
    at.selectbox(key="src_path").select(str(data.resolve())).run()
    at.selectbox(key="src_spec").select(str(spec.resolve())).run()
    at.button(key="src_apply").click().run()
    _ok(at)
    by_card = {m.label: m.value for m in at.metric}["Entities"]
    frame = env["frame"]
    assert by_card == f"{frame['entity_id'].nunique():,}"
    one_col = text.replace('columns = ["User", "Card"]', 'columns = ["User"]')
    assert one_col != text
    spec.write_text(one_col, encoding="utf-8")
    st_ = spec.stat()
    os.utime(spec, ns=(st_.st_atime_ns, st_.st_mtime_ns + 5_000_000_000))
    at.run()
    _ok(at)
    users = frame["entity_id"].astype(str).str.split(":").str[0].nunique()
    assert users < frame["entity_id"].nunique()
    assert {m.label: m.value for m in at.metric}["Entities"] == f"{users:,}"


def test_case_page_defaults_to_top_entity_and_its_highest_scored_transaction(env):
    at = _case(env)
    _ok(at)
    top = env["ranking"]["entity_id"].iloc[0]
    assert at.session_state["entity_id"] == top
    s = env["scores"][env["scores"]["entity_id"] == top]
    best = s.loc[s["probability"].idxmax(), "transaction_id"]
    assert at.session_state["query_id"] == best
    assert at.subheader[1].value.startswith(f"Transaction {cv.mask(best)} · ")
    metrics = {m.label: m.value for m in at.metric}
    w = "probability" if env["bundle"].calibrated else "score"  # the words rule
    assert metrics[f"Fraud {w}"] == f"{s['probability'].max():.3f}"
    assert metrics["Review threshold"] == "0.500"
    assert [t.label for t in at.tabs] == ["Attributions", "Fields", "Attention", "Context rows"]
    drawn = {c.key for c in _charts(at)}  # the first tab open: its bars and the timeline only
    assert drawn - TAB_CHARTS["Attributions"] == {next(k for k in drawn if k.startswith("tl_"))}
    assert TAB_CHARTS["Attributions"] <= drawn
    assert len(_charts_of_every_tab(at)) == N_CASE_CHARTS
    # the query alone vs with its history: the sentence and its numbers, equal to the engine's
    from engine.cases.fields_view import history_caption, query_fields

    h = query_fields(env["bundle"], env["frame"], best, cells=False)["history_effect"]
    boxes = [b.value for b in [*at.info, *at.warning]]
    assert md(h["sentence"]) in boxes
    assert md(history_caption({"history_effect": h})) in [c.value for c in at.caption]
    assert ("own fields drive" in h["sentence"]) == (h["alone"] >= 0.5)
    # the query's fields (Fields tab): what is shown says which values passed the check against field ablation
    _open_tab(at, "Fields")
    assert any("typical value" in c.value or "Integrated gradients of the query" in c.value for c in at.caption)


def test_choosing_an_entity_and_a_transaction_shows_its_explanations(env):
    r, scores = env["ranking"], env["scores"]
    ent = r["entity_id"].iloc[2]
    at = _case(env, ent)
    _ok(at)
    assert at.title[0].value == f"Case {md(cv.mask(ent))}"  # escaped: shown as the literal id
    # pick a transaction with history from the flagged-transactions picker
    s = scores[scores["entity_id"] == ent].sort_values("timestamp")
    options = at.selectbox(key="case_query_pick").options
    assert len(options) >= 2
    other = s.iloc[8:].sort_values("probability", ascending=False)["transaction_id"]
    other = next(t for t in other if t != at.session_state["query_id"])
    at.session_state["query_id"] = other  # what the table / chart / picker callbacks store
    at.run()
    _ok(at)
    assert at.session_state["query_id"] == other
    head = at.subheader[1].value
    assert head.startswith(f"Transaction {cv.mask(other)} · ")
    metrics = {m.label: m.value for m in at.metric}
    p = float(s.loc[s["transaction_id"] == other, "probability"].iloc[0])
    assert metrics["Fraud probability" if env["bundle"].calibrated else "Fraud score"] == f"{p:.3f}"
    # the one band rule (checkpoint thresholds 0.5 / 0.8), as the disposition panel and the export
    assert metrics["Decision"] == cv.BAND_LABELS[cv.decision_band(p, 0.5, 0.8)]
    assert metrics["Decision band"] == metrics["Decision"]
    # 4 decimals, or a tiny non-zero gap in scientific notation (never "+0.0000")
    assert re.fullmatch(r"[+-]\d\.\d{4}|[+-]\d\.\de[+-]\d\d|0\.0000", metrics["IG gap"])
    assert metrics["IG gap"] not in ("+0.0000", "-0.0000")
    assert int(metrics["Context"]) > 5
    assert len(_charts_of_every_tab(at)) == N_CASE_CHARTS
    # the context table has the query last, with its attributions
    _open_tab(at, "Context rows")
    ctx = at.dataframe[-1].value
    assert ctx["query"].tolist()[-1] and not any(ctx["query"].tolist()[:-1])
    assert {"IG (logit)", "SHAP (logit)", "occlusion (logit)"} <= set(ctx.columns)


def test_the_flagged_picker_changes_the_query(env):
    ent = env["ranking"]["entity_id"].iloc[0]
    at = _case(env, ent)
    _ok(at)
    tl = cv.entity_timeline(env["frame"], env["scores"], ent, env["bundle"].threshold, "USD")
    current = at.session_state["query_id"]
    options = cv.query_options(tl, current)
    assert len(at.selectbox(key="case_query_pick").options) == len(options)
    target = next(o for o in options if o != current)
    at.selectbox(key="case_query_pick").select(target).run()
    _ok(at)
    assert at.session_state["query_id"] == target
    assert at.subheader[1].value.startswith(f"Transaction {cv.mask(target)} · ")
    assert len(_charts_of_every_tab(at)) == N_CASE_CHARTS


def test_attention_layer_and_head_are_selectable(env):
    at = _case(env)
    _ok(at)
    _open_tab(at, "Attention")
    at.selectbox(key="attn_layer").select(0).run()
    at.selectbox(key="attn_head").select(1).run()
    _ok(at)
    assert {c.key for c in _charts(at)} >= TAB_CHARTS["Attention"]


def test_model_page_shows_the_model_card(env):
    at = signed_in()
    at.switch_page("pages/model.py")
    at.run()
    _ok(at)
    assert at.title[0].value == "Model " + md("tiny-dash")  # escaped: shown as the literal name
    assert any(env["bundle"].sha256 in c.value for c in at.caption)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Review threshold"] == "0.500" and metrics["Decline threshold"] == "0.800"
    assert "history" in {c.key for c in _charts(at)}  # training history (the at-a-glance figures: test_model_page.py)
    assert any("[entity]" in c.value for c in at.code)


def test_a_missing_model_is_reported_not_raised(env, monkeypatch, tmp_path):
    monkeypatch.setenv("FRAUDLENS_MODEL", str(tmp_path / "no-model"))
    for page in ("pages/cases.py", "pages/case.py", "pages/model.py"):
        at = signed_in()
        at.switch_page(page)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert at.error and "not found" in at.error[0].value


def test_launch_arguments_win_over_environment():
    from dashboard.state import parse_settings

    env = {"FRAUDLENS_DATA": "env.csv", "FRAUDLENS_SPEC": "tabformer", "FRAUDLENS_MODEL": "envmodel",
           "FRAUDLENS_MAX_ROWS": "10"}
    s = parse_settings(["--data", "a.csv", "--model", "m"], env)
    assert (s.data, s.spec, s.model, s.max_rows) == ("a.csv", "tabformer", "m", 10)
    s = parse_settings([], {})
    assert (s.data, s.spec, s.model, s.max_rows) == (None, None, None, None)
    s = parse_settings(["-q", "tests/x.py", "--max-rows", "5"], {})  # unknown args are ignored
    assert s.max_rows == 5


def test_dashboard_never_imports_torch():
    for p in (ROOT / "dashboard").rglob("*.py"):
        text = p.read_text()
        assert not re.search(r"^\s*(import|from)\s+torch\b", text, re.M), p
        assert "engine.model" not in text, p


def _selection_script():
    import streamlit as st

    from dashboard import state

    ss = st.session_state
    ids = ["t0", "t1", "t2"]
    ss["entity_id"], ss["query_id"] = "e0", "t0"
    # the ranking table's row 1 -> entity e1 (and the query is reset)
    ss["rank"] = {"selection": {"rows": [1], "columns": []}}
    state.on_entity_table_select("rank", ["e0", "e1"])
    st.text(f"entity={ss['entity_id']} query={ss['query_id']}")
    # a transaction-table row -> its id, out of range / empty -> unchanged
    ss["tx"] = {"selection": {"rows": [2]}}
    state.on_query_table_select("tx", ids)
    ss["tx_bad"] = {"selection": {"rows": [7]}}
    state.on_query_table_select("tx_bad", ids)
    ss["tx_none"] = {"selection": {"rows": []}}
    state.on_query_table_select("tx_none", ids)
    st.text(f"table={ss['query_id']}")
    # a chart point carries its row position in customdata[0]
    ss["chart"] = {"selection": {"points": [{"customdata": [1, "$5.00", 0.4]}], "point_indices": [1]}}
    state.on_query_chart_select("chart", ids)
    st.text(f"chart={ss['query_id']}")
    state.on_query_chart_select("missing-key", ids)
    st.text(f"after-missing={ss['query_id']}")


def test_selection_callbacks_turn_positions_into_ids():
    at = AppTest.from_function(_selection_script, default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.text] == ["entity=e1 query=None", "table=t2", "chart=t1", "after-missing=t1"]


def _tx_table(at: AppTest):
    return next(d for d in at.dataframe if d.key and d.key.startswith("tx_"))


def test_the_transaction_table_is_a_plain_frame_with_the_query_selected(env):
    """No pandas Styler on the transaction table (styling every cell cost ~3 s of CPU per page run
    on a 9,391-transaction card); the query is shown as the table's selected row."""
    import json

    at = _case(env)
    _ok(at)
    tx = _tx_table(at)
    ent, q = at.session_state["entity_id"], at.session_state["query_id"]
    tl = cv.entity_timeline(env["frame"], env["scores"], ent, env["bundle"].threshold, "USD")
    assert len(tx.value) == len(tl) == int((env["scores"]["entity_id"] == ent).sum())
    assert tx.proto.arrow_data.styler.styles == "" and not tx.proto.arrow_data.styler.uuid
    rows = json.loads(tx.proto.selection_default)["selection"]["rows"]
    assert [tl["transaction_id"].iloc[r] for r in rows] == [q]


def test_the_table_sort_survives_a_row_selection_and_the_selected_row_is_explained(env):
    """Issue 15 §8: a row selection reruns the page; the chosen order stays, the table (its widget
    key, hence the browser's own column sort) stays, and the query is the clicked row's id."""
    import json

    from engine.cases import timeline_table as tt

    at = _case(env)
    _ok(at)
    ent = at.session_state["entity_id"]
    tl = cv.entity_timeline(env["frame"], env["scores"], ent, env["bundle"].threshold, "USD")
    at.selectbox(key="tx_sort_pick").select("amount").run()
    _ok(at)
    assert at.session_state["tx_sort"] == "amount"
    tx = _tx_table(at)
    key = tx.key
    by_amount = tt.sort_timeline(tl, "amount")
    assert tx.value["amount"].tolist() == by_amount["amount"].tolist()  # drawn in the chosen order
    assert tx.value["amount"].is_monotonic_decreasing
    q0 = at.session_state["query_id"]
    assert json.loads(tx.proto.selection_default)["selection"]["rows"] == [by_amount["transaction_id"].tolist().index(q0)]
    # the analyst clicks row 3 of the table as shown (amount order): that transaction is explained
    clicked = by_amount["transaction_id"].iloc[3]
    assert clicked != q0
    at.session_state[key] = {"selection": {"rows": [3], "columns": []}}
    at.run()
    _ok(at)
    assert at.session_state["query_id"] == clicked  # not tl (time order) row 3
    assert at.subheader[1].value.startswith(f"Transaction {md(cv.mask(clicked))} · ")
    assert at.session_state["tx_sort"] == "amount" and at.selectbox(key="tx_sort_pick").value == "amount"
    tx2 = _tx_table(at)
    assert tx2.key == key  # the same table: a sort made in the browser is kept too
    assert tx2.value.equals(tx.value)  # the same data
    assert tx2.proto.selection_default == tx.proto.selection_default  # the element is unchanged
    # a query chosen elsewhere (the flagged picker) redraws the table with that row selected, order kept
    other = next(o for o in cv.query_options(tl, clicked) if o != clicked)
    at.selectbox(key="case_query_pick").select(other).run()
    _ok(at)
    tx3 = _tx_table(at)
    assert at.session_state["query_id"] == other and tx3.key != key
    assert tx3.value["amount"].tolist() == by_amount["amount"].tolist()
    assert json.loads(tx3.proto.selection_default)["selection"]["rows"] == [by_amount["transaction_id"].tolist().index(other)]
    # an unknown sort in session state falls back to time order, never an error
    at.session_state["tx_sort"] = "nonsense"
    at.run()
    _ok(at)
    assert _tx_table(at).value["amount"].tolist() == tl["amount"].tolist()


def test_long_timeline_draws_the_window_around_the_query_and_show_all_draws_every_one(env, monkeypatch):
    import json

    top = env["ranking"]["entity_id"].iloc[0]
    n = int((env["scores"]["entity_id"] == top).sum())
    assert n > 12, "the top entity of the slice needs more transactions than the window"
    from engine.cases import timeline_table as tt

    monkeypatch.setattr(tt, "TIMELINE_MAX_POINTS", 12)
    at = _case(env)
    _ok(at)

    def timeline_points(at):
        chart = next(c for c in at.get("plotly_chart") if c.key.startswith("tl_"))
        return len(json.loads(chart.proto.spec)["data"][0]["x"])

    assert timeline_points(at) == 12
    caps = [c.value for c in at.caption]
    assert any(c.startswith(md(f"Drawn: the 12 of {n:,} transactions around the explained one")) for c in caps), caps
    at.toggle(key="tl_all").set_value(True).run()
    _ok(at)
    assert timeline_points(at) == n
    assert f"All {n:,} transactions drawn." in [c.value for c in at.caption]


def test_the_case_page_reads_the_fields_view_the_precompute_stored(env):
    """The history-effect box comes from the explanation cache when the precompute stored it
    (a stored sentence that differs from a fresh computation shows that it is the one read)."""
    from dashboard.components import fields as fields_ui
    from engine.cases.explain_cache import FIELDS_KIND, ExplanationCache
    from engine.cases.fields_view import query_fields
    from engine.cases.store import default_db_path, source_id

    fields_ui._fields.clear()  # the in-memory cache of earlier tests' pages (same data, model, transaction)

    top = env["ranking"]["entity_id"].iloc[0]
    s = env["scores"][env["scores"]["entity_id"] == top]
    best = str(s.loc[s["probability"].idxmax(), "transaction_id"])
    src = cv.load_source(env["data"], env["spec"])
    stored = query_fields(env["bundle"], env["frame"], best, currency=src.currency)
    stored["history_effect"]["sentence"] = "Stored by the precompute for this test"
    cache = ExplanationCache(default_db_path().parent / "explanations.sqlite")
    sid = source_id(src.file_sha256, src.spec.name)
    cache.put_json(env["bundle"].sha256, sid, best, {"max_rows": None}, FIELDS_KIND, stored)
    at = _case(env)
    _ok(at)
    assert at.session_state["query_id"] == best
    assert md("Stored by the precompute for this test") in [b.value for b in [*at.info, *at.warning]]


def test_a_file_without_the_label_column_opens_on_every_page(env, monkeypatch, tmp_path):
    """A production file has no label yet: Cases, Case (every tab) and Model open without an
    error, with the same top entity as the labelled file."""
    bare = tmp_path / "bare.csv"
    pd.read_csv(env["data"], dtype=str, keep_default_na=False).drop(columns=["Is Fraud?"]).to_csv(bare, index=False)
    monkeypatch.setenv("FRAUDLENS_DATA", str(bare))
    at = _case(env)
    _ok(at)
    assert at.session_state["entity_id"] == env["ranking"]["entity_id"].iloc[0]
    assert len(_charts_of_every_tab(at)) == N_CASE_CHARTS
    at.switch_page("pages/cases.py").run()
    _ok(at)
    at.switch_page("pages/model.py").run()
    _ok(at)
