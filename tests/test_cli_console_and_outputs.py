"""What the CLI prints and writes for data that holds card numbers and personal data: the console's
reject table masks card numbers and cuts long values (the rejected file keeps them raw, to fix the
row); score / explain / rejected files are 0600 and replace a symlink at the path instead of writing
through it; ``--help`` never cuts an option name when stdout is not a terminal."""

from __future__ import annotations

import json
import os
import stat

import pandas as pd
import pytest
from typer.testing import CliRunner

from engine.cases.redact import mask_card_number
from engine.cli import app
from engine.cli_common import SHOWN_VALUE_CHARS, _shown_value
from tiny_models import demo_slice

runner = CliRunner()
#: a record with 20 cells (the demo spec has 18): its rejected value is the whole raw line
MALFORMED = ("0,0,2023,2,1,11:00,$5.00,4000 1234 5678 9010,John Smith,12 Long Street Springfield,Hialeah,FL,"
             "33010.0,5912,,No,,,,")
TOO_LARGE = "0,0,2023,2,1,10:00,$4111111111111111,Swipe Transaction,123,Hialeah,FL,33010.0,5912,,No,,,"


@pytest.fixture
def data(tmp_path):
    p = demo_slice(tmp_path / "tx.csv", 60)
    with open(p, "a", encoding="utf-8") as f:
        f.write(TOO_LARGE + "\n" + MALFORMED + "\n")
    return p


def _mode(p) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_the_console_masks_card_numbers_and_cuts_values_the_rejected_file_keeps_them(data, tmp_path):
    old = os.umask(0o022)
    try:
        r = runner.invoke(app, ["score", "--data", str(data), "--out", str(tmp_path / "s.csv"),
                                "--rejected", str(tmp_path / "rejected.csv")])
    finally:
        os.umask(old)
    assert r.exit_code == 0, r.output
    assert "rows read 62 = accepted 60 + rejected 2" in r.output
    lines = r.output.splitlines()
    big = next(ln for ln in lines if ln.lstrip().startswith("61 "))
    assert "$411111******1111" in big and "4111111111111111" not in r.output
    # the raw line, masked by engine.cases.redact (whose separators may mask more of a CSV line), then cut
    cut = next(ln for ln in lines if ln.lstrip().startswith("62 "))
    shown = mask_card_number(MALFORMED)[:SHOWN_VALUE_CHARS - 1] + "…"
    assert len(shown) == 60 and shown in cut and "record has 20 cells, expected 18" in cut
    assert shown.startswith("0,0,2023,") and "John Smith,12 " in shown
    assert "1234 5678" not in r.output and "Long Street" not in r.output and "Springfield" not in r.output
    # the file keeps every value raw (for fixing the row), written 0600 as the scores
    rej = pd.read_csv(tmp_path / "rejected.csv", dtype=str, keep_default_na=False)
    assert rej["value"].tolist() == ["$4111111111111111", MALFORMED]
    assert _mode(tmp_path / "rejected.csv") == 0o600 and _mode(tmp_path / "s.csv") == 0o600
    assert len(pd.read_csv(tmp_path / "s.csv")) == 62


def test_shown_value_masks_before_it_cuts_and_shows_line_breaks():
    assert _shown_value("4111111111111111") == "411111******1111"
    long = "x" * 50 + "4111111111111111" + "y" * 20
    assert _shown_value(long) == "x" * 50 + "411111***…"  # the cut never leaves the number's digits
    assert _shown_value("a\nb\rc\x1b") == "a\\nb\\x0dc\\x1b"
    assert _shown_value("-12.5") == "-12.5" and _shown_value(None) is None


def test_score_and_explain_outputs_replace_a_symlink_and_are_0600(data, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out, rej, expl = tmp_path / "s.csv", tmp_path / "r.csv", tmp_path / "e.json"
    for link in (out, rej, expl):
        link.symlink_to(victim)
    r = runner.invoke(app, ["score", "--data", str(data), "--out", str(out), "--rejected", str(rej)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["explain", "--data", str(data), "--entity", "0:0", "--position", "-1",
                            "--methods", "attention", "--out", str(expl)])
    assert r.exit_code == 0, r.output
    assert victim.read_text() == "keep me"
    for p in (out, rej, expl):
        assert not p.is_symlink() and _mode(p) == 0o600, p
    doc = json.loads(expl.read_text())
    assert doc["schema"] == "fraudlens-explanation/1" and doc["entity_id"] == "0:0"
    assert len(pd.read_csv(out)) == 62 and len(pd.read_csv(rej)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.json", "r.csv", "s.csv", "tx.csv", "victim.txt"]


def test_help_names_every_option_in_full_when_stdout_is_not_a_terminal():
    r = runner.invoke(app, ["train", "--help"])
    assert r.exit_code == 0, r.output
    for name in ("--target-precision", "--alerts-per-day", "--windows-per-epoch", "--no-amount-by-value"):
        assert name in r.output, name
    assert "…" not in r.output
    assert max(len(ln) for ln in r.output.splitlines()) == 120  # not the 80-column fallback
    # a narrower terminal is widened; a wider one keeps its width (read at each help, not at import)
    for columns, width in (("60", 120), ("200", 200)):
        r = runner.invoke(app, ["score", "--help"], env={"COLUMNS": columns})
        assert r.exit_code == 0 and max(len(ln) for ln in r.output.splitlines()) == width, columns


def test_train_prints_the_decline_threshold_and_warns_when_it_is_the_review_one(capsys):
    """New-user trial: train chose review = decline = 0.959 and printed neither the decline threshold
    nor that every alert would be declined."""
    from engine.cli_common import _print_calibration

    op = {"review": 0.959, "decline": 0.959, "target": {"kind": "precision", "value": 0.5}, "met": True,
          "validation": {"precision": 0.97, "recall": 1.0, "alerts_per_day": 0.3}}
    _print_calibration({"method": "isotonic"}, op)
    out = " ".join(capsys.readouterr().out.split())
    assert "decline threshold 0.959" in out and "no review band" in out
    _print_calibration({"method": "isotonic"}, {**op, "decline": 0.99})
    out = " ".join(capsys.readouterr().out.split())
    assert "decline threshold 0.990" in out and "no review band" not in out


def test_parquet_score_and_rejected_outputs_replace_a_symlink_and_are_0600(data, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out, rej = tmp_path / "s.parquet", tmp_path / "r.parquet"
    for link in (out, rej):
        link.symlink_to(victim)
    r = runner.invoke(app, ["score", "--data", str(data), "--out", str(out), "--rejected", str(rej)])
    assert r.exit_code == 0, r.output
    assert victim.read_text() == "keep me"
    for p in (out, rej):
        assert not p.is_symlink() and _mode(p) == 0o600, p
    assert len(pd.read_parquet(out)) == 62 and len(pd.read_parquet(rej)) == 2


def test_the_console_masks_an_entity_that_is_a_card_number(tmp_path):
    p = demo_slice(tmp_path / "tx.csv", 30)
    with open(p, "a", encoding="utf-8") as f:
        f.write("4111111111111111,0,2023,2,1,12:00,$abc,Swipe Transaction,123,Hialeah,FL,33010.0,5912,,No,,,\n")
    r = runner.invoke(app, ["score", "--data", str(p), "--out", str(tmp_path / "s.csv"),
                            "--rejected", str(tmp_path / "rejected.csv")])
    assert r.exit_code == 0, r.output
    assert "1 rejected rows" in r.output and "411111******1111:0" in r.output
    assert "4111111111111111" not in r.output
    rej = pd.read_csv(tmp_path / "rejected.csv", dtype=str, keep_default_na=False)
    assert rej["entity_id"].tolist() == ["4111111111111111:0"]  # the file keeps it raw
