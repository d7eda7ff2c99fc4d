"""Sign-in for the dashboard; every page runs behind it (rules in :mod:`engine.serve.access`).

Methods, any of which the operator may configure:

* **identity provider** - Streamlit's OIDC sign-in (``st.login`` / ``st.user``; Authlib, and an
  ``[auth]`` section in ``.streamlit/secrets.toml``); the user's e-mail must be listed with a
  role in the credentials file;
* **password** - the credentials file ``$FRAUDLENS_USERS`` (argon2id hashes, written by
  ``fraudlens users add``);
* **demo** - ``$FRAUDLENS_DEMO=1`` signs in the demo user (supervisor) automatically, only while the
  server listens on a loopback address and the page was opened as a loopback name (``localhost``,
  ``127.0.0.1``, ``[::1]``: :func:`demo_host_ok`, against DNS rebinding); every page then shows a
  banner saying so.

The signed-in :class:`engine.serve.access.Identity` is kept in session state under
:data:`SESSION_KEY` (no widget has that key, so the browser cannot set it); it is the only
source of the acting user's name.
"""

from __future__ import annotations

import logging

import streamlit as st

from engine.serve import access as ac
from engine.serve import guard

SESSION_KEY = "_fraudlens_identity"
_FORM = "signin_form"
log = logging.getLogger("fraudlens.signin")


def _oidc_configured() -> bool:
    try:
        return "auth" in st.secrets
    except Exception:  # noqa: BLE001 - no secrets file, or an unreadable one: no OIDC
        return False


def _page_host() -> str | None:
    """The ``Host`` header of this session's browser connection, or ``None`` without one (AppTest,
    a bare script run: no client connection at all)."""
    try:
        return st.context.headers.get("Host")
    except Exception:  # noqa: BLE001 - no script run context: no browser connection
        return None


def demo_host_ok(host: str | None) -> bool:
    """True when a session whose page was opened as ``host`` (its ``Host`` header) may be signed in
    as the demo user: no browser connection (``None``), or a loopback name (``localhost``,
    ``127.0.0.1``, ``[::1]``, any port: an SSH tunnel's local port differs from the server's).

    A loopback bind alone does not keep other sites out: a page on ``evil.example`` whose name
    later resolves to 127.0.0.1 (DNS rebinding) reaches the server from the analyst's own browser,
    same-origin, with ``Host: evil.example:8501``; without this check it would act as the demo
    supervisor. https://en.wikipedia.org/wiki/DNS_rebinding"""
    return host is None or guard.host_ok(host, None)


def _demo_allowed() -> bool:
    return (ac.demo_enabled() and ac.is_loopback(st.get_option("server.address"))
            and demo_host_ok(_page_host()))


def _demo_refused_for_host() -> bool:
    return (ac.demo_enabled() and ac.is_loopback(st.get_option("server.address"))
            and not demo_host_ok(_page_host()))


def current() -> ac.Identity | None:
    """The signed-in identity of this session, or ``None``."""
    ss = st.session_state
    ident = ss.get(SESSION_KEY)
    if isinstance(ident, ac.Identity):
        if ident.method == "oidc" and not _oidc_logged_in():
            ss.pop(SESSION_KEY, None)
            return None
        if ident.method == "demo" and not _demo_allowed():
            ss.pop(SESSION_KEY, None)
            return None
        now = ac.still_signed_in(ac.users_path(), ident)  # the file's word now: removed or re-roled users
        if now is None:
            log.warning("signed out %s: no longer listed in the credentials file", ascii(ident.name)[:80])
            ss.pop(SESSION_KEY, None)
            ss["signin_msg"] = "Your account is no longer listed in the credentials file: signed out."
            return None
        if now != ident:
            ss[SESSION_KEY] = now
        return now
    if _oidc_configured() and _oidc_logged_in():
        try:
            ident = ac.oidc_identity(ac.users_path(), st.user.get("email"))
        except ac.AccessError as e:
            st.error(str(e))
            return None
        ss[SESSION_KEY] = ident
        return ident
    if _demo_allowed():
        ss[SESSION_KEY] = ac.Identity(ac.DEMO_USER, ac.DEMO_ROLE, "demo")
        return ss[SESSION_KEY]
    return None


def _oidc_logged_in() -> bool:
    try:
        return bool(st.user.is_logged_in)
    except Exception:  # noqa: BLE001 - st.user without [auth]
        return False


def _client_address() -> str | None:
    """The browser's address as the server sees it (``st.context.ip_address``; None when unknown,
    as in AppTest: the wrong-password lock is then kept per user name alone)."""
    try:
        ip = st.context.ip_address
    except Exception:  # noqa: BLE001 - outside a browser session
        return None
    return str(ip) if ip else None


def _on_password() -> None:
    ss = st.session_state
    name, pw = ss.get("signin_name") or "", ss.get("signin_password") or ""
    ss["signin_password"] = ""
    path = ac.users_path()
    try:
        if path is None:
            raise ac.SignInError("no credentials file configured")
        ss[SESSION_KEY] = ac.authenticate(path, name, pw, client=_client_address())
        ss.pop("signin_msg", None)
    except ac.AccessError as e:
        log.warning("sign-in refused for %s: %s", ascii(name)[:80], e)
        ss["signin_msg"] = str(e)


def require_signed_in() -> ac.Identity:
    """The signed-in identity; otherwise render the sign-in page and stop the script run (no
    case data is read or shown before this returns)."""
    ident = current()
    if ident is not None:
        return ident
    st.title("Sign in to fraudlens")
    pw, oidc = ac.users_path() is not None, _oidc_configured()
    msg = st.session_state.pop("signin_msg", None)
    if msg:
        st.error(msg)
    if _demo_refused_for_host():
        st.error("Demo sign-in is only for a page opened as localhost, 127.0.0.1 or [::1]; this page was "
                 "opened under another name (a DNS-rebinding page reaches a loopback server that way). "
                 f"Open http://localhost:{st.get_option('server.port')}/ instead.")
    if oidc:
        st.button("Sign in with your identity provider", type="primary", on_click=st.login, key="signin_oidc")
    if pw:
        with st.form(_FORM):
            st.text_input("User name", key="signin_name", max_chars=128)
            st.text_input("Password", type="password", key="signin_password", max_chars=1024)
            st.form_submit_button("Sign in", type="primary", on_click=_on_password)
    if not (pw or oidc):
        st.warning("No sign-in is configured: set FRAUDLENS_USERS to a credentials file (`fraudlens users add NAME "
                   "--role ROLE`), configure [auth] in .streamlit/secrets.toml, or run the local demo "
                   "(`fraudlens dashboard --demo`, 127.0.0.1 only).")
    st.stop()
    raise AssertionError("unreachable")  # pragma: no cover - st.stop raises


def sign_out() -> None:
    """Forget this session's identity (and end the identity-provider session)."""
    ident = st.session_state.pop(SESSION_KEY, None)
    for k in list(st.session_state.keys()):
        if k != SESSION_KEY:
            del st.session_state[k]
    if isinstance(ident, ac.Identity) and ident.method == "oidc":
        st.logout()


def banner_and_sidebar(ident: ac.Identity) -> None:
    """The demo banner (every page, in demo mode) and who is signed in, with a sign-out button."""
    if ident.method == "demo":
        st.warning(f"Demo mode: signed in automatically as **{ac.DEMO_USER}** ({ac.DEMO_ROLE}), local only "
                   "(127.0.0.1). Not for real cases.", icon=":material/science:")
    with st.sidebar:
        st.caption("Signed in")
        st.text(f"{ident.name} · {ident.role}")
        if ident.method != "demo":
            st.button("Sign out", key="signout", on_click=sign_out)


def deny(action: str) -> bool:
    """Show why the signed-in user may not take ``action`` and return True; False if allowed."""
    try:
        ac.require(current(), action)
    except ac.AccessDenied as e:
        st.error(str(e).capitalize() + ".")
        return True
    return False
