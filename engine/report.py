"""Compliance exports of one case: one report model -> JSON, PDF, CSV (no Streamlit, no torch).

The *report model* is a plain dict (see ``engine/report_schema.json``, a JSON Schema, draft
2020-12; ``schema_version`` = :data:`SCHEMA_VERSION`). It is built once by :func:`build_report`
from data the dashboard already has (the case row, its disposition history and notes, the
cached explanations, the scored context rows) and then serialised three ways:

* :func:`to_json` - the report itself, UTF-8, validated against the schema;
* :func:`to_pdf` - a human-readable rendering (fpdf2). Charts are PNGs rendered with kaleido
  from the *same* :mod:`engine.figures` functions the dashboard draws; when kaleido cannot
  render (no Chromium), the PDF is table-only and says so on its first page. Every page footer
  carries the report id and the report's sha256;
* :func:`to_csv` - one row per context transaction with each method's signed attribution.

Report hash (``report_sha256``)
    ``sha256`` (hex) of the *canonical JSON* of the report with ``report_sha256`` set to the
    empty string ``""``: ``json.dumps(report, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False).encode("utf-8")``. :func:`verify_report` recomputes it. The JSON export
    is an indented rendering of the same dict, so parse it and re-canonicalise to check.

Redaction and injection
    Every identifier and free text is passed through
    :func:`engine.redact.mask_card_number` (card numbers keep at most first 6 / last 4 digits);
    the entity id is replaced by a keyed pseudonym (:func:`engine.redact.pseudonymise`, salt
    from ``$FRAUDLENS_PSEUDONYM_SALT`` or a per-installation secret file next to the case
    store, see :func:`pseudonym_salt`). CSV cells are neutralised against formula injection
    (:func:`engine.redact.neutralise_csv_frame`); PDF text is written as plain text (never
    ``markdown=True``) and any HTML goes through :func:`engine.redact.escape_markup`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import math
import os
import secrets
import threading
import uuid
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import __version__
from .redact import escape_markup, mask_card_number, neutralise_csv_frame, pseudonymise

SCHEMA_VERSION = "fraudlens-report/1"
SCHEMA_PATH = Path(__file__).with_name("report_schema.json")
ENV_SALT = "FRAUDLENS_PSEUDONYM_SALT"
SALT_FILENAME = "pseudonym_salt"
ATTRIBUTION_METHODS = ("integrated_gradients", "shap", "occlusion")
ATTENTION_METHODS = ("attention", "attention_rollout")
BANDS = ("below_review", "review", "decline")
_LIBS = ("fraudlens", "torch", "numpy", "pandas", "captum", "shap", "safetensors", "plotly", "kaleido",
         "fpdf2", "jsonschema")
_FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
_KALEIDO_LOCK = threading.Lock()


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
    content of ``<data dir>/pseudonym_salt`` (created once with 32 random bytes, mode 0600;
    data dir as the case store's: ``$FRAUDLENS_DATA_DIR`` or the user data dir)."""
    env = os.environ.get(ENV_SALT, "").strip()
    if env:
        return env
    if data_dir is None:
        from .cases import default_db_path

        data_dir = default_db_path().parent
    p = Path(data_dir) / SALT_FILENAME
    if not p.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
        except FileExistsError:  # another process won the race
            pass
    return p.read_text().strip()


def decision_band(probability: float, review: float, decline: float | None) -> str:
    """``"decline"`` (p >= decline), ``"review"`` (p >= review) or ``"below_review"``."""
    if decline is not None and probability >= decline:
        return "decline"
    return "review" if probability >= review else "below_review"


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
                s, src = t, f"recomputed on the scored data, test period (from {val_end})"
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
    order = np.argsort(-np.abs(vals), kind="stable")[:top_k]
    reasons = [
        {"rank": i + 1, "transaction_id": _text(e.transaction_ids[j]), "position": int(j),
         "is_query": bool(j == len(vals) - 1), "label": labels.get(str(e.transaction_ids[j]), ""),
         "value": _num(vals[j]), "direction": ("towards fraud" if vals[j] > 0 else
                                               "towards legitimate" if vals[j] < 0 else "none")}
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
    }


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
        context: the canonical rows of the query's context (``engine.case_view.context_rows``).
        thresholds: ``review``, ``decline`` and ``source`` (where they come from).
        history, notes: ``CaseStore.history`` / ``CaseStore.notes`` frames.
        scored_at: when the data was scored (UTC); ``probabilities``: transaction id -> own
            fraud probability of each context row (from the scored source).
        trust: optional engine.trust results (JSON-able dict: faithfulness, reasons, ...).
        threshold_quality: :func:`threshold_metrics` output, optional.
    """
    from .explain.base import ATTENTION_CAVEAT  # lazily: the engine.explain package imports torch

    expls = dict(expls)
    trust = trust if trust is not None else expls.pop("trust", None)
    expls = {k: v for k, v in expls.items() if hasattr(v, "values") and hasattr(v, "transaction_ids")}
    if not expls:
        raise ValueError("build_report: no explanations")
    q = next(iter(expls.values()))
    query = str(q.query_transaction_id)
    logit = float(q.score_logit)
    prob = 1.0 / (1.0 + math.exp(-logit))
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
        labels[tid] = f"{(when or '')[:16].replace('T', ' ')} · {amt if amt is not None else ''} {currency}".strip()
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
            "details": {c: _text(r[c]) for c in detail_columns if c in ctx},
        })

    hist = [] if history is None else [
        {"ts": _text(h.ts), "kind": h.kind, "disposition": h.disposition, "state_after": h.state_after,
         "analyst": _text(h.analyst), "note": _text(h.note)} for h in history.itertuples(index=False)]
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
            "training_data": {"sha256": td.get("sha256"), "path": _text(td.get("path"))},
            "checkpoint_thresholds": _jsonable(meta.get("thresholds") or {}),
            "versions": _jsonable(meta.get("versions") or {}),
        },
        "dataset": {
            "spec": str(dataset.get("spec", "")),
            "file_name": _text(dataset.get("file_name")),
            "file_sha256": dataset.get("file_sha256"),
            "max_rows": dataset.get("max_rows"),
            "currency": currency,
        },
        "transactions": txs,
        "score": {
            "transaction_id": _text(query),
            "logit": logit,
            "probability": prob,
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
    report["report_sha256"] = report_sha256(report)
    return report


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


# --------------------------------------------------------------------------------------- JSON
def to_json(report: dict[str, Any]) -> bytes:
    """The report as indented UTF-8 JSON (validated against the schema first)."""
    validate(report)
    return json.dumps(report, sort_keys=True, indent=2, ensure_ascii=False).encode("utf-8")


# ---------------------------------------------------------------------------------------- CSV
def to_csv(report: dict[str, Any]) -> bytes:
    """One row per context transaction: ids, time, amount, own probability, details, and one
    signed attribution column per method (``attr:<method>``, logits; attention as
    ``attn:<method>`` weights), plus report id/sha, case id, pseudonym and the latest
    disposition and note. Every text cell neutralised against formula injection."""
    rows = []
    exps = report["explanations"]
    disp = report["disposition"]
    last_note = disp["history"][-1]["note"] if disp["history"] else (disp["notes"][-1]["text"] if disp["notes"] else None)
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
        r["disposition_state"] = disp["state"]
        r["disposition_note"] = last_note
        rows.append(r)
    df = neutralise_csv_frame(pd.DataFrame(rows))
    return df.to_csv(index=False, lineterminator="\n").encode("utf-8")


# ------------------------------------------------------------------------------------- figures
def report_figures(expls: dict[str, Any], timeline: pd.DataFrame | None = None, threshold: float | None = None,
                   currency: str = "", labels: list[str] | None = None) -> dict[str, Any]:
    """The charts of the report, built by the same :mod:`engine.figures` functions the
    dashboard draws: the entity timeline, attribution bars per method, IG per field."""
    from . import figures as fig

    out: dict[str, Any] = {}
    q = next((e for e in expls.values() if hasattr(e, "query_transaction_id")), None)
    if timeline is not None and len(timeline) and threshold is not None:
        out["Timeline"] = fig.timeline_figure(timeline, threshold, query_id=q.query_transaction_id if q else None,
                                              currency=currency)
    for m in ATTRIBUTION_METHODS:
        e = expls.get(m)
        if e is not None and len(e.transaction_ids) > 1:
            out[fig.METHOD_TITLES.get(m, m)] = fig.attribution_bars(e, labels=labels, include_query=False)
    e = expls.get("integrated_gradients")
    if e is not None and e.field_values is not None:
        out["Integrated gradients per field (query)"] = fig.field_bars(e)
    return out


def render_pngs(figures: dict[str, Any], width: int = 900, height: int = 380) -> tuple[dict[str, bytes], str | None]:
    """PNG bytes per figure via kaleido (one Chromium for all); ``({}, reason)`` on failure."""
    if not figures:
        return {}, None
    try:
        import kaleido
        import plotly.io as pio
    except ImportError as e:
        return {}, f"kaleido not installed ({e})"
    if not os.environ.get("BROWSER_PATH"):
        for c in ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"):
            if Path(c).exists():
                os.environ["BROWSER_PATH"] = c
                break
    out: dict[str, bytes] = {}
    with _KALEIDO_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        started = False
        try:
            kaleido.start_sync_server(silence_warnings=True)
            started = True
            for name, f in figures.items():
                out[name] = pio.to_image(f, format="png", width=width, height=int(f.layout.height or height),
                                         scale=1.5)
        except Exception as e:  # noqa: BLE001 - any renderer failure -> table-only PDF
            return {}, f"{type(e).__name__}: {str(e)[:200]}"
        finally:
            if started:
                try:
                    kaleido.stop_sync_server(silence_warnings=True)
                except Exception:  # noqa: BLE001
                    pass
    return out, None


# ---------------------------------------------------------------------------------------- PDF
def _fmt(x: Any, spec: str = "{:.4f}") -> str:
    return "-" if x is None else spec.format(x)


def to_pdf(report: dict[str, Any], images: dict[str, bytes] | None = None, image_error: str | None = None) -> bytes:
    """The report as a PDF (fpdf2). ``images``: title -> PNG (see :func:`render_pngs`); when
    empty, the PDF states that charts were not rendered and why (``image_error``). All text
    is written as plain text (no markdown / HTML interpretation); notes and merchant names
    appear literally."""
    from fpdf import FPDF
    from fpdf.enums import XPos, YPos

    rid, sha = report["report_id"], report["report_sha256"]

    class _PDF(FPDF):
        def footer(self) -> None:
            self.set_y(-12)
            self.set_font(FONT, size=7)
            self.cell(0, 5, f"report {rid} · sha256 {sha} · page {self.page_no()}/{{nb}}", align="C")

    pdf = _PDF(format="A4")
    unicode_font = (_FONT_DIR / "DejaVuSans.ttf").exists() and (_FONT_DIR / "DejaVuSans-Bold.ttf").exists()
    if unicode_font:
        pdf.add_font("DejaVu", "", str(_FONT_DIR / "DejaVuSans.ttf"))
        pdf.add_font("DejaVu", "B", str(_FONT_DIR / "DejaVuSans-Bold.ttf"))
        FONT = "DejaVu"
    else:  # core font: latin-1 only
        FONT = "Helvetica"

    def clean(s: Any) -> str:
        s = "" if s is None else str(s)
        s = "".join(ch for ch in s if ch in "\t\n" or ord(ch) >= 32)
        return s if unicode_font else s.encode("latin-1", "replace").decode("latin-1")

    pdf.set_title(f"fraudlens case report {rid}")
    pdf.set_creator(f"fraudlens {report['app']['version']}")
    pdf.set_auto_page_break(True, margin=15)
    pdf.add_page()
    W = pdf.epw

    def h1(t: str) -> None:
        pdf.set_font(FONT, "B", 14)
        pdf.multi_cell(W, 8, clean(t), new_x=XPos.LMARGIN, new_y=YPos.NEXT)

    def h2(t: str) -> None:
        pdf.ln(2)
        pdf.set_font(FONT, "B", 11)
        pdf.multi_cell(W, 6, clean(t), new_x=XPos.LMARGIN, new_y=YPos.NEXT)
        pdf.set_font(FONT, "", 9)

    def para(t: str, size: int = 9) -> None:
        pdf.set_font(FONT, "", size)
        pdf.multi_cell(W, 4.6, clean(t), new_x=XPos.LMARGIN, new_y=YPos.NEXT)

    def kv(pairs: list[tuple[str, Any]]) -> None:
        pdf.set_font(FONT, "", 9)
        for k, v in pairs:
            pdf.set_font(FONT, "B", 9)
            pdf.cell(45, 4.6, clean(k))
            pdf.set_font(FONT, "", 9)
            pdf.multi_cell(W - 45, 4.6, clean(v), new_x=XPos.LMARGIN, new_y=YPos.NEXT)

    def table(headers: list[str], rows: list[list[Any]], widths: list[float]) -> None:
        pdf.set_font(FONT, "", 7.5)
        with pdf.table(col_widths=widths, text_align="LEFT", line_height=3.8, markdown=False,
                       first_row_as_headings=True) as t:
            t.row([clean(h) for h in headers])
            for r in rows:
                t.row([clean(c) for c in r])

    c, m, s, d = report["case"], report["model"], report["score"], report["disposition"]
    h1(f"fraudlens case report · case {c['case_id']}")
    kv([("Report id", rid), ("Report sha256", sha),
        ("", "sha256 of the canonical JSON report (sorted keys, no whitespace, UTF-8) with report_sha256 = \"\""),
        ("Schema", report["schema_version"]), ("Exported at (UTC)", report["exported_at"]),
        ("Exported by", report.get("exported_by") or "-"), ("Scored at (UTC)", report.get("scored_at") or "-"),
        ("App", f"{report['app']['name']} {report['app']['version']}")])
    if images:
        para(f"Charts: {len(images)} rendered with kaleido from the dashboard's figure functions.", 8)
    else:
        para(f"Charts: not rendered - table-only report ({image_error or 'no charts'}).", 8)

    h2("Case")
    kv([("Case id", c["case_id"]), ("Entity (pseudonym)", c["entity_pseudonym"]), ("State", c["state"]),
        ("Assignee", c.get("assignee") or "-"), ("Case version", c["version"])])
    h2("Model and data")
    kv([("Model", f"{m['name']} (version {m['version']})"), ("Model sha256", m["sha256"]),
        ("Training data sha256", m["training_data"].get("sha256") or "-"),
        ("Dataset spec", report["dataset"]["spec"]), ("Data file", report["dataset"].get("file_name") or "-"),
        ("Data sha256", report["dataset"].get("file_sha256") or "-")])
    h2("Score and decision")
    th = s["thresholds"]
    kv([("Transaction", s["transaction_id"]), ("Fraud probability", _fmt(s["probability"])),
        ("Score (logit)", _fmt(s["logit"], "{:+.4f}")),
        ("Thresholds", f"review {_fmt(th['review'])} · decline {_fmt(th['decline'])} ({th['source']})"),
        ("Decision band", s["decision_band"].replace("_", " "))])
    tq = report.get("threshold_quality")
    if tq and tq.get("by_threshold"):
        para("Threshold quality (" + tq["source"] + "): " + "; ".join(
            f"{k} {_fmt(v['threshold'], '{:.3f}')}: precision {_fmt(v['precision'], '{:.3f}')}, "
            f"recall {_fmt(v['recall'], '{:.3f}')}" for k, v in tq["by_threshold"].items()), 8)

    h2("Top reasons (signed attributions, logits: + towards fraud)")
    for meth, e in report["explanations"].items():
        if not e["is_attribution"]:
            continue
        pdf.set_font(FONT, "B", 9)
        pdf.multi_cell(W, 5, clean(f"{meth}: delta {_fmt(e['convergence_delta'], '{:+.4f}')} · "
                                   f"reference {_fmt(e['reference_logit'], '{:+.3f}')} · steps {e['steps']} · "
                                   f"samples {e['samples']} · seed {e['seed']}"),
                       new_x=XPos.LMARGIN, new_y=YPos.NEXT)
        para(f"Baseline: {e['baseline']}", 7.5)
        table(["#", "Transaction", "When · amount", "Attribution"],
              [[r["rank"], r["transaction_id"], r["label"], _fmt(r["value"], "{:+.4f}")] for r in e["top_reasons"]],
              [8, 50, 80, 30])
        if e["top_fields"]:
            para("Fields: " + ", ".join(f"{f['field']} {_fmt(f['value'], '{:+.3f}')}" for f in e["top_fields"]), 7.5)
    h2("Caveat")
    para(report["attention_caveat"], 8)

    if images:
        for title, png in images.items():
            h2(title)
            pdf.image(io.BytesIO(png), w=W)

    h2("Transactions used (context, time order, query last)")
    det_keys = sorted({k for t in report["transactions"] for k in (t.get("details") or {})})
    table(["#", "Transaction", "Time (UTC)", "Amount", "P(fraud)", "Label", "Details"],
          [[t["position"], t["transaction_id"] + (" (query)" if t["is_query"] else ""),
            (t["timestamp"] or "")[:19].replace("T", " "), _fmt(t["amount"], "{:.2f}"),
            _fmt(t["probability"], "{:.3f}"), "-" if t["known_label"] is None else t["known_label"],
            " · ".join(f"{k}={(t.get('details') or {}).get(k) or ''}" for k in det_keys)]
           for t in report["transactions"]],
          [8, 28, 30, 18, 15, 11, 70])

    h2("Disposition")
    kv([("State", d["state"]), ("Latest disposition", d.get("latest") or "-"),
        ("Reviewers", ", ".join(d["reviewers"]) or "-")])
    if d["history"]:
        table(["Time (UTC)", "Kind", "Disposition", "State after", "Analyst", "Note"],
              [[h["ts"], h["kind"], h["disposition"], h["state_after"], h["analyst"], h["note"]] for h in d["history"]],
              [30, 18, 24, 24, 20, 74])
    if d["notes"]:
        table(["Time (UTC)", "Analyst", "Note"], [[n["ts"], n["analyst"], n["text"]] for n in d["notes"]],
              [35, 25, 130])
    if report.get("trust"):
        _pdf_trust(report["trust"], h2, para, table)
    h2("Library versions")
    para(", ".join(f"{k} {v}" for k, v in report["library_versions"].items()), 7.5)
    return bytes(pdf.output())


def _pdf_trust(trust: dict, h2, para, table) -> None:
    """The trust section of the PDF: faithfulness per method, completeness, method agreement,
    reason codes and what-if edits, as tables and sentences (the JSON export has every number)."""
    h2("Trust checks")
    faith = trust.get("faithfulness") or {}
    if faith:
        para("Deletion AOPC: mean score drop (logit) when the method's top-k earlier transactions are removed, "
             "k = 1..K; compared with random orders. Higher than random = the method points at what the model uses.", 7.5)
        table(["Method", "AOPC", "AOPC random", "AOPC attention order", "Sufficiency", "K"],
              [[m, _fmt(v.get("aopc"), "{:+.3f}"), _fmt(v.get("aopc_random"), "{:+.3f}"),
                _fmt(v.get("aopc_attention"), "{:+.3f}"), _fmt(v.get("sufficiency"), "{:+.3f}"), v.get("k_max", "")]
               for m, v in faith.items() if isinstance(v, dict)],
              [45, 25, 28, 38, 28, 12])
    for c in trust.get("completeness") or []:
        para(" · ".join(f"{k}: {v}" for k, v in c.items() if not isinstance(v, (dict, list))), 7.5)
    rnd = trust.get("randomisation") or {}
    if rnd.get("verdicts"):
        para("Model-parameter randomisation (Adebayo et al. 2018): a method whose attributions barely change when "
             f"the model's weights are randomised (rank correlation above {rnd.get('bound')}) is not evidence.", 7.5)
        table(["Method", "Verdict", "Rank correlation after randomisation"],
              [[m, v.get("verdict", ""), _fmt(v.get("final_spearman"), "{:+.2f}")] for m, v in rnd["verdicts"].items()],
              [50, 40, 70])
    pairs = ((trust.get("agreement") or {}).get("pairs")) or []
    bad = [p for p in pairs if p.get("status") == "methods disagree"]
    if pairs:
        para(f"Method agreement: {len(pairs) - len(bad)} of {len(pairs)} method pairs agree (Spearman >= bound)"
             + ("; disagree: " + ", ".join(f"{p['method_a']} vs {p['method_b']} ({p['spearman']:+.2f})" for p in bad)
                if bad else "."), 7.5)
    reasons = trust.get("reasons") or []
    if reasons:
        table(["Reason", "Transactions cited"],
              [[r.get("text", ""), ", ".join(r.get("transaction_ids") or [])] for r in reasons], [130, 60])
    wi = trust.get("what_if")
    if wi:
        para(f"What-if edits in force when exported: score {wi.get('probability', 0):.3f} (logit "
             f"{wi.get('logit', 0):+.3f}) versus original logit {wi.get('original_logit', 0):+.3f}.", 7.5)
        table(["Operation", "Transaction", "Values"],
              [[e.get("op", ""), e.get("transaction_id") or "(new)",
                ", ".join(f"{k}={v}" for k, v in (e.get("values") or {}).items())] for e in wi.get("edits") or []],
              [30, 50, 110])
    if trust.get("attention_caveat"):
        para(f"Note: {trust['attention_caveat']}.", 7.5)


def escape_for_html(text: Any) -> str:
    """Untrusted text for an HTML rendering of the report (re-export of escape_markup)."""
    return escape_markup(text)
