"""``fraudlens bench explanations`` (engine.cli -> engine.trust.bench.main) on a slice of the demo
data with a tiny untrained model: the markdown it writes has one table row per method."""

from __future__ import annotations

import pandas as pd
import torch
from typer.testing import CliRunner

from engine.cases import view as cv
from engine.cli import app
from engine.data.csv_writer import write_csv
from tiny_models import demo_slice, tiny_checkpoint

METHODS = ["attention", "integrated_gradients", "shap", "occlusion"]


def test_bench_explanations_writes_one_row_per_method(tmp_path):
    data = demo_slice(tmp_path / "tx.csv", 400)
    spec = cv.demo_spec_name()
    src = cv.load_source(data, spec)
    # review threshold 0: every transaction is flagged, so the bench has cases to explain
    tiny_checkpoint(src.frame, src.spec, tmp_path / "model", {"thresholds": {"review": 0.0}})
    out = tmp_path / "bench" / "explanations.md"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = CliRunner().invoke(app, ["bench", "explanations", "--data", str(data), "--spec", spec,
                                       "--model", str(tmp_path / "model"), "--max-cases", "2",
                                       "--methods", ",".join(METHODS), "--out", str(out),
                                       "--shap-reference-samples", "400", "--randomisation-cases", "3"])
    finally:
        torch.set_num_threads(n)
    assert res.exit_code == 0, res.output
    text = out.read_text()
    main, fields = text.split("|fields -->", 1)  # the per-field section follows the main one
    fields, planted = fields.split("<!-- /bench:", 1)  # then the planted-cause section (demo data)
    assert "|planted -->" in planted and "must not name a planted pattern" in planted
    reasons = text.split("|reasons -->", 1)[1].split("<!-- /bench:", 1)[0]  # reason-code accuracy, same cases
    assert "Reason codes of 2 cases, every number recomputed" in reasons and "Failed checks: 0 of" in reasons
    rand = text.split("|randomisation -->", 1)[1]  # the randomisation section: every method and the dummies
    for m in [*METHODS, "dummy_amount", "dummy_recency", "dummy_row_encoder"]:
        assert f"| {m} | " in rand
    assert "| dummy_amount | not evidence | head |" in rand  # the broken explainer fails, whatever the model
    lines = main.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| method | cases"))
    end = next(i for i in range(first, len(lines)) if not lines[i].startswith("|"))
    table = [line for line in lines[first:end] if line.startswith("| ")]
    assert table[0].startswith("| method | cases | deletion AOPC@10")
    rows = table[1:]
    names = [r.split("|")[1].strip().removesuffix(" (does not beat most recent first)") for r in rows]
    assert names == [*METHODS, "baseline: most recent first (no model)", "baseline: largest absolute amount first (no model)"]
    assert all(r.split("|")[2].strip() == "2" for r in rows)  # two cases each
    ftable = [line for line in fields.splitlines() if line.startswith("| ")]
    assert ftable[0].startswith("| method | cases | fields counted | sign agreement")
    fnames = [r.split("|")[1].strip() for r in ftable[1:]]
    assert fnames[0].startswith("IG from the typical query") and fnames[-1] == "exact field Shapley values"
    assert len(fnames) == 4 and all(r.split("|")[2].strip() == "2" for r in ftable[1:])
    assert "History effect over the same 2 flagged cases" in fields
    assert "written to" in res.output
    # the SHAP estimator's error against its reference: one row per case + the mean
    sec = lines[lines.index("### SHAP error against the exact / high-sample reference"):]
    acc = [line for line in sec if line.startswith("| ")]
    assert acc[0].startswith("| case | P | estimator") and len(acc) == 1 + 2 + 1 and acc[-1].startswith("| **mean**")


def test_bench_explanations_reports_a_missing_model(tmp_path):
    res = CliRunner().invoke(app, ["bench", "explanations", "--model", str(tmp_path / "nope"), "--max-cases", "1",
                                   "--out", str(tmp_path / "x.md")])
    assert res.exit_code == 2, res.output  # reported by _fail, not a traceback
    assert not (tmp_path / "x.md").exists()


def _one_section(tmp_path, n_rows: int, *flags: str):
    """``bench explanations`` with ``flags`` on ``n_rows`` demo rows and a tiny checkpoint flagging
    everything, one torch thread: (data path, spec name, result, output file)."""
    data = demo_slice(tmp_path / "tx.csv", n_rows)
    spec = cv.demo_spec_name()
    src = cv.load_source(data, spec)
    tiny_checkpoint(src.frame, src.spec, tmp_path / "model", {"thresholds": {"review": 0.0}})
    out = tmp_path / "explanations.md"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = CliRunner().invoke(app, ["bench", "explanations", "--data", str(data), "--spec", spec,
                                       "--model", str(tmp_path / "model"), "--out", str(out), *flags])
    finally:
        torch.set_num_threads(n)
    return data, spec, res, out


def test_bench_explanations_planted_only_writes_only_the_planted_section(tmp_path):
    data, spec, res, out = _one_section(tmp_path, 3000, "--planted-only")
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert text.count("<!-- bench:") == 1 and "|planted -->" in text and "| method | cases | deletion" not in text
    assert "top-2 reason codes name the planted pattern" in text or "No planted-cause episode" in text
    assert "must not name a planted pattern" in text
    # a file without planted causes is refused with a clear message
    plain = tmp_path / "plain.csv"
    raw = pd.read_csv(data, dtype=str, keep_default_na=False).drop(columns=["Fraud Episode", "Fraud Kind", "Fraud Cause"])
    write_csv(raw, plain)
    res = CliRunner().invoke(app, ["bench", "explanations", "--data", str(plain), "--spec", "tabformer",
                                   "--model", str(tmp_path / "model"), "--out", str(tmp_path / "y.md"),
                                   "--planted-only"])
    assert res.exit_code == 2 and "Fraud Cause" in res.output, res.output


def test_bench_explanations_reasons_only_writes_only_the_reason_accuracy_section(tmp_path):
    _, _, res, out = _one_section(tmp_path, 400, "--max-cases", "3", "--reasons-only")
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert text.count("<!-- bench:") == 1 and "|reasons -->" in text and "| method | cases | deletion" not in text
    assert "Reason codes of 3 cases, every number recomputed" in text and "| reason kind | reasons | checks |" in text
    checks = [line for line in text.splitlines() if line.startswith("| (order of each case's list) |")]
    assert checks == ["| (order of each case's list) | - (3 lists) | 3 | 3 | 0 | 0 |"]  # the ranking check, one per case
    both = CliRunner().invoke(app, ["bench", "explanations", "--model", str(tmp_path / "model"), "--out",
                                    str(tmp_path / "z.md"), "--planted-only", "--reasons-only"])
    assert both.exit_code == 2 and "choose one" in both.output, both.output


def test_score_prints_a_small_review_threshold_with_its_digits(tmp_path, monkeypatch):
    """A review threshold of 6.8e-06 printed with 3 decimals read "0.000": as if every transaction
    were flagged. Printed with 4 significant digits."""
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "data"))
    data = demo_slice(tmp_path / "tx.csv", 300)
    src = cv.load_source(data, cv.demo_spec_name())
    tiny_checkpoint(src.frame, src.spec, tmp_path / "model", {"thresholds": {"review": 6.8e-06, "decline": 1.8e-05}})
    res = CliRunner().invoke(app, ["score", "--data", str(data), "--model", str(tmp_path / "model"),
                                   "--out", str(tmp_path / "s.parquet")])
    assert res.exit_code == 0, res.output
    assert "at or above the review threshold 6.8e-06 " in res.output, res.output
