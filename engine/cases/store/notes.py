"""Case store notes: free-text notes on a case, append-only."""

from __future__ import annotations

import pandas as pd

from engine.cases.store.common import (
    NARRATIVE_COLUMNS,
    NOTE_COLUMNS,
    _require_text,
    _utcnow,
    resolve_analyst,
)


class NotesMixin:
    """Add and read a case's notes (mixin of :class:`CaseStore`)."""

    def add_note(self, case_id: int, text: str, *, analyst: str | None = None) -> int:
        """Append a note to the case; return the note id. The case's state is unchanged.

        Raises :class:`NoteRequiredError` (empty text), :class:`CaseNotFoundError`,
        :class:`MissingAnalystError`.
        """
        text = _require_text(text, "note text")
        analyst = resolve_analyst(analyst)
        with self._write() as conn:
            ts = _utcnow()
            row = self._case_row(conn, case_id)
            cur = conn.execute(
                "INSERT INTO notes(case_id, ts, analyst, text) VALUES (?, ?, ?, ?)",
                (row["id"], ts, analyst, text),
            )
            snap = self._snapshot(row)
            self._audit(
                conn, ts, analyst, "note_added", case_id=row["id"],
                model_sha256=row["model_sha256"], before=snap,
                after={**snap, "note_id": cur.lastrowid, "note": text},
            )
            return int(cur.lastrowid)

    def notes(self, case_id: int) -> pd.DataFrame:
        """The case's notes, oldest first (:data:`NOTE_COLUMNS`). Raises CaseNotFoundError."""
        self.get_case(case_id)
        rows = self._read(
            f"SELECT {', '.join(NOTE_COLUMNS)} FROM notes WHERE case_id = ? ORDER BY id",
            (int(case_id),),
        )
        return pd.DataFrame([tuple(r) for r in rows], columns=NOTE_COLUMNS)

    # -- report narratives (schema v4) ----------------------------------------------------------

    def save_narrative(self, case_id: int, text: str, *, analyst: str | None = None) -> int:
        """Store a new version of the case's report narrative (the analyst's own words for the
        SAR-style report); return its id. Append-only: earlier versions stay
        (:meth:`narratives`), the latest is :meth:`narrative`. Audited as ``narrative_saved``
        with the text. The case's state is unchanged. Raises :class:`NoteRequiredError` (empty
        text), :class:`CaseNotFoundError`, :class:`MissingAnalystError`.
        """
        text = _require_text(text, "narrative text")
        analyst = resolve_analyst(analyst)
        with self._write() as conn:
            ts = _utcnow()
            row = self._case_row(conn, case_id)
            cur = conn.execute(
                "INSERT INTO narratives(case_id, ts, analyst, text) VALUES (?, ?, ?, ?)",
                (row["id"], ts, analyst, text),
            )
            snap = self._snapshot(row)
            self._audit(
                conn, ts, analyst, "narrative_saved", case_id=row["id"],
                model_sha256=row["model_sha256"], before=snap,
                after={**snap, "narrative_id": cur.lastrowid, "narrative": text},
            )
            return int(cur.lastrowid)

    def narratives(self, case_id: int) -> pd.DataFrame:
        """Every saved narrative of the case, oldest first (:data:`NARRATIVE_COLUMNS`)."""
        self.get_case(case_id)
        rows = self._read(
            f"SELECT {', '.join(NARRATIVE_COLUMNS)} FROM narratives WHERE case_id = ? ORDER BY id",
            (int(case_id),),
        )
        return pd.DataFrame([tuple(r) for r in rows], columns=NARRATIVE_COLUMNS)

    def narrative(self, case_id: int) -> dict | None:
        """The latest narrative of the case (``id``, ``ts``, ``analyst``, ``text``), or ``None``."""
        n = self.narratives(case_id)
        return None if n.empty else n.iloc[-1].to_dict()
