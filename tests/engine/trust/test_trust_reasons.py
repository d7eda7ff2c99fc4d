"""Reason codes: every number is recomputed from the data; only top-ranked transactions and
fields are cited."""

import numpy as np
import pandas as pd
import pytest
from trust_helpers import context, one_torch_thread, positive_queries  # noqa: F401

from engine.model.checkpoint import ModelBundle, build_model
from engine.explain.context import build_context
from engine.explain import explain_all
from engine.explain.base import Explanation
from engine.data.features import FeatureEncoder
from engine.data.spec import load_spec
from engine.trust.reasons import reason_codes, summary_text


def demo_like_frame() -> pd.DataFrame:
    """Card 0:0: 20 in-person purchases in Boston, then 5 online purchases 8 minutes apart at new
    merchants, new MCCs, ~5x the amounts (the last one is the query). Card 0:1: filler."""
    rng = np.random.default_rng(0)
    t0 = pd.Timestamp("2023-03-01 09:00")
    normal = pd.DataFrame({
        "timestamp": [t0 + pd.Timedelta(hours=10 * i + int(rng.integers(0, 3))) for i in range(20)],
        "amount": np.round(rng.uniform(35, 65, 20), 2),
        "merchant": rng.choice(["111", "222", "333"], 20), "merchant_city": "Boston", "merchant_state": "MA",
        "zip": "02108", "mcc": rng.choice(["5411", "5812"], 20), "use_chip": "Chip Transaction",
        "errors": [""] * 19 + ["Insufficient Balance"],
    })
    tb = normal["timestamp"].iloc[-1] + pd.Timedelta(days=2)
    burst = pd.DataFrame({
        "timestamp": [tb + pd.Timedelta(minutes=8 * i) for i in range(5)],
        "amount": [251.0, 240.5, 275.25, 262.0, 248.0],
        "merchant": ["901", "902", "903", "904", "905"], "merchant_city": "ONLINE", "merchant_state": "<empty>",
        "zip": "<empty>", "mcc": ["5732", "5944", "5732", "5944", "5732"], "use_chip": "Online Transaction",
        "errors": ["", "Bad CVV", "", "", ""],
    })
    a = pd.concat([normal, burst], ignore_index=True).assign(entity_id="0:0")
    b = normal.assign(entity_id="0:1", timestamp=normal["timestamp"] + pd.Timedelta(hours=1))
    f = pd.concat([a, b], ignore_index=True)
    f["label"] = pd.array(np.zeros(len(f), dtype=np.int8), dtype="Int8")
    f.insert(0, "row_number", np.arange(1, len(f) + 1))
    f.insert(1, "transaction_id", [f"r{i}" for i in f["row_number"]])
    return f.sort_values(["entity_id", "timestamp", "row_number"]).reset_index(drop=True)


def demo_ctx():
    fr = demo_like_frame()
    spec = load_spec("demo")
    enc = FeatureEncoder.fit(fr, spec)
    model = build_model(enc, seed=0, d_model=8, n_heads=2, n_layers=1, d_ff=8, dropout=0.0,
                        context_length=32, min_history=8).eval()
    bundle = ModelBundle(model=model, encoder=enc, spec=spec)
    qid = fr.loc[fr.entity_id == "0:0", "transaction_id"].iloc[-1]
    return build_context(bundle, fr, qid)


def synthetic_ig(ctx, field_weights: dict, normal_cited: int = 3, negative: int = 5) -> Explanation:
    """IG-like explanation: burst rows (and the query) carry ``field_weights``; earlier row
    ``normal_cited`` a small positive amount attribution; row ``negative`` a negative one."""
    T, names = ctx.T, list(ctx.field_names)
    fv = np.zeros((T, len(names)))
    for p in range(T - 5, T):
        for f, w in field_weights.items():
            fv[p, names.index(f)] = w
    fv[normal_cited, names.index("amount")] = 0.2
    fv[negative, names.index("amount")] = -3.0
    return Explanation(method="integrated_gradients", entity_id=ctx.entity_id, transaction_ids=list(ctx.transaction_ids),
                       query_transaction_id=ctx.query_transaction_id, values=fv.sum(1), units="logit", signed=True,
                       baseline="test", params={}, score_logit=0.0, field_values=fv, field_names=names)


WEIGHTS = {"time_since_prev": 1.0, "merchant": 1.0, "amount": 1.0, "mcc": 0.8, "use_chip": 0.5}


def test_reason_numbers_match_the_data():
    ctx = demo_ctx()
    rows = ctx.rows
    e = synthetic_ig(ctx, WEIGHTS)
    reasons = reason_codes(ctx, {"integrated_gradients": e}, top_k=5, max_fields=5, max_reasons=10)
    by = {r.kind: r for r in reasons}
    assert set(by) == {"burst", "channel", "new_merchant", "new_mcc", "amount"}, [r.text for r in reasons]
    T = ctx.T
    burst_ids = list(ctx.transaction_ids[T - 5:])
    cited = sorted([3] + list(range(T - 5, T)))  # top 5 positive earlier + the query (positive)
    cited_ids = [ctx.transaction_ids[p] for p in cited]
    base = [p for p in range(T - 1) if p not in cited]
    ts = pd.to_datetime(rows["timestamp"])
    for r in reasons:
        assert set(r.transaction_ids) <= set(cited_ids) and r.numbers["field_ranked"] == 1
        assert set(r.fields) <= set(WEIGHTS)
    b = by["burst"]
    assert b.transaction_ids == burst_ids and b.numbers["n_transactions"] == 5
    assert b.numbers["span_minutes"] == pytest.approx((ts.iloc[T - 1] - ts.iloc[T - 5]).total_seconds() / 60) == 32
    assert b.text == "5 transactions in 32 minutes"
    c = by["channel"]
    assert c.numbers["n_online"] == 5 and c.numbers["n_cited"] == len(cited) == 6
    assert c.numbers["baseline_online_share"] == 0.0 and c.transaction_ids == burst_ids
    m = by["new_merchant"]
    seen = set(rows["merchant"].iloc[base])
    new = [t for p, t in zip(cited, cited_ids) if rows["merchant"].iloc[p] not in seen]
    assert m.transaction_ids == new == burst_ids
    assert (m.numbers["n_new"], m.numbers["n_cited"], m.numbers["n_baseline"]) == (5, 6, len(base))
    assert m.text.startswith(f"5 of 6 at merchants not seen in the card's other {len(base)} transactions")
    mc = by["new_mcc"]
    assert mc.numbers["values"] == "5732, 5944" and mc.numbers["n_new"] == 5
    a = by["amount"]
    amt = rows["amount"].to_numpy()
    assert a.numbers["median_cited"] == pytest.approx(np.median(amt[cited]))
    assert a.numbers["median_baseline"] == pytest.approx(np.median(amt[base]))
    assert a.numbers["ratio"] == pytest.approx(np.median(amt[cited]) / np.median(amt[base]))
    assert f"{a.numbers['ratio']:.1f}x" in a.text and f"{a.numbers['median_cited']:,.2f} USD" in a.text
    assert a.transaction_ids == cited_ids
    # the negative-attribution row is never cited; errors carry no attribution -> no errors reason
    assert ctx.transaction_ids[5] not in {t for r in reasons for t in r.transaction_ids}
    assert "errors" not in by
    assert summary_text(reasons).endswith(".") and summary_text([]) == ""


def test_only_highly_ranked_fields_are_cited():
    ctx = demo_ctx()
    e = synthetic_ig(ctx, {"errors": 6.0, "merchant": 1.0, "amount": 0.1, "time_since_prev": 0.05})
    reasons = reason_codes(ctx, {"integrated_gradients": e}, top_k=5, max_fields=2, max_reasons=10)
    assert {r.kind for r in reasons} == {"errors", "new_merchant"}
    err = next(r for r in reasons if r.kind == "errors")
    assert err.numbers["n_errors"] == 1 and err.numbers["errors"] == "Bad CVV"
    assert err.transaction_ids == [ctx.transaction_ids[ctx.T - 4]]
    assert err.text == "1 of 6 with authorisation errors (Bad CVV)"
    assert reasons[0].kind == "errors"  # ordered by attribution weight


def test_without_field_attributions_and_errors():
    ctx = demo_ctx()
    e = synthetic_ig(ctx, WEIGHTS)
    shap_like = Explanation(method="shap", entity_id=ctx.entity_id, transaction_ids=list(ctx.transaction_ids),
                            query_transaction_id=ctx.query_transaction_id, values=e.values, units="logit",
                            signed=True, baseline="test", params={}, score_logit=0.0,
                            extras={"player_mask": np.r_[np.ones(ctx.T - 1, bool), False]})
    reasons = reason_codes(ctx, {"shap": shap_like}, top_k=5, max_reasons=10)
    assert reasons and all(r.numbers["field_ranked"] == 0 for r in reasons)
    assert ctx.query_transaction_id in reasons[0].transaction_ids or any(
        ctx.query_transaction_id in r.transaction_ids for r in reasons)
    with pytest.raises(ValueError, match="method"):
        reason_codes(ctx, {"attention": e})
    nothing = Explanation(method="occlusion", entity_id=ctx.entity_id, transaction_ids=list(ctx.transaction_ids),
                          query_transaction_id=ctx.query_transaction_id, values=-np.ones(ctx.T), units="logit",
                          signed=True, baseline="test", params={}, score_logit=0.0)
    assert reason_codes(ctx, {"occlusion": nothing}) == []


def test_reasons_on_the_trained_model_cite_top_transactions_and_true_numbers():
    n_reasons = 0
    for qid in positive_queries(max_position=15)[:6]:
        ctx = context(qid)
        ex = explain_all(ctx, ["integrated_gradients", "shap"], shap_samples=128)
        for method in ("integrated_gradients", "shap"):
            reasons = reason_codes(ctx, ex, method=method, top_k=3, max_reasons=10)
            v = ex[method].values
            top = [j for j in np.argsort(-v[:-1], kind="stable") if v[j] > 0][:3]
            allowed = {ctx.transaction_ids[j] for j in top} | {ctx.query_transaction_id}
            fv = ex["integrated_gradients"].field_values
            for r in reasons:
                n_reasons += 1
                assert set(r.transaction_ids) <= allowed, (r, allowed)
                pos = [ctx.transaction_ids.index(t) for t in r.transaction_ids]
                idx = [ctx.field_names.index(f) for f in r.fields]
                assert np.clip(fv[np.ix_(pos, idx)], 0, None).sum() == pytest.approx(r.weight) and r.weight > 0
                rows = ctx.rows.set_index("transaction_id")
                if r.kind == "burst":
                    t = pd.to_datetime(rows.loc[r.transaction_ids, "timestamp"])
                    assert r.numbers["n_transactions"] == len(r.transaction_ids) >= 3
                    assert r.numbers["span_minutes"] == pytest.approx((t.max() - t.min()).total_seconds() / 60)
                if r.kind.startswith("new_"):
                    f = r.kind[4:]
                    cited = set(r.transaction_ids) | allowed
                    base = [t for t in ctx.transaction_ids[:-1] if t not in cited]
                    assert not set(rows.loc[r.transaction_ids, f]) & set(rows.loc[base, f])
                    assert r.numbers["n_new"] == len(r.transaction_ids)
    assert n_reasons > 0


def test_terminal_run_reason_matches_the_delayed_labels():
    """Handbook spec: the query's terminal had frauds every day from 12 days before it; known 7
    days late, the run at the query holds the frauds of days -12..-8 (5 of them)."""
    from engine.data.aggregates import add_aggregates

    spec = load_spec("handbook")
    t0 = pd.Timestamp("2018-08-20 12:00")
    other = pd.DataFrame({"entity_id": "C2", "timestamp": [t0 + pd.Timedelta(days=d, hours=1) for d in range(-20, 0)],
                          "amount": 30.0, "terminal": "T9", "label": 0})
    term = pd.DataFrame({"entity_id": "C3", "timestamp": [t0 + pd.Timedelta(days=d, hours=2) for d in range(-20, -7)],
                         "amount": 40.0, "terminal": "T1", "label": [int(d >= -12) for d in range(-20, -7)]})
    cust = pd.DataFrame({"entity_id": "C1", "timestamp": [t0 + pd.Timedelta(days=d) for d in range(-20, 1)],
                         "amount": 50.0, "terminal": ["T9"] * 20 + ["T1"], "label": 0})
    f = pd.concat([cust, other, term], ignore_index=True)
    f["label"] = pd.array(f["label"].to_numpy(), dtype="Int8")
    f["TX_FRAUD_SCENARIO"] = 0
    f.insert(0, "row_number", np.arange(1, len(f) + 1))
    f.insert(1, "transaction_id", [f"r{i}" for i in f["row_number"]])
    f = add_aggregates(f.sort_values(["entity_id", "timestamp"]).reset_index(drop=True), spec)
    enc = FeatureEncoder.fit(f, spec)
    assert "terminal" not in enc.field_names()  # model_input = false in the handbook spec
    model = build_model(enc, seed=0, d_model=8, n_heads=2, n_layers=1, d_ff=8, dropout=0.0,
                        context_length=32, min_history=8).eval()
    ctx = build_context(ModelBundle(model=model, encoder=enc, spec=spec), f, "r21")
    names = list(ctx.field_names)
    fv = np.zeros((ctx.T, len(names)))
    fv[-1, names.index("terminal_risk")] = 2.0
    e = Explanation(method="integrated_gradients", entity_id=ctx.entity_id, transaction_ids=list(ctx.transaction_ids),
                    query_transaction_id="r21", values=fv.sum(1), units="logit", signed=True, baseline="test",
                    params={}, score_logit=0.0, field_values=fv, field_names=names)
    by = {r.kind: r for r in reason_codes(ctx, {"integrated_gradients": e}, top_k=3, max_reasons=10)}
    run = by["terminal_risk_run"]
    assert run.numbers["run_length"] == 5 and run.numbers["run_days"] == pytest.approx(12 - 2 / 24)
    assert run.transaction_ids == ["r21"]
    assert run.text.startswith("this transaction's terminal: its last 5 known transactions were all frauds")
