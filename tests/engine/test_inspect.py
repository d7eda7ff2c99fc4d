"""engine.data.inspect: guessing a spec from a raw file, writing it, reading with it."""

from __future__ import annotations

import csv

import pytest

from engine.data.inspect import _tokens, guess_spec, write_spec
from engine.data.io import read_transactions
from engine.data.spec import FieldKind, load_spec


def test_tokens():
    assert _tokens("TX_FRAUD_SCENARIO") == ["tx", "fraud", "scenario"]
    assert _tokens("isFraud") == ["is", "fraud"]
    assert _tokens("Is Fraud?") == ["is", "fraud"]
    assert _tokens("Use Chip") == ["use", "chip"]


def test_guess_tabformer_round_trip(shared_data, tmp_path):
    src = shared_data / "tabformer" / "User0_credit_card_transactions.csv"
    spec = guess_spec(src, name="tab_guess")
    assert spec.name == "tab_guess"
    assert spec.entity.columns == ["User", "Card"]
    assert spec.timestamp.parts == {"year": "Year", "month": "Month", "day": "Day", "time": "Time"}
    assert spec.amount.column == "Amount"
    assert (spec.label.column, spec.label.positive, spec.label.negative) == ("Is Fraud?", ["Yes"], ["No"])
    by = {f.column: f for f in spec.fields}
    assert by["Errors?"].kind is FieldKind.MULTI_VALUED
    assert by["Zip"].normalize == "zip5"
    assert by["Merchant Name"].kind is FieldKind.CATEGORICAL and by["Merchant Name"].hashed_buckets
    assert by["MCC"].kind is FieldKind.CATEGORICAL and by["MCC"].hashed_buckets is None
    assert by["Use Chip"].hashed_buckets is None
    # write, load back, read the file: every row accepted
    p = write_spec(spec, tmp_path / "tab_guess.toml")
    text = p.read_text()
    assert text.startswith("# fraudlens dataset spec 'tab_guess'.") and "CHECK AND EDIT" in text
    loaded = load_spec(p)
    assert loaded == spec
    res = read_transactions(src, loaded)
    assert res.summary() == "rows read 19,963 = accepted 19,963 + rejected 0"
    assert int((res.frame["label"] == 1).sum()) == 27
    assert res.frame.set_index("row_number").loc[734, "errors"] == "Bad PIN|Insufficient Balance"
    with pytest.raises(FileExistsError):
        write_spec(spec, p)
    write_spec(spec, p, overwrite=True)


def test_guess_handbook(shared_data):
    spec = guess_spec(shared_data / "handbook" / "transactions.parquet")
    assert spec.name == "transactions"
    assert spec.id == "TRANSACTION_ID"
    assert spec.entity.columns == ["CUSTOMER_ID"]
    assert spec.timestamp.column == "TX_DATETIME"
    assert spec.amount.column == "TX_AMOUNT"
    assert (spec.label.column, spec.label.positive) == ("TX_FRAUD", ["1"])
    assert spec.passthrough == ["TX_FRAUD_SCENARIO"]  # the simulator's answer: never model input
    assert spec.ignored == ["TX_TIME_SECONDS", "TX_TIME_DAYS"]
    assert [(f.column, f.kind.value) for f in spec.fields] == [("TERMINAL_ID", "categorical")]
    assert spec.fields[0].hashed_buckets >= 1024


def test_guess_banksim(shared_data):
    src = shared_data / "banksim" / "banksim_sample.csv"
    spec = guess_spec(src)
    assert spec.entity.columns == ["customer"]
    assert (spec.timestamp.column, spec.timestamp.unit) == ("step", "D")
    assert "unit 'D' and origin 2000-01-01 are guesses" in spec.description
    assert spec.amount.column == "amount" and spec.label.column == "fraud"
    assert {f.column: f.kind.value for f in spec.fields} == {
        "age": "categorical", "gender": "categorical", "merchant": "categorical", "category": "categorical"
    }
    res = read_transactions(src, spec)
    assert res.summary() == "rows read 20,000 = accepted 20,000 + rejected 0"
    assert int((res.frame["label"] == 1).sum()) == 240


def write(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_guess_generic_csv(tmp_path):
    rows = []
    for i in range(60):
        rows.append([
            f"T{i:04d}", f"acc{i % 7}", f"2021-03-{1 + i % 28:02d} 12:{i % 60:02d}:00", f"€{i * 1.5:.2f}",
            str(i % 3), f"{i * 0.37:.3f}", "web,mobile" if i % 9 == 0 else ["web", "mobile", ""][i % 3],
            "scenario_x" if i % 20 == 0 else "", "true" if i % 20 == 0 else "false", str(i),
        ])
    p = write(tmp_path / "My Export-2021.csv",
              ["transaction_id", "AccountNumber", "created_at", "Total", "channel_code", "risk",
               "devices", "Fraud Kind", "is_fraud", ""], rows)
    spec = guess_spec(p)
    assert spec.name == "my_export_2021"
    assert spec.id == "transaction_id"
    assert spec.entity.columns == ["AccountNumber"]
    assert spec.timestamp.column == "created_at" and spec.timestamp.format is None
    assert spec.amount.column == "Total"
    assert (spec.label.column, spec.label.positive, spec.label.negative) == ("is_fraud", ["true"], ["false"])
    assert spec.passthrough == ["Fraud Kind"]
    assert spec.ignored == [""]
    assert {f.column: f.kind.value for f in spec.fields} == {
        "channel_code": "categorical", "risk": "numeric", "devices": "multi_valued"
    }
    res = read_transactions(p, spec)
    assert res.summary() == "rows read 60 = accepted 60 + rejected 0"
    assert res.frame.set_index("row_number").loc[1, "amount"] == 0.0
    assert res.frame.set_index("row_number").loc[10, "devices"] == "mobile|web"


def test_guess_without_entity_names_placeholder(tmp_path):
    p = write(tmp_path / "x.csv", ["when", "amount", "shop"],
              [["2021-01-01", "1.0", "a"], ["2021-01-02", "2.0", "b"]])
    spec = guess_spec(p)
    assert spec.entity.columns == ["<edit: entity column>"]
    assert "no entity column" in spec.description and "no label column" in spec.description
    with pytest.raises(ValueError, match="'<edit: entity column>' \\(entity\\)"):
        read_transactions(p, spec)
