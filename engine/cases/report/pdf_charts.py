"""Charts drawn straight into the report PDF with fpdf2 (vectors and real text, no images).

Every label is PDF text: tick labels keep their sign and decimals (``"+0.80"``, ``"-0.20"``,
``"0.00"``; :func:`tick_labels`), transaction labels and field names are wrapped inside their
own column, never cut, and nothing is drawn outside the page margins. Text extraction and
search find them, and the chart stays sharp at any zoom.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from engine.cases.fmt import format_signed

FRAUD_RGB = (198, 40, 40)
LEGIT_RGB = (21, 101, 192)
NEUTRAL_RGB = (120, 144, 156)
AXIS_RGB = (96, 125, 139)
ROW_LINE = 3.2  # mm, label line height
MAX_ROWS = 16


def nice_ticks(lo: float, hi: float, n: int = 4) -> tuple[list[float], int]:
    """Evenly spaced ticks covering ``[lo, hi]`` on a 1/2/2.5/5 x 10^k step, about ``n``
    intervals, and the decimals that show the step (at least 2). ``lo == hi`` is widened."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 1.0
    if hi - lo <= 0:
        lo, hi = (lo - 1.0, hi + 1.0) if lo == 0 else (lo - abs(lo) * 0.5, hi + abs(hi) * 0.5)
    raw = (hi - lo) / max(1, n)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw - 1e-12)
    first = math.floor(lo / step + 1e-9) * step
    ticks = []
    t = first
    while t <= hi + step * 1e-6:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi - 1e-12:
        ticks.append(round(ticks[-1] + step, 12))
    decimals = max(2, -math.floor(math.log10(step)) + (1 if round(step / mag) in (2.5, 25) else 0))
    return ticks, min(decimals, 6)


def tick_labels(ticks: Sequence[float], decimals: int, signed: bool) -> list[str]:
    """``signed``: ``"+0.80"``, ``"-0.20"``, ``"0.00"`` (:func:`engine.cases.fmt.format_signed`);
    else ``"0.80"``. The leading ``0.`` and the minus are always written."""
    if signed:
        return [format_signed(t, decimals) for t in ticks]
    return [f"{t:.{decimals}f}" for t in ticks]


def bar_chart(doc: Any, title: str, labels: Sequence[str], values: Sequence[float], *, unit: str,
              signed: bool, domain: tuple[float, float] | None = None, ref: float | None = None,
              ref_label: str = "", note: str = "") -> list[str]:
    """Horizontal bars, one per label (top to bottom in the given order), into ``doc`` (the
    PDF helper of :mod:`engine.cases.report.pdf_writer`). Labels wrap in a left column (42 %
    of the width); bars sit on an axis with tick labels above and below; each bar's value is
    written at the right. ``signed``: red = towards fraud (+), blue = towards legitimate (-),
    symmetric axis around 0. ``ref``: a dashed vertical line (e.g. the review threshold).
    Returns the tick labels drawn (for tests)."""
    pdf, W = doc.pdf, doc.W
    vals = [float(v) if v is not None and math.isfinite(float(v)) else 0.0 for v in values]
    if domain is None:
        m = max([abs(v) for v in vals] + [1e-9])
        domain = (-m, m) if signed else (0.0, max(vals + [1e-9]))
    ticks, dec = nice_ticks(*domain)
    if signed:
        lim = max(abs(ticks[0]), abs(ticks[-1]))
        ticks, dec = nice_ticks(-lim, lim)
    lo, hi = ticks[0], ticks[-1]
    texts = tick_labels(ticks, dec, signed)
    lw, vw, gap = W * 0.42, 16.0, 3.0
    x0 = pdf.l_margin
    bx, bw = x0 + lw + gap, W - lw - gap - vw - 2.0

    def xv(v: float) -> float:
        return bx + (min(max(v, lo), hi) - lo) / (hi - lo) * bw

    pdf.set_font(doc.font, "", 6.5)
    rows = []
    for lab in labels:
        lines = pdf.multi_cell(lw, ROW_LINE, doc.clean(lab), dry_run=True, output="LINES") or [""]
        rows.append((lines, max(4.4, len(lines) * ROW_LINE + 1.2)))
    head = 6.0 + (4.0 if note or ref_label else 0.0) + 5.0
    total = head + sum(h for _, h in rows) + 6.0
    if pdf.get_y() + min(total, pdf.eph * 0.6) > pdf.page_break_trigger:
        pdf.add_page()
    doc.h3(title)
    if note or ref_label:
        doc.para(" ".join(x for x in (note, ref_label) if x), 7)

    def axis() -> None:
        y = pdf.get_y()
        pdf.set_font(doc.font, "", 6.5)
        pdf.set_draw_color(*AXIS_RGB)
        for t, s in zip(ticks, texts):
            x = xv(t)
            w = pdf.get_string_width(s) + 1.0
            pdf.set_xy(min(max(x - w / 2, bx - 2.0), bx + bw + 2.0 - w), y)
            pdf.cell(w, 3.2, s, align="C")
            pdf.line(x, y + 3.4, x, y + 4.4)
        pdf.line(bx, y + 4.4, bx + bw, y + 4.4)
        pdf.set_xy(bx + bw + 2.0, y)
        pdf.cell(vw, 3.2, unit, align="R")
        pdf.set_xy(x0, y + 4.8)

    axis()
    for (lines, h), v in zip(rows, vals):
        if pdf.get_y() + h > pdf.page_break_trigger:
            pdf.add_page()
            axis()
        y = pdf.get_y()
        pdf.set_font(doc.font, "", 6.5)
        pdf.set_text_color(0, 0, 0)
        for i, line in enumerate(lines):
            pdf.set_xy(x0, y + 0.6 + i * ROW_LINE)
            pdf.cell(lw, ROW_LINE, line)
        rgb = (FRAUD_RGB if v > 0 else LEGIT_RGB) if signed else NEUTRAL_RGB
        pdf.set_fill_color(*rgb)
        a, b = sorted((xv(0.0 if signed else lo), xv(v)))
        bh = min(3.2, h - 1.2)
        if b - a > 0.05:
            pdf.rect(a, y + (h - bh) / 2, b - a, bh, style="F")
        pdf.set_draw_color(*AXIS_RGB)
        if signed:
            pdf.line(xv(0.0), y, xv(0.0), y + h)
        if ref is not None:
            pdf.set_dash_pattern(dash=0.8, gap=0.6)
            pdf.line(xv(ref), y, xv(ref), y + h)
            pdf.set_dash_pattern()
        pdf.set_xy(bx + bw + 2.0, y + (h - ROW_LINE) / 2)
        pdf.cell(vw, ROW_LINE, format_signed(v, max(dec, 2)) if signed else f"{v:.{max(dec, 2)}f}", align="R")
        pdf.set_xy(x0, y + h)
    axis()
    pdf.set_fill_color(255, 255, 255)  # later tables must not inherit a bar colour
    pdf.set_draw_color(0, 0, 0)
    pdf.set_text_color(0, 0, 0)
    pdf.ln(2)
    return texts
