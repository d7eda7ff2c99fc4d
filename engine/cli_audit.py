"""``fraudlens audit head`` / ``fraudlens audit verify``: the case store's audit log from the command line.

``head`` prints the anchor of the last audit row (:mod:`engine.cases.store.anchor`) for a copy
kept off this host (a cron job appending it to write-once storage or a SIEM); ``verify`` recomputes
the hash chain and every cross-check of :func:`engine.cases.store.chain.verify_chain` and, with
``--anchors``, checks that each anchored row is still there with its hash, which catches a log
rewritten with every later hash recomputed (the chain alone cannot). Both only read the store;
neither needs sign-in (they print ids, hashes and times, never case content). The store is opened
read-only (SQLite ``mode=ro``): not even its journal mode changes. ``head`` refuses a log whose
chain does not verify. Exit status of
``verify``: 0 intact, 1 broken (the first broken row and why), 2 a usage error (no store, an
unreadable anchor file).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from engine.cli_common import _fail, console
from engine.data.csv_writer import show_controls

audit_app = typer.Typer(no_args_is_help=True, help="the case store's audit log: its head (anchor) and its verification")

_CASES_HELP = "case store file (default: $FRAUDLENS_DATA_DIR/cases.sqlite3, the dashboard's)"


def _open(cases: Optional[Path]):
    """A read-only connection (``mode=ro``: the file is never changed, not even its journal mode)
    to an existing case store of the current schema; never creates one."""
    import sqlite3
    from urllib.parse import quote

    from engine.cases.store import LATEST_VERSION, default_db_path
    from engine.cases.store.common import lenient_text

    db = cases or default_db_path()
    if not db.is_file():
        _fail(f"no case store at {db} (pass --cases, or set $FRAUDLENS_DATA_DIR to the dashboard's data directory)")
    try:
        conn = sqlite3.connect(f"file:{quote(str(db.resolve()))}?mode=ro", uri=True, isolation_level=None)
        conn.text_factory = lenient_text
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as e:
        _fail(f"{db}: cannot be read as a case store ({type(e).__name__}: {e})")
    if version != LATEST_VERSION:
        conn.close()
        _fail(f"{db}: " + ("not a case store (schema version 0)" if version == 0 else
                           f"schema version {version}, this fraudlens reads {LATEST_VERSION}"
                           + (": open it once with the dashboard (or any command that writes cases) to migrate it"
                              if version < LATEST_VERSION else ": a newer fraudlens wrote it")))
    return db, conn


@audit_app.command("head")
def audit_head(
    cases: Optional[Path] = typer.Option(None, "--cases", help=_CASES_HELP),
    as_json: bool = typer.Option(False, "--json", help="print {row_id, row_hash, ts} as JSON instead of the anchor line"),
):
    """Print the anchor of the last audit row (one line) to keep off this host; `audit verify --anchors` checks it.

    Refuses (exit status 1) when the chain does not verify: an anchor of a tampered log would vouch for it."""
    from engine.cases.store.anchor import current_anchor
    from engine.cases.store.chain import verify_chain

    db, conn = _open(cases)
    try:
        conn.execute("BEGIN")  # the verdict and the anchor from one snapshot
        chain = verify_chain(conn)
        a = current_anchor(conn)
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    if not chain.ok:
        console.print(f"error: no anchor taken: {show_controls(chain.message)}", markup=False, highlight=False,
                      soft_wrap=True)
        raise typer.Exit(1)
    if a is None:
        _fail(f"{db}: the audit log is empty (nothing to anchor yet)")
    console.print(json.dumps(a.as_dict()) if as_json else a.line(), markup=False, highlight=False, soft_wrap=True)


@audit_app.command("verify")
def audit_verify(
    cases: Optional[Path] = typer.Option(None, "--cases", help=_CASES_HELP),
    anchors: Optional[list[Path]] = typer.Option(
        None, "--anchors", metavar="FILE",
        help="file of anchor lines (from `audit head`) or an exported report's JSON; repeatable"),
):
    """Verify the audit log's hash chain and cross-checks, and each anchor; exit 1 when anything is broken."""
    from engine.cases.store.anchor import AnchorFileError, check_anchors, read_anchor_file
    from engine.cases.store.chain import verify_chain

    kept = []
    for f in anchors or []:
        try:
            kept += read_anchor_file(f)
        except AnchorFileError as e:
            _fail(str(e))
    db, conn = _open(cases)
    try:
        conn.execute("BEGIN")  # the chain, the anchors and the count from one snapshot
        chain = verify_chain(conn)
        pinned = check_anchors(conn, kept) if kept else None
        n_rows = int(conn.execute("SELECT count(*) FROM audit_log").fetchone()[0])
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    ok = chain.ok and (pinned is None or pinned.ok)
    console.print(show_controls(f"{db}: {n_rows:,} audit rows"), soft_wrap=True, markup=False, highlight=False)
    console.print(("chain: intact" if chain.ok else f"chain: BROKEN: {show_controls(chain.message)}"), soft_wrap=True,
                  markup=False)
    if pinned is None:
        line = "anchors: none given (a log rewritten with every hash recomputed verifies without them; pass --anchors)"
    elif not pinned.ok:
        line = f"anchors: BROKEN: {show_controls(pinned.reason)}"
    elif chain.ok:
        line = (f"anchors: {len(kept)} checked, all match (the log up to row {max(a.row_id for a in kept)} is as it "
                "was when they were taken)")
    else:
        line = (f"anchors: {len(kept)} checked, each anchored row still has its recorded hash (the chain above is "
                "broken: nothing is vouched for)")
    console.print(line, soft_wrap=True, markup=False, highlight=False)
    if not ok:
        raise typer.Exit(1)
