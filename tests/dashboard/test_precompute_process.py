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
    job = {"data": str(world["data"]), "spec": world["spec"], "max_rows": None,
           "data_sha256": world["src"].file_sha256, "model": str(world["model"]),
           "model_sha256": world["bundle"].sha256, "cache": str(tmp_path / "e.sqlite"), "source_id": "src1",
           "params": {"max_rows": None}, "ids": world["ids"], "budget_s": 120.0,
           "status": str(tmp_path / "status.json")}
    job.update(over)
    return job


def test_the_job_explains_in_order_and_reports_each(world, tmp_path):
    job = _job(world, tmp_path)
    out = pj.run_job(job)
    assert out["state"] == "done", out
    assert out["done"] == world["ids"] and out["counts"] == {"computed": 3, "cached": 0, "failed": 0, "left": 0}
    assert pj.read_status(job["status"]) == out and out["pid"] == os.getpid()
    cache = ExplanationCache(job["cache"])
    for tid in world["ids"]:
        got = cache.get(world["bundle"].sha256, "src1", tid, {"max_rows": None})
        ref = cv.explain_query(world["bundle"], world["src"].frame, tid)
        assert set(got) == set(ref)
        np.testing.assert_allclose(got["occlusion"].values, ref["occlusion"].values, atol=1e-6)
    # a second run reads what is stored: nothing computed again, every id still reported
    again = pj.run_job(job)
    assert again["counts"]["cached"] == 3 and again["counts"]["computed"] == 0 and again["done"] == world["ids"]


@pytest.mark.parametrize("field,value,needle", [("data_sha256", "0" * 64, "file changed"),
                                                ("model_sha256", "f" * 64, "checkpoint differs")])
def test_other_data_or_model_than_the_servers_is_refused(world, tmp_path, field, value, needle):
    job = _job(world, tmp_path, **{field: value})
    out = pj.run_job(job)
    assert out["state"] == "error" and needle in out["error"] and out["done"] == []
    assert ExplanationCache(job["cache"]).count() == 0


def test_a_job_without_a_field_is_refused(world, tmp_path):
    job = _job(world, tmp_path)
    del job["ids"]
    with pytest.raises(KeyError, match="ids"):
        pj.run_job(job)


def test_runs_as_its_own_low_priority_process(world, tmp_path):
    job = _job(world, tmp_path, ids=world["ids"][:1])
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    r = subprocess.run([sys.executable, "-m", "engine.cases.precompute_job", str(path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    st = pj.read_status(job["status"])
    assert st["done"] == world["ids"][:1] and st["pid"] != os.getpid()
    assert st["niceness"] >= min(19, os.getpriority(os.PRIO_PROCESS, 0) + pj.NICENESS)
    bad = subprocess.run([sys.executable, "-m", "engine.cases.precompute_job"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "usage" in bad.stderr
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
