"""fraudlens dashboard entry point: ``streamlit run dashboard/app.py -- [--data FILE --spec NAME]
[--model DIR] [--max-rows N]`` (or env FRAUDLENS_DATA / FRAUDLENS_SPEC / FRAUDLENS_MODEL /
FRAUDLENS_MAX_ROWS). Every page runs behind the sign-in of dashboard/components/access.py.
Pages: Open a case from data (pages/cases.py: pick a source, a model and any entity), Work queue
(pages/queue.py: the analyst's work list: my open cases, claim next, bulk assign), Case (one entity's timeline and the
explanations of one transaction), Model (model card), Audit (audit log and its hash-chain
verdict; supervisors, auditors and admins)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:  # `streamlit run dashboard/app.py` puts only dashboard/ on the path
    sys.path.insert(0, str(_ROOT))

import streamlit as st  # noqa: E402

from dashboard import state  # noqa: E402
from dashboard.components import access  # noqa: E402
from dashboard.components.safe import md  # noqa: E402
from engine.cases.view import mask  # noqa: E402

# page icon: an emoji becomes an inline SVG favicon; a :material/...: icon would be fetched from a CDN
st.set_page_config(page_title="fraudlens", page_icon="🔎", layout="wide")
st.set_option("client.disableDataExport", True)  # tables' raw CSV export: off (also in .streamlit/config.toml)
_who = access.current()
log = logging.getLogger("fraudlens.dashboard")

pages = [
    st.Page("pages/cases.py", title="Open a case from data", default=True),  # data, model, any entity
    st.Page("pages/queue.py", title="Work queue"),  # the analyst's work list (dashboard/pages/queue.py)
    st.Page("pages/case.py", title="Case"),
    st.Page("pages/model.py", title="Model"),
    st.Page("pages/audit.py", title="Audit"),  # audit log + hash-chain verdict (dashboard/pages/audit.py)
]


def render_sidebar() -> None:
    """What is loaded, in three lines; the case in focus."""
    ss = st.session_state
    src = ss[state.SOURCE]
    with st.sidebar:
        st.caption("Loaded")
        st.markdown(f"**Data** {md(src['label'])} · spec {md(src['spec'])}")
        st.markdown(f"**Model** {'demo model' if not ss[state.MODEL] else md(Path(ss[state.MODEL]).name)}")
        if ss.get(state.ENTITY):
            st.markdown(f"**Entity** {md(mask(ss[state.ENTITY]))}")
        if ss.get(state.QUERY):
            st.markdown(f"**Query** {md(mask(ss[state.QUERY]))}")
        render_chain_alarm()


def render_chain_alarm() -> None:
    """A red line on every page when the case store's audit chain is broken (verified at open
    and again when the last check is older than 30 s: a log changed while the server runs)."""
    from dashboard import components as comp

    try:
        verdict = comp.get_store().recent_audit_verdict(30.0)
    except Exception as e:  # noqa: BLE001 - never silent: a store that cannot be verified is an alarm
        log.error("audit chain not verified: %r", e)
        st.error(f"The audit log could not be verified ({type(e).__name__}): see Audit.", icon=":material/gpp_bad:")
        return
    if not verdict.ok:
        where = f" at row {verdict.first_broken_id}" if verdict.first_broken_id is not None else ""
        st.error(f"Audit log tampered with{where}: see Audit.", icon=":material/gpp_bad:")


# the pages are declared before the sign-in gate so that the page asked for (say /queue) opens
# once signed in; the menu stays hidden until then
page = st.navigation(pages, position="sidebar" if _who is not None else "hidden")
IDENTITY = access.require_signed_in()  # the sign-in page and st.stop() until someone is signed in
access.banner_and_sidebar(IDENTITY)
state.init_state(state.parse_settings(sys.argv[1:]))
render_sidebar()
page.run()
