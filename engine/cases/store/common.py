"""Case store constants, errors, settings helpers and result types (shared by every concern)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import platformdirs

from engine.cases.store.identity import SYSTEM_ACTOR, is_reserved, person_key, same_person

# ------------------------------------------------------------------------------------------------
# Constants

DB_FILENAME = "cases.sqlite3"
ENV_DATA_DIR = "FRAUDLENS_DATA_DIR"
ENV_ANALYST = "FRAUDLENS_ANALYST"
ENV_FOUR_EYES = "FRAUDLENS_FOUR_EYES"
#: ``cases.source_id`` of the cases created before data sources were recorded (schema < 3)
LEGACY_SOURCE = "legacy"

STATES = ("open", "assigned", "pending_approval", "confirmed_fraud", "false_positive", "escalated",
          "closed_no_action")
#: disposition -> resulting state (four-eyes turns ``confirmed_fraud`` into ``pending_approval``)
DISPOSITIONS = {
    "confirmed_fraud": "confirmed_fraud",
    "false_positive": "false_positive",
    "escalate": "escalated",
    "closed_no_action": "closed_no_action",
}
#: fraud type of a disposition (schema v4) -> its label
FRAUD_TYPES = {
    "card_testing": "Card testing",
    "account_takeover": "Account takeover",
    "lost_stolen": "Lost or stolen card",
    "card_not_present": "Card not present",
    "compromised_terminal_merchant": "Compromised terminal or merchant",
    "first_party": "First-party fraud",
    "other": "Other",
}
#: the most a loss or exposure amount may be (a typo guard, file currency)
MAX_AMOUNT = 1e12

#: Columns :meth:`CaseStore.upsert_cases` needs, one row per entity.
CASE_INPUT_COLUMNS = (
    "entity_id",
    "max_probability",
    "max_transaction_id",
    "first_ts",
    "last_ts",
    "max_amount",
    "n_transactions",
    "n_known_fraud",
)
_SCORE_COLUMNS = CASE_INPUT_COLUMNS[1:]

QUEUE_COLUMNS = [
    "case_id",
    "model_sha256",
    "source_id",
    "entity_id",
    "max_probability",
    "recommendation",
    "max_transaction_id",
    "first_ts",
    "last_ts",
    "max_amount",
    "n_transactions",
    "n_known_fraud",
    "state",
    "assignee",
    "pending_by",
    "version",
    "created_at",
    "updated_at",
    "priority",
    "sla_due_at",
    "assigned_at",
]
_QUEUE_DTYPES = {
    "case_id": "int64",
    "max_probability": "float64",
    "max_amount": "float64",
    "n_transactions": "Int64",
    "n_known_fraud": "Int64",
    "version": "int64",
    "priority": "float64",
}
#: audit actions that record a read of a case (a report download), not a change to it: they move
#: neither the case's audit mark nor the "last change" a version conflict names, and they record
#: no case state (the verifier never takes a read as a statement of what the case holds)
READ_ACTIONS = ("report_exported",)
HISTORY_COLUMNS = ["id", "case_id", "ts", "kind", "disposition", "state_after", "analyst", "note",
                   "fraud_type", "loss_amount", "exposure_amount", "currency"]
NARRATIVE_COLUMNS = ["id", "case_id", "ts", "analyst", "text"]
NOTE_COLUMNS = ["id", "case_id", "ts", "analyst", "text"]
AUDIT_COLUMNS = ["id", "ts", "actor", "action", "case_id", "model_sha256", "before", "after",
                 "prev_hash", "row_hash"]

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_SOURCE_RE = re.compile(r"^(legacy|[0-9a-f]{64}/[^\x00-\x1f\x7f]{1,200})$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_TS_FORMAT = "%Y-%m-%dT%H:%M:%S.%f"  # naive UTC, fixed width so text order == time order
_MAX_NAME_LEN = 128


# ------------------------------------------------------------------------------------------------
# Errors


class CaseStoreError(Exception):
    """Base class of the case store's own errors."""


class SchemaError(CaseStoreError):
    """The database's schema version is newer than this code (or the file is not a case store)."""


class CaseNotFoundError(CaseStoreError, LookupError):
    """No case with that id."""


class MissingAnalystError(CaseStoreError, ValueError):
    """No analyst name given and ``$FRAUDLENS_ANALYST`` unset, or the name is invalid."""


class NoteRequiredError(CaseStoreError, ValueError):
    """A disposition or approval was attempted without a non-empty note."""


class InvalidTransitionError(CaseStoreError, ValueError):
    """The action is not allowed in the case's current state (e.g. approving an open case)."""


class FourEyesError(CaseStoreError, PermissionError):
    """The analyst who proposed a confirmed-fraud disposition tried to approve it."""


class AuditChainError(CaseStoreError):
    """The audit log's hash chain is broken (a row was changed, removed or reordered).

    Attributes:
        verdict: the :class:`ChainVerdict` that found it.
    """

    def __init__(self, verdict: "ChainVerdict"):
        self.verdict = verdict
        super().__init__(verdict.message)


class ConflictError(CaseStoreError):
    """The case changed since the caller read it (``expected_version`` is stale).

    Attributes:
        case_id: the case.
        expected_version: the version the caller based its change on.
        actual_version: the version in the database now.
    """

    def __init__(self, case_id: int, expected_version: int, actual_version: int, detail: str = ""):
        self.case_id = case_id
        self.expected_version = expected_version
        self.actual_version = actual_version
        msg = (
            f"case {case_id} was changed by someone else since you loaded it "
            f"(you had version {expected_version}, it is now version {actual_version}"
            f"{'; last change: ' + detail if detail else ''}). Reload the case and retry."
        )
        super().__init__(msg)


# ------------------------------------------------------------------------------------------------
# Settings helpers


def default_db_path() -> Path:
    """Where the case store lives when no path is given.

    Returns ``$FRAUDLENS_DATA_DIR/cases.sqlite3`` if that variable is set and non-empty, else
    ``platformdirs.user_data_dir("fraudlens")/cases.sqlite3`` (Linux: ``~/.local/share/
    fraudlens`` or ``$XDG_DATA_HOME/fraudlens``). Nothing is created.
    """
    env = os.environ.get(ENV_DATA_DIR, "").strip()
    base = Path(env).expanduser() if env else Path(platformdirs.user_data_dir("fraudlens"))
    return base / DB_FILENAME


def four_eyes_from_env() -> bool:
    """True if ``$FRAUDLENS_FOUR_EYES`` is ``1``, ``true``, ``yes`` or ``on`` (any case)."""
    return os.environ.get(ENV_FOUR_EYES, "").strip().lower() in {"1", "true", "yes", "on"}


def resolve_analyst(name: str | None = None) -> str:
    """The acting analyst's name: ``name`` if given, else ``$FRAUDLENS_ANALYST``.

    Leading/trailing whitespace is removed. Raises :class:`MissingAnalystError` if both are
    empty, the name is longer than 128 characters, contains control characters, is made only
    of invisible characters, or is (a lookalike of) the reserved ``"system"`` actor (see
    :mod:`engine.cases.store.identity`).
    """
    raw = name if name is not None else os.environ.get(ENV_ANALYST, "")
    if not isinstance(raw, str):
        raise MissingAnalystError(f"analyst name must be text, got {type(raw).__name__}")
    value = raw.strip()
    if not value:
        raise MissingAnalystError(
            f"no analyst name: enter your name or set the {ENV_ANALYST} environment variable"
        )
    if len(value) > _MAX_NAME_LEN or _CONTROL_RE.search(value):
        raise MissingAnalystError(
            f"invalid analyst name {value[:40]!r}: at most {_MAX_NAME_LEN} printable characters"
        )
    if not person_key(value):
        raise MissingAnalystError(f"invalid analyst name {value[:40]!r}: only invisible characters")
    if is_reserved(value):
        raise MissingAnalystError(
            f"invalid analyst name {value[:40]!r}: {SYSTEM_ACTOR!r} (or a lookalike) is reserved "
            "for the system's own actions"
        )
    return value


def _same_person(a: str | None, b: str | None) -> bool:
    return same_person(a, b)


def source_id(file_sha256: str, spec_name: str) -> str:
    """The data-source key of a case: ``"<file content sha256>/<spec key>"``; the dashboard passes
    :func:`engine.data.spec.spec_key` (the spec's name, with its content hash unless it is an
    unchanged built-in spec).

    A case belongs to one (model, data source, entity): the same entity id in two files (or in
    one file read with two specs, where the id can mean another card or customer) is two
    cases. ``file_sha256`` is the file's content hash (:func:`engine.cases.view.file_identity`,
    64 lowercase hex digits), so the same bytes give the same source wherever the file lies.
    Cases created before sources were recorded (schema < 3) have :data:`LEGACY_SOURCE`.
    Raises ``ValueError`` for a bad hash or a spec name that is empty, longer than 200
    characters or has control characters.
    """
    _check_sha(file_sha256)
    return _check_source(f"{file_sha256}/{spec_name}")


def _check_source(value: str) -> str:
    if not isinstance(value, str) or not _SOURCE_RE.match(value):
        raise ValueError(
            "source_id: expected 'legacy' or '<64 hex digits>/<spec name>' (at most 200 "
            f"printable characters), got {str(value)[:80]!r}"
        )
    return value


def _utcnow() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")


def _check_sha(model_sha256: str) -> str:
    if not isinstance(model_sha256, str) or not _SHA256_RE.match(model_sha256):
        raise ValueError(f"model_sha256: expected 64 lowercase hex digits, got {model_sha256!r}")
    return model_sha256


def _require_text(text: Any, what: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise NoteRequiredError(f"{what} is required and must not be empty")
    return text.strip()


def _ts_text(value: Any) -> str | None:
    """Timestamp -> fixed-width naive-UTC text (None for missing). Aware values are converted."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    ts = pd.Timestamp(value)
    if ts.tzinfo is not None:
        ts = ts.tz_convert("UTC").tz_localize(None)
    return ts.strftime(_TS_FORMAT)


def _is_date_only(value: Any) -> bool:
    if isinstance(value, dt.datetime | pd.Timestamp):
        return False
    if isinstance(value, dt.date):
        return True
    return isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value.strip()) is not None


def _json(obj: Any, ensure_ascii: bool = True) -> str | None:
    return None if obj is None else json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=ensure_ascii)



@dataclass(frozen=True)
class Thresholds:
    """Per-model score thresholds (probabilities in [0, 1], ``review <= decline``).

    Cases with ``max_probability >= review`` enter the queue; ``>= decline`` are recommended for
    decline.
    """

    model_sha256: str
    review: float
    decline: float
    updated_at: str
    updated_by: str


@dataclass(frozen=True)
class ChainVerdict:
    """Result of :meth:`CaseStore.verify_audit_chain`.

    Attributes:
        ok: every audit row is intact and in place.
        rows_checked: audit rows read.
        first_broken_id: the id of the first row that is changed, missing or out of place
            (``None`` when ``ok``).
        reason: one line on what is wrong (``""`` when ``ok``).
    """

    ok: bool
    rows_checked: int
    first_broken_id: int | None = None
    reason: str = ""

    @property
    def message(self) -> str:
        """One line for people: "audit log intact (N rows)" or what broke where."""
        if self.ok:
            return f"audit log intact ({self.rows_checked:,} rows, hash chain verified)"
        where = f" at row {self.first_broken_id}" if self.first_broken_id is not None else ""
        return f"audit log tampered with{where}: {self.reason}"


@dataclass(frozen=True)
class UpsertResult:
    """Counts from :meth:`CaseStore.upsert_cases`."""

    created: int
    updated: int
    unchanged: int


def lenient_text(raw: bytes) -> str:
    """The store connections' ``text_factory``: text that is not UTF-8 (only an edit outside the
    store writes it) reads as U+FFFD instead of raising, so its audit row fails its hash."""
    return raw.decode("utf-8", "replace")


@contextmanager
def lenient_snapshot(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """Reads of ``conn`` in one read transaction (one WAL snapshot; the caller's own transaction
    when one is open) with :func:`lenient_text` as the text factory, both restored on exit: the
    audit checks (:func:`engine.cases.store.chain.verify_chain`, the anchors) see one state of the
    file and never raise on text that is not UTF-8."""
    own, factory = not conn.in_transaction, conn.text_factory
    conn.text_factory = lenient_text
    if own:
        conn.execute("BEGIN")
    try:
        yield conn
    finally:
        conn.text_factory = factory
        if own:
            conn.execute("ROLLBACK")
