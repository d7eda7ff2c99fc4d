"""Reason codes state facts: every count and ratio recomputed from the data over the window it
describes; only transactions positive beyond their error are cited; ranked by signed contribution;
the query's own fields are reasons."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from trust_helpers import context, one_torch_thread, positive_queries, two_card_frame  # noqa: F401

from engine.data.features import FeatureEncoder
from engine.data.spec import load_spec
from engine.explain import explain_all
from engine.explain.base import Explanation
from engine.explain.context import build_context
from engine.model.checkpoint import ModelBundle, build_model
from engine.trust.reasons import citable_positions, first_seen, reason_codes, summary_text


def demo_like_frame(n_normal: int = 20) -> pd.DataFrame:
    """Card 0:0: ``n_normal`` in-person purchases in Boston, then 6 online purchases 8 minutes apart
    at new merchants and MCCs, ~5x the amounts; the last one (the query) has a Bad CVV error. Card
    0:1: filler."""
    rng = np.random.default_rng(0)
    t0 = pd.Timestamp("2023-03-01 09:00")
    n = n_normal
    normal = pd.DataFrame({
        "timestamp": [t0 + pd.Timedelta(hours=10 * i + int(rng.integers(0, 3))) for i in range(n)],
        "amount": np.round(rng.uniform(35, 65, n), 2),
        "merchant": rng.choice(["111", "222", "333"], n), "merchant_city": "Boston", "merchant_state": "MA",
        "zip": "02108", "mcc": rng.choice(["5411", "5812"], n), "use_chip": "Chip Transaction",
        "errors": [""] * (n - 1) + ["Insufficient Balance"],
    })
    tb = normal["timestamp"].iloc[-1] + pd.Timedelta(days=2)
    burst = pd.DataFrame({
        "timestamp": [tb + pd.Timedelta(minutes=8 * i) for i in range(6)],
        "amount": [251.0, 240.5, 275.25, 262.0, 248.0, 301.0],
        "merchant": ["901", "902", "903", "904", "905", "906"], "merchant_city": "ONLINE",
        "merchant_state": "<empty>", "zip": "<empty>", "mcc": ["5732", "5944", "5732", "5944", "5732", "5946"],
        "use_chip": "Online Transaction", "errors": ["", "Bad CVV", "", "", "", "Bad CVV"],
    })
    return two_card_frame(pd.concat([normal, burst], ignore_index=True), normal)


def demo_ctx(n_normal: int = 20, fr: pd.DataFrame | None = None, min_history: int = 8, context_length: int = 32,
             entity: str = "0:0"):
    """The context of ``entity``'s last transaction in ``fr`` (default :func:`demo_like_frame`), tiny untrained
    model with the demo spec."""
    fr = demo_like_frame(n_normal) if fr is None else fr
    spec = load_spec("demo")
    enc = FeatureEncoder.fit(fr, spec)
    model = build_model(enc, seed=0, d_model=8, n_heads=2, n_layers=1, d_ff=8, dropout=0.0,
                        context_length=context_length, min_history=min_history).eval()
    qid = fr.loc[fr.entity_id == entity, "transaction_id"].iloc[-1]
    return build_context(ModelBundle(model=model, encoder=enc, spec=spec), fr, qid)


def shap_like(ctx, values, se=None) -> Explanation:
    e = Explanation(method="shap", entity_id=ctx.entity_id, transaction_ids=list(ctx.transaction_ids),
                    query_transaction_id=ctx.query_transaction_id, values=np.asarray(values, float), units="logit",
                    signed=True, baseline="test", params={}, score_logit=0.0,
                    extras={} if se is None else {"standard_errors": np.asarray(se, float)})
    return e


def field_expl(ctx, query_fields: dict) -> Explanation:
    names = list(ctx.field_names)
    fv = np.zeros((ctx.T, len(names)))
    for f, w in query_fields.items():
        fv[-1, names.index(f)] = w
    return Explanation(method="integrated_gradients", entity_id=ctx.entity_id, transaction_ids=list(ctx.transaction_ids),
                       query_transaction_id=ctx.query_transaction_id, values=fv.sum(1), units="logit", signed=True,
                       baseline="test", params={}, score_logit=0.0, field_values=fv, field_names=names)


def burst_values(ctx):
    """Burst rows T-6..T-2 positive except T-4 (negative: pushed towards legitimate); row 3 small positive."""
    T = ctx.T
    v = np.zeros(T)
    v[T - 6:T - 1] = [0.9, 0.8, -0.4, 0.7, 0.6]
    v[3] = 0.05
    return v


def test_counts_cover_the_whole_window_not_the_cited_set():
    ctx = demo_ctx()
    T, rows = ctx.T, ctx.rows
    by = {r.kind: r for r in reason_codes(ctx, {"shap": shap_like(ctx, burst_values(ctx))}, top_k=4,
                                          max_reasons=20)}
    ts = pd.to_datetime(rows["timestamp"])
    cited = [ctx.transaction_ids[p] for p in (T - 6, T - 5, T - 3, T - 2)]  # T-4 is negative, row 3 below the top 4
    b = by["burst"]
    assert b.transaction_ids == cited
    # 6 transactions from the first cited one to the query, the uncited T-4 included
    assert b.numbers["n_transactions"] == 6 and b.numbers["n_cited"] == 4
    assert b.numbers["span_minutes"] == pytest.approx((ts.iloc[T - 1] - ts.iloc[T - 6]).total_seconds() / 60) == 40
    assert b.text == "6 transactions in 40 minutes up to this one"
    m = by["new_values"]  # one reason for every column's new values, each transaction cited once
    assert (m.numbers["n_new_merchant"], m.numbers["n_window"], m.numbers["n_new"]) == (5, 5, 5)
    assert m.transaction_ids == cited and not any(k.startswith("new_") and k != "new_values" for k in by)
    # the share of new values before the span, recomputed: rows 1..T-7 (row 0 has no history), any column new
    cols = [c for c in ("merchant", "mcc", "merchant_city", "merchant_state") if c in rows]
    online = rows["use_chip"].astype(str).str.contains("Online").to_numpy()
    anynew = np.zeros(T, bool)
    for c in cols:
        new = first_seen(rows[c].astype(str).to_numpy(), "<empty>")
        anynew |= new & ~online if c in ("merchant_city", "merchant_state") else new
    before = anynew[10:T - 6]  # positions with at least 10 earlier rows, up to the span's start (T-6)
    assert m.numbers["new_share_before"] == pytest.approx(before.mean()) and len(before) == 10
    assert m.text == ("of the 5 transactions in the 40 minutes before this one, 5 were at merchants and 2 at merchant "
                      f"categories (5732, 5944) the card had not used before (against {100 * before.mean():.0f}% of "
                      f"its transactions 11-{T - 6} of the history shown)")
    e = by["errors"]  # the Bad CVV on T-5 opens the errors window: T-5..T-2, 32 minutes before the query
    assert e.numbers["n_errors"] == 1 and e.numbers["n_window"] == 4 and e.numbers["errors"] == "Bad CVV"
    assert e.numbers["span_minutes"] == pytest.approx(32)
    a = by["amount"]
    amt = rows["amount"].to_numpy()
    assert a.numbers["median_window"] == pytest.approx(np.median(amt[T - 6:T - 1]))
    assert a.numbers["median_before"] == pytest.approx(np.median(amt[:T - 6]))
    assert a.numbers["ratio"] == pytest.approx(np.median(amt[T - 6:T - 1]) / np.median(amt[:T - 6]))
    assert m.numbers["values_mcc"] == "5732, 5944" and m.numbers["n_new_mcc"] == 2  # new = first time in the history
    assert m.weight == pytest.approx(burst_values(ctx)[[T - 6, T - 5, T - 3, T - 2]].sum())  # each cited once
    # history reasons weigh the sum of their cited values (signed contribution towards fraud)
    v = burst_values(ctx)
    assert b.weight == pytest.approx(v[[T - 6, T - 5, T - 3, T - 2]].sum())
    assert ctx.transaction_ids[T - 4] not in {t for r in by.values() for t in r.transaction_ids}


def test_only_values_positive_beyond_their_error_are_cited():
    ctx = demo_ctx()
    T = ctx.T
    v = burst_values(ctx)
    se = np.full(T, 0.1)
    se[T - 6] = 0.5  # 0.9 < 2 x 0.5: not beyond its error
    e = shap_like(ctx, v, se)
    assert sorted(citable_positions(e, top_k=10).tolist()) == [T - 5, T - 3, T - 2]  # 0.05 on row 3: < 0.2
    reasons = reason_codes(ctx, {"shap": e}, max_reasons=20)
    assert ctx.transaction_ids[T - 6] not in {t for r in reasons for t in r.transaction_ids}
    burst = next(r for r in reasons if r.kind == "burst")
    assert burst.numbers["n_transactions"] == 5  # from T-5 to the query


def test_query_fields_are_reasons_weighed_by_their_field_attribution():
    ctx = demo_ctx()
    T, rows = ctx.T, ctx.rows
    ex = {"shap": shap_like(ctx, burst_values(ctx)),
          "integrated_gradients": field_expl(ctx, {"amount": 3.5, "errors": 1.0, "merchant": -0.5, "mcc": 0.2})}
    reasons = reason_codes(ctx, ex, top_k=4, max_reasons=20)
    by = {r.kind: r for r in reasons}
    amt = rows["amount"].to_numpy()
    qa = by["query_amount"]
    med = float(np.median(amt[:T - 1][amt[:T - 1] > 0]))
    assert qa.numbers["median_before"] == pytest.approx(med) and qa.numbers["ratio"] == pytest.approx(301.0 / med)
    assert qa.text.startswith(f"this transaction's amount, 301.00 USD, is {301.0 / med:.1f}x the card's median")
    assert qa.transaction_ids == [ctx.query_transaction_id] and qa.weight == pytest.approx(3.5)
    assert by["query_errors"].text == "this transaction had an authorisation error (Bad CVV)"
    assert by["query_errors"].weight == pytest.approx(1.0)
    # the query's merchant is new, but its field pushed towards legitimate: not named; its new MCC is
    new = by["query_new_values"]
    assert "merchant" not in new.numbers["new_fields"].split(", ") and new.numbers["value_mcc"] == "5946"
    assert new.numbers["new_fields"] == "mcc" and new.text.startswith("the card's first transaction at this merchant category 5946 in ")
    assert new.weight == pytest.approx(0.2)
    assert sum(r.kind.startswith("query_new") for r in reasons) == 1  # one reason for all new values
    weights = [r.weight for r in reasons]
    assert weights == sorted(weights, reverse=True) and reasons[0].kind == "query_amount"
    assert summary_text(reasons).endswith(".") and summary_text([]) == ""


def test_without_field_values_query_facts_come_last_unweighed():
    ctx = demo_ctx()
    reasons = reason_codes(ctx, {"shap": shap_like(ctx, burst_values(ctx))}, top_k=4, max_reasons=20)
    kinds = [r.kind for r in reasons]
    first_query = kinds.index("query_amount")
    assert all(r.about == "history" for r in reasons[:first_query])
    assert all(r.about == "query" and math.isnan(r.weight) and r.numbers["weight_known"] == 0
               for r in reasons[first_query:])
    assert reasons[0].to_dict()["weight"] == pytest.approx(reasons[0].weight)
    assert reasons[-1].to_dict()["weight"] is None
    with pytest.raises(ValueError, match="method"):
        reason_codes(ctx, {"attention": shap_like(ctx, burst_values(ctx))})


def test_nothing_positive_gives_only_query_facts():
    ctx = demo_ctx()
    reasons = reason_codes(ctx, {"occlusion": shap_like(ctx, -np.ones(ctx.T))}, max_reasons=20)
    assert reasons and all(r.about == "query" for r in reasons)


def test_first_seen_marks_values_absent_from_every_earlier_row():
    got = first_seen(np.array(["a", "b", "a", "<empty>", "c", "b"]), "<empty>")
    assert got.tolist() == [False, True, False, False, True, False]


def test_small_test_charges_days_before_are_a_reason():
    fr = demo_like_frame()
    card = fr[fr.entity_id == "0:0"].copy()
    # two tiny charges at new merchants 3 days before the burst, then 4 ordinary purchases
    t = pd.to_datetime(card["timestamp"]).iloc[-6] - pd.Timedelta(days=3)
    extra = card.iloc[:2].copy()
    extra["timestamp"] = [t, t + pd.Timedelta(minutes=2)]
    extra["amount"] = [1.25, 0.75]
    extra["merchant"] = ["777", "778"]
    extra["transaction_id"] = ["t1", "t2"]
    extra["row_number"] = [900, 901]
    fr2 = pd.concat([fr, extra]).sort_values(["entity_id", "timestamp", "row_number"]).reset_index(drop=True)
    spec = load_spec("demo")
    enc = FeatureEncoder.fit(fr2, spec)
    model = build_model(enc, seed=0, d_model=8, n_heads=2, n_layers=1, d_ff=8, dropout=0.0,
                        context_length=32, min_history=8).eval()
    qid = fr2.loc[fr2.entity_id == "0:0", "transaction_id"].iloc[-1]
    ctx = build_context(ModelBundle(model=model, encoder=enc, spec=spec), fr2, qid)
    v = np.zeros(ctx.T)
    pos = [ctx.transaction_ids.index(t) for t in ("t1", "t2")]
    v[pos] = [1.5, 1.2]
    # a model whose logit is the sum of per-transaction weights: removing t1 / t2 *raises* the score,
    # so the test_then_purchase pattern (engine/trust/patterns.py) does not hold and small_charges stays
    w = torch.zeros(ctx.T, dtype=torch.float64)
    w[pos] = -0.5
    ctx.logits = lambda present=None: ((torch.ones(1, ctx.T, dtype=torch.bool) if present is None else present)
                                       .double() * w).sum(1)
    reasons = reason_codes(ctx, {"shap": shap_like(ctx, v)}, max_reasons=20)
    assert "test_then_purchase" not in {r.kind for r in reasons}
    assert reasons[0].kind == "small_charges" and set(reasons[0].transaction_ids) == {"t1", "t2"}
    ts = pd.to_datetime(ctx.rows["timestamp"])
    span = (ts.iloc[-1] - ts.iloc[pos[0]]).total_seconds() / 60
    assert reasons[0].numbers["span_minutes"] == pytest.approx(span)
    assert reasons[0].text.startswith("2 small charges (0.75 USD, 1.25 USD) at merchants new to the card, ") or \
        reasons[0].text.startswith("2 small charges (1.25 USD, 0.75 USD) at merchants new to the card, ")
    one = v.copy()
    one[pos[1]] = -1.2  # only t1 cited: one charge, one merchant (the trial read "1 small charge ... at merchants")
    small = next(r for r in reason_codes(ctx, {"shap": shap_like(ctx, one)}, max_reasons=20) if r.kind == "small_charges")
    assert small.text.startswith("1 small charge (") and " at a merchant new to the card, " in small.text
    # removing them lowers the score: the pattern reason holds, cites both and the query, and replaces small_charges
    w[pos] = 0.5
    by = {r.kind: r for r in reason_codes(ctx, {"shap": shap_like(ctx, v)}, max_reasons=20)}
    assert set(by["test_then_purchase"].transaction_ids) == {"t1", "t2", ctx.query_transaction_id}
    assert by["test_then_purchase"].numbers["deletion_logit"] == pytest.approx(1.0) and "small_charges" not in by


def test_reasons_on_the_trained_model_cite_citable_transactions_and_true_numbers():
    n_reasons = 0
    for qid in positive_queries(max_position=15)[:6]:
        ctx = context(qid)
        ex = explain_all(ctx, ["integrated_gradients", "shap"], shap_samples=128)
        for method in ("integrated_gradients", "shap"):
            reasons = reason_codes(ctx, ex, method=method, top_k=3, max_reasons=10)
            allowed = {ctx.transaction_ids[j] for j in citable_positions(ex[method], 3)} | {ctx.query_transaction_id}
            ts = pd.to_datetime(ctx.rows["timestamp"]).reset_index(drop=True)
            for r in reasons:
                n_reasons += 1
                if r.about == "pattern":  # cites by its own evidence: its deletion effect is recomputed
                    assert r.kind == "test_then_purchase" and r.transaction_ids[-1] == ctx.query_transaction_id
                    drop = torch.ones(1, ctx.T, dtype=torch.bool)
                    drop[0, [ctx.transaction_ids.index(t) for t in r.transaction_ids[:-1]]] = False
                    assert r.numbers["deletion_logit"] == pytest.approx(ctx.score_logit() - float(ctx.logits(drop)[0]))
                    continue
                assert set(r.transaction_ids) <= allowed, (r, allowed)
                assert r.weight > 0 or math.isnan(r.weight)
                if r.kind == "burst":
                    first = min(ctx.transaction_ids.index(t) for t in r.transaction_ids)
                    n = int(((ts >= ts.iloc[first]) & (ts <= ts.iloc[-1])).sum())
                    assert r.numbers["n_transactions"] == n
                if r.about == "history":
                    pos = [ctx.transaction_ids.index(t) for t in r.transaction_ids]
                    assert r.weight == pytest.approx(float(ex[method].values[pos].sum()))
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
    ex = {"occlusion": shap_like(ctx, np.zeros(ctx.T)), "integrated_gradients": field_expl(ctx, {"terminal_risk": 2.0})}
    by = {r.kind: r for r in reason_codes(ctx, ex, top_k=3, max_reasons=10)}
    run = by["terminal_risk_run"]
    assert run.numbers["run_length"] == 5 and run.numbers["run_days"] == pytest.approx(12 - 2 / 24)
    assert run.transaction_ids == ["r21"] and run.weight == pytest.approx(2.0)
    assert run.text.startswith("this transaction's terminal: its last 5 known transactions were all frauds")


def test_new_values_are_no_reason_where_new_values_are_the_card_s_habit():
    """A card whose every earlier transaction was at a new merchant: "5 of 5 were at new merchants"
    says nothing about this burst, so there is no new_values reason (the rest still fire)."""
    fr = demo_like_frame()
    card = fr["entity_id"] == "0:0"
    first20 = fr.index[card][:20]
    fr.loc[first20, "merchant"] = [f"m{i}" for i in range(20)]  # 20 distinct merchants: all new
    fr.loc[first20, "mcc"] = [f"{5000 + i}" for i in range(20)]
    spec = load_spec("demo")
    enc = FeatureEncoder.fit(fr, spec)
    model = build_model(enc, seed=0, d_model=8, n_heads=2, n_layers=1, d_ff=8, dropout=0.0,
                        context_length=32, min_history=8).eval()
    qid = fr.loc[card, "transaction_id"].iloc[-1]
    ctx = build_context(ModelBundle(model=model, encoder=enc, spec=spec), fr, qid)
    kinds = {r.kind for r in reason_codes(ctx, {"shap": shap_like(ctx, burst_values(ctx))}, top_k=4, max_reasons=20)}
    assert "new_values" not in kinds and "burst" in kinds


def test_new_values_over_a_long_quiet_span_are_no_reason():
    """A cited transaction at a new merchant long before the burst opens a span in which few
    transactions were at new values: "3 of the 20 transactions in 8 days" is no reason."""
    ctx = demo_ctx()
    T = ctx.T
    v = burst_values(ctx)
    v[T - 6:T - 1] = 0.0  # the burst is not cited: only row 1 (a first visit) and row 2
    v[1], v[2] = 0.9, 0.8
    kinds = {r.kind for r in reason_codes(ctx, {"shap": shap_like(ctx, v)}, top_k=4, max_reasons=20)}
    assert "new_values" not in kinds


def test_a_short_history_gives_no_new_values_reason():
    """With 14 normal rows only 4 positions before the burst have NOVELTY_MIN_BEFORE (10) earlier rows,
    below NOVELTY_MIN_COMPARED (5): no comparison, so "5 of the 5 were at new merchants" is no reason
    (the first transactions of any history are at new values); with 15 (5 such positions) the same
    burst is one, its share before recomputed over those 5."""
    from engine.trust.reasons import NOVELTY_MIN_BEFORE, NOVELTY_MIN_COMPARED

    def kinds(n_normal):
        ctx = demo_ctx(n_normal)
        rs = reason_codes(ctx, {"shap": shap_like(ctx, burst_values(ctx))}, top_k=4, max_reasons=20)
        return {r.kind: r for r in rs}

    assert (NOVELTY_MIN_BEFORE, NOVELTY_MIN_COMPARED) == (10, 5)
    short, enough = kinds(14), kinds(15)
    assert "new_values" not in short and "burst" in short  # the rest still fire
    r = enough["new_values"]
    assert r.numbers["n_new_merchant"] == 5 and r.numbers["new_share_before"] is not None
    assert r.text.endswith("of its transactions 11-15 of the history shown)")


def test_an_amount_ratio_needs_a_median_over_enough_purchases():
    """Fewer than MEDIAN_MIN_PURCHASES (5) earlier purchases are no habit: with 4 purchases before the
    cited burst the span's amounts are no reason, with 5 they are (median recomputed over those 5);
    a 301.00 query after 4 purchases of 35-65 gets no amount reason, after 5 it does."""
    from engine.trust.reasons import MEDIAN_MIN_PURCHASES

    assert MEDIAN_MIN_PURCHASES == 5

    def reasons(ctx, v, fq):
        ex = {"shap": shap_like(ctx, v), "integrated_gradients": field_expl(ctx, fq)}
        return {r.kind: r for r in reason_codes(ctx, ex, top_k=6, max_reasons=20)}

    def burst_cited(ctx):
        v = np.zeros(ctx.T)
        v[ctx.T - 6:ctx.T - 1] = 0.5
        return v

    few, enough = demo_ctx(4), demo_ctx(5)
    assert "amount" not in reasons(few, burst_cited(few), {})
    a = reasons(enough, burst_cited(enough), {})["amount"]
    amt = enough.rows["amount"].to_numpy()
    assert a.numbers["n_before"] == 5 and a.numbers["median_before"] == pytest.approx(np.median(amt[:5]))

    def query_only(n_normal):  # the burst's last row (301.00, online) right after the normal purchases
        fr = demo_like_frame(n_normal)
        card = fr.index[fr["entity_id"] == "0:0"]
        return demo_ctx(fr=fr.drop(card[n_normal:n_normal + 5]).reset_index(drop=True), min_history=2)

    fq = {"amount": 2.0, "amount_vs_history": 0.5}
    few, enough = query_only(4), query_only(5)
    assert few.rows["amount"].iloc[-1] == 301.0 and few.T == 5
    assert "query_amount" not in reasons(few, np.zeros(few.T), fq)
    qa = reasons(enough, np.zeros(enough.T), fq)["query_amount"]
    amt = enough.rows["amount"].to_numpy()
    assert qa.numbers["n_before"] == 5 and qa.numbers["ratio"] == pytest.approx(301.0 / np.median(amt[:5]))


def test_new_values_say_when_the_history_shown_is_cut():
    """New-user trial: "the card's first transaction at this merchant in 89 earlier transactions"
    read as absolute, though the card had 377 and had used the merchant 6 times before the model's
    window. With older transactions outside the context the reason says so, and counts them."""
    fr = demo_like_frame(60)
    ctx = demo_ctx(fr=fr)
    card = fr[fr.entity_id == "0:0"]
    older = int((pd.to_datetime(card["timestamp"]) < pd.to_datetime(ctx.rows["timestamp"]).iloc[0]).sum())
    assert ctx.n_before_context == older > 0
    ex = {"shap": shap_like(ctx, burst_values(ctx)),
          "integrated_gradients": field_expl(ctx, {"amount": 3.5, "mcc": 0.2})}
    new = {r.kind: r for r in reason_codes(ctx, ex, top_k=4, max_reasons=20)}["query_new_values"]
    q = ctx.T - 1
    assert new.text == (f"the card's first transaction at this merchant and merchant category 5946 in its last {q} transactions "
                        f"(the {older} older ones are not in the history shown)")
    assert new.numbers["n_older"] == older and new.numbers["n_before"] == q
    short = demo_ctx()  # the whole history fits the context: no such clause
    assert short.n_before_context == 0


@pytest.mark.parametrize("cols,noun", [(["cc_num"], "card"), (["User", "Card"], "card"), (["pan"], "card"),
                                       (["CUSTOMER_ID"], "customer"), (["client_id"], "customer"),
                                       (["acct"], "account"), (["nameOrig"], "account")])
def test_the_entity_is_named_by_its_columns(cols, noun):
    from types import SimpleNamespace

    from engine.trust.reasons import _entity_noun

    assert _entity_noun(SimpleNamespace(entity=SimpleNamespace(columns=cols))) == noun


def test_the_reason_audit_checks_the_cut_history_clause():
    from engine.trust.reason_audit import audit_reasons

    fr = demo_like_frame(60)
    ctx = demo_ctx(fr=fr)
    ex = {"shap": shap_like(ctx, burst_values(ctx)),
          "integrated_gradients": field_expl(ctx, {"amount": 3.5, "mcc": 0.2})}
    reasons = reason_codes(ctx, ex, top_k=4, max_reasons=20)
    res = audit_reasons(ctx, reasons, ex, frame=fr)
    mine = res[res["kind"] == "query_new_values"]
    assert len(mine) and mine["ok"].all(), mine.to_dict("records")
    import dataclasses

    bad = [dataclasses.replace(r, numbers={**r.numbers, "n_older": 3}) if r.kind == "query_new_values" else r
           for r in reasons]
    res = audit_reasons(ctx, bad, ex, frame=fr)
    assert not res.loc[res["kind"] == "query_new_values", "ok"].all()
