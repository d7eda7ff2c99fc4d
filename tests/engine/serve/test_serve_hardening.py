"""The scoring service's HTTP surface under hostile or malformed requests (findings of the
attacker trial): NaN-safe explanations, metrics of every status, Content-Type and Host checks,
body caps before parsing, 422 naming the key for every malformed input, /healthz without the
token, ids with "/", duplicates with logit/calibrated, the calibrated probability of a stored
explanation, and the token rules."""

import dataclasses
import json
import math
import sqlite3

import pytest
from fastapi.testclient import TestClient

from engine.cases.store import CaseStore
from engine.serve import guard
from engine.serve.api import create_app
from engine.serve.record import RecordError, canonical_row, json_finite
from engine.serve.service import ScoringService
from engine.serve.warm import TokenError, resolve_token
from serve_helpers import id_spec, raw_records
from tiny_models import tiny_spec

TOKEN = "Zq3-8vLk_p2Rt7YwXe5NmB4cHj6DfG9sUa1"


def make(bundle, tmp_path, token=None, loopback_port=None, **kw):
    kw.setdefault("case_db", tmp_path / "cases.sqlite3")
    kw.setdefault("start_worker", False)
    svc = ScoringService(bundle, tmp_path / "history.sqlite3", **kw)
    base = f"http://127.0.0.1:{loopback_port}" if loopback_port else "http://testserver"
    return svc, TestClient(create_app(svc, token, loopback_port=loopback_port), base_url=base,
                           raise_server_exceptions=False)


def metric(c, name: str) -> float:
    lines = dict(ln.rsplit(" ", 1) for ln in c.get("/metrics").text.splitlines() if ln and not ln.startswith("#"))
    return float(lines.get(name, 0))


def post_raw(c, path, body: bytes | str, ctype="application/json", **headers):
    if ctype is not None:
        headers["Content-Type"] = ctype
    return c.post(path, content=body.encode() if isinstance(body, str) else body, headers=headers)


# ---------------------------------------------------------------- 1: NaN-safe explanations, metrics
def test_stored_nan_explanation_answers_json_and_storage_refuses_nan(bundle, records, tmp_path):
    svc, c = make(bundle, tmp_path)
    b = c.post("/v1/score", json=records[0]).json()
    # a row stored before the fix: json.dumps wrote the NaN weight of an unweighed query reason
    bad = {"explanation": {"score_logit": 1.5, "values": [0.1, float("nan")]},
           "reasons": [{"kind": "query_amount", "weight": float("nan"), "about": "query"}]}
    with sqlite3.connect(svc.history_path) as con:
        con.execute("INSERT INTO explanations(transaction_id, entity_id, case_id, method, explanation_json, "
                    "created_at) VALUES (?,?,?,?,?,?)", (b["transaction_id"], b["entity_id"], None, "occlusion",
                                                        json.dumps(bad), "2026-12-01T00:00:00"))
    r = c.get(f"/v1/explanations/{b['transaction_id']}")
    assert r.status_code == 200, r.text
    assert "NaN" not in r.text
    ex = r.json()
    assert ex["reasons"][0]["weight"] is None and ex["explanation"]["values"] == [0.1, None]
    with pytest.raises(ValueError, match="not JSON compliant"):  # cannot recur: storage refuses NaN
        svc.history.put_explanation("t-x", "e", None, "occlusion", bad)
    assert json_finite({"a": [1.0, float("inf"), -float("inf")], "b": "x"}) == {"a": [1.0, None, None], "b": "x"}
    svc.close()


def test_metrics_count_the_real_status_of_every_route(bundle, records, tmp_path, monkeypatch):
    svc, c = make(bundle, tmp_path)
    c.post("/v1/score", json=records[0])
    assert c.get("/v1/explanations/none-such").status_code == 404

    def boom(tid):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(svc, "explanation", boom)
    r = c.get("/v1/explanations/anything")
    assert r.status_code == 500 and r.json()["detail"][0]["type"] == "internal_error"
    assert "RuntimeError" in r.json()["detail"][0]["msg"]
    assert post_raw(c, "/v1/score", json.dumps(records[1]), ctype="text/plain").status_code == 415
    assert metric(c, 'fraudlens_serve_requests_total{route="/v1/explanations",status="500"}') == 1
    assert metric(c, 'fraudlens_serve_requests_total{route="/v1/explanations",status="404"}') == 1
    assert metric(c, 'fraudlens_serve_requests_total{route="/v1/explanations",status="200"}') == 0
    assert metric(c, 'fraudlens_serve_requests_total{route="/v1/score",status="415"}') == 1
    assert metric(c, 'fraudlens_serve_requests_total{route="/v1/score",status="200"}') == 1
    c.get("/healthz")
    assert metric(c, 'fraudlens_serve_requests_total{route="/healthz",status="200"}') == 1
    svc.close()


# ---------------------------------------------------------------- 4, 19: Content-Type and Host
def test_posts_need_application_json_utf8(bundle, records, tmp_path):
    svc, c = make(bundle, tmp_path)
    body = json.dumps(records[0])
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                  "application/json; charset=utf-16", "application/jsonx", None):
        r = post_raw(c, "/v1/score", body, ctype=ctype, Origin="http://evil.example")
        assert r.status_code == 415, (ctype, r.text)
        assert r.json()["detail"][0]["loc"] == ["header", "Content-Type"]
    r = post_raw(c, "/v1/score/batch", json.dumps({"transactions": [records[0]]}), ctype="text/plain")
    assert r.status_code == 415
    assert svc.history.count() == 0  # nothing committed
    r = post_raw(c, "/v1/score", body.encode("utf-16"))  # UTF-16 body labelled JSON: not UTF-8
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
    assert "UTF-8" in r.json()["detail"][0]["msg"]
    assert post_raw(c, "/v1/score", body, ctype='application/JSON; charset="UTF-8"').status_code == 200
    # the CORS preflight a browser needs before a cross-site application/json POST is never approved
    pre = c.options("/v1/score", headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
                                          "Access-Control-Request-Headers": "content-type"})
    assert pre.status_code >= 400 and not any(k.lower().startswith("access-control-") for k in pre.headers)
    assert svc.history.count() == 1
    svc.close()


def test_loopback_service_checks_the_host_header(bundle, records, tmp_path):
    svc, c = make(bundle, tmp_path, loopback_port=18731)
    for host in ("evil.example", "evil.example:18731", "127.0.0.1:9999", "localhost", "10.0.0.5:18731", "::1"):
        r = c.post("/v1/score", json=records[0], headers={"Host": host})
        assert r.status_code == 421, (host, r.text)
        assert r.json()["detail"][0]["loc"] == ["header", "Host"]
        assert c.get("/healthz", headers={"Host": host}).status_code == 421
    assert svc.history.count() == 0
    for i, host in enumerate(("127.0.0.1:18731", "localhost:18731", "[::1]:18731", "LOCALHOST:18731")):
        r = c.post("/v1/score", json=records[i], headers={"Host": host})
        assert r.status_code == 200, (host, r.text)
    assert svc.history.count() == 4
    assert guard.host_ok("127.0.0.2:80", None) and not guard.host_ok("127.0.0.1.evil.example", None)
    assert guard.host_ok("localhost", 80) and not guard.host_ok("localhost:x", 80)
    assert not guard.host_ok("[::1", None) and not guard.host_ok("[::1:8000", 8000) and guard.host_ok("[::1]:8000", 8000)
    svc.close()


# ---------------------------------------------------------------- 5: body caps before parsing
def test_body_caps_before_parsing(bundle, records, tmp_path):
    svc, c = make(bundle, tmp_path)
    cap = guard.MAX_BODY_BYTES["/v1/score"]
    assert cap == 2**20 and guard.MAX_BODY_BYTES["/v1/score/batch"] == 16 * 2**20
    big = json.dumps(dict(records[0], pad="x" * cap))
    r = post_raw(c, "/v1/score", big)
    assert r.status_code == 413 and "1,048,576 bytes" in r.json()["detail"][0]["msg"]
    r = post_raw(c, "/v1/score", "{" + "x" * cap)  # not JSON: refused by size, never parsed
    assert r.status_code == 413

    def chunks():  # chunked upload, no Content-Length
        for _ in range(40):
            yield b"x" * 65536

    r = c.post("/v1/score", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["detail"][0]["type"] == "body_too_large"
    r = post_raw(c, "/v1/score", json.dumps(records[0]), **{"Content-Length": "99999999"})
    assert r.status_code == 413
    # the same 1 MiB+ body as a batch is under the batch cap
    r = post_raw(c, "/v1/score/batch", json.dumps({"transactions": [dict(records[0], pad="x" * cap)]}))
    assert r.status_code == 200 and r.json()["accepted"] == 1
    assert svc.history.count() == 1
    svc.close()


# ---------------------------------------------------------------- 6, 11: every malformed input is a 422
BAD_CELLS = [
    ({"amt": 10**400}, "amt", "amount is not finite"),
    ({"r": -10**400}, "r", "not finite"),
    ({"tid": ["a", "b"]}, "tid", "got a list"),
    ({"tid": {"a": 1}}, "tid", "got an object"),
    ({"card": [1]}, "card", "got a list"),
    ({"m": "s\ud800"}, "m", "lone surrogate"),
    ({"tid": "bad\ud800"}, "tid", "lone surrogate"),
    ({"card": "\udfffx"}, "card", "lone surrogate"),
    ({"unused\ud800": 1}, "unused\\ud800", "lone surrogate"),
    ({"card": True}, "card", "got a boolean"),
    ({"tid": False}, "tid", "got a boolean"),
    ({"amt": True}, "amt", "got a boolean"),
    ({"ts": True}, "ts", "got a boolean"),
]


@pytest.mark.parametrize("change,column,reason", BAD_CELLS)
def test_malformed_cells_are_422_naming_the_key(bundle, records, tmp_path, change, column, reason):
    svc, c = make(bundle, tmp_path)
    r = post_raw(c, "/v1/score", json.dumps(dict(records[0], **change)))  # ensure_ascii: "\ud800" escapes
    assert r.status_code == 422, r.text
    d = r.json()["detail"][0]
    assert d["loc"] == ["body", column] and reason in d["msg"], d
    assert svc.history.count() == 0
    svc.close()


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_json_literals_are_json_invalid(bundle, records, tmp_path, literal):
    svc, c = make(bundle, tmp_path)
    for key in ("amt", "r"):
        body = json.dumps(records[0]).replace(json.dumps(records[0][key]), literal, 1)
        assert literal in body
        r = post_raw(c, "/v1/score", body)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["type"] == "json_invalid" and literal in r.json()["detail"][0]["msg"]
    svc.close()


def test_a_repeated_key_is_json_invalid(bundle, records, tmp_path):
    """Two "amt" keys: parsers disagree on which wins, so the body is refused, not read as the last."""
    svc, c = make(bundle, tmp_path)
    body = json.dumps(records[0])[:-1] + ', "amt": 99999.0}'
    r = post_raw(c, "/v1/score", body)
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid", r.text
    assert "the key 'amt' appears more than once" in r.json()["detail"][0]["msg"]
    nested = json.dumps([records[0], records[1]])
    r = post_raw(c, "/v1/score/batch", nested.replace('"tid"', '"m": "x", "tid"', 1))  # "m" twice in item 0
    assert r.status_code == 422 and "'m' appears more than once" in r.json()["detail"][0]["msg"], r.text
    assert svc.history.count() == 0
    r = post_raw(c, "/v1/score", json.dumps(dict(records[0], m=True)))  # a boolean in a field: its text, as before
    assert r.status_code == 200, r.text
    svc.close()


def test_deeply_nested_json_is_422(bundle, records, tmp_path):
    svc, c = make(bundle, tmp_path)
    deep = json.dumps(records[0])[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}"
    r = post_raw(c, "/v1/score", deep)
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
    assert "nested too deeply" in r.json()["detail"][0]["msg"]
    svc.close()


def test_batch_rejects_each_bad_item_and_scores_the_others(bundle, records, tmp_path):
    svc, c = make(bundle, tmp_path)
    items = [records[0], dict(records[1], amt=10**400), records[2], dict(records[3], tid=[1]),
             dict(records[4], m="s\ud800"), dict(records[5], **{"k\udc00": "v"}), records[6]]
    r = post_raw(c, "/v1/score/batch", json.dumps({"transactions": items}))
    assert r.status_code == 200, r.text
    out = r.json()
    assert [x["index"] for x in out["results"]] == [0, 2, 6]
    assert [(x["index"], x["loc"][-1]) for x in out["rejected"]] == [(1, "amt"), (3, "tid"), (4, "m"), (5, "k\\udc00")]
    assert svc.history.count() == 3
    # and a later score of those entities is unaffected (nothing of the bad items was staged)
    assert c.post("/v1/score", json=records[7]).status_code == 200
    svc.close()


def test_canonical_row_overflow_and_surrogates_directly():
    spec = id_spec()
    rec = raw_records()[0]
    with pytest.raises(RecordError, match="amount is not finite"):
        canonical_row(dict(rec, amt=10**400), spec)
    e = pytest.raises(RecordError, canonical_row, dict(rec, m="x\ud800y"), spec).value
    assert e.column == "m" and e.value == "x\\ud800y"
    e.value.encode("utf-8")  # the echoed input always encodes
    assert math.isclose(canonical_row(dict(rec, amt=10**3), spec)["amount"], 1000.0)
    # a counter timestamp (BankSim's "step", unit days): a 400-digit step names the column
    from engine.data.spec import DatasetSpec

    stepped = DatasetSpec.model_validate({**spec.model_dump(mode="json"), "timestamp": {
        "column": "step", "unit": "D", "origin": "2000-01-01"}})
    srec = dict({k: v for k, v in rec.items() if k != "ts"}, step=3)
    assert canonical_row(srec, stepped)["timestamp"].isoformat() == "2000-01-04T00:00:00"
    with pytest.raises(RecordError, match="timestamp offset is not a number") as e:
        canonical_row(dict(srec, step=10**400), stepped)
    assert e.value.column == "step"
    # a spec without an id column: the id is the "transaction_id" key (BankSim's case in the trial)
    plain = tiny_spec()
    assert plain.id is None
    base = {k: v for k, v in rec.items() if k != "tid"}
    assert canonical_row(dict(base, transaction_id="t-1"), plain)["transaction_id"] == "t-1"
    for bad, word in ((["t"], "got a list"), ({"t": 1}, "got an object"), ("t\ud800", "lone surrogate")):
        with pytest.raises(RecordError, match=word) as e:
            canonical_row(dict(base, transaction_id=bad), plain)
        assert e.value.column == "transaction_id"


# ---------------------------------------------------------------- 9: /healthz and 409 disclosures
def test_healthz_details_need_the_token_and_409_names_no_time(bundle, records, tmp_path):
    svc, c = make(bundle, tmp_path, token=TOKEN)
    assert c.get("/healthz").json() == {"status": "ok"}
    assert c.get("/healthz", headers={"Authorization": "Bearer wrong"}).json() == {"status": "ok"}
    auth = {"Authorization": f"Bearer {TOKEN}"}
    h = c.get("/healthz", headers=auth).json()
    assert h["model_sha256"] == bundle.sha256 and "thresholds" in h and "case_worker" in h
    assert c.post("/v1/score", json=records[0], headers=auth).status_code == 200
    r = c.post("/v1/score", json=dict(records[0], amt=records[0]["amt"] + 1), headers=auth)
    assert r.status_code == 409
    msg = r.json()["detail"][0]["msg"]
    assert msg == "transaction id already used by a different transaction"
    svc.close()
    svc, c = make(bundle, tmp_path / "open")  # without a token the details stay public (loopback)
    assert "model_sha256" in c.get("/healthz").json()
    svc.close()


# ---------------------------------------------------------------- 12: ids with "/"
def test_explanations_of_ids_with_slashes(bundle, records, tmp_path):
    svc, c = make(bundle, tmp_path)
    tid = "acct/2024/tx-9"
    b = c.post("/v1/score", json=dict(records[0], tid=tid)).json()
    assert b["transaction_id"] == tid
    svc.history.put_explanation(tid, b["entity_id"], None, "occlusion", {"explanation": {}, "reasons": []})
    for path in ("/v1/explanations/acct/2024/tx-9", "/v1/explanations/acct%2F2024%2Ftx-9"):
        r = c.get(path)
        assert r.status_code == 200, (path, r.text)
        assert r.json()["transaction_id"] == tid
    assert c.get("/v1/explanations/acct/2024").status_code == 404
    from urllib.parse import quote

    odd = "q?x=1#f%/ü"  # "?", "#" and "%" must be percent-encoded in the path
    b = c.post("/v1/score", json=dict(records[1], tid=odd)).json()
    svc.history.put_explanation(odd, b["entity_id"], None, "occlusion", {"explanation": {}, "reasons": []})
    r = c.get("/v1/explanations/" + quote(odd, safe=""))
    assert r.status_code == 200 and r.json()["transaction_id"] == odd
    svc.close()


# ---------------------------------------------------------------- 13: duplicates
def test_duplicates_carry_logit_and_calibrated(bundle, records, tmp_path):
    svc, c = make(bundle, tmp_path)
    first = c.post("/v1/score", json=records[0]).json()
    again = c.post("/v1/score", json=records[0]).json()
    assert again["duplicate"] and again["logit"] == first["logit"] and again["calibrated"] is first["calibrated"]
    assert again["probability"] == first["probability"]
    r = post_raw(c, "/v1/score/batch", json.dumps({"transactions": [records[1], records[1]]})).json()
    a, b = r["results"]
    assert not a["duplicate"] and b["duplicate"] and b["logit"] == a["logit"] and b["calibrated"] is False
    svc.close()


# ---------------------------------------------------------------- 16: calibrated stored explanation
def test_stored_explanation_gives_the_calibrated_probability(bundle, records, tmp_path):
    import engine.serve.casework as cw

    cal = dataclasses.replace(bundle, meta={**bundle.meta, "calibration": {"method": "platt", "a": 0.5, "b": -1.0}})
    assert cal.calibrated
    svc, c = make(cal, tmp_path)
    svc.thresholds = {"review": 0.0, "decline": 1.0, "source": "test"}  # every transaction flagged
    bodies = [c.post("/v1/score", json=rec).json() for rec in records[:12]]
    assert all(b["calibrated"] for b in bodies)
    history, store = cw.HistoryStore(svc.history_path), CaseStore(tmp_path / "cases.sqlite3")
    assert svc.worker.step(history, store)
    history.close(), store.close()
    for b in bodies[-3:]:
        ex = c.get(f"/v1/explanations/{b['transaction_id']}").json()
        assert ex["calibrated"] is True
        assert ex["probability"] == pytest.approx(b["probability"], abs=1e-12)
        sig = 1.0 / (1.0 + math.exp(-b["logit"]))
        assert ex["explanation"]["score_probability"] == pytest.approx(sig, abs=1e-4)
        assert abs(ex["probability"] - ex["explanation"]["score_probability"]) > 1e-3  # calibrated differs
        assert all(r["weight"] is None or math.isfinite(r["weight"]) for r in ex["reasons"])
    # the explanation of a frame without stored probabilities is calibrated from its logit
    frame = svc.history.entity_frame(bodies[-1]["entity_id"]).drop(columns=["probability"])
    out = cw.explain_flagged(cal, frame, bodies[-1]["transaction_id"])
    assert out["probability"] == pytest.approx(bodies[-1]["probability"], abs=1e-5)
    json.dumps(out, allow_nan=False)
    svc.close()


# ---------------------------------------------------------------- 18: token rules
def test_token_rules(tmp_path):
    with pytest.raises(TokenError, match="at least 32 characters"):
        resolve_token(None, "127.0.0.1", env={"FRAUDLENS_SERVE_TOKEN": "s3cret-token-0123456789"})  # 23
    with pytest.raises(TokenError, match="only 1 distinct characters; it must have at least 10 distinct"):
        resolve_token(None, "0.0.0.0", env={"FRAUDLENS_SERVE_TOKEN": "a" * 40})
    with pytest.raises(TokenError, match="only 9 distinct"):
        resolve_token(None, "0.0.0.0", env={"FRAUDLENS_SERVE_TOKEN": "123456789" * 4})
    assert resolve_token(None, "0.0.0.0", env={"FRAUDLENS_SERVE_TOKEN": "1234567890" * 4}) == "1234567890" * 4
    f = tmp_path / "token"
    f.write_text(f"\n   \n{TOKEN}\nsecond-line-ignored\n")
    assert resolve_token(f, "10.0.0.5", env={}) == TOKEN
    f.write_text("\n\n  \n")
    with pytest.raises(TokenError, match="no token .every line is empty."):
        resolve_token(f, "10.0.0.5", env={})
    f.write_text("")
    with pytest.raises(TokenError, match="no token"):
        resolve_token(f, "127.0.0.1", env={})
    with pytest.raises(TokenError, match="cannot be read"):
        resolve_token(tmp_path / "missing", "127.0.0.1", env={})


# ---------------------------------------------------------------- a timestamp ahead of the clock
def test_a_transaction_dated_ahead_of_the_clock_is_refused_and_does_not_lock_its_entity_out(bundle, records,
                                                                                             tmp_path):
    """Accepted, a transaction dated 2099 would make every later real transaction of its entity
    'out of order' (409): the service refuses it (422, naming the timestamp column) on every path."""
    import time

    import pandas as pd

    e = records[0]["card"]
    mine = [r for r in records if r["card"] == e]
    future = dict(mine[1], tid="t-future",
                  ts=(pd.Timestamp(time.time(), unit="s") + pd.Timedelta(days=3)).isoformat())
    svc, c = make(bundle, tmp_path)
    assert c.post("/v1/score", json=mine[0]).status_code == 200
    r = c.post("/v1/score", json=future)
    assert r.status_code == 422, r.text
    d = r.json()["detail"][0]
    assert d["loc"][-1] == "ts" and "min after this server's clock" in d["msg"] and "at most 10 min" in d["msg"]
    assert d["type"] == "timestamp_ahead"  # the same type on every path
    assert c.post("/v1/score", json=mine[1]).status_code == 200  # the entity goes on
    b = c.post("/v1/score/batch", json={"transactions": [dict(future, tid="t-future-2"), mine[2]]}).json()
    assert [x["index"] for x in b["results"]] == [1]
    assert [(x["index"], x["type"]) for x in b["rejected"]] == [(0, "timestamp_ahead")]
    row = canonical_row(dict(future, tid="t-future-3"), bundle.spec)
    res = svc.score_rows([row])[0]  # the scorer process's path
    assert res[:2] == ("err", 422) and res[2][0]["type"] == "timestamp_ahead"
    assert svc.history.get("t-future") is None
    svc.close()

    # a --warm file: the row dated ahead is rejected with its reason, the others appended
    from engine.serve.warm import warm_start
    from serve_helpers import write_raw

    svc, c = make(bundle, tmp_path / "warm")
    out = warm_start(svc, write_raw(records[:10] + [future], tmp_path / "warm.parquet"), log=lambda m: None)
    assert (out["appended"], out["rejected"]) == (10, 1)
    rej = out["rejected_rows"].iloc[0]
    assert (rej["row_number"], rej["transaction_id"], rej["column"]) == (11, "t-future", "ts")
    assert "min after this server's clock" in rej["reason"]
    svc.close()

    # the check can fail: without a limit the row is accepted and the entity is locked out
    with pytest.raises(ValueError, match="max_ahead_s"):
        make(bundle, tmp_path / "bad", max_ahead_s=-1.0)
    svc, c = make(bundle, tmp_path / "nolimit", max_ahead_s=float("inf"))  # serve --max-ahead-minutes inf
    assert c.post("/v1/score", json=mine[0]).status_code == 200
    assert c.post("/v1/score", json=future).status_code == 200
    assert c.post("/v1/score", json=mine[1]).status_code == 409
    svc.close()
