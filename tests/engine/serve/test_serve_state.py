"""The scoring service's state against its history store: a failed request leaves no uncommitted
row in the entity cache, warm-start ids and content checks, one server per history file, the
cache's byte accounting with long strings, private folders."""

import os
import socket
import stat
import tracemalloc
from pathlib import Path

import pytest

from engine.data.io import read_transactions
from engine.model.checkpoint import load_checkpoint
from engine.serve.history import GroupCommitter, HistoryLocked, RecordsRefused, row_json
from engine.serve.service import ScoringService, ServiceError
from engine.serve.state import EntityCache
from engine.serve.warm import warm_start
from serve_helpers import write_raw
from tiny_models import tiny_checkpoint, tiny_spec


def make(bundle, tmp_path, name="history.sqlite3", **kw):
    kw.setdefault("case_db", tmp_path / "cases.sqlite3")
    kw.setdefault("start_worker", False)
    return ScoringService(bundle, tmp_path / name, **kw)


def max_diff(svc, recs, batch_probs) -> float:
    """Score ``recs`` as one batch; the largest difference to whole-file scoring."""
    out = svc.score_batch(recs)
    assert out["rejected"] == [] and out["accepted"] == len(recs)
    return max(abs(r["probability"] - batch_probs[r["transaction_id"]]) for r in out["results"])


# ------------------------------------------------------------------ finding 2: failed requests
def test_a_batch_failing_part_way_leaves_no_uncommitted_row_in_the_cache(bundle, records, batch_probs, tmp_path,
                                                                         monkeypatch):
    svc = make(bundle, tmp_path)
    first, second = records[0], next(r for r in records if r["card"] != records[0]["card"])
    real_get = svc.history.get

    def get(tid):
        if tid == second["tid"]:
            raise UnicodeEncodeError("utf-8", "bad\ud800", 3, 4, "surrogates not allowed")
        return real_get(tid)

    monkeypatch.setattr(svc.history, "get", get)
    with pytest.raises(UnicodeEncodeError):  # not a ServiceError: the API answers 500
        svc.score_batch([first, second])
    assert svc.history.count() == 0 and not svc.inflight
    assert first["card"] not in svc.cache.sizes  # its uncommitted row was evicted with it
    monkeypatch.setattr(svc.history, "get", real_get)
    # the first item's entity scores like a fresh entity: as whole-file scoring of the committed rows
    assert max_diff(svc, records, batch_probs) < 1e-5
    svc.close()


def test_score_one_failing_after_the_cache_step_evicts_the_entity(bundle, records, batch_probs, tmp_path,
                                                                  monkeypatch):
    svc = make(bundle, tmp_path)
    for r in records[:5]:
        svc.score_one(r)
    e = records[5]["card"]
    real = svc.committer.submit
    monkeypatch.setattr(svc.committer, "submit", lambda recs: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        svc.score_one(records[5])
    with pytest.raises(RuntimeError, match="boom"):
        svc.score_batch(records[5:8])
    assert e not in svc.cache.sizes and not svc.inflight and svc.history.count() == 5
    monkeypatch.setattr(svc.committer, "submit", real)
    got = {r["tid"]: svc.score_one(r).body["probability"] for r in records[5:]}
    assert max(abs(p - batch_probs[t]) for t, p in got.items()) < 1e-5
    svc.close()


def test_records_the_store_cannot_hold_fail_only_their_request(bundle, records, tmp_path):
    """One group commit holding a record SQLite cannot bind (a lone surrogate) commits the other
    requests' records, refuses that one and stays usable; nothing is acknowledged uncommitted."""
    c = GroupCommitter(tmp_path / "h.sqlite3")

    def rec(tid):
        return (tid, "c0", 1, "{}", 0.0, 0.5, "below_review", 0, "sha", "2026-01-01")

    good, bad, later = c.submit([rec("a")]), c.submit([rec("b\ud800")]), c.submit([rec("c")])
    c.wait(good)
    with pytest.raises(RecordsRefused, match="history store refused the records: UnicodeEncodeError"):
        c.wait(bad)
    c.wait(later)
    assert c.broken is None and c.store.count() == 2 and c.store.get("c") is not None
    c.stop()


def test_a_refused_commit_answers_500_and_evicts_the_entity(bundle, records, batch_probs, tmp_path, monkeypatch):
    svc = make(bundle, tmp_path)
    svc.score_one(records[0])
    real = svc.committer.store.append

    def append(recs):
        if any(r[0] == records[1]["tid"] for r in recs):
            raise ValueError("cannot bind")
        real(recs)

    monkeypatch.setattr(svc.committer.store, "append", append)
    with pytest.raises(ServiceError) as ei:
        svc.score_one(records[1])
    assert ei.value.status == 500 and "refused the records: ValueError: cannot bind" in ei.value.detail[0]["msg"]
    assert records[1]["card"] not in svc.cache.sizes and not svc.inflight and svc.committer.broken is None
    monkeypatch.setattr(svc.committer.store, "append", real)
    got = {r["tid"]: svc.score_one(r).body["probability"] for r in records[1:]}
    assert max(abs(p - batch_probs[t]) for t, p in got.items()) < 1e-5
    svc.close()


# ------------------------------------------------------------------ finding 3: warm start
@pytest.fixture(scope="module")
def noid_bundle(records, tmp_path_factory):
    """A checkpoint whose spec has no transaction id column (ids from row numbers)."""
    tmp = tmp_path_factory.mktemp("noid-ck")
    frame = read_transactions(write_raw(records, tmp / "fit.parquet"), tiny_spec()).frame
    return load_checkpoint(tiny_checkpoint(frame, tiny_spec(), tmp / "model", {"name": "tiny-noid"}))


def test_warm_ids_do_not_collide_across_files_without_an_id_column(noid_bundle, records, tmp_path):
    svc = make(noid_bundle, tmp_path)
    strip = [{k: v for k, v in r.items() if k != "tid"} for r in records]
    a, b = write_raw(strip[:40], tmp_path / "a.parquet"), write_raw(strip[40:80], tmp_path / "b.parquet")
    out_a = warm_start(svc, a, log=lambda m: None)
    out_b = warm_start(svc, b, log=lambda m: None)
    assert (out_a["appended"], out_b["appended"], out_b["skipped"], out_b["rejected"]) == (40, 40, 0, 0)
    assert svc.history.count() == 80
    ids = [r[0] for r in svc.history.conn.execute("SELECT transaction_id FROM transactions ORDER BY seq")]
    assert len(set(ids)) == 80 and all(i.startswith("sha256:") and len(i) == 23 for i in ids)
    # the same file again, or a file that grew: its earlier rows are the same transactions
    again = warm_start(svc, b, log=lambda m: None)
    assert (again["appended"], again["skipped"], again["rejected"]) == (0, 40, 0)
    grown = warm_start(svc, write_raw(strip[:90], tmp_path / "grown.parquet"), log=lambda m: None)
    assert (grown["appended"], grown["skipped"], grown["rejected"]) == (10, 80, 0)
    # a corrected label is the same transaction with other content: rejected with its reason, not appended
    def flip(r):
        return dict(r, y="0" if r["y"] == "1" else "1")

    # rows 1 and 3 as stored, row 2 with its label flipped, row 4 = row 3 with its label flipped
    fixed = [strip[0], flip(strip[1]), strip[2], flip(strip[2])]
    out = warm_start(svc, write_raw(fixed, tmp_path / "fixed.parquet"), log=lambda m: None)
    assert (out["appended"], out["skipped"], out["conflicts"], out["rejected"]) == (0, 2, 1, 2)
    reasons = out["rejected_rows"].set_index("row_number")["reason"].to_dict()
    assert reasons[2] == ("the same transaction (entity, time, amount, fields) is in the history store with other "
                          "label or passthrough values")
    assert reasons[4].startswith("the same transaction as row 3 (entity, time, amount and fields equal")
    assert svc.history.count() == 90
    # a live transaction "r5" of another customer is not taken for a warm row
    live = svc.score_one(dict(strip[95], transaction_id="r5", card="live-card"))
    assert live.body["duplicate"] is False and svc.history.count() == 91
    svc.close()


def test_warm_rows_already_there_must_have_the_same_content(bundle, records, batch_probs, tmp_path):
    svc = make(bundle, tmp_path)
    out = warm_start(svc, write_raw(records[:30], tmp_path / "a.parquet"), log=lambda m: None)
    assert out["appended"] == 30
    changed = [dict(r) for r in records[:40]]
    changed[3]["amt"] = 99999.0  # same transaction id, other content
    first = next(r for r in records[:30] if r["card"] == records[35]["card"])
    changed.append(dict(first, tid="late-1"))  # older than its entity's history in the store
    logged = []
    out = warm_start(svc, write_raw(changed, tmp_path / "b.parquet"), log=logged.append)
    assert (out["rows_read"], out["appended"], out["skipped"], out["conflicts"], out["rejected"]) == (41, 10, 29, 1, 2)
    rej = out["rejected_rows"].set_index("row_number")
    assert rej.loc[4, "column"] == "tid" and rej.loc[4, "value"] == records[3]["tid"]
    assert rej.loc[4, "reason"] == "transaction id already in the history store with different content (another transaction)"
    assert rej.loc[41, "column"] == "ts" and "older than entity" in rej.loc[41, "reason"]
    assert any("rejected row 4, column 'tid': transaction id already in the history store" in m for m in logged)
    stored = svc.history.get(records[3]["tid"])
    assert stored["row_json"] != row_json({**stored, "amount": 99999.0}) and '"amount":99999.0' not in stored["row_json"]
    assert svc.history.count() == 40
    # the appended rows were scored on the entities' history: as whole-file scoring
    assert max_diff(svc, records[40:], batch_probs) < 1e-5
    svc.close()


def test_warm_after_live_scoring_finds_the_same_rows(bundle, records, tmp_path):
    svc = make(bundle, tmp_path)
    for r in records[:20]:
        svc.score_one(r)
    out = warm_start(svc, write_raw(records[:20], tmp_path / "a.parquet"), log=lambda m: None)
    assert (out["skipped"], out["conflicts"], out["appended"]) == (20, 0, 0)
    svc.close()


# ------------------------------------------------------------------ finding 7: one server per file
def test_one_server_per_history_file(bundle, tmp_path):
    svc = make(bundle, tmp_path)
    path = tmp_path / "history.sqlite3"
    with pytest.raises(HistoryLocked) as ei:
        make(bundle, tmp_path)
    msg = str(ei.value)
    assert f"the history store {path} is in use: another fraudlens serve (pid {os.getpid()}) holds its lock" in msg
    assert f"{path}.lock" in msg
    other = make(bundle, tmp_path, name="other.sqlite3")  # another file: fine
    other.close()
    svc.close()
    again = make(bundle, tmp_path)  # released at close
    again.close()


def test_the_cli_refuses_a_second_server(bundle, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from engine.cli import app

    svc = make(bundle, tmp_path)
    with socket.socket() as probe:  # a free port: the lock, not the port, must stop the second server
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    r = CliRunner().invoke(app, ["serve", "--model", str(bundle.path), "--history", str(tmp_path / "history.sqlite3"),
                                 "--cases", str(tmp_path / "cases.sqlite3"), "--port", str(port)])
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and "is in use: another fraudlens serve" in out and "holds its lock" in out, out
    svc.close()


@pytest.mark.parametrize("processes", ["one", "two"])
def test_a_taken_port_fails_before_anything_is_created(bundle, tmp_path, processes):
    from typer.testing import CliRunner

    from engine.cli import app

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = CliRunner().invoke(app, ["serve", "--model", str(bundle.path), "--history", str(tmp_path / "h.sqlite3"),
                                     "--cases", str(tmp_path / "cases.sqlite3"), "--port", str(port),
                                     "--processes", processes])
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}: Address already in use" in out, out
    assert "fraudlens serve: model" not in out  # no banner
    assert list(tmp_path.iterdir()) == []  # no history store, no case store


# ------------------------------------------------------------------ finding 8: byte accounting
def test_cache_bytes_count_long_ids_and_merchants(bundle, records, tmp_path):
    """With 4,000-character entity ids and merchants the accounted bytes stay within 2x of the
    memory the cache holds (tracemalloc)."""
    svc = make(bundle, tmp_path)
    cache = EntityCache(bundle, svc.history, 1 << 40)
    base = [r for r in records if r["card"] == records[0]["card"]][:30]
    from engine.serve.record import canonical_row

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for e in range(40):
        for i, r in enumerate(base):
            row = canonical_row(dict(r, tid=f"{e}-{i}", card=f"{e:04d}" + "E" * 3996, m=f"{e}.{i}." + "M" * 3990),
                                bundle.spec)
            cache.ensure(row["entity_id"])
            cache.score(row["entity_id"], row)
            del row
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(cache.sizes) == 40
    assert held / 2 <= cache.bytes <= 2 * held, (cache.bytes, held)
    assert cache.bytes > 40 * 30 * 4000  # the merchants' text is counted
    svc.close()


# ------------------------------------------------------------------ finding 10: private folders
@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_folders_the_service_creates_are_private(bundle, tmp_path, monkeypatch, umask):
    from engine.serve.commands import default_history_path

    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "data"))
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    old = os.umask(umask)
    try:
        svc = ScoringService(bundle, default_history_path(bundle), case_db=tmp_path / "c.sqlite3", start_worker=False)
        svc2 = ScoringService(bundle, shared / "new" / "h.sqlite3", case_db=tmp_path / "c.sqlite3", start_worker=False)
    finally:
        os.umask(old)
    for d in (tmp_path / "data", tmp_path / "data" / "serve", shared / "new"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755  # an existing folder keeps its mode
    assert stat.S_IMODE(default_history_path(bundle).stat().st_mode) == 0o600
    assert stat.S_IMODE(Path(str(default_history_path(bundle)) + ".lock").stat().st_mode) == 0o600
    svc.close()
    svc2.close()


def test_without_fcntl_the_service_says_there_is_no_lock(bundle, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "fcntl", None)  # as on Windows: import fcntl fails
    with pytest.warns(RuntimeWarning, match="no lock on the history store .*: this platform has no fcntl"):
        svc = make(bundle, tmp_path)
    assert svc.history_lock.supported is False
    svc.close()


def test_cheap_amount_reason_needs_five_earlier_purchases_and_states_true_numbers():
    """The response's ``amount`` reason follows the case reasons' rule: a median over fewer than
    MEDIAN_MIN_PURCHASES (5) purchases is no habit; over 5 the ratio and median are recomputed.
    Refunds (amount <= 0) are not purchases."""
    import statistics

    from engine.serve.state import cheap_reasons
    from engine.trust.reasons import MEDIAN_MIN_PURCHASES

    assert MEDIAN_MIN_PURCHASES == 5
    t = 1_700_000_000 * 10**9
    prev = [(t - (10 - i) * 86_400 * 10**9, a, "m1") for i, a in enumerate([20.0, 30.0, -25.0, 40.0, 50.0])]
    row = {"amount": 400.0, "ts_ns": t, "merchant": "m1", "errors": ""}
    assert not [r for r in cheap_reasons(row, prev, "merchant", "card") if r["code"] == "amount"]  # 4 purchases
    prev.append((t - 86_400 * 10**9, 60.0, "m1"))
    got = [r for r in cheap_reasons(row, prev, "merchant", "card") if r["code"] == "amount"]
    med = statistics.median([20.0, 30.0, 40.0, 50.0, 60.0])
    assert got == [{"code": "amount", "text": f"amount 400.00 is {400 / med:.1f}x the card's median {med:,.2f} over "
                                              "its last 5 purchases"}]


def test_a_flag_always_carries_a_reason(bundle, records, tmp_path):
    from engine.serve.service import NO_SIMPLE_FACT

    svc = make(bundle, tmp_path)
    svc.thresholds = {"review": 0.0, "decline": 0.0, "source": "test"}  # every transaction is declined
    out = svc.score_batch(records[:40])
    assert out["accepted"] == 40
    assert all(r["decision"] == "decline" and r["reasons"] for r in out["results"])
    plain = [r for r in out["results"] if r["reasons"] == [NO_SIMPLE_FACT]]
    assert plain  # some rows have no cheap fact: they get the model-pattern reason, not []
    assert all(NO_SIMPLE_FACT not in r["reasons"] or len(r["reasons"]) == 1 for r in out["results"])
    svc.thresholds = {"review": 1.01, "decline": 1.01, "source": "test"}  # nothing flagged: no filler reason
    out = svc.score_batch(records[40:80])
    assert all(NO_SIMPLE_FACT not in r["reasons"] for r in out["results"])
    svc.close()


# ------------------------------------------------------------------ WAL checkpoints off the commit path
def _rec(i):
    return (f"t{i}", "c0", i, "{}", 0.0, 0.5, "below_review", 0, "sha", "2026-01-01")


def test_the_commit_path_never_checkpoints_and_the_checkpointer_thread_wakes_after_its_commits(tmp_path, monkeypatch):
    """SQLite's automatic checkpoint (4-5 ms inside the commit that crosses 1,000 WAL pages, the
    slowest 1 % of the service's batches) is off on the committer's connection; the checkpointer
    thread runs after ``every`` commits."""
    from engine.serve.history import Checkpointer

    monkeypatch.setattr(Checkpointer, "every", 5)
    monkeypatch.setattr(Checkpointer, "interval_s", 60.0)  # only the commit count wakes it here
    c = GroupCommitter(tmp_path / "h.sqlite3", sync="normal")
    assert c.store.conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    for i in range(4):
        c.wait(c.submit([_rec(i)]))
    assert c.checkpointer.runs == 0
    c.wait(c.submit([_rec(4)]))  # the 5th commit wakes the thread
    import time

    deadline = time.monotonic() + 10
    while c.checkpointer.runs == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert c.checkpointer.runs >= 1 and c.checkpointer.failures == 0
    c.stop()
    assert not (tmp_path / "h.sqlite3-wal").exists()


@pytest.mark.parametrize("catch_up", [True, False])
def test_after_a_background_checkpoint_the_next_commit_restarts_the_wal(tmp_path, monkeypatch, catch_up):
    """Commits arrive while the background checkpoint copies, so it never ends with the WAL fully
    copied and SQLite never restarts it; the committer copies the few frames left before its next
    commit, which then writes from the WAL's start. Without that catch-up the WAL only grows
    (the control case, ``catch_up=False``)."""
    from engine.serve.history import Checkpointer

    monkeypatch.setattr(Checkpointer, "every", 10**9)
    monkeypatch.setattr(Checkpointer, "interval_s", 3600.0)  # the thread never runs: checkpoints by hand
    path = tmp_path / "h.sqlite3"
    wal = tmp_path / "h.sqlite3-wal"  # its size: the furthest frame ever written (a restarted WAL is rewritten from its start)
    c = GroupCommitter(path, sync="normal")
    for i in range(40):
        c.wait(c.submit([_rec(i)]))
    import sqlite3

    reader = sqlite3.connect(path, isolation_level=None)  # a read snapshot at 40 commits: the checkpoint below
    reader.execute("BEGIN")                               # copies no further, as one whose copy commits overtook
    reader.execute("SELECT count(*) FROM transactions").fetchone()
    for i in range(40, 60):
        c.wait(c.submit([_rec(i)]))
    busy, frames, copied = c.checkpointer.checkpoint()
    assert copied < frames and c.checkpointer.catch_up  # frames left behind
    reader.execute("ROLLBACK")
    reader.close()
    grown = wal.stat().st_size
    assert grown >= 60 * 4096  # every commit adds frames: nothing checkpointed them on the commit path
    if not catch_up:
        c.checkpointer.catch_up = False
    for i in range(60, 100):
        c.wait(c.submit([_rec(i)]))
    after = wal.stat().st_size
    if catch_up:
        assert after == grown and not c.checkpointer.catch_up, (grown, after)
    else:
        assert after > 1.5 * grown, (grown, after)
    assert c.store.count() == 100
    c.stop()


def test_the_checkpointer_thread_survives_any_error(tmp_path, monkeypatch):
    """Nothing else checkpoints the WAL (the commit path's automatic checkpoint is off), so an error of
    any kind is counted and logged and the thread keeps running."""
    from engine.serve.history import Checkpointer

    monkeypatch.setattr(Checkpointer, "interval_s", 0.01)
    calls = []

    def boom(self):
        calls.append(1)
        raise RuntimeError("unexpected")

    monkeypatch.setattr(Checkpointer, "checkpoint", boom)
    c = GroupCommitter(tmp_path / "h.sqlite3", sync="normal")
    import time

    deadline = time.monotonic() + 10
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(calls) >= 3 and c.checkpointer.failures >= 3 and c.checkpointer.thread.is_alive()
    c.stop()
