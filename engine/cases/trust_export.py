"""The trust checks of one case, computed and written for the report's ``trust`` block: the one
path the dashboard's Trust tab / export and ``fraudlens report`` share.

:func:`trust_results` runs the checks on a query context and its explanations (completeness,
with IG re-run on more steps when its gap is too large; deletion faithfulness of every method and
of two model-free orders; method agreement); :func:`trust_json` writes them (and the reason codes)
as the report's JSON-able ``trust`` dict. Session-only parts (what-if edits, randomisation
verdicts) are added by the dashboard.
"""

from __future__ import annotations

import dataclasses
from typing import Any

#: deletion faithfulness: the top-k of every method, k = 1..FAITH_K; curves to CURVE_MAX; random orders
FAITH_K, CURVE_MAX, N_RANDOM = 10, 20, 5
ATTENTION_WORDS = "attention weights are not attributions"


def trust_results(ctx: Any, expls: dict) -> dict[str, Any]:
    """The checks of one query (plain data; no reasons: the caller adds the case's reason codes).

    Args:
        ctx: :class:`engine.explain.context.QueryContext` of the query (original or edited history).
        expls: method -> :class:`engine.explain.base.Explanation` of that context.
    Returns:
        ``logit`` (float, the query's logit), ``explanations`` (``expls`` with IG re-run when its
        completeness gap needed it), ``completeness`` (list of
        :class:`engine.trust.sanity.CompletenessCheck`), ``faithfulness`` and
        ``faithfulness_baselines`` (method -> result of
        :func:`engine.trust.faithfulness.evaluate_faithfulness`), ``agreement``
        (:func:`engine.trust.agreement.method_agreement` or ``None``), ``rows``,
        ``transaction_ids``, ``T``.
    """
    from engine.trust.agreement import method_agreement
    from engine.trust.baselines import baseline_orders
    from engine.trust.faithfulness import evaluate_faithfulness
    from engine.trust.sanity import completeness_checks

    logit = ctx.score_logit()
    checks, expls = completeness_checks(ctx, dict(expls), warn=False)  # IG re-run with more steps if needed
    P = ctx.T - 1
    faith = evaluate_faithfulness(ctx, expls, k_max=FAITH_K, curve_max=CURVE_MAX, n_random=N_RANDOM) if P >= 1 else {}
    # model-free orders every method must beat (most recent first, largest amount first)
    base = (evaluate_faithfulness(ctx, baseline_orders(ctx), k_max=FAITH_K, curve_max=CURVE_MAX, n_random=N_RANDOM,
                                  attention=expls.get("attention")) if P >= 1 else {})
    return {"logit": float(logit), "explanations": expls, "completeness": checks, "faithfulness": faith,
            "faithfulness_baselines": base, "agreement": method_agreement(expls) if P >= 1 else None,
            "rows": ctx.rows.reset_index(drop=True).copy(),
            "transaction_ids": [str(t) for t in ctx.transaction_ids], "T": int(ctx.T)}


def trust_json(res: dict[str, Any], reasons: list | None = None) -> dict[str, Any]:
    """The report's ``trust`` dict from :func:`trust_results` and the case's reason codes
    (:class:`engine.trust.reasons.Reason` list): faithfulness per method (AOPC, random and
    attention AOPC, sufficiency, k, the first 10 of its order), completeness checks, method
    agreement (Spearman matrix, pairs, bound), reason codes, the attention caveat."""
    faith = {
        m: {k: getattr(r, k) for k in ("aopc", "aopc_random", "aopc_attention", "sufficiency", "sufficiency_random",
                                       "k_max", "full_logit", "alone_logit") if hasattr(r, k)}
        | {"order": list(r.order)[:10]}
        for m, r in {**(res.get("faithfulness") or {}), **(res.get("faithfulness_baselines") or {})}.items()
    }
    agree = res.get("agreement")
    return {
        "faithfulness": faith,
        "completeness": [dataclasses.asdict(c) if dataclasses.is_dataclass(c) else dict(c)
                         for c in (res.get("completeness") or [])],
        "agreement": None if agree is None else {
            "spearman": agree.spearman.round(4).to_dict(), "pairs": agree.pairs.to_dict("records"), "bound": agree.bound},
        "reasons": [{"kind": r.kind, "text": r.text, "transaction_ids": list(r.transaction_ids),
                     "fields": list(r.fields), "numbers": dict(r.numbers)} for r in (reasons or [])],
        "attention_caveat": ATTENTION_WORDS,
    }


def case_trust_json(bundle: Any, frame: Any, transaction_id: str, expls: dict) -> dict[str, Any]:
    """The ``trust`` block of an unedited case, as the dashboard exports it: the checks of
    :func:`trust_results` on the query's context in ``frame`` and the case's reason codes
    (:func:`engine.cases.links.case_reason_codes`, with the common point of compromise).
    Raises like :func:`engine.explain.context.build_context`."""
    from engine.cases import view as cv
    from engine.cases.links import case_reason_codes
    from engine.explain.context import build_context

    ctx = build_context(bundle, cv.entity_rows(frame, transaction_id), str(transaction_id))
    return trust_json(trust_results(ctx, expls), list(case_reason_codes(ctx, dict(expls), frame)))
