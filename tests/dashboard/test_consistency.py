"""One source of truth seen from every page (AppTest):

* the thresholds in force and the decision band: after thresholds are saved for the model, the
  Cases, Queue, Case (header, decision, disposition panel, what-if), Model pages, the JSON
  export and the CLI all state the same review / decline thresholds and the same band;
* the exports carry what the analyst saw: the JSON and PDF are built in the script run, with
  this session's what-if edits and randomisation verdicts.

A tiny model and a demo-data slice (tests/dashboard/test_trust.py's ``world``); a temp case
store through FRAUDLENS_DATA_DIR; downloads read back by spying on Streamlit's media storage.
"""

from __future__ import annotations

import re
import io
import json
from pathlib import Path
from typing import Any

import pytest
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from dashboard.components.access import SESSION_KEY
from engine.cases import view as cv
from engine.cases.store import CaseStore
from engine.serve import access as ac

from test_app import users_file  # noqa: F401 - the shared fixture
from test_trust import APP, TIMEOUT, _ok, world  # noqa: F401 - the shared fixture

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def cenv(world, monkeypatch, tmp_path, users_file):  # noqa: F811
    monkeypatch.setenv("FRAUDLENS_DATA", str(world["data"]))
    monkeypatch.setenv("FRAUDLENS_SPEC", world["spec"])
    monkeypatch.setenv("FRAUDLENS_MODEL", str(world["model"]))
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FRAUDLENS_USERS", str(users_file))  # alice (analyst) signs in: _page
    monkeypatch.delenv("FRAUDLENS_DEMO", raising=False)
    monkeypatch.delenv("FRAUDLENS_DATA_ROOTS", raising=False)
    monkeypatch.setenv("FRAUDLENS_PSEUDONYM_SALT", "test")
    monkeypatch.delenv("FRAUDLENS_FOUR_EYES", raising=False)
    monkeypatch.delenv("FRAUDLENS_MAX_ROWS", raising=False)
    return {**world, "db": tmp_path / "cases.sqlite3"}


@pytest.fixture
def downloads(monkeypatch):
    """file name -> a click on that download button: the bytes it serves. Report downloads are
    deferred (dashboard/components/export.py: the audit row is written at the click, then the
    bytes are served), so the deferred callables are collected and called here; plain downloads
    are read from the media storage as Streamlit stores them."""
    from streamlit.runtime.media_file_manager import MediaFileManager

    got: dict[str, Any] = {}
    orig = MemoryMediaFileStorage.load_and_get_id
    orig_deferred = MediaFileManager.add_deferred

    def spy(self, path_or_data, mimetype, kind, filename=None):
        if filename:
            data = path_or_data if isinstance(path_or_data, bytes) else Path(path_or_data).read_bytes()
            got[filename] = lambda: data
        return orig(self, path_or_data, mimetype, kind, filename)

    def spy_deferred(self, data_callable, mimetype, coordinates, file_name=None, **kw):
        if file_name:
            got[file_name] = data_callable
        return orig_deferred(self, data_callable, mimetype, coordinates, file_name, **kw)

    monkeypatch.setattr(MemoryMediaFileStorage, "load_and_get_id", spy)
    monkeypatch.setattr(MediaFileManager, "add_deferred", spy_deferred)
    return got


def _page(page: str, user: ac.Identity = ac.Identity("alice", "analyst", "password"), **state) -> AppTest:
    """``page`` run once in a session signed in as ``user`` (as the sign-in form does)."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.session_state[SESSION_KEY] = user
    for k, v in state.items():
        at.session_state[k] = v
    at.switch_page(page)
    at.run()
    _ok(at)
    return at


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _download(downloads: dict, suffix: str) -> bytes:
    """A click on the latest report download button whose file name ends with ``suffix``."""
    hits = [v for k, v in downloads.items() if k.endswith(suffix) and re.match(r"fraudlens-case\d+-", k)]
    assert hits, sorted(downloads)
    return hits[-1]()


def _earlier(env) -> str:
    f = env["frame"]
    rows = f[f["entity_id"] == env["entity"]].reset_index(drop=True)
    pos = int((rows["transaction_id"].astype(str) == env["query"]).to_numpy().argmax())
    return str(rows["transaction_id"].iloc[pos - 1])


# --------------------------------------------------------------------------------- item 14
def test_saved_thresholds_are_the_same_on_every_page_in_the_export_and_the_cli(cenv, downloads):
    s = cenv["scores"]
    p = float(s.loc[s["transaction_id"].astype(str) == cenv["query"], "probability"].iloc[0])
    # new thresholds that move the query to another band than the checkpoint's (0.5 / 0.9)
    review = 0.2
    decline = round((p + review) / 2, 4) if p < 0.9 else round(min(p + 0.0005, 1.0), 4)
    band = cv.decision_band(p, review, decline)
    assert band != cv.decision_band(p, 0.5, 0.9)
    with CaseStore(cenv["db"]) as st_:
        st_.set_thresholds(cenv["bundle"].sha256, review, decline, actor="sup")
    n_flag = int((s["probability"] >= review).sum())
    n_flag_entity = int((s.loc[s["entity_id"] == cenv["entity"], "probability"] >= review).sum())

    at = _page("pages/cases.py")
    assert _metrics(at)["Flagged transactions"] == f"{n_flag:,}"
    assert f"review threshold {review:.3f}" in at.caption[-1].value or any(
        f"review threshold {review:.3f}" in c.value for c in at.caption)

    at = _page("pages/queue.py")
    assert f"review **{review:.3f}**" in at.expander[0].label and f"decline **{decline:.3f}**" in at.expander[0].label
    q = at.dataframe[1].value
    assert (q["max_probability"] >= review).all()
    assert q["band"].tolist() == [cv.decision_band(x, review, decline) for x in q["max_probability"]]

    at = _page("pages/case.py", entity_id=cenv["entity"], query_id=cenv["query"], trust_show=True)
    m = _metrics(at)
    assert m["Review threshold"] == f"{review:.3f}" and m["Decline threshold"] == f"{decline:.3f}"
    assert m["Flagged"] == f"{n_flag_entity:,}"
    assert m["Decision"] == cv.BAND_LABELS[band] and m["Decision band"] == cv.BAND_LABELS[band]
    fp = next(x for x in at.metric if x.label == ("Fraud probability" if cenv["bundle"].calibrated else "Fraud score"))
    assert fp.proto.body == f"{p - review:+.3f} vs threshold" or f"{p - review:+.3f}" in str(fp.proto)
    at.tabs[-1]  # the What-if tab is rendered with the others
    assert m["What-if decision"] == cv.BAND_LABELS[band]  # no edit: the original score's band

    at.button(key="dl_prepare").click().run()
    _ok(at)
    report = json.loads(_download(downloads, ".json"))
    assert report["score"]["thresholds"]["review"] == review
    assert report["score"]["thresholds"]["decline"] == decline
    assert report["score"]["decision_band"] == band

    at = _page("pages/model.py")
    m = _metrics(at)
    assert m["Review threshold"] == f"{review:.3f}" and m["Decline threshold"] == f"{decline:.3f}"

    from engine.cli import app

    r = CliRunner().invoke(app, ["score", "--data", str(cenv["data"]), "--spec", cenv["spec"], "--model",
                                 str(cenv["model"]), "--out", str(cenv["db"].parent / "s.parquet")])
    assert r.exit_code == 0, r.output
    assert f"{n_flag:,} transactions at or above the review threshold {review:.3f}" in " ".join(r.output.split())


def test_decision_band_is_one_rule():
    assert [cv.decision_band(x, 0.2, 0.9) for x in (0.1, 0.2, 0.5, 0.9, 0.979)] == [
        "below_review", "review", "review", "decline", "decline"]
    with pytest.raises(ValueError, match="finite"):
        cv.decision_band(float("nan"), 0.2, 0.9)
    from engine.cases import report as rp

    assert rp.decision_band is cv.decision_band


# --------------------------------------------------------------------------------- item 12
def test_exports_carry_the_sessions_whatif_edits_and_verdicts(cenv, downloads):
    from pypdf import PdfReader

    edit = {"op": "change", "transaction_id": _earlier(cenv), "values": {"amount": 4321.5}}
    at = _page("pages/case.py", entity_id=cenv["entity"], query_id=cenv["query"], trust_show=True,
               whatif_edits={cenv["query"]: [edit]}, trust_sanity_models=[cenv["bundle"].sha256])
    assert not at.get("download_button") or all(
        b.proto.label not in ("Download PDF", "Download JSON") for b in at.get("download_button"))
    at.button(key="dl_prepare").click().run()
    _ok(at)
    exports = ["Download PDF", "Download JSON", "Download CSV"]
    assert [b.proto.label for b in at.get("download_button") if b.proto.label in exports] == exports
    report = json.loads(_download(downloads, ".json"))
    wi = report["trust"]["what_if"]
    assert wi["edits"] == [edit] and wi["edited_transaction_ids"] == [edit["transaction_id"]]
    assert wi["probability"] == pytest.approx(at.session_state["whatif_result"][cenv["query"]]["probability"])
    verdicts = report["trust"]["randomisation"]["verdicts"]
    assert set(verdicts) == {"attention", "integrated_gradients", "shap", "occlusion"}
    assert {v["verdict"] for v in verdicts.values()} <= {"evidence", "not evidence"}
    text = " ".join(" ".join(pg.extract_text() for pg in PdfReader(io.BytesIO(_download(downloads, ".pdf"))).pages)
                    .split())
    assert "What-if edits in force" in text and "amount=4321.5" in text and "Model-parameter randomisation" in text

    # another edit: the prepared exports no longer match the page, so they are prepared again
    at.session_state["whatif_edits"] = {cenv["query"]: [edit, {**edit, "values": {"amount": 1.0}}]}
    at.run()
    _ok(at)
    assert "Download JSON" not in [b.proto.label for b in at.get("download_button")]
    assert at.button(key="dl_prepare") is not None


def test_each_export_carries_its_own_user_and_the_notes_added_since(cenv, downloads):
    """The prepared report is cached per server process: a second user's export of the same case
    names the second user, and a note added after the first export is in the next one."""
    at = _page("pages/case.py", entity_id=cenv["entity"], query_id=cenv["query"])
    at.button(key="dl_prepare").click().run()
    _ok(at)
    first = json.loads(_download(downloads, ".json"))
    assert first["exported_by"] == "alice"
    case_id = int(first["case"]["case_id"])
    store = CaseStore(cenv["db"])
    store.add_note(case_id, "called the cardholder: card was stolen", analyst="carol")
    downloads.clear()
    at2 = _page("pages/case.py", user=ac.Identity("bob", "supervisor", "password"),
                entity_id=cenv["entity"], query_id=cenv["query"])
    at2.button(key="dl_prepare").click().run()
    _ok(at2)
    second = json.loads(_download(downloads, ".json"))
    assert second["exported_by"] == "bob"
    assert second["report_id"] != first["report_id"]
    assert [n["text"] for n in second["disposition"]["notes"]] == ["called the cardholder: card was stolen"]
    assert [n["text"] for n in first["disposition"]["notes"]] == []


def test_a_download_is_audited_at_the_click_and_refused_for_a_removed_user(cenv, downloads, monkeypatch, tmp_path):
    """Drawing the buttons serves nothing and writes nothing; each click writes its audit row
    before the bytes are served; a user removed from the credentials file since the page was
    drawn gets nothing; a download the store cannot record is refused and the page says why at its
    next run (review findings: the bytes were at a media URL as soon as the buttons were drawn, and
    the audit row was written only by the click callback; later, the reason of a refusal was lost)."""
    import hashlib
    import os
    import shutil
    import sqlite3

    users = tmp_path / "users.toml"  # a copy: this test removes alice from it
    shutil.copy(os.environ["FRAUDLENS_USERS"], users)
    monkeypatch.setenv("FRAUDLENS_USERS", str(users))
    at = _page("pages/case.py", entity_id=cenv["entity"], query_id=cenv["query"])
    at.button(key="dl_prepare").click().run()
    _ok(at)
    with CaseStore(cenv["db"]) as s:
        assert not len(s.audit_log(action="report_exported"))
    js = _download(downloads, ".json")
    report = json.loads(js)
    pdf = _download(downloads, ".pdf")
    with CaseStore(cenv["db"]) as s:
        a = s.audit_log(int(report["case"]["case_id"]), action="report_exported")
        assert a["actor"].tolist() == ["alice", "alice"]
        assert [x["format"] for x in a["after"]] == ["json", "pdf"]
        assert {x["report_sha256"] for x in a["after"]} == {report["report_sha256"]}
        # each row names the file served (the report sha is the same for the three formats)
        assert [x["file_sha256"] for x in a["after"]] == [hashlib.sha256(js).hexdigest(), hashlib.sha256(pdf).hexdigest()]

    # the store cannot take the row: refused, and the page's next run says why
    from engine.cases.store.audit import AuditMixin

    def locked(self, *a, **k):
        raise sqlite3.OperationalError("database is locked")

    with monkeypatch.context() as m:
        m.setattr(AuditMixin, "record_export", locked)
        with pytest.raises(sqlite3.OperationalError):
            _download(downloads, ".csv")
    at.run()
    assert any("CSV download was refused" in e.value and "database is locked" in e.value for e in at.error), [
        e.value for e in at.error]

    ac.write_users(users, {k: v for k, v in ac.load_users(users).items() if k != "alice"})
    with pytest.raises(ac.AccessDenied):
        _download(downloads, ".csv")
    with CaseStore(cenv["db"]) as s:
        assert len(s.audit_log(action="report_exported")) == 2


def test_fraudlens_report_writes_the_report_the_dashboard_exports(cenv, downloads, tmp_path):
    """`fraudlens report` and the dashboard's JSON export of the same case and transaction agree on
    everything but the report's identity (id, hash, export and scoring time, run times) and the
    session's trust checks, which only a dashboard session has (review finding: the CLI report had
    no per-field block and no max_rows, and its test compared the shared function with itself)."""
    import streamlit as st

    st.cache_data.clear()  # the page computes (and stores in this test's data dir) what the CLI then reads
    at = _page("pages/case.py", entity_id=cenv["entity"], query_id=cenv["query"])
    at.button(key="dl_prepare").click().run()
    _ok(at)
    page = json.loads(_download(downloads, ".json"))
    from test_app import PASSWORD

    out = tmp_path / "cli"
    r = CliRunner().invoke(app_cli(), ["report", "--case", str(page["case"]["case_id"]), "--data", str(cenv["data"]),
                                       "--spec", cenv["spec"], "--model", str(cenv["model"]), "--transaction",
                                       cenv["query"], "--formats", "json", "--out", str(out), "--user", "alice",
                                       "--password-stdin"], input=PASSWORD + "\n")
    assert r.exit_code == 0, r.output
    cli = json.loads(next(out.iterdir()).read_text(encoding="utf-8"))

    assert "explanations stored" in " ".join(r.output.split())  # the dashboard's explanations, read back

    # the log's head when each was made: the page's download wrote its audit row before the CLI ran
    assert cli["audit_anchor"]["row_id"] > page["audit_anchor"]["row_id"] >= 1

    def same(d):  # run times ("elapsed_s", at any depth) differ between two computations
        if isinstance(d, dict):
            return {k: same(v) for k, v in d.items() if k not in ("report_id", "report_sha256", "exported_at",
                                                                  "scored_at", "library_versions", "elapsed_s",
                                                                  "audit_anchor")}
        return [same(v) for v in d] if isinstance(d, list) else d

    a, b = same(page), same(cli)
    assert a.keys() == b.keys() and "field_attribution" in b and "history_effect" in b and b["trust"]["reasons"]
    assert [k for k in a if a[k] != b[k]] == []


def app_cli():
    from engine.cli import app

    return app
