"""The report as CSV: one row per context transaction, every text cell neutralised."""

from __future__ import annotations

from typing import Any

import pandas as pd

from engine.data.csv_writer import csv_bytes


# ---------------------------------------------------------------------------------------- CSV
def to_csv(report: dict[str, Any]) -> bytes:
    """One row per context transaction: ids, time, amount, own probability, details, and one
    signed attribution column per method (``attr:<method>``, logits; attention as
    ``attn:<method>`` weights), plus report id/sha, case id, pseudonym, the case state and the
    latest disposition as the report's narrative records it (:func:`engine.cases.report.narrative.
    disposition_summary`): ``disposition``, ``disposition_by`` / ``disposition_note`` (who
    recorded or proposed it, their note), ``approved_by`` / ``approval_note`` (the four-eyes
    approval; empty when none). Written by :func:`engine.data.csv_writer.csv_bytes` (every text cell
    neutralised against formula injection)."""
    rows = []
    exps = report["explanations"]
    disp = report["disposition"]
    nd = report["narrative"]["disposition"] or {}
    ap = nd.get("approval") or {}
    case_cols = {"disposition_state": disp["state"], "disposition": nd.get("outcome"),
                 "disposition_by": nd.get("analyst"), "disposition_note": nd.get("note"),
                 "approved_by": ap.get("analyst"), "approval_note": ap.get("note")}
    for t in report["transactions"]:
        r = {
            "report_id": report["report_id"], "report_sha256": report["report_sha256"],
            "case_id": report["case"]["case_id"], "entity_pseudonym": report["case"]["entity_pseudonym"],
            "model_sha256": report["model"]["sha256"],
            "position": t["position"], "transaction_id": t["transaction_id"], "is_query": t["is_query"],
            "timestamp": t["timestamp"], "amount": t["amount"], "currency": t["currency"],
            "probability": t["probability"], "known_label": t["known_label"],
        }
        for k, v in (t.get("details") or {}).items():
            r[k] = v
        for m, e in exps.items():
            col = ("attr:" if e["is_attribution"] else "attn:") + m
            vals = e["values"]
            r[col] = vals[t["position"]] if t["position"] < len(vals) else None
        r.update(case_cols)
        rows.append(r)
    return csv_bytes(pd.DataFrame(rows))
