"""Tests of the transaction simulator (engine.data.simulate) and the committed demo data."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.data.simulate import (
    COLUMNS,
    EPISODE_KINDS,
    FRAUD_KINDS,
    TABFORMER_COLUMNS,
    csv_bytes,
    main,
    simulate,
    summarize,
    write_csv,
)

REPO = Path(__file__).resolve().parents[2]
DEMO_CSV = REPO / "demo_data" / "transactions.csv"
DEMO_README = REPO / "demo_data" / "README.md"
REAL_TABFORMER = Path("/work/shared/data/tabformer/User0_credit_card_transactions.csv")
ERROR_NAMES = {"Bad Card Number", "Bad CVV", "Bad Expiration", "Bad PIN", "Insufficient Balance",
               "Technical Glitch"}
ATO_MCCS = {5732, 5944, 5947, 5045, 5094, 5946}


def _prepare(df: pd.DataFrame) -> pd.DataFrame:
    """Add parsed helper columns: amount (float), ts (Timestamp), fraud (bool), row order."""
    out = df.copy()
    out["amount"] = out["Amount"].str.replace("$", "", regex=False).astype(float)
    hm = out["Time"].str.split(":", expand=True).astype(int)
    out["ts"] = pd.to_datetime(dict(year=out["Year"], month=out["Month"], day=out["Day"])) + \
        pd.to_timedelta(hm[0] * 60 + hm[1], unit="m")
    out["fraud"] = out["Is Fraud?"] == "Yes"
    out["pos"] = np.arange(len(out))
    return out


@pytest.fixture(scope="module")
def demo() -> pd.DataFrame:
    return simulate(400, 7, shared_compromise=3)  # demo_data/README.md: how the committed file was made


@pytest.fixture(scope="module")
def frames(demo) -> list[pd.DataFrame]:
    """The demo frame plus two other seeds/sizes, parsed, for the structural property tests."""
    return [_prepare(demo), _prepare(simulate(80, 11, days=200)),
            _prepare(simulate(80, 12, start="2021-06-15", days=150))]


def _episodes(frames, kind):
    """(frame, card legit rows, primary rows of the episode) for every episode of ``kind``."""
    found = []
    for f in frames:
        fr = f[f["fraud"]]
        for ep, rows in fr.groupby("Fraud Episode"):
            primary = rows[rows["Fraud Kind"] != "fraud_refund"]
            if primary["Fraud Kind"].iloc[0] != kind:
                continue
            u, c = rows["User"].iloc[0], rows["Card"].iloc[0]
            legit = f[(f["User"] == u) & (f["Card"] == c) & ~f["fraud"]]
            found.append((f, legit, primary.sort_values("pos")))
    assert found, f"no {kind} episode in the test frames"
    return found


# --- reproducibility ---------------------------------------------------------------------------


def test_same_seed_gives_identical_frame_and_bytes():
    a = simulate(30, 5, days=90)
    b = simulate(30, 5, days=90)
    pd.testing.assert_frame_equal(a, b)
    assert csv_bytes(a) == csv_bytes(b)


def test_different_seed_gives_different_frame():
    a = simulate(30, 5, days=90)
    b = simulate(30, 6, days=90)
    assert csv_bytes(a) != csv_bytes(b)
    assert not a["Amount"].head(50).equals(b["Amount"].head(50))


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError):
        simulate(0, 1)
    with pytest.raises(ValueError):
        simulate(5, 1, days=10)


# --- format ------------------------------------------------------------------------------------


def test_columns_match_tabformer_plus_three(demo):
    assert list(demo.columns) == COLUMNS
    assert COLUMNS[:15] == TABFORMER_COLUMNS
    assert COLUMNS[15:] == ["Fraud Episode", "Fraud Kind", "Fraud Cause"]
    if REAL_TABFORMER.exists():
        header = REAL_TABFORMER.open().readline().rstrip("\n").split(",")
        assert header == TABFORMER_COLUMNS


def test_text_formats(demo):
    assert demo["Amount"].str.fullmatch(r"\$-?\d+\.\d\d").all()
    assert demo["Time"].str.fullmatch(r"\d\d:\d\d").all()
    hh = demo["Time"].str[:2].astype(int)
    mm = demo["Time"].str[3:].astype(int)
    assert hh.between(0, 23).all() and mm.between(0, 59).all()
    assert set(demo["Use Chip"]) == {"Swipe Transaction", "Chip Transaction", "Online Transaction"}
    assert set(demo["Is Fraud?"]) == {"Yes", "No"}
    assert demo["Merchant Name"].dtype == np.int64
    assert (demo["Merchant Name"] < 0).any() and (demo["Merchant Name"] > 0).any()
    assert demo["MCC"].between(1000, 9999).all()
    assert pd.to_datetime(dict(year=demo["Year"], month=demo["Month"], day=demo["Day"])).notna().all()


def test_online_rows_have_online_city_and_no_zip(demo):
    online = demo["Use Chip"] == "Online Transaction"
    assert (demo.loc[online, "Merchant City"] == "ONLINE").all()
    assert (demo.loc[online, "Merchant State"] == "").all()
    assert (demo.loc[online, "Zip"] == "").all()
    store = demo[~online]
    assert (store["Merchant City"] != "ONLINE").all()
    assert store["Merchant State"].str.fullmatch(r"[A-Z]{2}").all()
    assert store["Zip"].str.fullmatch(r"\d{4,5}\.0").all()


def test_errors_column(demo):
    errs = demo["Errors?"]
    assert (errs == "").mean() > 0.95
    assert (errs == "Insufficient Balance").any() and (errs == "Bad PIN").any()
    for value in set(errs) - {""}:
        parts = value.split(",")
        assert set(parts) <= ERROR_NAMES and parts == sorted(parts)
    assert not demo.loc[demo["Use Chip"] == "Online Transaction", "Errors?"].str.contains("Bad PIN").any()


def test_rows_ordered_by_user_card_time(frames):
    for f in frames:
        key = f[["User", "Card"]].to_numpy()
        assert (np.diff(key[:, 0]) >= 0).all()
        same_user = np.diff(key[:, 0]) == 0
        assert (np.diff(key[:, 1])[same_user] >= 0).all()
        same_card = same_user & (np.diff(key[:, 1]) == 0)
        assert (np.diff(f["ts"].to_numpy())[same_card] >= np.timedelta64(0)).all()


def test_customers_have_one_to_three_cards(demo):
    assert demo["User"].nunique() == 400
    assert sorted(demo["User"].unique()) == list(range(400))
    per_user = demo.groupby("User")["Card"].agg(["nunique", "max"])
    assert per_user["nunique"].between(1, 3).all()
    assert (per_user["max"] == per_user["nunique"] - 1).all()  # cards numbered from 0


def test_csv_round_trip_and_quoting(tmp_path):
    df = simulate(40, 3, days=120)
    path = write_csv(df, tmp_path / "sub" / "t.csv")
    raw = path.read_bytes()
    assert raw == csv_bytes(df) and b"\r" not in raw
    assert raw.split(b"\n", 1)[0].decode() == ",".join(COLUMNS)
    back = pd.read_csv(path, dtype=str, keep_default_na=False)
    assert list(back.columns) == COLUMNS
    assert (back["Amount"] == df["Amount"].to_numpy()).all()
    assert (back["Errors?"] == df["Errors?"].to_numpy()).all()
    assert (back["Merchant Name"].astype("int64") == df["Merchant Name"].to_numpy()).all()
    # a comma list is quoted in the file
    multi = df.loc[df["Errors?"].str.contains(","), "Errors?"]
    for value in multi:
        assert f'"{value}"'.encode() in raw


# --- labels ------------------------------------------------------------------------------------


def test_fraud_rows_have_episode_and_kind_and_legit_rows_none(frames):
    for f in frames:
        fr, lg = f[f["fraud"]], f[~f["fraud"]]
        assert len(fr) > 0
        assert fr["Fraud Episode"].str.fullmatch(r"E\d{4}").all()
        assert fr["Fraud Kind"].isin(FRAUD_KINDS).all()
        assert (lg["Fraud Episode"] == "").all() and (lg["Fraud Kind"] == "").all()
        for ep, rows in fr.groupby("Fraud Episode"):
            assert len(rows[["User", "Card"]].drop_duplicates()) == 1
            primary = rows.loc[rows["Fraud Kind"] != "fraud_refund", "Fraud Kind"]
            assert len(primary) > 0 and primary.nunique() == 1
            assert primary.iloc[0] in EPISODE_KINDS
            assert (rows["Fraud Kind"] == "fraud_refund").sum() <= 1
        # at most one episode per card; episode ids numbered in (User, Card) order
        per_card = fr.groupby(["User", "Card"])["Fraud Episode"].nunique()
        assert (per_card == 1).all()
        firsts = fr.drop_duplicates("Fraud Episode")["Fraud Episode"].tolist()
        assert firsts == [f"E{i:04d}" for i in range(1, len(firsts) + 1)]


def test_demo_rates(demo):
    s = summarize(demo)
    assert 35_000 <= s["rows"] <= 60_000
    # 6-10 % of cards draw an episode; shared_compromise=3 adds 3 co-victims per compromised store
    co_victims = 3 * s["episodes_by_kind"]["compromised_merchant"] // 4
    assert co_victims == 30 and 0.06 <= (s["cards_with_episode"] - co_victims) / s["cards"] <= 0.10
    assert 0.005 <= s["fraud_rows"] / s["rows"] <= 0.015
    assert all(s["episodes_by_kind"][k] >= 3 for k in EPISODE_KINDS)
    assert s["fraud_rows_by_kind"]["fraud_refund"] >= 1
    assert s["fraud_rows"] == sum(s["fraud_rows_by_kind"].values())


def test_card_testing_structure(frames):
    for f, legit, rows in _episodes(frames, "card_testing"):
        assert (rows["Use Chip"] == "Online Transaction").all()
        assert (rows["Merchant City"] == "ONLINE").all()
        tiny = rows[rows["amount"] <= 3.0]
        large = rows[rows["amount"] > 3.0]
        assert 3 <= len(tiny) <= 8 and 1 <= len(large) <= 2
        assert tiny["amount"].between(0.50, 3.00).all()
        assert (large["amount"] >= 200).all() and (large["amount"] <= 1500.01).all()
        assert tiny["ts"].max() <= large["ts"].min()
        assert rows["ts"].max() - rows["ts"].min() <= pd.Timedelta(hours=3)
        assert tiny["Merchant Name"].is_unique
        assert not rows["Merchant Name"].isin(legit["Merchant Name"]).any()


def test_account_takeover_structure(frames):
    for f, legit, rows in _episodes(frames, "account_takeover"):
        assert 4 <= len(rows) <= 10
        assert (rows["Use Chip"] == "Online Transaction").all()
        assert rows["ts"].max() - rows["ts"].min() <= pd.Timedelta(hours=4)
        earlier = legit[legit["ts"] < rows["ts"].min()]
        median_pos = earlier.loc[earlier["amount"] > 0, "amount"].median()
        median_all = earlier["amount"].median()
        assert (rows["amount"] >= 3 * median_pos - 1e-9).all()
        assert (rows["amount"] >= 3 * median_all - 1e-9).all()
        assert (rows["amount"] <= 8 * median_pos + 0.01).all()
        assert rows["MCC"].isin(ATO_MCCS).all()
        assert not rows["MCC"].isin(legit["MCC"]).any()
        assert not rows["Merchant Name"].isin(legit["Merchant Name"]).any()


def test_skimmed_card_structure(frames):
    for f, legit, rows in _episodes(frames, "skimmed_card"):
        assert (rows["Use Chip"] == "Swipe Transaction").all()
        assert rows["ts"].max() - rows["ts"].min() <= pd.Timedelta(hours=48)
        assert 2 <= rows["Merchant State"].nunique() <= 4
        assert (rows["Merchant State"] != "").all()
        home_state = legit.loc[legit["Merchant State"] != "", "Merchant State"].mode().iloc[0]
        assert not (rows["Merchant State"] == home_state).any()
        assert not rows["Merchant Name"].isin(legit["Merchant Name"]).any()
        # the states are visited one after another (no state comes back)
        runs = (rows["Merchant State"] != rows["Merchant State"].shift()).sum()
        assert runs == rows["Merchant State"].nunique()


def _cause_rows(f, rows):
    """The rows planted as the cause of the episode of ``rows`` (any label)."""
    return f[f["Fraud Cause"] == rows["Fraud Episode"].iloc[0]].sort_values("pos")


def test_cause_column_only_on_planted_kinds(frames):
    for f in frames:
        cause = f[f["Fraud Cause"] != ""]
        assert len(cause) > 0
        kinds = f[f["fraud"]].groupby("Fraud Episode")["Fraud Kind"].first()
        assert set(kinds.loc[cause["Fraud Cause"].unique()]) <= {"tested_then_cnp", "compromised_merchant"}
        for ep, k in kinds.items():  # every planted episode has its cause, no other episode has one
            planted = k in ("tested_then_cnp", "compromised_merchant")
            assert ((f["Fraud Cause"] == ep).sum() > 0) == planted, ep


def test_tested_then_cnp_structure(frames):
    for f, legit, rows in _episodes(frames, "tested_then_cnp"):
        tests = _cause_rows(f, rows)
        large = rows[~rows["pos"].isin(tests["pos"])]
        assert 1 <= len(tests) <= 2 and 1 <= len(large) <= 3
        assert tests["fraud"].all() and tests["amount"].between(0.50, 3.00).all()
        assert (large["amount"] >= 200).all() and (large["amount"] <= 1500.01).all()
        assert (rows["Use Chip"] == "Online Transaction").all()
        assert not rows["Merchant Name"].isin(legit["Merchant Name"]).any()
        # the cause is not among the latest rows: 3-8 legitimate rows of the card lie between
        between = legit[(legit["ts"] > tests["ts"].max()) & (legit["ts"] < large["ts"].min())]
        assert 3 <= len(between) <= 8, len(between)


def test_compromised_merchant_structure(frames):
    for f, legit, rows in _episodes(frames, "compromised_merchant"):
        visit = _cause_rows(f, rows)
        assert len(visit) == 1 and not visit["fraud"].iloc[0]
        assert visit["Use Chip"].iloc[0] == "Swipe Transaction" and visit["Merchant City"].iloc[0] != "ONLINE"
        delay = rows["ts"].min().normalize() - visit["ts"].iloc[0].normalize()
        assert pd.Timedelta(days=7) <= delay <= pd.Timedelta(days=30)
        assert 3 <= len(rows) <= 6 and rows["Merchant City"].nunique() == 1
        assert (rows["Use Chip"] == "Swipe Transaction").all()
        home_state = legit.loc[legit["Merchant State"] != "", "Merchant State"].mode().iloc[0]
        assert not (rows["Merchant State"] == home_state).any()


def test_fraud_refund_reverses_an_earlier_fraud_charge_of_its_episode(frames):
    n = 0
    for f in frames:
        for _, r in f[f["Fraud Kind"] == "fraud_refund"].iterrows():
            n += 1
            assert r["amount"] < 0
            ep = f[(f["Fraud Episode"] == r["Fraud Episode"]) & (f["Fraud Kind"] != "fraud_refund")]
            match = ep[(ep["amount"] == -r["amount"]) & (ep["ts"] < r["ts"])
                       & (ep["Merchant Name"] == r["Merchant Name"])]
            assert len(match) >= 1
            assert r["Is Fraud?"] == "Yes" and r["Use Chip"] == match["Use Chip"].iloc[0]
    assert n >= 1


def test_legit_refunds_reverse_earlier_legit_purchases(frames):
    f = frames[0]
    legit = f[~f["fraud"]]
    refunds = legit[legit["amount"] < 0]
    assert len(refunds) > 0
    key = ["User", "Card", "Merchant Name"]
    cand = refunds.merge(legit[legit["amount"] > 0][key + ["amount", "ts"]], on=key,
                         suffixes=("", "_p"))
    ok = cand[(cand["amount_p"] == -cand["amount"]) & (cand["ts_p"] < cand["ts"])]
    assert ok["pos"].nunique() == len(refunds)


# --- demo data ---------------------------------------------------------------------------------


def test_committed_demo_csv_is_a_fresh_simulation(demo):
    assert DEMO_CSV.exists()
    assert DEMO_CSV.stat().st_size <= 5 * 1024 * 1024
    assert DEMO_CSV.read_bytes() == csv_bytes(demo)


def test_demo_readme_states_the_counts(demo):
    text = DEMO_README.read_text()
    s = summarize(demo)
    assert "fraudlens simulate --customers 400 --seed 7 --shared-compromise 3 --out demo_data/transactions.csv" in text
    assert "synthetic" in text.lower()
    assert hashlib.sha256(DEMO_CSV.read_bytes()).hexdigest() in text
    assert f"{DEMO_CSV.stat().st_size:,} bytes" in text
    for number in (s["rows"], s["cards"], s["fraud_rows"], *s["fraud_rows_by_kind"].values(),
                   *s["episodes_by_kind"].values()):
        assert f"{number:,}" in text


def test_main_writes_and_summarises(tmp_path):
    out = tmp_path / "x.csv"
    msg = main(12, 4, out)
    df = simulate(12, 4)
    assert out.read_bytes() == csv_bytes(df)
    assert f"{len(df):,} rows" in msg and str(out) in msg


def test_shared_compromise_plants_a_common_point():
    """simulate(shared_compromise=k): other cards swipe at each compromised store within 3 days of
    the first card's visit (their cause) and have counterfeit fraud 7-30 days later; with k = 0 the
    frame is the one without the option."""
    base = simulate(80, 5, days=150)
    assert base.equals(simulate(80, 5, days=150, shared_compromise=0))
    df = simulate(80, 5, days=150, shared_compromise=2)
    ts = pd.to_datetime(dict(year=df["Year"], month=df["Month"], day=df["Day"])) + \
        pd.to_timedelta(df["Time"].astype(str) + ":00")
    df = df.assign(ts=ts, card=df["User"].astype(str) + ":" + df["Card"].astype(str))
    cause = df[(df["Fraud Cause"] != "")]
    eps = df[df["Fraud Kind"] == "compromised_merchant"].drop_duplicates("Fraud Episode")
    base_eps = base[base["Fraud Kind"] == "compromised_merchant"]["Fraud Episode"].nunique()
    assert eps["Fraud Episode"].nunique() > base_eps  # co-victims added
    first_victims = 0
    for m, g in cause[cause["Fraud Cause"].isin(set(eps["Fraud Episode"]))].groupby("Merchant Name"):
        if len(g) < 2:
            continue
        first_victims += 1
        assert g["card"].nunique() == len(g)  # one visit per card
        assert (g["ts"].max() - g["ts"].min()) <= pd.Timedelta(days=6, minutes=1440)
        for _, v in g.iterrows():  # each visitor's counterfeit fraud 7-30 days after its visit
            fr = df[(df["Fraud Episode"] == v["Fraud Cause"]) & (df["Fraud Cause"] == "")]
            gap = (fr["ts"].min().normalize() - v["ts"].normalize()).days
            assert 7 <= gap <= 30 + 1 and (fr["card"] == v["card"]).all()
            assert df.loc[(df["card"] == v["card"]) & (df["Fraud Episode"] != ""), "Fraud Episode"].nunique() == 1
    assert first_victims >= 1
