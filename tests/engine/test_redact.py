"""Tests for engine.cases.redact: card masking, pseudonyms, CSV injection, markup escaping."""

from __future__ import annotations

import csv
import io
import json
import math

import numpy as np
import pandas as pd
import pytest

from engine.cases import redact as redact
from engine.cases.redact import (
    escape_markup,
    mask_card_number,
    neutralise_csv_cell,
    neutralise_csv_frame,
    pseudonymise,
)

# ----------------------------------------------------------------------------------------------
# mask_card_number


@pytest.mark.parametrize(
    "text, expected",
    [
        ("4111111111111111", "411111******1111"),
        ("4111 1111 1111 1111", "4111 11** **** 1111"),
        ("4111-1111-1111-1111", "4111-11**-****-1111"),
        ("378282246310005", "378282*****0005"),  # 15-digit Amex
        ("601111111111111111", "601111********1111"),  # 18 digits
        ("6011111111111111117", "601111*********1117"),  # 19 digits
        ("123456789012", "123456**9012"),  # 12 digits: the shortest masked run
        ("card 4111111111111111 used at 12:00", "card 411111******1111 used at 12:00"),
        ("a=4111111111111111,b=5500005555555559",
         "a=411111******1111,b=550000******5559"),
        ("id:4111111111111111x", "id:411111******1111x"),
    ],
)
def test_masks_card_like_digit_runs(text, expected):
    assert mask_card_number(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "12345678901",  # 11 digits: too short
        "amount 1234.56 on 2024-01-31",
        "12345678901234567890",  # 20 digits: longer than any card number
        "",
        "no digits at all",
    ],
)
def test_leaves_non_card_text_alone(text):
    assert mask_card_number(text) == text


def test_masking_never_shows_more_than_ten_digits():
    for n in range(12, 20):
        number = "".join(str((7 * i + 3) % 10) for i in range(n))
        masked = mask_card_number(number)
        assert len(masked) == n
        assert masked[:6] == number[:6] and masked[-4:] == number[-4:]
        assert set(masked[6:-4]) == {"*"}
        assert sum(c.isdigit() for c in masked) == 10


def test_mask_handles_ints_and_non_text():
    assert mask_card_number(4111111111111111) == "411111******1111"
    assert mask_card_number(None) is None
    assert math.isnan(mask_card_number(float("nan")))
    assert mask_card_number(True) is True
    assert mask_card_number(12.5) == 12.5


# ----------------------------------------------------------------------------------------------
# pseudonymise


def test_pseudonym_is_stable_keyed_and_short():
    a = pseudonymise("card:4111", "salt-1")
    assert a == pseudonymise("card:4111", "salt-1") == pseudonymise("card:4111", b"salt-1")
    assert len(a) == 16 and all(c in "0123456789abcdef" for c in a)
    # known value: HMAC-SHA256(key="salt-1", msg="card:4111"), first 16 hex digits
    import hashlib
    import hmac

    assert a == hmac.new(b"salt-1", b"card:4111", hashlib.sha256).hexdigest()[:16]
    assert pseudonymise("card:4111", "salt-2") != a  # different salt, different pseudonym
    assert pseudonymise("card:4112", "salt-1") != a  # different entity
    assert pseudonymise(12, "s") == pseudonymise("12", "s")
    assert len(pseudonymise("x", "s", length=32)) == 32
    ids = [f"0:{i}" for i in range(2000)]
    assert len({pseudonymise(e, "s") for e in ids}) == len(ids)  # no collisions here


@pytest.mark.parametrize("salt", ["", b"", None])
def test_pseudonym_needs_a_salt(salt):
    with pytest.raises(ValueError, match="salt"):
        pseudonymise("x", salt)


@pytest.mark.parametrize("length", [0, 7, 65])
def test_pseudonym_length_bounds(length):
    with pytest.raises(ValueError, match="length"):
        pseudonymise("x", "s", length=length)


# ----------------------------------------------------------------------------------------------
# neutralise_csv_cell


@pytest.mark.parametrize(
    "value",
    ["=1+2", "+1", "-2+3", "@SUM(A1)", "\t=cmd", "\r=cmd", "=HYPERLINK(\"http://x\",\"y\")",
     "-12.50", " =1+1", "\n=1+1", "\u00a0=1+1", "\ufeff=1+1", "\u200b=2+2", "\u3000=1+1", "  \t@x",
     "\u200e=1", "\u202e=1", "\u2061=1", "\u00ad=1", "\u034f+1"],
)
def test_formula_like_strings_get_a_leading_quote(value):
    assert neutralise_csv_cell(value) == "'" + value


@pytest.mark.parametrize("value", ["hello", "12.50", "a=b", "'already", "", " x=1", "\u200b"])
def test_harmless_strings_unchanged(value):
    assert neutralise_csv_cell(value) == value


def test_numbers_stay_numbers():
    out = neutralise_csv_cell(-12.5)
    assert out == -12.5 and isinstance(out, float)
    assert neutralise_csv_cell(-3) == -3 and isinstance(neutralise_csv_cell(-3), int)
    np_val = np.float64(-7.25)
    assert neutralise_csv_cell(np_val) is np_val
    assert neutralise_csv_cell(None) is None
    assert math.isnan(neutralise_csv_cell(float("nan")))
    ts = pd.Timestamp("2024-01-01")
    assert neutralise_csv_cell(ts) is ts


def test_neutralised_frame_round_trips_through_csv():
    df = pd.DataFrame(
        {
            "merchant": ["=cmd|' /C calc'!A0", "Shop, \"Best\"", "@evil", None],
            "amount": [-12.5, 3.0, -0.01, 7.0],
            "=col": ["a", "b", "c", "d"],
        }
    )
    out = neutralise_csv_frame(df)
    assert df["merchant"].iloc[0] == "=cmd|' /C calc'!A0"  # input untouched
    assert out["merchant"].tolist()[:3] == ["'=cmd|' /C calc'!A0", "Shop, \"Best\"", "'@evil"]
    assert pd.isna(out["merchant"].iloc[3])
    assert out["amount"].dtype == "float64" and out["amount"].tolist() == [-12.5, 3.0, -0.01, 7.0]
    assert list(out.columns) == ["merchant", "amount", "'=col"]
    rows = list(csv.reader(io.StringIO(out.to_csv(index=False))))
    assert rows[1][0] == "'=cmd|' /C calc'!A0" and rows[2][0] == 'Shop, "Best"'
    assert rows[1][1] == "-12.5"  # the number is written as a number, not quoted text
    assert not any(cell.startswith(redact.CSV_FORMULA_TRIGGERS) for row in rows for cell in row
                   if not _is_number(cell))


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def test_docstrings_cite_owasp():
    assert redact.OWASP_CSV_INJECTION_URL in neutralise_csv_cell.__doc__
    assert redact.OWASP_XSS_PREVENTION_URL.split("/")[-1] in escape_markup.__doc__.replace(
        "\n", ""
    ).replace(" ", "")


# ----------------------------------------------------------------------------------------------
# escape_markup


def test_escape_markup():
    assert escape_markup('<script>alert("x")</script>') == (
        "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"
    )
    assert escape_markup("Tom & Jerry's") == "Tom &amp; Jerry&#x27;s"
    assert escape_markup("a\x00b\x1bc\td\ne") == "abc\td\ne"
    assert escape_markup(None) == ""
    assert escape_markup(-12.5) == "-12.5"
    # idempotence is NOT expected: escaping twice double-escapes (escape once, at output)
    assert escape_markup("&amp;") == "&amp;amp;"


def test_escape_markdown_shows_bidi_controls_as_visible_text():
    """U+202E in a merchant name would show the rest of a caption reversed: written as the literal
    text \\u202e (its backslash escaped too, so markdown shows it as typed)."""
    assert redact.escape_markdown("ACME \u202eLTD") == "ACME \\\\u202eLTD"
    assert "\u2066" not in redact.escape_markdown("a\u2066b\u2069") and redact.escape_markdown("שלום") == "שלום"


def test_luhn_rule_masks_the_card_number_inside_a_longer_run_and_keeps_keys_raw():
    """Review findings: "ref 12 4111111111111111" and "4111111111111111-01" were left whole (the
    whole run failed the Luhn check); a Luhn-valid 16-digit transaction id was masked in the
    timeline, so the page no longer found its row; a value cut to 24 characters before masking
    showed 14 card digits."""
    import pandas as pd

    from engine.cases import view as cv
    from engine.cases.redact import mask_card_fields, mask_field_value

    assert mask_field_value("merchant", "ref 12 4111111111111111") == "ref 12 411111******1111"
    assert mask_field_value("merchant", "4111111111111111-01") == "411111******1111-01"
    assert mask_field_value("merchant", "-727612092139916043") == "-727612092139916043"  # fails Luhn: whole
    frame = pd.DataFrame({"transaction_id": ["4000000000000002"], "entity_id": ["4111111111111111"],
                          "merchant": ["4000000000000002"]})
    out = mask_card_fields(frame)
    assert out["transaction_id"].iloc[0] == "4000000000000002" and out["entity_id"].iloc[0] == "4111111111111111"
    assert out["merchant"].iloc[0] == "400000******0002"
    row = pd.Series({"merchant": "Shop ref 4111111111111111 x", "timestamp": pd.Timestamp("2024-01-01")})
    (v,) = cv.field_value_texts(row, ["merchant"], "USD")
    assert "41111111" not in v and v.startswith("Shop ref 411111******")


@pytest.mark.parametrize("written", ["4111.1111.1111.1111", "4111/1111/1111/1111", "4111  1111  1111  1111",
                                     "4111_1111_1111_1111", "4111\u200b1111\u200b1111\u200b1111",
                                     "\uff14\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11\uff11"
                                     "\uff11\uff11\uff11"])
def test_card_numbers_in_other_written_forms_are_masked(written):
    """Security test: dots, slashes, doubled spaces, underscores, zero-width characters and
    full-width digits hid a card number from both masking rules (in the page and the exports)."""
    from engine.cases.redact import mask_field_value

    for field in ("merchant", "card"):
        out = mask_field_value(field, f"x {written} y")
        digits = "".join(ch for ch in out if ch.isdigit())
        assert "*" in out and "4111111111111111" not in digits, (field, out)
    assert mask_card_number(written) != written
    assert mask_card_number("caf\u00e9 \u0663 tel 0800 123 4567") == "caf\u00e9 \u0663 tel 0800 123 4567"  # untouched


def test_card_field_names():
    from engine.cases.redact import is_card_field

    assert [is_card_field(n) for n in ("card", "Card Number", "pan", "masked_PAN", "account_number", "cc_num",
                                       "company", "span_id", "merchant", "mcc")] == [
        True, True, True, True, True, True, False, False, False, False]


# ----------------------------------------------------------------------------------------------
# separators (security review: a no-break space, an en dash or a comma hid a card number from both rules)

#: every separator the review named: Unicode spaces, tab, newline, hyphens and dashes, minus signs,
#: soft hyphen, comma, colon, plus
REVIEW_SEPARATORS = (["\u00a0", "\t", "\n", "\u202f", "\u205f", "\u3000", "\u00ad", "\u2212", "\uff0d", "\ufe63",
                      ",", ":", "+", ", ", "\r\n", " \u2013"]
                     + [chr(c) for c in range(0x2000, 0x200B)] + [chr(c) for c in range(0x2010, 0x2016)])


@pytest.mark.parametrize("sep", REVIEW_SEPARATORS, ids=[ascii(s) for s in REVIEW_SEPARATORS])
def test_card_numbers_with_unicode_and_punctuation_separators_are_masked(sep):
    """Both rules, card field and any other field (the Luhn rule), mask the number and keep the
    separators as written."""
    from engine.cases.redact import mask_field_value

    written = sep.join(["4111", "1111", "1111", "1111"])
    expected = sep.join(["4111", "11**", "****", "1111"])
    assert mask_card_number(written) == expected
    assert mask_card_number(f"PAN {written} ok") == f"PAN {expected} ok"
    for field in ("card", "merchant"):
        assert mask_field_value(field, f"x {written} y") == f"x {expected} y", field
    amex = sep.join(["3782", "822463", "10005"])  # 4-6-5, Luhn-valid
    assert mask_field_value("merchant", amex) == sep.join(["3782", "82****", "*0005"])


def test_no_break_space_repro():
    assert mask_card_number("4111\u00a01111\u00a01111\u00a01111") == "4111\u00a011**\u00a0****\u00a01111"


@pytest.mark.parametrize("text", ["12, 34, 56", "2019-01-01 00:00:18", "at 2019-01-01 00:00:18.123456, ok",
                                  "2024/01/31 23:59", "2019-01-01T00:00:18+00:00", "amount 1,234.56 EUR",
                                  "seen 2019-01-01 00:00:18, 2019-01-02 10:11:12 and 2019-01-03 23:59:59"])
def test_lists_of_small_numbers_and_dates_with_times_stay_whole(text):
    """The colon, comma and space as separators must not make timestamps (12 or 14 digits) or short
    lists read as card numbers, in either rule."""
    from engine.cases.redact import mask_field_value

    assert mask_card_number(text) == text
    assert redact.mask_field_value("merchant", text) == text
    assert mask_field_value("card", text) == text


def test_a_card_number_next_to_other_digits_or_a_timestamp_shows_no_more_than_first6_last4():
    """With more separators a run can hold other digits before a card number (a cut from the left
    showed its last 8 digits) or two card numbers (the Luhn rule masked only one)."""
    from engine.cases.redact import mask_field_value

    assert mask_card_number("order 12345 4111 1111 1111 1111") == "order 12345 4*** **** **** 1111"
    assert mask_card_number("Amount 1200.50\n4111 1111 1111 1111") == "Amount 1200.50\n4111 11** **** 1111"  # 50 is not joined
    assert mask_field_value("merchant", "order 12345, 4111 1111 1111 1111") == "order 12345, 4111 11** **** 1111"
    assert mask_field_value("merchant", "4111111111111111 5500005555555559") == "411111******1111 550000******5559"
    assert mask_card_number("2019-01-01 00:00:18 4111 1111 1111 1111") == "2019-01-01 00:00:18 4111 11** **** 1111"
    assert mask_card_number("12345678901234567890") == "12345678901234567890"  # one group of 20 digits: no card


def test_audit_csv_masks_a_comma_separated_card_number_in_a_note(tmp_path):
    """Security review repro: a note with "PAN 4111,1111,1111,1111" appeared whole in the audit CSV."""
    from engine.cases.store import CaseStore, audit_csv

    rows = pd.DataFrame({"entity_id": ["e1"], "max_probability": [0.9], "max_transaction_id": ["t1"],
                         "first_ts": pd.Timestamp("2024-01-01"), "last_ts": pd.Timestamp("2024-01-02"),
                         "max_amount": 5.0, "n_transactions": 2, "n_known_fraud": 0})
    with CaseStore(tmp_path / "cases.sqlite3", four_eyes=False) as s:
        s.upsert_cases("d" * 64, rows)
        s.add_note(1, "PAN 4111,1111,1111,1111 seen 2019-01-01 00:00:18", analyst="alice")
        log = s.audit_log()
    text = audit_csv(log).decode("utf-8")
    assert "4111,1111,1111,1111" not in text
    note = [r for r in csv.DictReader(io.StringIO(text)) if r["action"] == "note_added"][0]["after"]
    assert '"note":"PAN 4111,11**,****,1111 seen 2019-01-01 00:00:18"' in note


@pytest.mark.parametrize("note", ["PAN 4111\u00a01111\u00a01111\u00a01111", "PAN \uff14\uff11\uff11\uff11111111111111"])
def test_audit_csv_masks_numbers_that_json_escaping_hid(tmp_path, note):
    """Review: the audit CSV's JSON was ASCII-escaped, so a no-break space or full-width digits
    reached the masking as escape text ("4111\\u00a01111...") and the number left whole."""
    from engine.cases.store import CaseStore, audit_csv

    rows = pd.DataFrame({"entity_id": ["e1"], "max_probability": [0.9], "max_transaction_id": ["t1"],
                         "first_ts": pd.Timestamp("2024-01-01"), "last_ts": pd.Timestamp("2024-01-02"),
                         "max_amount": 5.0, "n_transactions": 2, "n_known_fraud": 0})
    with CaseStore(tmp_path / "cases.sqlite3", four_eyes=False) as s:
        s.upsert_cases("d" * 64, rows)
        s.add_note(1, note, analyst="alice")
        log = s.audit_log()
    after = [r for r in csv.DictReader(io.StringIO(audit_csv(log).decode("utf-8"))) if r["action"] == "note_added"][0]["after"]
    digits = "".join(ch for ch in json.loads(after)["note"] if ch.isdigit())
    assert "*" in after and len(digits) <= 10, after


@pytest.mark.parametrize("text", ["31/01/2024 14:05 called", "01/02/2019 10:30:00", "2019-01-01\u00a000:00:18",
                                  "2019-01-01, 2019-02-01", "amounts 123.45, 678.90, 1234.56",
                                  "12:30:45 12:31:02 12:45", "10.0.0.1:8080, 192.168.1.1"])
def test_dates_times_amounts_and_addresses_are_never_joined_into_a_card_number(text):
    """Review: with commas, colons and every space as separators they were masked
    ("31/01/20** 14:05"); groups of 1-2 digits are never joined now."""
    assert mask_card_number(text) == text
    assert redact.mask_field_value("merchant", text) == text
    assert mask_card_number("4111111111111111:0") == "411111******1111:0"
