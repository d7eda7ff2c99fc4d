"""The report model of one case: :func:`build_report`, its hash, its JSON Schema and the thresholds it states.

See :mod:`engine.cases.report` for the format, the hash rule and the redaction rules."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import re
import secrets
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engine import __version__
from engine.cases.fmt import format_amount, format_ts
from engine.cases.redact import escape_markup, mask_card_number, mask_field_value, pseudonymise
from engine.cases.thresholds import BANDS, decision_band  # noqa: F401 - the one band rule, re-exported

SCHEMA_VERSION = "fraudlens-report/3"
SCHEMA_PATH = Path(__file__).with_name("report_schema.json")
ENV_SALT = "FRAUDLENS_PSEUDONYM_SALT"
SALT_FILENAME = "pseudonym_salt"
ATTRIBUTION_METHODS = ("integrated_gradients", "shap", "occlusion")
ATTENTION_METHODS = ("attention", "attention_rollout")
_LIBS = ("fraudlens", "torch", "numpy", "pandas", "captum", "shap", "safetensors", "plotly", "kaleido",
         "fpdf2", "jsonschema")


# ------------------------------------------------------------------------------------- helpers
def utcnow() -> str:
    """Now, UTC, ISO 8601 with ``+00:00``."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _utc_text(value: Any) -> str | None:
    """A timestamp as UTC ISO 8601 text (naive values are taken as UTC); None for missing."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    ts = pd.Timestamp(value)
    ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
    return ts.isoformat()


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _text(x: Any) -> str | None:
    """Display-safe text: None for missing, card numbers masked."""
    if x is None or (not isinstance(x, str) and pd.isna(x)):
        return None
    return mask_card_number(str(x))


def _detail(field: str, x: Any) -> str | None:
    """A transaction detail for the report, masked by the one field rule the dashboard's tables
    use (:func:`engine.cases.redact.mask_field_value`): a card field's card-number-like runs, in
    any other field only Luhn-valid 13-19 digit runs, so the report and the page name the same
    merchant id and neither shows a card number that landed in another column."""
    if x is None or (not isinstance(x, str) and pd.isna(x)):
        return None
    return mask_field_value(field, str(x))


def _base_name(x: Any) -> str | None:
    """The last part of a path (either separator), so no server directory layout is exported."""
    if x is None or (not isinstance(x, str) and pd.isna(x)):
        return None
    return re.split(r"[\\/]", str(x).rstrip("/\\"))[-1] or None


def _spec_name(x: Any) -> str:
    """A spec's identity for the report: a built-in name or ``name@hash`` kept as is; a spec
    given as a file path is reduced to its file name (the directory is server layout)."""
    s = "" if x is None else str(x)
    return s if "/" not in s and "\\" not in s else (_base_name(s) or "")


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return _num(x)
    if isinstance(x, (pd.Timestamp, dt.datetime)):
        return _utc_text(x)
    if x is None or isinstance(x, str):
        return x
    return str(x)


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries that shape a report (read from package metadata;
    nothing is imported)."""
    out = {"fraudlens": __version__}
    for p in _LIBS[1:]:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            pass
    return out


def pseudonym_salt(data_dir: str | Path | None = None) -> str:
    """The secret salt for entity pseudonyms: ``$FRAUDLENS_PSEUDONYM_SALT`` if set, else the
    content of ``<data dir>/pseudonym_salt`` (created once with 32 random bytes, mode 0600, in a
    folder created 0700; an existing key readable by others is tightened to 0600; data dir as
    the case store's: ``$FRAUDLENS_DATA_DIR`` or the user data dir)."""
    env = os.environ.get(ENV_SALT, "").strip()
    if env:
        return env
    if data_dir is None:
        from engine.cases.store import default_db_path

        data_dir = default_db_path().parent
    p = Path(data_dir) / SALT_FILENAME
    if not p.exists():
        if not p.parent.exists():
            p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        except FileExistsError:  # another process won the race
            pass
    st = p.stat()
    if st.st_mode & 0o077 and st.st_uid == os.getuid():  # a key left readable by others
        os.chmod(p, 0o600)
    return p.read_text().strip()


def threshold_metrics(scores: pd.DataFrame | None, thresholds: dict[str, float], meta: dict | None = None,
                      ) -> dict[str, Any]:
    """Precision / recall each threshold gives on the model's test period.

    If ``scores`` (``probability``, ``timestamp``, ``label``) has labels, they are *recomputed*
    on its rows in the test period (timestamp >= ``meta.split.val_end``; all labelled rows when
    the split is unknown or leaves none) - ``source`` says which. Otherwise the checkpoint's
    ``meta.metrics.test`` values are used for a threshold equal to the one they were measured
    at (``source="checkpoint"``) and the others are ``None``.

    Returns ``{"source": str, "n": int|None, "n_fraud": int|None, "by_threshold": {name:
    {"threshold", "precision", "recall", "alerts"}}}``.
    """
    meta = meta or {}
    out: dict[str, Any] = {"source": "none", "n": None, "n_fraud": None, "by_threshold": {}}
    if scores is not None and "label" in scores and scores["label"].notna().any():
        s = scores.loc[scores["label"].notna()]
        val_end = (meta.get("split") or {}).get("val_end")
        src = "recomputed on the scored data (all labelled rows)"
        if val_end and "timestamp" in s:
            t = s.loc[pd.to_datetime(s["timestamp"]) >= pd.Timestamp(val_end)]
            if len(t):
                s, src = t, f"recomputed on the scored data, test period (from {format_ts(val_end)})"
        y = s["label"].astype(int).to_numpy() == 1
        p = s["probability"].to_numpy(dtype=float)
        out.update(source=src, n=int(len(s)), n_fraud=int(y.sum()))
        for name, thr in thresholds.items():
            if thr is None:
                continue
            flag = p >= float(thr)
            tp = int((flag & y).sum())
            out["by_threshold"][name] = {
                "threshold": float(thr), "alerts": int(flag.sum()),
                "precision": tp / int(flag.sum()) if flag.any() else None,
                "recall": tp / int(y.sum()) if y.any() else None,
            }
        return out
    test = (meta.get("metrics") or {}).get("test") or {}
    if test:
        out.update(source="checkpoint (model test period)", n=test.get("n"), n_fraud=test.get("n_fraud"))
    for name, thr in thresholds.items():
        if thr is None:
            continue
        same = test and test.get("threshold") is not None and abs(float(test["threshold"]) - float(thr)) < 1e-9
        out["by_threshold"][name] = {
            "threshold": float(thr), "alerts": test.get("alerts") if same else None,
            "precision": test.get("precision") if same else None,
            "recall": test.get("recall") if same else None,
        }
    return out


# -------------------------------------------------------------------------------- the model
def _explanation_entry(e: Any, labels: dict[str, str], top_k: int) -> dict[str, Any]:
    vals = np.asarray(e.values, dtype=float)
    se = getattr(e, "standard_errors", None)
    se = None if se is None else np.asarray(se, dtype=float)
    order = np.argsort(-np.abs(vals), kind="stable")[:top_k]
    reasons = [
        {"rank": i + 1, "transaction_id": _text(e.transaction_ids[j]), "position": int(j),
         "is_query": bool(j == len(vals) - 1), "label": labels.get(str(e.transaction_ids[j]), ""),
         "value": _num(vals[j]), "standard_error": None if se is None else _num(se[j]),
         "direction": ("towards fraud" if vals[j] > 0 else "towards legitimate" if vals[j] < 0 else "none")}
        for i, j in enumerate(order)
    ]
    fields = []
    if e.field_values is not None and e.field_names:
        fv = np.asarray(e.field_values, dtype=float).sum(axis=0)
        for i, j in enumerate(np.argsort(-np.abs(fv), kind="stable")[:top_k]):
            fields.append({"rank": i + 1, "field": str(e.field_names[j]), "value": _num(fv[j])})
    params = {k: v for k, v in (e.params or {}).items()
              if isinstance(v, (int, float, bool, str)) or v is None}
    return {
        "method": e.method,
        "units": e.units,
        "signed": bool(e.signed),
        "is_attribution": e.method not in ATTENTION_METHODS,
        "baseline": e.baseline or "",
        "parameters": _jsonable({k: (mask_card_number(v) if isinstance(v, str) else v) for k, v in params.items()}),
        "steps": _jsonable(params.get("steps", params.get("n_steps"))),
        "samples": _jsonable(params.get("samples", params.get("n_samples", params.get("nsamples")))),
        "seed": _jsonable(params.get("seed")),
        "score_logit": _num(e.score_logit),
        "reference_logit": _num(e.reference_logit),
        "convergence_delta": _num(e.convergence_delta),
        "elapsed_s": _num(e.elapsed_s),
        "top_reasons": reasons,
        "top_fields": fields,
        "values": [_num(v) for v in vals],
        "standard_errors": None if se is None else [_num(v) for v in se],
        "estimator": _estimator_entry(e),
    }


def _estimator_entry(e: Any) -> dict[str, Any] | None:
    """How a sampled method's values were estimated (SHAP: ``extras``), else ``None``."""
    ex = e.extras or {}
    if "estimator" not in ex:
        return None
    pr = ex.get("pruned") or {}
    return _jsonable({"name": ex["estimator"], "n_players": ex.get("n_players"),
                      "pruned_transactions": pr.get("n_transactions", 0), "prune_tolerance": pr.get("tolerance"),
                      "converged": ex.get("converged"), "stop_reason": ex.get("stop_reason"),
                      "rounds": ex.get("rounds"), "n_evaluations": ex.get("n_evaluations"),
                      "additivity_gap": ex.get("additivity_gap")})


def build_report(
    *,
    case: dict[str, Any],
    entity_id: str,
    model: Any,
    dataset: dict[str, Any],
    expls: dict[str, Any],
    context: pd.DataFrame,
    thresholds: dict[str, Any],
    history: pd.DataFrame | None = None,
    notes: pd.DataFrame | None = None,
    scored_at: str | None = None,
    probabilities: dict[str, float] | None = None,
    trust: dict[str, Any] | None = None,
    threshold_quality: dict[str, Any] | None = None,
    detail_columns: tuple[str, ...] = ("merchant", "merchant_city", "merchant_state", "mcc"),
    salt: str | None = None,
    exported_by: str | None = None,
    top_k: int = 5,
    report_id: str | None = None,
    exported_at: str | None = None,
    narrative: dict[str, Any] | None = None,
    fields: dict[str, Any] | None = None,
    later: dict[str, Any] | None = None,
    audit_anchor: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report model of one case and one explained query (a dict matching the schema).

    Args:
        case: the case row (``CaseStore.get_case``: id, state, assignee, pending_by, version,
            max_probability, ...).
        entity_id: the raw entity id (only its pseudonym is written).
        model: the model bundle (``.meta``, ``.sha256``; duck-typed, never imported here).
        dataset: ``spec`` (name), ``file_name``, ``file_sha256``, ``max_rows``, ``currency``.
        expls: method -> :class:`engine.explain.base.Explanation` of the query; an optional
            ``"trust"`` entry (dict) is taken as ``trust``.
        context: the canonical rows of the query's context (``engine.cases.view.context_rows``).
        thresholds: ``review``, ``decline`` and ``source`` (where they come from).
        history, notes: ``CaseStore.history`` / ``CaseStore.notes`` frames.
        scored_at: when the data was scored (UTC); ``probabilities``: transaction id -> own
            fraud probability of each context row (from the scored source).
        trust: optional engine.trust results (JSON-able dict: faithfulness, reasons, ...).
        threshold_quality: :func:`threshold_metrics` output, optional.
        narrative: the analyst's latest report narrative (``CaseStore.narrative``: ``text``,
            ``analyst``, ``ts``) for the SAR-style section (``report["narrative"]``,
            :func:`engine.cases.report.narrative.narrative_section`), or ``None``.
        later: the entity's activity after the explained transaction (:func:`later_activity`),
            which the report's transactions (the query's context) do not cover; stored as
            ``narrative.later_activity``. ``None``: not known (not written).
        fields: optional :func:`engine.cases.fields_view.query_fields` output: stored as
            ``history_effect`` (the query alone vs with its history) and ``field_attribution``
            (validated per-field values of the query, cell-level values of the top transactions).
        audit_anchor: the case store's last audit row now (``AuditAnchor.as_dict()``: ``row_id``,
            ``row_hash``, ``ts``), stored as ``audit_anchor``: every report handed out is a copy of
            the log's head (:mod:`engine.cases.store.anchor`). ``None``: not written.
    """
    from engine.cases.report.narrative import narrative_section

    from engine.explain.base import (
        ATTENTION_CAVEAT,  # lazily: the engine.explain package imports torch
    )

    expls = dict(expls)
    trust = trust if trust is not None else expls.pop("trust", None)
    expls = {k: v for k, v in expls.items() if hasattr(v, "values") and hasattr(v, "transaction_ids")}
    if not expls:
        raise ValueError("build_report: no explanations")
    q = next(iter(expls.values()))
    query = str(q.query_transaction_id)
    logit = float(q.score_logit)
    # the model's output: calibrated when the checkpoint is (what the thresholds apply to and the
    # scored file holds); the explanations' score_probability is sigmoid(logit), the explainers' units
    to_prob = getattr(model, "probability", None)
    calibrated = bool(getattr(model, "calibrated", False))
    prob = float(to_prob([logit])[0]) if callable(to_prob) else 1.0 / (1.0 + math.exp(-logit))
    review = float(thresholds["review"])
    decline = _num(thresholds.get("decline"))
    meta = dict(getattr(model, "meta", {}) or {})
    salt = salt if salt is not None else pseudonym_salt()
    probabilities = probabilities or {}
    currency = dataset.get("currency") or ""

    ctx = context.reset_index(drop=True)
    labels: dict[str, str] = {}
    txs = []
    for i, r in ctx.iterrows():
        tid = str(r["transaction_id"])
        when = _utc_text(r.get("timestamp"))
        amt = _num(r.get("amount"))
        labels[tid] = f"{format_ts(when)} · {format_amount(amt, currency)}"
        lab = r.get("label") if "label" in ctx else None
        txs.append({
            "position": int(i),
            "transaction_id": _text(tid),
            "timestamp": when,
            "amount": amt,
            "currency": currency,
            "probability": _num(probabilities.get(tid)),
            "known_label": None if lab is None or pd.isna(lab) else int(lab),
            "is_query": tid == query,
            "details": {c: _detail(c, r[c]) for c in detail_columns if c in ctx},
        })

    hist = [] if history is None else [
        {"ts": _text(h.ts), "kind": h.kind, "disposition": h.disposition, "state_after": h.state_after,
         "analyst": _text(h.analyst), "note": _text(h.note),
         **{k: (_num(getattr(h, k, None)) if k.endswith("amount") else _text(getattr(h, k, None)))
            for k in ("fraud_type", "loss_amount", "exposure_amount", "currency")}}
        for h in history.itertuples(index=False)]
    nts = [] if notes is None else [
        {"ts": _text(n.ts), "analyst": _text(n.analyst), "text": _text(n.text)} for n in notes.itertuples(index=False)]
    reviewers = sorted({h["analyst"] for h in hist if h["analyst"]} | {n["analyst"] for n in nts if n["analyst"]})
    last = next((h for h in reversed(hist) if h["kind"] == "disposition"), None)

    td = dict(meta.get("training_data") or {})
    report: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "report_id": report_id or str(uuid.uuid4()),
        "report_sha256": "",
        "exported_at": exported_at or utcnow(),
        "exported_by": _text(exported_by),
        "scored_at": _utc_text(scored_at) if scored_at else None,
        "app": {"name": "fraudlens", "version": __version__},
        "case": {
            "case_id": int(case["id"]),
            "entity_pseudonym": pseudonymise(entity_id, salt),
            "state": case.get("state"),
            "assignee": _text(case.get("assignee")),
            "pending_by": _text(case.get("pending_by")),
            "version": int(case.get("version", 0)),
            "max_probability": _num(case.get("max_probability")),
        },
        "model": {
            "name": str(meta.get("name") or (Path(model.path).name if getattr(model, "path", None) else "")),
            "version": str(meta.get("version") or meta.get("created_at") or ""),
            "format": meta.get("format"),
            "sha256": str(getattr(model, "sha256", "")),
            "training_data": {"sha256": td.get("sha256"), "file_name": _text(_base_name(td.get("path")))},
            "checkpoint_thresholds": _jsonable(meta.get("thresholds") or {}),
            "versions": _jsonable(meta.get("versions") or {}),
        },
        "dataset": {
            "spec": _spec_name(dataset.get("spec")),
            "file_name": _text(_base_name(dataset.get("file_name"))),
            "file_sha256": dataset.get("file_sha256"),
            "max_rows": dataset.get("max_rows"),
            "currency": currency,
        },
        "transactions": txs,
        "score": {
            "transaction_id": _text(query),
            "logit": logit,
            "probability": prob,
            "calibrated": calibrated,
            "thresholds": {"review": review, "decline": decline, "source": str(thresholds.get("source", ""))},
            "decision_band": decision_band(prob, review, decline),
        },
        "threshold_quality": _jsonable(threshold_quality) if threshold_quality else None,
        "explanations": {m: _explanation_entry(e, labels, top_k) for m, e in expls.items()},
        "attention_caveat": ATTENTION_CAVEAT,
        "library_versions": library_versions(),
        "disposition": {
            "state": case.get("state"),
            "latest": last["disposition"] if last else None,
            "history": hist,
            "notes": nts,
            "reviewers": reviewers,
        },
    }
    if trust is not None:
        report["trust"] = _jsonable(trust)
    report["narrative"] = _jsonable(narrative_section(report, narrative, hist))
    if later is not None:
        report["narrative"]["later_activity"] = _jsonable(later)
    if audit_anchor is not None:
        report["audit_anchor"] = {"row_id": int(audit_anchor["row_id"]), "row_hash": str(audit_anchor["row_hash"]),
                                  "ts": _text(audit_anchor.get("ts")) or ""}
    if fields:
        report["history_effect"] = _jsonable(fields.get("history_effect"))
        report["field_attribution"] = _jsonable(fields.get("field_attribution"))
    report["report_sha256"] = report_sha256(report)
    return report


def later_activity(entity_rows: pd.DataFrame, query: str, review: float) -> dict[str, Any]:
    """What the entity did after the explained transaction ``query`` (the report covers the query's
    context, which ends at it): ``n`` transactions, ``n_flagged`` (own probability at or above
    ``review``), ``n_known_fraud`` (label 1), ``suspicious_amount`` (sum over the flagged or
    known-fraud ones; ``None`` when none), ``from`` / ``to`` (UTC text of the first and last).

    ``entity_rows``: the entity's scored rows (``transaction_id``, ``timestamp``, ``probability``,
    optionally ``amount`` and ``label``). Raises ``KeyError`` when ``query`` is not among them."""
    rows = entity_rows.sort_values("timestamp", kind="stable").reset_index(drop=True)
    ids = rows["transaction_id"].astype(str)
    hit = ids[ids == str(query)]
    if not len(hit):
        raise KeyError(f"transaction {query!r} is not one of the entity's")
    after = rows.iloc[int(hit.index[-1]) + 1:]
    flagged = after["probability"].to_numpy(dtype=float) >= float(review)
    known = (after["label"].fillna(0).to_numpy() == 1) if "label" in after else np.zeros(len(after), bool)
    sus = flagged | known
    amt = after["amount"].to_numpy(dtype=float)[sus] if "amount" in after else np.array([])
    return {"n": int(len(after)), "n_flagged": int(flagged.sum()), "n_known_fraud": int(known.sum()),
            "suspicious_amount": round(float(amt.sum()), 2) if sus.any() and len(amt) else None,
            "from": _utc_text(after["timestamp"].iloc[0]) if len(after) else None,
            "to": _utc_text(after["timestamp"].iloc[-1]) if len(after) else None}


# ------------------------------------------------------------------------------------- hashing
def canonical_json(report: dict[str, Any]) -> bytes:
    return json.dumps(report, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def report_sha256(report: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of ``report`` with ``report_sha256`` = ``""``."""
    return hashlib.sha256(canonical_json({**report, "report_sha256": ""})).hexdigest()


def verify_report(report: dict[str, Any]) -> bool:
    return report.get("report_sha256") == report_sha256(report)


def load_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))


def validate(report: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` if ``report`` does not match the schema."""
    import jsonschema

    jsonschema.validate(report, load_schema(), cls=jsonschema.Draft202012Validator)



def escape_for_html(text: Any) -> str:
    """Untrusted text for an HTML rendering of the report (re-export of escape_markup)."""
    return escape_markup(text)
