"""Generated hostile inputs against every export (made by code here, never copied files).

One parametrised case per attack class:

* formula cells (``=``, ``+``, ``-``, ``@``, tab, CR, NUL, full-width ``＝``) in every CSV the project
  writes: ``score --out x.csv``, ``--rejected``, the report CSV, the simulator's CSV, the writer itself;
* markdown / HTML payloads (links, images, raw ``<img>``) in text shown by the dashboard and in the
  charts' labels and hover text;
* long text (a 20,000-character note, a 5,000-character field value) in the PDF.
"""

from __future__ import annotations

import csv
import io
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from engine.data.csv_writer import CSV_FORMULA_TRIGGERS, csv_bytes, neutralise_csv_frame, write_csv

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

#: attack class -> a cell a spreadsheet would evaluate
FORMULAS = {
    "equals": '=HYPERLINK("http://127.0.0.1:9/x","verify your card")',
    "plus": "+1+cmd|' /C calc'!A0",
    "minus": "-2+3",
    "at": "@SUM(A1:A9)",
    "tab": "\t=1+2",
    "cr": "\r=1+2",
    "nul": "\x00=1+2",
    "fullwidth_equals": "\uff1dHYPERLINK(\"http://127.0.0.1:9/x\")",
}
#: attack class -> markdown / HTML that would become a link, an image or markup if rendered
MARKUP = {
    "md_link": "[verify your card](http://127.0.0.1:9/x)",
    "md_image": "![x](http://127.0.0.1:9/img.png)",
    "html_img": '<img src="http://127.0.0.1:9/img.png">',
    "html_link": '<a href="http://127.0.0.1:9/x">verify</a>',
    "autolink": "see http://127.0.0.1:9/x or www.example.invalid",
    "streamlit_directives": ":red[alert] :material/warning: $x^2$ **bold** `code`",
}


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _cells(data: bytes) -> list[str]:
    return [c for row in csv.reader(io.StringIO(data.decode("utf-8"))) for c in row]


def _assert_safe(data: bytes) -> None:
    bad = [c for c in _cells(data) if c.startswith(CSV_FORMULA_TRIGGERS) and not _is_number(c)]
    assert bad == []


# ------------------------------------------------------------------------------------ CSV writer
@pytest.mark.parametrize("attack", list(FORMULAS))
def test_the_writer_neutralises_every_trigger(attack, tmp_path):
    v = FORMULAS[attack]
    df = pd.DataFrame({"text": [v, "plain"], "cat": pd.Categorical([v, "x"]), v: [1.5, -2.0]})
    data = csv_bytes(df)
    _assert_safe(data)
    rows = list(csv.reader(io.StringIO(data.decode("utf-8"))))
    shown = ("'" + v).replace("\x00", "\\x00")  # a NUL is written as the text \x00
    assert rows[0] == ["text", "cat", shown]
    assert rows[1][:2] == [shown, shown] and rows[2][:2] == ["plain", "x"]
    assert rows[1][2] == "1.5" and rows[2][2] == "-2.0"  # numbers stay numbers
    assert write_csv(df, tmp_path / "a" / "x.csv").read_bytes() == data
    buf = io.BytesIO()
    write_csv(df, buf)
    assert buf.getvalue() == data


def test_a_frame_without_triggers_is_written_as_pandas_would():
    df = pd.DataFrame({"a": ["x", "y, z"], "n": [-1, 2]})
    assert csv_bytes(df) == df.to_csv(index=False, lineterminator="\n").encode()
    assert neutralise_csv_frame(df)["n"].dtype == df["n"].dtype


def test_redact_keeps_re_exporting_the_rule():
    from engine.cases import redact
    from engine.data import csv_writer

    assert redact.neutralise_csv_cell is csv_writer.neutralise_csv_cell
    assert redact.neutralise_csv_frame is csv_writer.neutralise_csv_frame


# --------------------------------------------------------------------------- score --out and --rejected
@pytest.fixture(scope="module")
def hostile_world(tmp_path_factory):
    """The demo slice with one formula per attack class in ``Amount`` (rejected rows) and in
    ``Merchant State`` (accepted rows), and a tiny model for it. The NUL case is left out of the
    file: a CSV holding a NUL byte is refused whole as binary data (engine.data.sniff); the writer
    still neutralises a NUL-led cell (test_the_writer_neutralises_every_trigger)."""
    from engine.cases import view as cv
    from tiny_models import demo_slice, tiny_checkpoint

    d = tmp_path_factory.mktemp("hostile")
    clean = demo_slice(d / "clean.csv", 300)
    rows = list(csv.reader(io.StringIO(clean.read_text(encoding="utf-8"))))
    head = rows[0]
    for i, v in enumerate(v for k, v in FORMULAS.items() if k != "nul"):
        rows[1 + i][head.index("Amount")] = v
        rows[20 + i][head.index("Merchant State")] = v
    data = d / "hostile.csv"
    with open(data, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    src = cv.load_source(clean, cv.demo_spec_name())
    tiny_checkpoint(src.frame, src.spec, d / "model", {"name": "tiny-hostile",
                                                       "thresholds": {"review": 0.5, "decline": 0.8}})
    return {"dir": d, "data": data, "model": d / "model"}


def test_score_csv_and_rejected_csv_are_neutralised(hostile_world, tmp_path, monkeypatch):
    from engine.cli import app

    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "store"))
    out, rej = tmp_path / "x.csv", tmp_path / "rejected.csv"
    r = CliRunner().invoke(app, ["score", "--data", str(hostile_world["data"]), "--spec", "demo",
                                 "--model", str(hostile_world["model"]), "--out", str(out),
                                 "--rejected", str(rej)])
    assert r.exit_code == 0, r.output
    for path in (out, rej):
        data = path.read_bytes()
        _assert_safe(data)
        cells = _cells(data)
        # the rejected formulas are there, as text: the payload behind one leading quote
        for attack in ("equals", "minus", "at", "fullwidth_equals"):
            assert "'" + FORMULAS[attack] in cells, (path.name, attack)


def test_report_csv_is_neutralised(hostile_world):
    from engine.cases import report as rp

    rep = {"report_id": "=r", "report_sha256": "+s", "case": {"case_id": 1, "entity_pseudonym": "@p"},
           "model": {"sha256": "-m"}, "explanations": {"occlusion": {"is_attribution": True, "values": [0.5]}},
           "disposition": {"state": "open", "history": [], "notes": [{"text": FORMULAS["equals"]}]},
           "narrative": {"disposition": {"outcome": "confirmed_fraud", "analyst": FORMULAS["minus"],
                                         "note": FORMULAS["equals"], "approval": {"analyst": FORMULAS["at"],
                                                                                  "note": FORMULAS["tab"]}}},
           "transactions": [{"position": 0, "transaction_id": FORMULAS["tab"], "is_query": True,
                             "timestamp": "2024-01-01T00:00:00", "amount": -5.0, "currency": "USD",
                             "probability": 0.9, "known_label": None,
                             "details": {"merchant_state": FORMULAS["fullwidth_equals"]}}]}
    data = rp.to_csv(rep)
    _assert_safe(data)
    cells = _cells(data)
    assert "'" + FORMULAS["equals"] in cells and "'" + FORMULAS["fullwidth_equals"] in cells
    assert "'" + FORMULAS["minus"] in cells and "'" + FORMULAS["at"] in cells  # disposition_by, approved_by


def test_simulator_csv_is_neutralised_and_the_demo_data_unchanged():
    from engine.data.simulate import simulate
    from engine.data.simulate.generate import csv_bytes as sim_csv_bytes

    demo = simulate(customers=2, seed=3).head(48).copy()
    assert (demo["Merchant Name"] < 0).any()  # negative merchant ids are numbers, never quoted
    demo["Merchant City"] = [FORMULAS[k] for k in FORMULAS] * 6
    data = sim_csv_bytes(demo)
    _assert_safe(data)
    assert "'" + FORMULAS["at"] in _cells(data)
    # only trigger cells change: the rest of the row is written as before
    plain = demo.assign(**{"Merchant City": "Hialeah"})
    assert sim_csv_bytes(plain) == plain.to_csv(index=False, lineterminator="\n").encode()


# ------------------------------------------------------------------------------------ long text in the PDF
def _words(n_chars: int, tag: str) -> str:
    """Distinct words (``tag00001 tag00002 ...``) of about ``n_chars`` characters: every part of
    the text can be found again in the PDF."""
    out, i = [], 0
    while sum(map(len, out)) + len(out) < n_chars:
        i += 1
        out.append(f"{tag}{i:05d}")
    return " ".join(out)


def _report_of(world, note: str, field_value: str, tmp_path) -> dict:
    from engine.cases import report as rp
    from engine.cases import view as cv
    from engine.cases.store import CaseStore

    src = cv.load_source(world["data"], cv.demo_spec_name())
    bundle = cv.load_model(world["model"])
    scores = cv.score_source(bundle, src.frame)
    ranking = cv.rank_entities(scores, bundle.threshold)
    entity = ranking["entity_id"].iloc[0]
    tl = cv.entity_timeline(src.frame, scores, entity, bundle.threshold)
    query = cv.default_query(tl)
    expls = cv.explain_query(bundle, src.frame, query, methods=("occlusion",))
    ctx = cv.context_rows(expls, src.frame).copy()
    ctx.loc[ctx.index[-1], "merchant_city"] = field_value
    store = CaseStore(tmp_path / "cases.sqlite3", four_eyes=False)
    store.upsert_cases(bundle.sha256, pd.DataFrame([{
        "entity_id": entity, "max_probability": float(ranking["max_probability"].iloc[0]),
        "max_transaction_id": query, "first_ts": tl["timestamp"].min(), "last_ts": tl["timestamp"].max(),
        "max_amount": float(tl["amount"].max()), "n_transactions": len(tl), "n_known_fraud": 0}]))
    case_id = int(store.queue(bundle.sha256, 0.0).case_id.iloc[0])
    store.record_disposition(case_id, "escalate", note, analyst="alice")
    store.add_note(case_id, note, analyst="bob")
    return rp.build_report(
        case=store.get_case(case_id), entity_id=entity, model=bundle,
        dataset={"spec": src.spec.name, "file_name": "hostile.csv", "file_sha256": src.file_sha256,
                 "max_rows": None, "currency": src.currency},
        expls=expls, context=ctx, thresholds={"review": 0.5, "decline": 0.8, "source": "checkpoint"},
        history=store.history(case_id), notes=store.notes(case_id), scored_at="2024-01-01T00:00:00",
        probabilities=dict(zip(tl["transaction_id"], tl["probability"])), salt="s", exported_by="alice")


@pytest.mark.parametrize("attack, note_chars, field_chars", [
    ("long_note", 20_000, 10), ("long_field", 10, 5_000), ("unbroken_field", 10, 0)])
def test_pdf_wraps_long_text_across_pages(hostile_world, tmp_path, attack, note_chars, field_chars):
    from pypdf import PdfReader

    from engine.cases import report as rp

    note = _words(note_chars, "note")
    field = _words(field_chars, "field") if field_chars else "§" * 5_000  # one 5,000-character token
    pdf = rp.to_pdf(_report_of(hostile_world, note, field, tmp_path))
    pages = PdfReader(io.BytesIO(pdf)).pages
    text = "\n".join(p.extract_text() for p in pages)
    if note_chars >= 5_000 or field_chars >= 5_000:
        assert len(pages) >= 3
    # every word of the note, in order, three times (the narrative's disposition note, the disposition
    # history and the notes tables): nothing cut
    words = note.split()
    assert re.findall(r"note\d{5}", text) == words + words + words
    if field_chars:
        assert re.findall(r"field\d{5}", text) == field.split()
    else:  # one unbroken token, wrapped at characters: all 5,000 of them, in the details column
        assert text.count("§") == 5_000


def test_pdf_shows_characters_its_font_lacks_as_code_points(hostile_world, tmp_path):
    """A note with a character the PDF font has no glyph for ("\ufdfd", an emoji) was blank in the
    PDF: the text was lost without a sign. It is written as [U+FDFD]; covered text is unchanged."""
    from pypdf import PdfReader

    from engine.cases import report as rp
    from engine.cases.report.pdf_writer import Doc

    note = "caller said \ufdfd then \U0001f642 – café Ünïcode ok"
    rep = _report_of(hostile_world, note, "Zürich", tmp_path)
    doc = Doc(rep)
    if not doc.unicode:
        pytest.skip("DejaVu fonts not installed: the core font's rule (latin-1) applies")
    assert doc.clean(note) == "caller said [U+FDFD] then [U+1F642] – café Ünïcode ok"
    text = " ".join(p.extract_text() for p in PdfReader(io.BytesIO(rp.to_pdf(rep))).pages)
    assert text.count("caller said [U+FDFD] then [U+1F642]") >= 2  # the disposition note and the notes table
    assert "Zürich" in text
    # a bidi control in a note is written visibly, as the page and the CSV show it (security test)
    bidi = _report_of(hostile_world, "amount 10\u202e05 USD", "x", tmp_path / "b")
    assert "amount 10\\u202e05 USD" in " ".join(p.extract_text() for p in PdfReader(io.BytesIO(rp.to_pdf(bidi))).pages)


# ------------------------------------------------------------------------------------ markdown / HTML payloads
def _rendered(markdown_source: str) -> str:
    """HTML a CommonMark renderer (raw HTML allowed: the worst case) makes of ``markdown_source``."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": True}).render(markdown_source)


def _no_link_or_image(html_out: str) -> None:
    assert "<a " not in html_out and "<img" not in html_out, html_out


#: what remark-gfm turns into links in the text *after* parsing (escapes are gone by then)
_GFM_AUTOLINK = re.compile(r"(?i)(https?://|www\.)|[-.\w+]+@[-\w]+(\.[-\w]+)+")


def _no_autolink(rendered_text: str) -> None:
    assert not _GFM_AUTOLINK.search(rendered_text), rendered_text


@pytest.mark.parametrize("attack", list(MARKUP))
def test_escaped_markdown_shows_the_literal_text(attack):
    import html as html_mod

    from dashboard.components.safe import md

    payload = MARKUP[attack]
    src = f"**Data** {md(payload)} · spec {md('demo')}"
    out = _rendered(src)
    _no_link_or_image(out)
    text = html_mod.unescape(re.sub(r"<[^>]+>", "", out)).strip()
    assert text.replace("\u2060", "") == f"Data {payload} · spec demo"  # the literal text
    _no_autolink(text)
    assert md("line one\nline two\r\n") == "line one line two "


@pytest.mark.parametrize("attack", list(MARKUP))
def test_chart_labels_and_hover_are_plain_text(hostile_world, attack):
    from engine.cases import figures as fig
    from engine.cases import view as cv

    payload = MARKUP[attack]
    src = cv.load_source(hostile_world["data"], cv.demo_spec_name())
    bundle = cv.load_model(hostile_world["model"])
    scores = cv.score_source(bundle, src.frame)
    ent = cv.rank_entities(scores, bundle.threshold)["entity_id"].iloc[0]
    tl = cv.entity_timeline(src.frame, scores, ent, bundle.threshold).assign(merchant_city=payload)
    expls = cv.explain_query(bundle, src.frame, cv.default_query(tl), methods=("integrated_gradients",))
    e = expls["integrated_gradients"]
    figs = [fig.timeline_figure(tl, 0.5, hover_columns=["merchant_city"]),
            fig.field_bars(e, values=[payload] * len(e.field_names)),
            fig.attribution_bars(e, labels=[payload] * len(e.transaction_ids)),
            fig.field_heatmap(e, labels=[payload] * len(e.transaction_ids))]
    for f in figs:
        text = f.to_json()
        if "<" in payload:
            assert "<a " not in text and "<img" not in text and "&lt;" in text


# ------------------------------------------------------------------- every page, every markdown context
HOST = "127.0.0.1:9"
_TEXT_KEYS = {"body", "label", "help", "placeholder", "caption", "text"}


def _strings(obj, key=None):
    """Every string under a markdown-rendered key of a protobuf message dict."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(v, k)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v, key)
    elif isinstance(obj, str) and key in _TEXT_KEYS:
        yield obj


def _page_texts(at):
    """(markdown-rendered strings, Plotly specs) of every element and block of an AppTest run. The
    body of an ``st.text`` is shown as it is, never parsed as markdown (its ``help`` is): left out."""
    from google.protobuf.json_format import MessageToDict

    texts, charts = [], []
    stack = [at._tree]
    while stack:
        node = stack.pop()
        stack += list(getattr(node, "children", {}).values())
        proto = getattr(node, "proto", None)
        if proto is None or not hasattr(proto, "DESCRIPTOR"):
            continue
        d = MessageToDict(proto)
        if proto.DESCRIPTOR.full_name == "Text":  # st.text: plain text
            d.pop("body", None)
        texts += list(_strings(d))
        if "spec" in d and isinstance(d["spec"], str):
            charts.append(d["spec"])
    return texts, charts


@pytest.fixture(scope="module")
def markup_world(tmp_path_factory):
    """Demo slice whose last card carries markdown / HTML payloads in merchant, city, state and MCC
    (new categories in its latest transactions, so reason codes cite them), a file name and a model
    name with payloads, and a tiny model fitted on it."""
    from engine.cases import view as cv
    from tiny_models import demo_slice, tiny_checkpoint

    d = tmp_path_factory.mktemp("markup")
    clean = demo_slice(d / "clean.csv", 600)
    df = pd.read_csv(clean, dtype=str, keep_default_na=False)
    payloads = list(MARKUP.values())
    for col in ("Merchant City", "Merchant State", "MCC", "Merchant Name"):
        idx = df.index[-6:]
        df.loc[idx, col] = [payloads[i % len(payloads)] for i in range(len(idx))]
    data = d / "![x](http:127.0.0.1:9) [verify your card](http:127.0.0.1:9) <img src=x>.csv"
    write_csv(df, data)
    src = cv.load_source(data, cv.demo_spec_name())
    tiny_checkpoint(src.frame, src.spec, d / "model", {"name": "tiny [verify your card](http://127.0.0.1:9/x)",
                                                       "thresholds": {"review": 0.0, "decline": 0.99}})
    ent = src.frame["entity_id"].iloc[-1] if False else df["User"].iloc[-1] + ":" + df["Card"].iloc[-1]
    return {"dir": d, "data": data, "model": d / "model", "entity": ent}


def test_no_page_renders_data_or_user_text_as_markdown(markup_world, monkeypatch, tmp_path):
    import html as html_mod

    from streamlit.testing.v1 import AppTest

    from dashboard.components.access import SESSION_KEY
    from engine.cases.store import CaseStore
    from engine.serve import access as ac

    evil_analyst = "![x](http://127.0.0.1:9/img.png) [verify your card](http://127.0.0.1:9/x)"
    evil_note = "<img src=http://127.0.0.1:9/img.png> [verify your card](http://127.0.0.1:9/x) www.evil.invalid"
    monkeypatch.setenv("FRAUDLENS_DATA", str(markup_world["data"]))
    monkeypatch.setenv("FRAUDLENS_SPEC", "demo")
    monkeypatch.setenv("FRAUDLENS_MODEL", str(markup_world["model"]))
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("FRAUDLENS_DEMO", raising=False)
    monkeypatch.delenv("FRAUDLENS_DATA_ROOTS", raising=False)
    monkeypatch.setenv("FRAUDLENS_PSEUDONYM_SALT", "t")
    monkeypatch.delenv("FRAUDLENS_FOUR_EYES", raising=False)
    monkeypatch.delenv("FRAUDLENS_MAX_ROWS", raising=False)
    app = str(ROOT / "dashboard" / "app.py")
    seen_payload = False
    for page, state in [("pages/queue.py", {}), ("pages/cases.py", {"entity_id": markup_world["entity"]}),
                        ("pages/case.py", {"entity_id": markup_world["entity"], "trust_show": True}),
                        ("pages/model.py", {})]:
        at = AppTest.from_file(app, default_timeout=180)
        # signed in (as the sign-in form does) under a hostile name: names come to the pages from
        # the identity and from the case store's history, whatever wrote them there
        at.session_state[SESSION_KEY] = ac.Identity(evil_analyst, "analyst", "password")
        for k, v in state.items():
            at.session_state[k] = v
        at.switch_page(page)
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        if page == "pages/case.py":  # a disposition by the hostile analyst, with a hostile note
            at.radio(key="disp_choice").set_value("escalate")
            at.text_area(key="disp_note").set_value(evil_note)
            at.button(key="FormSubmitter:disposition_form-Record disposition").click().run()
            assert not at.exception, [e.value for e in at.exception]
            with CaseStore(tmp_path / "cases.sqlite3") as s:
                assert s.audit_log()["actor"].eq(evil_analyst).any()
        assert f"{evil_analyst} · analyst" in [t.value for t in at.sidebar.text]  # who: plain st.text
        texts, charts = _page_texts(at)
        for t in texts:
            out = _rendered(t)
            _no_link_or_image(out)
            _no_autolink(html_mod.unescape(re.sub(r"<[^>]+>", "", out)))
        seen_payload |= any("verify your card" in t for t in texts)
        for spec in charts:
            assert "<a " not in spec and "<img" not in spec, page
    assert seen_payload  # the payloads were on the pages, as text


def test_a_nul_inside_a_cell_is_written_as_visible_text():
    df = pd.DataFrame({"value": ["ab\x00cd", "\x00=1+1", None], "n": [1, 2, 3], "col\x00": ["x", "y", "z"]})
    data = csv_bytes(df)
    assert b"\x00" not in data
    rows = list(csv.reader(io.StringIO(data.decode("utf-8"))))
    assert rows[0] == ["value", "n", "col\\x00"]
    assert rows[1][0] == "ab\\x00cd" and rows[2][0] == "'\\x00=1+1" and rows[3][0] == ""
    assert df["value"][0] == "ab\x00cd"  # the caller's frame is not changed


def test_terminal_control_sequences_in_cells_are_written_as_visible_text():
    """An ESC / CSI / BEL from the data would drive the terminal of whoever runs ``cat`` on the
    file (clear the screen, set the title): written as ``\\xNN``; tab, newline and CR kept."""
    df = pd.DataFrame({"merchant": ["\x1b[2J\x1b]0;pwned\x07", "a\x9bb\x7f", "tab\there", "two\nlines", "Zürich 中"],
                       "n": [1, 2, 3, 4, 5]})
    data = csv_bytes(df)
    assert not re.search(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", data) and "\x9b" not in data.decode("utf-8")
    rows = list(csv.reader(io.StringIO(data.decode("utf-8"))))
    assert [r[0] for r in rows[1:]] == ["\\x1b[2J\\x1b]0;pwned\\x07", "a\\x9bb\\x7f", "tab\there", "two\nlines",
                                        "Zürich 中"]


def test_bidi_controls_and_line_separators_in_cells_are_written_as_visible_text():
    """Trojan Source (CVE-2021-42574): U+202E makes "txn_5€01" read as "txn_10€5" in a viewer that
    applies the bidi algorithm; U+2028 breaks a row in some viewers. Written as ``\\uNNNN``; other
    non-ASCII text (Arabic, Hebrew letters themselves) is kept."""
    cells = ["amt \u202e01.5\u202c", "\u2066iso\u2069 \u2067x\u2068y", "l\u200em\u200fa\u061cb", "row\u2028two\u2029",
             "שלום مرحبا"]
    data = csv_bytes(pd.DataFrame({"merchant\u202e": cells}))
    text = data.decode("utf-8")
    assert not re.search("[\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]", text)
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["merchant\\u202e"]
    assert [r[0] for r in rows[1:]] == ["amt \\u202e01.5\\u202c", "\\u2066iso\\u2069 \\u2067x\\u2068y",
                                        "l\\u200em\\u200fa\\u061cb", "row\\u2028two\\u2029", "שלום مرحبا"]
