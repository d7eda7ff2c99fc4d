"""End to end through the CLI on a small real slice of the Handbook data:
train (tiny) -> score -> explain, checking the row accounting and the outputs."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from engine import cli_common
from engine.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def handbook_slice(shared_data, tmp_path_factory):
    src = shared_data / "handbook" / "transactions.parquet"
    df = pd.read_parquet(src)
    # 300 customers over the first 40 days: enough history and frauds in every period
    custs = np.sort(df["CUSTOMER_ID"].unique())[:300]
    df = df[df["CUSTOMER_ID"].isin(custs) & (df["TX_DATETIME"] < "2018-05-11")]
    # a shuffled order and one broken row: the reader must sort and reject, never drop silently
    df = df.sample(frac=1.0, random_state=0).reset_index(drop=True)
    df["TX_AMOUNT"] = df["TX_AMOUNT"].astype(object)
    df.loc[7, "TX_AMOUNT"] = "twelve"
    out = tmp_path_factory.mktemp("hb") / "slice.csv"
    df.to_csv(out, index=False)
    return out, len(df), int(df["TX_FRAUD"].sum())


def tiny_train(data, model_dir) -> list[str]:
    """`fraudlens train` arguments of a tiny, quick model on the slice (2 epochs, d_model 16, one layer)."""
    return ["train", "--data", str(data), "--spec", "handbook", "--out", str(model_dir), "--epochs", "2",
            "--windows-per-epoch", "120", "--context-length", "32", "--min-history", "16", "--d-model", "16",
            "--n-layers", "1", "--n-heads", "2", "--no-progress", "--train-end", "2018-04-25", "--val-end", "2018-05-03"]


def test_train_score_explain_end_to_end(handbook_slice, tmp_path):
    data, n_rows, _ = handbook_slice
    model_dir = tmp_path / "model"
    r = runner.invoke(app, tiny_train(data, model_dir) + ["--no-activity-ple"])
    assert r.exit_code == 0, r.output
    # the flag reaches the model (score and explain below run it), and the batch follows the windows per epoch
    assert json.loads((model_dir / "checkpoint.json").read_text())["model_config"]["activity_ple"] is False
    assert "batch size 8 (not 64): 120 training windows per epoch give at least 40 optimisation steps" in \
        " ".join(r.output.split())
    assert f"rows read {n_rows:,} = accepted {n_rows - 1:,} + rejected 1" in r.output
    meta = json.loads((model_dir / "checkpoint.json").read_text())
    assert len(meta["sha256"]) == 64 and meta["spec"]["name"] == "handbook"
    assert 0.0 <= meta["metrics"]["test"]["auc_roc"] <= 1.0
    assert meta["training_data"]["rows_rejected"] == 1
    assert (model_dir / "model.safetensors").exists()
    # the LightGBM baseline was trained on the same split and scored on the same test rows
    assert "transformer vs LightGBM baseline" in r.output
    base = json.loads((model_dir / "metrics.json").read_text())["baseline"]
    assert base["test"]["n"] == meta["metrics"]["test"]["n"]
    assert base["test"]["n_fraud"] == meta["metrics"]["test"]["n_fraud"] > 0
    boot = base["bootstrap"]["average_precision"]
    assert boot["a"] == pytest.approx(meta["metrics"]["test"]["average_precision"])
    assert boot["b"] == pytest.approx(base["test"]["average_precision"])
    assert boot["ci_low"] <= boot["diff"] <= boot["ci_high"]
    # calibration fitted on validation, stored and validated; thresholds against the default target
    assert meta["calibration"]["method"] in ("isotonic", "platt") and meta["calibration"]["fitted_on"] == "validation"
    assert "calibration: " in r.output and "operating point (calibrated probability)" in r.output
    op = json.loads((model_dir / "metrics.json").read_text())["operating_point"]
    assert op["target"] == {"kind": "precision", "value": 0.5} and op == meta["operating_point"]
    assert meta["thresholds"]["review"] == op["review"] == meta["metrics"]["test"]["threshold"]
    assert op["test"]["precision"] == pytest.approx(meta["metrics"]["test"]["precision"])
    cm = meta["calibration_metrics"]["test"]
    assert cm["probability"]["n_fraud"] == meta["metrics"]["test"]["n_fraud"]
    assert set(meta["drift_reference"]["fields"]) >= {"amount"}
    # split sanity: what the model card records is what the console said
    assert isinstance(meta["split"]["warnings"], list)
    for w in meta["split"]["warnings"]:
        assert f"warning: {w}" in " ".join(r.output.split()).replace("\n", " ") or w[:60] in r.output

    scores_path = tmp_path / "scores.parquet"
    r = runner.invoke(app, ["score", "--data", str(data), "--spec", "handbook", "--out", str(scores_path),
                            "--model", str(model_dir)])
    assert r.exit_code == 0, r.output
    assert f"rows read {n_rows:,} = rows scored {n_rows - 1:,} + rows rejected 1" in r.output
    s = pd.read_parquet(scores_path)
    assert len(s) == n_rows and s["row_number"].is_unique
    assert (s["status"] == "rejected").sum() == 1
    rej = s[s["status"] == "rejected"].iloc[0]
    assert rej["row_number"] == 8 and rej["rejected_column"] == "TX_AMOUNT" and "twelve" in rej["rejected_value"]
    scored = s[s["status"] == "scored"]
    assert scored["probability"].between(0, 1).all()
    # a calibrated model: "probability" is the map applied to the logit, "score" the sigmoid
    from engine.model.calibration import apply_calibration

    assert np.allclose(scored["probability"], apply_calibration(meta["calibration"], scored["logit"]))
    assert np.allclose(scored["score"], 1 / (1 + np.exp(-scored["logit"].astype(float))))
    assert "on the calibrated fraud probability" in " ".join(r.output.split())

    # explain the highest-scored transaction of the top entity
    top = scored.sort_values("probability", ascending=False).iloc[0]
    out = tmp_path / "explanation.json"
    r = runner.invoke(app, ["explain", "--data", str(data), "--spec", "handbook", "--model", str(model_dir),
                            "--entity", str(top["entity_id"]), "--row", str(int(top["row_number"])),
                            "--out", str(out), "--ig-steps", "20"])
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    ex = doc["explanations"]
    assert set(ex) == {"attention", "attention_rollout", "integrated_gradients", "shap", "occlusion"}
    # the model's answer as `score` wrote it (calibrated), not the explainers' sigmoid(logit) (new-user trial)
    assert doc["score"]["probability"] == pytest.approx(float(top["probability"]), abs=1e-6)
    assert doc["score"]["calibrated"] is True
    assert doc["score"]["flagged"] == bool(float(top["probability"]) >= doc["score"]["review_threshold"])
    assert doc["score"]["review_threshold"] > 0
    # thresholds a supervisor set in the case store apply, as `score` uses them (review finding)
    from engine.cases.store import CaseStore, default_db_path

    with CaseStore(default_db_path()) as cs:
        cs.set_thresholds(meta["sha256"], 0.001, 0.002, actor="carol")
    r = runner.invoke(app, ["explain", "--data", str(data), "--spec", "handbook", "--model", str(model_dir),
                            "--entity", str(top["entity_id"]), "--row", str(int(top["row_number"])),
                            "--out", str(out), "--methods", "attention"])
    assert r.exit_code == 0, r.output
    sc = json.loads(out.read_text())["score"]
    assert (sc["review_threshold"], sc["decline_threshold"]) == (0.001, 0.002) and "carol" in sc["thresholds_source"]
    assert sc["flagged"] == bool(float(top["probability"]) >= 0.001)
    with CaseStore(default_db_path()) as cs:  # back to the checkpoint's for what follows
        cs.set_thresholds(meta["sha256"], *[meta["thresholds"][k] for k in ("review", "decline")], actor="carol")
    for e in ex.values():
        assert e["query_transaction_id"] == str(top["transaction_id"])
        assert e["transaction_ids"][-1] == str(top["transaction_id"])
        assert e["score_logit"] == pytest.approx(float(top["logit"]), abs=1e-4)
    ig = ex["integrated_gradients"]
    assert sum(ig["values"]) == pytest.approx(ig["score_logit"] - ig["reference_logit"], abs=abs(ig["convergence_delta"]) + 1e-3)
    sh = ex["shap"]  # one standard error per value, same order; the query's own entry 0
    assert len(sh["standard_errors"]) == len(sh["values"]) and sh["standard_errors"][-1] == 0.0
    assert sh["extras"]["estimator"] in ("exact", "pruned+exact", "kernel", "pruned+kernel")
    assert sh["convergence_delta"] is None and ig["standard_errors"] is None

    # asking for the rejected row says why it cannot be explained; another entity's row says so
    r = runner.invoke(app, ["explain", "--data", str(data), "--spec", "handbook", "--model", str(model_dir),
                            "--entity", str(top["entity_id"]), "--row", "8", "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2
    assert "row 8 of" in r.output and "was rejected (TX_AMOUNT: amount is not a number)" in r.output
    other = scored[scored["entity_id"] != top["entity_id"]].iloc[0]
    r = runner.invoke(app, ["explain", "--data", str(data), "--spec", "handbook", "--model", str(model_dir),
                            "--entity", str(top["entity_id"]), "--row", str(int(other["row_number"])),
                            "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and f"is not a transaction of entity {str(top['entity_id'])!r}" in r.output


def test_explain_names_the_problem(handbook_slice, tmp_path):
    data, _, _ = handbook_slice
    r = runner.invoke(app, ["explain", "--data", str(data), "--spec", "handbook", "--entity", "no-such",
                            "--row", "3", "--model", "does-not-exist"])
    assert r.exit_code == 2 and "not found" in r.output


def test_score_with_a_model_of_another_spec_says_what_to_do(shared_data, tmp_path):
    r = runner.invoke(app, ["score", "--data", str(shared_data / "banksim" / "banksim_sample.csv"), "--spec", "banksim",
                            "--out", str(tmp_path / "s.parquet")])
    assert r.exit_code == 2
    assert "lacks field(s)" in r.output and "merchant_city" in r.output and "fraudlens train" in r.output
    # forgetting --model: the demo model is named and what it reads
    assert "demo model, used when no --model is given, reads TabFormer-format files only" in " ".join(r.output.split())


def test_a_seed_ensemble_trains_scores_and_explains_as_one_model(handbook_slice, tmp_path):
    """`train --members 2`: one checkpoint whose score is the members' mean logit; `score` and
    `explain` read it like any model (IG complete for that score, every method on the same logit)."""
    data, n_rows, _ = handbook_slice
    model_dir = tmp_path / "ens"
    r = runner.invoke(app, tiny_train(data, model_dir) + ["--members", "2", "--seed", "3", "--no-baseline"])
    assert r.exit_code == 0, r.output
    assert "member 1 of 2 (seed 6," in r.output and "member 2 of 2 (seed 7," in r.output
    meta = json.loads((model_dir / "checkpoint.json").read_text())
    assert meta["model_config"]["n_members"] == 2 and [m["seed"] for m in meta["members"]] == [6, 7]
    from engine.model.checkpoint import load_checkpoint
    from engine.model.ensemble import SeedEnsemble

    b = load_checkpoint(model_dir)
    assert isinstance(b.model, SeedEnsemble)
    scores_path = tmp_path / "scores.parquet"
    r = runner.invoke(app, ["score", "--data", str(data), "--spec", "handbook", "--out", str(scores_path),
                            "--model", str(model_dir)])
    assert r.exit_code == 0, r.output
    s = pd.read_parquet(scores_path)
    assert len(s) == n_rows and (s["status"] == "scored").sum() == n_rows - 1
    top = s[s["status"] == "scored"].sort_values("logit", ascending=False).iloc[0]
    out = tmp_path / "explanation.json"
    r = runner.invoke(app, ["explain", "--data", str(data), "--spec", "handbook", "--model", str(model_dir),
                            "--entity", str(top["entity_id"]), "--row", str(int(top["row_number"])),
                            "--out", str(out), "--ig-steps", "20"])
    assert r.exit_code == 0, r.output
    ex = json.loads(out.read_text())["explanations"]
    for e in ex.values():
        assert e["score_logit"] == pytest.approx(float(top["logit"]), abs=1e-4)
    ig = ex["integrated_gradients"]
    assert sum(ig["values"]) == pytest.approx(ig["score_logit"] - ig["reference_logit"],
                                              abs=abs(ig["convergence_delta"]) + 1e-3)
    r = runner.invoke(app, ["train", "--data", str(data), "--spec", "handbook", "--out", str(tmp_path / "x"),
                            "--members", "2", "--workers", "2", "--no-progress"])
    assert r.exit_code == 2 and "ensemble (--members) trains on one machine only" in " ".join(r.output.split())


def test_a_test_period_without_fraud_trains_and_prints_na_not_nan(handbook_slice, tmp_path):
    """A one-class test period leaves the ranking metrics undefined: the table says so, and the
    validation period (which holds frauds) still chooses the model."""
    data, _, _ = handbook_slice
    df = pd.read_csv(data, dtype=str, keep_default_na=False)
    df.loc[df["TX_DATETIME"] >= "2018-05-03", "TX_FRAUD"] = "0"
    clean = tmp_path / "no_test_fraud.csv"
    df.to_csv(clean, index=False)
    r = runner.invoke(app, tiny_train(clean, tmp_path / "m"))
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "the test period holds 0 labelled frauds" in out
    test_row = next(line for line in r.output.splitlines() if line.strip("│ ┃").startswith("test"))
    assert test_row.count("n/a (one class)") == 2 and "nan" not in test_row
    assert "LightGBM baseline │ n/a (one class) │ n/a (one class)" in r.output
    assert "no comparison: the test rows hold one class only" in out


def test_forgetting_model_on_another_layout_names_the_demo_model(shared_data, tmp_path):
    data = shared_data / "banksim" / "banksim_sample.csv"
    r = runner.invoke(app, ["score", "--data", str(data), "--out", str(tmp_path / "s.parquet")])
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and "columns required by spec 'demo' not found" in out
    assert "the demo model in assets/ is used, and it reads TabFormer-format files only" in out and "--model DIR" in out
    r = runner.invoke(app, ["explain", "--data", str(data), "--entity", "x"])
    assert r.exit_code == 2 and "reads TabFormer-format files only" in " ".join(r.output.split())
    # with --spec the file's own columns are found: the hint is not given for a different cause
    r = runner.invoke(app, ["score", "--data", str(data), "--spec", "handbook", "--out", str(tmp_path / "s.parquet")])
    assert r.exit_code == 2 and "the demo model in assets/ is used" not in " ".join(r.output.split())


@pytest.mark.parametrize("name", ["scores.json", "scores.csv.gz", "scores"])
def test_score_refuses_an_output_name_that_is_neither_csv_nor_parquet(name, tmp_path):
    from engine.cli import DEMO_DATA

    r = runner.invoke(app, ["score", "--data", str(DEMO_DATA), "--out", str(tmp_path / name)])
    assert r.exit_code == 2, r.output
    assert "expected a name ending in .parquet, .pq or .csv" in " ".join(r.output.split())
    assert list(tmp_path.iterdir()) == []  # refused before any work
    r = runner.invoke(app, ["score", "--data", str(DEMO_DATA), "--out", str(tmp_path / "s.parquet"),
                            "--rejected", str(tmp_path / name)])
    assert r.exit_code == 2 and "--rejected" in r.output and list(tmp_path.iterdir()) == []


def test_score_writes_csv_for_an_upper_case_suffix(tmp_path):
    from engine.cli import DEMO_DATA

    out = tmp_path / "SCORES.CSV"
    r = runner.invoke(app, ["score", "--data", str(DEMO_DATA), "--out", str(out)])
    assert r.exit_code == 0, r.output
    head = out.read_bytes()[:200]
    assert not head.startswith(b"PAR1") and b"transaction_id" in head and b"status" in head


def _demo_rows(tmp_path, n=2500) -> pd.DataFrame:
    from engine.cli import DEMO_DATA

    return pd.read_csv(DEMO_DATA, nrows=n, dtype=str, keep_default_na=False)


def test_score_and_explain_read_a_file_without_the_label_column(tmp_path):
    """Production files carry no label: score and explain read them as unlabelled, with the same
    scores as the labelled file (the demo spec has no label-reading aggregates)."""
    df = _demo_rows(tmp_path)
    labelled, bare = tmp_path / "labelled.csv", tmp_path / "bare.csv"
    df.to_csv(labelled, index=False)
    df.drop(columns=["Is Fraud?"]).to_csv(bare, index=False)
    r = runner.invoke(app, ["score", "--data", str(bare), "--out", str(tmp_path / "bare.parquet")])
    assert r.exit_code == 0, r.output
    assert "no label column 'Is Fraud?': read as unlabelled" in " ".join(r.output.split())
    assert runner.invoke(app, ["score", "--data", str(labelled), "--out", str(tmp_path / "lab.parquet")]).exit_code == 0
    a, b = pd.read_parquet(tmp_path / "bare.parquet"), pd.read_parquet(tmp_path / "lab.parquet")
    assert len(a) == len(b) == len(df) and "label" not in a.columns and "label" in b.columns
    assert np.allclose(a["probability"].to_numpy(), b["probability"].to_numpy(), atol=1e-6)
    # partition by partition too (it needed the label column)
    r = runner.invoke(app, ["score", "--data", str(bare), "--out", str(tmp_path / "parts.parquet"), "--partitions", "3"])
    assert r.exit_code == 0, r.output
    assert "no label column 'Is Fraud?': read as unlabelled" in " ".join(r.output.split())
    c = pd.read_parquet(tmp_path / "parts.parquet").set_index("transaction_id").loc[b["transaction_id"]]
    assert "label" not in c.columns
    assert np.allclose(c["probability"].to_numpy(), b["probability"].to_numpy(), atol=1e-6)
    r = runner.invoke(app, ["explain", "--data", str(bare), "--entity", "0:0", "--position", "-1", "--methods", "attention",
                            "--out", str(tmp_path / "e.json")])
    assert r.exit_code == 0, r.output
    # training still needs the label
    r = runner.invoke(app, ["train", "--data", str(bare), "--spec", "demo", "--out", str(tmp_path / "m")])
    assert r.exit_code == 2 and "'Is Fraud?' (label)" in " ".join(r.output.split())


def test_a_label_reading_spec_still_needs_the_label_column(handbook_slice, tmp_path):
    from engine.data.io import read_transactions
    from engine.data.spec import load_spec

    data, _, _ = handbook_slice
    bare = tmp_path / "bare.csv"
    pd.read_csv(data, dtype=str).drop(columns=["TX_FRAUD"]).to_csv(bare, index=False)
    with pytest.raises(ValueError, match=r"label column 'TX_FRAUD' not found.*from the known labels"):
        read_transactions(bare, load_spec("handbook"), label_required=False)


def test_a_file_with_every_row_rejected_fails_with_the_likely_fix(tmp_path):
    df = _demo_rows(tmp_path, 300)
    df["Amount"] = df["Amount"].str.replace(".", ",", regex=False)  # a decimal comma
    data = tmp_path / "comma.csv"
    df.to_csv(data, index=False, sep=";")
    rej = tmp_path / "rejected.csv"
    r = runner.invoke(app, ["score", "--data", str(data), "--out", str(tmp_path / "s.parquet"), "--rejected", str(rej)])
    out = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert "no transaction accepted (all 300 rows rejected" in out and 'decimal = ","' in out
    assert len(pd.read_csv(rej)) == 300 and not (tmp_path / "s.parquet").exists()
    assert f"Every row's reason is in {rej}" in out and "--rejected FILE" not in out
    # a rejection the hint does not know gets no hint
    df = _demo_rows(tmp_path, 300)
    df["Amount"] = "twelve"
    df.to_csv(data, index=False)
    r = runner.invoke(app, ["score", "--data", str(data), "--out", str(tmp_path / "s.parquet")])
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and "Hint" not in r.output and "amount is not a number" in out
    assert "--rejected FILE writes every row's reason" in out  # not given: the option that writes them
    r = runner.invoke(app, ["explain", "--data", str(data), "--entity", "0:0", "--position", "-1"])
    assert r.exit_code == 2 and "--rejected" not in r.output  # explain has no such option
    r = runner.invoke(app, ["train", "--data", str(data), "--spec", "demo", "--out", str(tmp_path / "m"), "--no-progress"])
    assert f"Every row's reason is in {tmp_path / 'm' / 'rejected.csv'}" in " ".join(r.output.split())


def test_inspect_names_its_force_option_when_the_spec_exists(tmp_path):
    from engine.cli import DEMO_DATA

    out = tmp_path / "s.toml"
    out.write_text("x")
    r = runner.invoke(app, ["inspect", str(DEMO_DATA), "--out", str(out)])
    assert r.exit_code == 2 and "--force" in r.output and "overwrite=True" not in r.output
    assert out.read_text() == "x"
    assert runner.invoke(app, ["inspect", str(DEMO_DATA), "--out", str(out), "--force"]).exit_code == 0


def test_a_refused_training_leaves_no_model_less_folder(tmp_path):
    df = _demo_rows(tmp_path, 2500)
    df["Is Fraud?"] = "No"  # nothing to learn from
    data, out = tmp_path / "nofraud.csv", tmp_path / "model"
    df.to_csv(data, index=False)
    r = runner.invoke(app, ["train", "--data", str(data), "--spec", "demo", "--out", str(out), "--no-progress"])
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and "no labelled fraud at all" in text and "No model written" in text, r.output
    assert not out.exists()
    df.loc[3, "Amount"] = "twelve"  # one rejected row: its reason is kept and named
    df.to_csv(data, index=False)
    r = runner.invoke(app, ["train", "--data", str(data), "--spec", "demo", "--out", str(out), "--no-progress"])
    assert r.exit_code == 2 and "No model written; the 1 rejected row is in" in " ".join(r.output.split())
    assert len(pd.read_csv(out / "rejected.csv")) == 1 and sorted(p.name for p in out.iterdir()) == ["rejected.csv"]


def test_inspect_reads_the_file_with_its_guess_and_warns_about_rejected_rows(tmp_path, monkeypatch):
    df = _demo_rows(tmp_path, 3000)
    df.loc[[5, 9, 11], "Amount"] = "twelve"
    df.loc[20, "Year"] = "20x4"
    data = tmp_path / "bad.csv"
    df.to_csv(data, index=False)
    r = runner.invoke(app, ["inspect", str(data), "--out", str(tmp_path / "s.toml")])
    text = " ".join(r.output.split())
    assert r.exit_code == 0, r.output
    assert "of all 3,000 rows, 4 would be rejected" in text
    assert "Amount: amount is not a number: 3 rows, first row 6" in text  # row numbers are the file's (1 = first)
    assert "Year: timestamp part year is not a whole number: 1 row, first row 21" in text
    dup = pd.concat([df, df.iloc[[30]]], ignore_index=True)  # a reason of the whole record names no column
    dup.to_csv(data, index=False)
    r = runner.invoke(app, ["inspect", str(data), "--out", str(tmp_path / "s.toml"), "--force"])
    assert "(whole record): exact duplicate of row 31: 1 row, first row 3,001" in " ".join(r.output.split()), r.output
    far = df.copy()  # a transaction dated decades away: train and score warned about it, inspect did not
    far.loc[40, "Year"] = "1970"
    far.to_csv(data, index=False)
    r = runner.invoke(app, ["inspect", str(data), "--out", str(tmp_path / "s.toml"), "--force"])
    assert "1 transaction is dated far outside the file's dates" in " ".join(r.output.split()), r.output
    assert "row 41 at 1970-" in r.output
    df = _demo_rows(tmp_path, 3000)
    df.to_csv(data, index=False)
    r = runner.invoke(app, ["inspect", str(data), "--out", str(tmp_path / "s.toml"), "--force"])
    assert "all 3,000 rows are accepted" in " ".join(r.output.split()) and "would be rejected" not in r.output
    df.loc[2990, "Amount"] = "twelve"  # far past the 50,000-row head the check read before: the whole file is read
    df.to_csv(data, index=False)
    monkeypatch.setattr(cli_common, "TRIAL_ROWS", 2995)
    r = runner.invoke(app, ["inspect", str(data), "--out", str(tmp_path / "s.toml"), "--force"])
    assert "of the first 2,995 rows (the most it reads), 1 would be rejected" in " ".join(r.output.split()), r.output


def test_train_onto_an_existing_file_is_one_error_line(tmp_path):
    """--out names a file, not a folder: one error line (exit 2), never a traceback."""
    df = _demo_rows(tmp_path, 300)
    df.loc[3, "Amount"] = "twelve"  # a rejected row: train writes out/rejected.csv first
    data, out = tmp_path / "tx.csv", tmp_path / "outfile"
    df.to_csv(data, index=False)
    out.write_text("x")
    r = runner.invoke(app, ["train", "--data", str(data), "--spec", "demo", "--out", str(out), "--no-progress"])
    assert r.exit_code == 2 and not isinstance(r.exception, FileExistsError), r.output
    assert f"cannot write --rejected {out / 'rejected.csv'}" in " ".join(r.output.split())
    assert out.read_text() == "x"


def test_the_all_rejected_hint_tells_a_thousands_comma_from_a_decimal_comma():
    """'1,234' may be either; '17,23' or '1.234,50' only a decimal comma: the hint never proposes
    decimal = "," alone for values that may be thousands (it would read $1,234 as 1.234)."""
    from engine.cli_common import all_rejected_hint
    from engine.data.spec import load_spec

    spec = load_spec("tabformer")

    def rej(vals, col="Amount"):
        return pd.DataFrame({"value": vals, "reason": "amount is not a number", "column": col})

    both = all_rejected_hint(rej(["$1,234", "$12,345", "$999,000"]), spec)
    assert "thousands comma (add ',' to strip under [amount])" in both and "or a decimal comma" in both
    for vals in (["$17,23", "$1,234"], ["$1.234,50", "$999,000"], ["-0,5"], ["12,3456"]):
        h = all_rejected_hint(rej(vals), spec)
        assert "look like decimal commas" in h and 'set decimal = "," under [amount]' in h, vals
    assert "on the field reading 'Zip'" in all_rejected_hint(rej(["1,5", "2,25"], col="Zip"), spec)
    assert "numeric field reads no grouping" in all_rejected_hint(rej(["1,500"], col="Zip"), spec)
    assert all_rejected_hint(rej(["twelve", "1,5"]), spec) is None  # under 80 % look like numbers with a comma
    assert all_rejected_hint(rej(["$12.5.3"]), spec) is None


def test_train_with_a_spec_without_label_says_so_first(tmp_path):
    """It printed three fraud-count warnings of the split check before 'training needs a label
    column' (new-user trial)."""
    from engine.data.spec import load_spec

    spec = load_spec("demo").model_dump(mode="json")
    spec["label"] = None
    spec["name"] = "nolabel"
    from engine.data.spec import spec_from_dict

    path = tmp_path / "nolabel.toml"
    path.write_text(spec_from_dict(spec).to_toml(), encoding="utf-8")
    data = tmp_path / "d.csv"
    _demo_rows(tmp_path, 600).to_csv(data, index=False)
    r = runner.invoke(app, ["train", "--data", str(data), "--spec", str(path), "--out", str(tmp_path / "m"),
                            "--no-progress"])
    text = " ".join(r.output.split())
    assert r.exit_code == 2, r.output
    assert "training needs a label column: spec 'nolabel' has no [label]" in text
    assert "frauds" not in text


def test_a_failing_baseline_never_costs_the_trained_model(handbook_slice, tmp_path, monkeypatch):
    """The LightGBM comparison failed after the transformer had trained and the whole run ended in
    a traceback with no model written (new-user trial): now a warning, and the checkpoint is saved."""
    import lightgbm as lgb

    from engine.model import train as train_mod

    def refuse(*a, **k):
        raise lgb.basic.LightGBMError("Do not support special JSON characters in feature name.")

    monkeypatch.setattr(train_mod, "compare_with_baseline", refuse)
    data, _, _ = handbook_slice
    model_dir = tmp_path / "model"
    r = runner.invoke(app, tiny_train(data, model_dir))
    text = " ".join(r.output.split())
    assert r.exit_code == 0, r.output
    assert "warning: the LightGBM baseline could not be trained (LightGBMError: Do not support" in text
    assert (model_dir / "model.safetensors").exists()
    assert "baseline" not in json.loads((model_dir / "metrics.json").read_text())
