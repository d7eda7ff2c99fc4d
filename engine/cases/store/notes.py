"""Case store notes: free-text notes on a case, append-only."""

from __future__ import annotations

import pandas as pd

from engine.cases.store.common import (
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
