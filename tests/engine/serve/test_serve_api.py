"""The scoring service through FastAPI's TestClient: scores equal batch scoring, idempotency,
4xx naming the field, restart and LRU rebuild from the history store, token, shadow mode,
cases and explanations of flagged transactions, metrics."""

import sqlite3
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from engine.cases.store import CaseStore
from engine.serve.api import create_app
from engine.serve.casework import service_source_id
from engine.serve.service import ScoringService
from engine.serve.warm import TokenError, resolve_token, warm_start
from serve_helpers import write_raw


def make(bundle, tmp_path, **kw):
    kw.setdefault("case_db", tmp_path / "cases.sqlite3")
    kw.setdefault("start_worker", False)
    token = kw.pop("token", None)
    svc = ScoringService(bundle, tmp_path / "history.sqlite3", **kw)
    return svc, TestClient(create_app(svc, token))


@pytest.mark.parametrize("sync", ["full", "normal"])
def test_scores_equal_batch_scoring(bundle, records, batch_probs, tmp_path, sync):
    svc, c = make(bundle, tmp_path, sync=sync)
    got = {}
    for rec in records[:60]:
        r = c.post("/v1/score", json=rec)
        assert r.status_code == 200, r.text
        b = r.json()
        assert set(b) >= {"transaction_id", "entity_id", "probability", "decision", "reasons", "model_sha256",
                          "latency_ms"}
        assert b["model_sha256"] == bundle.sha256 and b["entity_id"] == rec["card"] and b["latency_ms"] > 0
        assert b["decision"] in ("below_review", "review", "decline")
        got[b["transaction_id"]] = b["probability"]
    r = c.post("/v1/score/batch", json={"transactions": records[60:]})
    assert r.status_code == 200 and r.json()["rejected"] == [] and r.json()["accepted"] == len(records) - 60
    got.update({x["transaction_id"]: x["probability"] for x in r.json()["results"]})
    assert len(got) == len(records) == len(batch_probs)
    diff = max(abs(got[t] - batch_probs[t]) for t in got)
    assert diff < 1e-5, diff
    assert svc.history.count() == len(records)
    first = c.post("/v1/score", json=dict(records[0], tid="fresh-1", card="new-card")).json()
    assert first["reasons"] == [{"code": "first_transaction", "text": "first transaction of this card"}]
    svc.close()


def test_retry_is_not_appended_twice(bundle, records, tmp_path):
    svc, c = make(bundle, tmp_path)
    a = c.post("/v1/score", json=records[0]).json()
    b = c.post("/v1/score", json=records[0]).json()
    assert b["duplicate"] is True and a["duplicate"] is False and b["probability"] == a["probability"]
    assert svc.history.count() == 1
    batch = c.post("/v1/score/batch", json={"transactions": [records[0], records[1], records[1]]}).json()
    assert [x["duplicate"] for x in batch["results"]] == [True, False, True] and batch["accepted"] == 1
    assert svc.history.count() == 2
    r = c.post("/v1/score", json=dict(records[0], amt=999.0))  # same id, other content
    assert r.status_code == 409
    d = r.json()["detail"][0]
    assert d["loc"] == ["body", "tid"] and "already used by a different transaction" in d["msg"]
    svc.close()


def test_malformed_and_out_of_order_name_the_field(bundle, records, tmp_path):
    svc, c = make(bundle, tmp_path)
    r = c.post("/v1/score", json=dict(records[0], amt="abc"))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "amt"]
    assert r.json()["detail"][0]["msg"] == "amount is not a number"
    r = c.post("/v1/score", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["msg"].startswith("not valid JSON")
    r = c.post("/v1/score", json=[records[0]])
    assert r.status_code == 422 and r.json()["detail"][0]["msg"] == "expected a JSON object (one transaction)"
    missing = {k: v for k, v in records[0].items() if k != "m"}
    r = c.post("/v1/score", json=missing)
    assert r.status_code == 422 and "m" in r.json()["detail"][0]["loc"]
    e = records[0]["card"]
    later = [x for x in records if x["card"] == e]
    assert c.post("/v1/score", json=later[3]).status_code == 200
    r = c.post("/v1/score", json=later[1])  # older than the entity's last accepted transaction
    assert r.status_code == 409
    d = r.json()["detail"][0]
    assert d["loc"] == ["body", "ts"] and "earlier than entity" in d["msg"]
    other = next(x for x in records if x["card"] != e)
    assert c.post("/v1/score", json=other).status_code == 200  # another entity's older time is fine
    batch = c.post("/v1/score/batch", json={"transactions": [later[4], dict(later[5], r="x"), later[2]]}).json()
    assert [x["index"] for x in batch["results"]] == [0]
    assert [(x["index"], x["loc"][-1]) for x in batch["rejected"]] == [(1, "r"), (2, "ts")]
    assert batch["rejected"][0]["msg"] == "risk is not a number"
    assert svc.history.count() == 3
    svc.close()


def test_restart_and_lru_rebuild_from_history_give_the_same_scores(bundle, records, batch_probs, tmp_path):
    svc, c = make(bundle, tmp_path)
    for rec in records[:70]:
        assert c.post("/v1/score", json=rec).status_code == 200
    svc.close()
    # restart on the same history, with a cache cap that keeps about one entity
    svc, c = make(bundle, tmp_path, cache_bytes=1)
    got = {}
    for rec in records[70:]:
        b = c.post("/v1/score", json=rec).json()
        got[b["transaction_id"]] = b["probability"]
    assert max(abs(got[t] - batch_probs[t]) for t in got) < 1e-5
    st = svc.cache.stats()
    assert st["entities"] == 1 and st["evictions"] > 10 and st["misses"] > 10
    assert svc.history.count() == len(records)
    svc.close()


def test_warm_start_from_a_file(bundle, records, batch_probs, tmp_path):
    svc, c = make(bundle, tmp_path)
    out = warm_start(svc, write_raw(records[:50], tmp_path / "warm.parquet"), log=lambda m: None)
    assert out["appended"] == 50 and out["rejected"] == 0 and out["cached"] == 4
    again = warm_start(svc, tmp_path / "warm.parquet", log=lambda m: None)
    assert again["appended"] == 0 and again["skipped"] == 50
    misses = svc.cache.misses
    got = {}
    for rec in records[50:]:
        b = c.post("/v1/score", json=rec).json()
        got[b["transaction_id"]] = b["probability"]
    assert svc.cache.misses == misses  # every entity was warm
    assert max(abs(got[t] - batch_probs[t]) for t in got) < 1e-5
    svc.close()


def test_warm_start_onto_history_with_a_cache_below_one_entity(bundle, records, batch_probs, tmp_path):
    """A warm start onto an existing history steps each row through the cache, appending to the
    store only at the end; with a cap below one entity that is right only because the reader
    orders the file by entity, then time: each entity is rebuilt once (from what was there before),
    its rows stepped, then evicted for the next. Scores equal whole-file scoring."""
    svc, c = make(bundle, tmp_path, cache_bytes=1)
    for rec in records[:20]:
        assert c.post("/v1/score", json=rec).status_code == 200
    misses = svc.cache.misses
    out = warm_start(svc, write_raw(records[20:130], tmp_path / "warm.parquet"), log=lambda m: None)
    assert out["appended"] == 110 and out["rejected"] == 0
    assert svc.cache.misses - misses == len({r["card"] for r in records[20:130]})  # one rebuild per entity
    stored = {r["tid"]: svc.history.get(r["tid"])["probability"] for r in records[20:130]}
    assert max(abs(stored[t] - batch_probs[t]) for t in stored) < 1e-5
    got = {}
    for rec in records[130:]:
        b = c.post("/v1/score", json=rec).json()
        got[b["transaction_id"]] = b["probability"]
    assert max(abs(got[t] - batch_probs[t]) for t in got) < 1e-5
    svc.close()


def test_token_required_off_loopback(bundle, records, tmp_path):
    with pytest.raises(TokenError, match="refusing to listen on 0.0.0.0 without a token"):
        resolve_token(None, "0.0.0.0", env={})
    assert resolve_token(None, "127.0.0.1", env={}) is None
    with pytest.raises(TokenError, match="at least 32 characters"):
        resolve_token(None, "0.0.0.0", env={"FRAUDLENS_SERVE_TOKEN": "short"})
    f = tmp_path / "token"
    f.write_text("s3cret-token-0123456789-abcdefghij\n")
    assert resolve_token(f, "10.0.0.5", env={}) == "s3cret-token-0123456789-abcdefghij"
    svc, c = make(bundle, tmp_path, token="s3cret-token-0123456789-abcdefghij")
    assert c.post("/v1/score", json=records[0]).status_code == 401
    assert c.post("/v1/score", json=records[0], headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/metrics").status_code == 401
    assert c.get("/healthz").status_code == 200
    ok = c.post("/v1/score", json=records[0], headers={"Authorization": "Bearer s3cret-token-0123456789-abcdefghij"})
    assert ok.status_code == 200 and svc.history.count() == 1
    svc.close()


def test_shadow_mode_writes_no_cases(bundle, records, tmp_path):
    svc, c = make(bundle, tmp_path, shadow=True)
    bodies = [c.post("/v1/score", json=rec).json() for rec in records[:40]]
    assert all(b["shadow"] for b in bodies) and svc.counts["flagged"] > 0
    assert svc.worker is None and not (tmp_path / "cases.sqlite3").exists()
    assert svc.history.count() == 40  # logged
    svc.close()


def test_flagged_transactions_open_cases_with_explanations(bundle, records, batch_probs, tmp_path):
    review = float(np.median([batch_probs[r["tid"]] for r in records[:40]]))
    with CaseStore(tmp_path / "cases.sqlite3") as store:  # thresholds set on the Queue page apply
        store.set_thresholds(bundle.sha256, review=review, decline=max(review, 0.95), actor="alice")
    svc, c = make(bundle, tmp_path, start_worker=True)
    assert svc.thresholds["review"] == review
    bodies = [c.post("/v1/score", json=rec).json() for rec in records[:40]]
    flagged = [b for b in bodies if b["probability"] >= svc.thresholds["review"]]
    assert flagged and len(flagged) < len(bodies)
    deadline = time.time() + 60
    while time.time() < deadline and svc.worker.explained < len(flagged):
        time.sleep(0.1)
    assert svc.worker.explained == len(flagged) and svc.worker.errors == 0
    with CaseStore(tmp_path / "cases.sqlite3") as store:
        q = store.queue(bundle.sha256, source_id=service_source_id(bundle))
        assert set(q["entity_id"]) == {b["entity_id"] for b in flagged}
        for e in q["entity_id"]:
            top = max((b for b in bodies if b["entity_id"] == e), key=lambda b: b["probability"])
            row = q[q["entity_id"] == e].iloc[0]
            assert row["max_transaction_id"] == top["transaction_id"]
            assert row["max_probability"] == pytest.approx(top["probability"])
    r = c.get(f"/v1/explanations/{flagged[-1]['transaction_id']}")
    assert r.status_code == 200
    ex = r.json()
    assert ex["method"] == "occlusion" and ex["case_id"] is not None
    assert ex["explanation"]["query_transaction_id"] == flagged[-1]["transaction_id"]
    assert ex["explanation"]["score_probability"] == pytest.approx(flagged[-1]["probability"], abs=1e-4)
    assert isinstance(ex["reasons"], list)
    not_flagged = next(b for b in bodies if b["probability"] < svc.thresholds["review"])
    assert c.get(f"/v1/explanations/{not_flagged['transaction_id']}").status_code == 404
    svc.close()


def test_explanation_worker_keeps_to_its_cpu_budget(bundle, records, batch_probs, tmp_path, monkeypatch):
    """Each explanation's thread CPU time is followed by a pause of cpu * (1/budget - 1), so the
    worker uses at most ``explain_cpu`` of a core; the backlog counts flagged rows not yet explained."""
    import engine.serve.casework as cw

    review = float(np.median([batch_probs[r["tid"]] for r in records[:40]]))
    with CaseStore(tmp_path / "cases.sqlite3") as store:
        store.set_thresholds(bundle.sha256, review=review, decline=max(review, 0.95), actor="alice")
    svc, c = make(bundle, tmp_path, explain_cpu=0.2)
    bodies = [c.post("/v1/score", json=rec).json() for rec in records[:40]]
    n_flagged = sum(b["probability"] >= review for b in bodies)
    assert n_flagged >= 2
    w = svc.worker
    history, store = cw.HistoryStore(svc.history_path), CaseStore(tmp_path / "cases.sqlite3")
    assert history.flagged_count_after(0) == n_flagged
    spent, waits = [], []

    def busy(bundle, frame, tid):  # a fixed CPU cost per explanation
        t0 = cw.time.thread_time()
        while cw.time.thread_time() - t0 < 0.02:
            pass
        spent.append(cw.time.thread_time() - t0)
        return {"explanation": {}, "reasons": []}

    monkeypatch.setattr(cw, "explain_flagged", busy)
    monkeypatch.setattr(w, "_sleep", lambda s: waits.append(s))
    assert w.step(history, store) and w.backlog == n_flagged
    assert w.explained == n_flagged and len(waits) == n_flagged
    for cpu, pause in zip(spent, waits):
        assert pause >= 4.0 * cpu * 0.95  # 1/0.2 - 1 = 4 (the measured CPU includes put_explanation)
    assert w.paused_s == pytest.approx(sum(waits))
    assert not w.step(history, store) and w.backlog == 0
    assert c.get("/healthz").json()["case_worker"]["backlog"] == 0
    assert "fraudlens_serve_worker_backlog 0.0" in c.get("/metrics").text
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="fraction of one core"):
            cw.CaseWorker(bundle, svc.history_path, None, "occlusion", explain_cpu=bad)
    history.close(), store.close(), svc.close()


def test_healthz_metrics_and_openapi(bundle, records, batch_probs, tmp_path):
    svc, c = make(bundle, tmp_path)
    review = float(np.median([batch_probs[r["tid"]] for r in records[:10]]))
    svc.thresholds = {"review": review, "decline": 1.0, "source": "test"}  # about half of them flagged
    for rec in records[:10]:
        c.post("/v1/score", json=rec)
    c.post("/v1/score", json=records[0])
    c.post("/v1/score", json=dict(records[11], amt=""))
    h = c.get("/healthz").json()
    assert h["status"] == "ok" and h["history_transactions"] == 10 and h["model_sha256"] == bundle.sha256
    assert (h["case_worker"]["explain"], h["case_worker"]["explain_cpu"]) == ("occlusion", 0.25)
    text = c.get("/metrics").text
    lines = dict(ln.rsplit(" ", 1) for ln in text.splitlines() if ln and not ln.startswith("#"))
    assert float(lines['fraudlens_serve_requests_total{route="/v1/score",status="200"}']) == 11
    assert float(lines['fraudlens_serve_requests_total{route="/v1/score",status="422"}']) == 1
    assert float(lines['fraudlens_serve_latency_seconds_count{route="/v1/score"}']) == 12
    assert float(lines["fraudlens_serve_transactions_flagged_total"]) == svc.counts["flagged"] > 0
    assert float(lines["fraudlens_serve_transactions_duplicates_total"]) == 1
    assert float(lines["fraudlens_serve_cache_hits_total"]) == svc.cache.hits > 0
    schema = c.get("/openapi.json").json()
    assert {"/v1/score", "/v1/score/batch", "/healthz", "/metrics"} <= set(schema["paths"])
    props = schema["paths"]["/v1/score"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"card", "ts", "amt", "m", "tid"} <= set(props["properties"]) and "y" not in props["required"]
    svc.close()


def test_history_is_durable_sqlite(bundle, records, tmp_path):
    svc, c = make(bundle, tmp_path)
    c.post("/v1/score", json=records[0])
    mode = svc.history.conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = svc.history.conn.execute("PRAGMA synchronous").fetchone()[0]
    assert (mode, sync) == ("wal", 2)  # 2 = FULL
    svc.close()
    with sqlite3.connect(tmp_path / "history.sqlite3") as con:
        assert con.execute("SELECT transaction_id FROM transactions").fetchall() == [(records[0]["tid"],)]


def test_concurrent_clients_share_commits_and_keep_batch_scores(bundle, records, batch_probs, tmp_path):
    import threading

    svc, _ = make(bundle, tmp_path)
    by_entity: dict[str, list] = {}
    for r in records:
        by_entity.setdefault(r["card"], []).append(r)
    got, errors = {}, []

    def client(recs):
        for r in recs:
            try:
                got[r["tid"]] = svc.score_one(r).body["probability"]
            except Exception as e:  # noqa: BLE001
                errors.append(e)

    threads = [threading.Thread(target=client, args=(v,)) for v in by_entity.values()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(got) == len(records) == svc.history.count()
    assert max(abs(got[t] - batch_probs[t]) for t in got) < 1e-5
    assert svc.committer.rows == len(records) and not svc.inflight
    svc.close()


def test_a_failed_commit_answers_503_and_the_service_refuses_until_restarted(bundle, records, tmp_path):
    svc, c = make(bundle, tmp_path)
    assert c.post("/v1/score", json=records[0]).status_code == 200
    svc.history.conn.execute("CREATE TRIGGER fail BEFORE INSERT ON transactions "
                             "BEGIN SELECT RAISE(ABORT, 'disk full'); END")
    r = c.post("/v1/score", json=records[1])
    assert r.status_code == 503 and "disk full" in r.json()["detail"][0]["msg"]
    r = c.post("/v1/score", json=records[2])
    assert r.status_code == 503 and "restart the service" in r.json()["detail"][0]["msg"]
    assert svc.history.count() == 1 and c.get("/healthz").json()["history_broken"]
    svc.history.conn.execute("DROP TRIGGER fail")
    svc.close()
    svc, c = make(bundle, tmp_path)  # restarted: the unacknowledged transaction is scored afresh
    assert c.post("/v1/score", json=records[1]).json()["duplicate"] is False
    assert svc.history.count() == 2
    svc.close()


def test_cli_refuses_a_public_host_without_a_token(monkeypatch):
    from typer.testing import CliRunner

    from engine.cli import app

    monkeypatch.delenv("FRAUDLENS_SERVE_TOKEN", raising=False)
    r = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0"])
    assert r.exit_code == 2 and "refusing to listen on 0.0.0.0 without a token" in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["serve", "--sync", "sometimes"])
    assert r.exit_code == 2 and "--sync" in r.output


def test_incremental_case_summary_equals_a_whole_history_read(bundle, records, batch_probs, tmp_path):
    """The case worker reads only the rows after its last summary (HistoryStore.entity_summary
    ``since``); merged over several batches the summary equals one read of the whole history,
    ties of the highest probability keep the earliest transaction, and an entity with no new row
    keeps its summary."""
    import engine.serve.casework as cw

    svc, c = make(bundle, tmp_path)
    svc.thresholds = {"review": 0.0, "decline": 1.0, "source": "test"}  # every transaction flagged
    history, store = cw.HistoryStore(svc.history_path), CaseStore(tmp_path / "cases.sqlite3")
    w = svc.worker
    for lo, hi in ((0, 7), (7, 19), (19, 40)):
        for rec in records[lo:hi]:
            assert c.post("/v1/score", json=rec).status_code == 200
        assert w.step(history, store)
    entities = {r["card"] for r in records[:40]}
    assert len(entities) >= 2 and set(w.summaries) == entities
    for e in entities:
        assert w.summaries[e] == history.entity_summary(e)
    q = store.queue(bundle.sha256, source_id=service_source_id(bundle), review_threshold=0.0)
    for e in entities:
        row = q[q["entity_id"] == e].iloc[0]
        full = history.entity_summary(e)
        assert row["n_transactions"] == full["n_transactions"] == sum(r["card"] == e for r in records[:40])
        assert row["max_transaction_id"] == full["max_transaction_id"]
    # a tie of the highest probability: the earlier transaction stays the case's top one
    e = next(iter(entities))
    s = history.entity_summary(e)
    tie = {**s, "max_probability": 2.0, "max_transaction_id": "earlier"}
    again = history.entity_summary(e, since={**tie, "through_seq": 0})
    assert again["max_transaction_id"] == "earlier"
    assert again["n_transactions"] == s["n_transactions"] + s["n_transactions"]  # merged with the given counts
    assert history.entity_summary(e, since=s) is s  # nothing new
    with pytest.raises(KeyError, match="no transaction"):
        history.entity_summary("no-such-card")
    history.close(), store.close()
    svc.close()


def test_score_route_is_answered_by_the_guard_direct_handler(bundle, records, tmp_path, monkeypatch):
    """``POST /v1/score`` is answered by the handler the Guard calls directly (no FastAPI route
    per request), after the Guard's checks; the FastAPI route (OpenAPI) is the same function."""
    from starlette.routing import Route

    svc, c = make(bundle, tmp_path, token="s3cret")
    route = next(r for r in c.app.routes if isinstance(r, Route) and r.path == "/v1/score")

    async def boom(scope, receive, send):
        raise AssertionError("the FastAPI route ran")

    monkeypatch.setattr(route, "app", boom)
    h = {"Authorization": "Bearer s3cret"}
    assert c.post("/v1/score", json=records[0]).status_code == 401  # checks first
    r = c.post("/v1/score", json=records[0], headers=h)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json()["transaction_id"] == records[0]["tid"] and r.json()["latency_ms"] > 0
    bad = c.post("/v1/score", json={"card": "x"}, headers=h)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][0] == "body"
    assert "/v1/score" in c.get("/openapi.json", headers=h).json()["paths"]
    svc.close()


def test_case_worker_runs_in_its_own_process_and_thresholds_refresh(bundle, records, tmp_path):
    """The case worker is a process of its own (its Python work never holds the scoring path's
    interpreter lock); closing the service stops it; the service re-reads thresholds set on the
    Queue page without a restart."""
    import os

    svc, c = make(bundle, tmp_path, start_worker=True, explain="none")
    w = svc.worker
    assert w.pid is not None and w.pid != os.getpid() and w.is_alive()
    assert c.get("/healthz").json()["case_worker"]["pid"] == w.pid
    assert svc.thresholds["source"] != "set by carol"
    with CaseStore(tmp_path / "cases.sqlite3") as store:
        store.set_thresholds(bundle.sha256, review=0.0, decline=1.0, actor="carol")
    assert svc.refresh_thresholds()["review"] == 0.0 and svc.thresholds["source"].startswith("set by carol")
    assert c.post("/v1/score", json=records[0]).json()["decision"] == "review"  # every score >= 0 is flagged
    deadline = time.time() + 60
    while time.time() < deadline and w.cases_written < 1:
        time.sleep(0.05)
    assert w.cases_written >= 1 and w.errors == 0, w.last_error
    svc.close()
    assert not w.is_alive() and w.process.exitcode == 0


def test_case_worker_process_refuses_a_changed_checkpoint(bundle, tmp_path):
    """The worker process reloads the checkpoint from disk and checks its sha256: a file changed
    since the service loaded it is reported (errors, last_error), never used."""
    import dataclasses

    import engine.serve.casework as cw

    w = cw.CaseWorker(dataclasses.replace(bundle, sha256="0" * 64), tmp_path / "h.sqlite3", tmp_path / "c.sqlite3",
                      "none")
    w.start()
    w.process.join(120)
    assert w.errors == 1 and "changed since the service loaded it" in w.last_error and w.failed
    with pytest.raises(ValueError, match="no path"):
        cw.CaseWorker(dataclasses.replace(bundle, path=None), tmp_path / "h.sqlite3", None, "none").start()


def test_a_killed_case_worker_never_blocks_scoring_and_is_restarted(bundle, records, tmp_path):
    """The worker process killed with SIGKILL while idle (waiting for work): the next flagged
    request still answers at once (its wake-up never blocks: no multiprocessing.Event, whose
    set() waits for its waiters under a shared lock), /healthz says "degraded", and the
    supervisor restarts the worker after its back-off."""
    import os
    import signal

    svc, c = make(bundle, tmp_path, explain="none")  # the supervisor is driven by hand below
    svc.thresholds = {"review": 0.0, "decline": 1.0, "source": "test"}  # every transaction flagged
    w = svc.worker
    w.start()
    deadline = time.time() + 120
    while time.time() < deadline and not w.idle:
        time.sleep(0.05)
    assert w.idle and w.is_alive()
    old = w.pid
    os.kill(old, signal.SIGKILL)
    w.process.join(10)
    assert w.failed and c.get("/healthz").json()["status"] == "degraded"
    t0 = time.perf_counter()
    for rec in records[:5]:
        assert c.post("/v1/score", json=rec).status_code == 200
    assert time.perf_counter() - t0 < 5.0  # not stuck on the dead worker's wake-up
    state: dict = {}
    svc.supervisor.tick(100.0, state)  # schedules the restart after the back-off (1 s)
    assert w.pid == old and state["restart_at"] == 101.0
    svc.supervisor.tick(101.0, state)
    assert w.pid != old and w.restarts == 1 and w.is_alive()
    assert state["backoff"] == 2.0  # doubles while it keeps failing
    deadline = time.time() + 120
    while time.time() < deadline and w.cases_written < 1:
        time.sleep(0.05)
    assert w.cases_written >= 1  # the restarted worker picked up the flags appended meanwhile
    h = c.get("/healthz").json()
    assert h["status"] == "ok" and h["case_worker"]["restarts"] == 1
    svc.close()
    assert not w.is_alive() and not w.failed  # a stopped worker is not a failure


def test_thresholds_in_force_closes_the_case_store_it_opens(bundle, tmp_path, monkeypatch):
    """The service re-reads the thresholds every 30 s through thresholds_in_force(db_path=...):
    the case store it opens for that is closed again (it was left open on every call)."""
    from engine.cases.store import CaseStore
    from engine.cases.thresholds import thresholds_in_force

    db = tmp_path / "cases.sqlite3"
    with CaseStore(db) as store:
        store.set_thresholds(bundle.sha256, review=0.3, decline=0.8, actor="carol")
    closed = []
    real = CaseStore.close
    monkeypatch.setattr(CaseStore, "close", lambda self: closed.append(1) or real(self))
    for _ in range(3):
        t = thresholds_in_force(bundle, db_path=db)
        assert t["review"] == 0.3 and t["decline"] == 0.8 and t["source"].startswith("set by carol")
    assert len(closed) == 3
    assert thresholds_in_force(bundle, db_path=tmp_path / "missing.sqlite3")["source"] == "checkpoint default"
    assert not (tmp_path / "missing.sqlite3").exists() and len(closed) == 3  # a missing store is not created


def test_healthz_shows_no_explanation_budget_without_explanations(bundle, tmp_path):
    svc, c = make(bundle, tmp_path, explain="none")
    w = c.get("/healthz").json()["case_worker"]
    assert (w["explain"], w["explain_cpu"]) == ("none", None)
    svc.close()
