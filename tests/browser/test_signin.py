"""Sign-in and roles in a real browser (Debian's headless Chromium through Playwright, as
test_e2e.py): without sign-in no case data is shown; a wrong password is refused; an analyst
cannot change thresholds (a supervisor can); an auditor cannot record a disposition."""

from __future__ import annotations

import re

import pytest

from conftest import PASSWORD, REBIND_HOST, sign_in, streamlit_server, tick_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]
T = 90_000  # ms


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    p = ctx.new_page()
    p.set_default_timeout(T)
    yield p
    ctx.close()


@pytest.mark.parametrize("path", ["", "/queue", "/case", "/model"])
def test_without_sign_in_no_case_data_is_shown(app_url, page, e2e_world, path):
    page.goto(app_url + path)
    page.get_by_role("heading", name="Sign in to fraudlens").wait_for()
    page.wait_for_timeout(1500)  # let any (wrong) page content arrive
    body = page.locator("body").inner_text()
    assert page.locator('[data-testid="stDataFrame"]').count() == 0
    assert page.locator('[data-testid="stMetric"]').count() == 0
    assert page.locator(".js-plotly-plot").count() == 0
    for text in ("Work queue", "Transactions scored", "Entities by highest", "Model card", "tiny-e2e", "Disposition"):
        assert text not in body
    links = page.get_by_role("link", name="Work queue")
    if links.count():  # Streamlit's pages/ listing may show before st.navigation runs: it leads to sign-in too
        links.first.click()
        page.wait_for_timeout(1500)
        page.get_by_role("heading", name="Sign in to fraudlens").wait_for()
        assert page.locator('[data-testid="stDataFrame"]').count() == 0
        assert "Work queue" not in page.locator("body").inner_text()


def test_a_wrong_password_is_refused(app_url, page):
    page.goto(app_url)
    page.get_by_role("heading", name="Sign in to fraudlens").wait_for()
    page.get_by_role("textbox", name="User name").fill("sam")
    page.get_by_role("textbox", name="Password").fill(PASSWORD + "-wrong")
    page.get_by_role("button", name="Sign in").click()
    page.get_by_text("unknown user or wrong password").wait_for()
    assert page.get_by_role("heading", name="Sign in to fraudlens").count() == 1
    assert page.locator('[data-testid="stDataFrame"]').count() == 0


def _thresholds(page) -> None:
    page.get_by_role("heading", name="Work queue").wait_for()
    page.get_by_text(re.compile(r"^Thresholds · review")).click()


def test_an_analyst_cannot_change_thresholds_a_supervisor_can(app_url, page):
    sign_in(page, app_url, "e2e", path="/queue")
    _thresholds(page)
    page.get_by_text("Only a supervisor changes thresholds (you: analyst)").wait_for()
    assert page.get_by_role("button", name="Save thresholds for this model").count() == 0
    assert page.get_by_role("spinbutton", name="Review threshold").count() == 0
    assert "e2e · analyst" in page.locator('[data-testid="stSidebar"]').inner_text()

    sign_in(page, app_url, "sam", path="/queue")  # a new page load: a new session
    _thresholds(page)
    page.get_by_role("button", name="Save thresholds for this model").wait_for()


def test_an_auditor_cannot_record_a_disposition(app_url, page):
    # an analyst's visit to the queue opens the cases of flagged entities (an auditor's, read-only,
    # never writes): without it this test depended on an earlier test of the same server
    sign_in(page, app_url, "e2e", path="/queue")
    page.get_by_role("heading", name="Work queue").wait_for()
    page.get_by_role("button", name="Claim next case").wait_for()
    sign_in(page, app_url, "audrey", path="/queue")
    page.get_by_role("heading", name="Work queue").wait_for()
    assert page.get_by_role("button", name=re.compile("^Assign")).count() == 0
    assert page.get_by_role("button", name="Claim next case").count() == 0
    opener = page.get_by_role("button", name=re.compile(r"Open case \d+"))
    tick_until(page, 0, opener)  # an auditor's queue shows all open cases; tick one to open it
    opener.click()
    page.get_by_text("Disposition", exact=True).first.wait_for()
    page.get_by_text("Your role (auditor) reads cases: it does not record dispositions.").wait_for()
    assert page.get_by_role("button", name="Record disposition").count() == 0
    assert page.get_by_role("textbox", name="Note (required)").count() == 0


@pytest.fixture(scope="module")
def demo_url(e2e_world, tmp_path_factory):
    """A demo-mode server (``FRAUDLENS_DEMO=1``, bound to 127.0.0.1, no credentials file)."""
    d = tmp_path_factory.mktemp("demo-server")
    env = {"FRAUDLENS_DATA_DIR": str(d / "store"), "FRAUDLENS_DEMO": "1", "FRAUDLENS_USERS": "",
           "FRAUDLENS_DATA": str(e2e_world["data"]), "FRAUDLENS_SPEC": e2e_world["spec"],
           "FRAUDLENS_MODEL": str(e2e_world["model"]), "FRAUDLENS_PSEUDONYM_SALT": "e2e"}
    with streamlit_server(env, d / "streamlit.log", ("--server.address", "127.0.0.1")) as url:
        yield url


def test_demo_mode_refuses_a_dns_rebinding_page(demo_url, browser):
    """A page on another site whose name resolves to 127.0.0.1 (DNS rebinding; the session
    browser's --host-resolver-rules maps ``REBIND_HOST`` there) reaches the demo server
    same-origin: it must get the sign-in page, not the demo supervisor; the same server opened as
    localhost signs in."""
    port = demo_url.rsplit(":", 1)[1]
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = ctx.new_page()
        page.set_default_timeout(T)
        page.goto(f"http://{REBIND_HOST}:{port}/")
        page.get_by_role("heading", name="Sign in to fraudlens").wait_for()
        page.get_by_text("Demo sign-in is only for a page opened as localhost").wait_for()
        page.wait_for_timeout(1500)
        body = page.locator("body").inner_text()
        assert "Demo mode: signed in automatically" not in body and "Open a case" not in body
        assert page.locator('[data-testid="stDataFrame"]').count() == 0
        page.goto(f"http://localhost:{port}/")
        page.get_by_text("Demo mode: signed in automatically as").wait_for()
        assert page.get_by_role("heading", name="Sign in to fraudlens").count() == 0
    finally:
        ctx.close()
