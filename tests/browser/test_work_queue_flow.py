"""The work queue, disposition details and the audit screen in a real browser (Debian's headless
Chromium through Playwright, server and sign-in from conftest.py): claim the next case, bulk
assign ticked rows, a disposition with fraud type and amounts, the audit log filtered and
exported. A screenshot of each page goes to the artefact folder (``$FRAUDLENS_ARTEFACTS`` or
test-output/)."""

from __future__ import annotations

import csv
import io
import re

import pytest

from conftest import choose_option, sign_in, tick_rows

pytestmark = [pytest.mark.browser, pytest.mark.slow]
T = 90_000  # ms: the first explanation of a case on a shared 2-core machine


@pytest.fixture
def page(browser):
    ctx = browser.new_context(accept_downloads=True, viewport={"width": 1400, "height": 1000})
    p = ctx.new_page()
    p.set_default_timeout(T)
    yield p
    ctx.close()


def _shot(page, output_dir, name: str) -> None:
    """A full-page screenshot once the page has finished drawing (no skeleton placeholders)."""
    try:
        page.wait_for_function("() => !document.querySelector('[data-testid=\"stSkeleton\"]')", timeout=30_000)
    except Exception:  # noqa: BLE001 - a screenshot of a slow page is still an artefact
        pass
    page.wait_for_timeout(800)
    page.screenshot(path=str(output_dir / name), full_page=True)


def _view(page, name: str) -> None:
    """Choose a view of the work queue ("My open cases", "Unassigned open cases", ...)."""
    page.locator('[data-testid="stButtonGroup"]').get_by_text(name, exact=True).click()
    page.wait_for_timeout(1500)


def test_claim_next_case_then_disposition_with_fraud_type(app_url, page, output_dir):
    sign_in(page, app_url, "e2e", path="/queue")
    page.get_by_role("heading", name="Work queue").wait_for()
    page.get_by_text("Your work list", exact=False).first.wait_for()
    page.get_by_role("button", name="Claim next case").click()
    claimed = page.get_by_text(re.compile(r"^Claimed case \d+")).first
    claimed.wait_for()
    case_id = re.search(r"Claimed case (\d+)", claimed.inner_text()).group(1)
    _shot(page, output_dir, "work_queue_claimed.png")
    page.get_by_role("button", name=f"Open case {case_id} →").click()

    # the case page: disposition with a fraud type, a loss and an exposure
    page.get_by_text("Disposition", exact=True).first.wait_for()
    page.get_by_text("Confirmed fraud", exact=True).click()
    box = page.locator('[data-testid="stSelectbox"]').filter(has_text="Fraud type")
    choose_option(page, box, "Card testing")
    page.get_by_role("spinbutton", name=re.compile(r"^Loss")).fill("1234.5")
    page.get_by_role("spinbutton", name=re.compile(r"^Exposure")).fill("5000")
    page.get_by_role("textbox", name="Note (required)").fill("3 small test charges then a large one")
    page.get_by_role("button", name="Record disposition").click()
    page.get_by_test_id("stAlertContentSuccess").get_by_text(
        re.compile(r"Recorded \"Confirmed fraud\" by e2e · card testing · loss 1,234.50")).wait_for()
    # a note without a disposition
    page.get_by_role("textbox", name="Add a note (no disposition needed)").fill("card holder called back")
    page.get_by_role("button", name="Add note").click()
    page.get_by_test_id("stAlertContentSuccess").get_by_text("Note added by e2e").wait_for()
    page.get_by_test_id("stToastText").get_by_text("Note added by e2e").wait_for()  # seen where the form is
    assert page.get_by_text("No notes yet").count() == 0
    _shot(page, output_dir, "case_disposition_fraud_type.png")


def test_bulk_assign_ticked_rows(app_url, page, output_dir):
    sign_in(page, app_url, "sam", path="/queue")
    page.get_by_role("heading", name="Work queue").wait_for()
    _view(page, "Unassigned open cases")
    assert page.get_by_role("button", name=re.compile("ticked")).first.is_disabled()  # nothing ticked yet
    tick_rows(page, [0, 1])
    page.get_by_text("2 cases ticked").wait_for()
    page.get_by_role("button", name="Assign 2 ticked").click()
    page.get_by_text(re.compile(r"^Assigned 2 cases to sam")).first.wait_for()
    _shot(page, output_dir, "work_queue_bulk_assigned.png")
    _view(page, "My open cases")
    page.get_by_text(re.compile(r"Cases shown")).first.wait_for()
    metric = page.locator('[data-testid="stMetric"]').filter(has_text="Cases shown")
    assert int(metric.locator('[data-testid="stMetricValue"]').inner_text()) >= 2


def test_audit_filter_and_export(app_url, e2e_world, page, output_dir, tmp_path):
    from engine.cases.store import CaseStore

    with CaseStore(e2e_world["dir"] / "store" / "cases.sqlite3") as s:  # the server's store: a bulk assignment
        sha = s.audit_log(action="case_created")["model_sha256"].iloc[0]  # to find, whatever ran before
        ids = s.queue(sha, 0.0)["case_id"].tolist()[-2:]
        s.bulk_assign(ids, "sam", actor="sam")
    sign_in(page, app_url, "audrey", path="/audit")
    page.get_by_role("heading", name="Audit log").wait_for()
    page.get_by_text(re.compile(r"audit log intact")).wait_for()
    ms = page.locator('[data-testid="stMultiSelect"]').filter(has_text="Action")
    choose_option(page, ms, "bulk_assigned")
    page.keyboard.press("Escape")
    page.wait_for_timeout(1500)
    _shot(page, output_dir, "audit_filtered.png")
    with page.expect_download(timeout=T) as dl:
        page.get_by_role("button", name="Download as CSV").click()
    path = tmp_path / "audit.csv"
    dl.value.save_as(path)
    assert re.fullmatch(r"fraudlens-audit-log-filtered-\d{8}T\d{6}Z\.csv", dl.value.suggested_filename)
    rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
    assert rows and {r["action"] for r in rows} == {"bulk_assigned"}
    assert {r["actor"] for r in rows} == {"sam"}
    (output_dir / "audit_export.csv").write_bytes(path.read_bytes())
