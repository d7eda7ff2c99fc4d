"""Planted causes that are not the latest rows: do the explainers and the reason codes find them?

On the demo data every fraud episode used to be the last few transactions before the query, so
"most recent first" ranked the truth perfectly without looking at the model. The simulator
(:mod:`engine.data.simulate`) therefore also plants causes earlier in the history and tags them in
the evaluation-only column ``Fraud Cause`` (never model input):

* ``tested_then_cnp``: 1-2 tiny test charges at new merchants, 3-8 legitimate transactions
  before the card-not-present purchases;
* ``compromised_merchant``: an ordinary-looking purchase at a compromised store (labelled
  legitimate) 7-30 days before counterfeit purchases elsewhere.

For every planted episode the *query* is its first fraud transaction after the cause (the first
card-not-present or counterfeit purchase); the truth ``G`` = the cause rows in the query's context.
:func:`planted_cause_bench` reports, per episode kind and method, **precision@k** with
``k = |G|`` (share of the method's top-k earlier transactions that are cause rows; ranking as in
:func:`engine.trust.faithfulness.ranking_order`) next to the model-free "most recent first" and
"largest amount first" orders, and the share of cases whose top-2 reason codes
(:mod:`engine.trust.reasons`) **name the planted pattern** (:func:`names_pattern`): a reason of one
of the kinds :data:`PATTERN_REASONS` lists for the episode kind that cites a cause row. A reason of
another kind citing a cause row among many others (e.g. "27 of the 30 transactions in 153 days
were at new merchants") does not name the pattern and is a miss.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from engine.explain import explain_all
from engine.explain.context import build_context
from engine.model.checkpoint import ModelBundle
from engine.trust.baselines import baseline_orders
from engine.trust.faithfulness import ranking_order
from engine.trust.reasons import reason_codes

CAUSE_COLUMN = "Fraud Cause"
EPISODE_COLUMN = "Fraud Episode"
KIND_COLUMN = "Fraud Kind"
#: episode kind -> the reason kinds that name its planted pattern
PATTERN_REASONS = {"tested_then_cnp": ("test_then_purchase", "small_charges"),
                   "compromised_merchant": ("common_point",)}


def names_pattern(reasons, kind: str, cause_ids: set[str], top: int = 2) -> bool:
    """True when one of the first ``top`` reasons is of a kind in :data:`PATTERN_REASONS` for
    episode ``kind`` and cites one of ``cause_ids`` (transaction ids of the cause rows).

    Raises:
        KeyError: an episode kind without planted pattern.
    """
    kinds = PATTERN_REASONS[kind]
    return any(r.kind in kinds and cause_ids & set(r.transaction_ids) for r in list(reasons)[:top])


def planted_queries(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per planted episode: ``episode``, ``kind``, ``query`` (transaction id of its first
    fraud transaction after the cause) and ``n_cause`` (cause rows of the episode).

    Raises:
        ValueError: ``frame`` has no ``Fraud Cause`` column (not demo-simulator data).
    """
    if CAUSE_COLUMN not in frame:
        raise ValueError(f"the frame has no '{CAUSE_COLUMN}' column: planted causes exist only in "
                         "fraudlens-simulated data (spec demo)")
    cause = frame[CAUSE_COLUMN].astype("string").fillna("").str.strip()
    ep = frame[EPISODE_COLUMN].astype("string").fillna("").str.strip()
    out = []
    for e in sorted(set(cause[cause != ""])):
        is_cause = (cause == e).to_numpy()
        last_cause = frame.loc[is_cause, "timestamp"].max()
        fraud = frame[(ep == e).to_numpy() & ~is_cause & (frame["timestamp"] > last_cause).to_numpy()]
        if len(fraud):
            first = fraud.sort_values(["timestamp", "row_number"]).iloc[0]
            out.append({"episode": e, "kind": str(first[KIND_COLUMN]), "query": str(first["transaction_id"]),
                        "n_cause": int(is_cause.sum())})
    return pd.DataFrame(out, columns=["episode", "kind", "query", "n_cause"])


def precision_at(order: np.ndarray, truth: np.ndarray) -> float:
    """Share of the first ``|truth|`` entries of ``order`` that are in ``truth`` (NaN if empty)."""
    k = len(truth)
    return float(np.isin(np.asarray(order)[:k], truth).mean()) if k else float("nan")


def planted_cause_bench(bundle: ModelBundle, frame: pd.DataFrame, *,
                        methods: Iterable[str] = ("integrated_gradients", "shap", "occlusion", "attention_rollout"),
                        shap_samples: int | None = None, log=None, link_facts=None,
                        kinds: Iterable[str] | None = None) -> pd.DataFrame:
    """Per planted episode: precision@|G| of each method and baseline, and whether a top-2 reason
    names the planted pattern (module docstring).

    Args:
        link_facts: optional ``callable(ctx) -> list[dict]`` giving the query entity's visit facts
            (:func:`engine.trust.common_point.visit_facts`) for the ``common_point`` reason;
            ``None``: reasons without link data.
        kinds: episode kinds to run (default: all planted kinds).

    Returns:
        one row per (episode, method) with ``episode``, ``kind``, ``query``, ``method``,
        ``n_truth`` (cause rows in the context), ``P`` (earlier transactions), ``precision``,
        ``probability`` (the model's output for the query: calibrated when the checkpoint has a
        map), ``reason_top2`` (1.0 / 0.0: a top-2 reason code names the pattern,
        :func:`names_pattern`), ``reason_top2_cites`` (1.0 / 0.0: a top-2 reason of any kind cites a
        cause row, the looser rule) and ``reasons`` (the kinds of the reasons, " > " joined). Episodes
        whose cause fell outside the context are left out.
    """
    methods = list(methods)
    rows = []
    pqs = planted_queries(frame)
    if kinds is not None:
        pqs = pqs[pqs["kind"].isin(list(kinds))]
    for _, pq in pqs.iterrows():
        ctx = build_context(bundle, frame, pq["query"])
        cause = ctx.rows[CAUSE_COLUMN].astype("string").fillna("").str.strip().to_numpy()
        truth = np.flatnonzero(cause[:-1] == pq["episode"]).astype(np.int64)
        if not len(truth):
            continue
        expls = explain_all(ctx, methods, **({"shap_samples": shap_samples} if shap_samples else {}))
        ranked = {m: e for m, e in expls.items() if m in methods}
        ranked.update(baseline_orders(ctx))
        links = link_facts(ctx) if link_facts is not None else None
        reasons = (reason_codes(ctx, expls, links=links)
                   if any(m in expls for m in ("shap", "occlusion", "integrated_gradients")) else [])
        cause_ids = {ctx.transaction_ids[j] for j in truth}
        top2 = float(names_pattern(reasons, pq["kind"], cause_ids))
        cites = float(any(cause_ids & set(r.transaction_ids) for r in reasons[:2]))  # the looser, previous rule
        kinds_txt = " > ".join(r.kind for r in reasons)
        prob = float(bundle.probability(np.array([next(iter(expls.values())).score_logit]))[0])
        for m, e in ranked.items():
            rows.append({"episode": pq["episode"], "kind": pq["kind"], "query": pq["query"], "method": m,
                         "n_truth": len(truth), "P": ctx.T - 1, "precision": precision_at(ranking_order(e), truth),
                         "probability": prob, "reason_top2": top2, "reason_top2_cites": cites,
                         "reasons": kinds_txt})
        if log:
            log(f"planted {pq['episode']} ({pq['kind']}): P={ctx.T - 1}, |G|={len(truth)}, "
                f"top-2 reasons name the pattern: {bool(top2)} ({kinds_txt})")
    return pd.DataFrame(rows)


def control_queries(bundle: ModelBundle, frame: pd.DataFrame, *, n_legit: int = 30, seed: int = 0) -> pd.DataFrame:
    """Queries that must **not** get a planted-pattern reason: the first fraud of every episode of
    a kind without planted cause (card testing, account takeover, skimming) and up to ``n_legit``
    flagged legitimate transactions (probability >= the review threshold, label 0, drawn with
    ``seed``). Columns ``kind`` (episode kind or ``"flagged legitimate"``), ``query``."""
    from engine.model.scoring import score_encoded

    kind = frame[KIND_COLUMN].astype("string").fillna("").str.strip()
    planted = set(PATTERN_REASONS) | {"", "fraud_refund"}
    ep = frame[~kind.isin(planted).to_numpy()].sort_values(["timestamp", "row_number"]).drop_duplicates(EPISODE_COLUMN)
    out = [{"kind": str(r[KIND_COLUMN]), "query": str(r["transaction_id"])} for _, r in ep.iterrows()]
    if n_legit > 0 and "label" in frame:
        enc = bundle.encoder.transform(frame)
        prob = bundle.probability(score_encoded(bundle.model, enc, frame["entity_id"].to_numpy()).astype(np.float64))
        legit = np.flatnonzero((prob >= bundle.threshold) & (frame["label"].fillna(0).to_numpy() == 0)
                               & (kind == "").to_numpy())
        pick = np.sort(np.random.default_rng(seed).choice(legit, size=min(n_legit, len(legit)), replace=False))
        out += [{"kind": "flagged legitimate", "query": str(frame["transaction_id"].iloc[i])} for i in pick]
    return pd.DataFrame(out, columns=["kind", "query"])


def control_bench(bundle: ModelBundle, frame: pd.DataFrame, *, methods: Iterable[str] = ("integrated_gradients",
                  "shap", "occlusion"), link_facts=None, n_legit: int = 30, seed: int = 0, log=None) -> pd.DataFrame:
    """Reason codes of :func:`control_queries`: one row per query with ``kind``, ``query``,
    ``reasons`` (kinds, " > " joined) and, per planted kind of :data:`PATTERN_REASONS`,
    ``false_<kind>`` (1.0 / 0.0: a top-2 reason is of that pattern's kinds). ``link_facts`` as in
    :func:`planted_cause_bench`."""
    rows = []
    for _, cq in control_queries(bundle, frame, n_legit=n_legit, seed=seed).iterrows():
        ctx = build_context(bundle, frame, cq["query"])
        if ctx.T < 2:
            continue
        expls = explain_all(ctx, list(methods))
        reasons = reason_codes(ctx, expls, links=link_facts(ctx) if link_facts is not None else None)
        row = {"kind": cq["kind"], "query": cq["query"], "reasons": " > ".join(r.kind for r in reasons)}
        for k, kinds in PATTERN_REASONS.items():
            row[f"false_{k}"] = float(any(r.kind in kinds for r in reasons[:2]))
        rows.append(row)
        if log:
            log(f"control {cq['kind']} {cq['query']}: {row['reasons']}")
    return pd.DataFrame(rows)


def control_markdown(ctl: pd.DataFrame) -> str:
    """Markdown: per control kind, how many queries got a planted-pattern reason in their top 2."""
    if ctl.empty:
        return "No control query."
    pats = list(PATTERN_REASONS)
    lines = ["| control queries (must not name a planted pattern) | cases | "
             + " | ".join(f"top-2 has {' / '.join(PATTERN_REASONS[k])}" for k in pats) + " |",
             "|---|---|" + "---|" * len(pats)]
    for kind, g in ctl.groupby("kind", sort=True):
        lines.append(f"| {kind} | {len(g)} | " + " | ".join(f"{int(g[f'false_{k}'].sum())} of {len(g)}" for k in pats)
                     + " |")
    return "\n".join(lines)


def planted_markdown(res: pd.DataFrame) -> str:
    """Markdown: per kind and method, mean precision@|G| over the episodes (methods and the two
    model-free orders), then per kind the share of cases whose top-2 reason codes name the planted
    pattern (:func:`names_pattern`) next to the looser "a top-2 reason of any kind cites a cause row",
    then one row per episode with its reason kinds."""
    if res.empty:
        return "No planted-cause episode with its cause inside the query's context."
    lines = ["| episode kind | method | cases | precision@\\|G\\| |", "|---|---|---|---|"]
    for (kind, m), g in res.groupby(["kind", "method"], sort=True):
        lines.append(f"| {kind} | {m} | {len(g)} | {g['precision'].mean():.2f} |")
    lines += ["", "| episode kind | cases | top-2 reason codes name the planted pattern | top-2 cite a cause row "
                  "(any reason kind) |", "|---|---|---|---|"]
    eps = res.drop_duplicates("episode")
    for kind, g in eps.groupby("kind", sort=True):
        c = g["reason_top2_cites"] if "reason_top2_cites" in g else g["reason_top2"]
        lines.append(f"| {kind} | {len(g)} | {int(g['reason_top2'].sum())} of {len(g)} "
                     f"({100 * g['reason_top2'].mean():.0f}%) | {int(c.sum())} of {len(g)} ({100 * c.mean():.0f}%) |")
    if "reasons" in eps:
        lines += ["", "| episode | kind | names the pattern | reason codes, best first |", "|---|---|---|---|"]
        for r in eps.sort_values(["kind", "episode"]).itertuples():
            lines.append(f"| {r.episode} | {r.kind} | {'yes' if r.reason_top2 else 'no'} | {r.reasons or '–'} |")
    return "\n".join(lines)


__all__ = ["PATTERN_REASONS", "control_bench", "control_markdown", "control_queries", "names_pattern", "planted_cause_bench", "planted_markdown", "planted_queries", "precision_at"]
