"""engine.data.inspect: guessing a spec from a raw file, writing it, reading with it."""

from __future__ import annotations

import csv

import pandas as pd
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
    assert "Zip" not in by and "Zip" in spec.passthrough  # a bare zip code: personal data unless allowed
    assert "Merchant City" in by and "Merchant State" in by  # the merchant's location is not personal
    allowed = {f.column: f for f in guess_spec(src, name="tab_guess", allow_personal=True).fields}
    assert allowed["Zip"].normalize == "zip5"
    assert by["Merchant Name"].kind is FieldKind.CATEGORICAL and by["Merchant Name"].hashed_buckets
    # a high-cardinality id is proposed as novelty only ("new merchant"), a low-cardinality code is embedded
    assert by["Merchant Name"].embed is False and by["MCC"].embed is True and by["Use Chip"].embed is True
    assert any("'Merchant Name' has" in n and "novelty only" in n for n in spec.description.split("; "))
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
    assert {f.column: f.kind.value for f in spec.fields} == {"merchant": "categorical", "category": "categorical"}
    assert spec.passthrough == ["age", "gender"]  # the customer's attributes: never model input by default
    assert "'gender' looks like personal data of the cardholder" in spec.description
    opted = guess_spec(src, allow_personal=True)
    assert {f.column: f.kind.value for f in opted.fields} == {
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


def test_the_sample_is_spread_over_an_entity_sorted_file(tmp_path):
    """An entity-sorted file whose first 5,000 rows are one card with no fraud: the first rows
    alone would see one label value; a sample spread over the file sees both."""
    rows = []
    for card in range(4):
        for i in range(3000):
            fraud = "Yes" if card == 3 and i % 50 == 0 else "No"
            rows.append([str(card), f"2021-01-{1 + i % 28:02d} 10:00:00", f"{i % 97}.50", fraud])
    p = write(tmp_path / "sorted.csv", ["card_id", "time", "amount", "is_fraud"], rows)
    notes: list[str] = []
    spec = guess_spec(p, notes_out=notes)
    assert (spec.label.column, spec.label.positive, spec.label.negative) == ("is_fraud", ["Yes"], ["No"])
    assert not any("only one value seen" in n for n in notes)
    assert "5,000 of 12,000 rows, spread over the file" in spec.description
    head_only = guess_spec(p, sample_rows=3000)  # 3,000 spread rows still reach the last card
    assert not any("only one value" in x for x in head_only.description.split("; "))


def test_personal_columns_are_passthrough_unless_allowed(tmp_path):
    rows = [[f"t{i}", f"c{i % 5}", f"2021-02-{1 + i % 28:02d}", f"{i}.00", ["F", "M"][i % 2], "1980-01-01",
             "Alice", "Main St 1", f"m{i % 9}", "12345", "0"] for i in range(40)]
    p = write(tmp_path / "pii.csv", ["trans_id", "cc_num", "date", "amt", "gender", "dob", "first", "street",
                                     "merchant_name", "merchant_zip", "is_fraud"], rows)
    notes: list[str] = []
    spec = guess_spec(p, notes_out=notes)
    assert set(spec.passthrough) == {"gender", "dob", "first", "street"}
    assert {f.column for f in spec.fields} == {"merchant_name", "merchant_zip"}  # the merchant side stays
    assert sum("personal data of the cardholder" in n for n in notes) == 4
    assert {"gender", "dob", "first", "street"} <= {f.column for f in guess_spec(p, allow_personal=True).fields}


def test_inspect_cli_prints_its_notes(tmp_path):
    from typer.testing import CliRunner

    from engine.cli import app

    rows = [[f"c{i % 3}", f"2021-02-{1 + i % 28:02d}", f"{i}.00", ["F", "M"][i % 2]] for i in range(30)]
    p = write(tmp_path / "n.csv", ["customer", "date", "amount", "gender"], rows)
    r = CliRunner().invoke(app, ["inspect", str(p), "--out", str(tmp_path / "n.toml")])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "note: no label column found" in text
    assert "note: 'gender' looks like personal data of the cardholder" in text


def test_a_stray_label_value_keeps_the_label_and_is_reported(tmp_path):
    """One 'yes' among Yes/No (a typo in the file): the label is still proposed, the stray value is
    named in a note, and reading rejects that row alone. Many other values: not a label."""
    rows = [[str(i % 9), f"2021-02-{1 + i % 28:02d} 10:00:00", f"{i % 50}.25", "Yes" if i % 40 == 0 else "No"]
            for i in range(2000)]
    rows[777][3] = "yes"  # data row 778 (row numbers count from 1)
    p = write(tmp_path / "stray.csv", ["card", "time", "amount", "Is Fraud?"], rows)
    notes: list[str] = []
    spec = guess_spec(p, notes_out=notes)
    assert (spec.label.column, spec.label.positive, spec.label.negative) == ("Is Fraud?", ["Yes"], ["No"])
    assert any("1 of 2,000 sampled cells are neither 'Yes' nor 'No': 'yes' (1)" in n for n in notes), notes
    res = read_transactions(p, spec)
    assert res.summary() == "rows read 2,000 = accepted 1,999 + rejected 1"
    assert res.rejected["row_number"].tolist() == [778] and "label value 'yes'" in res.rejected["reason"].iloc[0]
    for i in range(0, 2000, 50):  # 2 % of the cells are other values: more than a stray, no label proposed
        rows[i][3] = "maybe"
    p = write(tmp_path / "mixed.csv", ["card", "time", "amount", "Is Fraud?"], rows)
    assert guess_spec(p).label is None


def test_ill_formed_records_count_in_the_file_and_are_noted(tmp_path):
    """A record with invalid UTF-8 and one with a missing cell are not in the sample, but the
    record count is the file's (what reading reports as rows read) and a note names them."""
    lines = [b"card,time,amount,label"] + [f"c{i % 4},2021-02-{1 + i % 28:02d} 10:00:00,{i}.5,0".encode()
                                           for i in range(40)]
    lines[6] = b"c1,2021-02-06 10:00:00,\xff\xfe5,0"  # data row 6
    lines[20] = b"c2,2021-02-20 10:00:00,5"  # data row 20: 3 cells of 4
    p = tmp_path / "bad.csv"
    p.write_bytes(b"\n".join(lines) + b"\n")
    notes: list[str] = []
    spec = guess_spec(p, notes_out=notes)
    assert "(38 of 40 rows, spread over the file)" in spec.description
    note = next(n for n in notes if "ill-formed" in n)
    assert note.startswith("2 of 40 records are ill-formed") and "first: row 6" in note, note
    assert "not valid UTF-8 text" in note
    assert read_transactions(p, spec).rows_read == 40


def test_german_and_spanish_column_names_get_their_roles(tmp_path):
    """A German bank export (';' delimiter, decimal comma, dd.mm.yyyy, ja/nein) and a Spanish one:
    the roles come from the translated names plus the cells, as for English names."""
    de = [[f"K{i % 20:04d}", f"{1 + i % 28:02d}.{1 + (i // 28) % 12:02d}.2024 {i % 24:02d}:{i % 60:02d}",
           f"{1 + i % 9}.{i % 1000:03d},{i % 100:02d}" if i % 3 == 0 else f"{1 + i % 900},{i % 100:02d}",
           f"H{i % 300}", "MW"[i % 2], f"{i % 7},{i % 10}", "ja" if i % 97 == 0 else "nein"] for i in range(1500)]
    p = tmp_path / "umsaetze.csv"
    p.write_text("Kundennummer;Buchungsdatum;Betrag;Händler;Geschlecht;Gebühr;Betrug\n"
                 + "\n".join(";".join(r) for r in de) + "\n", encoding="utf-8")
    spec = guess_spec(p)
    assert spec.entity.columns == ["Kundennummer"]
    assert spec.timestamp.column == "Buchungsdatum" and spec.timestamp.format == "%d.%m.%Y %H:%M"
    assert (spec.amount.column, spec.amount.decimal) == ("Betrag", ",")
    assert (spec.label.column, spec.label.positive, spec.label.negative) == ("Betrug", ["ja"], ["nein"])
    assert [f.column for f in spec.fields] == ["Händler", "Gebühr"] and spec.passthrough == ["Geschlecht"]
    fee = spec.fields[1]
    assert (fee.name, fee.kind, fee.decimal) == ("gebuhr", FieldKind.NUMERIC, ",")  # a numeric with a decimal comma
    res = read_transactions(p, spec)
    assert res.summary() == "rows read 1,500 = accepted 1,500 + rejected 0"
    assert res.frame["amount"].iloc[0] == 1000.0 and int(res.frame["label"].sum()) == 16
    assert res.frame.sort_values("row_number")["gebuhr"].iloc[:3].tolist() == [0.0, 1.1, 2.2]

    es = [[f"C{i % 15}", f"2024-03-{1 + i % 28:02d} 10:{i % 60:02d}:00", f"{(i * 7) % 500}.{i % 100:02d}",
           f"tienda{i % 40}", ["tarjeta", "efectivo"][i % 2], "sí" if i % 50 == 0 else "no"] for i in range(800)]
    p = write(tmp_path / "es.csv", ["id_cliente", "fecha", "importe", "comercio", "paid_via", "fraude"], es)
    spec = guess_spec(p)
    assert spec.entity.columns == ["id_cliente"] and spec.timestamp.column == "fecha"
    assert spec.amount.column == "importe" and spec.label.positive == ["sí"]
    assert {f.column for f in spec.fields} == {"comercio", "paid_via"}  # an English 'via' is not a street


def test_english_amounts_with_thousands_commas_are_amounts(tmp_path):
    """'1,234.50' and '2,000' (commas grouping thousands) are an amount read with the default
    strip, never a decimal comma and never a categorical field."""
    rows = [[f"c{i % 5}", f"2021-02-{1 + i % 28:02d} 10:00:00", f"{1 + i % 9},{(i * 37) % 1000:03d}"
             + (".50" if i % 2 else "")] for i in range(200)]
    for name, rs in (("cents", rows), ("whole", [r[:2] + [r[2].removesuffix(".50")] for r in rows])):
        p = write(tmp_path / f"{name}.csv", ["card", "time", "amount"], rs)
        spec = guess_spec(p)
        assert (spec.amount.column, spec.amount.decimal) == ("amount", "."), name
        assert spec.fields == []
        res = read_transactions(p, spec)
        assert res.frame.sort_values("row_number")["amount"].iloc[:2].tolist() == (
            [1000.0, 2037.5] if name == "cents" else [1000.0, 2037.0])


def test_an_id_with_one_blank_line_stays_the_id_and_a_repeating_id_is_passthrough(tmp_path):
    """A unique id column with one empty cell (a line of separators in an export) is still the
    transaction id (that row is rejected); an id-named column whose values repeat is pass-through,
    never the id and never a model input."""
    rows = [[f"R{i % 400}", f"T{i:05d}", f"c{i % 9}", f"2021-01-{1 + i % 28:02d} 10:00:00", f"{i % 97}.25",
             "1" if i % 40 == 0 else "0", f"k{i % 4}"] for i in range(600)]
    rows[300] = ["", "", "", "", "", "", ""]
    p = write(tmp_path / "x.csv", ["txn_ref", "txn_id", "card", "time", "amount", "fraud", "txn_type_id"], rows)
    spec = guess_spec(p)
    assert spec.id == "txn_id"
    assert "txn_ref" in spec.passthrough
    assert "txn_ref" not in [f.column for f in spec.fields]
    assert "txn_type_id" in [f.column for f in spec.fields]  # 4 values: a code, a field, never an id
    assert "txn_id': 1 empty cell" in spec.description and "'txn_ref' looks like a transaction id" in spec.description
    res = read_transactions(p, spec)
    assert res.summary() == "rows read 600 = accepted 599 + rejected 1"
    assert res.rejected["row_number"].tolist() == [301]


@pytest.mark.parametrize("column, cells, expected", [
    ("amt_eur", ["12.50", "3.00"], "EUR"),
    ("Betrag GBP", ["12.50", "3.00"], "GBP"),
    ("value", ["£12.50", "£3.00"], "GBP"),
    ("value", ["$12.50", "$3.00"], "USD"),
    ("valor", ["R$12,50", "R$3,00"], "BRL"),
    ("value", ["C$12.50", "C$3.00"], "CAD"),
    ("value", ["12.50", "3.00"], None),
    ("value", ["£12.50", "€3.00"], None),
])
def test_the_amount_currency_comes_from_the_column_name_or_its_symbol(tmp_path, column, cells, expected):
    rows = [[f"c{i % 4}", f"2021-01-{1 + i % 28:02d} 10:00:00", cells[i % 2]] for i in range(100)]
    spec = guess_spec(write(tmp_path / "x.csv", ["card", "time", column], rows))
    assert spec.amount.column == column
    if expected is None:
        assert spec.amount.currency == "USD" and "USD assumed" in spec.description
    else:
        assert spec.amount.currency == expected and "USD assumed" not in spec.description
        # a bare "$" is written by other currencies too: guessed, with a note
        assert ("'$' read as USD" in spec.description) == (cells[0].startswith("$") and column == "value")


def test_a_nested_parquet_column_is_passthrough_and_the_spec_reads_its_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 300
    pq.write_table(pa.table({
        "card": [f"c{i % 7}" for i in range(n)],
        "time": pa.array(pd.date_range("2024-01-01", periods=n, freq="h")),
        "amount": [float(i % 50) for i in range(n)],
        "tags": pa.array([["web", "3ds"] if i % 3 else [] for i in range(n)], pa.list_(pa.string())),
    }), tmp_path / "n.parquet")
    spec = guess_spec(tmp_path / "n.parquet")
    assert spec.passthrough == ["tags"] and spec.fields == []
    assert "'tags' holds a list / struct per cell" in spec.description
    assert read_transactions(tmp_path / "n.parquet", spec).summary() == "rows read 300 = accepted 300 + rejected 0"


def test_one_comma_cell_among_few_merchants_stays_categorical(tmp_path):
    """Multi-valued was decided on the distinct values too, where 1 comma cell among 11 merchants is
    9 % (new-user trial: a whole merchant column split on commas, then a LightGBM crash)."""
    merchants = ["Tesco", "Lidl", "Shell", "Apple", "Steam", "Aldi", "Uber", "Bolt", "Ikea", "Zara"]
    rows = [[f"T{i}", f"acc{i % 40}", f"2024-01-{1 + i % 28:02d} 10:{i % 60:02d}:00", f"{5 + i % 50}.00",
             "Uber, Trip: NYC" if i == 777 else merchants[i % 10], "1" if i % 97 == 0 else "0"]
            for i in range(16_000)]
    p = write(tmp_path / "m.csv", ["txn_id", "account_no", "txn_time", "amount", "merchant", "is_fraud"], rows)
    spec = guess_spec(p)
    assert {f.column: f.kind.value for f in spec.fields}["merchant"] == "categorical"
    assert "list of values" not in spec.description
    # a real list column: its parts occur alone too, so it is still found, with a note saying so
    rows2 = [r[:4] + ["web,mobile" if i % 9 == 0 else ["web", "mobile"][i % 2]] + r[5:] for i, r in enumerate(rows)]
    p2 = write(tmp_path / "d.csv", ["txn_id", "account_no", "txn_time", "amount", "devices", "is_fraud"], rows2)
    spec2 = guess_spec(p2)
    assert {f.column: f.kind.value for f in spec2.fields}["devices"] == "multi_valued"
    assert "'devices': read as a list of values separated by ','" in spec2.description


@pytest.mark.parametrize(("name", "pos", "neg"), [("suspicious", "yes", "no"), ("flagged", "Y", "N"),
                                                  ("suspicious", "1", "0")])
def test_a_two_valued_outcome_under_another_name_is_never_a_model_input(tmp_path, name, pos, neg):
    """Without a label column, 'suspicious' (yes/no) was proposed as a categorical model input
    (new-user trial): it may be the answer itself."""
    rows = [[f"T{i}", f"acc{i % 40}", f"2024-01-{1 + i % 28:02d} 10:{i % 60:02d}:00", f"{5 + i % 50}.00",
             ["web", "pos"][i % 2], "Y" if i % 3 else "N", "1" if i % 7 == 0 else "0", pos if i % 50 == 0 else neg]
            for i in range(3000)]
    p = write(tmp_path / "s.csv", ["txn_id", "account_no", "txn_time", "amount", "channel", "card_present_flag",
                                   "bad_pin", name], rows)
    spec = guess_spec(p)
    assert spec.label is None
    assert name in spec.passthrough and name not in {f.column for f in spec.fields}
    assert f"set [label] column = {name!r}, positive = [{pos!r}]" in spec.description
    # ordinary two-valued inputs stay inputs (review: *_flag and bad_* columns were made passthrough)
    assert {f.column for f in spec.fields} == {"channel", "card_present_flag", "bad_pin"}


def test_the_day_month_note_only_when_the_order_is_a_guess(tmp_path):
    """It was printed even when values like 01/30/2026 settle the order (new-user trial)."""
    def spec_of(days):
        rows = [[f"T{i}", f"acc{i % 5}", f"01/{days[i % len(days)]:02d}/2026 10:{i % 60:02d}", "5.00", "1" if i % 9 else "0"]
                for i in range(300)]
        return guess_spec(write(tmp_path / "t.csv", ["txn_id", "account_no", "txn_time", "amount", "is_fraud"], rows))
    settled = spec_of(list(range(1, 31)))
    assert settled.timestamp.format == "%m/%d/%Y %H:%M" and "day/month order" not in settled.description
    guess = spec_of(list(range(1, 13)))
    assert "day/month order may be the other way" in guess.description
