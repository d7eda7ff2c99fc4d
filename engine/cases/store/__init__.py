"""The analyst case store: case queue, assignment, dispositions, four-eyes approval, audit log.

One SQLite file holds every case of every model. A *case* is one (model, data source, entity):
the entity's highest fraud probability under that model in that data source and a few facts
about its history. The data source is :func:`source_id` (the file's content sha256 and the
spec name), so the same entity id in two files is two cases, each with its own dispositions and
notes. Cases written before schema version 3 belong to the source :data:`LEGACY_SOURCE`
(``"legacy"``). Scoring calls :meth:`CaseStore.upsert_cases`; analysts work the queue (:meth:`CaseStore.queue`), assign
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
    ``closed_no_action`` ``closed_no_action`` (reviewed; nothing to do; schema v4)
    ===================  ===========================================================

    A disposition may carry a fraud type (:data:`FRAUD_TYPES`), a loss and an exposure amount
    (numbers >= 0 in the data's currency). Open work is :data:`OPEN_STATES`; the other states
    are closed.

Work list (schema v4)
    Each case has a ``priority`` score (from its score and largest amount) and an SLA due time
    (``sla_due_at``); see :mod:`engine.cases.store.priority`. :meth:`CaseStore.claim_next`
    assigns the highest-priority unassigned open case atomically (audited ``claimed``);
    :meth:`CaseStore.bulk_assign` assigns many cases in one transaction (``bulk_assigned``,
    one audit row per case). The analyst's report narrative is stored append-only
    (:meth:`CaseStore.save_narrative`, audited ``narrative_saved``).

    A disposition can be recorded in any state (a later disposition revises an earlier one;
    both stay in :meth:`CaseStore.history`). A new disposition on a ``pending_approval`` case
    replaces the pending proposal; with four-eyes on it waits for approval too, as does any
    disposition on a ``confirmed_fraud`` case (undoing an approved fraud takes two people), and
    the approval applies the proposed disposition (:meth:`CaseStore.pending_disposition`); a
    supervisor who disagrees sends it back (:meth:`CaseStore.send_back`: the case returns to the
    state its last applied disposition gave it; the refusal note is a case note, audited
    ``sent_back``). Every disposition, approval and refusal requires a non-empty note.
    A pending case always needs a different analyst to approve it, even if four-eyes has since
    been switched off, because it was proposed under the rule.

Analyst identity
    The store does not sign anyone in: every action takes the acting user's name (``analyst=``
    / ``actor=``), which the caller takes from its signed-in session; when omitted,
    ``$FRAUDLENS_ANALYST`` is used (:func:`resolve_analyst`), else :class:`MissingAnalystError`.
    Wherever the store compares people (four-eyes, the assignee filter, the audit actor filter)
    it compares :func:`person_key` (NFKC, format/zero-width characters removed, casefold, a
    confusable skeleton; :mod:`engine.cases.store.identity`), so ``alice``, ``Alice``,
    ``ali\u200bce`` and ``аlice`` (Cyrillic ``а``) are one person and cannot approve each
    other's proposals. System actions (scoring) use ``actor="system"``; that name and its
    lookalikes are refused for analysts.

Audit log (append-only, enforced in the database)
    Columns: ``id``, ``ts`` (UTC, ISO 8601 with ``+00:00``), ``actor``, ``action``,
    ``case_id``, ``model_sha256``, ``before_json``, ``after_json``. Triggers ``RAISE(ABORT)``
    on any ``UPDATE`` or ``DELETE`` of ``audit_log``, ``dispositions`` and ``notes`` rows and on
    ``DELETE`` of cases; there is no API to edit or delete them. For every case-level row,
    ``after_json`` holds the case's ``state``, ``assignee``, ``pending_by`` and ``version``
    after the action, so the case row always equals its last audit row (checked by tests,
    including after killing a writer mid-transaction). Refused self-approvals are logged too
    (action ``approval_refused``, state unchanged).

    ``INSERT OR REPLACE`` / ``REPLACE`` on those tables is refused too (BEFORE INSERT
    triggers on an existing id or case key: REPLACE's implicit delete fires no DELETE trigger
    unless ``PRAGMA recursive_triggers`` is on).

    Tamper evidence: every audit row carries ``prev_hash`` (the previous row's hash) and
    ``row_hash`` (SHA-256 over its canonical content and ``prev_hash``); ``audit_head`` holds
    the last row's id and hash (:mod:`engine.cases.store.chain`). Opening a store verifies the
    chain (:attr:`CaseStore.audit_verdict`; a broken chain logs an error and warns with
    :class:`AuditTamperWarning`, or raises :class:`AuditChainError` with
    ``strict_audit=True``); :meth:`CaseStore.verify_audit_chain` re-checks on demand and names
    the first changed, missing or moved row. Someone who can write the file can drop the
    triggers, but an edit, a removed row (last one included) or a reordering no longer
    verifies unless every later hash and the head are recomputed as well; keep off-host copies
    of ``audit_head`` to catch that.

File permissions
    The database file is created with mode 0600 and, when the store creates its folder, the
    folder with 0700 (an existing file of the user's is tightened to 0600); SQLite's ``-wal``
    and ``-shm`` files inherit the database file's mode.

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
    src = source_id(file_identity(path), "tabformer")    # engine.cases.view.file_identity
    store.upsert_cases(sha, entity_summary, source_id=src)  # after scoring
    q = store.queue(sha, source_id=src, state="open")    # ranked, highest score first
    case = store.get_case(int(q.case_id.iloc[0]))
    store.assign(case["id"], "alice", actor="alice")
    store.record_disposition(case["id"], "confirmed_fraud", "3 cards, same merchant",
                             analyst="alice")            # -> "pending_approval" (four-eyes)
    store.approve(case["id"], "Agreed, chargebacks filed", analyst="bob")  # -> "confirmed_fraud"

Package map
    :mod:`~engine.cases.store.common` (constants, errors, analyst and path settings, source ids),
    :mod:`~engine.cases.store.identity` (person keys: who is the same person),
    :mod:`~engine.cases.store.chain` (the audit hash chain and its verification),
    :mod:`~engine.cases.store.schema` (connection settings, schema, migrations),
    :mod:`~engine.cases.store.connection` (the open connection and write transactions),
    :mod:`~engine.cases.store.queue` (thresholds, cases from scoring, the review queue),
    :mod:`~engine.cases.store.decisions` (assignment, dispositions, approvals),
    :mod:`~engine.cases.store.notes` (notes, narratives), :mod:`~engine.cases.store.audit` (audit log),
    :mod:`~engine.cases.store.priority` (priority and SLA rules),
    :mod:`~engine.cases.store.work` (claim next, bulk assign),
    :mod:`~engine.cases.store.case_store` (:class:`CaseStore`, composed from them).
"""

from engine.cases.store.audit import audit_csv
from engine.cases.store.case_store import CaseStore
from engine.cases.store.chain import verify_chain
from engine.cases.store.common import (
    AUDIT_COLUMNS,
    CASE_INPUT_COLUMNS,
    DB_FILENAME,
    DISPOSITIONS,
    ENV_ANALYST,
    FRAUD_TYPES,
    NARRATIVE_COLUMNS,
    ENV_DATA_DIR,
    ENV_FOUR_EYES,
    HISTORY_COLUMNS,
    LEGACY_SOURCE,
    NOTE_COLUMNS,
    QUEUE_COLUMNS,
    STATES,
    SYSTEM_ACTOR,
    AuditChainError,
    CaseNotFoundError,
    ChainVerdict,
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
    source_id,
)
from engine.cases.store.connection import AuditTamperWarning
from engine.cases.store.identity import is_reserved, person_key, same_person
from engine.cases.store.priority import (
    CLOSED_STATES,
    OPEN_STATES,
    priority_level,
    priority_score,
    sla_status,
)
from engine.cases.store.schema import (
    LATEST_VERSION,
    MIGRATIONS,
    connect,
    migrate,
    schema_version,
)

__all__ = [
    "AuditChainError", "AuditTamperWarning", "ChainVerdict", "LEGACY_SOURCE", "is_reserved",
    "audit_csv", "person_key", "same_person", "source_id", "verify_chain",
    "AUDIT_COLUMNS", "CASE_INPUT_COLUMNS", "DB_FILENAME", "DISPOSITIONS", "ENV_ANALYST",
    "ENV_DATA_DIR", "ENV_FOUR_EYES", "HISTORY_COLUMNS", "LATEST_VERSION", "MIGRATIONS",
    "NOTE_COLUMNS", "QUEUE_COLUMNS", "STATES", "SYSTEM_ACTOR", "CaseNotFoundError", "CaseStore",
    "CaseStoreError", "ConflictError", "FourEyesError", "InvalidTransitionError",
    "MissingAnalystError", "NoteRequiredError", "SchemaError", "Thresholds", "UpsertResult",
    "connect", "default_db_path", "four_eyes_from_env", "migrate", "resolve_analyst",
    "schema_version", "FRAUD_TYPES", "NARRATIVE_COLUMNS", "OPEN_STATES", "CLOSED_STATES",
    "priority_level", "priority_score", "sla_status",
]
