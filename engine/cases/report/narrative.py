"""The SAR-style narrative of a report (the first section an investigator reads) and the
report's file name.

:func:`narrative_section` builds ``report["narrative"]`` from the parts of the report model that
:func:`engine.cases.report.model.build_report` has already made (transactions, explanations,
disposition history, trust reasons) plus the analyst's own narrative from the case store
(:meth:`engine.cases.store.CaseStore.narrative`):

* ``subject`` - the entity (pseudonym), the case, the data file;
* ``transactions`` - the *transactions involved* (definition below) with why each is in;
* ``activity`` - the first and last time of the *suspicious* transactions among them (below; the
  explained transaction alone when none is), UTC: a cited legitimate purchase months earlier does
  not stretch the suspicious activity's dates;
* ``total_suspicious_amount`` - the sum of the amounts of the *suspicious* ones among them: flagged
  (own probability at or above the review threshold) or a known fraud (label 1), never a
  transaction that is only cited (an attribution ranks evidence, legitimate purchases too) or the
  explained one when it is neither (the data file's currency; ``None`` when none is);
  ``suspicious_count`` how many they are;
* ``reasons`` - plain-language reasons: the trust checks' reason codes when the report has them,
  else one sentence per transaction the attributions cite towards fraud;
* ``analyst_narrative`` - the analyst's text (``None`` until one is written);
* ``disposition`` - the latest outcome with its fraud type, loss and exposure amounts, who
  recorded (proposed) it with their note, and the four-eyes approval that applied it
  (:func:`disposition_summary`).

Transactions involved (``INVOLVED_RULE``)
    the explained (query) transaction; every context transaction whose own fraud probability
    reaches the review threshold (*flagged*); and every earlier transaction that an attribution
    method (integrated gradients, SHAP, occlusion) ranks in its top reasons *towards fraud*
    (*cited*); and every transaction in the context already known as fraud (label 1: *known_fraud*).
    Attention weights never make a transaction involved (they are not attributions).
"""

from __future__ import annotations

import re
from typing import Any

from engine.cases.fmt import format_amount, format_signed, format_ts

INVOLVED_RULE = ("the explained transaction, every transaction in its context whose own fraud probability "
                 "reaches the review threshold (flagged), and every earlier transaction an attribution method "
                 "cites towards fraud among its top reasons (cited), and every one labelled fraud (known_fraud); the "
                 "suspicious amount sums the flagged and known-fraud ones only")
_METHOD_WORDS = {"integrated_gradients": "integrated gradients", "shap": "SHAP", "occlusion": "occlusion"}


def _fraud_type_label(code: str | None) -> str | None:
    from engine.cases.store.common import FRAUD_TYPES

    return FRAUD_TYPES.get(code, code) if code else None


def involved_transactions(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The transactions involved (see the module docstring), time order, each with ``why``
    (a list of ``"explained"``, ``"flagged"``, ``"cited"``, ``"known_fraud"``)."""
    review = float(report["score"]["thresholds"]["review"])
    cited: set[str] = set()
    for e in report["explanations"].values():
        if not e.get("is_attribution"):
            continue
        for r in e.get("top_reasons") or []:
            if not r.get("is_query") and (r.get("value") or 0) > 0:
                cited.add(str(r["transaction_id"]))
    out = []
    for t in report["transactions"]:
        why = []
        if t.get("is_query"):
            why.append("explained")
        p = t.get("probability")
        if p is not None and p >= review:
            why.append("flagged")
        if str(t["transaction_id"]) in cited:
            why.append("cited")
        if t.get("known_label") == 1:
            why.append("known_fraud")
        if why:
            out.append({"transaction_id": t["transaction_id"], "timestamp": t.get("timestamp"),
                        "amount": t.get("amount"), "currency": t.get("currency") or "",
                        "probability": p, "why": why})
    return out


def _generated_reasons(report: dict[str, Any], top: int = 3) -> list[dict[str, Any]]:
    """One sentence per transaction cited towards fraud by the first attribution method."""
    cur = report["dataset"].get("currency") or ""
    by_id = {t["transaction_id"]: t for t in report["transactions"]}
    for m in ("integrated_gradients", "shap", "occlusion"):
        e = report["explanations"].get(m)
        if not e:
            continue
        out = []
        for r in e.get("top_reasons") or []:
            if (r.get("value") or 0) <= 0 or len(out) >= top:
                continue
            t = by_id.get(r["transaction_id"], {})
            what = ("The explained transaction itself" if r.get("is_query") else
                    f"The transaction of {format_ts(t.get('timestamp'))} for {format_amount(t.get('amount'), cur)}")
            out.append({"text": f"{what} raised the fraud score ({format_signed(r['value'])} logit by "
                                f"{_METHOD_WORDS.get(m, m)}).",
                        "transaction_ids": [r["transaction_id"]], "source": _METHOD_WORDS.get(m, m)})
        fields = [f for f in e.get("top_fields") or [] if (f.get("value") or 0) > 0][:2]
        if fields:
            out.append({"text": "Of the explained transaction's own fields, " + " and ".join(
                f"{f['field']} ({format_signed(f['value'])})" for f in fields) + " pushed the score up most.",
                "transaction_ids": [], "source": _METHOD_WORDS.get(m, m)})
        return out
    return []


def narrative_section(report: dict[str, Any], analyst_narrative: dict[str, Any] | None = None,
                      history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``report["narrative"]`` (see the module docstring) from a report model under
    construction. ``analyst_narrative``: ``{"text", "analyst", "ts"}`` (the latest saved
    narrative) or ``None``; ``history``: the report's disposition history entries (their
    ``fraud_type``, ``loss_amount``, ``exposure_amount``, ``currency`` keys when present)."""
    from engine.cases.redact import mask_card_number

    inv = involved_transactions(report)
    suspicious = [t for t in inv if {"flagged", "known_fraud"} & set(t["why"])]
    amounts = [t["amount"] for t in suspicious if t["amount"] is not None]
    times = sorted(t["timestamp"] for t in (suspicious or [t for t in inv if "explained" in t["why"]]) if t["timestamp"])
    trust_reasons = [r for r in ((report.get("trust") or {}).get("reasons") or []) if isinstance(r, dict)]
    if trust_reasons:
        reasons = [{"text": str(r.get("text", "")), "transaction_ids": [str(x) for x in r.get("transaction_ids") or []],
                    "source": "reason codes (trust checks)"} for r in trust_reasons if r.get("text")]
    else:
        reasons = _generated_reasons(report)
    hist = history if history is not None else report["disposition"]["history"]
    disp = disposition_summary(hist, report["case"]["state"], report["dataset"].get("currency") or "")
    an = None
    if analyst_narrative and str(analyst_narrative.get("text") or "").strip():
        an = {"text": mask_card_number(str(analyst_narrative["text"])),
              "analyst": mask_card_number(str(analyst_narrative.get("analyst") or "")) or None,
              "ts": str(analyst_narrative.get("ts")) if analyst_narrative.get("ts") else None}
    return {
        "subject": {"entity_pseudonym": report["case"]["entity_pseudonym"], "case_id": report["case"]["case_id"],
                    "data_file": report["dataset"].get("file_name"), "spec": report["dataset"].get("spec")},
        "activity": {"from": times[0] if times else None, "to": times[-1] if times else None},
        "involved_rule": INVOLVED_RULE,
        "transactions": inv,
        "total_suspicious_amount": round(float(sum(amounts)), 2) if amounts else None,
        "suspicious_count": len(suspicious),
        "currency": report["dataset"].get("currency") or "",
        "reasons": reasons,
        "analyst_narrative": an,
        "disposition": disp,
    }


def disposition_summary(history: list[dict[str, Any]], state: str | None, currency: str = "") -> dict[str, Any] | None:
    """The case's disposition as one record, or ``None`` when none was recorded (or applied).

    ``history``: the report's disposition history entries, oldest first (``kind`` is
    ``"disposition"`` or ``"approval"``). While the case is ``pending_approval`` the record is the
    pending proposal (``pending`` true). Otherwise it is the latest *applied* disposition: one
    recorded without four-eyes (``state_after`` is not ``pending_approval``), or a proposal followed
    by its approval before any newer proposal. The record holds ``analyst`` / ``ts`` / ``note``
    (who recorded or proposed it, when, their note), its fraud type, loss and exposure,
    ``approval`` (the ``"approval"`` entry that applied it: ``{"analyst", "ts", "note"}``, or
    ``None``) and ``refused``: the newest proposal when it was sent back instead of approved
    (``{"outcome", "analyst", "ts"}``), else ``None``. Every export (PDF narrative, CSV columns,
    JSON) reads this one record, so the three never name different people or notes."""
    idxs = [i for i, h in enumerate(history) if h.get("kind") == "disposition"]
    if not idxs:
        return None

    def approval_of(i: int) -> dict[str, Any] | None:
        nxt = next((j for j in idxs if j > i), len(history))
        return next((h for h in history[i + 1:nxt] if h.get("kind") == "approval"), None)

    newest = history[idxs[-1]]
    pending = state == "pending_approval"
    refused = None
    if pending:
        pick = idxs[-1]
    else:
        applied = [i for i in idxs if history[i].get("state_after") != "pending_approval" or approval_of(i)]
        if idxs[-1] not in applied:  # the newest proposal was sent back
            refused = {"outcome": newest["disposition"], "analyst": newest.get("analyst"), "ts": newest.get("ts")}
        if not applied:
            return {"outcome": None, "state": state, "analyst": None, "ts": None, "note": None, "fraud_type": None,
                    "fraud_type_label": None, "loss_amount": None, "exposure_amount": None, "currency": currency or "",
                    "approval": None, "pending": False, "refused": refused}
        pick = applied[-1]
    last = history[pick]
    ap = None if pending else approval_of(pick)
    return {"outcome": last["disposition"], "state": state, "analyst": last.get("analyst"),
            "ts": last.get("ts"), "note": last.get("note"), "fraud_type": last.get("fraud_type"),
            "fraud_type_label": _fraud_type_label(last.get("fraud_type")),
            "loss_amount": last.get("loss_amount"), "exposure_amount": last.get("exposure_amount"),
            "currency": last.get("currency") or currency or "",
            "approval": ({"analyst": ap.get("analyst"), "ts": ap.get("ts"), "note": ap.get("note")}
                         if ap is not None else None),
            "pending": pending, "refused": refused}


def _slug(text: Any, n: int) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", str(text or "")).strip("-")[:n] or "x"


def report_filename(report: dict[str, Any], ext: str) -> str:
    """``fraudlens-case12-<pseudonym 10>-tx-<transaction id>-20261201T140509Z-<report id 8>.<ext>``:
    entity (pseudonym, never the raw id), explained transaction (masked id, only letters,
    digits, ``-`` and ``_``), export time (UTC, seconds) and the report id, so two reports never
    share a name. Raises ``KeyError`` for a report without those fields."""
    ts = format_ts(report["exported_at"], seconds=True).replace(" UTC", "").replace("-", "").replace(":", "")
    ts = ts.replace(" ", "T") + "Z"
    return (f"fraudlens-case{int(report['case']['case_id'])}-{_slug(report['case']['entity_pseudonym'], 10)}-"
            f"tx-{_slug(report['score']['transaction_id'], 32)}-{ts}-{_slug(report['report_id'], 8)}."
            f"{ext.lstrip('.')}")
