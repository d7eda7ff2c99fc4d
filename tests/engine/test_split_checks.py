"""engine.model.split_checks: thin periods are named, the proposed dates fix them, short histories warn."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from engine.data.io import read_transactions
from engine.data.spec import load_spec
from engine.model.split_checks import date_outliers, history_warning, propose_split_dates, split_warnings
from engine.model.train import time_split

TABFORMER = Path("/work/shared/data/tabformer/User0_credit_card_transactions.csv")
REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "demo_data" / "transactions.csv"


def _frame(n_ent=40, per=50, fraud_share=0.05, seed=0):
    rng = np.random.default_rng(seed)
    ents = np.repeat([f"e{i}" for i in range(n_ent)], per)
    t = pd.Timestamp("2024-01-01") + pd.to_timedelta(rng.integers(0, 300 * 86400, len(ents)), unit="s")
    y = (rng.random(len(ents)) < fraud_share).astype(int)
    fr = pd.DataFrame({"entity_id": ents, "timestamp": t, "label": pd.array(y, dtype="Int8")})
    return fr.sort_values(["entity_id", "timestamp"], ignore_index=True)


def _counts(fr, split, code):
    y = fr.label.to_numpy(dtype=float, na_value=np.nan)
    m = (split == code) & (y == 1)
    return int(m.sum()), fr.entity_id[m].nunique()


def test_thin_test_period_is_named_with_its_counts():
    fr = _frame(fraud_share=0.0)
    # one episode: 12 frauds on one card, all in the last days
    late = fr.index[fr.entity_id == "e3"][-12:]
    fr.loc[late, "timestamp"] = pd.Timestamp("2024-10-20") + pd.to_timedelta(np.arange(12), unit="min")
    fr.loc[late, "label"] = 1
    fr.loc[fr.index[fr.timestamp < "2024-06-01"][::40], "label"] = 1
    split, _, _ = time_split(fr.timestamp, "2024-08-01", "2024-10-01")
    w = split_warnings(fr, split)
    n, k = _counts(fr, split, 2)
    assert n == 12 and k == 1
    assert any("the test period holds 12 labelled frauds on 1 entity" in x for x in w), w
    assert any(x.startswith("the validation period holds 0 labelled frauds") for x in w), w


def test_no_warning_when_both_periods_are_rich():
    fr = _frame(n_ent=100, per=60, fraud_share=0.05)
    split, _, _ = time_split(fr.timestamp)
    assert _counts(fr, split, 1)[0] >= 30 and _counts(fr, split, 2)[0] >= 30
    assert split_warnings(fr, split) == []


def test_proposed_dates_give_both_periods_enough_frauds():
    fr = _frame(n_ent=100, per=60, fraud_share=0.02, seed=3)
    split, _, _ = time_split(fr.timestamp)
    assert split_warnings(fr, split)  # the default 70/85 % split is too thin here
    a, b = propose_split_dates(fr)
    split2, _, _ = time_split(fr.timestamp, a, b)
    assert split_warnings(fr, split2) == []
    for code in (1, 2):
        n, k = _counts(fr, split2, code)
        assert n >= 30 and k >= 5


def test_no_proposal_when_the_file_has_too_few_frauds():
    fr = _frame(fraud_share=0.0)
    fr.loc[fr.index[:40:2], "label"] = 1  # 20 frauds in all
    assert propose_split_dates(fr) is None


def test_history_warning_on_a_random_row_sample_only():
    dense = _frame(n_ent=10, per=60)
    assert history_warning(dense, 32) is None
    sparse = _frame(n_ent=200, per=5)
    w = history_warning(sparse, 32)
    assert w is not None and "median entity has 5 transactions" in w and "200 entities" in w


@pytest.mark.skipif(not TABFORMER.exists(), reason="shared TabFormer data not present")
def test_tabformer_default_split_warns_and_has_no_usable_proposal():
    fr = read_transactions(TABFORMER, load_spec("tabformer")).frame
    split, _, _ = time_split(fr.timestamp)
    w = split_warnings(fr, split)
    n_test = _counts(fr, split, 2)[0]
    assert any(f"the test period holds {n_test} labelled fraud" in x for x in w)
    assert propose_split_dates(fr) is None  # 27 frauds in all cannot fill three periods


def test_score_cli_warns_on_short_histories(tmp_path):
    from engine.cli import app

    fr = pd.read_csv(DEMO, dtype=str)
    # keep the first 3 transactions of each card: a random-row-like file
    small = fr.groupby(["User", "Card"], sort=False).head(3)
    path = tmp_path / "short.csv"
    small.to_csv(path, index=False)
    r = CliRunner().invoke(app, ["score", "--data", str(path), "--spec", "demo", "--out", str(tmp_path / "s.parquet")])
    assert r.exit_code == 0, r.output
    assert "warning: the median entity has 3 transactions" in r.output


def test_a_2099_typo_is_named_by_its_row_and_explains_an_empty_default_period():
    fr = _frame(n_ent=20, per=30)
    fr["row_number"] = np.arange(1, len(fr) + 1)
    assert date_outliers(fr) is None  # ten months of ordinary dates
    fr.loc[17, "timestamp"] = pd.Timestamp("2099-01-01 12:00")
    fr.loc[400, "timestamp"] = pd.Timestamp("1970-01-01")
    w = date_outliers(fr)
    assert w.startswith("2 transactions are dated far outside the file's dates (2024-01")
    assert "row 18 at 2099-01-01 12:00:00, row 401 at 1970-01-01 00:00:00;" in w
    with pytest.raises(ValueError, match="the validation period is empty"):
        time_split(fr.timestamp)  # 70 % / 85 % of 1970-2099: both cuts after every ordinary row

    from engine.model.train import TrainConfig, train

    spec = load_spec("demo")
    with pytest.raises(ValueError, match="validation period is empty; 2 transactions are dated far outside.*row 18"):
        train(fr, spec, TrainConfig(), fitter=lambda *a, **k: pytest.fail("fitted"), log=lambda m: None)


def test_train_refuses_a_validation_period_without_fraud_before_any_epoch_and_proposes_dates():
    """Early stopping, calibration and the review threshold all read the validation period: with no
    fraud there, training used to run for minutes and save an unchosen, uncalibrated model."""
    from engine.model.train import TrainConfig, train

    fr = _frame(n_ent=40, per=50, fraud_share=0.0)
    fr["row_number"] = np.arange(1, len(fr) + 1)
    early = fr.index[fr.timestamp < "2024-05-01"][::30]
    late = fr.index[fr.timestamp >= "2024-10-01"][::30]
    fr.loc[early, "label"] = 1
    fr.loc[late, "label"] = 1  # frauds in training and test, none in between
    spec = load_spec("demo")
    refuse = dict(fitter=lambda *a, **k: pytest.fail("fitted"), log=lambda m: None)
    with pytest.raises(ValueError, match=r"the validation period \[2024-08-01, 2024-10-01\) holds no labelled fraud "
                       r"\([\d,]+ labelled transactions\).*; --train-end \d{4}-\d\d-\d\d --val-end \d{4}-\d\d-\d\d gives"):
        train(fr, spec, TrainConfig(train_end="2024-08-01", val_end="2024-10-01"), **refuse)
    # the proposed dates give the validation period frauds: training goes on (to the fitter)
    import re

    try:
        train(fr, spec, TrainConfig(train_end="2024-08-01", val_end="2024-10-01"), **refuse)
    except ValueError as e:
        a, b = re.search(r"--train-end (\S+) --val-end (\S+)", str(e)).groups()
    split, _, _ = time_split(fr.timestamp, a, b)
    assert _counts(fr, split, 1)[0] >= 1 and _counts(fr, split, 2)[0] >= 1

    class Fitted(Exception):
        pass

    def fitter(*a, **k):
        raise Fitted

    with pytest.raises(Fitted):
        train(fr, spec, TrainConfig(train_end=a, val_end=b), fitter=fitter, log=lambda m: None)
    # only frauds in the validation period: refused too; a file whose frauds cannot be split: said so
    only = fr.copy()
    only.loc[(only.timestamp >= "2024-08-01") & (only.timestamp < "2024-10-01"), "label"] = 1
    with pytest.raises(ValueError, match="holds only frauds"):
        train(only, spec, TrainConfig(train_end="2024-08-01", val_end="2024-10-01"), **refuse)
    one = fr.assign(label=pd.array(np.zeros(len(fr), int), dtype="Int8"))
    one.loc[one.index[one.timestamp < "2024-03-01"][:2], "label"] = 1  # 2 frauds: three periods need 3
    with pytest.raises(ValueError, match="this file's 2 frauds are too few to split"):
        train(one, spec, TrainConfig(), **refuse)
    none = fr.assign(label=pd.array(np.zeros(len(fr), int), dtype="Int8"))  # a file without any fraud
    with pytest.raises(ValueError, match=r"this file has no labelled fraud at all \(check the spec's \[label\]"):
        train(none, spec, TrainConfig(), **refuse)


def test_score_cli_names_a_transaction_dated_2099(tmp_path):
    from engine.cli import app

    fr = pd.read_csv(DEMO, dtype=str, keep_default_na=False).head(3000)
    fr.loc[1234, "Year"] = "2099"
    path = tmp_path / "typo.csv"
    fr.to_csv(path, index=False)
    r = CliRunner().invoke(app, ["score", "--data", str(path), "--spec", "demo", "--out", str(tmp_path / "s.parquet")])
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "warning: 1 transaction is dated far outside the file's dates" in out and "row 1235 at 2099-" in out
    assert "--train-end" not in out


def test_date_outliers_gathered_from_sampled_parts_name_the_same_rows():
    """The partitioned scorer's sketch (a sample per part, the extremes of each part) names the
    outliers the exact check names, and says 'at least' when a part holds more than it kept."""
    from engine.model.split_checks import DateOutliers

    rng = np.random.default_rng(1)
    n = 30_000
    ts = pd.Timestamp("2023-01-01") + pd.to_timedelta(rng.integers(0, 365 * 86400, n), unit="s")
    fr = pd.DataFrame({"timestamp": ts, "row_number": np.arange(1, n + 1)})
    fr.loc[[5, 17_000], "timestamp"] = pd.Timestamp("2099-01-01")
    exact = date_outliers(fr)
    sketch = DateOutliers(sample=2_000, extremes=20)
    for part in np.array_split(np.arange(n), 4):
        sketch.add(fr["timestamp"].iloc[part], fr["row_number"].iloc[part])
    got = sketch.warning()
    assert "row 6 at 2099-01-01 00:00:00, row 17001 at 2099-01-01 00:00:00;" in got and got.startswith("2 transactions")
    first = [pd.Timestamp(w.split("(")[1][:10]) for w in (got, exact)]  # the bulk's first date, sampled or not
    kth = fr["timestamp"].sort_values().iloc[n // 100].normalize()  # the earliest 1 % set aside
    assert first[1] == kth and abs(first[0] - first[1]) <= pd.Timedelta(days=3)
    fr.loc[:99, "timestamp"] = pd.Timestamp("1970-01-01")  # 100 outliers in the first part (20 kept per side) + row 17001
    sketch = DateOutliers(sample=2_000, extremes=20)
    for part in np.array_split(np.arange(n), 4):
        sketch.add(fr["timestamp"].iloc[part], fr["row_number"].iloc[part])
    assert sketch.warning().startswith("at least 21 transactions are dated far outside")
    assert date_outliers(fr).startswith("101 transactions are dated far outside")


@pytest.mark.parametrize("n, typos", [(10, 1), (120, 1), (1000, 6)])
def test_small_files_and_several_typos_are_named(n, typos):
    """The bulk sets aside at least one row at each end: one 2099 row among 10 is named, and the
    range printed is the ordinary rows' (a linear quantile let the outlier drag it to 2054)."""
    ts = pd.Timestamp("2024-01-01") + pd.to_timedelta(np.arange(n) * 3600, unit="s")
    fr = pd.DataFrame({"timestamp": ts, "row_number": np.arange(1, n + 1)})
    fr.loc[n - typos:, "timestamp"] = pd.Timestamp("2099-01-01")
    w = date_outliers(fr)
    assert w is not None and w.startswith(f"{typos} transaction")
    assert "to 2099" not in w and "to 205" not in w
