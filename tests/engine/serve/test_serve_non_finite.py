"""A JSON number beyond the float range (``1e400``: Python's json reads it as ``inf``) is refused
for every column the spec reads, naming the key: as cell text it was the id, entity or category
``"inf"`` (``"transaction_id": 1e400`` accepted as "inf", ``"User": -1e400`` the entity
``"-inf:0"``). Number columns keep the file reader's reasons ("amount is not finite")."""

import json

import pytest
from fastapi.testclient import TestClient

from engine.data.spec import DatasetSpec, load_spec
from engine.serve.api import create_app
from engine.serve.record import TRANSACTION_ID_KEY, RecordError, canonical_row, cell_text
from engine.serve.service import ScoringService
from serve_helpers import id_spec, raw_records

NOT_FINITE = "number is not finite (a JSON number beyond the float range, such as 1e400)"
TAB_OK = {"User": "0", "Card": "3", "Year": "2023", "Month": "2", "Day": "28", "Time": "07:05", "Amount": "$-25.00",
          "Use Chip": "Chip Transaction", "Merchant Name": "-394807054096290944", "Merchant City": "Hialeah",
          "Merchant State": "FL", "Zip": "33010.0", "MCC": "5812", "Errors?": "", "Is Fraud?": "No",
          TRANSACTION_ID_KEY: "t1"}


@pytest.mark.parametrize("key", ["tid", "card", "m", "mcc", "e", "y"])
@pytest.mark.parametrize("x", [float("inf"), float("-inf")])
def test_an_infinite_number_is_refused_for_a_text_column(key, x):
    rec = raw_records()[0]
    e = pytest.raises(RecordError, canonical_row, dict(rec, **{key: x}), id_spec()).value
    assert (e.column, e.reason, e.value) == (key, NOT_FINITE, repr(x))
    assert e.detail() == {"loc": ["body", key], "msg": NOT_FINITE, "type": "value_error", "input": repr(x)}


def test_tabformer_ids_entity_parts_and_timestamp_parts():
    spec = load_spec("tabformer")
    assert canonical_row(TAB_OK, spec)["entity_id"] == "0:3"
    for key, x in [(TRANSACTION_ID_KEY, 1e400), ("User", -1e400), ("Card", 1e400), ("Year", 1e400),
                   ("Merchant Name", -1e400), ("Zip", 1e400)]:
        e = pytest.raises(RecordError, canonical_row, dict(TAB_OK, **{key: float(x)}), spec).value
        assert (e.column, e.reason) == (key, NOT_FINITE), key


def test_number_columns_keep_the_file_readers_reasons_and_cell_text_never_writes_inf():
    spec, rec = id_spec(), raw_records()[0]
    with pytest.raises(RecordError, match="^amt: amount is not finite$"):
        canonical_row(dict(rec, amt=float("inf")), spec)
    with pytest.raises(RecordError, match="^r: risk is not finite$"):
        canonical_row(dict(rec, r=float("-inf")), spec)
    stepped = DatasetSpec.model_validate({**spec.model_dump(mode="json"), "timestamp": {
        "column": "step", "unit": "D", "origin": "2000-01-01"}})
    srec = dict({k: v for k, v in rec.items() if k != "ts"}, step=float("inf"))
    with pytest.raises(RecordError, match="^step: timestamp offset is not a number$"):
        canonical_row(srec, stepped)
    with pytest.raises(ValueError, match="inf is not a finite number"):
        cell_text(float("inf"))
    assert cell_text(1e300) == "1e+300" and cell_text(float("nan")) == ""  # finite: as before


def test_posting_1e400_is_a_422_naming_the_key(bundle, records, tmp_path):
    svc = ScoringService(bundle, tmp_path / "history.sqlite3", case_db=tmp_path / "cases.sqlite3", start_worker=False)
    c = TestClient(create_app(svc, None), base_url="http://testserver", raise_server_exceptions=False)
    try:
        for key, literal in [("tid", "1e400"), ("card", "-1e400"), ("m", "1E999")]:
            body = json.dumps(dict(records[0], **{key: 0})).replace(f'"{key}": 0', f'"{key}": {literal}')
            r = c.post("/v1/score", content=body.encode(), headers={"Content-Type": "application/json"})
            assert r.status_code == 422, r.text
            d = r.json()["detail"][0]
            assert d["loc"] == ["body", key] and d["msg"] == NOT_FINITE and d["input"] in ("inf", "-inf"), d
        items = json.dumps({"transactions": [records[1], dict(records[2], tid=0)]}).replace('"tid": 0', '"tid": 1e400')
        r = c.post("/v1/score/batch", content=items.encode(), headers={"Content-Type": "application/json"})
        assert r.status_code == 200, r.text
        out = r.json()
        assert [x["index"] for x in out["results"]] == [0]
        assert [(x["index"], x["loc"][-1], x["msg"]) for x in out["rejected"]] == [(1, "tid", NOT_FINITE)]
        assert svc.history.count() == 1
    finally:
        svc.close()
