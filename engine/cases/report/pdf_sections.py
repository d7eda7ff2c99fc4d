"""The sections of the report PDF, one function each (narrative, evidence, methods appendix),
drawn through :class:`engine.cases.report.pdf_writer.Doc`. A new section is a new function
here and one line in :func:`engine.cases.report.pdf_writer.to_pdf`."""

from __future__ import annotations

from typing import Any

from engine.cases.fmt import format_amount, format_gap, format_signed, format_ts
from engine.cases.report.narrative import _fraud_type_label
from engine.cases.report.pdf_fields import pdf_fields
from engine.cases.report.pdf_charts import MAX_ROWS, bar_chart

_METHOD_NAMES = {"integrated_gradients": "Integrated gradients", "shap": "SHAP", "occlusion": "Occlusion",
                 "attention": "Attention", "attention_rollout": "Attention rollout"}
_OUTCOMES = {"confirmed_fraud": "Confirmed fraud", "false_positive": "False positive", "escalate": "Escalated",
             "closed_no_action": "Closed, no action"}
_STATES = {"open": "open", "assigned": "assigned", "pending_approval": "pending approval (four-eyes)",
           "confirmed_fraud": "confirmed fraud", "false_positive": "false positive", "escalated": "escalated",
           "closed_no_action": "closed, no action"}
_WHY = {"explained": "explained transaction", "flagged": "flagged by the model", "cited": "cited by the attributions",
        "known_fraud": "known fraud (label 1)"}


def _p(x: Any, d: int = 3) -> str:
    return "-" if x is None else f"{float(x):.{d}f}"


#: methods that remove earlier transactions and always keep the explained one
#: (engine.explain.removal.REMOVAL_RULE): its value is 0 by construction, not a finding
QUERY_KEPT_METHODS = ("shap", "occlusion")


def _words(v: Any) -> str:
    """A value from the trust / parameter dicts as words, never a Python repr."""
    if v is None:
        return "not measured"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(_words(x) for x in v) or "none"
    return str(v)


def title_block(doc: Any, report: dict[str, Any]) -> None:
    """Title and the report's identity (id, hash, export time and user)."""
    c = report["case"]
    doc.h1(f"Suspicious activity report · fraudlens case {c['case_id']}")
    doc.kv([("Report id", report["report_id"]), ("Report sha256", report["report_sha256"]),
            ("", "sha256 of the canonical JSON report (sorted keys, no whitespace, UTF-8) with report_sha256 = \"\""),
            ("Exported", f"{format_ts(report['exported_at'])} by {report.get('exported_by') or '-'}"),
            ("Data scored", format_ts(report.get("scored_at")))])
    a = report.get("audit_anchor")
    if a:
        doc.kv([("Audit log at export", f"row {a['row_id']}, sha256 {a['row_hash']}"),
                ("", "the case store's last audit row when this report was made; \"fraudlens audit verify --anchors\" "
                     "with this report's JSON checks the log still holds it")])


def narrative_section(doc: Any, report: dict[str, Any]) -> None:
    """1. Narrative: subject, activity, total suspicious amount, disposition, reasons, the
    analyst's narrative, the transactions involved."""
    n = report["narrative"]
    cur = n.get("currency") or ""
    doc.h2("1. Narrative")
    s, a = n["subject"], n["activity"]
    d = n.get("disposition")
    pairs = [("Subject (entity)", f"{s['entity_pseudonym']} (pseudonym; case {s['case_id']})"),
             ("Data", f"{s.get('data_file') or '-'} (spec {s.get('spec') or '-'})"),
             ("Suspicious activity", f"{format_ts(a.get('from'))} to {format_ts(a.get('to'))}"),
             ("Total suspicious amount", f"{format_amount(n.get('total_suspicious_amount'), cur)} over "
                                          f"{n.get('suspicious_count', 0)} flagged or known-fraud transaction(s) of the "
                                          f"{len(n['transactions'])} involved, up to the explained one"),
             ("After the explained transaction", _later_text(n.get("later_activity"), cur)),
             ("Case state", _STATES.get(report["case"]["state"], report["case"]["state"]))]
    if d:
        pairs += [("Disposition", disposition_line(d)),
                  ("Fraud type", d.get("fraud_type_label") or "not recorded"),
                  ("Loss", format_amount(d.get("loss_amount"), d.get("currency") or cur)
                   if d.get("loss_amount") is not None else "not recorded"),
                  ("Exposure", format_amount(d.get("exposure_amount"), d.get("currency") or cur)
                   if d.get("exposure_amount") is not None else "not recorded")]
    else:
        pairs.append(("Disposition", "none recorded yet"))
    doc.kv(pairs)
    doc.para(f"Transactions involved: {n['involved_rule']}. The activity dates span the same flagged and "
             "known-fraud transactions (the explained one alone when none is).", 7.5)

    doc.h3("Why the activity is suspicious")
    reasons = [r["text"] for r in n.get("reasons") or []]
    doc.bullets(reasons or ["No reason met the evidence rules for this transaction."])

    doc.h3("Analyst's narrative")
    an = n.get("analyst_narrative")
    if an:
        doc.para(an["text"])
        doc.para(f"Written by {an.get('analyst') or '-'}, {format_ts(an.get('ts'))}.", 7.5)
    else:
        doc.para("No narrative written yet (write it in the dashboard's export panel).", 8)
    if d and d.get("note"):
        doc.h3("Disposition note")
        doc.para(d["note"])
        doc.para(f"By {d.get('analyst') or '-'}, {format_ts(d.get('ts'))}.", 7.5)
    ap = (d or {}).get("approval")
    if ap and ap.get("note"):
        doc.h3("Approval note")
        doc.para(ap["note"])
        doc.para(f"By {ap.get('analyst') or '-'}, {format_ts(ap.get('ts'))}.", 7.5)

    doc.h3("Transactions involved")
    doc.table(["Time", "Transaction", "Amount", "P(fraud)", "Why"],
              [[format_ts(t["timestamp"]), t["transaction_id"], format_amount(t["amount"], t.get("currency") or cur),
                _p(t["probability"]), ", ".join(_WHY.get(w, w) for w in t["why"])] for t in n["transactions"]],
              [30, 42, 26, 16, 56])


def _later_text(la: dict[str, Any] | None, cur: str) -> str:
    """The entity's activity after the explained transaction, which the report does not cover."""
    if la is None:
        return "not known (this report covers the explained transaction's history only)"
    if not la["n"]:
        return "no later transaction of this entity in the data"
    sus = (f"; {la['n_flagged']} flagged, {la['n_known_fraud']} known fraud"
           + (f", {format_amount(la['suspicious_amount'], cur)} suspicious" if la.get("suspicious_amount") is not None
              else ""))
    return (f"{la['n']} later transaction(s), {format_ts(la['from'])} to {format_ts(la['to'])}{sus}: not covered by "
            "this report (export from the latest flagged transaction to cover them)")


def disposition_line(d: dict[str, Any]) -> str:
    """``report["narrative"]["disposition"]`` in one line: the outcome, who recorded (or
    proposed) it and when, and the four-eyes approval that applied it or that it still waits,
    e.g. ``"Confirmed fraud, proposed by alice 2026-12-07 10:01 UTC, approved by sam
    2026-12-07 10:20 UTC"``."""
    rf = d.get("refused")
    refused = (f"; a later proposal, {_OUTCOMES.get(rf['outcome'], rf['outcome']).lower()} by {rf.get('analyst') or '-'} "
               f"{format_ts(rf.get('ts'))}, was sent back" if rf else "")
    if d.get("outcome") is None:
        return "none applied" + refused
    what = _OUTCOMES.get(d["outcome"], d["outcome"])
    ap = d.get("approval")
    who = f"{d.get('analyst') or '-'} {format_ts(d.get('ts'))}"
    if ap:
        return f"{what}, proposed by {who}, approved by {ap.get('analyst') or '-'} {format_ts(ap.get('ts'))}{refused}"
    if d.get("pending"):
        return f"{what}, proposed by {who}, awaiting a supervisor's approval"
    return f"{what}, recorded by {who}{refused}"


def _tx_label(t: dict[str, Any], cur: str) -> str:
    lab = f"{format_ts(t['timestamp'])} · {format_amount(t['amount'], t.get('currency') or cur)} · {t['transaction_id']}"
    return lab + (" (explained)" if t.get("is_query") else "")


def evidence_section(doc: Any, report: dict[str, Any]) -> list[list[str]]:
    """2. Evidence: score and decision, the charts, ranking per method, context, history.
    Returns the tick labels of every chart drawn (for tests)."""
    pdf = doc.pdf
    pdf.add_page()
    doc.h2("2. Evidence")
    sc, th = report["score"], report["score"]["thresholds"]
    cur = report["dataset"].get("currency") or ""
    word = "Fraud probability" if sc.get("calibrated") else "Fraud score (uncalibrated)"
    doc.kv([("Explained transaction", sc["transaction_id"]), (word, _p(sc["probability"])),
            ("Score (logit)", format_signed(sc["logit"], 3)),
            ("Thresholds", f"review {_p(th['review'])} · decline {_p(th['decline'])} ({th['source']})"),
            ("Decision band", sc["decision_band"].replace("_", " "))])
    ticks: list[list[str]] = []
    txs = report["transactions"]
    shown = txs[-MAX_ROWS:]
    ticks.append(bar_chart(
        doc, "Fraud probability of each transaction in the context (time order, explained last)",
        [_tx_label(t, cur) for t in shown], [t["probability"] or 0.0 for t in shown], unit="probability",
        signed=False, domain=(0.0, 1.0), ref=float(th["review"]),
        ref_label=f"Dashed line: review threshold {_p(th['review'])}.",
        note="" if len(shown) == len(txs) else f"The last {len(shown)} of {len(txs)} context transactions."))
    for m, e in report["explanations"].items():
        if not e["is_attribution"] or len(e["values"]) < 2:
            continue
        vals = e["values"][:-1]
        order = sorted(range(len(vals)), key=lambda i: -abs(vals[i] or 0.0))[:MAX_ROWS]
        keep = sorted(order)
        q = e["values"][-1]
        ticks.append(bar_chart(
            doc, f"{_METHOD_NAMES.get(m, m)}: contribution of each earlier transaction (logit; + towards fraud)",
            [_tx_label(txs[i], cur) for i in keep], [vals[i] or 0.0 for i in keep], unit="logit", signed=True,
            note=(f"The {len(keep)} of {len(vals)} earlier transactions with the largest contributions, time order. "
                  if len(keep) < len(vals) else "") + (
                     "The explained transaction itself is never removed by this method (it ranks the earlier "
                     "transactions only), so it has no contribution here." if m in QUERY_KEPT_METHODS else
                     f"The explained transaction's own fields: {format_signed(q, 3)} logit (not drawn).")))
    for m, e in report["explanations"].items():
        # unchecked per-field sums only when no validated block exists (engine/cases/fields_view.py)
        if e["is_attribution"] and e.get("top_fields") and not report.get("field_attribution"):
            f = e["top_fields"]
            ticks.append(bar_chart(
                doc, f"{_METHOD_NAMES.get(m, m)}: the explained transaction's fields (logit; + towards fraud)",
                [x["field"] for x in f], [x["value"] or 0.0 for x in f], unit="logit", signed=True,
                note=f"The {len(f)} fields with the largest contributions."))
    pdf_fields(report, doc.h2, doc.para, doc.table)  # history effect + validated per-field values
    doc.h3("Ranking per method (largest contributions first)")
    for m, e in report["explanations"].items():
        if not e["is_attribution"]:
            continue
        doc.para(_METHOD_NAMES.get(m, m), 8)
        has_se = e.get("standard_errors") is not None
        doc.table(["#", "Transaction", "When · amount", "Contribution ± SE (logit)" if has_se else "Contribution (logit)"],
                  [[r["rank"], r["transaction_id"] + (" (explained)" if r["is_query"] else ""), r.get("label", ""),
                    format_signed(r["value"], 4) + (f" ± {r['standard_error']:.4f}" if has_se and
                                                    r.get("standard_error") is not None else "")]
                   for r in e["top_reasons"]], [8, 50, 74, 36])
    doc.h3("Transactions used by the model (context, time order, explained last)")
    det_keys = sorted({k for t in txs for k in (t.get("details") or {})})
    doc.table(["#", "Transaction", "Time", "Amount", "P(fraud)", "Label", "Details"],
              [[t["position"], t["transaction_id"] + (" (explained)" if t["is_query"] else ""),
                format_ts(t["timestamp"]), format_amount(t["amount"], t.get("currency") or cur),
                _p(t["probability"]), "-" if t["known_label"] is None else t["known_label"],
                " · ".join(f"{k}={(t.get('details') or {}).get(k) or ''}" for k in det_keys)] for t in txs],
              [8, 28, 30, 22, 14, 10, 68])
    d = report["disposition"]
    doc.h3("Disposition history")
    if d["history"]:
        doc.table(["Time", "Kind", "Outcome", "Fraud type", "Loss · exposure", "Analyst", "Note"],
                  [[format_ts(h["ts"]), h["kind"], _OUTCOMES.get(h["disposition"], h["disposition"]),
                    _fraud_type_label(h.get("fraud_type")) or "-",
                    f"{format_amount(h.get('loss_amount'), h.get('currency') or cur)} · "
                    f"{format_amount(h.get('exposure_amount'), h.get('currency') or cur)}",
                    h["analyst"], h["note"]] for h in d["history"]], [26, 20, 20, 22, 30, 16, 56])
    else:
        doc.para("No disposition recorded.", 8)
    if d["notes"]:
        doc.h3("Notes")
        doc.table(["Time", "Analyst", "Note"], [[format_ts(x["ts"]), x["analyst"], x["text"]] for x in d["notes"]],
                  [30, 25, 135])
    return ticks


def _settings_in_words(m: str, e: dict[str, Any]) -> str:
    parts = []
    if e.get("steps") is not None:
        parts.append(f"{e['steps']} integration steps")
    if e.get("samples") is not None:
        parts.append(f"{e['samples']} samples")
    if e.get("seed") is not None:
        parts.append(f"random seed {e['seed']}")
    other = {k: v for k, v in (e.get("parameters") or {}).items()
             if k not in ("steps", "n_steps", "samples", "n_samples", "nsamples", "seed") and v is not None}
    parts += [f"{k.replace('_', ' ')}: {_words(v)}" for k, v in other.items()]
    if e.get("baseline"):
        parts.append(f"baseline: {e['baseline']}")
    if e.get("convergence_delta") is not None:
        parts.append(f"completeness gap (convergence delta) {format_gap(e['convergence_delta'])} logit")
    est = e.get("estimator")
    if est:
        parts.append(f"estimator {est['name']} over {est['n_players']} players ({est['n_evaluations']} coalitions"
                     + (f", {est['rounds']} rounds" if est.get("rounds") else "")
                     + (f", the {est['pruned_transactions']} oldest transactions merged into one player"
                        if est.get("pruned_transactions") else "")
                     + "; top-5 ranking " + ("resolved" if est.get("converged") else "not resolved within the time budget")
                     + "); each contribution has a standard error; the contributions add up to score minus base value "
                       "by construction (imposed by the estimator, not an accuracy check)")
    if e.get("reference_logit") is not None:
        parts.append(f"score of the baseline {format_signed(e['reference_logit'], 3)} logit")
    kind = "attribution, logit" if e["is_attribution"] else "attention weights, not attributions"
    return f"{_METHOD_NAMES.get(m, m)} ({kind}): " + ("; ".join(parts) if parts else "no settings").rstrip(".") + "."


def methods_section(doc: Any, report: dict[str, Any]) -> None:
    """3. Methods appendix: model and data, explainer settings and trust checks in words."""
    doc.pdf.add_page()
    doc.h2("3. Methods appendix")
    m, ds = report["model"], report["dataset"]
    doc.h3("Model and data")
    doc.kv([("Model", f"{m['name']} (version {m['version'] or '-'})"), ("Model sha256", m["sha256"]),
            ("Training data sha256", m["training_data"].get("sha256") or "-"),
            ("Dataset spec", ds["spec"]), ("Data file", ds.get("file_name") or "-"),
            ("Data sha256", ds.get("file_sha256") or "-"), ("Schema", report["schema_version"])])
    tq = report.get("threshold_quality")
    if tq and tq.get("by_threshold"):
        doc.para("Threshold quality (" + tq["source"] + "): " + "; ".join(
            f"{k} {_p(v['threshold'])}: precision {_p(v['precision'])}, recall {_p(v['recall'])}"
            for k, v in tq["by_threshold"].items()) + ".", 8)
    doc.h3("Explainer settings")
    doc.bullets([_settings_in_words(k, e) for k, e in report["explanations"].items()], 8)
    doc.para(report["attention_caveat"], 7.5)
    if report.get("trust"):
        trust_section(doc, report["trust"])
    doc.h3("Library versions")
    doc.para(", ".join(f"{k} {v}" for k, v in report["library_versions"].items()), 7.5)


def trust_section(doc: Any, trust: dict[str, Any]) -> None:
    """Trust checks in words and tables: faithfulness, completeness, randomisation, agreement,
    reason codes, what-if edits (the JSON export has every number)."""
    doc.h3("Trust checks")
    faith = trust.get("faithfulness") or {}
    if faith:
        doc.para("Deletion AOPC: mean score drop (logit) when the method's top-k earlier transactions are removed, "
                 "k = 1..K, compared with random orders. Higher than random means the method points at what the "
                 "model uses.", 7.5)
        doc.table(["Method", "AOPC", "AOPC random", "AOPC attention order", "Sufficiency", "K"],
                  [[_METHOD_NAMES.get(k, k), format_signed(v.get("aopc"), 3), format_signed(v.get("aopc_random"), 3),
                    format_signed(v.get("aopc_attention"), 3), format_signed(v.get("sufficiency"), 3),
                    v.get("k_max", "")] for k, v in faith.items() if isinstance(v, dict)],
                  [45, 25, 28, 38, 28, 12])
    for c in trust.get("completeness") or []:
        if isinstance(c, dict):
            doc.para("Completeness: " + "; ".join(f"{k.replace('_', ' ')} {_words(v)}" for k, v in c.items()
                                                  if not isinstance(v, (dict, list))) + ".", 7.5)
    rnd = trust.get("randomisation") or {}
    if rnd.get("verdicts"):
        doc.para("Model-parameter randomisation (Adebayo et al. 2018), layers randomised top first: a method is "
                 "evidence only if every step moves its ranking more than re-running it with another seed does and, "
                 f"with every layer random, its rank correlation |rho| with the original is at most "
                 f"{_words(rnd.get('bound'))}.", 7.5)
        doc.table(["Method", "Verdict", "Why"],
                  [[_METHOD_NAMES.get(k, k), v.get("verdict", ""),
                    v.get("reason") or f"final rank correlation {format_signed(v.get('final_spearman'))}"]
                   for k, v in rnd["verdicts"].items()], [40, 30, 120])
    pairs = ((trust.get("agreement") or {}).get("pairs")) or []
    bad = [p for p in pairs if p.get("status") == "methods disagree"]
    if pairs:
        doc.para(f"Method agreement: {len(pairs) - len(bad)} of {len(pairs)} method pairs agree (Spearman at or "
                 "above the bound)" + ("; disagree: " + ", ".join(
                     f"{_METHOD_NAMES.get(p['method_a'], p['method_a'])} vs "
                     f"{_METHOD_NAMES.get(p['method_b'], p['method_b'])} ({format_signed(p['spearman'])})" for p in bad)
                     if bad else "") + ".", 7.5)
    reasons = trust.get("reasons") or []
    if reasons:
        doc.table(["Reason code", "Transactions cited"],
                  [[r.get("text", ""), ", ".join(r.get("transaction_ids") or [])] for r in reasons], [130, 60])
    wi = trust.get("what_if")
    if wi:
        doc.para(f"What-if edits in force when exported: {_p(wi.get('probability'))} (logit "
                 f"{format_signed(wi.get('logit'), 3)}) versus original logit "
                 f"{format_signed(wi.get('original_logit'), 3)}.", 7.5)
        doc.table(["Operation", "Transaction", "Values"],
                  [[x.get("op", ""), x.get("transaction_id") or "(new)",
                    ", ".join(f"{k}={v}" for k, v in (x.get("values") or {}).items())] for x in wi.get("edits") or []],
                  [30, 50, 110])
    if trust.get("attention_caveat"):
        doc.para(f"Note: {str(trust['attention_caveat']).rstrip('.')}.", 7.5)  # never ".."


__all__ = ["evidence_section", "methods_section", "narrative_section", "title_block", "trust_section"]
