"""Case page: can the explanations be trusted, and what if the history were different?

Two tabs, rendered by :func:`render_case_trust` (called once from ``dashboard/pages/case.py``):

* **Trust** (:func:`render_trust_tab`): per method the deletion curve (method vs random orders vs
  the attention order) and its AOPC against random (:mod:`engine.trust.faithfulness`); the
  model-parameter randomisation verdict per method ("evidence" / "not evidence",
  :func:`engine.trust.sanity.randomisation_check`, computed lazily behind a button, once per
  model and data, on :data:`SANITY_CASES` flagged cases); completeness (IG convergence delta,
  with IG's automatic re-run; a warning above :data:`engine.trust.sanity.COMPLETENESS_TOLERANCE`);
  SHAP's standard errors (its additivity is imposed, so no check); the methods' rank-agreement matrix with
  disagreements put into words (:mod:`engine.trust.agreement`); the reason codes of the query,
  each with the transactions it cites (:mod:`engine.trust.reasons`).
* **What-if** (:func:`dashboard.components.whatif.render_whatif`, its own module; its names are
  re-exported here): change (amount, time, merchant, MCC, ...) or remove an earlier transaction,
  or add one; the query is re-scored at once and re-explained with the same model
  (:func:`engine.trust.whatif.what_if`, no retraining). Edited rows are highlighted; Reset drops
  every edit of the query. Its session-state keys (``whatif_edits``, ``whatif_result``) are
  documented there.

The reason codes of the original history are the lead box's (:func:`case_trust`: one build per
query, ``dashboard/components/lead.py``); those of an edited history are the What-if tab's.

Session-state keys:

* ``"trust_show"``: the toggle that shows the two tabs (off by default: the checks cost a few
  seconds per case). ``"trust_sanity_models"``: model sha256s whose randomisation check the
  analyst asked for in this session.

Caching: per-case results with ``st.cache_data`` keyed by (data sha256, spec, max_rows, model
sha256, transaction id, edits hash); the randomisation check keyed by (model sha256, data sha256,
spec, max_rows, number of cases). The engine does every computation; nothing here imports torch.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import state
from dashboard.components.sanity import (  # noqa: F401 (re-exported for the page and tests)
    SANITY_CASES,
    SANITY_METHODS,
    SANITY_MODELS,
    SANITY_SHAP_SAMPLES,
    _request_sanity,
    _sanity_requested,
    sanity_cases,
    sanity_result,
)
from dashboard.components.whatif import (  # noqa: F401 (re-exported: the page, the export and tests use them here)
    WHATIF_EDITS,
    WHATIF_ERROR,
    WHATIF_FIELDS,
    WHATIF_RESULT,
    _rows_table,
    _sigmoid,
    edits_key,
    query_edits,
    render_whatif,
    reset_whatif,
    _whatif_case,
    whatif_case,
    whatif_score,
)
from dashboard.components import lead
from dashboard.components.safe import error_text, md
from engine.cases import view as cv
from engine.cases.accuracy import median_standard_error, shap_accuracy_text
from engine.trust import figures as tfig

SHOW_KEY = "trust_show"
TAB_LABELS = ["Trust", "What-if"]

#: faithfulness settings: AOPC over top 1..K, curves drawn to k = CURVE_MAX, random orders (the engine's)
from engine.cases.trust_export import CURVE_MAX, FAITH_K, N_RANDOM  # noqa: E402,F401
#: randomisation check: flagged cases, methods, SHAP coalitions (kept small: it runs L + 3 times)
PLOTLY_CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": ["lasso2d", "toImage"]}
CITED_BG = "#c8e6c9"


def _title(m: str) -> str:
    return tfig.METHOD_TITLES.get(m, m)


# ------------------------------------------------------------------------------------ caches

@st.cache_data(show_spinner="Checking the explanations…", max_entries=64)
def _case_trust(data_sha: str, spec: str, max_rows: int | None, model_sha: str, transaction_id: str,
                edits_hash: str, _path: str, _model_path: str, _edits: tuple = ()) -> dict[str, Any]:
    """Everything the two tabs show for one (possibly edited) case; plain, picklable data."""
    from engine.cases.trust_export import trust_results
    from engine.explain.context import build_context
    from engine.trust.whatif import what_if

    source = state._source(_path, spec, data_sha, max_rows)
    bundle = state.get_bundle(_model_path)
    edits = [dict(e) for e in _edits]
    if edits:  # the What-if tab's explanations (same cache entry), the context re-built (score only: cheap)
        w = _whatif_case(data_sha, spec, max_rows, model_sha, transaction_id, edits_hash, _path, _model_path, _edits)
        ctx = what_if(bundle, source.frame, transaction_id, edits, methods=()).context
        expls, original_logit, edited_ids = dict(w["explanations"]), w["original_logit"], list(w["edited_ids"])
    else:
        expls = dict(state._explanations(data_sha, spec, max_rows, model_sha, str(transaction_id), (), _path,
                                         _model_path))
        ctx = build_context(bundle, cv.entity_rows(source.frame, transaction_id), str(transaction_id))
        original_logit, edited_ids = None, []
    res = trust_results(ctx, expls)  # engine.cases.trust_export: the checks fraudlens report runs too
    # the original history: the lead box's reasons (filled in by case_trust: one build per query); edited: the
    # What-if tab's
    return {**res, "original_logit": float(res["logit"] if original_logit is None else original_logit),
            "reasons": list(w["reasons"]) if edits else None, "edited_ids": edited_ids}


def case_trust(loaded: "state.Loaded", transaction_id: str, edits: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Trust results of one case (with ``edits`` applied), cached per (data sha256, spec, model
    sha256, transaction id, edits hash). Without edits, ``"reasons"`` are the lead box's
    (:func:`dashboard.components.lead.case_lead`, the same cache entry): the reason codes of a
    query are built once per query, and the Trust tab lists exactly the reasons the box above
    shows. With edits they are built on the edited history."""
    from dashboard.components.lead import case_lead

    path, spec, sha, max_rows, model_path, model_sha = loaded.key
    edits = list(edits or [])
    res = _case_trust(sha, spec, max_rows, model_sha, str(transaction_id), edits_key(edits), path, model_path,
                      tuple(edits))
    if res["reasons"] is None:
        res = {**res, "reasons": list(case_lead(loaded, transaction_id).reasons)}
    return res


# ------------------------------------------------------------------------------------- render
def render_case_trust(loaded: "state.Loaded", query: str, expls: dict) -> None:
    """The toggle and, when on, the Trust and What-if tabs of ``query``."""
    # the count only while the tabs are closed: open, the What-if tab (a fragment, rerun without this label) says it
    n = 0 if st.session_state.get(SHOW_KEY) else len(query_edits(query))
    label = "Trust checks and what-if" + (f" ({n} what-if edit{'s' if n != 1 else ''})" if n else "")
    if not st.toggle(label, key=SHOW_KEY,
                     help="Faithfulness, sanity and completeness checks, method agreement, reason codes, "
                          "and editing the history to see the score change (a few seconds per case)."):
        return
    tabs = st.tabs(TAB_LABELS)
    with tabs[0]:
        render_trust_tab(loaded, query, expls)
    with tabs[1]:
        render_whatif(loaded, query, expls)


def _labels(rows: pd.DataFrame, currency: str) -> list[str]:
    return cv.context_labels(rows, currency)


BASELINE_TITLES = {"recency": "Most recent first (no model)", "largest_amount": "Largest amount first (no model)"}


def faithfulness_summary(res: dict[str, Any], verdicts: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per method: AOPC vs random / attention / most-recent-first (logits), beats random,
    beats most recent first, sanity verdict, completeness gap (IG), median standard error of the
    values (SHAP; logit); then one row per model-free order (display table of the Trust tab)."""
    gaps = {c.method: c for c in res["completeness"]}
    base = res.get("faithfulness_baselines") or {}
    rec = base["recency"].aopc if "recency" in base else float("nan")
    rows = []
    for m, f in res["faithfulness"].items():
        c = gaps.get(m)
        rows.append({
            "method": _title(m), "aopc": f.aopc, "aopc_random": f.aopc_random, "aopc_minus_random": f.aopc - f.aopc_random,
            "aopc_attention": f.aopc_attention, "aopc_recency": rec, "beats_random": bool(f.aopc > f.aopc_random),
            "beats_recency": bool(f.aopc > rec),
            "sanity": (verdicts or {}).get(m, "not run" if m in SANITY_METHODS else "not checked"),
            "completeness_gap": None if c is None else c.delta,
            "standard_error": median_standard_error(res["explanations"].get(m)),
        })
    for m, f in base.items():
        rows.append({"method": BASELINE_TITLES.get(m, m), "aopc": f.aopc, "aopc_random": f.aopc_random,
                     "aopc_minus_random": f.aopc - f.aopc_random, "aopc_attention": f.aopc_attention,
                     "aopc_recency": rec, "beats_random": bool(f.aopc > f.aopc_random), "beats_recency": None,
                     "sanity": "no model", "completeness_gap": None, "standard_error": None})
    return pd.DataFrame(rows, columns=["method", "aopc", "aopc_random", "aopc_minus_random", "aopc_attention",
                                       "aopc_recency", "beats_random", "beats_recency", "sanity", "completeness_gap",
                                       "standard_error"])


def disagreement_texts(agreement) -> list[str]:
    """Plain-language sentences for the method pairs flagged "methods disagree"."""
    if agreement is None:
        return []
    out = []
    for _, p in agreement.disagreements.iterrows():
        out.append(f"**{_title(p.method_a)}** and **{_title(p.method_b)}** disagree on this case "
                   f"(Spearman ρ = {p.spearman:+.2f}, below {agreement.bound}): they point at different earlier "
                   f"transactions, so neither ranking should be read on its own.")
    return out


def render_trust_tab(loaded: "state.Loaded", query: str, expls: dict) -> None:
    """Faithfulness, sanity, completeness, agreement and reason codes of ``query`` (original history)."""
    currency = loaded.source.currency
    try:
        res = case_trust(loaded, query)
    except Exception as e:  # noqa: BLE001
        st.warning(f"The trust checks could not run for {md(cv.mask(query))}: {error_text(e)}")
        return
    if res["T"] <= 1:
        st.info("This is the first transaction of the entity's history: there is nothing earlier to check the "
                "explanations against.")
        return
    verdicts = None
    if _sanity_requested(loaded):
        try:
            verdicts = sanity_result(loaded)["result"].verdicts()
        except Exception as e:  # noqa: BLE001
            st.warning(f"The randomisation check could not run: {error_text(e)}")

    # ---- faithfulness ------------------------------------------------------------------------
    st.markdown("#### Faithfulness: does removing what a method ranks first change the score?")
    k = max((f.k_max for f in res["faithfulness"].values()), default=FAITH_K)
    st.caption(f"AOPC = mean drop of the score (logit) when the method's top 1..{k} "
               "earlier transactions are removed; higher = the method found what the score depends on. A method "
               f"whose AOPC is not above the random orders' (mean of {N_RANDOM}) is no better than chance here.")
    summ = faithfulness_summary(res, verdicts)
    st.dataframe(summ, key="trust_faith_table", hide_index=True, column_config={
        "method": st.column_config.TextColumn("Method"),
        "aopc": st.column_config.NumberColumn("AOPC (logit)", format="%.3f"),
        "aopc_random": st.column_config.NumberColumn("Random AOPC", format="%.3f"),
        "aopc_minus_random": st.column_config.NumberColumn("AOPC − random", format="%+.3f"),
        "aopc_attention": st.column_config.NumberColumn("Attention-order AOPC", format="%.3f"),
        "aopc_recency": st.column_config.NumberColumn("Most-recent-first AOPC", format="%.3f"),
        "beats_random": st.column_config.CheckboxColumn("Beats random"),
        "beats_recency": st.column_config.CheckboxColumn(
            "Beats most recent first", help="a method that does not beat sorting by time tells you nothing the "
                                            "timeline does not"),
        "sanity": st.column_config.TextColumn("Randomisation check", help=
                                              "evidence: the ranking changes when the model's learned weights are "
                                              "destroyed; not evidence: it survives them, so it does not reflect "
                                              "what the model learned"),
        "completeness_gap": st.column_config.NumberColumn("Completeness gap (logit, IG)", format="%+.2e"),
        "standard_error": st.column_config.NumberColumn("Median standard error (logit, SHAP)", format="%.4f",
                                                        help="sampling error of each value; 0 = exact"),
    })
    for c in res["completeness"]:
        if not c.ok:
            st.warning(f"{md(_title(c.method))}: {md(c.message)}.", icon=":material/warning:")
    ok = [c for c in res["completeness"] if c.ok]
    if ok:
        st.caption(" · ".join(md(c.message) for c in ok))
    if shap_accuracy_text(res["explanations"].get("shap")):
        st.caption(md(shap_accuracy_text(res["explanations"].get("shap"))))
    methods = list(res["faithfulness"])
    cols = st.columns(min(3, max(1, len(methods))))
    for i, m in enumerate(methods):
        f = res["faithfulness"][m]
        with cols[i % len(cols)]:
            st.plotly_chart(tfig.deletion_curve_figure(f, title=f"{_title(m)}: AOPC {f.aopc:.2f} vs random "
                                                                f"{f.aopc_random:.2f}", height=260),
                            key=f"trust_curve_{m}", config=PLOTLY_CONFIG)

    # ---- sanity --------------------------------------------------------------------------------
    st.markdown("#### Sanity: do the methods depend on what the model learned?")
    if verdicts is None:
        st.caption(f"Cascading model-parameter randomisation (Adebayo et al. 2018) on {SANITY_CASES} flagged cases "
                   "of the loaded data; computed once per model and data (about a minute on a large model).")
        st.button("Run the randomisation check", key="trust_sanity_run", on_click=_request_sanity,
                  args=(loaded.bundle.sha256,), icon=":material/science:")
    else:
        san = sanity_result(loaded)
        r = san["result"]
        words = [f"**{_title(m)}**: {v}" for m, v in r.verdicts().items()]
        st.markdown(" · ".join(words))
        st.caption(f"Layers randomised top first. *Evidence*: every step moves the ranking more than a re-run with another seed "
                   f"does, and with every layer random |rho| <= {r.bound} (chart: |rho| per step, 95 % interval over cases).")
        st.text("\n".join(f"{_title(x.method)}: {x.verdict} ({x.reason})" for x in r.summary.itertuples())
                + "\nCases: " + ", ".join(cv.mask(t) for t in san["cases"]) + f" ({r.elapsed_s:.0f} s)")
        st.plotly_chart(tfig.randomisation_figure(r.steps_table, bound=r.bound, height=300),
                        key="trust_randomisation", config=PLOTLY_CONFIG)

    # ---- agreement -----------------------------------------------------------------------------
    st.markdown("#### Do the methods agree on which transactions matter?")
    ag = res["agreement"]
    if ag is not None:
        st.plotly_chart(tfig.agreement_heatmap(ag.spearman, bound=ag.bound, height=320),
                        key="trust_agreement", config=PLOTLY_CONFIG)
        texts = disagreement_texts(ag)
        if texts:  # stated once, with what it means (not one box per pair)
            st.info(f"{len(texts)} method pair{'s' if len(texts) != 1 else ''} disagree on this case: "
                    + "; ".join(f"**{_title(p.method_a)}** and **{_title(p.method_b)}** (ρ {p.spearman:+.2f})"
                                for _, p in ag.disagreements.iterrows())
                    + f", below {ag.bound}. They point at different earlier transactions: read no single "
                    "ranking on its own; the faithfulness table above says which one removal tests support.",
                    icon=":material/compare_arrows:")
        else:
            st.caption(f"Every pair of methods ranks the {ag.n_transactions} earlier transactions alike "
                       f"(Spearman ρ ≥ {ag.bound}) or the correlation is undefined.")

    # ---- reasons, and the smallest change that clears the flag (dashboard/components/counterfactual.py) ----
    from dashboard.components.lead import flag_heading, output

    render_reasons(res, currency, key=f"trust_reason_{query}", heading=flag_heading(loaded, output(loaded, res["logit"])))
    from dashboard.components.counterfactual import render_counterfactual

    render_counterfactual(loaded, query, res)


def render_reasons(res: dict[str, Any], currency: str, key: str, heading: str = "Why it was flagged") -> None:
    """The reason codes, each with the transactions it cites; picking one highlights its rows.
    ``heading``: :func:`dashboard.components.lead.flag_heading` of the query."""
    st.markdown(f"#### {md(heading)} (reason codes)")
    reasons = res["reasons"]
    if not reasons:
        st.caption("No reason code: no earlier transaction pushed the score towards fraud in a pattern the reason "
                   "rules describe.")
        return
    rows = res["rows"]
    ids = [str(t) for t in rows["transaction_id"]]
    labels = _labels(rows, currency)
    lab = dict(zip(ids, labels))
    for i, r in enumerate(reasons):
        cited = md(", ".join(cv.mask(lab.get(t, t)) for t in r.transaction_ids))
        st.markdown(f"{i + 1}\\. **{md(cv.mask(r.text))}** — cites {len(r.transaction_ids)}: {cited}")
    pick = st.radio("Show the transactions a reason cites", list(range(len(reasons))), key=key, horizontal=True,
                    format_func=lambda i: f"Reason {i + 1}")
    cited = set(reasons[pick or 0].transaction_ids)
    table = _rows_table(rows, labels, currency)
    table.insert(1, "cited", [t in cited for t in ids])
    st.dataframe(table.style.apply(
        lambda row: [f"background-color: {CITED_BG}" if row["cited"] else "" for _ in row], axis=1),
        key=f"{key}_table", hide_index=True, height=min(36 * (len(table) + 1), 320),
        column_config={"cited": st.column_config.CheckboxColumn("Cited"),
                       "amount": st.column_config.NumberColumn(f"Amount ({currency})", format="%.2f")})


__all__ = ["SHOW_KEY", "TAB_LABELS", "WHATIF_EDITS", "WHATIF_RESULT", "case_trust", "disagreement_texts",
           "edits_key", "faithfulness_summary", "query_edits", "render_case_trust", "render_trust_tab",
           "render_whatif", "reset_whatif", "sanity_cases", "sanity_result", "whatif_case", "whatif_score"]


def export_payload(loaded: "state.Loaded", query: str) -> dict[str, Any]:
    """JSON-able trust results of one case for the compliance export (``trust`` key of the report):
    faithfulness per method, completeness checks, method agreement, reason codes, and the what-if
    edits in force for this query with the score they give. Uses the same cached computation as
    the Trust tab."""
    from engine.cases.trust_export import trust_json

    edits = query_edits(query)
    res = case_trust(loaded, query, edits)
    out: dict[str, Any] = trust_json(res, res.get("reasons"))  # the block fraudlens report writes too
    if _sanity_requested(loaded):  # randomisation verdicts, when the analyst ran the check for this model
        san = sanity_result(loaded)
        out["randomisation"] = {
            "cases": list(san["cases"]), "bound": float(san["result"].bound),
            "verdicts": {str(r["method"]): {"verdict": str(r["verdict"]), "final_spearman": float(r["final_spearman"]),
                                            "reason": str(r["reason"]), "first_unchanged": str(r["first_unchanged"])}
                         for r in san["result"].summary.to_dict("records")},
        }
    if edits:
        out["what_if"] = {"edits": edits, "edited_transaction_ids": list(res.get("edited_ids") or []),
                          "logit": res["logit"], "probability": lead.output(loaded, res["logit"]),
                          "original_logit": res["original_logit"]}
    return out
