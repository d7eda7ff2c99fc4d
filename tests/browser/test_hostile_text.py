"""Hostile text in a real browser (Debian's Chromium through Playwright, see conftest.py).

A case whose merchant, city, state and MCC values, analyst note, data file name, model name and
uploaded file name carry markdown links, markdown images and raw ``<img>`` tags pointing at
127.0.0.1:9 (the discard port: nothing listens), seen by an analyst signed in through the form
(conftest.py's credentials file and :func:`sign_in`; user names are validated, so they hold no
markup: a hostile name in the identity is tests/hostile/test_exports.py's). Asserted: no element
of any page has an attribute (``href``, ``src``, ``xlink:href``) naming that host, and the browser
never requests it (a Playwright request listener). On the same case: a what-if edit is made, the
exports are prepared and the JSON downloaded carries the edit; the server log has no
"missing ScriptRunContext"; the tables' toolbar offers no raw "Download as CSV".
"""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from conftest import sign_in, streamlit_server, write_users

pytestmark = [pytest.mark.browser, pytest.mark.slow]
T = 120_000  # ms
HOST = "127.0.0.1:9"
LINK = f"[verify your card](http://{HOST}/x)"
IMAGE = f"![x](http://{HOST}/img.png)"
IMG = f'<img src="http://{HOST}/img.png">'
ANALYST = "e2e"  # signed in: user names are validated (engine.serve.access), no markup in them
NOTE = f"{LINK} {IMAGE} {IMG} checked"
# file names cannot hold "/": a browser reads "\" in an http URL as "/"
FILE_NAME = f"![x](http:\\\\{HOST}\\img.png) [verify your card](http:\\\\{HOST}\\x) <img src=http:\\\\{HOST}\\i.png>"


@pytest.fixture(scope="module")
def hostile_app(tmp_path_factory):
    """A server on a demo slice whose last card carries the payloads, with a tiny model."""
    from engine.cases import view as cv
    from engine.data.csv_writer import write_csv
    from tiny_models import demo_slice, tiny_checkpoint

    d = tmp_path_factory.mktemp("hostile-browser")
    df = pd.read_csv(demo_slice(d / "clean.csv", 800), dtype=str, keep_default_na=False)
    last = df.index[-8:]
    for i, col in enumerate(("Merchant City", "Merchant State", "MCC", "Merchant Name")):
        df.loc[last, col] = [[LINK, IMAGE, IMG][(i + j) % 3] for j in range(len(last))]
    data = d / f"{FILE_NAME}.csv"
    write_csv(df, data)
    src = cv.load_source(data, cv.demo_spec_name())
    tiny_checkpoint(src.frame, src.spec, d / "model", {"name": f"tiny {LINK}",
                                                       "thresholds": {"review": 0.05, "decline": 0.99}})
    entity = f"{df['User'].iloc[-1]}:{df['Card'].iloc[-1]}"
    env = {"FRAUDLENS_DATA_DIR": str(d / "store"), "FRAUDLENS_USERS": str(write_users(d / "users.toml")),
           "FRAUDLENS_DATA": str(data), "FRAUDLENS_SPEC": "demo", "FRAUDLENS_MODEL": str(d / "model"),
           "FRAUDLENS_PSEUDONYM_SALT": "e2e"}
    log_path = d / "streamlit.log"
    with streamlit_server(env, log_path, ("--server.address", "127.0.0.1")) as url:
        yield {"url": url, "entity": entity, "log": log_path, "csv": data.read_bytes()}


# attributes that make the browser fetch or link (an <input value> holding the text is text)
_ATTRS_NAMING_HOST = """host => [...document.querySelectorAll('*')].flatMap(el =>
    [...el.attributes].filter(a => /^(href|xlink:href|src|srcset|action|formaction|poster|data|style|background)$/i
                                      .test(a.name) && a.value.includes(host))
                      .map(a => el.tagName + ' ' + a.name + '=' + a.value))"""


_WHERE = """host => [...document.querySelectorAll('a')].filter(a => (a.getAttribute('href') || '').includes(host))
    .map(a => { let e = a; while (e && !e.getAttribute('data-testid')) e = e.parentElement;
                return (e ? e.getAttribute('data-testid') : '?') + ': ' + a.parentElement.outerHTML.slice(0, 300); })"""


def _no_host(page, requests: list[str]) -> None:
    assert page.evaluate(_ATTRS_NAMING_HOST, HOST) == [], page.evaluate(_WHERE, HOST)
    assert page.locator(f'a[href*="{HOST}"]').count() == 0
    assert requests == []


def test_hostile_text_stays_text_and_exports_carry_the_whatif_edit(hostile_app, browser, output_dir, tmp_path):
    ctx = browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 1000})
    requests: list[str] = []
    ctx.on("request", lambda r: requests.append(r.url) if HOST in r.url else None)
    page = ctx.new_page()
    page.set_default_timeout(T)

    # the case of the card with the payloads
    sign_in(page, hostile_app["url"], ANALYST, path="/case")
    page.get_by_text("Disposition", exact=True).first.wait_for()
    box = page.locator('[data-testid="stSelectbox"]').filter(has_text="Entity (ranked")
    box.click()
    page.keyboard.type(hostile_app["entity"])
    page.get_by_role("option", name=re.compile("^" + re.escape(hostile_app["entity"]) + " · max")).click()
    page.get_by_role("heading", name=re.compile("^Case " + re.escape(hostile_app["entity"]))).wait_for()
    page.get_by_text("Disposition", exact=True).first.wait_for()
    _no_host(page, requests)

    # the tables' toolbar: no raw CSV export
    page.locator('[data-testid="stDataFrame"]').first.hover()
    assert page.get_by_role("button", name="Download as CSV").count() == 0

    # trust checks (reason codes cite the payload categories) and one what-if edit
    page.get_by_text("Trust checks and what-if").click()
    page.get_by_role("tab", name="What-if").click()
    page.get_by_text("Change or remove a transaction").first.wait_for()
    amount = page.get_by_label("Amount (USD)").first
    amount.fill("4321.5")
    amount.press("Enter")
    page.get_by_role("button", name="Apply edit").click()
    page.get_by_text("1 edit in force").first.wait_for()
    _no_host(page, requests)

    # a disposition by the signed-in analyst, with the hostile note
    page.get_by_text("Escalate", exact=True).click()
    page.get_by_role("textbox", name="Note (required)").fill(NOTE)
    page.get_by_role("button", name="Record disposition").click()
    page.get_by_test_id("stAlertContentSuccess").get_by_text("Recorded \"Escalate\" by").wait_for()
    shown = page.get_by_test_id("stAlertContentSuccess").get_by_text("Recorded \"Escalate\" by").inner_text().replace(
        "\u2060", "")
    assert shown.startswith(f"Recorded \"Escalate\" by {ANALYST}")  # the literal text
    toast = page.get_by_test_id("stToastText").get_by_text("Recorded \"Escalate\" by").inner_text().replace("\u2060", "")
    assert toast.startswith(f"Recorded \"Escalate\" by {ANALYST}")  # the toast too
    _no_host(page, requests)

    # the exports: prepared in the session, the JSON carries the edit
    page.get_by_role("button", name="Prepare the exports").click()
    page.get_by_role("button", name=re.compile("Download JSON")).wait_for(timeout=3 * T)  # trust + PDF + charts
    with page.expect_download(timeout=2 * T) as dl:
        page.get_by_role("button", name=re.compile("Download JSON")).click()
    path = tmp_path / "r.json"
    dl.value.save_as(path)
    report = json.loads(path.read_text(encoding="utf-8"))
    edits = report["trust"]["what_if"]["edits"]
    assert len(edits) == 1 and edits[0]["op"] == "change" and edits[0]["values"]["amount"] == 4321.5
    assert report["disposition"]["history"][-1]["note"] == NOTE
    # an edit in the What-if tab (a fragment: only the tab reruns) drops the exports prepared with the old edits
    page.get_by_role("button", name="Undo last", exact=True).click()
    page.get_by_text("No edits yet").first.wait_for()
    page.get_by_role("button", name="Prepare the exports").wait_for(timeout=2 * T)
    assert page.get_by_role("button", name=re.compile("Download JSON")).count() == 0
    page.screenshot(path=str(output_dir / "hostile_case_page.png"), full_page=True)
    _no_host(page, requests)

    # the Model page (model name with a link) and an upload whose file name carries the payloads
    sign_in(page, hostile_app["url"], ANALYST, path="/model")  # a new page load: a new session
    page.get_by_role("heading", name=re.compile("^Model tiny")).wait_for()
    title = page.get_by_role("heading", name=re.compile("^Model tiny")).first.inner_text().replace("\u2060", "")
    assert title == f"Model tiny {LINK}"
    _no_host(page, requests)
    sign_in(page, hostile_app["url"], ANALYST)
    page.get_by_role("heading", name="Open a case from data").wait_for()
    exp = page.locator('[data-testid="stExpander"]').first
    if not page.get_by_text("Transactions file").count():
        exp.locator("summary").click()
    page.get_by_text("Upload", exact=True).click()
    page.locator('input[type="file"]').set_input_files(
        {"name": FILE_NAME + ".csv", "mimeType": "text/csv", "buffer": hostile_app["csv"]})
    page.get_by_role("button", name="Use this data").click()
    page.locator('[data-testid="stSidebar"]').get_by_text("verify your card", exact=False).first.wait_for()
    _no_host(page, requests)
    ctx.close()

    log = hostile_app["log"].read_text(errors="replace")
    assert "missing ScriptRunContext" not in log
