"""Stored explanations: lossless round trip, keyed by model / source / transaction / parameters,
a corrupt entry is a miss, precompute skips stored ones and stops at its budget."""

import os
import stat
import threading

import numpy as np
import pytest

from engine.cases.explain_cache import (ExplanationCache, cache_key, decode_explanations,
                                        encode_explanations, precompute)
from engine.explain.base import Explanation


def expl(tid="q", v=(0.1, float("nan"), 2.0)) -> Explanation:
    ids = [f"t{i}" for i in range(len(v) - 1)] + [tid]
    return Explanation(method="shap", entity_id="e", transaction_ids=ids, query_transaction_id=tid,
                       values=np.array(v), units="logit", signed=True, baseline="b", params={"seed": 1},
                       score_logit=1.5, field_values=np.arange(6.0).reshape(3, 2), field_names=["a", "b"],
                       extras={"player_mask": np.array([True, True, False]), "per_head": np.ones((2, 3), np.float32)})


def test_round_trip_is_lossless():
    got = decode_explanations(encode_explanations({"shap": expl()}))["shap"]
    e = expl()
    np.testing.assert_array_equal(got.values, e.values)  # NaN kept
    assert got.extras["player_mask"].dtype == bool and got.extras["per_head"].dtype == np.float32
    np.testing.assert_array_equal(got.field_values, e.field_values)
    assert got.params == {"seed": 1} and got.score_logit == 1.5
    with pytest.raises(ValueError, match="not a stored explanation"):
        decode_explanations('{"shap": {"method": 1}}')


def test_keyed_by_everything_and_private(tmp_path):
    c = ExplanationCache(tmp_path / "x" / "explanations.sqlite")
    assert stat.S_IMODE(os.stat(c.path).st_mode) == 0o600
    c.put("m1", "s1", "q", {"steps": 50}, {"shap": expl()})
    assert c.get("m1", "s1", "q", {"steps": 50})["shap"].score_logit == 1.5
    for other in (("m2", "s1", "q", {"steps": 50}), ("m1", "s2", "q", {"steps": 50}),
                  ("m1", "s1", "r", {"steps": 50}), ("m1", "s1", "q", {"steps": 51})):
        assert c.get(*other) is None
    assert len({cache_key("m", "s", "q", {"a": 1}), cache_key("m", "s", "q", {"a": 2})}) == 2
    # a tampered entry is a miss, never an exception
    with c._conn() as con:
        con.execute("UPDATE explanations SET payload = 'garbage'")
    assert c.get("m1", "s1", "q", {"steps": 50}) is None


def test_json_payloads_of_another_kind_are_keyed_apart_and_a_bad_entry_is_a_miss(tmp_path):
    from engine.cases.explain_cache import FIELDS_KIND

    c = ExplanationCache(tmp_path / "explanations.sqlite")
    obj = {"history_effect": {"alone": 0.25, "gap": float("nan")}, "values": np.array([1.5, -2.0], np.float32)}
    c.put("m1", "s1", "q", {"max_rows": None}, {"shap": expl()})
    c.put_json("m1", "s1", "q", {"max_rows": None}, FIELDS_KIND, obj, 0.5)
    got = c.get_json("m1", "s1", "q", {"max_rows": None}, FIELDS_KIND)
    assert got["history_effect"]["alone"] == 0.25 and np.isnan(got["history_effect"]["gap"])
    assert got["values"].dtype == np.float32 and got["values"].tolist() == [1.5, -2.0]
    # the explanations and the fields view do not read each other's rows; other kinds and keys miss
    assert c.get("m1", "s1", "q", {"max_rows": None})["shap"].score_logit == 1.5
    assert c.get_json("m1", "s1", "q", {"max_rows": None}, "other") is None
    assert c.get_json("m2", "s1", "q", {"max_rows": None}, FIELDS_KIND) is None
    assert c.count() == 2
    with pytest.raises(ValueError, match="kind"):
        c.get_json("m1", "s1", "q", {}, "")
    key = cache_key("m1", "s1", "q", {"max_rows": None, "__payload__": FIELDS_KIND})
    for bad in ("garbage", "[1, 2]"):  # not JSON, not an object: a miss, never an exception
        with c._conn() as con:
            con.execute("UPDATE explanations SET payload = ? WHERE key = ?", (bad, key))
        assert c.get_json("m1", "s1", "q", {"max_rows": None}, FIELDS_KIND) is None


def test_precompute_skips_stored_and_respects_stop(tmp_path):
    c = ExplanationCache(tmp_path / "e.sqlite")
    calls = []

    def explain(tid):
        calls.append(tid)
        if tid == "bad":
            raise KeyError(tid)
        return {"shap": expl(tid)}

    kw = dict(model_sha="m", source_id="s", params={})
    assert precompute(explain, ["a", "bad", "b"], c, **kw) == {"computed": 2, "cached": 0, "failed": 1, "left": 0}
    assert precompute(explain, ["a", "b", "c"], c, **kw) == {"computed": 1, "cached": 2, "failed": 0, "left": 0}
    assert calls == ["a", "bad", "b", "c"]
    stop = threading.Event()
    stop.set()
    assert precompute(explain, ["d", "e"], c, stop=stop, **kw)["left"] == 2
    assert c.count("m") == 3


def test_precompute_hands_each_stored_result_to_after(tmp_path):
    """``after(tid, explanations)`` sees every transaction once, with what was stored (computed now
    or read); its ValueError counts the transaction as failed and the others go on."""
    c = ExplanationCache(tmp_path / "e.sqlite")
    kw = dict(model_sha="m", source_id="s", params={})
    precompute(lambda t: {"shap": expl(t)}, ["a"], c, **kw)  # "a" stored before
    seen = []

    def after(tid, out):
        if tid == "c":
            raise ValueError("cannot build")
        seen.append((tid, out["shap"].query_transaction_id))

    counts = precompute(lambda t: {"shap": expl(t)}, ["a", "b", "c", "d"], c, after=after, **kw)
    assert counts == {"computed": 2, "cached": 1, "failed": 1, "left": 0}
    assert seen == [("a", "a"), ("b", "b"), ("d", "d")]


def test_the_same_transaction_is_computed_once_while_another_thread_computes_it(tmp_path):
    """The page asking for the case the background precompute is on waits for that result
    (``get_or_compute``): one computation, counted, not two."""
    c = ExplanationCache(tmp_path / "e.sqlite")
    calls, started, release = [], threading.Event(), threading.Event()

    def slow():
        calls.append("slow")
        started.set()
        assert release.wait(30)
        return {"shap": expl("q")}

    def must_not_run():
        calls.append("second")
        return {"shap": expl("q", v=(9.0, 9.0))}

    got = {}
    bg = threading.Thread(target=lambda: got.setdefault("bg", c.get_or_compute("m", "s", "q", {}, slow)))
    bg.start()
    assert started.wait(30)
    assert c.in_flight() == 1
    page = threading.Thread(target=lambda: got.setdefault("page", c.get_or_compute("m", "s", "q", {}, must_not_run)))
    page.start()
    page.join(0.3)
    assert page.is_alive()  # waiting for the background result, not computing
    release.set()
    bg.join(30)
    page.join(30)
    assert calls == ["slow"]
    assert got["bg"][1] == "computed" and got["page"][1] == "waited"
    np.testing.assert_array_equal(got["page"][0]["shap"].values, expl("q").values)
    assert c.in_flight() == 0
    # stored now: read, never computed
    assert c.get_or_compute("m", "s", "q", {}, must_not_run)[1] == "stored" and calls == ["slow"]
    # the other computation failed: the waiter computes itself (nothing is stored by a failure)
    started.clear()

    def fails():
        started.set()
        assert release.wait(30)
        raise RuntimeError("boom")

    out = {}

    def owner():
        try:
            c.get_or_compute("m", "s", "r", {}, fails)
        except RuntimeError as e:
            out["err"] = str(e)

    t = threading.Thread(target=owner)
    release.clear()
    t.start()
    assert started.wait(30)
    w = threading.Thread(target=lambda: out.setdefault("w", c.get_or_compute("m", "s", "r", {}, lambda: {"shap": expl("r")})))
    w.start()
    release.set()
    t.join(30)
    w.join(30)
    assert out["err"] == "boom" and out["w"][1] == "computed"
    assert c.get("m", "s", "r", {}) is not None


def test_precompute_counts_a_transaction_computed_by_another_thread_as_cached(tmp_path):
    c = ExplanationCache(tmp_path / "e.sqlite")
    c.put("m", "s", "a", {}, {"shap": expl("a")})
    calls = []
    counts = precompute(lambda t: calls.append(t) or {"shap": expl(t)}, ["a", "b"], c, model_sha="m",
                        source_id="s", params={})
    assert calls == ["b"] and counts == {"computed": 1, "cached": 1, "failed": 0, "left": 0}
