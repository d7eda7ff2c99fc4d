"""``fraudlens serve --processes two``: the HTTP front and the scorer in two processes with dynamic
batching (engine/serve/scorer.py). Rows scored together keep their own answers (409 / 500 for
one row only), scores equal whole-file scoring, requests form batches under concurrency, and the
two processes live and die together."""

import asyncio
import os
import signal
import sqlite3
import time

import httpx
import pytest

from engine.serve.record import canonical_row
from engine.serve.service import ScoringService
from serve_helpers import id_spec, write_raw
from test_serve_kill import _free_port, _running, _start


def _rows(records):
    spec = id_spec()
    return [canonical_row(r, spec) for r in records]


def test_score_rows_keeps_each_rows_answer(bundle, records, batch_probs, tmp_path, monkeypatch):
    svc = ScoringService(bundle, tmp_path / "h.sqlite3", case_db=tmp_path / "c.sqlite3", start_worker=False,
                         sync="normal")
    try:
        rows = _rows(records)
        first = svc.score_rows(rows[:20])
        assert [r[0] for r in first] == ["ok"] * 20
        for row, (_, body, _) in zip(rows[:20], first):
            assert body["probability"] == pytest.approx(batch_probs[row["transaction_id"]], abs=1e-5)
        # a duplicate, an out-of-order row and a new one in the same batch: each keeps its own answer
        entity = rows[19]["entity_id"]
        early = next(r for r in rows[:19] if r["entity_id"] == entity)
        late_copy = {**early, "transaction_id": "late-1"}
        res = svc.score_rows([rows[5], late_copy, rows[20]])
        assert res[0][0] == "ok" and res[0][1]["duplicate"] is True
        assert res[1][:2] == ("err", 409) and "earlier than entity" in res[1][2][0]["msg"]
        assert res[2][0] == "ok" and res[2][1]["probability"] == pytest.approx(
            batch_probs[rows[20]["transaction_id"]], abs=1e-5)
        # an unexpected failure of one row: the batch is redone row by row, only that row fails
        bad = rows[23]["transaction_id"]
        enc = svc.cache.scorer.bundle.encoder
        real = enc.transform_row  # used by the batched and the one-row step

        def failing(row):
            if row["transaction_id"] == bad:
                raise RuntimeError("injected")
            return real(row)

        monkeypatch.setattr(enc, "transform_row", failing)
        res = svc.score_rows(rows[21:26])
        assert [r[0] for r in res] == ["ok", "ok", "err", "ok", "ok"]
        assert res[2][1] == 500 and res[2][2][0]["type"] == "internal_error"
        monkeypatch.setattr(enc, "transform_row", real)
        res = svc.score_rows(rows[23:40])  # the failed row again, then the rest
        assert [r[0] for r in res[:1]] == ["ok"] and res[0][1]["duplicate"] is False
        got = {}
        for row, r in zip(rows[21:40], svc.score_rows(rows[21:40])):
            assert r[0] == "ok" and r[1]["duplicate"] is True
            got[row["transaction_id"]] = r[1]["probability"]
        assert max(abs(got[t] - batch_probs[t]) for t in got) < 1e-5
        with sqlite3.connect(tmp_path / "h.sqlite3") as con:
            ids = [x[0] for x in con.execute("SELECT transaction_id FROM transactions")]
        assert len(ids) == len(set(ids)) == 40 and "late-1" not in ids
        assert svc.metrics_state()["counts"]["rejected"] == 1  # the 409 (the 500 is not a refusal)
    finally:
        svc.close()


def _start_two(ck, tmp, port, *extra):
    return _start(ck, tmp, port, "--processes", "two", "--sync", "normal", *extra)


def test_two_processes_batch_concurrent_requests_and_score_as_whole_file(ck, records, batch_probs, tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = _start_two(ck, tmp_path, port)
    try:
        by_entity: dict[str, list] = {}
        for r in records:
            by_entity.setdefault(r["card"], []).append(r)

        async def lane(client, recs):  # one entity per lane: its transactions in order
            out = {}
            for rec in recs:
                r = await client.post("/v1/score", json=rec)
                assert r.status_code == 200, r.text
                out[rec["tid"]] = r.json()["probability"]
            return out

        async def main():
            async with httpx.AsyncClient(base_url=url, timeout=30) as c:
                parts = await asyncio.gather(*(lane(c, recs) for recs in by_entity.values()))
                bad = await c.post("/v1/score", json={**records[0], "tid": "x-1", "amt": "twelve"})
                return {k: v for p in parts for k, v in p.items()}, bad

        got, bad = asyncio.run(main())
        assert len(got) == len(records)
        assert max(abs(got[t] - batch_probs[t]) for t in got) < 1e-5
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "amt"]
        h = httpx.get(f"{url}/healthz").json()
        procs = h["processes"]
        assert procs["front"] == server.pid and procs["scorer"] != server.pid and _running(procs["scorer"])
        assert h["history_transactions"] == len(records)
        assert procs["dynamic_batch_rows"] == len(records)  # the 422 never reached the scorer
        assert procs["dynamic_batches"] < len(records)  # 4 concurrent lanes: some rows were scored together
        metrics = httpx.get(f"{url}/metrics").text
        assert f"fraudlens_serve_dynamic_batch_rows_total {float(len(records))}" in metrics
        assert "fraudlens_serve_transactions_rejected_total 1.0" in metrics
        assert f"fraudlens_serve_transactions_scored_total {float(len(records))}" in metrics

        # the scorer dies: requests are answered 503 and the front exits (status 3) for a restart
        os.kill(procs["scorer"], signal.SIGKILL)
        r = httpx.post(f"{url}/v1/score", json={**records[0], "tid": "after-kill"}, timeout=10)
        assert r.status_code == 503 and r.json()["detail"][0]["type"] == "scorer_unavailable"
        assert server.wait(30) == 3
    finally:
        if server.poll() is None:
            server.kill()
    # a kill -9 of the front takes the scorer with it; a restart takes over the same history store
    server = _start_two(ck, tmp_path, port)
    try:
        scorer = httpx.get(f"{url}/healthz").json()["processes"]["scorer"]
        os.kill(server.pid, signal.SIGKILL)
        server.wait(10)
        deadline = time.time() + 10
        while time.time() < deadline and _running(scorer):
            time.sleep(0.05)
        assert not _running(scorer)
    finally:
        if server.poll() is None:
            server.kill()
    server = _start(ck, tmp_path, port)  # the default (--processes auto) on the same store
    try:
        r = httpx.post(f"{url}/v1/score", json=records[3], timeout=10)
        assert r.status_code == 200 and r.json()["duplicate"] is True
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


def test_processes_option_is_checked(ck, tmp_path):
    from typer.testing import CliRunner

    from engine.cli import app

    res = CliRunner().invoke(app, ["serve", "--model", str(ck), "--history", str(tmp_path / "h.sqlite3"),
                                   "--processes", "three"])
    assert res.exit_code == 2 and "--processes: expected auto, one or two, got 'three'" in res.output


def test_warm_start_runs_in_the_scorer(ck, records, batch_probs, tmp_path):
    warm = write_raw(records[:30], tmp_path / "warm.parquet")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = _start_two(ck, tmp_path, port, "--warm", str(warm))
    try:
        assert httpx.get(f"{url}/healthz").json()["history_transactions"] == 30
        got = {}
        for rec in records[30:50]:
            r = httpx.post(f"{url}/v1/score", json=rec, timeout=10)
            assert r.status_code == 200 and r.json()["duplicate"] is False
            got[rec["tid"]] = r.json()["probability"]
        assert max(abs(got[t] - batch_probs[t]) for t in got) < 1e-5
        r = httpx.post(f"{url}/v1/score", json=records[3], timeout=10)  # warmed: answered from the store
        assert r.json()["duplicate"] is True
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    import subprocess
    import sys

    from test_serve_kill import ROOT

    res = subprocess.run([sys.executable, "-m", "engine.cli", "serve", "--model", str(ck), "--port", str(port),
                          "--history", str(tmp_path / "h2.sqlite3"), "--processes", "two", "--warm", str(bad)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--warm" in res.stdout and "bad.parquet" in res.stdout


def test_scorer_refuses_a_checkpoint_that_is_not_the_fronts(ck, bundle, tmp_path):
    from engine.serve.scorer import ScorerStartError, _open_service

    opts = {"model": str(ck), "sha256": "0" * 64, "history": str(tmp_path / "h.sqlite3"), "cache_bytes": 2**20,
            "shadow": True, "case_db": None, "explain": "none", "sync": "normal", "explain_cpu": 0.25}
    with pytest.raises(ScorerStartError, match="changed on disk while starting"):
        _open_service(opts)
    svc = _open_service({**opts, "sha256": bundle.sha256})  # the same checkpoint: opened
    try:
        assert svc.bundle.sha256 == bundle.sha256 and svc.shadow
    finally:
        svc.close()


@pytest.mark.parametrize("path", ["score_rows", "score_batch"])
def test_a_cache_smaller_than_one_request_never_loses_its_rows(bundle, records, batch_probs, tmp_path, path,
                                                              monkeypatch):
    """With a cache cap below one entity, the entities of one request evict each other while it is
    scored: an entity dropped mid-request must not be scored as new (its state gone) or rebuilt from a
    history that lacks the request's rows staged but not yet committed. Scores equal whole-file scoring."""
    svc = ScoringService(bundle, tmp_path / "h.sqlite3", case_db=tmp_path / "c.sqlite3", start_worker=False,
                         sync="normal", cache_bytes=1)

    def alone(*a):
        raise AssertionError("the batch failed and fell back to scoring its rows one by one")

    monkeypatch.setattr("engine.serve.waves._alone", alone)
    try:
        got = {}
        for lo in range(0, len(records), 24):  # 24 interleaved rows of the 4 entities per request
            chunk = records[lo:lo + 24]
            if path == "score_rows":
                res = svc.score_rows(_rows(chunk))
                assert [r[0] for r in res] == ["ok"] * len(chunk)
                bodies = [r[1] for r in res]
            else:
                out = svc.score_batch(chunk)
                assert out["rejected"] == [] and out["accepted"] == len(chunk)
                bodies = out["results"]
            got.update({b["transaction_id"]: b["probability"] for b in bodies})
        assert len(got) == len(records)
        assert max(abs(got[t] - batch_probs[t]) for t in got) < 1e-5
        st = svc.cache.stats()
        assert st["evictions"] > 10 and st["entities"] == 1  # the cap holds again after each request
    finally:
        svc.close()


def test_the_channel_carries_json_and_never_unpickles(records):
    import math
    import pickle

    import pandas as pd

    from engine.serve import scorer as sc

    rows = _rows(records[:3])
    rows[0]["nan_field"] = float("nan")
    frame = sc._pack(("score", sc._wire_rows(rows)))
    assert sc.FRAME.unpack(frame[:4])[0] == len(frame) - 4
    kind, back = sc._unpack(frame[4:])
    back = sc._unwire_rows(back)
    assert kind == "score" and [r["transaction_id"] for r in back] == [r["transaction_id"] for r in rows]
    for a, b in zip(rows, back):
        assert isinstance(b["timestamp"], pd.Timestamp) and b["timestamp"] == a["timestamp"]
        assert b.keys() == a.keys()
    assert math.isnan(back[0]["nan_field"])
    # a value JSON cannot hold is a loud bug, never silently pickled; pickle bytes are not read
    with pytest.raises(TypeError, match="JSON values only, got Timestamp"):
        sc._pack(("score", rows))
    with pytest.raises(ValueError):
        sc._unpack(pickle.dumps(("ok", [1])))
