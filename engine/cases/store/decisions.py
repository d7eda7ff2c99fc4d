"""Case store decisions: assignment, dispositions, four-eyes approvals and their history."""

from __future__ import annotations

import pandas as pd

import logging
import math
from typing import Any

from engine.cases.store.common import (
    DISPOSITIONS,
    FRAUD_TYPES,
    MAX_AMOUNT,
    HISTORY_COLUMNS,
    FourEyesError,
    InvalidTransitionError,
    _require_text,
    _same_person,
    _utcnow,
    resolve_analyst,
)


log = logging.getLogger("fraudlens.cases")


class DecisionsMixin:
    """Assign, record a disposition, approve, read the history (mixin of :class:`CaseStore`)."""

    # -- the four-eyes policy -------------------------------------------------------------------

    @property
    def four_eyes(self) -> bool:
        """The four-eyes rule in force now: on when this process asked for it (``four_eyes=True``
        / ``$FRAUDLENS_FOUR_EYES``) *or* the store's latest policy row says so, read at each call
        (one indexed query), so a long-running process (the dashboard) applies a rule another
        process switched on after it opened the store."""
        if getattr(self, "_four_eyes_asked", False):
            return True
        with self._lock:
            return _stored_four_eyes(self._conn)

    @four_eyes.setter
    def four_eyes(self, asked: bool) -> None:
        self._four_eyes_asked = bool(asked)

    def _four_eyes_policy(self, asked: bool) -> bool:
        """At open: the first process that asks for four-eyes writes ``four_eyes_on`` into the
        audit log (actor ``system``); from then on every process applies the rule, whatever its
        own setting (a security test showed a process started without the setting let an analyst
        apply a disposition, a pending one included, alone), until :meth:`switch_four_eyes_off`
        lifts it, audited. Returns the rule in force."""
        with self._lock:
            stored = _stored_four_eyes(self._conn)
        if asked and not stored:
            with self._write() as conn:
                self._audit(conn, _utcnow(), "system", "four_eyes_on", after={"four_eyes": True})
        if stored and not asked:
            log.info("%s: four-eyes is on in the store (switched on by an earlier process); kept on", self.path)
        return asked or stored

    def switch_four_eyes_off(self, *, actor: str | None = None) -> None:
        """Lift the store's four-eyes rule (audited ``four_eyes_off`` under ``actor``), for this
        process too; a process that asks for the rule switches it on again. Pending proposals
        still need another person (:meth:`approve`). Raises :class:`MissingAnalystError`."""
        actor = resolve_analyst(actor)
        with self._write() as conn:
            self._audit(conn, _utcnow(), actor, "four_eyes_off", after={"four_eyes": False})
        self.four_eyes = False

    # -- analyst actions ------------------------------------------------------------------------

    def assign(
        self,
        case_id: int,
        assignee: str | None,
        *,
        actor: str | None = None,
        expected_version: int | None = None,
    ) -> int:
        """Assign the case to ``assignee`` (``None`` = unassign); return the new version.

        An ``open`` case becomes ``assigned`` (and back to ``open`` when unassigned); other
        states keep their state. ``actor`` is who does it (default ``$FRAUDLENS_ANALYST``).
        Raises :class:`CaseNotFoundError`, :class:`ConflictError` (stale ``expected_version``),
        :class:`MissingAnalystError`.
        """
        actor = resolve_analyst(actor)
        new_assignee = resolve_analyst(assignee) if assignee is not None else None
        with self._write() as conn:
            ts = _utcnow()
            row = self._case_row(conn, case_id)
            self._check_version(conn, row, expected_version)
            state = row["state"]
            if state == "open" and new_assignee is not None:
                state = "assigned"
            elif state == "assigned" and new_assignee is None:
                state = "open"
            after = self._set_state(
                conn, row, ts, state=state, assignee=new_assignee, pending_by=row["pending_by"]
            )
            conn.execute("UPDATE cases SET assigned_at = ? WHERE id = ?",
                         (ts if new_assignee is not None else None, row["id"]))
            self._audit(
                conn, ts, actor, "assigned", case_id=row["id"], model_sha256=row["model_sha256"],
                before=self._snapshot(row), after=after,
            )
        return after["version"]

    def record_disposition(
        self,
        case_id: int,
        disposition: str,
        note: str,
        *,
        analyst: str | None = None,
        expected_version: int | None = None,
        fraud_type: str | None = None,
        loss_amount: float | None = None,
        exposure_amount: float | None = None,
        currency: str | None = None,
    ) -> str:
        """Record a disposition with its (required) note; return the case's new state.

        ``disposition`` is one of :data:`DISPOSITIONS` (``closed_no_action``: reviewed, nothing
        to do). With four-eyes on, ``confirmed_fraud`` leaves the case ``pending_approval``
        until another analyst calls :meth:`approve`, and so does any other disposition on a
        case that is ``confirmed_fraud`` (undoing an approved fraud takes two people too) or
        ``pending_approval`` (the new proposal replaces the pending one); the approval then
        applies the proposed disposition. ``fraud_type`` is one of
        :data:`FRAUD_TYPES` (or ``None``); ``loss_amount`` (money lost) and
        ``exposure_amount`` (money at risk) are numbers in ``[0, 1e12]`` in ``currency``
        (ISO 4217 code, the data file's currency), or ``None``; all are kept in the history
        and the audit row.

        Raises :class:`NoteRequiredError` (empty note), ``ValueError`` (unknown disposition),
        :class:`CaseNotFoundError`, :class:`ConflictError` (stale ``expected_version``),
        :class:`MissingAnalystError`; ``ValueError`` for an unknown fraud type or an amount
        that is negative, not a number or above 1e12. Nothing is written when it raises.
        """
        if disposition not in DISPOSITIONS:
            raise ValueError(
                f"disposition: expected one of {list(DISPOSITIONS)}, got {disposition!r}"
            )
        if fraud_type is not None and fraud_type not in FRAUD_TYPES:
            raise ValueError(f"fraud_type: expected one of {list(FRAUD_TYPES)}, got {fraud_type!r}")
        loss_amount = _amount(loss_amount, "loss_amount")
        exposure_amount = _amount(exposure_amount, "exposure_amount")
        currency = (str(currency).strip()[:8] or None) if currency is not None else None
        extra = {"fraud_type": fraud_type, "loss_amount": loss_amount,
                 "exposure_amount": exposure_amount, "currency": currency}
        note = _require_text(note, "a note explaining the disposition")
        analyst = resolve_analyst(analyst)
        state = DISPOSITIONS[disposition]
        pending_by = None
        with self._write() as conn:
            ts = _utcnow()
            row = self._case_row(conn, case_id)
            self._check_version(conn, row, expected_version)
            # a pending case's new disposition replaces the proposal and still waits: else a
            # reversal proposal re-recorded by its proposer would apply alone
            # the rule in force in this transaction (another process may have switched it on)
            four_eyes = self._four_eyes_asked or _stored_four_eyes(conn)
            if four_eyes and (state == "confirmed_fraud"
                              or row["state"] in ("confirmed_fraud", "pending_approval")):
                state, pending_by = "pending_approval", analyst
            after = self._set_state(
                conn, row, ts, state=state, assignee=row["assignee"], pending_by=pending_by
            )
            conn.execute(
                "INSERT INTO dispositions(case_id, ts, kind, disposition, state_after, analyst, "
                "note, fraud_type, loss_amount, exposure_amount, currency) "
                "VALUES (?, ?, 'disposition', ?, ?, ?, ?, ?, ?, ?, ?)",
                (row["id"], ts, disposition, state, analyst, note, *extra.values()),
            )
            self._audit(
                conn, ts, analyst, "disposition", case_id=row["id"],
                model_sha256=row["model_sha256"], before=self._snapshot(row),
                after={**after, "disposition": disposition, "note": note, "four_eyes": four_eyes,
                       **{k: v for k, v in extra.items() if v is not None}},
            )
        return state

    def approve(
        self,
        case_id: int,
        note: str,
        *,
        analyst: str | None = None,
        expected_version: int | None = None,
    ) -> str:
        """Approve a pending four-eyes disposition; return the state it leads to.

        What is pending is the case's latest disposition: ``confirmed_fraud`` (-> ``"confirmed_fraud"``),
        or a revision of an approved fraud (e.g. ``false_positive`` -> ``"false_positive"``).

        The approver must differ (case-insensitively) from the analyst who proposed it; a
        self-approval raises :class:`FourEyesError` and is logged as ``approval_refused``
        without changing the case. Raises :class:`NoteRequiredError` (empty note),
        :class:`InvalidTransitionError` (case not ``pending_approval``),
        :class:`CaseNotFoundError`, :class:`ConflictError`, :class:`MissingAnalystError`.
        """
        note = _require_text(note, "a note explaining the approval")
        analyst = resolve_analyst(analyst)
        refused: FourEyesError | None = None
        with self._write() as conn:
            ts = _utcnow()
            row = self._pending_row(conn, case_id, expected_version, "approved")
            snap = self._snapshot(row)
            if _same_person(analyst, row["pending_by"]):
                refused = FourEyesError(
                    f"four-eyes rule: {analyst!r} proposed confirmed fraud on case {row['id']} "
                    "and cannot approve it; another analyst must approve"
                )
                self._audit(
                    conn, ts, analyst, "approval_refused", case_id=row["id"],
                    model_sha256=row["model_sha256"], before=snap,
                    after={**snap, "reason": "same analyst as proposer", "note": note},
                )
            else:
                proposed = _pending_disposition(conn, row["id"])
                new_state = DISPOSITIONS[proposed]
                after = self._set_state(
                    conn, row, ts, state=new_state, assignee=row["assignee"], pending_by=None,
                )
                conn.execute(
                    "INSERT INTO dispositions(case_id, ts, kind, disposition, state_after, "
                    "analyst, note) VALUES (?, ?, 'approval', ?, ?, ?, ?)",
                    (row["id"], ts, proposed, new_state, analyst, note),
                )
                self._audit(
                    conn, ts, analyst, "approved", case_id=row["id"],
                    model_sha256=row["model_sha256"], before=snap,
                    after={**after, "proposed_by": row["pending_by"], "disposition": proposed, "note": note,
                           "proposal": _proposal(conn, row["id"])},  # what was approved, as the approver saw it
                )
        if refused is not None:
            raise refused
        return new_state

    def send_back(
        self,
        case_id: int,
        note: str,
        *,
        analyst: str | None = None,
        expected_version: int | None = None,
    ) -> str:
        """Refuse a pending four-eyes proposal (the supervisor disagrees); return the state the
        case returns to: the state the last applied disposition gave it (a refused reversal of an
        approved fraud leaves it ``confirmed_fraud``), else ``assigned`` / ``open`` by its assignee.

        The refusal note is required; it is kept as a case note (``notes``) with an audit row
        ``sent_back`` that records it, the proposal refused and its proposer. As for :meth:`approve`,
        the proposer cannot send back their own proposal (:class:`FourEyesError`; they record a new
        one instead). Raises :class:`NoteRequiredError`, :class:`InvalidTransitionError` (case not
        ``pending_approval``), :class:`CaseNotFoundError`, :class:`ConflictError`,
        :class:`MissingAnalystError`, :class:`FourEyesError`. Nothing is written when it raises.
        """
        note = _require_text(note, "a note explaining why the proposal is sent back")
        analyst = resolve_analyst(analyst)
        with self._write() as conn:
            ts = _utcnow()
            row = self._pending_row(conn, case_id, expected_version, "sent back")
            if _same_person(analyst, row["pending_by"]):
                raise FourEyesError(f"four-eyes rule: {analyst!r} proposed this disposition on case {row['id']}; "
                                    "another supervisor sends it back (or record a new proposal)")
            applied = conn.execute(
                "SELECT state_after FROM dispositions WHERE case_id = ? AND state_after != 'pending_approval' "
                "ORDER BY id DESC LIMIT 1", (row["id"],)).fetchone()
            state = applied[0] if applied is not None else ("assigned" if row["assignee"] else "open")
            snap = self._snapshot(row)
            proposal = {"disposition": _pending_disposition(conn, row["id"]), **_proposal(conn, row["id"])}
            after = self._set_state(conn, row, ts, state=state, assignee=row["assignee"], pending_by=None)
            cur = conn.execute("INSERT INTO notes(case_id, ts, analyst, text) VALUES (?, ?, ?, ?)",
                               (row["id"], ts, analyst, note))
            self._audit(conn, ts, analyst, "sent_back", case_id=row["id"], model_sha256=row["model_sha256"],
                        before=snap, after={**after, "note_id": cur.lastrowid, "note": note,
                                            "proposed_by": row["pending_by"], "proposal": proposal})
        return state

    def _pending_row(self, conn, case_id: int, expected_version: int | None, verb: str):
        """The case's row, at ``expected_version``, in ``pending_approval`` (inside a write);
        raises :class:`CaseNotFoundError`, :class:`ConflictError`, :class:`InvalidTransitionError`."""
        row = self._case_row(conn, case_id)
        self._check_version(conn, row, expected_version)
        if row["state"] != "pending_approval":
            raise InvalidTransitionError(
                f"case {row['id']} is {row['state']!r}; only 'pending_approval' cases can be {verb}")
        return row

    def pending_disposition(self, case_id: int) -> str | None:
        """The disposition a ``pending_approval`` case waits to have approved (one of
        :data:`DISPOSITIONS`), else ``None``. Raises :class:`CaseNotFoundError`."""
        case = self.get_case(case_id)
        if case["state"] != "pending_approval":
            return None
        with self._lock:
            return _pending_disposition(self._conn, int(case_id))

    def history(self, case_id: int) -> pd.DataFrame:
        """The case's dispositions and approvals, oldest first (:data:`HISTORY_COLUMNS`).

        ``kind`` is ``"disposition"`` or ``"approval"``; ``state_after`` the state it produced.
        Raises :class:`CaseNotFoundError`.
        """
        self.get_case(case_id)
        rows = self._read(
            f"SELECT {', '.join(HISTORY_COLUMNS)} FROM dispositions WHERE case_id = ? ORDER BY id",
            (int(case_id),),
        )
        return pd.DataFrame([tuple(r) for r in rows], columns=HISTORY_COLUMNS)


def _stored_four_eyes(conn) -> bool:
    """Whether the store's latest policy row (``four_eyes_on`` / ``four_eyes_off``) is on."""
    row = conn.execute("SELECT action FROM audit_log WHERE case_id IS NULL AND action IN "
                       "('four_eyes_on', 'four_eyes_off') ORDER BY id DESC LIMIT 1").fetchone()
    return row is not None and row[0] == "four_eyes_on"


def _amount(value: Any, what: str) -> float | None:
    """A loss / exposure amount: ``None``, or a finite number in ``[0, MAX_AMOUNT]``."""
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: expected a number, got {str(value)[:40]!r}") from None
    if not math.isfinite(v) or v < 0 or v > MAX_AMOUNT:
        raise ValueError(f"{what}: expected a number from 0 to {MAX_AMOUNT:,.0f}, got {v!r}")
    return v


def _proposal(conn, case_id: int) -> dict[str, Any]:
    """The latest disposition recorded on ``case_id`` (what an approval applies): its time,
    proposer, note, fraud type, loss, exposure and currency, for the approval's audit row."""
    r = conn.execute("SELECT ts, analyst, note, fraud_type, loss_amount, exposure_amount, currency FROM dispositions "
                     "WHERE case_id = ? AND kind = 'disposition' ORDER BY id DESC LIMIT 1", (case_id,)).fetchone()
    keys = ("ts", "analyst", "note", "fraud_type", "loss_amount", "exposure_amount", "currency")
    return {} if r is None else {k: v for k, v in zip(keys, tuple(r)) if v is not None}


def _pending_disposition(conn, case_id: int) -> str:
    """The latest disposition recorded on ``case_id`` (what a pending approval applies)."""
    r = conn.execute("SELECT disposition FROM dispositions WHERE case_id = ? AND kind = 'disposition' "
                     "ORDER BY id DESC LIMIT 1", (case_id,)).fetchone()
    return r[0] if r is not None and r[0] in DISPOSITIONS else "confirmed_fraud"
