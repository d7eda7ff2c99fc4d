"""Calibration map, ECE / reliability, operating point and bootstrap, drift reference and PSI:
against hand-computed values; bad maps and references refused by the checkpoint loader."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
from sklearn.isotonic import IsotonicRegression

from engine.model import calibration as cal
from engine.model import drift
from engine.model import operating_point as opp
from engine.model.checkpoint import META, WEIGHTS, CheckpointError, checkpoint_sha256, load_checkpoint
from engine.model.scoring import ScoreRun, score_frame, write_scores
from tiny_models import tiny_checkpoint, tiny_frame, tiny_spec


def _synthetic(n=4000, seed=0, a=2.0, b=-3.0):
    """Logits whose true fraud probability is sigmoid(a * logit + b) (Platt's model)."""
    rng = np.random.default_rng(seed)
    lg = rng.normal(0, 1.5, n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(a * lg + b)))).astype(int)
    ents = np.array([f"e{i % 400}" for i in range(n)])
    return lg, y, ents


# ------------------------------------------------------------------------------- ECE and bins
def test_ece_and_reliability_by_hand():
    y = np.array([0, 0, 1, 1])
    p = np.array([0.1, 0.2, 0.7, 0.9])
    # bins of width 0.1: |0.1 - 0| + |0.2 - 0| + |0.7 - 1| + |0.9 - 1| over 4 rows
    assert cal.expected_calibration_error(y, p) == pytest.approx((0.1 + 0.2 + 0.3 + 0.1) / 4)
    rows = cal.reliability_table(y, p)
    assert [r["n"] for r in rows] == [0, 1, 1, 0, 0, 0, 0, 1, 0, 1]
    assert rows[7]["fraud_rate"] == 1.0 and rows[7]["mean_probability"] == pytest.approx(0.7)
    assert rows[0]["fraud_rate"] is None  # empty bin
    # p = 1.0 falls in the last (closed) bin; two rows in one bin are averaged
    assert cal.expected_calibration_error([1, 0], [1.0, 0.95]) == pytest.approx(abs(0.975 - 0.5))
    s = cal.calibration_summary(y, p)
    assert s["sum_probability"] == pytest.approx(1.9) and s["sum_over_frauds"] == pytest.approx(0.95)
    assert s["brier"] == pytest.approx((0.01 + 0.04 + 0.09 + 0.01) / 4)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        cal.reliability_table([0], [1.2])


# ---------------------------------------------------------------------------- fitting, applying
def test_isotonic_map_is_sklearns_centred_and_platt_recovers_its_parameters():
    lg, y, ents = _synthetic()
    iso = cal.fit_calibration(lg, y, ents, method="isotonic")
    ref = IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(lg, y)
    # centred: one breakpoint per PAV block, at the block's mean logit, with the block's rate
    fitted = ref.predict(lg)
    rates = np.unique(fitted)
    assert iso["x"] and np.allclose(iso["x"], [lg[fitted == r].mean() for r in rates])
    # the first block holds no fraud: its rate 0 becomes the Jeffreys estimate 0.5 / (n + 1)
    n_first = int((fitted == rates[0]).sum())
    assert rates[0] == 0.0 and n_first > 50
    assert iso["y"][0] == pytest.approx(0.5 / (n_first + 1)) and iso["y"][0] > 0
    # the last block is all fraud: 1 - 0.5 / (n + 1)
    n_last = int((fitted == rates[-1]).sum())
    assert rates[-1] == 1.0 and iso["y"][-1] == pytest.approx(1 - 0.5 / (n_last + 1)) and iso["y"][-1] < 1
    rates = np.concatenate([[iso["y"][0]], rates[1:-1], [iso["y"][-1]]])
    assert iso["variant"] == "centred" and np.allclose(iso["y"], rates)
    # at each block's mean logit the map gives the block's rate; strictly increasing in between
    assert np.allclose(cal.apply_calibration(iso, iso["x"]), rates)
    inner = np.linspace(iso["x"][0], iso["x"][-1], 301)[1:-1]
    assert (np.diff(cal.apply_calibration(iso, inner)) > 0).all()
    probe = np.linspace(-6, 6, 301)
    pl = cal.fit_calibration(lg, y, ents, method="platt")
    assert pl["a"] == pytest.approx(2.0, abs=0.25) and pl["b"] == pytest.approx(-3.0, abs=0.3)
    assert cal.apply_calibration(pl, [0.0])[0] == pytest.approx(1 / (1 + math.exp(-pl["b"])))
    # both are monotone: ranking kept
    for m in (iso, pl):
        assert (np.diff(cal.apply_calibration(m, probe)) >= 0).all()
    # calibration brings the expected frauds to the observed count (in-sample)
    for m in (iso, pl):
        assert cal.apply_calibration(m, lg).sum() == pytest.approx(y.sum(), rel=0.05)
    assert cal.apply_calibration(None, [0.0])[0] == 0.5  # no map: the score


def test_isotonic_end_blocks_never_give_probability_zero_or_one():
    """A run of legitimate transactions at the lowest logits (and of frauds at the highest) is a
    sample limit: the map gives (k + 1/2) / (n + 1) there, kept below half the next block's rate."""
    lg = np.arange(400, dtype=float)
    y = np.zeros(400)
    y[200:220:2] = 1  # 10 frauds among logits 200..219
    y[380:] = 1  # the top 20 all fraud
    iso = cal.fit_calibration(lg, y, np.arange(400), method="isotonic")
    assert iso["y"][0] == pytest.approx(0.5 / 201)  # 200 legitimate transactions, none fraud
    assert iso["y"][-1] == pytest.approx(1 - 0.5 / 21)  # 20 frauds, all fraud
    p = cal.apply_calibration(iso, [-1e6, 0.0, 1e6])
    assert 0 < p[0] == p[1] < 0.01 and 0.97 < p[2] < 1
    # a small first block next to a small rate: at most half of it (the map stays increasing)
    lg2, y2 = np.arange(1100, dtype=float), np.zeros(1100)
    y2[100] = 1  # logits 0..99 no fraud, then one fraud in 1,000: rate ~0.001 < 0.5 / 101
    iso2 = cal.fit_calibration(lg2, y2, np.arange(1100), method="isotonic")
    assert iso2["y"][0] == pytest.approx(iso2["y"][1] / 2) and iso2["y"][1] == pytest.approx(1 / 1000)
    cal.check_calibration(iso2)


def test_ranking_by_calibrated_probability_keeps_the_logits_ranking():
    """The step (plain isotonic) map ties whole blocks, so average precision from its
    probabilities is below that of the logits; the centred map keeps the logits' ranking inside
    its range, and its calibration is no worse out of sample."""
    from sklearn.metrics import average_precision_score

    lg, y, ents = _synthetic(n=6000, seed=3)
    hold_lg, hold_y, _ = _synthetic(n=6000, seed=4)
    iso = cal.fit_calibration(lg, y, ents, method="isotonic")
    step = IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(lg, y)
    inside = (hold_lg > iso["x"][0]) & (hold_lg < iso["x"][-1])
    p_c = cal.apply_calibration(iso, hold_lg)
    assert len(np.unique(p_c[inside])) == len(np.unique(hold_lg[inside]))  # no ties inside
    assert len(np.unique(step.predict(hold_lg[inside]))) < 0.05 * inside.sum()  # the step map ties
    ap_logit = average_precision_score(hold_y[inside], hold_lg[inside])
    assert average_precision_score(hold_y[inside], p_c[inside]) == pytest.approx(ap_logit, abs=1e-12)
    assert average_precision_score(hold_y[inside], step.predict(hold_lg[inside])) < ap_logit - 1e-3
    brier_c = np.mean((p_c - hold_y) ** 2)
    brier_step = np.mean((step.predict(hold_lg) - hold_y) ** 2)
    assert brier_c <= brier_step * 1.01
    # a map stored before the centred variant (sklearn's step breakpoints) is still applied as stored
    old = {"method": "isotonic", "x": step.X_thresholds_.tolist(), "y": step.y_thresholds_.tolist()}
    cal.check_calibration(old)
    assert np.allclose(cal.apply_calibration(old, hold_lg), step.predict(hold_lg))


def test_auto_rule_platt_with_few_frauds_else_lower_cv_brier():
    lg, y, ents = _synthetic(n=600, b=-5.5)
    assert y.sum() < cal.MIN_ISOTONIC_FRAUDS
    few = cal.fit_calibration(lg, y, ents)
    assert few["method"] == "platt" and "< 30" in few["choice"]["rule"]
    lg, y, ents = _synthetic(n=6000)
    auto = cal.fit_calibration(lg, y, ents)
    b = auto["choice"]["cv_brier"]
    assert auto["method"] == ("isotonic" if b["isotonic"] < b["platt"] else "platt")
    # data from Platt's own model: Platt wins the cross-validation
    assert auto["method"] == "platt"
    # a step function Platt cannot follow: isotonic wins
    rng = np.random.default_rng(1)
    x = rng.normal(0, 2, 6000)
    y2 = (rng.random(6000) < np.where(x > 1, 0.6, 0.02)).astype(int)
    assert cal.fit_calibration(x, y2, ents)["method"] == "isotonic"
    with pytest.raises(ValueError, match="one class"):
        cal.fit_calibration(lg, np.zeros_like(y), ents)


@pytest.mark.parametrize("bad, msg", [
    ({"method": "isotonic", "x": [0.0, 1.0], "y": [0.6, 0.4]}, "non-decreasing"),
    ({"method": "isotonic", "x": [0.0, 1.0], "y": [0.2, 1.5]}, "in \\[0, 1\\]"),
    ({"method": "isotonic", "x": [1.0, 1.0], "y": [0.2, 0.3]}, "strictly increasing"),
    ({"method": "isotonic", "x": [0.0, 1.0, 2.0], "y": [0.2, 0.3]}, "differ in length"),
    ({"method": "isotonic", "x": [0.0], "y": [0.2]}, "list of 2"),
    ({"method": "isotonic", "x": [0.0, "1"], "y": [0.2, 0.3]}, "x\\[1\\]"),
    ({"method": "isotonic", "x": list(range(cal.MAX_BREAKPOINTS + 1)), "y": [0.0] * (cal.MAX_BREAKPOINTS + 1)},
     "list of 2"),
    ({"method": "platt", "a": -1.0, "b": 0.0}, "monotone"),
    ({"method": "platt", "a": 1.0, "b": 1e9}, "\\|b\\|"),
    ({"method": "platt", "a": True, "b": 0.0}, "a:"),
    ({"method": "beta", "a": 1.0}, "method"),
])
def test_bad_maps_are_refused(bad, msg):
    with pytest.raises(ValueError, match=msg):
        cal.check_calibration(bad)


# --------------------------------------------------------------------------- checkpoint round trip
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("calck")
    frame, spec = tiny_frame(n_entities=6, n=60), tiny_spec()
    lg, y, ents = _synthetic(n=800)
    meta = {"name": "tiny-cal", "thresholds": {"review": 0.3, "decline": 0.6},
            cal.CALIBRATION_KEY: cal.fit_calibration(lg, y, ents, method="isotonic"),
            drift.DRIFT_KEY: drift.drift_reference(frame, spec)}
    tiny_checkpoint(frame, spec, d / "cal", meta)
    tiny_checkpoint(frame, spec, d / "raw", {"name": "tiny-raw"})
    return d, frame


def _edited(src, out, edit):
    shutil.copytree(src, out)
    m = json.loads((out / META).read_text())
    edit(m)
    m["sha256"] = checkpoint_sha256((out / WEIGHTS).read_bytes(), m)  # an attacker can rehash
    (out / META).write_text(json.dumps(m))
    return out


def test_calibrated_checkpoint_scores_probabilities_and_an_uncalibrated_one_scores(tiny, tmp_path):
    d, frame = tiny
    b = load_checkpoint(d / "cal")
    assert b.calibrated
    s = score_frame(b, frame)
    assert np.allclose(s["score"], 1 / (1 + np.exp(-s["logit"].astype(float))))
    assert np.allclose(s["probability"], cal.apply_calibration(b.meta["calibration"], s["logit"]))
    assert not np.allclose(s["probability"], s["score"])
    raw = load_checkpoint(d / "raw")
    assert not raw.calibrated and cal.probability_word(raw.meta) == "score"
    sr = score_frame(raw, frame)
    assert np.array_equal(sr["probability"], sr["score"])
    # written files: "probability" only for the calibrated model
    for bundle, scores, want in ((b, s, True), (raw, sr, False)):
        run = ScoreRun(scores=scores, rejected=pd.DataFrame(columns=["row_number", "column", "value", "reason"]),
                       rows_read=len(scores), seconds=0.0, calibrated=bundle.calibrated)
        out = write_scores(run, tmp_path / f"{want}.parquet")
        cols = set(pd.read_parquet(out).columns)
        assert {"logit", "score"} <= cols and ("probability" in cols) == want


@pytest.mark.parametrize("edit, msg", [
    (lambda m: m["calibration"].update(y=list(reversed(m["calibration"]["y"]))), "calibration: y: .*non-decreasing"),
    (lambda m: m["calibration"].update(y=[2.0] * len(m["calibration"]["y"])), "calibration: y: probabilities"),
    (lambda m: m.update(calibration={"method": "platt", "a": 0.0, "b": 0.0}), "calibration: a:"),
    (lambda m: m["drift_reference"]["fields"]["risk"].update(edges=[3.0, 1.0]), "drift_reference: fields.risk.edges"),
    (lambda m: m["drift_reference"]["fields"]["mcc"].update(other=0.5), "drift_reference: fields.mcc: shares sum"),
])
def test_a_checkpoint_with_a_bad_map_or_reference_does_not_load(tiny, tmp_path, edit, msg):
    d, _ = tiny
    p = _edited(d / "cal", tmp_path / "bad", edit)
    with pytest.raises(CheckpointError, match=msg):
        load_checkpoint(p)
    assert str(p / META) in str(pytest.raises(CheckpointError, load_checkpoint, p).value)


# --------------------------------------------------------------------------- operating point
def test_thresholds_against_a_precision_or_an_alert_target_by_hand():
    p = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2])
    y = np.array([1, 1, 0, 1, 0, 0, 1, 0])
    # precision at >= t: 0.9: 1, 0.8: 1, 0.7: 2/3, 0.6: 3/4, 0.5: 3/5, 0.4: 1/2, 0.3: 4/7, 0.2: 1/2
    r = opp.choose_operating_thresholds(y, p, days=2.0, target_precision=0.55)
    assert r["review"] == 0.3 and r["met"] and r["validation"]["precision"] == pytest.approx(4 / 7)
    assert r["validation"]["recall"] == 1.0 and r["validation"]["alerts_per_day"] == 3.5
    assert r["decline"] == 0.8  # lowest threshold with precision >= 0.8
    r = opp.choose_operating_thresholds(y, p, days=2.0, alerts_per_day=2.0)  # <= 4 alerts in 2 days
    assert r["review"] == 0.6 and r["validation"]["alerts"] == 4 and r["target"]["kind"] == "alerts_per_day"
    r = opp.choose_operating_thresholds(y, p, days=2.0, alerts_per_day=0.1)
    assert not r["met"] and "no validation threshold" in r["warning"]
    r = opp.choose_operating_thresholds(y, p, days=2.0)
    # 0.2 is the lowest with precision >= 0.5 (4/8), but 0.3 catches the same 4 frauds with one alert less
    assert r["target"] == {"kind": "precision", "value": opp.DEFAULT_TARGET_PRECISION} and r["review"] == 0.3
    assert r["validation"]["precision"] == pytest.approx(4 / 7) and r["validation"]["recall"] == 1.0
    with pytest.raises(ValueError, match="one target"):
        opp.choose_operating_thresholds(y, p, 1.0, target_precision=0.5, alerts_per_day=3)
    pts = opp.curve_points(y, p, days=2.0)
    assert pts["threshold"][:3] == [0.9, 0.8, 0.7] and pts["precision"][2] == pytest.approx(2 / 3)
    assert pts["alerts_per_day"][-1] == 4.0


def test_a_model_that_catches_every_fraud_early_gets_the_threshold_of_its_last_fraud():
    """A new user's file: every validation fraud scores above 0.5, 600 legitimate transactions
    score ~1e-10. The lowest threshold with precision >= 0.5 was 1e-10 (precision exactly 0.5,
    twice the alerts); the review and decline thresholds are now the last fraud's probability."""
    rng = np.random.default_rng(0)
    p = np.concatenate([rng.uniform(0.6, 0.99, 100), rng.uniform(1e-10, 3e-10, 600)])
    y = np.r_[np.ones(100, int), np.zeros(600, int)]
    r = opp.choose_operating_thresholds(y, p, days=10.0)
    assert r["review"] == pytest.approx(p[:100].min()) and r["decline"] == r["review"]
    assert r["validation"] == {"precision": 1.0, "recall": 1.0, "alerts": 100, "alerts_per_day": 10.0, "days": 10.0}
    r = opp.choose_operating_thresholds(y, p, days=10.0, alerts_per_day=500)
    assert r["review"] == pytest.approx(p[:100].min()) and r["validation"]["alerts"] == 100


def test_bootstrap_at_threshold_values_and_the_warning_rule():
    rng = np.random.default_rng(0)
    n = 3000
    ents = np.array([f"c{i % 300}" for i in range(n)])
    y = (rng.random(n) < 0.05).astype(int)
    p = np.clip(0.3 * y + rng.random(n) * 0.6, 0, 1)
    r = opp.bootstrap_at_threshold(y, p, ents, 0.5, days=10.0, n_boot=300)
    pred = p >= 0.5
    assert r["precision"] == pytest.approx((pred & (y == 1)).sum() / pred.sum())
    assert r["recall"] == pytest.approx((pred & (y == 1)).sum() / y.sum())
    assert r["alerts_per_day"] == pytest.approx(pred.sum() / 10.0) and r["n_entities"] == 300
    lo, hi = r["interval"]["precision"]
    assert lo < r["precision"] < hi and hi - lo < 0.2
    assert opp.precision_warning(r["precision"], r) is None
    w = opp.precision_warning(hi + 0.05, r)
    assert w and "outside the test precision's 95% interval" in w


# ------------------------------------------------------------------------------- drift and PSI
def test_psi_by_hand_and_readings():
    # (0.25 - 0.5) ln(0.25 / 0.5) + (0.75 - 0.5) ln(0.75 / 0.5)
    assert drift.psi([0.5, 0.5], [0.25, 0.75]) == pytest.approx(0.25 * math.log(2) + 0.25 * math.log(1.5))
    assert drift.psi([0.3, 0.7], [0.3, 0.7]) == 0.0
    # an empty bin is floored, so finite
    assert drift.psi([0.5, 0.5], [1.0, 0.0]) == pytest.approx(
        (1 - 0.5) * math.log(1 / 0.5) + (1e-4 - 0.5) * math.log(1e-4 / 0.5))
    assert [drift.psi_reading(v) for v in (0.05, 0.1, 0.2, 0.25, 3)] == [
        "stable", "moderate shift", "moderate shift", "major shift", "major shift"]


def test_drift_reference_and_psi_table():
    frame, spec = tiny_frame(n_entities=6, n=200), tiny_spec()
    ref = drift.drift_reference(frame, spec)
    drift.check_drift_reference(json.loads(json.dumps(ref)))
    assert set(ref["fields"]) == {"amount", "merchant", "mcc", "risk", "errors"}
    r = ref["fields"]["risk"]
    assert len(r["edges"]) == 9 and sum(r["proportions"]) == pytest.approx(1.0)
    assert r["proportions"] == pytest.approx([0.1] * 10, abs=0.01)  # deciles
    same = drift.psi_table(ref, frame)
    assert (same["psi"] < 1e-9).all() and (same["reading"] == "stable").all()
    shifted = frame.assign(risk=frame["risk"] + 2.0, mcc="5411")
    t = drift.psi_table(ref, shifted).set_index("field")
    assert t.loc["risk", "reading"] == "major shift" and t.loc["mcc", "reading"] == "major shift"
    assert t.loc["merchant", "psi"] < 1e-9
    # the mcc PSI by hand: all rows become 5411
    m = ref["fields"]["mcc"]
    e = np.array(m["proportions"] + [m["other"]])
    a = np.array([1.0 if c == "5411" else 0.0 for c in m["categories"]] + [0.0])
    assert t.loc["mcc", "psi"] == pytest.approx(drift.psi(e, a))
    assert drift.psi_table(None, frame).empty


def test_score_cli_says_score_for_an_uncalibrated_model_and_probability_for_the_demo_model(tmp_path, monkeypatch):
    from pathlib import Path

    from typer.testing import CliRunner

    from engine.cli import app
    from tiny_models import demo_slice

    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "store"))
    data = demo_slice(tmp_path / "d.csv", 200)
    legacy = Path(__file__).resolve().parents[1] / "fixtures" / "legacy_demo"  # written before calibration existed
    r = CliRunner().invoke(app, ["score", "--data", str(data), "--spec", "tabformer", "--model", str(legacy),
                                 "--out", str(tmp_path / "s.csv")])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "on the score (uncalibrated: not a probability)" in text
    header = (tmp_path / "s.csv").read_text().splitlines()[0].split(",")
    assert "score" in header and "logit" in header and "probability" not in header
    r = CliRunner().invoke(app, ["score", "--data", str(data), "--out", str(tmp_path / "p.csv")])  # the demo model
    assert r.exit_code == 0, r.output
    assert "calibrated fraud probability" in " ".join(r.output.split())
    header = (tmp_path / "p.csv").read_text().splitlines()[0].split(",")
    assert {"score", "logit", "probability"} <= set(header)
