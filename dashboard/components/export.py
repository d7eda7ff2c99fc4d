"""Compliance downloads of the case on screen: PDF, JSON, CSV (built by engine.cases.report).

Nothing is recomputed: the report is built from the explanations the case page already has
(cached by ``dashboard.state``); the report dict and each format's bytes are cached per
process by *case + explanation key* (case id and version, data sha, spec, model sha,
transaction, thresholds), so a download never reruns an explanation and a re-download serves
identical bytes (same report id and sha256). A new disposition bumps the case version and so
produces a new report.

The bytes are built *inside the script run* (with the session state available), after the analyst
clicks "Prepare the exports": the report then carries this session's what-if edits and
randomisation verdicts. (A deferred ``st.download_button`` callable runs outside the session -
"missing ScriptRunContext" - and saw no edits and no verdicts.) The prepared exports belong to
one key (case version, query, thresholds, edits, verdicts shown): any change asks to prepare
again, so a download never carries a state the page no longer shows.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from typing import Any, Callable

import streamlit as st

from dashboard import components as comp
from dashboard.components.safe import md
from engine.cases import fmt
from engine.cases import view as cv
from engine.cases import report as rp
from engine.cases.store import CaseStoreError
from engine.serve import access as ac

PREPARED = "export_prepared"  # session state: the key of the exports prepared in this session
PREPARE_NOW = "prepare-now"  # PREPARED after a click on "Prepare the exports", until the run that builds them
EXPORT_FAILED = "export_failed"  # session state: format -> why its download was refused (shown on the next run)
_LOCK = threading.Lock()
log = logging.getLogger("fraudlens.dashboard")
_CACHE: "OrderedDict[tuple, Any]" = OrderedDict()
_MAX = 48
MIME = {"pdf": "application/pdf", "json": "application/json", "csv": "text/csv"}


def _cached(key: tuple, make: Callable[[], Any]) -> Any:
    with _LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    val = make()
    with _LOCK:
        _CACHE.setdefault(key, val)
        while len(_CACHE) > _MAX:
            _CACHE.popitem(last=False)
        return _CACHE[key]


def report_key(loaded: Any, case: dict, query: str, thresholds: dict, who: str | None = None) -> tuple:
    """The cache key of one case report: the case and its record (version and latest audit row:
    a note added since is in the next report), data, model, query, thresholds, and the exporting
    user (``exported_by`` is theirs, never another session's)."""
    path, spec, sha, max_rows, model_path, model_sha = loaded.key
    mark = comp.get_store().case_audit_mark(int(case["id"]))
    return ("report", int(case["id"]), int(case["version"]), mark, sha, spec, max_rows, model_sha, str(query),
            float(thresholds["review"]), float(thresholds["decline"]), who)


def build_case_report(loaded: Any, case: dict, entity: str, expls: dict, tl: Any, thresholds: dict,
                      scored_at: str | None, who: str | None, trust: dict | None = None,
                      fields: dict | None = None) -> dict:
    """The report model from what the case page holds (``fields``: history effect and per-field
    attributions, engine.cases.fields_view), by the path ``fraudlens report`` takes too
    (:func:`engine.cases.report.case_export.case_report`)."""
    from engine.cases.report.case_export import case_report

    return case_report(comp.get_store(), case, entity_id=entity, source=loaded.source, bundle=loaded.bundle,
                       scores=loaded.scores, expls=expls, thresholds=thresholds, exported_by=who,
                       file_label=str(loaded.src.get("label", "")), max_rows=loaded.src.get("max_rows"),
                       scored_at=scored_at, trust=trust, fields=fields)


def render_exports(loaded: Any, case: dict, entity: str, expls: dict, tl: Any, thresholds: dict,
                   scored_at: str | None, who: str | None, trust: dict | None = None, fields: Any = None) -> None:
    """Three download buttons (PDF, JSON, CSV) for the explained query of this case."""
    expl = next((v for v in expls.values() if hasattr(v, "query_transaction_id")), None)
    if expl is None:
        return
    query = str(expl.query_transaction_id)
    key = report_key(loaded, case, query, thresholds, who)
    if trust is None and isinstance(expls.get("trust"), dict):
        trust = expls["trust"]

    if callable(trust):  # trust checks + what-if edits: keyed by the edits and verdicts in force
        key = key + session_key(loaded, query)

    narrative_id = render_narrative(case)
    key = key + ("narrative", narrative_id)
    st.markdown("**Export for compliance**")
    st.caption("PDF, JSON (schema `engine/cases/report/report_schema.json`) and per-transaction attributions (CSV) of "
               f"transaction {md(cv.mask(query))}; card numbers masked, entity pseudonymised. The PDF carries the "
               "JSON report's id and sha256.")
    ss = st.session_state
    if ss.get(PREPARED) == PREPARE_NOW:  # the key of this run, not of the run that drew the button: a what-if
        ss[PREPARED] = key  # edit reruns only its fragment (dashboard/components/whatif.py), not this button
    if ss.get(PREPARED) != key:
        st.button("Prepare the exports", key="dl_prepare", on_click=ss.__setitem__, args=(PREPARED, PREPARE_NOW),
                  icon=":material/inventory_2:",
                  help="Builds the PDF, JSON and CSV now, with this session's what-if edits and randomisation "
                       "verdicts; a change on the page asks to prepare them again.")
        return

    # built here, in the script run: the trust payload reads this session's state
    def make_report() -> dict:
        t = trust() if callable(trust) else trust
        fl = fields() if callable(fields) else fields
        return build_case_report(loaded, case, entity, expls, tl, thresholds, scored_at, who, t, fl)

    def make_pdf() -> bytes:  # charts drawn by the PDF writer itself (vectors and text)
        return rp.to_pdf(report)

    with st.spinner("Preparing the exports…"):
        report = _cached(key, make_report)
        pdf = _cached(key + ("pdf",), make_pdf)
        js = _cached(key + ("json",), lambda: rp.to_json(report))
        csv = _cached(key + ("csv",), lambda: rp.to_csv(report))
    failed = ss.setdefault(EXPORT_FAILED, {})  # filled by a download that could not be audited (other thread)
    for kind in list(failed):
        st.error(md(failed.pop(kind)), icon=":material/error:")
    c = st.columns(3)
    ident, store = comp.signed_in(), comp.get_store()
    for col, (kind, label, data, icon) in zip(c, (("pdf", "Download PDF", pdf, ":material/picture_as_pdf:"),
                                                  ("json", "Download JSON", js, ":material/data_object:"),
                                                  ("csv", "Download CSV", csv, ":material/table:"))):
        name = rp.report_filename(report, kind)
        col.download_button(label, audited_download(store, ident, int(case["id"]), report, kind, data, failed, name),
                            file_name=name, mime=MIME[kind], key=f"dl_{kind}", on_click="ignore", icon=icon)
    st.caption(f"Report {md(report['report_id'])} · exported {fmt.format_ts(report['exported_at'])} · every "
               "download is recorded in the audit log with the report's id and sha256 (a download that cannot be "
               "recorded is refused; the reason shows here at the page's next run)")


def _purge_later(data: bytes, mime: str, file_name: str) -> None:
    """Remove the served report from Streamlit's in-memory media store after
    :func:`report_url_ttl_s` seconds: Streamlit serves ``/media/<id>`` to anyone who has the
    address, without a session check, until it prunes unused files (a security review replayed a
    downloaded report's address from a shell with no sign-in). Uses Streamlit's runtime
    internals; where they are not there (AppTest), nothing is done."""
    def purge() -> None:
        try:
            from streamlit import runtime
            from streamlit.runtime.memory_media_file_storage import _calculate_file_id

            storage = runtime.get_instance().media_file_mgr._storage
            storage.delete_file(_calculate_file_id(data, mime, file_name))
        except Exception as e:  # noqa: BLE001 - another Streamlit version: the file is pruned later, as before
            log.warning("report bytes not purged from the media store: %s", e)

    t = threading.Timer(report_url_ttl_s(), purge)
    t.daemon = True
    t.start()


def report_url_ttl_s() -> float:
    """Seconds a downloaded report stays at its ``/media/`` address (``$FRAUDLENS_REPORT_URL_TTL_S``,
    default 30: the browser fetches it at once)."""
    import os

    try:
        return max(0.5, float(os.environ.get("FRAUDLENS_REPORT_URL_TTL_S", "30")))
    except ValueError:
        return 30.0


def audited_download(store: Any, ident: Any, case_id: int, report: dict, kind: str, data: bytes,
                     failed: dict | None = None, file_name: str | None = None) -> Callable[[], bytes]:
    """The deferred data of one download button: Streamlit calls it when the user clicks (no
    bytes are served before), and it writes the ``report_exported`` audit row
    (engine.cases.store.AuditMixin.record_export) *before* it returns the prepared bytes; if the
    row cannot be written, or the user is no longer one whose role views cases (the credentials
    file read now: a removed user's page still shows the button), it raises and nothing is
    served. Runs outside the script run (no session state): the identity and the store are
    taken when the button is drawn. Streamlit tells the browser only "Failed to generate file"; the
    reason goes into ``failed`` (the session's dict: shown on the page's next run) and the log."""

    def make() -> bytes:
        try:
            now = ac.still_signed_in(ac.users_path(), ident) if ident is not None else None
            who = ac.require(now, ac.VIEW_CASES).name
            store.record_export(case_id, report_id=report["report_id"], report_sha256=report["report_sha256"],
                                fmt=kind, analyst=who, file_sha256=hashlib.sha256(data).hexdigest())
        except Exception as e:
            why = f"The {kind.upper()} download was refused: it could not be recorded in the audit log ({e})."
            if failed is not None:
                failed[kind] = why
            log.warning("%s", why)
            raise
        if file_name is not None:
            _purge_later(data, MIME[kind], file_name)
        return data

    return make


NARRATIVE_MSG = "narrative_msg"


def _save_narrative(case_id: int) -> None:
    ss = st.session_state
    text = (ss.get(f"narrative_text_{case_id}") or "").strip()
    try:  # checked at the action, not only by hiding the form
        who = ac.require(comp.signed_in(), ac.NOTE).name
        if not text:
            raise ValueError("write the narrative first")
        comp.get_store().save_narrative(case_id, text, analyst=who)
    except (ac.AccessDenied, CaseStoreError, ValueError) as e:
        ss[NARRATIVE_MSG] = ("error", md(e))
        return
    ss[NARRATIVE_MSG] = ("success", f"Narrative saved by {md(who)}; the next export carries it.")


def render_narrative(case: dict) -> int | None:
    """The analyst's report narrative of the case: an editor (roles that add notes), stored
    append-only and audited (``CaseStore.save_narrative``); returns the id of the latest one
    (part of the export key, so a new narrative asks to prepare the exports again)."""
    store = comp.get_store()
    cur = store.narrative(case["id"])
    st.markdown("**Report narrative**")
    msg = st.session_state.pop(NARRATIVE_MSG, None)
    if msg:
        getattr(st, msg[0])(msg[1])
    if ac.can(comp.signed_in(), ac.NOTE):
        k = f"narrative_text_{case['id']}"
        if k not in st.session_state:
            st.session_state[k] = cur["text"] if cur else ""
        with st.form(f"narrative_form_{case['id']}"):
            st.text_area("Narrative (opens the report: what happened, in your words)", key=k, height=140,
                         placeholder="Who, what, when, how much, and why it is suspicious")
            st.form_submit_button("Save narrative", on_click=_save_narrative, args=(int(case["id"]),))
    elif cur:  # a role that reads cases (an auditor) reads the narrative too, as text
        st.text(cv.mask(cur["text"]))
    if cur:
        st.caption(f"Saved by {md(cv.mask(cur['analyst']))} at {fmt.format_ts(cur['ts'])}.")
    elif not ac.can(comp.signed_in(), ac.NOTE):
        st.caption("No narrative written yet.")
    return int(cur["id"]) if cur else None


def session_key(loaded: Any, query: str) -> tuple:
    """The part of the export key that lives in this session: the what-if edits of ``query`` and
    whether the randomisation verdicts of the loaded model are shown (read in the script run)."""
    try:
        from dashboard.components.trust import SANITY_MODELS, edits_key, query_edits
    except ImportError:  # pragma: no cover - trust UI absent
        return ()
    sanity = loaded.bundle.sha256 in (st.session_state.get(SANITY_MODELS) or [])
    return ("edits", edits_key(query_edits(query)), "sanity", bool(sanity))
