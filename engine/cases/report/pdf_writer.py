"""The report as PDF (fpdf2), with charts drawn by the dashboard's own figure functions (kaleido)."""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from engine.cases.report.model import ATTRIBUTION_METHODS

_FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
_KALEIDO_LOCK = threading.Lock()
#: line height of table text (mm); a table row is kept to at most ROW_PAGE_SHARE of a page
TABLE_LINE = 3.8
ROW_PAGE_SHARE = 0.4


# ------------------------------------------------------------------------------------- figures
def report_figures(expls: dict[str, Any], timeline: pd.DataFrame | None = None, threshold: float | None = None,
                   currency: str = "", labels: list[str] | None = None) -> dict[str, Any]:
    """The charts of the report, built by the same :mod:`engine.cases.figures` functions the
    dashboard draws: the entity timeline, attribution bars per method, IG per field."""
    from engine.cases import figures as fig

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
def _row_parts(pdf: Any, cells: list[str], widths_mm: list[float], line_h: float) -> list[list[str]]:
    """One table row as one or more rows: fpdf2 cannot break a table row across pages, so a row
    whose tallest cell needs more than :data:`ROW_PAGE_SHARE` of a page (a 20,000-character note,
    a 5,000-character field) is split into consecutive rows of at most that many wrapped lines;
    the other cells are empty on the continuation rows. Nothing is cut: the lines of every part,
    in order, are the cell's full text as the PDF wraps it."""
    max_lines = max(1, int(pdf.eph * ROW_PAGE_SHARE / line_h))
    wrapped = []
    for text, w in zip(cells, widths_mm):
        if len(text) <= 80:  # cannot reach max_lines even in the narrowest column
            wrapped.append([text])
            continue
        lines = pdf.multi_cell(max(w - 2 * pdf.c_margin - 1.0, 2.0), line_h, text, dry_run=True, output="LINES")
        wrapped.append(lines or [text])
    n_parts = max(-(-len(lines) // max_lines) for lines in wrapped)
    if n_parts == 1:
        return [cells]
    return [["\n".join(lines[i * max_lines:(i + 1) * max_lines]) if len(lines) > 1 else (lines[0] if i == 0 else "")
             for lines in wrapped] for i in range(n_parts)]


def _fmt(x: Any, spec: str = "{:.4f}") -> str:
    return "-" if x is None else spec.format(x)


class Doc:
    """The PDF being written (fpdf2) and its text helpers: the font (DejaVu when installed, else
    a core font with latin-1 only), :meth:`clean` (control characters removed; plain text,
    never markdown), headings, paragraphs, key-value lines and tables that break long rows
    across pages (:func:`_row_parts`). The section writers of
    :mod:`engine.cases.report.pdf_sections` draw through it."""

    def __init__(self, report: dict[str, Any]) -> None:
        from fpdf import FPDF

        rid, sha = report["report_id"], report["report_sha256"]
        outer = self

        class _PDF(FPDF):
            def footer(self) -> None:
                self.set_y(-12)
                self.set_font(outer.font, size=7)
                self.cell(0, 5, f"report {rid} · sha256 {sha} · page {self.page_no()}/{{nb}}", align="C")

        self.pdf = pdf = _PDF(format="A4")
        self.unicode = (_FONT_DIR / "DejaVuSans.ttf").exists() and (_FONT_DIR / "DejaVuSans-Bold.ttf").exists()
        if self.unicode:
            pdf.add_font("DejaVu", "", str(_FONT_DIR / "DejaVuSans.ttf"))
            pdf.add_font("DejaVu", "B", str(_FONT_DIR / "DejaVuSans-Bold.ttf"))
            self.font = "DejaVu"
        else:  # core font: latin-1 only
            self.font = "Helvetica"
        self._coverage: dict[int, bool] = {}
        pdf.set_title(f"fraudlens case report {rid}")
        pdf.set_creator(f"fraudlens {report['app']['version']}")
        pdf.set_auto_page_break(True, margin=15)
        pdf.add_page()
        self.W = pdf.epw

    def clean(self, s: Any) -> str:
        """``s`` as the PDF can show it: control characters removed, bidi controls written as
        ``\u202e`` (:func:`engine.data.csv_writer.show_controls`); a character the font has no
        glyph for (the core font: anything outside latin-1) written as ``[U+FDFD]``, so no text
        of a note or a field is silently lost as a blank."""
        from engine.data.csv_writer import show_controls

        s = "" if s is None else str(s)
        s = "".join(ch for ch in s if ch in "\t\n" or ord(ch) >= 32)
        s = show_controls(s)  # bidi controls (U+202E: text shown reversed) as visible "\u202e", as on the page
        covered = self._covered
        return "".join(ch if ch in "\t\n" or covered(ord(ch)) else f"[U+{ord(ch):04X}]" for ch in s)

    def _covered(self, cp: int) -> bool:
        """True when every style of the font in use has a glyph for code point ``cp``."""
        if not self.unicode:
            return cp < 256
        if cp not in self._coverage:
            self._coverage[cp] = all(cp in f.cmap for f in self.pdf.fonts.values() if hasattr(f, "cmap"))
        return self._coverage[cp]

    def _multi(self, h: float, t: str) -> None:
        from fpdf.enums import XPos, YPos

        self.pdf.multi_cell(self.W, h, self.clean(t), new_x=XPos.LMARGIN, new_y=YPos.NEXT)

    def h1(self, t: str) -> None:
        self.pdf.set_font(self.font, "B", 15)
        self._multi(8, t)

    def h2(self, t: str) -> None:
        self.pdf.ln(3)
        self.pdf.set_font(self.font, "B", 12)
        self._multi(7, t)
        self.pdf.set_font(self.font, "", 9)

    def h3(self, t: str) -> None:
        self.pdf.ln(1.5)
        self.pdf.set_font(self.font, "B", 9.5)
        self._multi(5, t)
        self.pdf.set_font(self.font, "", 9)

    def para(self, t: str, size: float = 9) -> None:
        self.pdf.set_font(self.font, "", size)
        self._multi(4.6 if size >= 9 else 3.8, t)

    def bullets(self, items: list[str], size: float = 9) -> None:
        for it in items:
            self.para(f"•  {it}" if self.unicode else f"-  {it}", size)

    def kv(self, pairs: list[tuple[str, Any]], key_w: float = 48) -> None:
        from fpdf.enums import XPos, YPos

        pdf = self.pdf
        for k, v in pairs:
            pdf.set_font(self.font, "B", 9)
            pdf.cell(key_w, 4.6, self.clean(k))
            pdf.set_font(self.font, "", 9)
            pdf.multi_cell(self.W - key_w, 4.6, self.clean(v), new_x=XPos.LMARGIN, new_y=YPos.NEXT)

    def table(self, headers: list[str], rows: list[list[Any]], widths: list[float]) -> None:
        pdf = self.pdf
        pdf.set_font(self.font, "", 7.5)
        cols = [self.W * w / sum(widths) for w in widths]
        with pdf.table(col_widths=widths, text_align="LEFT", line_height=TABLE_LINE, markdown=False,
                       first_row_as_headings=True) as t:
            t.row([self.clean(h) for h in headers])
            for r in rows:
                for part in _row_parts(pdf, [self.clean(c) for c in r], cols, TABLE_LINE):
                    t.row(part)


def to_pdf(report: dict[str, Any]) -> bytes:
    """The report as a PDF (fpdf2), in the order an investigator files it:

    1. **Narrative** (:func:`~engine.cases.report.pdf_sections.narrative_section`): subject,
       activity date range, total suspicious amount, the transactions involved, the reasons in
       plain language, the analyst's narrative and the disposition;
    2. **Evidence** (:func:`~engine.cases.report.pdf_sections.evidence_section`): the score
       against the thresholds, charts drawn as PDF vectors and text
       (:mod:`engine.cases.report.pdf_charts`), the ranking per method, the context
       transactions, the disposition history and notes;
    3. **Methods appendix** (:func:`~engine.cases.report.pdf_sections.methods_section`):
       model and data, explainer settings and trust checks in words, library versions.

    All text is written as plain text (no markdown / HTML interpretation); notes and merchant
    names appear literally. Times as ``2026-12-01 14:05 UTC``, amounts as ``1,234.50 USD``
    (:mod:`engine.cases.fmt`). Every page footer carries the report id and sha256."""
    from engine.cases.report import pdf_sections as sec

    doc = Doc(report)
    sec.title_block(doc, report)
    sec.narrative_section(doc, report)
    sec.evidence_section(doc, report)
    sec.methods_section(doc, report)
    return bytes(doc.pdf.output())
