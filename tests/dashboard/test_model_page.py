"""The Model page's "model at a glance" through AppTest: calibration (reliability diagram, ECE),
the threshold slider on the precision-recall curve, importance over flagged cases, PSI per field;
and the words rule: "probability" only for a calibrated model, "score" otherwise."""

from __future__ import annotations

import numpy as np
import plotly.io as pio
import pytest
from streamlit.testing.v1 import AppTest

from pathlib import Path

from engine.cases import model_glance as mg
from engine.cases import view as cv
from engine.serve import access as ac
from tiny_models import demo_slice, tiny_checkpoint

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def users_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("users") / "users.toml"
    ac.add_user(p, "alice", "analyst", PASSWORD)
    return p


def signed_in_as(user: str) -> AppTest:
    from dashboard.components.access import SESSION_KEY

    at = AppTest.from_file(APP, default_timeout=90)
    at.session_state[SESSION_KEY] = ac.Identity(user, "analyst", "password")
    return at


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny model fitted to a demo slice, saved twice: without and with a calibration map,
    operating point and drift reference computed on the slice itself (as training would on
    validation / test)."""
    from engine.model import calibration as cal
    from engine.model import drift
    from engine.model import operating_point as opp

    d = tmp_path_factory.mktemp("mpage")
    data = demo_slice(d / "tx.csv", 1500)
    spec = cv.demo_spec_name()
    src = cv.load_source(data, spec)
    base = {"name": "tiny-glance", "thresholds": {"review": 0.5, "decline": 0.8}}
    tiny_checkpoint(src.frame, src.spec, d / "raw", base)
    raw = cv.load_model(d / "raw")
    s = cv.score_source(raw, src.frame)
    y = s["label"].astype(int).to_numpy()
    assert 0 < y.sum() < len(y)
    lg = s["logit"].to_numpy(np.float64)
    m = cal.fit_calibration(lg, y, s["entity_id"].to_numpy(), method="platt")
    p = cal.apply_calibration(m, lg)
    days = mg.data_days(s)
    op = opp.choose_operating_thresholds(y, p, days, target_precision=0.2)
    op["test"] = opp.bootstrap_at_threshold(y, p, s["entity_id"].to_numpy(), op["review"], days, n_boot=100)
    op["precision_warning"] = opp.precision_warning(op["validation"]["precision"], op["test"])
    op["test_curve"] = opp.curve_points(y, p, days)
    meta = {**base, "thresholds": {"review": op["review"], "decline": op["decline"]}, "calibration": m,
            "operating_point": op, "drift_reference": drift.drift_reference(src.frame, src.spec),
            "calibration_metrics": {"test": {"score": cal.calibration_summary(y, s["score"].to_numpy()),
                                             "probability": cal.calibration_summary(y, p)}}}
    tiny_checkpoint(src.frame, src.spec, d / "cal", meta)
    # records the loader does not validate (display only), malformed: the page says so, never raises
    tiny_checkpoint(src.frame, src.spec, d / "odd", {**meta, "calibration_metrics": {"test": {"score": {"ece": "x"}}},
                                                       "operating_point": {"review": "a", "validation": 5}})
    bundle = cv.load_model(d / "cal")
    return {"data": data, "spec": spec, "raw": d / "raw", "cal": d / "cal", "odd": d / "odd", "bundle": bundle, "frame": src.frame,
            "scores": cv.score_source(bundle, src.frame), "meta": meta}


def _page(world, monkeypatch, tmp_path, users_file, model: str) -> AppTest:
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("FRAUDLENS_USERS", str(users_file))
    for k in ("FRAUDLENS_DEMO", "FRAUDLENS_DATA_ROOTS", "FRAUDLENS_MAX_ROWS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("FRAUDLENS_DATA", str(world["data"]))
    monkeypatch.setenv("FRAUDLENS_SPEC", world["spec"])
    monkeypatch.setenv("FRAUDLENS_MODEL", str(world[model]))
    at = signed_in_as("alice")
    at.switch_page("pages/model.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def _metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_calibrated_model_at_a_glance(world, monkeypatch, tmp_path, users_file):
    at = _page(world, monkeypatch, tmp_path, users_file, "cal")
    charts = {c.key for c in at.get("plotly_chart")}
    assert {"reliability", "pr_curve", "psi"} <= charts
    assert not any("no calibration map" in w.value for w in at.warning)
    met = _metrics(at)
    cm = world["meta"]["calibration_metrics"]["test"]
    assert met["Test ECE · calibrated probability"] == f"{cm['probability']['ece']:.4f}"
    assert met["Test ECE · uncalibrated score"] == f"{cm['score']['ece']:.4f}"
    loaded = mg.loaded_calibration(world["scores"])
    assert met["Loaded data ECE · probability"] == f"{loaded['ece']:.4f}"
    # the slider: alerts per day, precision and recall of the loaded labelled data at its value
    sl = at.slider(key="pr_threshold")
    assert "probability" in sl.label and sl.value == pytest.approx(world["bundle"].threshold)
    t = float(np.quantile(world["scores"]["probability"], 0.97))
    sl.set_value(round(t, 3)).run()
    want = mg.operating_at(world["scores"], round(t, 3))
    met = _metrics(at)
    assert met["Alerts per day"] == f"{want['alerts_per_day']:,.1f}"
    assert met["Precision"] == ("—" if want["precision"] is None else f"{want['precision']:.3f}")
    assert met["Recall"] == f"{want['recall']:.3f}"
    # PSI table: the loaded data is the training data here, so every field is stable
    psi = next(d.value for d in at.dataframe if "psi" in d.value.columns)
    assert set(psi["field"]) == set(world["meta"]["drift_reference"]["fields"])
    assert (psi["psi"] < 1e-9).all() and (psi["reading"] == "stable").all()
    # importance over flagged cases, on demand
    at.number_input(key="imp_cases").set_value(2).run()
    at.button(key="imp_go").click().run()
    assert not at.exception, [e.value for e in at.exception]
    imp = next(c for c in at.get("plotly_chart") if c.key == "importance")
    bars = pio.from_json(imp.proto.spec).data[0]
    assert set(bars.y) <= set(world["bundle"].config.field_names) and len(bars.y) >= 3
    assert (np.asarray(bars.x) >= 0).all() and all("pts of probability" in t for t in bars.text)
    pats = [d.value for d in at.dataframe if "pattern" in d.value.columns]
    if pats:  # the reason codes cited by those cases (when any)
        assert (pats[0]["cases"] <= 2).all()


def test_uncalibrated_model_says_score(world, monkeypatch, tmp_path, users_file):
    at = _page(world, monkeypatch, tmp_path, users_file, "raw")
    assert any("no calibration map" in w.value and "scores" in w.value for w in at.warning)
    assert "score" in at.slider(key="pr_threshold").label and "probability" not in at.slider(key="pr_threshold").label
    met = _metrics(at)
    assert "Loaded data ECE · score" in met and not any("probability" in k for k in met)
    assert "psi" not in {c.key for c in at.get("plotly_chart")}  # no training-period statistics stored
    assert any("stores no training-period field statistics" in c.value for c in at.caption)


def test_glance_functions_by_hand():
    import pandas as pd

    s = pd.DataFrame({"probability": [0.9, 0.8, 0.8, 0.4, 0.1], "label": [1, 0, 1, 1, 0],
                      "timestamp": pd.to_datetime(["2024-01-01", "2024-01-02", "2024-01-02", "2024-01-03",
                                                   "2024-01-03"])})
    c = mg.operating_curve(s, days=2.0)
    assert c["threshold"].tolist() == [0.9, 0.8, 0.4, 0.1]
    assert c["precision"].tolist() == pytest.approx([1.0, 2 / 3, 0.75, 0.6])
    assert c["recall"].tolist() == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0])
    assert c["alerts_per_day"].tolist() == [0.5, 1.5, 2.0, 2.5]
    at = mg.operating_at(s, 0.8)
    assert at == {"threshold": 0.8, "alerts": 3, "alerts_per_day": 1.5, "labelled": 5,
                  "precision": pytest.approx(2 / 3), "recall": pytest.approx(2 / 3)}
    assert mg.data_days(s) == 2.0
    assert mg.operating_curve(s.drop(columns="label")).empty
    # probability reading of an attribution: P(logit) - P(logit - a); no map = sigmoid
    assert mg.probability_reading({}, 0.0, 0.0) == 0.0
    assert mg.probability_reading({}, 2.0, 2.0) == pytest.approx(1 / (1 + np.exp(-2)) - 0.5)
    platt = {"calibration": {"method": "platt", "a": 1.0, "b": -2.0}}
    assert mg.probability_reading(platt, 2.0, 2.0) == pytest.approx(0.5 - 1 / (1 + np.exp(2)))


def test_malformed_display_records_are_reported_not_raised(world, monkeypatch, tmp_path, users_file):
    at = _page(world, monkeypatch, tmp_path, users_file, "odd")
    texts = [w.value for w in at.warning]
    assert any("calibration record is malformed" in t for t in texts)
    assert any("operating-point record is malformed" in t for t in texts)
    assert "pr_curve" in {c.key for c in at.get("plotly_chart")}  # the loaded data's curve still shows


def test_a_seed_ensemble_on_the_model_page(world, monkeypatch, tmp_path, users_file):
    """A 2-member ensemble checkpoint: the page names the members, shows each member's training
    history and best epoch, and explains flagged cases with it (importance on demand)."""
    import dataclasses

    import torch

    from engine.data.features import FeatureEncoder
    from engine.model.checkpoint import ModelBundle, build_model, save_checkpoint
    from engine.model.ensemble import SeedEnsemble

    spec = cv.load_source(world["data"], world["spec"]).spec
    enc = FeatureEncoder.fit(world["frame"], spec)
    members = []
    for seed in (2, 3):
        m = build_model(enc, seed=seed, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0, context_length=16,
                        min_history=6)
        with torch.no_grad():
            g = torch.Generator().manual_seed(seed)
            for p in m.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
        members.append(m.eval())
    ens = SeedEnsemble(dataclasses.replace(members[0].cfg, n_members=2), members).eval()
    hist = [{"epoch": e, "loss": 1.0 / e, "val_average_precision": 0.1 * e, "member": k} for k in (0, 1) for e in (1, 2)]
    meta = {"name": "tiny-ensemble", "thresholds": {"review": 0.5, "decline": 0.8}, "best_epoch": [2, 1],
            "history": hist, "members": [{"seed": 4, "best_epoch": 2}, {"seed": 5, "best_epoch": 1}]}
    save_checkpoint(ModelBundle(model=ens, encoder=enc, spec=spec, meta=meta), tmp_path / "ens")
    world = {**world, "ens": tmp_path / "ens"}
    at = _page(world, monkeypatch, tmp_path, users_file, "ens")
    assert _metrics(at)["Best epoch"] == "2 / 1"
    hist_chart = next(c for c in at.get("plotly_chart") if c.key == "history")
    names = [t.name for t in pio.from_json(hist_chart.proto.spec).data]
    assert "validation AP (member 1)" in names and "validation AP (member 2)" in names
    at.number_input(key="imp_cases").set_value(2).run()
    at.button(key="imp_go").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert "importance" in {c.key for c in at.get("plotly_chart")}
