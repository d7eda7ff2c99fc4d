"""Sign-in and roles through Streamlit's AppTest: the password form, sign-out, demo mode (only on
a loopback address, with a banner on every page), an admin sees no case data, an auditor's view
writes nothing, and the role is checked inside the action callbacks (not only by hiding them)."""

from __future__ import annotations

import pytest
from streamlit import config as st_config
from streamlit.testing.v1 import AppTest

from dashboard.components.access import SESSION_KEY
from engine.cases.store import CaseStore
from engine.serve import access as ac
from test_app import APP, PASSWORD, TIMEOUT, _ok, env, signed_in, users_file, world  # noqa: F401

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
PAGES = ("pages/cases.py", "pages/queue.py", "pages/case.py", "pages/model.py", "pages/audit.py")


@pytest.fixture
def address():
    """Set Streamlit's server.address for one test (restored afterwards)."""
    old = st_config.get_option("server.address")
    yield lambda v: st_config.set_option("server.address", v)
    st_config.set_option("server.address", old)


def _sign_in_form(at: AppTest, name: str, password: str) -> AppTest:
    at.text_input(key="signin_name").input(name)
    at.text_input(key="signin_password").input(password)
    return at.button(key="FormSubmitter:signin_form-Sign in").click().run()


def test_password_sign_in_and_sign_out(env, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FRAUDLENS_ANALYST", "alice")  # no longer an identity source for the dashboard
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    assert at.title[0].value == "Sign in to fraudlens" and not at.dataframe and not at.metric
    assert not [t for t in at.sidebar.text_input]  # no name box
    _sign_in_form(at, "alice", PASSWORD)
    _ok(at)
    assert at.title[0].value == "Open a case from data"
    assert at.session_state[SESSION_KEY] == ac.Identity("alice", "analyst", "password")
    assert any(t.value == "alice · analyst" for t in at.sidebar.text)
    assert at.session_state["signin_password"] == ""  # the password is not kept in the session
    at.sidebar.button(key="signout").click().run()
    assert at.title[0].value == "Sign in to fraudlens" and not at.dataframe
    _sign_in_form(at, "alice", PASSWORD + "x")
    assert [e.value for e in at.error] == ["unknown user or wrong password"]
    assert at.title[0].value == "Sign in to fraudlens"


@pytest.mark.parametrize("page", PAGES)
def test_demo_mode_on_localhost_signs_in_with_a_banner_on_every_page(env, monkeypatch, address, page):  # noqa: F811
    monkeypatch.setenv("FRAUDLENS_DEMO", "1")
    monkeypatch.delenv("FRAUDLENS_USERS")
    address("127.0.0.1")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.switch_page(page)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state[SESSION_KEY] == ac.Identity("demo", "supervisor", "demo")
    assert any(w.value.startswith("Demo mode: signed in automatically as **demo** (supervisor), local only")
               for w in at.warning)


@pytest.mark.parametrize("addr", ["0.0.0.0", "10.0.0.7", ""])
def test_demo_mode_elsewhere_signs_nobody_in(env, monkeypatch, address, addr):  # noqa: F811
    monkeypatch.setenv("FRAUDLENS_DEMO", "1")
    address(addr)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    assert at.title[0].value == "Sign in to fraudlens" and not at.dataframe and not at.metric
    assert SESSION_KEY not in at.session_state


class _Context:
    """Stands in for ``st.context``: the headers of the page's browser connection."""

    def __init__(self, host: str):
        self.headers = {"Host": host}


def _demo_page(monkeypatch, address, host: str) -> AppTest:
    """The app run once in demo mode on 127.0.0.1, its page opened with ``Host: host``."""
    import streamlit

    monkeypatch.setenv("FRAUDLENS_DEMO", "1")
    monkeypatch.delenv("FRAUDLENS_USERS")
    monkeypatch.setattr(streamlit, "context", _Context(host))
    address("127.0.0.1")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    return at


@pytest.mark.parametrize("host", ["evil.example:8501", "127.0.0.1.evil.example", "localhost.evil.example:8501",
                                  "10.0.0.7:8501", "0.0.0.0:8501"])
def test_demo_mode_refuses_a_page_opened_under_another_name(env, monkeypatch, address, host):  # noqa: F811
    """DNS rebinding: a page on another site whose name resolves to 127.0.0.1 reaches the loopback
    server with that site's Host header; it must not be signed in as the demo supervisor."""
    at = _demo_page(monkeypatch, address, host)
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Sign in to fraudlens" and not at.dataframe and not at.metric
    assert SESSION_KEY not in at.session_state
    assert any(e.value.startswith("Demo sign-in is only for a page opened as localhost") for e in at.error)


@pytest.mark.parametrize("host", ["localhost:8501", "127.0.0.1:9000", "[::1]:8501", "LOCALHOST"])
def test_demo_mode_signs_in_a_page_opened_as_a_loopback_name(env, monkeypatch, address, host):  # noqa: F811
    at = _demo_page(monkeypatch, address, host)
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state[SESSION_KEY] == ac.Identity("demo", "supervisor", "demo")


def test_demo_host_rule():
    from dashboard.components.access import demo_host_ok

    assert demo_host_ok(None)  # AppTest, a bare script run: no browser connection
    for ok in ("localhost", "localhost:8501", "127.0.0.1:1", "127.5.6.7:8501", "[::1]", "[::1]:8501"):
        assert demo_host_ok(ok), ok
    for bad in ("", "evil.example", "evil.example:8501", "localhost.evil.example", "127.0.0.1.nip.io:8501",
                "::1", "[::1", "10.0.0.7", "0.0.0.0:8501", "localhost:8501@evil.example"):
        assert not demo_host_ok(bad), bad


@pytest.mark.parametrize("page", PAGES)
def test_an_admin_sees_no_case_data(env, page):  # noqa: F811
    at = signed_in("dana")
    at.switch_page(page)
    at.run()
    assert not at.exception
    assert not at.dataframe and not at.metric
    what = "view the audit log" if page == "pages/audit.py" else "view cases"
    assert f"your role (admin) may not {what}" in at.error[0].value.lower()


def test_an_auditor_reads_the_case_and_writes_nothing(env, tmp_path, world):  # noqa: F811
    from streamlit.runtime.caching import cache_resource

    db = tmp_path / "store" / "cases.sqlite3"
    entity = world["ranking"]["entity_id"].iloc[0]
    at = signed_in("erin")
    at.session_state["entity_id"] = entity
    at.switch_page("pages/case.py")
    at.run()
    assert not at.exception
    assert [i.value for i in at.info] == ["This entity has no case in the case store."]
    assert not db.exists() or len(CaseStore(db).queue(world["bundle"].sha256, 0.0)) == 0  # no case created

    at = signed_in("alice")  # an analyst's view creates the cases
    at.session_state["entity_id"] = entity
    at.switch_page("pages/case.py")
    at.run()
    _ok(at)
    with CaseStore(db) as s:
        cid = int(s.find_case(world["bundle"].sha256, s.queue(world["bundle"].sha256, 0.0)["source_id"].iloc[0],
                              entity)["id"])
        s.save_narrative(cid, "Card used at 3 merchants within an hour; [a link](http://x)", analyst="alice")
        before = len(s.audit_log())
    cache_resource.clear()
    at = signed_in("erin")
    at.session_state["entity_id"] = entity
    at.switch_page("pages/case.py")
    at.run()
    _ok(at)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Case state"] == "open"
    assert not [b for b in at.button if "Record disposition" in b.label]
    assert any("Your role (auditor) reads cases" in c.value for c in at.caption)
    # the auditor reads the narrative (analyst trial: only "Saved by ..." was shown), as plain text
    assert "Card used at 3 merchants within an hour; [a link](http://x)" in [t.value for t in at.text]
    with CaseStore(db) as s:
        assert len(s.audit_log()) == before  # reading wrote nothing


def _callback_script(user: str, role: str, action: str) -> None:
    import streamlit as st

    from dashboard.components import disposition
    from dashboard.components.access import SESSION_KEY
    from engine.serve.access import Identity

    class Store:  # records what the callback asked the case store to do
        calls: list = []

        def record_disposition(self, *a, **k):
            self.calls.append(("record_disposition", a, k))
            return "false_positive"

        def approve(self, *a, **k):
            self.calls.append(("approve", a, k))
            return "confirmed_fraud"

        def send_back(self, *a, **k):
            self.calls.append(("send_back", a, k))
            return "assigned"

    st.session_state[SESSION_KEY] = Identity(user, role, "password")
    st.session_state["disp_choice"], st.session_state["disp_note"] = "false_positive", "forged call"
    st.session_state["approve_note"] = "forged approval"
    st.session_state["disp_replace_1"] = True  # case 1 is pending: replacing its proposal is ticked
    store = Store()
    case = {"id": 1, "version": 1, "state": "pending_approval", "pending_by": "someone"}
    {"record": disposition._record, "approve": disposition._approve, "send_back": disposition._send_back}[action](
        store, case)
    st.text(repr(st.session_state.get(disposition.MSG)))
    st.text(f"calls={len(store.calls)}")


@pytest.mark.parametrize("role,action,allowed", [("auditor", "record", False), ("admin", "record", False),
                                                 ("analyst", "approve", False), ("auditor", "approve", False),
                                                 ("analyst", "record", True), ("supervisor", "approve", True),
                                                 ("analyst", "send_back", False), ("supervisor", "send_back", True)])
def test_roles_are_checked_inside_the_action_callbacks(role, action, allowed):
    at = AppTest.from_function(_callback_script, args=("mallory", role, action), default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    msg, calls = at.text[0].value, at.text[1].value
    if allowed:
        assert calls == "calls=1" and "success" in msg and "mallory" in msg
    else:
        assert calls == "calls=0" and "'error'" in msg and f"your role ({role}) may not" in msg


@pytest.mark.parametrize("email,role", [("carol@bank.example", "auditor"), ("mallory@bank.example", None)])
def test_identity_provider_users_get_their_listed_role(env, monkeypatch, tmp_path, email, role):  # noqa: F811
    """Streamlit's OIDC session (st.user) as seen by the page: the role comes from the
    credentials file; an e-mail not listed there sees no case data."""
    import streamlit

    from dashboard.components import access

    users = tmp_path / "users.toml"
    ac.add_user(users, "carol@bank.example", "auditor", None)
    monkeypatch.setenv("FRAUDLENS_USERS", str(users))
    monkeypatch.setattr(access, "_oidc_configured", lambda: True)
    monkeypatch.setattr(access, "_oidc_logged_in", lambda: True)
    monkeypatch.setattr(streamlit, "user", {"email": email, "is_logged_in": True})
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    if role:
        assert at.session_state[SESSION_KEY] == ac.Identity(email, role, "oidc")
        assert at.title[0].value == "Open a case from data" and at.dataframe
    else:
        assert SESSION_KEY not in at.session_state
        assert any("has no role in this fraudlens" in e.value for e in at.error)
        assert at.title[0].value == "Sign in to fraudlens" and not at.dataframe and not at.metric


def test_a_re_roled_or_removed_user_is_changed_at_the_next_page_run(env, monkeypatch, tmp_path):  # noqa: F811
    """The credentials file is read at every page run and action: a role change takes effect at
    once, a removed user is signed out (not at the next sign-in)."""
    users = tmp_path / "own" / "users.toml"
    ac.add_user(users, "alice", "analyst", PASSWORD)
    ac.add_user(users, "bob", "supervisor", PASSWORD)
    monkeypatch.setenv("FRAUDLENS_USERS", str(users))
    at = signed_in("alice")
    at.run()
    _ok(at)
    assert any(t.value == "alice · analyst" for t in at.sidebar.text)
    recs = ac.load_users(users)
    ac.write_users(users, {**recs, "alice": ac.UserRecord("alice", "auditor", recs["alice"].password_hash)})
    at.run()
    assert at.session_state[SESSION_KEY] == ac.Identity("alice", "auditor", "password")
    assert any(t.value == "alice · auditor" for t in at.sidebar.text)
    ac.write_users(users, {"bob": recs["bob"]})
    at.run()
    assert SESSION_KEY not in at.session_state
    assert at.title[0].value == "Sign in to fraudlens" and not at.dataframe and not at.metric
    assert any("no longer listed in the credentials file" in e.value for e in at.error)
    users.write_text("not toml [", encoding="utf-8")  # an unreadable file: fail closed
    at = signed_in("bob")
    at.run()
    assert SESSION_KEY not in at.session_state and at.title[0].value == "Sign in to fraudlens"
