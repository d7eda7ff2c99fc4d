"""Case-view data preparation: source -> scores -> ranking -> timeline -> explanations -> tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engine.cases import timeline_table as tt
from engine.cases import view as cv
from tiny_models import demo_slice
from tiny_models import tiny_checkpoint as _tiny_checkpoint

ROWS = 800


def _slice(path: Path, n: int = ROWS) -> Path:
    return demo_slice(path, n)


def tiny_checkpoint(frame: pd.DataFrame, spec, out: Path) -> Path:
    """An untrained tiny model (weights perturbed so scores spread), saved as a checkpoint."""
    return _tiny_checkpoint(frame, spec, out,
                            {"name": "tiny-test", "thresholds": {"review": 0.5, "decline": 0.8},
                             "metrics": {"test": {"n": 10, "n_fraud": 1, "auc_roc": 0.5}},
                             "history": [{"epoch": 1, "loss": 1.0}],
                             "training_data": {"path": "/data/4111111111111111.csv", "sha256": "ab" * 32}},
                            seed=1)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("case_view")
    data = _slice(d / "tx.csv")
    src = cv.load_source(data, cv.demo_spec_name())
    model_dir = tiny_checkpoint(src.frame, src.spec, d / "model")
    bundle = cv.load_model(model_dir)
    scores = cv.score_source(bundle, src.frame)
    return src, bundle, scores


def test_load_source_accounts_for_rows_and_hashes_the_file(world, tmp_path):
    src, _, _ = world
    assert src.rows_read == ROWS == len(src.frame) + len(src.rejected)
    assert src.file_sha256 == cv.file_identity(src.path) and len(src.file_sha256) == 64
    assert src.currency == "USD"
    assert "accepted" in src.summary()
    small = cv.load_source(src.path, src.spec, max_rows=50)
    assert small.rows_read == 50
    with pytest.raises(FileNotFoundError):
        cv.load_source(tmp_path / "nope.csv", "demo")
    with pytest.raises(FileNotFoundError):
        cv.load_source(src.path, "no-such-spec")


def test_a_file_without_labels_opens_scored_with_unknown_known_frauds(world, tmp_path):
    """The dashboard opens a production file (no label column yet): same scores and timelines, and
    'known frauds' unknown (NA), not 0."""
    src, bundle, scores = world
    bare = tmp_path / "bare.csv"
    pd.read_csv(src.path, dtype=str, keep_default_na=False).drop(columns=["Is Fraud?"]).to_csv(bare, index=False)
    b = cv.load_source(bare, cv.demo_spec_name())
    assert b.rows_read == src.rows_read and len(b.frame) == len(src.frame) and "label" not in b.frame
    pq = tmp_path / "bare.parquet"  # the same through the Parquet reader (column names from the schema)
    pd.read_csv(bare, dtype=str, keep_default_na=False).to_parquet(pq, index=False)
    bp = cv.load_source(pq, cv.demo_spec_name())
    assert bp.rows_read == src.rows_read and len(bp.frame) == len(src.frame) and "label" not in bp.frame
    s2 = cv.score_source(bundle, b.frame)
    assert np.allclose(s2["probability"].to_numpy(), scores["probability"].to_numpy(), atol=1e-6)
    rk = cv.rank_entities(s2, bundle.threshold)
    assert rk["known_frauds"].isna().all() and len(rk) == src.frame["entity_id"].nunique()
    tl = cv.entity_timeline(b.frame, s2, rk["entity_id"].iloc[0], bundle.threshold)
    assert len(tl) and "label" not in tl


def test_scores_carry_the_threshold_flag(world):
    _, bundle, scores = world
    assert {"transaction_id", "entity_id", "probability", "logit", "flagged"} <= set(scores)
    np.testing.assert_array_equal(scores["flagged"], scores["probability"] >= bundle.threshold)
    assert scores["probability"].between(0, 1).all()


def test_rank_entities_orders_by_highest_score_and_counts(world):
    _, bundle, scores = world
    r = cv.rank_entities(scores, bundle.threshold)
    assert len(r) == scores["entity_id"].nunique()
    assert r["max_probability"].is_monotonic_decreasing
    for _, row in r.head(3).iterrows():
        s = scores[scores["entity_id"] == row["entity_id"]]
        assert row["max_probability"] == s["probability"].max()
        assert row["n_transactions"] == len(s)
        assert row["n_flagged"] == int((s["probability"] >= bundle.threshold).sum())
        assert row["known_frauds"] == int(s["label"].fillna(0).sum())
        assert row["last_seen"] == s["timestamp"].max()
        assert s.loc[s["transaction_id"] == row["top_transaction_id"], "probability"].iloc[0] == row["max_probability"]


def test_rank_entities_breaks_probability_ties_by_logit():
    """A step calibration map gives whole blocks one probability: among them the higher logit
    (the model's own ranking) comes first, before the flagged count."""
    s = pd.DataFrame({"entity_id": ["a", "a", "a", "b", "c"], "transaction_id": list("12345"),
                      "timestamp": pd.date_range("2024-01-01", periods=5),
                      "probability": [0.6, 0.6, 0.6, 0.6, 0.6], "logit": [0.1, 0.2, 0.3, 1.5, 0.9]})
    r = cv.rank_entities(s, 0.5)
    assert r["entity_id"].tolist() == ["b", "c", "a"]  # without the logit: a (3 flagged) first
    assert "_max_logit" not in r
    # the case opens on the same transaction everywhere: highest logit among the tied probabilities
    assert r.set_index("entity_id").loc["a", "top_transaction_id"] == "3"
    s2 = s.assign(logit=[0.1, 0.3, 0.2, 1.5, 0.9])
    assert cv.rank_entities(s2, 0.5).set_index("entity_id").loc["a", "top_transaction_id"] == "2"
    assert cv.default_query(s2[s2.entity_id == "a"]) == "2"
    assert cv.default_query(s2[s2.entity_id == "a"].drop(columns="logit")) == "3"  # no logit: the latest
    assert cv.query_options(s2.assign(flagged=True)[s2.entity_id == "a"], min_options=1) == ["2", "3", "1"]
    from dashboard.precompute import flagged_order

    order = flagged_order(s2.assign(flagged=True), cv.rank_entities(s2, 0.5))
    assert order[0] == "4" and order.index("2") < order.index("1")
    assert cv.rank_entities(s.drop(columns="logit"), 0.5)["entity_id"].iloc[0] == "a"


def test_rank_entities_masks_card_like_entities_for_display():
    s = pd.DataFrame({"entity_id": ["4111111111111111", "4111111111111111", "x"],
                      "transaction_id": ["1", "2", "3"], "timestamp": pd.date_range("2024-01-01", periods=3),
                      "probability": [0.2, 0.9, 0.5]})
    r = cv.rank_entities(s, 0.5)
    assert r["entity_id"].tolist() == ["4111111111111111", "x"]
    assert r["entity"].tolist() == ["411111******1111", "x"]
    assert r["known_frauds"].isna().all()  # no labels: unknown, not 0
    assert r["n_flagged"].tolist() == [1, 1]


def test_entity_timeline_is_time_ordered_scored_and_masked(world):
    src, bundle, scores = world
    ent = cv.rank_entities(scores, bundle.threshold)["entity_id"].iloc[0]
    tl = cv.entity_timeline(src.frame, scores, ent, bundle.threshold, src.currency)
    mine = scores[scores["entity_id"] == ent]
    assert len(tl) == len(mine)
    assert tl["timestamp"].is_monotonic_increasing
    assert set(tl["transaction_id"]) == set(mine["transaction_id"])
    p = dict(zip(mine["transaction_id"], mine["probability"]))
    assert all(p[t] == v for t, v in zip(tl["transaction_id"], tl["probability"]))
    assert tl["when"].is_unique and tl["when"].iloc[0].endswith(f"{tl['amount'].iloc[0]:,.2f} USD")
    # merchant ids are 19-digit numbers: shown in full unless they pass the Luhn check (could be a
    # card number in the wrong column: masked, about 1 in 10)
    from engine.cases.redact import luhn_valid

    raw = src.frame.set_index("transaction_id").loc[tl["transaction_id"], "merchant"].astype(str).tolist()
    shown = tl["merchant"].astype(str).tolist()
    assert [s_ != r_ for s_, r_ in zip(shown, raw)] == [luhn_valid(r_) for r_ in raw]
    assert not any("*" in s_ for s_, r_ in zip(shown, raw) if not luhn_valid(r_))
    assert cv.mask_card_fields(pd.DataFrame({"card_number": ["4111111111111111"]}))["card_number"].iloc[0] == \
        "411111******1111"
    with pytest.raises(KeyError):
        cv.entity_timeline(src.frame, scores, "no-such-entity", 0.5)


def test_default_query_and_options(world):
    src, bundle, scores = world
    ent = cv.rank_entities(scores, bundle.threshold)["entity_id"].iloc[0]
    tl = cv.entity_timeline(src.frame, scores, ent, bundle.threshold, src.currency)
    q = cv.default_query(tl)
    assert tl.loc[tl["transaction_id"] == q, "probability"].iloc[0] == tl["probability"].max()
    opts = cv.query_options(tl, current=tl["transaction_id"].iloc[0])
    assert opts[0] == q
    assert tl["transaction_id"].iloc[0] in opts
    probs = [tl.loc[tl["transaction_id"] == o, "probability"].iloc[0] for o in opts[:-1]]
    assert probs == sorted(probs, reverse=True)
    lab = cv.option_label(tl, q)
    # one pass for the picker: the same label per id (an unknown id: its masked id)
    many = opts + [tl["transaction_id"].iloc[3], "no-such-id"]
    assert tt.option_labels(tl, many) == {t: cv.option_label(tl, t) for t in many}
    assert tt.option_labels(tl, ["no-such-id"]) == {"no-such-id": "no-such-id"}
    assert lab.startswith("▲" if tl["probability"].max() >= bundle.threshold else "·") and " USD" in lab
    assert cv.default_query(tl.iloc[:0]) is None


@pytest.fixture(scope="module")
def explained(world):
    src, bundle, scores = world
    ent = cv.rank_entities(scores, bundle.threshold)["entity_id"].iloc[0]
    tl = cv.entity_timeline(src.frame, scores, ent, bundle.threshold, src.currency)
    q = cv.default_query(tl.iloc[10:])  # a query with some history
    return tl, q, cv.explain_query(bundle, src.frame, q, shap_samples=64, ig_steps=16)


def test_explain_query_returns_every_method_for_the_query(world, explained):
    _, _, scores = world
    tl, q, ex = explained
    assert list(ex) == list(cv.METHODS)
    assert len(ex["shap"].transaction_ids) > 5
    for e in ex.values():
        assert e.query_transaction_id == q and e.transaction_ids[-1] == q
    logit = scores.loc[scores["transaction_id"] == q, "logit"].iloc[0]
    assert ex["integrated_gradients"].score_logit == pytest.approx(float(logit), abs=1e-4)
    with pytest.raises(KeyError):
        cv.explain_query(world[1], world[0].frame, "no-such-id")


def test_context_table_lines_up_rows_and_attributions(world, explained):
    src, bundle, scores = world
    tl, q, ex = explained
    t = cv.context_table(ex, src.frame, scores, src.currency)
    T = len(ex["shap"].transaction_ids)
    assert len(t) == T and t["query"].tolist() == [False] * (T - 1) + [True]
    assert t["transaction_id"].tolist() == ex["shap"].transaction_ids
    for m, col in cv.METHOD_COLUMNS.items():
        np.testing.assert_array_equal(t[col], ex[m].values)
    assert t["timestamp"].is_monotonic_increasing
    assert t["when"].iloc[-1].startswith("▶ query")
    p = scores.set_index("transaction_id")["probability"]
    np.testing.assert_allclose(t["probability"], p.loc[t["transaction_id"]].to_numpy())
    rows = cv.context_rows(ex, src.frame)
    assert rows["transaction_id"].tolist() == ex["shap"].transaction_ids
    labels = cv.context_labels(rows, src.currency)
    assert len(set(labels)) == T
    a = cv.attribution_table(ex["shap"], labels, top=3)
    assert len(a) == 3 and a["value"].abs().is_monotonic_decreasing


def test_query_summary_and_captions(world, explained):
    _, bundle, _ = world
    tl, q, ex = explained
    qs = cv.query_summary(ex, tl, q, bundle.threshold)
    assert qs.transaction_id == q and qs.threshold == bundle.threshold
    assert qs.flagged == (qs.probability >= bundle.threshold)
    assert qs.probability == pytest.approx(tl.loc[tl["transaction_id"] == q, "probability"].iloc[0], abs=1e-5)
    assert "integrated_gradients" in qs.convergence and qs.context_length == len(ex["shap"].transaction_ids)
    cap = cv.method_caption(ex["integrated_gradients"])
    assert "logit" in cap and "convergence delta" in cap
    import copy

    tiny = copy.copy(ex["integrated_gradients"])
    tiny.convergence_delta = -3.2e-06  # the chart caption read "-0.0000" beside the metric's -3.2e-06
    assert "convergence delta -3.2e-06 logit" in cv.method_caption(tiny)
    assert "Baseline" in cv.method_details(ex["shap"])
    # SHAP: its estimator and standard errors, not an "efficiency gap" check
    sh = cv.method_caption(ex["shap"])
    assert "estimator " + ex["shap"].extras["estimator"] in sh and "convergence delta" not in sh
    assert "not an accuracy check" in cv.method_details(ex["shap"])
    t = cv.attribution_table(ex["shap"], None)
    assert list(t.columns[:3]) == ["when", "value", "standard_error"]


def test_field_value_texts(world):
    src, bundle, _ = world
    row = src.frame.iloc[3]
    names = bundle.encoder.field_names()
    vals = cv.field_value_texts(row, names, "USD", prev_timestamp=src.frame["timestamp"].iloc[2])
    d = dict(zip(names, vals))
    assert d["amount"] == f"{row['amount']:,.2f} USD"
    assert d["hour"].endswith("h") and d["weekday"] in {"Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"}
    assert "*" not in d["merchant"]  # a merchant id is not a card number
    assert cv.field_value_texts(pd.Series({"card": "4111111111111111"}), ["card"]) == ["411111******1111"]


def test_model_card_has_provenance_and_masks_paths(world):
    _, bundle, _ = world
    card = cv.model_card(bundle)
    assert card["name"] == "tiny-test" and card["sha256"] == bundle.sha256 and len(card["sha256"]) == 64
    assert card["threshold"] == 0.5 and card["thresholds"]["decline"] == 0.8
    assert card["architecture"]["context_length"] == 16 and "cat_field_index" not in card["architecture"]
    assert card["config"]["cat_field_index"] and card["n_parameters"] > 0
    assert card["metrics"]["period"].tolist() == ["test"]
    assert card["training_data"]["path"] == "/data/411111******1111.csv"
    assert card["spec_name"] == bundle.spec.name and "[entity]" in card["spec_toml"]
    assert "torch" in card["versions"] and len(card["history"]) == 1


def test_mask_frame_masks_text_columns_only():
    df = pd.DataFrame({"entity_id": ["4111111111111111"], "note": ["card 4111 1111 1111 1111"], "n": [1]})
    out = cv.mask_frame(df)
    assert out["entity_id"].iloc[0] == "4111111111111111"  # raw id kept for look-ups
    assert out["note"].iloc[0] == "card 4111 11** **** 1111"
    assert df["note"].iloc[0] == "card 4111 1111 1111 1111"  # input untouched
    # bidi controls would show a merchant name reversed: visible escapes (ids kept raw for look-ups)
    sp = pd.DataFrame({"entity_id": ["a\u202eb"], "merchant": ["ACME \u202eLTD\u202c"], "flag": [True]})
    out = cv.mask_frame(sp)
    assert out["merchant"].iloc[0] == "ACME \\u202eLTD\\u202c" and out["entity_id"].iloc[0] == "a\u202eb"
    assert out["flag"].iloc[0] is True or out["flag"].iloc[0] == True  # noqa: E712 - non-text cells unchanged


def test_case_view_imports_no_streamlit():
    src = (Path(cv.__file__).read_text() + Path(cv.__file__).with_name("figures.py").read_text())
    assert "import streamlit" not in src and "from streamlit" not in src
