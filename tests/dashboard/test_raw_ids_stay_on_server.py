"""Security review: the Cases and Work queue pages passed whole frames to ``st.dataframe`` and hid
the raw columns with ``column_order``; a hidden column still travels to the browser, so the raw
``entity_id`` (a card number) and the raw transaction ids reached it while the visible column was
masked. Only the shown columns may be sent; a selected row must still open its own case (rows are
mapped to ids by position, server-side). A slice of the demo data whose user 0 is
"4111111111111111" (entity "4111111111111111:0") and a tiny model, through AppTest."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dashboard.components.safe import md
from engine.cases import view as cv
from engine.cases.store import CaseStore
from test_app import _ok, signed_in, users_file  # noqa: F401 - users_file: a fixture
from tiny_models import demo_slice, tiny_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

CARD = "4111111111111111"
ENTITY = f"{CARD}:0"
#: as the pages show it: the colon is a separator, so the 17-digit stretch keeps its first 6 / last 4
MASKED = "411111******1111:0"
#: what each page shows (dashboard/pages/cases.py SHOWN, dashboard/pages/queue.py COLS)
CASES_SHOWN = ["entity", "max_probability", "n_transactions", "n_flagged", "known_frauds", "last_seen"]
QUEUE_SHOWN = ["case_id", "priority_label", "entity", "max_probability", "band", "state_label", "assignee_text",
               "age", "sla_text", "amount_text", "n_transactions", "n_known_fraud", "last_seen"]


@pytest.fixture(scope="module")
def card_world(tmp_path_factory):
    d = tmp_path_factory.mktemp("card_ids")
    data = demo_slice(d / "tx.csv", 1500)
    lines = data.read_text(encoding="utf-8").splitlines(keepends=True)
    data.write_text(lines[0] + "".join(CARD + ln[1:] if ln.startswith("0,") else ln for ln in lines[1:]),
                    encoding="utf-8")
    spec = cv.demo_spec_name()
    src = cv.load_source(data, spec)
    assert ENTITY in set(src.frame["entity_id"])
    tiny_checkpoint(src.frame, src.spec, d / "model", {"name": "tiny-card-ids",
                                                       "thresholds": {"review": 0.5, "decline": 0.8}})
    bundle = cv.load_model(d / "model")
    scores = cv.score_source(bundle, src.frame)
    # a review threshold under the card entity's score: it is flagged, and listed by the queue
    top = float(scores.loc[scores["entity_id"] == ENTITY, "probability"].max())
    review = min(0.5, top * 0.9)
    ranking = cv.rank_entities(scores, review)
    return {"data": data, "spec": spec, "model": d / "model", "bundle": bundle, "ranking": ranking,
            "review": review, "transaction_ids": set(src.frame["transaction_id"].astype(str))}


@pytest.fixture
def cenv(card_world, monkeypatch, users_file, tmp_path):  # noqa: F811
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FRAUDLENS_USERS", str(users_file))
    monkeypatch.delenv("FRAUDLENS_DEMO", raising=False)
    monkeypatch.delenv("FRAUDLENS_DATA_ROOTS", raising=False)
    monkeypatch.delenv("FRAUDLENS_ANALYST", raising=False)
    monkeypatch.delenv("FRAUDLENS_FOUR_EYES", raising=False)
    monkeypatch.delenv("FRAUDLENS_MAX_ROWS", raising=False)
    monkeypatch.setenv("FRAUDLENS_PSEUDONYM_SALT", "test")
    monkeypatch.setenv("FRAUDLENS_DATA", str(card_world["data"]))
    monkeypatch.setenv("FRAUDLENS_SPEC", card_world["spec"])
    monkeypatch.setenv("FRAUDLENS_MODEL", str(card_world["model"]))
    db = tmp_path / "cases.sqlite3"
    with CaseStore(db) as s:
        s.set_thresholds(card_world["bundle"].sha256, card_world["review"], 0.8, actor="bob")
    return {**card_world, "db": db}


def _sent_text(at) -> str:
    """Everything the dataframe elements of the page send: every cell of every column, the column
    names and the index, as text."""
    parts = []
    for d in at.dataframe:
        v = d.value
        assert isinstance(v, pd.DataFrame)
        parts += [str(c) for c in v.columns] + [str(i) for i in v.index]
        parts += [str(x) for c in v.columns for x in v[c].tolist()]
    return "\n".join(parts)


def _assert_no_raw_ids(at, env) -> None:
    sent = _sent_text(at)
    assert CARD not in sent and ENTITY not in sent
    cells = set(sent.split("\n"))
    assert not cells & env["transaction_ids"]  # no raw transaction id (max_/top_transaction_id) either


def _assert_rows_map_to_their_entities(at, table: pd.DataFrame, entities: list[str]) -> None:
    """With each entity open in turn, the Cases table selects the row that shows it masked."""
    assert table["entity"].tolist() == [cv.mask(e) for e in entities]
    for i, e in enumerate(entities):
        at.session_state["entity_id"] = e
        at.run()
        assert json.loads(at.dataframe[0].proto.selection_default)["selection"]["rows"] == [i], (i, e)
        assert at.dataframe[0].value["entity"].iloc[i] == cv.mask(e)
        assert any(m.value.startswith(f"Selected **{md(cv.mask(e))}**") for m in at.markdown)


def test_cases_page_sends_only_the_shown_columns_and_a_row_opens_its_entity(cenv):
    at = signed_in("alice")
    at.run()
    _ok(at)
    table = at.dataframe[0].value
    assert list(table.columns) == CASES_SHOWN
    assert table["entity"].tolist() == [cv.mask(e) for e in cenv["ranking"]["entity_id"]]  # the ranking's order
    assert MASKED in table["entity"].tolist() and cv.mask(ENTITY) == MASKED
    _assert_no_raw_ids(at, cenv)

    # the ids list the selection is mapped with (state.selected_row_id: ids[row]) matches the rows sent, row by
    # row: the page selects the open entity's position in it (AppTest runs no on_select callback)
    _assert_rows_map_to_their_entities(at, table, cenv["ranking"]["entity_id"].tolist())
    _assert_no_raw_ids(at, cenv)

    # filtered ("only flagged"): fewer rows, positions move
    at.toggle(key="only_flagged").set_value(True).run()
    _ok(at)
    flagged = at.dataframe[0].value
    assert list(flagged.columns) == CASES_SHOWN and MASKED in flagged["entity"].tolist()
    assert len(flagged) < len(table)
    _assert_rows_map_to_their_entities(at, flagged, [e for e, n in zip(cenv["ranking"]["entity_id"],
                                                                      cenv["ranking"]["n_flagged"]) if n > 0])
    _assert_no_raw_ids(at, cenv)

    at.session_state["entity_id"] = ENTITY
    at.run()
    at.button(key="open_case").click().run()  # st.switch_page: AppTest does not follow it
    at.switch_page("pages/case.py").run()
    _ok(at)
    assert at.title[0].value == f"Case {md(MASKED)}"


def test_queue_sends_only_the_shown_columns_and_a_ticked_row_opens_its_case(cenv):
    at = signed_in("bob")
    at.switch_page("pages/queue.py")
    at.run()
    at.segmented_control(key="work_view").set_value("open").run()
    _ok(at)
    table = at.dataframe[1].value  # [0]: the threshold quality table
    assert list(table.columns) == QUEUE_SHOWN
    assert MASKED in table["entity"].tolist()
    _assert_no_raw_ids(at, cenv)
    with CaseStore(cenv["db"]) as s:
        q = s.queue(cenv["bundle"].sha256, cenv["review"], order="priority")
        case = q.loc[q["entity_id"] == ENTITY].iloc[0]
    assert table["case_id"].tolist() == q["case_id"].tolist()  # the store's priority order, row by row

    pos = table["entity"].tolist().index(MASKED)
    at.session_state[at.session_state["work_table_key"]] = {"selection": {"rows": [pos], "columns": []}}
    at.run()
    _ok(at)
    assert at.button(key="q_open").label == f"Open case {int(case['case_id'])} →"
    _assert_no_raw_ids(at, cenv)
    at.button(key="q_open").click().run()  # st.switch_page: AppTest does not follow it
    assert at.session_state["entity_id"] == ENTITY
    assert at.session_state["query_id"] == case["max_transaction_id"]
