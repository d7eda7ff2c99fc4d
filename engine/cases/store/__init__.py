"""The analyst case store: case queue, assignment, dispositions, four-eyes approval, audit log.

One SQLite file holds every case of every model. A *case* is one (model, entity) pair: the
entity's highest fraud probability under that model and a few facts about its history. Scoring
calls :meth:`CaseStore.upsert_cases`; analysts work the queue (:meth:`CaseStore.queue`), assign
cases, add notes and record dispositions. Every action is written, in the same transaction as
the change it describes, to an append-only audit log.

Where the file lives
    ``CaseStore(path)`` if a path is given, else ``$FRAUDLENS_DATA_DIR/cases.sqlite3``, else
    ``platformdirs.user_data_dir("fraudlens")/cases.sqlite3`` (see :func:`default_db_path`).
    Missing folders are created. The file must be on a local disk (WAL mode needs shared
    memory; network file systems are not supported by SQLite's WAL).

Schema and migrations
    ``PRAGMA user_version`` is the schema version; the ``schema_version`` table logs when each
    version was applied. :data:`MIGRATIONS` is the ordered list of migration functions;
    migration *i* (1-based) moves version *i-1* to *i*. Opening a store applies the missing ones,
    each in its own ``BEGIN IMMEDIATE`` transaction together with the version bump, so a crash
    mid-migration leaves the previous version intact. A database newer than this code raises
    :class:`SchemaError`. To change the schema, append a function to :data:`MIGRATIONS`; never
    edit a released one.

Case states
    ``open`` (new) -> ``assigned`` (someone owns it) -> a disposition:

    ===================  ===========================================================
    disposition          resulting state
    ===================  ===========================================================
    ``confirmed_fraud``  ``confirmed_fraud``; with four-eyes on: ``pending_approval``
                         until a *different* analyst calls :meth:`CaseStore.approve`
    ``false_positive``   ``false_positive``
    ``escalate``         ``escalated``
    ===================  ===========================================================

    A disposition can be recorded in any state (a later disposition revises an earlier one;
    both stay in :meth:`CaseStore.history`). A new disposition on a ``pending_approval`` case
    replaces the pending proposal. Every disposition and approval requires a non-empty note.
    A pending case always needs a different analyst to approve it, even if four-eyes has since
    been switched off, because it was proposed under the rule.

Analyst identity
    There is no login. Every action takes the acting analyst's name (``analyst=`` / ``actor=``);
    when omitted, ``$FRAUDLENS_ANALYST`` is used (:func:`resolve_analyst`), else
    :class:`MissingAnalystError`. Names are compared case-insensitively for the four-eyes rule.
    System actions (scoring) use ``actor="system"``.

Audit log (append-only, enforced in the database)
    Columns: ``id``, ``ts`` (UTC, ISO 8601 with ``+00:00``), ``actor``, ``action``,
    ``case_id``, ``model_sha256``, ``before_json``, ``after_json``. Triggers ``RAISE(ABORT)``
    on any ``UPDATE`` or ``DELETE`` of ``audit_log``, ``dispositions`` and ``notes`` rows and on
    ``DELETE`` of cases; there is no API to edit or delete them. For every case-level row,
    ``after_json`` holds the case's ``state``, ``assignee``, ``pending_by`` and ``version``
    after the action, so the case row always equals its last audit row (checked by tests,
    including after killing a writer mid-transaction). Refused self-approvals are logged too
    (action ``approval_refused``, state unchanged).

    The triggers stop accidental or application-level edits; anyone who can write the file can
    still drop them. Tamper evidence against a hostile file owner (hash chaining, off-host
    copies) is out of scope here.

Concurrency
    WAL journal, ``busy_timeout`` (``timeout_s``), ``synchronous=FULL`` and every write in a
    ``BEGIN IMMEDIATE`` transaction: concurrent writers (threads with their own store, or
    processes) queue up instead of failing, and none loses an update. ``cases.version`` is
    incremented by every state change (assign, disposition, approval); pass the version you
    displayed as ``expected_version=`` and a stale write raises :class:`ConflictError` instead
    of overwriting someone else's decision. One :class:`CaseStore` may be shared by threads
    (calls are serialised by a lock); separate processes each open their own.

Example::

    store = CaseStore()                                  # user data dir, env settings
    store.set_thresholds(sha, review=0.5, decline=0.9, actor="alice")
    store.upsert_cases(sha, entity_summary)              # after scoring
    q = store.queue(sha, state="open")                   # ranked, highest score first
    case = store.get_case(int(q.case_id.iloc[0]))
    store.assign(case["id"], "alice", actor="alice")
    store.record_disposition(case["id"], "confirmed_fraud", "3 cards, same merchant",
                             analyst="alice")            # -> "pending_approval" (four-eyes)
    store.approve(case["id"], "Agreed, chargebacks filed", analyst="bob")  # -> "confirmed_fraud"

Package map
    :mod:`~engine.cases.store.common` (constants, errors, analyst and path settings),
    :mod:`~engine.cases.store.schema` (connection settings, schema, migrations),
    :mod:`~engine.cases.store.connection` (the open connection and write transactions),
    :mod:`~engine.cases.store.queue` (thresholds, cases from scoring, the review queue),
    :mod:`~engine.cases.store.decisions` (assignment, dispositions, approvals),
    :mod:`~engine.cases.store.notes` (notes), :mod:`~engine.cases.store.audit` (audit log),
    :mod:`~engine.cases.store.case_store` (:class:`CaseStore`, composed from them).
"""

from engine.cases.store.case_store import CaseStore
from engine.cases.store.common import (
    AUDIT_COLUMNS,
    CASE_INPUT_COLUMNS,
    DB_FILENAME,
    DISPOSITIONS,
    ENV_ANALYST,
    ENV_DATA_DIR,
    ENV_FOUR_EYES,
    HISTORY_COLUMNS,
    NOTE_COLUMNS,
    QUEUE_COLUMNS,
    STATES,
    SYSTEM_ACTOR,
    CaseNotFoundError,
    CaseStoreError,
    ConflictError,
    FourEyesError,
    InvalidTransitionError,
    MissingAnalystError,
    NoteRequiredError,
    SchemaError,
    Thresholds,
    UpsertResult,
    default_db_path,
    four_eyes_from_env,
    resolve_analyst,
)
from engine.cases.store.schema import (
    LATEST_VERSION,
    MIGRATIONS,
    connect,
    migrate,
    schema_version,
)

__all__ = [
    "AUDIT_COLUMNS", "CASE_INPUT_COLUMNS", "DB_FILENAME", "DISPOSITIONS", "ENV_ANALYST",
    "ENV_DATA_DIR", "ENV_FOUR_EYES", "HISTORY_COLUMNS", "LATEST_VERSION", "MIGRATIONS",
    "NOTE_COLUMNS", "QUEUE_COLUMNS", "STATES", "SYSTEM_ACTOR", "CaseNotFoundError", "CaseStore",
    "CaseStoreError", "ConflictError", "FourEyesError", "InvalidTransitionError",
    "MissingAnalystError", "NoteRequiredError", "SchemaError", "Thresholds", "UpsertResult",
    "connect", "default_db_path", "four_eyes_from_env", "migrate", "resolve_analyst",
    "schema_version",
]
