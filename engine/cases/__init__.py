"""Case layer: what an analyst and a compliance officer work with, built on the layers below.

Map of the package:

* :mod:`~engine.cases.store` - the SQLite case store: connection and migrations, the review
  queue, assignment / dispositions / four-eyes approvals, notes, the append-only audit log;
* :mod:`~engine.cases.view` - the case view: load a source, score it, rank entities, the
  timeline and the explanation tables a page shows (no Streamlit);
* :mod:`~engine.cases.figures` - pure Plotly figure functions (the dashboard and the PDF draw
  the same figures);
* :mod:`~engine.cases.report` - the report model of one case and one writer per format (JSON,
  PDF, CSV);
* :mod:`~engine.cases.thresholds` - the thresholds in force for a model (stored, else the
  checkpoint's) and the decision band: one source of truth for every page, export and the CLI;
* :mod:`~engine.cases.redact` - card-number masking, keyed pseudonyms, CSV-formula
  neutralisation (re-exported from :mod:`engine.data.csv_writer`), markdown and markup escaping.

May import :mod:`engine.data`, :mod:`engine.model`, :mod:`engine.explain` and
:mod:`engine.trust`; nothing below imports it. Public names are re-exported here, imported on
first use (the dashboard imports this package and never imports torch itself).
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> submodule (imported on first access).
_EXPORTS = {
    "CaseStore": "store", "CaseStoreError": "store", "ConflictError": "store", "STATES": "store",
    "DISPOSITIONS": "store", "default_db_path": "store", "resolve_analyst": "store",
    "Source": "view", "load_source": "view", "load_model": "view", "score_source": "view",
    "rank_entities": "view", "explain_query": "view",
    "build_report": "report", "to_csv": "report", "to_json": "report", "to_pdf": "report",
    "verify_report": "report",
    "escape_markup": "redact", "mask_card_number": "redact", "neutralise_csv_frame": "redact",
    "pseudonymise": "redact", "escape_markdown": "redact",
    "thresholds_in_force": "thresholds", "decision_band": "thresholds", "BANDS": "thresholds",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
