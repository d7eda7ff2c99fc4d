"""A posted transaction is validated under the same rules as files: for the same cells, the
service refuses with the file reader's column and reason, and accepts with its values."""

import math

import pandas as pd
import pytest

from engine.data.io import read_transactions
from engine.data.spec import load_spec
from engine.serve.record import RecordError, canonical_row, cell_text
from serve_helpers import id_spec

TINY_OK = {"tid": "a1", "card": "c1", "ts": "2024-03-01T10:00:00", "amt": "$12.50", "m": " shop ", "mcc": "5411",
           "r": "0.5", "e": "Bad PIN, Bad CVV", "y": "0"}
TINY_BAD = [
    {"amt": "abc"}, {"amt": ""}, {"amt": "1e13"}, {"amt": "0x1A"}, {"ts": "not a date"}, {"ts": ""},
    {"ts": "2300-01-01"}, {"card": "  "}, {"r": "x"}, {"y": "maybe"}, {"e": "a|b"}, {"m": "x" * 5000},
    {"m": "a\x00b"}, {"tid": " "}, {"amt": "abc", "ts": ""},  # two problems: the file's order decides
]
TAB_OK = {"User": "0", "Card": "3", "Year": "2023", "Month": "2", "Day": "28", "Time": "07:05", "Amount": "$-25.00",
          "Use Chip": "Chip Transaction", "Merchant Name": "-394807054096290944", "Merchant City": "Hialeah",
          "Merchant State": "FL", "Zip": "33010.0", "MCC": "5812", "Errors?": "", "Is Fraud?": "No"}
TAB_BAD = [
    {"Year": "20x3"}, {"Month": "13"}, {"Day": "30"}, {"Time": "25:00"}, {"Time": ""}, {"Year": ""},
    {"User": ""}, {"Card": "3:1"}, {"Amount": "$abc"}, {"Is Fraud?": "Maybe"}, {"Month": "2.5"},
]


def _compare(spec, ok, bad, tmp_path, id_key=None):
    rows = [ok] + [{**ok, **b, **({"tid": f"b{i}"} if "tid" in ok and "tid" not in b else {})}
                   for i, b in enumerate(bad)]
    path = tmp_path / "cells.parquet"
    pd.DataFrame(rows).astype(str).to_parquet(path, index=False)
    res = read_transactions(path, spec)
    assert res.rows_read == len(rows) and len(res.rejected) == len(bad)
    rej = res.rejected.set_index("row_number")
    for i, rec in enumerate(rows[1:], start=2):
        post = dict(rec, **({id_key: f"p{i}"} if id_key else {}))
        with pytest.raises(RecordError) as e:
            canonical_row(post, spec)
        want = rej.loc[i]
        assert (e.value.column, e.value.reason) == (want["column"], want["reason"]), rec
    got = canonical_row(dict(ok, **({id_key: "p1"} if id_key else {})), spec)
    frame_row = res.frame.iloc[0]
    for c in res.frame.columns:
        if c in ("row_number", "transaction_id"):
            continue
        a, b = got[c], frame_row[c]
        if c == "label":
            assert a == (None if pd.isna(b) else int(b))
        elif isinstance(b, float) and math.isnan(b):
            assert math.isnan(a)
        else:
            assert a == b, c
    return got


def test_same_rejections_and_values_as_the_file_reader_iso_timestamps(tmp_path):
    got = _compare(id_spec(), TINY_OK, TINY_BAD, tmp_path)
    assert got["merchant"] == "shop" and got["errors"] == "Bad CVV|Bad PIN" and got["amount"] == 12.5


def test_same_rejections_and_values_as_the_file_reader_timestamp_parts(tmp_path):
    got = _compare(load_spec("tabformer"), TAB_OK, TAB_BAD, tmp_path, id_key="transaction_id")
    assert got["entity_id"] == "0:3" and got["zip"] == "33010" and got["amount"] == -25.0
    assert got["timestamp"] == pd.Timestamp("2023-02-28 07:05")


def test_json_numbers_and_service_rules():
    spec = id_spec()
    row = canonical_row({**TINY_OK, "amt": 12, "r": None, "mcc": 5411.0}, spec)
    assert row["amount"] == 12.0 and math.isnan(row["risk"]) and row["mcc"] == "5411"
    assert cell_text(1.0) == "1" and cell_text(0.25) == "0.25" and cell_text(True) == "true"
    with pytest.raises(RecordError, match="amount is not finite"):
        canonical_row({**TINY_OK, "amt": float("inf")}, spec)
    with pytest.raises(RecordError, match="field required") as e:
        canonical_row({k: v for k, v in TINY_OK.items() if k != "mcc"}, spec)
    assert e.value.column == "mcc"
    with pytest.raises(RecordError, match="expected a text or a number"):
        canonical_row({**TINY_OK, "m": ["a"]}, spec)
    no_label = canonical_row({k: v for k, v in TINY_OK.items() if k != "y"}, spec)
    assert no_label["label"] is None
    # a spec without an id column needs "transaction_id" (the idempotency key)
    with pytest.raises(RecordError) as e:
        canonical_row(TAB_OK, load_spec("tabformer"))
    assert e.value.column == "transaction_id" and e.value.reason == "field required"
    # a spec with delayed aggregates needs them from the caller
    hb = load_spec("handbook")
    rec = {"TRANSACTION_ID": "1", "CUSTOMER_ID": "7", "TX_DATETIME": "2018-04-01 00:00:31", "TX_AMOUNT": 57.16,
           "TERMINAL_ID": "3156", "TX_FRAUD_SCENARIO": 0}
    with pytest.raises(RecordError) as e:
        canonical_row(rec, hb)
    assert e.value.column == "terminal_risk_count_1d"
    assert e.value.reason == (
        "field required (also missing: 'terminal_risk_fraud_rate_1d', 'terminal_risk_count_7d', "
        "'terminal_risk_fraud_rate_7d', 'terminal_risk_count_30d', 'terminal_risk_fraud_rate_30d', "
        "'terminal_risk_recent_fraud_share_1', 'terminal_risk_recent_fraud_share_3', "
        "'terminal_risk_recent_fraud_share_10' and 2 more)")
    with pytest.raises(RecordError) as e:
        canonical_row({"TRANSACTION_ID": "1", "CUSTOMER_ID": "7", "TX_DATETIME": "2018-04-01 00:00:31"}, hb)
    assert e.value.column == "TX_AMOUNT" and e.value.reason.startswith(
        "field required (also missing: 'TERMINAL_ID', 'terminal_risk_count_1d', ") and e.value.reason.endswith(" and 4 more)")
    cols = [c for a in hb.aggregates for c in a.columns()]
    full = canonical_row({**rec, **{c: 0.0 for c in cols}}, hb)
    assert full["terminal_risk_fraud_rate_7d"] == 0.0 and full["entity_id"] == "7"


def test_plain_iso_fast_path_equals_pandas():
    """The request path parses plain ISO 8601 local times itself (engine.serve.record._iso_plain_ns);
    wherever it answers, the answer equals the file reader's pd.to_datetime(format="ISO8601",
    utc=True); everything else is left to pandas (None)."""
    import numpy as np
    import pandas as pd

    from engine.serve.record import _iso_plain_ns

    def pandas_ns(t):
        p = pd.to_datetime(pd.Index([t], dtype=object), format="ISO8601", errors="coerce", utc=True).tz_localize(None)
        return None if p.isna()[0] else int(p[0].as_unit("ns").value)

    rng = np.random.default_rng(0)
    lo, hi = pd.Timestamp("1678-01-02").value, pd.Timestamp("2261-12-30").value
    texts = []
    for ns in rng.integers(lo, hi, 400):
        ts = pd.Timestamp(int(ns))
        texts += [ts.strftime("%Y-%m-%d %H:%M:%S"), ts.strftime("%Y-%m-%dT%H:%M"),
                  ts.strftime("%Y-%m-%d %H:%M:%S.") + f"{ts.nanosecond + 1000 * ts.microsecond:09d}"[: rng.integers(1, 10)]]
    texts += ["2018-04-01 00:00:31", "2020-02-29 12:00:00", "2000-01-01T00:00:00.5", "2018-04-01 23:59:59.999999999"]
    answered = 0
    for t in texts:
        got = _iso_plain_ns(t)
        if got is not None:
            answered += 1
            assert got == pandas_ns(t), t
    assert answered == len(texts)  # every plain form above takes the fast path
    # not plain, or not valid: left to pandas (which parses or refuses them with the file reader's rule)
    for t in ["2019-02-29 00:00:00", "2018-04-01 24:00:00", "2018-04-01 23:60:00", "2018-04-01 23:59:60",
              "2018-13-01 00:00:00", "2018-04-01", "2018-04-01 00:00:00+02:00", "2018-04-01 00:00:00Z",
              "1500-01-01 00:00:00", "2263-01-01 00:00:00", "18-04-01 00:00:00", "2018-04-01 00:00:00.1234567890",
              "\uff12\uff10\uff11\uff18-04-01 00:00:00", "2018-04-01 00:00:0\u0663"]:  # non-ASCII digits: pandas decides
        assert _iso_plain_ns(t) is None, t
