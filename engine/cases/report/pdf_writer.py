"""The report as PDF (fpdf2), with charts drawn by the dashboard's own figure functions (kaleido)."""

from __future__ import annotations

import io
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
        cols = [W * w / sum(widths) for w in widths]
        with pdf.table(col_widths=widths, text_align="LEFT", line_height=TABLE_LINE, markdown=False,
                       first_row_as_headings=True) as t:
            t.row([clean(h) for h in headers])
            for r in rows:
                for part in _row_parts(pdf, [clean(c) for c in r], cols, TABLE_LINE):
                    t.row(part)

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
        est = e.get("estimator")
        head = (f"{meth}: estimator {est['name']} ({est['n_evaluations']} coalitions"
                + (f", {est['rounds']} rounds" if est.get("rounds") else "")
                + (f", {est['pruned_transactions']} oldest merged" if est.get("pruned_transactions") else "")
                + (", ranking resolved" if est.get("converged") else ", ranking NOT resolved within the budget")
                + ")" if est else f"{meth}: delta {_fmt(e['convergence_delta'], '{:+.4f}')}")
        pdf.multi_cell(W, 5, clean(f"{head} · reference {_fmt(e['reference_logit'], '{:+.3f}')} · steps {e['steps']} · "
                                   f"samples {e['samples']} · seed {e['seed']}"),
                       new_x=XPos.LMARGIN, new_y=YPos.NEXT)
        para(f"Baseline: {e['baseline']}", 7.5)

        def _value(r: dict) -> str:
            se = r.get("standard_error")
            return _fmt(r["value"], "{:+.4f}") + (f" ± {_fmt(se, '{:.4f}')}" if se else "")

        table(["#", "Transaction", "When · amount", "Attribution (± SE)" if est else "Attribution"],
              [[r["rank"], r["transaction_id"], r["label"], _value(r)] for r in e["top_reasons"]],
              [8, 50, 74, 36])
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
        para("Model-parameter randomisation (Adebayo et al. 2018), layers randomised top first: a method is evidence "
             "only if every step moves its ranking more than re-running it with another seed does and, with every "
             f"layer random, its rank correlation |rho| with the original is at most {rnd.get('bound')}.", 7.5)
        table(["Method", "Verdict", "Why"],
              [[m, v.get("verdict", ""), v.get("reason") or f"final rank correlation {_fmt(v.get('final_spearman'), '{:+.2f}')}"]
               for m, v in rnd["verdicts"].items()],
              [40, 30, 120])
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
