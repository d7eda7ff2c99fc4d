"""Cases belong to their data source (issue 12, item 6), through the dashboard: a second file
with the same entity ids gets its own cases; it neither takes over the first file's
disposition nor overwrites its figures, and switching back and forth writes no audit rows."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from engine.cases import view as cv
from engine.cases.store import CaseStore, source_id

from test_app import _ok, signed_in, users_file, world  # noqa: F401 - the shared fixtures

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def two_files(world, tmp_path, monkeypatch, users_file):  # noqa: F811
    """File A = the world's demo slice; file B = the same rows, the same entity ids, its first
    data row's amount changed (other bytes: another source)."""
    text = world["data"].read_text(encoding="utf-8").splitlines(keepends=True)
    header = text[0].split(",")
    amount = header.index("Amount")
    row = text[1].split(",")
    row[amount] = "$1234.56"
    b = tmp_path / "other.csv"
    b.write_text(text[0] + ",".join(row) + "".join(text[2:]), encoding="utf-8")
    monkeypatch.setenv("FRAUDLENS_SPEC", world["spec"])
    monkeypatch.setenv("FRAUDLENS_MODEL", str(world["model"]))
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("FRAUDLENS_USERS", str(users_file))  # alice (analyst) signs in: _queue
    monkeypatch.delenv("FRAUDLENS_DEMO", raising=False)
    monkeypatch.delenv("FRAUDLENS_DATA_ROOTS", raising=False)
    monkeypatch.delenv("FRAUDLENS_FOUR_EYES", raising=False)
    monkeypatch.delenv("FRAUDLENS_MAX_ROWS", raising=False)
    return {**world, "a": world["data"], "b": b, "db": tmp_path / "store" / "cases.sqlite3"}


def _queue(monkeypatch, path) -> AppTest:
    monkeypatch.setenv("FRAUDLENS_DATA", str(path))
    at = signed_in("alice")
    at.switch_page("pages/queue.py")
    at.run()
    _ok(at)
    return at


def test_second_file_with_same_entities_gets_its_own_cases(two_files, monkeypatch):
    sha, spec = two_files["bundle"].sha256, two_files["spec"]
    src_a = source_id(cv.file_identity(two_files["a"]), spec)
    src_b = source_id(cv.file_identity(two_files["b"]), spec)
    assert src_a != src_b
    _queue(monkeypatch, two_files["a"])
    with CaseStore(two_files["db"]) as s:
        qa = s.queue(sha, 0.0, source_id=src_a)
        entity = qa.entity_id.iloc[0]
        case_a = s.find_case(sha, src_a, entity)
        s.record_disposition(case_a["id"], "false_positive", "demo card, legit", analyst="alice")
        n_rows = len(s.audit_log())
        figures_a = {k: case_a[k] for k in ("max_probability", "max_amount", "n_transactions")}

    at = _queue(monkeypatch, two_files["b"])
    table = at.dataframe[1].value
    with CaseStore(two_files["db"]) as s:
        case_b = s.find_case(sha, src_b, entity)
        assert case_b is not None and case_b["id"] != case_a["id"]
        assert case_b["state"] == "open" and s.history(case_b["id"]).empty
        assert set(table["case_id"]) <= set(s.queue(sha, 0.0, source_id=src_b).case_id)
        assert case_a["id"] not in set(table["case_id"])
        a_now = s.find_case(sha, src_a, entity)
        assert a_now["state"] == "false_positive"
        assert {k: a_now[k] for k in figures_a} == figures_a
        assert len(s.queue(sha, 0.0, source_id=src_b)) == len(qa)
        log = s.audit_log()
        assert "score_updated" not in set(log.action)
        assert set(log.action.iloc[n_rows:]) == {"case_created"}
        n_rows = len(log)

    for path in (two_files["a"], two_files["b"], two_files["a"]):  # switching writes nothing
        _queue(monkeypatch, path)
    with CaseStore(two_files["db"]) as s:
        assert len(s.audit_log()) == n_rows
