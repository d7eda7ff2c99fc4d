"""Compliance exports of one case: one report model -> JSON, PDF, CSV (no Streamlit, no torch).

The *report model* is a plain dict (see ``engine/cases/report/report_schema.json``, a JSON Schema, draft
2020-12; ``schema_version`` = :data:`SCHEMA_VERSION`). It is built once by :func:`build_report`
from data the dashboard already has (the case row, its disposition history and notes, the
cached explanations, the scored context rows) and then serialised three ways:

* :func:`to_json` - the report itself, UTF-8, validated against the schema;
* :func:`to_pdf` - the report an investigator files (fpdf2): 1. a SAR-style narrative
  (:mod:`~engine.cases.report.narrative`: subject, activity dates, total suspicious amount,
  transactions involved, reasons, the analyst's narrative, the disposition), 2. the evidence
  (charts drawn as PDF vectors and text by :mod:`~engine.cases.report.pdf_charts`, so tick
  labels keep signs and decimals and nothing is clipped), 3. a methods appendix (settings and
  trust checks in words). Every page footer carries the report id and the report's sha256;
  :func:`report_filename` names the files (entity pseudonym, transaction, export time);
* :func:`to_csv` - one row per context transaction with each method's signed attribution.

Report hash (``report_sha256``)
    ``sha256`` (hex) of the *canonical JSON* of the report with ``report_sha256`` set to the
    empty string ``""``: ``json.dumps(report, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False).encode("utf-8")``. :func:`verify_report` recomputes it. The JSON export
    is an indented rendering of the same dict, so parse it and re-canonicalise to check.

Redaction and injection
    Every identifier and free text is passed through
    :func:`engine.cases.redact.mask_card_number` (card numbers keep at most first 6 / last 4 digits);
    the entity id is replaced by a keyed pseudonym (:func:`engine.cases.redact.pseudonymise`, salt
    from ``$FRAUDLENS_PSEUDONYM_SALT`` or a per-installation secret file next to the case
    store, see :func:`pseudonym_salt`). CSV cells are neutralised against formula injection
    (:func:`engine.cases.redact.neutralise_csv_frame`); PDF text is written as plain text (never
    ``markdown=True``) and any HTML goes through :func:`engine.cases.redact.escape_markup`.

Package map: :mod:`~engine.cases.report.model` (the report model, hash, schema, thresholds),
:mod:`~engine.cases.report.json_writer`, :mod:`~engine.cases.report.csv_writer`,
:mod:`~engine.cases.report.pdf_writer` (one writer per format).
"""

from engine.cases.redact import pseudonymise
from engine.cases.report.csv_writer import to_csv
from engine.cases.report.json_writer import to_json
from engine.cases.report.model import (
    ATTENTION_METHODS,
    ATTRIBUTION_METHODS,
    BANDS,
    ENV_SALT,
    SALT_FILENAME,
    SCHEMA_PATH,
    SCHEMA_VERSION,
    build_report,
    canonical_json,
    decision_band,
    escape_for_html,
    library_versions,
    load_schema,
    pseudonym_salt,
    report_sha256,
    threshold_metrics,
    utcnow,
    validate,
    verify_report,
)
from engine.cases.report.narrative import INVOLVED_RULE, involved_transactions, report_filename
from engine.cases.report.pdf_writer import render_pngs, report_figures, to_pdf

__all__ = [
    "ATTENTION_METHODS", "ATTRIBUTION_METHODS", "BANDS", "ENV_SALT", "SALT_FILENAME", "SCHEMA_PATH",
    "SCHEMA_VERSION", "build_report", "canonical_json", "decision_band", "escape_for_html",
    "library_versions", "load_schema", "pseudonym_salt", "pseudonymise", "render_pngs",
    "report_figures", "report_sha256", "threshold_metrics", "to_csv", "to_json", "to_pdf", "utcnow",
    "validate", "verify_report", "INVOLVED_RULE", "involved_transactions", "report_filename",
]
