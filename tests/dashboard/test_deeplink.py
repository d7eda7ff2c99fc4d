"""The case in the address bar (dashboard/components/deeplink.py) through AppTest: a reload (a new
session) opens the same case and transaction after sign-in, not the highest-ranked entity; an
address naming a case this session cannot open says so and opens the default."""

from __future__ import annotations

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from engine.cases.store import CaseStore, source_id
from test_case_lead import APP, TIMEOUT, env, world  # noqa: F401 - the shared fixtures

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _session(entity=None, query=None, params=None) -> AppTest:
    """A new session (as after a reload), signed in as alice, on the Case page."""
    from dashboard.components.access import SESSION_KEY
    from engine.serve.access import Identity

    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state[SESSION_KEY] = Identity("alice", "analyst", "password")
    if entity is not None:
        at.session_state["entity_id"] = entity
    if query is not None:
        at.session_state["query_id"] = query
    at.query_params.update(params or {})
    at.switch_page("pages/case.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _other(env) -> tuple[str, str]:  # noqa: F811
    """An entity that is not the highest-ranked one (the default) and one of its later transactions."""
    s = env["scores"]
    top = s.groupby("entity_id")["probability"].max().sort_values(ascending=False)
    entity = str(top.index[min(3, len(top) - 1)])
    tx = s.loc[s["entity_id"] == entity, "transaction_id"].astype(str).tolist()
    return entity, tx[len(tx) // 2]


def test_a_reload_reopens_the_case_and_transaction_in_the_address(env):  # noqa: F811
    entity, tx = _other(env)
    first = _session(entity, tx)
    assert first.session_state["query_id"] == tx
    params = dict(first.query_params)
    assert set(params) == {"case", "tx"} and params["tx"] == tx
    with CaseStore(env["store"] / "cases.sqlite3") as s:
        case = s.get_case(int(params["case"]))
    assert case["entity_id"] == entity  # the address carries the case number, never the entity id

    # the reload: a new session with nothing in it but the address
    again = _session(params=params)
    assert again.session_state["entity_id"] == entity and again.session_state["query_id"] == tx
    fresh = _session()  # without the address: the default (highest-ranked) entity
    assert fresh.session_state["entity_id"] != entity


@pytest.mark.parametrize("case, words", [("abc", "not a case number"), ("999999", "not in the case store"),
                                         ("100000000000000000000", "not a case number"),  # crashed the page
                                         ("1_0", "not a case number"), ("\u0661", "not a case number"),
                                         ("other", "another data file or model")])
def test_an_address_this_session_cannot_open_says_so(env, case, words):  # noqa: F811
    first = _session()  # creates the cases of the loaded source
    default = first.session_state["entity_id"]
    if case == "other":  # a case of another file under the same model
        with CaseStore(env["store"] / "cases.sqlite3") as s:
            s.upsert_cases(env["bundle"].sha256, pd.DataFrame([{
                "entity_id": "elsewhere", "max_probability": 0.9, "max_transaction_id": "t", "first_ts": "2024-01-01",
                "last_ts": "2024-01-02", "max_amount": 1.0, "n_transactions": 1, "n_known_fraud": 0}]),
                source_id=source_id("e" * 64, "demo"))
            case = str(s.find_case(env["bundle"].sha256, source_id("e" * 64, "demo"), "elsewhere")["id"])
    at = _session(params={"case": case})
    assert any(words in w.value for w in at.warning), [w.value for w in at.warning]
    assert at.session_state["entity_id"] == default
