"""The case on screen in the address bar: ``/case?case=<case id>&tx=<transaction id>``.

A reload (F5) starts a new Streamlit session: the sign-in and everything in the session state
are gone by design (nothing of a signed-in session is kept in the browser). What the analyst was
looking at is kept in the address instead, so after signing in again the same case and the same
explained transaction open, not the highest-ranked entity. A bookmarked or shared address opens
the same case for whoever signs in with a role that views cases.

Only the case *number* and the transaction id go into the address, never the entity id (it may be
a card number); a transaction id that looks like a card number is left out. The case must belong
to the data file and model loaded in the session (its ``source_id`` and ``model_sha256``): else the
page says so and opens nothing from the address.
"""

from __future__ import annotations

import re
from typing import Any

import streamlit as st

from dashboard import components as comp
from dashboard import state
from engine.cases import view as cv
from engine.cases.store import CaseStoreError

CASE_PARAM, TX_PARAM = "case", "tx"
#: session state: the address was read once in this session (later visits follow the session's choices)
RESTORED = "deeplink_restored"


def restore(loaded: Any) -> str | None:
    """Once per session, open the case the address names (entity, and the transaction when it is
    one of the case's). Returns ``None``, or a plain-text message when the address names a case
    this session cannot open (not a number, not in the store, another file's or model's case)."""
    ss = st.session_state
    if ss.get(RESTORED):
        return None
    ss[RESTORED] = True
    raw = st.query_params.get(CASE_PARAM)
    if raw is None:
        return None
    text = str(raw).strip()
    if not re.fullmatch(r"[0-9]{1,18}", text):  # ASCII digits only: no "1_0", no other scripts' digits
        return f"The address names case {text[:20]!r}: not a case number."
    cid = int(text)
    try:
        case = comp.get_store().get_case(cid)
    except (CaseStoreError, OverflowError):
        return f"Case {cid} is not in the case store."
    if case.get("model_sha256") != loaded.bundle.sha256 or case.get("source_id") != comp.data_source_id(loaded):
        return (f"Case {cid} belongs to another data file or model than the one loaded here: open it from the "
                "Work queue with its data file.")
    state.set_entity(str(case["entity_id"]))
    tx = st.query_params.get(TX_PARAM)
    if tx:
        state.set_query(str(tx))  # the page keeps it only if it is one of the entity's transactions
    return None


def publish(case_id: int | None, query: str | None) -> None:
    """Write the case on screen into the address (``case``, and ``tx`` unless the transaction id
    looks like a card number); nothing when the entity has no case yet."""
    if case_id is None:
        return
    want = {CASE_PARAM: str(int(case_id))}
    if query is not None and cv.mask(str(query)) == str(query):
        want[TX_PARAM] = str(query)
    if st.query_params.to_dict() != want:
        st.query_params.from_dict(want)
