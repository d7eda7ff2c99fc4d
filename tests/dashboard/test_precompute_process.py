"""The background precompute's own process (engine/cases/precompute_job.py): it explains the job's
transactions into the explanation cache in order, reports each in its status file, and refuses
to explain data or a model other than the server's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.cases import precompute_job as pj
from engine.cases import view as cv
from engine.cases.explain_cache import ExplanationCache
from engine.data.io import file_sha256
from tiny_models import demo_slice, tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("pjob")
    data = demo_slice(d / "tx.csv", 600)
    spec = cv.demo_spec_name()
    src = cv.load_source(data, spec)
    tiny_checkpoint(src.frame, src.spec, d / "model", {"name": "tiny-pjob"})
    bundle = cv.load_model(d / "model")
    scores = cv.score_source(bundle, src.frame)
    ids = [str(t) for t in scores.sort_values("probability", ascending=False)["transaction_id"].head(3)]
    return {"data": data, "spec": spec, "model": d / "model", "bundle": bundle, "src": src, "ids": ids}


def _job(world, tmp_path, **over):
    job = {"data": str(world["data"]), "spec": world["spec"], "spec_sha256": None, "max_rows": None,
           "data_sha256": world["src"].file_sha256, "model": str(world["model"]),
           "model_sha256": world["bundle"].sha256, "cache": str(tmp_path / "e.sqlite"), "source_id": "src1",
           "params": {"max_rows": None}, "ids": world["ids"], "budget_s": 120.0,
           "status": str(tmp_path / "status.json")}
    job.update(over)
    return job


def _without_timings(d):
    """``d`` as JSON text without its ``elapsed_s`` entries (wall-clock times differ run to run)."""
    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k != "elapsed_s"}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x
    return json.dumps(strip(d), sort_keys=True, default=str)


def test_the_job_explains_in_order_and_reports_each(world, tmp_path):
    job = _job(world, tmp_path)
    seen_current = []
    real = cv.explain_query

    def spy(bundle, frame, tid, **kw):  # while a transaction is explained, the status names it
        seen_current.append((tid, pj.read_status(job["status"])["current"]))
        return real(bundle, frame, tid, **kw)

    import pytest as _pytest

    with _pytest.MonkeyPatch.context() as mp:
        mp.setattr(cv, "explain_query", spy)
        out = pj.run_job(job)
    assert out["state"] == "done", out
    assert seen_current == [(t, t) for t in world["ids"]]
    assert out["current"] is None and out["n_done"] == 3
    assert pj.read_done(job["status"]) == (world["ids"], sum(len(t) + 1 for t in world["ids"]))
    assert out["counts"] == {"computed": 3, "cached": 0, "failed": 0, "left": 0}
    assert pj.read_status(job["status"]) == out and out["pid"] == os.getpid()
    cache = ExplanationCache(job["cache"])
    for tid in world["ids"]:
        got = cache.get(world["bundle"].sha256, "src1", tid, {"max_rows": None})
        ref = cv.explain_query(world["bundle"], world["src"].frame, tid)
        assert set(got) == set(ref)
        np.testing.assert_allclose(got["occlusion"].values, ref["occlusion"].values, atol=1e-6)
    # the Case page's fields view (history effect, validated field values) is stored beside them,
    # equal to computing it now, under its own key (not readable as explanations, nor they as it)
    from engine.cases.explain_cache import FIELDS_KIND
    from engine.cases.fields_view import query_fields

    for tid in world["ids"]:
        stored = cache.get_json(world["bundle"].sha256, "src1", tid, {"max_rows": None}, FIELDS_KIND)
        ref = query_fields(world["bundle"], world["src"].frame, tid, currency=world["src"].currency)
        assert _without_timings(stored) == _without_timings(ref)
        assert stored["field_attribution"]["field_names"] and "sentence" in stored["history_effect"]
    assert cache.get_json(world["bundle"].sha256, "src1", world["ids"][0], {"max_rows": None}, "other") is None
    assert cache.count() == 6
    # a second run reads what is stored: nothing computed again, every id still reported
    again = pj.run_job(job)
    assert again["counts"]["cached"] == 3 and again["counts"]["computed"] == 0
    assert pj.read_done(job["status"])[0] == world["ids"]


@pytest.mark.parametrize("field,value,needle", [("data_sha256", "0" * 64, "file changed"),
                                                ("model_sha256", "f" * 64, "checkpoint differs")])
def test_other_data_or_model_than_the_servers_is_refused(world, tmp_path, field, value, needle):
    job = _job(world, tmp_path, **{field: value})
    out = pj.run_job(job)
    assert out["state"] == "error" and needle in out["error"] and pj.read_done(job["status"])[0] == []
    assert ExplanationCache(job["cache"]).count() == 0


def test_a_failed_transaction_clears_current_and_the_others_go_on(world, tmp_path):
    job = _job(world, tmp_path, ids=[world["ids"][0], "no-such-id", world["ids"][1]])
    out = pj.run_job(job)
    assert out["state"] == "done" and out["current"] is None
    assert out["counts"] == {"computed": 2, "cached": 0, "failed": 1, "left": 0}
    assert pj.read_done(job["status"])[0] == [world["ids"][0], world["ids"][1]]


def test_an_edited_spec_file_is_refused(world, tmp_path):
    from engine.data.spec import SPEC_DIR

    spec = tmp_path / "spec.toml"
    spec.write_bytes((SPEC_DIR / f"{world['spec']}.toml").read_bytes())
    job = _job(world, tmp_path, spec=str(spec), spec_sha256=file_sha256(spec))
    spec.write_text(spec.read_text() + "\n# edited\n")
    out = pj.run_job(job)
    assert out["state"] == "error" and "spec changed" in out["error"]


def test_status_and_done_files_are_read_defensively(tmp_path):
    st = tmp_path / "s.json"
    st.write_text("[" * 100_000)  # deep nesting
    assert pj.read_status(st) is None
    st.write_text(json.dumps({"pad": "x" * (pj.MAX_STATUS_BYTES + 10)}))
    assert pj.read_status(st) is None
    pj.done_path(st).write_text("a\nb\npartial")  # a line being written is left for the next read
    assert pj.read_done(st) == (["a", "b"], 4)
    assert pj.read_done(st, 4) == ([], 4)
    # the atomic writer never follows a planted symlink and leaves no temporary file behind
    target = tmp_path / "victim"
    target.write_text("keep")
    pj.write_json_atomic(st, {"ok": 1})
    assert pj.read_status(st) == {"ok": 1} and target.read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json", "s.json.done", "victim"]
    with pytest.raises(ValueError):
        pj.write_json_atomic(st, {"bad": float("nan")})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json", "s.json.done", "victim"]


def test_the_lead_store_keeps_the_first_entries_and_refuses_when_full():
    from dashboard import precompute as pc

    s = pc.LeadStore(max_entries=2)
    assert s.put("a", 1) and s.put("b", 2) and s.full()
    assert not s.put("c", 3) and s.get("c") is None and s.get("a") == 1  # nothing evicted
    assert s.put("a", 9) and s.get("a") == 9 and len(s) == 2  # a known id may be replaced


def test_a_job_without_a_field_is_refused(world, tmp_path):
    job = _job(world, tmp_path)
    del job["ids"]
    with pytest.raises(KeyError, match="ids"):
        pj.run_job(job)


def test_runs_as_its_own_low_priority_process(world, tmp_path):
    job = _job(world, tmp_path, ids=world["ids"][:1])
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    env = {**os.environ, pj.ENV_NICENESS: "4"}
    r = subprocess.run([sys.executable, "-m", "engine.cases.precompute_job", str(path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not path.exists()  # the job file (every flagged id) is deleted once read
    st = pj.read_status(job["status"])
    assert pj.read_done(job["status"])[0] == world["ids"][:1] and st["pid"] != os.getpid()
    assert st["niceness"] == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 4)  # the override, added to ours
    bad = subprocess.run([sys.executable, "-m", "engine.cases.precompute_job"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "usage" in bad.stderr
    path.write_text("{not json")
    unreadable = subprocess.run([sys.executable, "-m", "engine.cases.precompute_job", str(path)], cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
    assert unreadable.returncode == 2 and "JSONDecodeError" in unreadable.stderr
    assert oct((tmp_path / "status.json").stat().st_mode & 0o777) == "0o600"


class _Running:
    """A stand-in for the precompute's Popen: running until ``stop()``."""

    def __init__(self):
        self.code = None

    def poll(self):
        return self.code

    def stop(self):
        self.code = 0


def test_a_page_waits_for_the_transaction_the_process_explains_now(world, tmp_path, monkeypatch):
    """dashboard/precompute.py: the page asking for the transaction the precompute process is on reads
    that result (no second computation); for any other transaction it does not wait."""
    import threading
    import time

    from dashboard import precompute as pc

    cache = ExplanationCache(tmp_path / "e.sqlite")
    status = tmp_path / "status.json"
    tid, other = world["ids"][0], world["ids"][1]
    pj.write_json_atomic(status, {"state": "running", "done": [], "current": tid})
    job = {"process": _Running(), "status": status, "model_sha": "m", "source_id": "s"}
    monkeypatch.setattr(pc, "JOBS", [job])
    ref = cv.explain_query(world["bundle"], world["src"].frame, tid)

    def finish():
        time.sleep(0.4)
        cache.put("m", "s", tid, {}, ref)
        pj.write_json_atomic(status, {"state": "running", "done": [tid], "current": other})

    t0 = time.monotonic()
    threading.Thread(target=finish).start()
    got = pc.wait_for_precompute(cache, "m", "s", tid, {}, wait_s=30)
    assert got is not None and time.monotonic() - t0 >= 0.35
    np.testing.assert_allclose(got["occlusion"].values, ref["occlusion"].values)
    t0 = time.monotonic()
    assert pc.wait_for_precompute(cache, "m", "s", world["ids"][2], {}, wait_s=30) is None
    assert time.monotonic() - t0 < 0.3  # not the one being explained: no wait
    # another model's job is not waited for
    pj.write_json_atomic(status, {"state": "running", "done": [], "current": world["ids"][2]})
    t0 = time.monotonic()
    assert pc.wait_for_precompute(cache, "other-model", "s", world["ids"][2], {}, wait_s=30) is None
    assert time.monotonic() - t0 < 0.3
    # the wait is bounded: a job that never moves on gives up after wait_s
    t0 = time.monotonic()
    assert pc.wait_for_precompute(cache, "m", "s", world["ids"][2], {}, wait_s=0.5) is None
    assert 0.45 <= time.monotonic() - t0 < 5


def test_niceness_defaults_to_15_and_reads_its_override(monkeypatch):
    monkeypatch.delenv(pj.ENV_NICENESS, raising=False)
    assert pj.niceness() == pj.NICENESS == 15
    for raw, want in (("3", 3), ("abc", 15), ("99", 19), ("-5", 0)):
        monkeypatch.setenv(pj.ENV_NICENESS, raw)
        assert pj.niceness() == want, raw


def test_the_process_stops_when_the_server_goes_away(world, tmp_path):
    """A server killed with SIGKILL leaves no precompute running: the process sees its parent change
    and stops after the transaction in hand (here: a long job of every transaction)."""
    import signal
    import time

    job = _job(world, tmp_path, ids=[str(t) for t in world["src"].frame["transaction_id"]], budget_s=600.0)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    parent = subprocess.Popen(  # stands for the server: starts the process, prints its pid, then idles
        [sys.executable, "-c", "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-m', "
         "'engine.cases.precompute_job', sys.argv[1]]); print(p.pid, flush=True); time.sleep(600)", str(path)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    t0 = time.monotonic()
    while (pj.read_status(job["status"]) or {}).get("n_done", 0) < 1 and time.monotonic() - t0 < 120:
        time.sleep(0.2)
    assert (pj.read_status(job["status"]) or {}).get("n_done", 0) >= 1, "the process never got going"
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(30)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        try:  # gone, or a zombie nobody reaped yet (state Z): it has exited either way
            with open(f"/proc/{child}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.2)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the precompute process kept running after its server was killed")
    done = pj.read_status(job["status"])
    assert done["state"] == "done" and done["counts"]["left"] > 0  # stopped early, cleanly
