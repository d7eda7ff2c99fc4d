"""Pattern reasons (engine/trust/patterns.py, engine/trust/common_point.py): a test charge before a
large card-not-present purchase and a common point of compromise. Every number is recomputed from
the data; each reason has cases that must not get it; the query entity's own label is never used."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import binom

from engine.data.features import FeatureEncoder
from engine.data.spec import load_spec
from engine.explain.base import Explanation
from engine.explain.context import build_context
from engine.model.checkpoint import ModelBundle, build_model
from engine.trust.common_point import context_visit_facts, fraud_onsets, visit_facts
from engine.trust.planted import names_pattern
from engine.trust.reasons import Reason, reason_codes
from trust_helpers import two_card_frame

T0 = pd.Timestamp("2023-03-01 09:00")


def card_frame(query_amount=640.0, query_online=True, charge_merchant="777", query_merchant="950") -> pd.DataFrame:
    """Card 0:0: 20 in-person purchases at 3 Boston merchants (35-65 USD), a 1.25 USD online
    charge at ``charge_merchant`` 64 hours before the query, 4 more ordinary purchases, then the
    query. Card 0:1: filler."""
    rng = np.random.default_rng(0)
    n = 25
    ts = [T0 + pd.Timedelta(hours=10 * i) for i in range(n)]
    f = pd.DataFrame({"timestamp": ts, "amount": np.round(rng.uniform(35, 65, n), 2),
                      "merchant": rng.choice(["111", "222", "333"], n), "merchant_city": "Boston",
                      "merchant_state": "MA", "zip": "02108", "mcc": "5411", "use_chip": "Chip Transaction",
                      "errors": ""})
    f.loc[20, ["amount", "merchant", "merchant_city", "merchant_state", "zip", "use_chip", "mcc"]] = \
        [1.25, charge_merchant, "ONLINE", "<empty>", "<empty>", "Online Transaction", "5815"]
    q = {"timestamp": ts[-1] + pd.Timedelta(days=1), "amount": query_amount, "merchant": query_merchant,
         "merchant_city": "ONLINE" if query_online else "Boston", "merchant_state": "<empty>" if query_online else "MA",
         "zip": "<empty>" if query_online else "02108", "mcc": "5732",
         "use_chip": "Online Transaction" if query_online else "Chip Transaction", "errors": ""}
    return two_card_frame(pd.concat([f, pd.DataFrame([q])], ignore_index=True), f)


def linear_ctx(fr: pd.DataFrame, weights: dict[str, float], base: float = 0.5):
    """The context of card 0:0's last transaction, with a model whose logit is ``base`` plus the
    weight of every present transaction (so every deletion effect is known exactly)."""
    spec = load_spec("demo")
    enc = FeatureEncoder.fit(fr, spec)
    model = build_model(enc, seed=0, d_model=8, n_heads=2, n_layers=1, d_ff=8, dropout=0.0,
                        context_length=32, min_history=8).eval()
    qid = fr.loc[fr.entity_id == "0:0", "transaction_id"].iloc[-1]
    ctx = build_context(ModelBundle(model=model, encoder=enc, spec=spec), fr, qid)
    w = torch.tensor([weights.get(t, 0.0) for t in ctx.transaction_ids], dtype=torch.float64)

    def logits(present=None):
        p = torch.ones(1, ctx.T, dtype=torch.bool) if present is None else present
        return base + (p.double() * w).sum(1)

    ctx.logits = logits
    return ctx


def expl(ctx, values, query_fields: dict | None = None) -> dict[str, Explanation]:
    """An occlusion-like ranking explanation and, with ``query_fields``, per-field values of the query."""
    out = {"occlusion": Explanation(method="occlusion", entity_id=ctx.entity_id,
                                    transaction_ids=list(ctx.transaction_ids),
                                    query_transaction_id=ctx.query_transaction_id,
                                    values=np.asarray(values, float), units="logit", signed=True, baseline="test",
                                    params={}, score_logit=0.0)}
    if query_fields is not None:
        names = list(ctx.field_names)
        fv = np.zeros((ctx.T, len(names)))
        for k, v in query_fields.items():
            fv[-1, names.index(k)] = v
        out["integrated_gradients"] = Explanation(
            method="integrated_gradients", entity_id=ctx.entity_id, transaction_ids=list(ctx.transaction_ids),
            query_transaction_id=ctx.query_transaction_id, values=fv.sum(1), units="logit", signed=True,
            baseline="test", params={}, score_logit=0.0, field_values=fv, field_names=names)
    return out


CHARGE = "r21"  # card 0:0's 21st row: the 1.25 USD charge
QF = {"amount": 1.0, "amount_vs_history": 0.5, "use_chip": 0.25, "merchant": 0.2, "first_seen": 0.05}


def test_test_then_purchase_numbers_recomputed_from_the_data():
    fr = card_frame()
    ctx = linear_ctx(fr, {CHARGE: 0.8})
    v = np.zeros(ctx.T)
    v[-6] = 0.01  # the ranking method barely sees the charge: the pattern is weighed by its deletion effect
    reasons = reason_codes(ctx, expl(ctx, v, QF), max_reasons=20)
    by = {r.kind: r for r in reasons}
    r = by["test_then_purchase"]
    rows = ctx.rows.reset_index(drop=True)
    amt = rows["amount"].to_numpy()
    med = float(np.median(amt[:-1][amt[:-1] > 0]))
    p = ctx.transaction_ids.index(CHARGE)
    assert r.transaction_ids == [CHARGE, ctx.query_transaction_id] and r.about == "pattern"
    assert r.numbers["median_before"] == pytest.approx(med) and r.numbers["ratio"] == pytest.approx(640.0 / med)
    assert r.numbers["n_between"] == ctx.T - 1 - p - 1 == 4
    ts = pd.to_datetime(rows["timestamp"])
    assert r.numbers["span_minutes"] == pytest.approx((ts.iloc[-1] - ts.iloc[p]).total_seconds() / 60)
    assert r.numbers["deletion_logit"] == pytest.approx(0.8)
    assert r.numbers["online"] and r.numbers["new_merchant"]
    # query part: amount + amount_vs_history + use_chip + merchant + first_seen (recent_activity 0)
    assert r.numbers["query_field_weight"] == pytest.approx(2.0) and r.weight == pytest.approx(2.8)
    pw, pwo = ctx.bundle.probability(np.array([ctx.score_logit(), ctx.score_logit() - 0.8]))
    assert (r.numbers["probability_with"], r.numbers["probability_without"]) == (pytest.approx(pw), pytest.approx(pwo))
    assert r.text.startswith(f"1 small charge (1.25 USD) at a merchant new to the card, 2.7 days (4 transactions) "
                             f"before this 640.00 USD online purchase at a merchant new to the card ({640 / med:.1f}x")
    # it states the query's amount / online / new merchant facts: those reasons are not repeated
    assert not {"query_amount", "query_online", "small_charges"} & set(by)
    # the query's new MCC is not stated by the pattern, but its only weight would be first_seen, which the
    # pattern already weighs (the mcc field itself has 0 here): no second reason from the same attribution
    assert "query_new_values" not in by
    assert reasons[0].kind == "test_then_purchase"


@pytest.mark.parametrize("case", ["charge raises nothing", "small query", "known merchant", "in person, known merchant"])
def test_test_then_purchase_must_not_fire(case):
    kw = {"small query": {"query_amount": 70.0}, "known merchant": {"charge_merchant": "111"},
          "in person, known merchant": {"query_online": False, "query_merchant": "222"}}.get(case, {})
    fr = card_frame(**kw)
    ctx = linear_ctx(fr, {CHARGE: -0.3 if case == "charge raises nothing" else 0.8})
    kinds = [r.kind for r in reason_codes(ctx, expl(ctx, np.zeros(ctx.T), QF), max_reasons=20)]
    assert "test_then_purchase" not in kinds


def test_names_pattern_needs_the_pattern_kind_and_a_cause_row():
    def R(kind, ids):
        return Reason(kind, "", ids, [], {}, 1.0)

    cause = {"c1"}
    assert names_pattern([R("test_then_purchase", ["c1", "q"]), R("burst", ["x"])], "tested_then_cnp", cause)
    assert names_pattern([R("burst", ["x"]), R("small_charges", ["c1"])], "tested_then_cnp", cause)
    # a reason of another kind that cites the cause among others does not name the pattern
    assert not names_pattern([R("new_merchant", ["c1", "x", "y"]), R("query_amount", ["q"])], "tested_then_cnp", cause)
    assert not names_pattern([R("burst", ["x"]), R("new_mcc", ["y"]), R("test_then_purchase", ["c1"])],
                             "tested_then_cnp", cause)  # third
    assert not names_pattern([R("test_then_purchase", ["x", "q"])], "tested_then_cnp", cause)  # another charge
    assert not names_pattern([R("test_then_purchase", ["c1"])], "compromised_merchant", cause)
    assert names_pattern([R("common_point", ["c1"])], "compromised_merchant", cause)


# ------------------------------------------------------------------------------ common point
DAY0 = pd.Timestamp("2023-06-01")


def cpp_frame(n_fraud_visitors=4, own_label=0, fraud_delay_days=20) -> pd.DataFrame:
    """Query card Q visits merchant M on day 10 (and merchants A/B every day); five other cards
    V0..V4 visit M on days 8..12, ``n_fraud_visitors`` of them have a fraud ``fraud_delay_days``
    after; 100 cards C* shop at A/B on days 3..17, C0 and C1 with a fraud 15 days later. Q's
    query on day 30 (labelled ``own_label``)."""
    rows = []  # entity, timestamp, merchant, label
    for d in range(0, 31):
        rows.append(("Q", DAY0 + pd.Timedelta(days=d, hours=12), "A" if d % 2 else "B", 0))
    rows.append(("Q", DAY0 + pd.Timedelta(days=10, hours=15), "M", 0))
    rows[-2] = ("Q", rows[-2][1], rows[-2][2], own_label)  # the query (day 30)
    for i in range(5):
        t = DAY0 + pd.Timedelta(days=8 + i, hours=11)
        rows.append((f"V{i}", t, "M", 0))
        rows.append((f"V{i}", t + pd.Timedelta(days=1), "A", 0))
        if i < n_fraud_visitors:
            rows.append((f"V{i}", t + pd.Timedelta(days=fraud_delay_days), "Z", 1))
    for j in range(100):
        t = DAY0 + pd.Timedelta(days=3 + j % 15, hours=10)
        rows.append((f"C{j}", t, "A" if j % 2 else "B", 0))
        if j < 2:
            rows.append((f"C{j}", t + pd.Timedelta(days=15), "Z", 1))
    f = pd.DataFrame(rows, columns=["entity_id", "timestamp", "merchant", "label"])
    f["label"] = f["label"].astype("Int8")
    f = f.sort_values(["entity_id", "timestamp"]).reset_index(drop=True)
    f.insert(0, "row_number", np.arange(1, len(f) + 1))
    f.insert(1, "transaction_id", [f"t{i}" for i in range(len(f))])
    return f


def test_visit_facts_recomputed():
    f = cpp_frame()
    q_time = f.loc[f.entity_id == "Q", "timestamp"].max()
    facts = visit_facts(f, "merchant", "Q", q_time)
    m = next(x for x in facts if x["point"] == "M")
    visit = f[(f.entity_id == "Q") & (f.merchant == "M")]
    assert m["transaction_id"] == visit["transaction_id"].iloc[0] and m["visit_time"] == visit["timestamp"].iloc[0]
    # visitors: V0..V4 within 7 days of day 10; 4 had fraud 20 days later (within 60)
    assert (m["n_visitors"], m["n_later_fraud"]) == (5, 4)
    # active on days 3..17 (other than Q): V0..V4 and the 100 C cards; fraud within 60 days: V0..V3, C0, C1
    assert (m["n_active"], m["n_active_fraud"]) == (105, 6)
    r0 = (6 + 0.5) / (105 + 1)
    assert m["base_rate"] == pytest.approx(r0) and m["rate_ratio"] == pytest.approx(0.8 / r0)
    assert m["p_value"] == pytest.approx(binom.sf(3, 5, r0))
    # visits tested: Q's point-days in the 60 days before the query with another visitor (A and B too)
    assert m["n_tested"] == len(facts) and m["p_adjusted"] == pytest.approx(min(1, m["p_value"] * len(facts)))
    assert facts[0]["point"] == "M"  # smallest p-value first


def test_query_entity_own_label_is_never_used():
    f0, f1 = cpp_frame(own_label=0), cpp_frame(own_label=1)
    q = f0.loc[f0.entity_id == "Q", "timestamp"].max()
    assert "Q" in fraud_onsets(f1).index
    a = visit_facts(f0, "merchant", "Q", q)
    b = visit_facts(f1, "merchant", "Q", q)
    assert a == b
    # Q confirmed as fraud by a disposition: no change either
    assert visit_facts(f0, "merchant", "Q", q, confirmed={"Q": f0.loc[f0.entity_id == "Q", "transaction_id"].iloc[0]}) == a


@pytest.mark.parametrize("n_fraud,delay,expect", [(4, 20, True), (0, 20, False), (4, 90, False), (1, 20, False)])
def test_common_point_reason_and_cases_that_must_not_get_it(n_fraud, delay, expect):
    """Reason: 4 of 5 visitors with fraud 20 days later. Not: no visitor fraud; frauds 90 days
    later (outside the 60-day follow-up); one visitor with fraud (not significant after Bonferroni)."""
    from engine.cases.links import case_reason_codes

    f = cpp_frame(n_fraud_visitors=n_fraud, fraud_delay_days=delay)
    spec = load_spec("demo")
    full = f.assign(amount=30.0, merchant_city="Boston", merchant_state="MA", zip="02108", mcc="5411",
                    use_chip="Chip Transaction", errors="")
    enc = FeatureEncoder.fit(full, spec)
    model = build_model(enc, seed=0, d_model=8, n_heads=2, n_layers=1, d_ff=8, dropout=0.0,
                        context_length=64, min_history=8).eval()
    qid = full.loc[full.entity_id == "Q", "transaction_id"].iloc[-1]
    ctx = build_context(ModelBundle(model=model, encoder=enc, spec=spec), full, qid)
    reasons = case_reason_codes(ctx, expl(ctx, np.zeros(ctx.T)), full, max_reasons=20)
    got = [r for r in reasons if r.kind == "common_point"]
    assert bool(got) == expect
    if expect:
        r = got[0]
        facts = context_visit_facts(full, ctx)
        m = next(x for x in facts if x["point"] == "M")
        assert r.transaction_ids == [m["transaction_id"]] and r.about == "pattern"
        # the lower 95 % Clopper-Pearson bound of 4/5, found directly: P(X >= 4 | n = 5, p) = 0.025
        p_low = brentq(lambda p: binom.sf(3, 5, p) - 0.025, 1e-9, 1 - 1e-9)
        assert r.weight == pytest.approx(math.log(p_low / m["base_rate"]), rel=1e-6)
        assert r.numbers["log_rate_ratio_lower95"] == r.weight
        assert r.numbers["n_later_fraud"] == 4 and r.numbers["n_visitors"] == 5 and r.numbers["n_active"] == 105
        assert r.text.startswith(f"on {m['visit_time']:%Y-%m-%d} the card used merchant M; 4 of the 5 other cards "
                                 "that used it within 7 days of that visit had fraud in the 60 days after (80%, "
                                 f"against {100 * m['base_rate']:.1f}% of the 105 other cards active")
        assert reasons[0].kind == "common_point"  # the only weighed reason here (occlusion all zero)


def test_base_rate_counts_match_a_direct_computation_and_ties_are_not_later():
    """n_active / n_active_fraud (vectorised over days) against plain pandas per window; an entity
    whose first transaction in the window *is* its first fraud is active, not a later fraud."""
    f = cpp_frame()
    tie = pd.DataFrame({"entity_id": ["S"], "timestamp": [DAY0 + pd.Timedelta(days=9, hours=8)], "merchant": ["A"],
                        "label": pd.array([1], dtype="Int8")})
    f = pd.concat([f, tie.assign(row_number=len(f) + 1, transaction_id="tS")], ignore_index=True)
    q = f.loc[f.entity_id == "Q", "timestamp"].max()
    on = fraud_onsets(f)
    for x in visit_facts(f, "merchant", "Q", q):
        d = x["visit_time"].normalize()
        w = f[(f.entity_id != "Q") & (f.timestamp >= d - pd.Timedelta(days=7)) & (f.timestamp < d + pd.Timedelta(days=8))]
        first = w.groupby("entity_id")["timestamp"].min()
        o = pd.to_datetime(pd.Series(first.index.map(on), index=first.index))
        later = int(((o > first) & (o <= first + pd.Timedelta(days=60))).sum())
        assert (x["n_active"], x["n_active_fraud"]) == (len(first), later)
    m = next(x for x in visit_facts(f, "merchant", "Q", q) if x["point"] == "M")
    assert (m["n_active"], m["n_active_fraud"]) == (106, 6)  # S is active, its fraud is not "later"


def test_visit_facts_without_any_fraud_label():
    """No fraud entity at all (e.g. a short slice): facts with k = 0 and p = 1, no reason."""
    f = cpp_frame(n_fraud_visitors=0)
    f["label"] = pd.array(np.zeros(len(f), dtype=np.int8), dtype="Int8")
    facts = visit_facts(f, "merchant", "Q", f.loc[f.entity_id == "Q", "timestamp"].max())
    assert facts and all(x["n_later_fraud"] == 0 and x["n_active_fraud"] == 0 and x["p_value"] == 1.0 for x in facts)


def test_common_point_weight_is_the_lower_bound_and_refuses_nonsense():
    from engine.trust.patterns import common_point_weight

    for k, n in ((1, 1), (3, 3), (2, 7), (5, 40)):
        p_low = brentq(lambda p: binom.sf(k - 1, n, p) - 0.025, 1e-12, 1 - 1e-12)
        assert common_point_weight(k, n, 0.012) == pytest.approx(math.log(p_low / 0.012), rel=1e-6)
    assert common_point_weight(3, 3, 0.012) > common_point_weight(1, 1, 0.012)  # more visitors, more support
    assert common_point_weight(0, 9, 0.012) == 0.0
    assert common_point_weight(1, 40, 0.5) < 0  # 1 of 40 against a 50 % base rate: no support
    with pytest.raises(ValueError, match="expected 0 <= k <= n"):
        common_point_weight(4, 3, 0.1)
    with pytest.raises(ValueError, match="base_rate"):
        common_point_weight(1, 3, 0.0)


def _keep_normal(fr: pd.DataFrame, keep: int, drop_after: int = 0) -> pd.DataFrame:
    """card_frame with only the last ``keep`` of card 0:0's 20 purchases before the charge, and the
    first ``drop_after`` of the 4 purchases after it removed (ids unchanged: CHARGE stays r21)."""
    card = fr.index[fr["entity_id"] == "0:0"]
    return fr.drop(list(card[:20 - keep]) + list(card[21:21 + drop_after])).reset_index(drop=True)


def test_test_then_purchase_needs_a_median_over_five_purchases():
    """4 positive amounts before the query (the charge included) are no habit: no pattern; with 5
    it fires and states n_before 5."""
    few = linear_ctx(_keep_normal(card_frame(), 1, drop_after=2), {CHARGE: 0.8})
    enough = linear_ctx(_keep_normal(card_frame(), 1, drop_after=1), {CHARGE: 0.8})
    for ctx, n in ((few, 4), (enough, 5)):
        amt = ctx.rows["amount"].to_numpy()[:-1]
        assert (amt > 0).sum() == n and CHARGE in ctx.transaction_ids
    v = np.zeros(few.T)
    assert "test_then_purchase" not in {r.kind for r in reason_codes(few, expl(few, v, QF), max_reasons=20)}
    by = {r.kind: r for r in reason_codes(enough, expl(enough, np.zeros(enough.T), QF), max_reasons=20)}
    assert by["test_then_purchase"].numbers["n_before"] == 5


def test_small_charges_need_a_median_over_five_purchases_before_the_charge():
    """The history reason (the query is no large purchase, so no pattern absorbs it): a charge with
    4 purchases before it is not "small" against a habit; with 5 it is."""
    for keep, expect in ((4, False), (5, True)):
        ctx = linear_ctx(_keep_normal(card_frame(query_amount=50.0), keep), {CHARGE: 0.8})
        v = np.zeros(ctx.T)
        v[ctx.transaction_ids.index(CHARGE)] = 0.9
        kinds = {r.kind: r for r in reason_codes(ctx, expl(ctx, v, QF), max_reasons=20)}
        assert ("small_charges" in kinds) == expect, (keep, list(kinds))
        if expect:
            r = kinds["small_charges"]
            assert r.transaction_ids == [CHARGE] and r.numbers["n_small"] == 1
