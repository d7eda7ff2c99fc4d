"""Untrusted text on the page, and tables leaving the page (no torch here).

* :func:`md` - text from data or users (merchant, MCC, file names, analyst names, notes, error
  messages that quote a value) for any Streamlit markdown context: every markdown / HTML special
  character backslash-escaped (:func:`engine.cases.redact.escape_markdown`), so it shows as the
  literal text and never becomes a link, an image or markup;
* :func:`error_text` - an exception as one escaped line;
* :func:`csv_download` - a table as a CSV download through the one neutralising writer
  (:func:`engine.data.csv_writer.csv_bytes`, card numbers masked). The tables' own toolbar
  export is off (``client.disableDataExport`` in ``.streamlit/config.toml``): it wrote raw cells.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from engine.cases.redact import escape_markdown, mask_card_number
from engine.data.csv_writer import csv_bytes


def md(text: Any) -> str:
    """``text`` escaped for a Streamlit markdown context (``None`` -> ``""``)."""
    return escape_markdown(text)


def error_text(e: BaseException) -> str:
    """``"TypeName: message"`` of ``e``, escaped for markdown."""
    return md(f"{type(e).__name__}: {e}")


def table_csv(frame: pd.DataFrame) -> bytes:
    """The CSV bytes :func:`csv_download` serves, masked as the page shows the table: an entity,
    transaction or card column has every card-number-like run masked (:func:`mask_card_number`),
    any other text column only its Luhn-valid ones (:func:`engine.cases.redact.mask_luhn_pans`: a
    merchant id reads whole, as on the page); then the neutralising writer."""
    from engine.cases.redact import is_card_field, mask_luhn_pans

    out = frame.copy()
    for c in out.columns:
        if out[c].dtype == object or pd.api.types.is_string_dtype(out[c].dtype):
            key = is_card_field(c) or any(w in str(c).lower() for w in ("entity", "transaction"))
            out[c] = out[c].map(mask_card_number if key else mask_luhn_pans)
    return csv_bytes(out)


def csv_download(frame: pd.DataFrame, file_name: str, key: str, label: str = "Download the table (CSV)") -> None:
    """A download button for ``frame`` as neutralised CSV (built in this script run)."""
    st.download_button(label, table_csv(frame), file_name=file_name, mime="text/csv", key=key,
                       on_click="ignore", icon=":material/download:")
