"""``fraudlens report``: a case's compliance report from the command line, signed in with the
credentials file, each file an audited download; the report equals the dashboard's path
(engine.cases.report.case_export) and verifies; refusals write nothing."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from pypdf import PdfReader
from typer.testing import CliRunner

from engine.cases import report as rp
from engine.cases import view as cv
from engine.cases.store import CaseStore, source_id
from engine.cli import app
from engine.data.spec import source_spec_key
from engine.serve import access as ac
from tiny_models import demo_slice, tiny_checkpoint

PW = "correct horse battery staple"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli-report")
    data = demo_slice(d / "tx.csv", 400)
    src = cv.load_source(data, cv.demo_spec_name())
    tiny_checkpoint(src.frame, src.spec, d / "model", {"name": "tiny-cli-report", "thresholds": {"review": 0.5}},
                    context_length=8, min_history=4)
    bundle = cv.load_model(d / "model")
    scores = cv.score_source(bundle, src.frame)
    rk = cv.rank_entities(scores, bundle.threshold)
    users = d / "users.toml"
    for name, role in (("alice", "analyst"), ("erin", "auditor"), ("root", "admin")):
        ac.add_user(users, name, role, PW)
    return {"dir": d, "data": data, "src": src, "bundle": bundle, "scores": scores, "ranking": rk, "users": users}


@pytest.fixture
def env(world, tmp_path, monkeypatch):
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("FRAUDLENS_USERS", str(world["users"]))
    monkeypatch.setenv("FRAUDLENS_PSEUDONYM_SALT", "t")
    (tmp_path / "store").mkdir()
    rk, src, b = world["ranking"], world["src"], world["bundle"]
    rows = pd.DataFrame({"entity_id": rk["entity_id"].astype(str), "max_probability": rk["max_probability"],
                         "max_transaction_id": rk["top_transaction_id"].astype(str), "first_ts": rk["first_seen"],
                         "last_ts": rk["last_seen"], "max_amount": 10.0, "n_transactions": rk["n_transactions"],
                         "n_known_fraud": rk["known_frauds"]})
    db = tmp_path / "store" / "cases.sqlite3"
    with CaseStore(db, four_eyes=False) as s:
        s.upsert_cases(b.sha256, rows, source_id=source_id(src.file_sha256, source_spec_key(src.spec)))
        cid = int(s.find_case(b.sha256, source_id(src.file_sha256, source_spec_key(src.spec)),
                              str(rk["entity_id"].iloc[0]))["id"])
        s.record_disposition(cid, "escalate", "called the card holder", analyst="alice")
    return {**world, "db": db, "case": cid, "out": tmp_path / "out", "entity": str(rk["entity_id"].iloc[0])}


def _run(env, user="alice", password=PW, *extra):
    args = ["report", "--case", str(env["case"]), "--data", str(env["data"]), "--model", str(env["dir"] / "model"),
            "--out", str(env["out"]), "--user", user, "--password-stdin", *extra]
    return CliRunner().invoke(app, args, input=password + "\n")


def test_report_writes_three_verified_files_and_audits_each(env):
    with CaseStore(env["db"]) as s:
        head = s.audit_anchor()  # the log's last row before the export
    res = _run(env)
    assert res.exit_code == 0, res.output
    files = sorted(env["out"].iterdir())
    assert [f.suffix for f in files] == [".csv", ".json", ".pdf"]
    doc = json.loads(next(f for f in files if f.suffix == ".json").read_text(encoding="utf-8"))
    rp.validate(doc)
    assert rp.verify_report(doc)
    assert doc["exported_by"] == "alice" and doc["case"]["case_id"] == env["case"]
    assert doc["score"]["transaction_id"] == cv.mask(env["ranking"]["top_transaction_id"].iloc[0])  # the riskiest
    assert doc["narrative"]["disposition"]["note"] == "called the card holder"
    mine = env["scores"][env["scores"]["entity_id"].astype(str) == env["entity"]].sort_values("timestamp", kind="stable")
    ids = mine["transaction_id"].astype(str).tolist()
    top = str(env["ranking"]["top_transaction_id"].iloc[0])
    assert doc["narrative"]["later_activity"]["n"] == len(ids) - 1 - ids.index(top)  # what the report does not cover
    assert env["entity"] not in json.dumps(doc["case"])  # pseudonymised
    text = " ".join(p.extract_text() for p in PdfReader(str(next(f for f in files if f.suffix == ".pdf"))).pages)
    assert doc["report_id"] in text and "by alice" in text
    flat = " ".join(text.split())
    la = doc["narrative"]["later_activity"]
    assert "After the explained transaction" in flat
    assert (f"{la['n']} later transaction(s)" in flat) if la["n"] else ("no later transaction of this entity" in flat)
    with CaseStore(env["db"]) as s:
        a = s.audit_log(env["case"], action="report_exported")
        assert a["actor"].tolist() == ["alice"] * 3
        assert sorted(x["format"] for x in a["after"]) == ["csv", "json", "pdf"]
        assert {x["report_sha256"] for x in a["after"]} == {doc["report_sha256"]}
        import hashlib

        assert sorted(x["file_sha256"] for x in a["after"]) == sorted(hashlib.sha256(f.read_bytes()).hexdigest()
                                                                      for f in files)
        assert s.verify_audit_chain().ok
    # (tests/dashboard/test_consistency.py compares this report with the dashboard's own JSON export)
    import stat

    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)  # the owner's only, as the store
    assert "field_attribution" in doc and "history_effect" in doc and doc["trust"]["reasons"] is not None
    # the report carries the log's head as it was made: a copy of it off the host (engine.cases.store.anchor)
    assert doc["audit_anchor"] == head.as_dict() and head.row_id >= 2
    assert f"row {head.row_id}, sha256 {head.row_hash}" in flat
    ok = CliRunner().invoke(app, ["audit", "verify", "--anchors", str(next(f for f in files if f.suffix == ".json"))])
    assert ok.exit_code == 0 and "anchors: 1 checked, all match" in ok.output, ok.output


def test_report_explains_the_transaction_asked_for_and_only_the_formats_asked_for(env):
    tx = env["scores"].loc[env["scores"]["entity_id"].astype(str) == env["entity"], "transaction_id"].astype(str)
    res = _run(env, "erin", PW, "--transaction", tx.iloc[-2], "--formats", "json")  # an auditor views cases
    assert res.exit_code == 0, res.output
    (f,) = list(env["out"].iterdir())
    assert json.loads(f.read_text(encoding="utf-8"))["score"]["transaction_id"] == cv.mask(tx.iloc[-2])


@pytest.mark.parametrize("user, password, extra, words", [
    ("alice", "wrong", (), "unknown user or wrong password"),
    ("mallory", PW, (), "unknown user or wrong password"),
    ("root", PW, (), "may not view cases"),
    ("alice", PW, ("--formats", "docx"), "--formats"),
    ("alice", PW, ("--transaction", "no-such-tx"), "is not one of case"),
])
def test_refusals_write_nothing(env, user, password, extra, words):
    res = _run(env, user, password, *extra)
    assert res.exit_code == 2 and words in " ".join(res.output.split()), res.output
    assert not env["out"].exists() or not list(env["out"].iterdir())
    with CaseStore(env["db"]) as s:
        assert not len(s.audit_log(env["case"], action="report_exported"))


def test_a_case_of_the_scoring_service_is_refused_saying_so(env, tmp_path):
    """New-user trial: a case opened by fraudlens serve was refused as "another data file or model
    than ... model 7c9604faf83f (its model 7c9604faf83f)", the same model named twice."""
    from engine.serve.casework import service_source_id

    b = env["bundle"]
    rows = pd.DataFrame({"entity_id": ["svc-card"], "max_probability": [0.9], "max_transaction_id": ["s1"],
                         "first_ts": pd.Timestamp("2024-01-01"), "last_ts": pd.Timestamp("2024-01-01"),
                         "max_amount": 10.0, "n_transactions": 1, "n_known_fraud": 0})
    with CaseStore(env["db"], four_eyes=False) as s:
        s.upsert_cases(b.sha256, rows, source_id=service_source_id(b))
        cid = int(s.find_case(b.sha256, service_source_id(b), "svc-card")["id"])
    res = CliRunner().invoke(app, ["report", "--case", str(cid), "--data", str(env["data"]), "--model",
                                   str(env["dir"] / "model"), "--out", str(env["out"]), "--user", "alice",
                                   "--password-stdin"], input=PW + "\n")
    assert res.exit_code == 2 and "was opened by the scoring service" in " ".join(res.output.split()), res.output
    assert not env["out"].exists() or not list(env["out"].iterdir())


def test_a_case_of_another_file_or_model_is_refused(env, tmp_path):
    other = demo_slice(tmp_path / "other.csv", 300)
    res = CliRunner().invoke(app, ["report", "--case", str(env["case"]), "--data", str(other), "--model",
                                   str(env["dir"] / "model"), "--out", str(env["out"]), "--user", "alice",
                                   "--password-stdin"], input=PW + "\n")
    assert res.exit_code == 2 and f"was opened from another data file (or the same file read with another spec) than " \
        f"--data {other.name}" in " ".join(res.output.split()), res.output
    res = _run(env, "alice", PW)
    assert res.exit_code == 0  # the case's own file
    res = CliRunner().invoke(app, ["report", "--case", "99999", "--data", str(env["data"]), "--model",
                                   str(env["dir"] / "model"), "--out", str(tmp_path / "o2"), "--user", "alice",
                                   "--password-stdin"], input=PW + "\n")
    assert res.exit_code == 2 and "not in the case store" in res.output


def test_no_credentials_file_no_report(env, monkeypatch):
    monkeypatch.delenv("FRAUDLENS_USERS")
    res = _run(env)
    assert res.exit_code == 2 and "needs sign-in" in res.output


def test_formats_once_never_overwrite_and_no_file_without_its_audit_row(env, monkeypatch):
    """Review findings: --formats pdf,pdf wrote one file and three audit rows; an existing file (or a
    link planted at its name) was written through; a store that could not take the audit row left
    the file on disk unaudited."""
    import sqlite3

    res = _run(env, "alice", PW, "--formats", "pdf,PDF,pdf")
    assert res.exit_code == 0, res.output
    assert len(list(env["out"].iterdir())) == 1
    with CaseStore(env["db"]) as s:
        assert len(s.audit_log(env["case"], action="report_exported")) == 1

    # a file or a symbolic link already at the report's name: refused, the target untouched
    monkeypatch.setattr(rp, "report_filename", lambda doc, ext: f"fixed.{ext}")
    target = env["out"].parent / "elsewhere.txt"
    target.write_text("keep me")
    (env["out"] / "fixed.json").symlink_to(target)
    res = _run(env, "alice", PW, "--formats", "json")
    assert res.exit_code == 2 and "never overwrites" in " ".join(res.output.split()), res.output
    assert target.read_text() == "keep me"

    # the audit row cannot be written: no file is left, and the error says why
    from engine.cases.store.audit import AuditMixin

    def locked(self, *a, **k):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(AuditMixin, "record_export", locked)
    res = _run(env, "alice", PW, "--formats", "csv")
    assert res.exit_code == 2 and "could not record the CSV download" in " ".join(res.output.split()), res.output
    assert not (env["out"] / "fixed.csv").exists()
