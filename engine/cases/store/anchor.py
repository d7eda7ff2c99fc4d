"""Audit anchors: the log's head written down somewhere else, so a rewrite of the whole chain shows.

The hash chain (:mod:`engine.cases.store.chain`) makes an edit evident, but it is not keyed: someone
who can write the database file can change a row and recompute every later hash, the head and the
id sequence, and :func:`~engine.cases.store.chain.verify_chain` then says ``ok``. The standard
answer (as certificate-transparency and syslog "witnesses" do) is to keep copies of the head where
that person cannot write: an **anchor** is one audit row's id and ``row_hash`` (with its time),
taken from the store (:func:`current_anchor`) and kept off this host (a ticket, a SIEM, a
``fraudlens audit head >> /mnt/worm/anchors.txt`` cron job). Every exported case report carries the
anchor of the moment it was made (``audit_anchor`` in the JSON, a line in the PDF), so each report
handed outside the bank is one more copy.

:func:`check_anchors` compares the store with anchors: the row an anchor names must still be there
with the same hash. Because each hash covers the previous one, a match means the log up to that
row is exactly what it was when the anchor was taken; a row changed at or before it (and every
later hash recomputed) changes it, and a log cut back to before it has lost it. An anchor says
nothing about rows written after it: take them regularly.

Text form of an anchor (one line; :meth:`AuditAnchor.line`, :func:`parse_anchors`)::

    fraudlens-audit-anchor/1 row=57 sha256=<64 hex digits> at=2026-12-07T18:30:00+00:00
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from engine.cases.store.common import ChainVerdict, lenient_snapshot

#: first word of an anchor line (the format's version)
ANCHOR_PREFIX = "fraudlens-audit-anchor/1"
#: what an anchor's time may hold (ISO 8601 text): nothing that could reach a terminal as a control
_TS = r"[0-9A-Za-z:.+\-]{1,64}"
_LINE = re.compile(rf"^{re.escape(ANCHOR_PREFIX)} row=([0-9]{{1,18}}) sha256=([0-9a-f]{{64}})(?: at=({_TS}))?$")
#: highest row id an anchor may name (SQLite's integer range)
MAX_ROW_ID = 2**63 - 1


class AnchorFileError(ValueError):
    """An anchor file that cannot be read as anchors (the message names the file and line)."""


@dataclass(frozen=True)
class AuditAnchor:
    """One audit row's id and hash, as kept off the host.

    Attributes:
        row_id: the audit row's id (1 = the first row).
        row_hash: its ``row_hash`` (SHA-256, 64 lowercase hex digits).
        ts: its time (UTC ISO 8601 text, as stored); informative, not compared.
    """

    row_id: int
    row_hash: str
    ts: str = ""

    def line(self) -> str:
        """The one-line text form (module docstring)."""
        return f"{ANCHOR_PREFIX} row={self.row_id} sha256={self.row_hash}" + (f" at={self.ts}" if self.ts else "")

    def as_dict(self) -> dict[str, object]:
        """``{"row_id", "row_hash", "ts"}`` (the report's ``audit_anchor``)."""
        return {"row_id": int(self.row_id), "row_hash": self.row_hash, "ts": self.ts}


def current_anchor(conn: sqlite3.Connection) -> AuditAnchor | None:
    """The anchor of the last audit row (``None`` for an empty log). Reads only.

    The last row is the one ``audit_head`` names when that row exists with that hash, else the
    row with the highest id (a broken head is for :func:`~engine.cases.store.chain.verify_chain`
    to report; the anchor is always a row that is really there).
    """
    with lenient_snapshot(conn):  # the head and the row from one snapshot
        head = conn.execute("SELECT last_id, last_hash FROM audit_head WHERE id = 1").fetchone()
        row = None
        if head is not None:
            row = conn.execute("SELECT id, row_hash, ts FROM audit_log WHERE id = ? AND row_hash = ?",
                               (head[0], head[1])).fetchone()
        if row is None:
            row = conn.execute("SELECT id, row_hash, ts FROM audit_log ORDER BY id DESC LIMIT 1").fetchone()
    if row is None:
        return None
    return AuditAnchor(int(row[0]), str(row[1]), str(row[2] or ""))


def check_anchors(conn: sqlite3.Connection, anchors: list[AuditAnchor]) -> ChainVerdict:
    """Whether every anchor's row is still in the log with the hash it had (module docstring).

    Returns ``ok`` with ``rows_checked`` = the number of anchors, or a broken verdict naming the
    lowest anchored row that is gone or changed. Reads only; never raises for a mismatch. An
    anchor that matches proves the log up to its row only together with a chain that verifies
    (:func:`~engine.cases.store.chain.verify_chain`: the links between the rows): check both.
    """
    with lenient_snapshot(conn):
        for a in sorted(anchors, key=lambda a: a.row_id):
            got = conn.execute("SELECT row_hash FROM audit_log WHERE id = ?", (int(a.row_id),)).fetchone()
            when = f" (anchor taken at {a.ts})" if a.ts else ""
            if got is None:
                reason = (f"audit row {a.row_id} named by an anchor{when} is gone: the log was cut back or "
                          "rewritten")
            elif str(got[0]) != a.row_hash:
                reason = (f"audit row {a.row_id} no longer has the hash an anchor recorded{when}: the log was "
                          f"rewritten at or before row {a.row_id}")
            else:
                continue
            return ChainVerdict(ok=False, rows_checked=len(anchors), first_broken_id=int(a.row_id), reason=reason)
    return ChainVerdict(ok=True, rows_checked=len(anchors))


def _from_json(doc: object) -> AuditAnchor | None:
    """The anchor of a report JSON (its ``audit_anchor``) or of ``audit head --json`` (the object
    itself); ``None`` when it holds no valid one."""
    if not isinstance(doc, dict):
        return None
    a = doc.get("audit_anchor", doc)
    if not isinstance(a, dict):
        return None
    rid, h, ts = a.get("row_id"), a.get("row_hash"), a.get("ts") or ""
    if isinstance(rid, int) and not isinstance(rid, bool) and 1 <= rid <= MAX_ROW_ID and isinstance(h, str) \
            and re.fullmatch(r"[0-9a-f]{64}", h) and isinstance(ts, str) and (ts == "" or re.fullmatch(_TS, ts)):
        return AuditAnchor(rid, h, ts)
    return None


def parse_anchors(text: str, source: str = "<text>") -> list[AuditAnchor]:
    """Anchors from ``text``, one per line: anchor lines (:meth:`AuditAnchor.line`) or JSON objects
    (``audit head --json``), blank lines and lines starting ``#`` skipped; or one exported
    report's JSON (its ``audit_anchor``). Lines end at ``\n`` only (as editors number them).

    Raises:
        AnchorFileError: a line that is not an anchor (named by ``source`` and line number), a
            report JSON without a valid ``audit_anchor``, or no anchor at all.
    """
    stripped = text.lstrip("\ufeff").strip()
    if stripped.startswith("{") and "\n" in stripped.rstrip():  # several lines: maybe a pretty-printed report
        try:
            doc = json.loads(stripped)
        except (ValueError, RecursionError):
            doc = None  # JSON lines, checked one by one below
        if isinstance(doc, dict):
            a = _from_json(doc)
            if a is None:
                raise AnchorFileError(f"{source}: a JSON file without an audit_anchor (row_id, row_hash, ts): expected "
                                      "a fraudlens case report (JSON) or anchor lines")
            return [a]
    out: list[AuditAnchor] = []
    for no, raw in enumerate(stripped.split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        shown = line[:80].encode("ascii", "backslashreplace").decode("ascii")
        if line.startswith("{"):
            try:
                a = _from_json(json.loads(line))
            except (ValueError, RecursionError):
                raise AnchorFileError(f"{source}, line {no}: not valid JSON") from None
            if a is None:
                raise AnchorFileError(f"{source}, line {no}: JSON without a valid row_id, row_hash (64 hex) and ts: "
                                      f"expected a report's audit_anchor or `fraudlens audit head --json`, got {shown!r}")
            out.append(a)
            continue
        m = _LINE.match(line)
        if m is None:
            raise AnchorFileError(f"{source}, line {no}: expected '{ANCHOR_PREFIX} row=N sha256=<64 hex> "
                                  f"[at=TIME]', got {shown!r}")
        row_id = int(m.group(1))
        if row_id < 1:
            raise AnchorFileError(f"{source}, line {no}: row must be 1 or more, got {row_id}")
        out.append(AuditAnchor(row_id, m.group(2), m.group(3) or ""))
    if not out:
        raise AnchorFileError(f"{source}: no anchor in the file")
    return out


def read_anchor_file(path: str | Path) -> list[AuditAnchor]:
    """:func:`parse_anchors` of a file (UTF-8; at most 16 MiB).

    Raises:
        AnchorFileError: unreadable, too large, not UTF-8, or not anchors (named by path and line).
    """
    p = Path(path)
    try:
        with open(p, "rb") as f:
            data = f.read(16 * 2**20 + 1)
    except OSError as e:
        raise AnchorFileError(f"{p}: cannot read ({e.strerror or e})") from None
    if len(data) > 16 * 2**20:
        raise AnchorFileError(f"{p}: larger than 16 MiB; expected anchor lines or one report JSON")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AnchorFileError(f"{p}: not UTF-8 text (byte {e.start})") from None
    return parse_anchors(text, str(p))
