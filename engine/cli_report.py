"""``fraudlens report``: a case's compliance report (PDF, JSON, CSV) from the command line.

The same report the dashboard's "Prepare the exports" builds (one path:
:func:`engine.cases.report.case_export.case_report`, with the same explanations, per-field block and
trust checks, :mod:`engine.cases.trust_export`; only a dashboard session's what-if edits and
randomisation verdicts are not in it), for a compliance officer who exports many
cases, or a case without a browser. The user signs in with the password of the credentials
file (``$FRAUDLENS_USERS``; prompted, never an option), needs a role that views cases, and each
file written is an audited download (``report_exported``, with the report's id and sha256) in
the case store, as in the dashboard. The explanations are read from the dashboard's explanation
cache when it already has them (the report then carries the numbers the analyst saw), else
computed and stored there.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from engine.cli_common import _fail, _load_model, _read, _require_accepted, _safe, console

FORMATS = ("pdf", "json", "csv")


def report(
    case: int = typer.Option(..., "--case", min=1, help="case number (the Work queue's Case column)"),
    data: Path = typer.Option(..., exists=True, help="the data file the case was opened from"),
    spec: Optional[str] = typer.Option(None, help="spec name or path (default: the model's spec)"),
    model: Optional[Path] = typer.Option(None, help="checkpoint directory (default: the demo model)"),
    transaction: Optional[str] = typer.Option(None, help="transaction to explain (default: the case's riskiest)"),
    out: Path = typer.Option(Path("."), help="directory the files are written to"),
    formats: str = typer.Option("pdf,json,csv", "--formats", help="comma-separated: pdf, json, csv"),
    max_rows: Optional[int] = typer.Option(None, "--max-rows", min=1,
                                           help="read only the first N rows, as a dashboard started with --max-rows"),
    user: str = typer.Option(..., help="your user name in the credentials file ($FRAUDLENS_USERS)"),
    password_stdin: bool = typer.Option(False, "--password-stdin",
                                        help="read the password from the first line of standard input (scripts)"),
):
    """Write one case's compliance report (PDF, JSON, CSV) as the dashboard exports it; each file is audited."""
    from engine.cases import report as rp
    from engine.cases import view as cv
    from engine.cases.explain_cache import ExplanationCache
    from engine.cases.report.case_export import case_report
    from engine.cases.store import CaseNotFoundError, CaseStore, default_db_path, source_id
    from engine.cases.thresholds import thresholds_in_force
    from engine.data.spec import source_spec_key
    from engine.serve import access as ac
    from engine.serve.casework import service_source_id

    kinds = list(dict.fromkeys(k.strip().lower() for k in formats.split(",") if k.strip()))  # each format once
    bad = [k for k in kinds if k not in FORMATS]
    if bad or not kinds:
        _fail(f"--formats: expected some of {', '.join(FORMATS)}, got {formats!r}")
    if out.exists() and not out.is_dir():
        _fail(f"--out {out} is a file; give a directory")

    # sign-in first: nothing is read or written for someone who is not a user who views cases
    users = ac.users_path()
    if users is None:
        _fail(f"report needs sign-in: set ${ac.ENV_USERS} to the credentials file (fraudlens users add NAME --role R)")
    pw = (sys.stdin.readline().rstrip("\r\n") if password_stdin
          else typer.prompt("Password", hide_input=True, err=True))
    try:
        ident = ac.require(ac.authenticate(users, user, pw, client="cli"), ac.VIEW_CASES)
    except (ac.SignInError, ac.AccessDenied, ac.UsersFileError) as e:
        _fail(str(e))

    db = default_db_path()
    if not db.exists():
        _fail(f"no case store at {db} (set $FRAUDLENS_DATA_DIR to the dashboard's data directory)")
    bundle = _load_model(model)
    sp, res = _read(data, spec or bundle.spec, max_rows=max_rows, demo_model=model is None and spec is None,
                    label_required=False)
    _require_accepted(res, data, sp)
    src = cv.Source(frame=res.frame, rejected=res.rejected, rows_read=res.rows_read, path=data, spec=sp,
                    file_sha256=cv.file_identity(data))
    sid = source_id(src.file_sha256, source_spec_key(sp))
    with CaseStore(db) as store:
        try:
            row = store.get_case(case)
        except CaseNotFoundError:
            _fail(f"case {case} is not in the case store {db}")
        if row["model_sha256"] != bundle.sha256:
            _fail(f"case {case} was opened by model {row['model_sha256'][:12]}, not by --model ({bundle.sha256[:12]}): "
                  "give the model it was opened with")
        if row["source_id"] == service_source_id(bundle):
            _fail(f"case {case} was opened by the scoring service (fraudlens serve), not from a file: its history is "
                  "in the service's history store, which reports do not read; its explanation is at GET "
                  "/v1/explanations/<transaction id>")
        if row["source_id"] != sid:
            _fail(f"case {case} was opened from another data file (or the same file read with another spec) than "
                  f"--data {data.name}: give the file and spec it was opened from")
        entity = str(row["entity_id"])
        scores = cv.score_source(bundle, src.frame)
        mine = scores[scores["entity_id"].astype(str) == entity]
        query = str(transaction or row["max_transaction_id"])
        if query not in set(mine["transaction_id"].astype(str)):
            _fail(f"transaction {query!r} is not one of case {case}'s {len(mine):,} transactions")
        # the dashboard's explanations and per-field block of this transaction when it has them (same
        # cache key: model, source, transaction, max_rows), else computed and stored for it
        cache = ExplanationCache(db.parent / "explanations.sqlite")
        params = {"max_rows": max_rows}
        expls, how = cache.get_or_compute(bundle.sha256, sid, query, params,
                                          lambda: cv.explain_query(bundle, src.frame, query))
        from engine.cases.fields_view import cached_query_fields

        try:  # as the dashboard's export: the report goes on without the block if it cannot be computed
            fields, _ = cached_query_fields(cache, bundle, src.frame, sid, query, params, currency=src.currency)
        except Exception:  # noqa: BLE001
            fields = None
        from engine.cases.trust_export import case_trust_json

        trust = case_trust_json(bundle, src.frame, query, expls)  # the trust block the dashboard exports
        thr = thresholds_in_force(bundle, store)
        doc = case_report(store, row, entity_id=entity, source=src, bundle=bundle, scores=scores, expls=expls,
                          thresholds=thr, exported_by=ident.name, file_label=data.name, max_rows=max_rows,
                          scored_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), fields=fields,
                          trust=trust)
        rp.validate(doc)
        out.mkdir(mode=0o700, parents=True, exist_ok=True)  # a new folder: the owner only, as the files
        writers = {"pdf": rp.to_pdf, "json": rp.to_json, "csv": rp.to_csv}
        for k in kinds:
            path = out / rp.report_filename(doc, k)
            data = writers[k](doc)
            try:  # a new file only (never through a link, never over another file), readable by its owner only
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            except FileExistsError:
                _fail(f"{path} exists; fraudlens report never overwrites a report (choose another --out)")
            except OSError as e:
                _fail(f"cannot write {path}: {e.strerror or e}")
            try:  # the audit row first: a file is never left without its row (the dashboard serves after it too)
                store.record_export(case, report_id=doc["report_id"], report_sha256=doc["report_sha256"], fmt=k,
                                    analyst=ident.name, file_sha256=hashlib.sha256(data).hexdigest())
            except Exception as e:  # noqa: BLE001 - no audit row: no file
                os.close(fd)
                path.unlink(missing_ok=True)
                _fail(f"the audit log could not record the {k.upper()} download ({type(e).__name__}: {e}); nothing "
                      f"was written for it")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            except OSError as e:
                _fail(f"cannot write {path}: {e.strerror or e} (its audit row names the file's sha256)")
            console.print(f"wrote {_safe(str(path))}")
    console.print(_safe(f"case {case}, transaction {cv.mask(query)} (explanations {how}); report {doc['report_id']}, "
                        f"sha256 {doc['report_sha256']}; exported by {ident.name}, {len(kinds)} download(s) in the "
                        "audit log"))
