"""The reason-code audit recomputes every number from the rows: the reasons of the reason module
pass it, and a reason whose count, ratio, citation or rank is altered fails it."""

import dataclasses

import numpy as np
import pytest
from test_trust_reasons import burst_values, demo_ctx, field_expl, shap_like
from trust_helpers import one_torch_thread  # noqa: F401

from engine.trust.reason_audit import audit_markdown, audit_reasons
from engine.trust.reasons import reason_codes


@pytest.fixture(scope="module")
def case():
    ctx = demo_ctx()
    ex = {"shap": shap_like(ctx, burst_values(ctx)),
          "integrated_gradients": field_expl(ctx, {"amount": 3.5, "errors": 1.0, "merchant": 0.4, "use_chip": 0.3})}
    return ctx, ex, reason_codes(ctx, ex, top_k=4, max_reasons=20)


def failed(res):
    return res[res["ok"] == False]  # noqa: E712


def test_the_reason_module_s_reasons_pass_every_check(case):
    ctx, ex, reasons = case
    kinds = {r.kind for r in reasons}
    assert {"burst", "new_values", "errors", "amount", "query_amount", "query_errors", "query_new_values"} <= kinds
    res = audit_reasons(ctx, reasons, ex)
    assert failed(res).empty, failed(res).to_string()
    checked = res[res["check"].str.startswith("number")]
    assert len(checked) >= 25 and set(checked["kind"]) >= {"burst", "new_values", "errors", "amount", "query_amount"}
    md = audit_markdown(res.assign(query="q1"), 1)
    assert "Failed checks: 0 of" in md and "| burst | 1 |" in md
    assert "| (order of each case's list) | - (1 list) | 1 | 1 | 0 | 0 |" in md and "| (all) |" not in md


@pytest.mark.parametrize("kind,key,delta", [("burst", "n_transactions", -2), ("new_values", "n_new_merchant", -1),
                                            ("errors", "n_window", 1), ("amount", "ratio", 0.1),
                                            ("query_amount", "median_before", 1.0)])
def test_an_altered_number_fails(case, kind, key, delta):
    """"7 transactions in 38 minutes" when the card had 9: a count over the cited set, or any
    number off by a little, is a failed check naming the kind and the number."""
    ctx, ex, reasons = case
    bad = [dataclasses.replace(r, numbers={**r.numbers, key: r.numbers[key] + delta}) if r.kind == kind else r
           for r in reasons]
    f = failed(audit_reasons(ctx, bad, ex))
    # the number, and the text check where the altered number is a stated count (no longer in the text)
    assert (kind, f"number {key}") in set(zip(f["kind"], f["check"])) and set(f["kind"]) == {kind}
    assert set(f["check"]) <= {f"number {key}", f"text states {key}"}


@pytest.mark.parametrize("kind,old,new,check", [
    ("burst", "6 transactions", "7 transactions", "text states count and span"),
    ("amount", "x the card's earlier median", "1x the card's earlier median", "text states medians and ratio"),
    ("new_values", "5 were at merchants", "1 was at merchants", "text states n_new_merchant"),
    ("query_amount", "over 25 earlier", "over 24 earlier", "text states amount and ratio"),
    ("query_new_values", "5946", "5947", "text states value_mcc")])
def test_a_number_misstated_in_the_text_fails(case, kind, old, new, check):
    """The text is checked against fragments formatted from the recomputed values: a count, a
    ratio (5.5x -> 5.1x), a median or a value that the sentence misstates fails."""
    ctx, ex, reasons = case
    r = next(x for x in reasons if x.kind == kind)
    assert old in r.text, r.text
    bad = [dataclasses.replace(x, text=x.text.replace(old, new)) if x.kind == kind else x for x in reasons]
    f = failed(audit_reasons(ctx, bad, ex))
    assert list(zip(f["kind"], f["check"])) == [(kind, check)]


def test_an_altered_weight_fails(case):
    """The weight (the "+x logit" of the page) is recomputed: the cited values' sum for a history
    reason, the query's field attribution on the reason's fields for a query reason."""
    ctx, ex, reasons = case
    for kind, check in (("burst", "number weight (sum of the cited values)"),
                        ("query_amount", "number weight (query field attribution)")):
        bad = [dataclasses.replace(x, weight=x.weight * 1.5) if x.kind == kind else x for x in reasons]
        f = failed(audit_reasons(ctx, bad, ex))
        assert (kind, check) in set(zip(f["kind"], f["check"]))


def test_a_reason_the_audit_cannot_read_is_a_failed_check_not_a_crash(case):
    ctx, ex, reasons = case
    bad = [dataclasses.replace(reasons[0], numbers={}), dataclasses.replace(reasons[1], transaction_ids=["nope"])]
    f = failed(audit_reasons(ctx, bad + reasons[2:], ex))
    assert list(f["check"][:2]) == ["audit error", "audit error"]
    assert "nope" in f["got"].iloc[1]
    assert audit_reasons(ctx, reasons, {})["check"].tolist() == ["audit error"]  # no ranking method


def test_reasons_made_under_the_old_short_history_rules_fail(monkeypatch):
    """Reasons computed with the old rules (a median over 1 purchase; new values with nothing to
    compare with) are reported by the audit, which applies the current rules."""
    import engine.trust.reasons as rs

    few = demo_ctx(14)  # 4 positions to compare with, below NOVELTY_MIN_COMPARED
    ex = {"shap": shap_like(few, burst_values(few)), "integrated_gradients": field_expl(few, {"amount": 1.0})}
    with monkeypatch.context() as m:
        m.setattr(rs, "NOVELTY_MIN_COMPARED", 0)
        m.setattr(rs, "MEDIAN_MIN_PURCHASES", 1)
        old = [r for r in rs.reason_codes(few, ex, top_k=4, max_reasons=20) if r.kind == "new_values"]
    assert old and old[0].numbers["new_share_before"] == 0.0  # over 4 positions only
    f = failed(audit_reasons(few, old, ex))
    assert "compared with the share before the span (>= 5 positions)" in set(f["check"])
    ctx1 = demo_ctx(1)
    v = np.zeros(ctx1.T)
    v[ctx1.T - 6:ctx1.T - 1] = 0.5
    ex1 = {"shap": shap_like(ctx1, v), "integrated_gradients": field_expl(ctx1, {"amount": 1.0})}
    with monkeypatch.context() as m:
        m.setattr(rs, "MEDIAN_MIN_PURCHASES", 1)
        old = [r for r in rs.reason_codes(ctx1, ex1, top_k=6, max_reasons=20) if r.kind == "amount"]
    assert old and old[0].numbers["n_before"] == 1
    assert "median over >= 5 purchases" in set(failed(audit_reasons(ctx1, old, ex1))["check"])


def test_citing_a_transaction_that_pushed_towards_legitimate_fails(case):
    ctx, ex, reasons = case
    T = ctx.T
    neg = ctx.transaction_ids[T - 4]  # value -0.4 in burst_values
    bad = [dataclasses.replace(r, transaction_ids=sorted(r.transaction_ids + [neg])) if r.kind == "burst" else r
           for r in reasons]
    f = failed(audit_reasons(ctx, bad, ex))
    assert "cites only values positive beyond their error" in set(f["check"])
    # standard errors: a value below 2 SE is not citable either
    v = burst_values(ctx)
    se = np.where(np.arange(T) == T - 6, 0.6, 0.01)  # T-6 has value 0.9 < 2 x 0.6
    ex2 = {**ex, "shap": shap_like(ctx, v, se)}
    f2 = failed(audit_reasons(ctx, reasons, ex2))
    assert "cites only values positive beyond their error" in set(f2["check"])


def test_reasons_out_of_order_fail_the_ranking_check(case):
    ctx, ex, reasons = case
    weighed = [r for r in reasons if np.isfinite(r.weight)]
    assert len(weighed) >= 2 and weighed[0].weight > weighed[-1].weight
    f = failed(audit_reasons(ctx, weighed[::-1], ex))
    assert list(f["check"]) == ["ranked by signed contribution towards fraud"]


def test_pattern_reasons_are_recomputed_and_fail_when_altered():
    """test_then_purchase (median, ratio, transactions between) from the rows; common_point (visitors,
    later frauds, active entities, base rate, p-value) from the other cards' rows of the whole frame."""
    from test_trust_patterns import CHARGE, QF, card_frame, cpp_frame, expl, linear_ctx

    from engine.cases.links import case_reason_codes

    ctx = linear_ctx(card_frame(), {CHARGE: 0.8})
    v = np.zeros(ctx.T)
    v[-6] = 0.01
    ex = expl(ctx, v, QF)
    reasons = reason_codes(ctx, ex, max_reasons=20)
    assert reasons[0].kind == "test_then_purchase"
    res = audit_reasons(ctx, reasons, ex)
    assert failed(res).empty and (res["kind"] == "test_then_purchase").sum() >= 10
    for key, val in (("n_between", 3), ("probability_without", reasons[0].numbers["probability_without"] + 0.1),
                     ("deletion_logit", reasons[0].numbers["deletion_logit"] * 2)):
        bad = [dataclasses.replace(reasons[0], numbers={**reasons[0].numbers, key: val})] + reasons[1:]
        checks = set(failed(audit_reasons(ctx, bad, ex))["check"])
        assert any(c.startswith(f"number {key}") for c in checks), checks
    bad = [dataclasses.replace(reasons[0], weight=reasons[0].weight * 3)] + reasons[1:]
    assert "number weight (deletion + query fields)" in set(failed(audit_reasons(ctx, bad, ex))["check"])
    # re-measured model numbers allow float32 noise of another batch shape (1e-7), not a misstated score
    nb = reasons[0].numbers
    close = [dataclasses.replace(reasons[0], numbers={**nb, "probability_with": nb["probability_with"] * (1 + 1e-7)})]
    assert failed(audit_reasons(ctx, close + reasons[1:], ex)).empty

    f = cpp_frame()
    full = f.assign(amount=30.0, merchant_city="Boston", merchant_state="MA", zip="02108", mcc="5411",
                    use_chip="Chip Transaction", errors="")
    ctx = demo_ctx(fr=full, context_length=64, entity="Q")
    ex = expl(ctx, np.zeros(ctx.T))
    reasons = case_reason_codes(ctx, ex, full, max_reasons=20)
    cp = [r for r in reasons if r.kind == "common_point"]
    assert len(cp) == 1
    res = audit_reasons(ctx, reasons, ex, frame=full)
    got = res[res["kind"] == "common_point"]
    assert failed(res).empty and set(got["check"]) >= {"number n_visitors", "number n_later_fraud", "number p_value"}
    assert audit_reasons(ctx, reasons, ex)["check"].eq("not recomputed").any()  # no frame: not recomputed, not passed
    for key, delta in (("n_active", 1), ("p_value", 1e-3), ("n_tested", -1)):
        bad = [dataclasses.replace(r, numbers={**r.numbers, key: r.numbers[key] + delta})
               if r.kind == "common_point" else r for r in reasons]
        assert set(failed(audit_reasons(ctx, bad, ex, frame=full))["check"]) == {f"number {key}"}
    bad = [dataclasses.replace(r, weight=r.weight * 3) if r.kind == "common_point" else r for r in reasons]
    assert set(failed(audit_reasons(ctx, bad, ex, frame=full))["check"]) == {
        "number weight (log rate ratio at the lower 95 % bound)"}
    other = next(t for t in ctx.transaction_ids[:-1] if t not in cp[0].transaction_ids)
    bad = [dataclasses.replace(r, transaction_ids=[other]) if r.kind == "common_point" else r for r in reasons]
    assert "number visit point" in set(failed(audit_reasons(ctx, bad, ex, frame=full))["check"])
