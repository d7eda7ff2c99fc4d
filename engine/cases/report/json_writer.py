"""The report as JSON (validated against the schema first)."""

from __future__ import annotations

import json
from typing import Any

from engine.cases.report.model import validate


# --------------------------------------------------------------------------------------- JSON
def to_json(report: dict[str, Any]) -> bytes:
    """The report as indented UTF-8 JSON (validated against the schema first)."""
    validate(report)
    return json.dumps(report, sort_keys=True, indent=2, ensure_ascii=False).encode("utf-8")
