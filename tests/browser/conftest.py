"""Browser end-to-end fixtures: a tiny model + demo-data slice, a `streamlit run` server on a
free port (:func:`streamlit_server`; temp FRAUDLENS_DATA_DIR; a credentials file FRAUDLENS_USERS
with the users of :data:`USERS`, all with :data:`PASSWORD`: :func:`write_users`), :func:`sign_in`
through the page's form, and Debian's headless Chromium driven by Playwright (never a
Playwright-downloaded browser)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dashboard import child_server

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
#: a name the session browser resolves to 127.0.0.1 (a DNS-rebinding page, tests/browser/test_signin.py)
REBIND_HOST = "rebind.test"
OUTPUT = ROOT / "test-output"
#: user -> role in the server's credentials file
USERS = {"e2e": "analyst", "sam": "supervisor", "audrey": "auditor"}
PASSWORD = "e2e correct horse battery"


def sign_in(page, url: str, user: str, password: str = PASSWORD, path: str = "") -> None:
    """Open ``url + path`` in ``page`` and sign in through the form (a new page load is a new
    Streamlit session: sign in again after one). Waits until the sign-in page is gone
    (:func:`dashboard.child_server.sign_in`, shared with the browser benchmark)."""
    child_server.sign_in(page, url, user, password, path)


def tick_rows(page, rows: list[int], grid=None) -> None:
    """Tick ``rows`` (0-based) of the visible work-queue table, or of ``grid`` (a locator of an
    st.dataframe with row selection, drawn on a canvas): a click on each row's marker cell at the
    left edge."""
    grid = page.locator('[data-testid="stDataFrame"]:visible').first if grid is None else grid
    grid.scroll_into_view_if_needed()
    box = grid.bounding_box()
    header = row = 35  # px: Streamlit's default header and row heights
    for r in rows:
        page.mouse.click(box["x"] + 18, box["y"] + header + row * r + row / 2)
        page.wait_for_timeout(600)  # one rerun per tick


def choose_option(page, box, option: str, tries: int = 4, wait_ms: int = 15_000) -> None:
    """Open the select box ``box`` (a locator) and click its option named ``option``: a click that
    lands while the page is rerunning redraws the box and loses the open list (seen once in a
    CI simulation), so it is repeated, at most ``tries`` times."""
    for i in range(tries):
        try:
            box.click()
            page.get_by_role("option", name=option).click(timeout=wait_ms)
            return
        except Exception:  # noqa: BLE001 - playwright TimeoutError: the list closed, open it again
            if i == tries - 1:
                raise
            page.keyboard.press("Escape")
            page.wait_for_timeout(1000)


def wait_idle(page, timeout_ms: int = 60_000) -> None:
    """Wait until the page is not rerunning (Streamlit shows its status widget while a script
    run is in progress); a loaded CI machine can take tens of seconds for a cold page."""
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')",
                           timeout=timeout_ms)


def tick_until(page, row: int, expect, tries: int = 3, wait_ms: int = 8000) -> None:
    """Tick ``row`` of the visible work-queue table until ``expect`` (a locator) is visible: a
    click that lands while the page is still rerunning (a cold server's first page) is lost, so
    it is repeated, at most ``tries`` times; each try waits up to ``wait_ms`` for ``expect``."""
    for i in range(tries):
        wait_idle(page)  # a tick during a rerun is the lost one: tick a page that is done
        if i and expect.is_visible():  # the last tick's rerun was slow, not lost: ticking again would untick
            return
        tick_rows(page, [row])
        try:
            expect.wait_for(timeout=wait_ms)
            return
        except Exception:  # noqa: BLE001 - playwright TimeoutError: the tick was lost, click again
            if i == tries - 1:
                raise


@pytest.fixture(scope="session")
def e2e_world(tmp_path_factory):
    """Tiny untrained model + the first 1500 demo rows (as tests/dashboard/test_app.py)."""
    from engine.cases import view as cv
    from tiny_models import demo_slice, tiny_checkpoint

    d = tmp_path_factory.mktemp("e2e")
    data = demo_slice(d / "tx.csv", 1500)
    src = cv.load_source(data, cv.demo_spec_name())
    tiny_checkpoint(src.frame, src.spec, d / "model", {"name": "tiny-e2e", "thresholds": {"review": 0.5, "decline": 0.8}})
    return {"dir": d, "data": data, "spec": cv.demo_spec_name(), "model": d / "model"}


def write_users(path: Path, users: dict[str, str] | None = None, password: str = PASSWORD) -> Path:
    """A credentials file at ``path`` with ``users`` (user -> role; default :data:`USERS`), all
    with ``password``."""
    from engine.serve.access import add_user

    for name, role in (USERS if users is None else users).items():
        add_user(path, name, role, password)
    return path


def streamlit_server(env: dict[str, str], log_path: Path, args: tuple[str, ...] = ()):
    """`streamlit run dashboard/app.py` (extra ``args``) on a free port, with ``env`` over this
    process's environment (no FRAUDLENS_FOUR_EYES, FRAUDLENS_ANALYST or FRAUDLENS_DEMO unless
    ``env`` sets them), its output in ``log_path``; yields its URL once healthy, stops it afterwards
    (:func:`dashboard.child_server.streamlit_server`, shared with the browser benchmark)."""
    return child_server.streamlit_server(env, log_path, args, timeout_s=60.0)


@pytest.fixture(scope="session")
def app_url(e2e_world):
    """`streamlit run dashboard/app.py` on a free port; yields its URL, stops it afterwards."""
    d = e2e_world["dir"]
    env = {"FRAUDLENS_DATA_DIR": str(d / "store"), "FRAUDLENS_USERS": str(write_users(d / "users.toml")),
           "FRAUDLENS_DATA": str(e2e_world["data"]), "FRAUDLENS_SPEC": e2e_world["spec"],
           "FRAUDLENS_MODEL": str(e2e_world["model"]), "FRAUDLENS_PSEUDONYM_SALT": "e2e",
           "FRAUDLENS_REPORT_URL_TTL_S": "3"}  # a downloaded report leaves /media/ after 3 s (test_e2e)
    with streamlit_server(env, d / "streamlit.log") as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                               args=[*CHROMIUM_ARGS, f"--host-resolver-rules=MAP {REBIND_HOST} 127.0.0.1"])
        yield b
        b.close()


@pytest.fixture(scope="session")
def output_dir() -> Path:
    """Where screenshots and downloaded reports are kept as test artefacts: ``$FRAUDLENS_ARTEFACTS``
    when set, else ``test-output/`` in the repository (ignored by git)."""
    out = Path(os.environ.get("FRAUDLENS_ARTEFACTS") or OUTPUT)
    out.mkdir(parents=True, exist_ok=True)
    return out
