"""The scoring service's durable history store: every accepted transaction, appended before the
response is sent.

One SQLite file in WAL mode with ``synchronous=FULL``: a commit returns only after the WAL is
fsynced, so an acknowledged transaction survives ``kill -9`` and a power cut, and a crash
mid-commit leaves the previous state (SQLite's atomic commit). SQLite rather than an
append-only log because the service needs two lookups per request that a log would need its
own index for: the transaction id (idempotency: a retried POST is answered from the stored
row, never appended twice; a UNIQUE constraint enforces it) and an entity's most recent rows
(rebuilding its scorer cache on a miss or after a restart). A commit costs ~0.1-0.5 ms here
(measured: p50 0.14 ms, p99 0.49 ms for one row).

Tables:

* ``transactions``: ``seq`` (arrival order), ``transaction_id`` (UNIQUE), ``entity_id``,
  ``ts_ns`` (int64 ns, naive UTC), ``row_json`` (the canonical row), ``logit``,
  ``probability``, ``decision`` (``below_review`` / ``review`` / ``decline``), ``flagged``
  (probability >= the review threshold), ``model_sha256``, ``received_at`` (UTC ISO 8601);
* ``explanations``: one row per flagged transaction explained in the background (JSON);
* ``meta``: key/value (the case worker's cursor).

One :class:`HistoryStore` per thread (SQLite connections are not shared between threads here).

One server per history file: :class:`HistoryLock` holds an exclusive ``fcntl.flock`` on
``<history>.lock`` for the service's lifetime, so a second ``fraudlens serve`` on the same file is
refused (two writers would interleave rows out of order). The folders the store creates (the
data dir, its ``serve/`` folder) are mode 0700 whatever the umask (:func:`private_dirs`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS transactions (
        seq INTEGER PRIMARY KEY,
        transaction_id TEXT NOT NULL UNIQUE,
        entity_id TEXT NOT NULL,
        ts_ns INTEGER NOT NULL,
        row_json TEXT NOT NULL,
        logit REAL NOT NULL,
        probability REAL NOT NULL,
        decision TEXT NOT NULL,
        flagged INTEGER NOT NULL,
        model_sha256 TEXT NOT NULL,
        received_at TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS transactions_entity ON transactions(entity_id, seq)",
    "CREATE INDEX IF NOT EXISTS transactions_flagged ON transactions(flagged, seq)",
    """CREATE TABLE IF NOT EXISTS explanations (
        transaction_id TEXT PRIMARY KEY,
        entity_id TEXT NOT NULL,
        case_id INTEGER,
        method TEXT NOT NULL,
        explanation_json TEXT NOT NULL,
        created_at TEXT NOT NULL)""",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
]
#: columns of a stored transaction as returned by :meth:`HistoryStore.get`
STORED = ("seq", "transaction_id", "entity_id", "ts_ns", "row_json", "logit", "probability", "decision",
          "flagged", "model_sha256", "received_at")


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def row_json(row: dict[str, Any]) -> str:
    """The canonical row as JSON (``timestamp`` as ``ts_ns``; NaN numbers as null)."""
    out = {}
    for k, v in row.items():
        if k == "timestamp":
            continue
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        out[k] = v
    return _ENCODER.encode(out)


def row_from_json(text: str) -> dict[str, Any]:
    """Inverse of :func:`row_json` (null numbers back to NaN is left to the encoder: None = missing)."""
    d = json.loads(text)
    d["timestamp"] = pd.Timestamp(int(d["ts_ns"]), unit="ns")
    return d


#: ``synchronous`` settings: ``full`` fsyncs the WAL at every commit (survives power loss);
#: ``normal`` writes the WAL at every commit and fsyncs it at checkpoints only (survives
#: ``kill -9`` and any process crash, may lose the last commits on power loss or an OS crash:
#: https://www.sqlite.org/pragma.html#pragma_synchronous)
SYNC_MODES = {"full": "FULL", "normal": "NORMAL"}


def private_dirs(folder: str | Path) -> Path:
    """Create ``folder`` and its missing parents with mode 0700 (``chmod`` after ``mkdir``, so the
    umask cannot widen or narrow it); folders that already exist keep their mode (a shared
    ``$FRAUDLENS_DATA_DIR`` stays as its owner set it). Returns ``folder``.

    Raises:
        OSError: from the file system (e.g. a parent is a file).
    """
    folder = Path(folder)
    missing = []
    p = folder
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:  # created meanwhile by another process: keep its mode
            continue
        os.chmod(d, 0o700)
    return folder


class HistoryLocked(RuntimeError):
    """Another process (a second ``fraudlens serve``) holds the history store's lock."""


class HistoryLock:
    """An exclusive, non-blocking ``fcntl.flock`` on ``<history>.lock`` (file mode 0600, holding
    the owner's pid), held until :meth:`release` or the process ends (the kernel drops a
    flock when its process dies, so a ``kill -9`` leaves no stale lock).

    On platforms without :mod:`fcntl` (Windows) no lock is taken and :attr:`supported` is False:
    there, running two servers on one history file is not prevented.

    Raises:
        HistoryLocked: another process holds the lock (the message names the history file,
            the lock file and the other server's pid when known).
    """

    def __init__(self, history_path: str | Path):
        self.path = Path(str(history_path) + ".lock")
        self.fd: int | None = None
        try:
            import fcntl
        except ImportError:  # Windows
            self.supported = False
            return
        self.supported = True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            try:
                other = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            finally:
                os.close(fd)
            pid = f" (pid {other})" if other.isdigit() else ""
            raise HistoryLocked(f"the history store {history_path} is in use: another fraudlens serve{pid} holds "
                                f"its lock {self.path}; one server per history file (stop the other one, or pass "
                                "--history with another file)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self.fd = fd

    def release(self) -> None:
        """Drop the lock (the lock file stays: removing it would race with a new server)."""
        if self.fd is not None:
            os.close(self.fd)  # closing the only descriptor releases the flock
            self.fd = None

    def __del__(self) -> None:  # a service whose construction failed half way
        self.release()


class HistoryStore:
    """The durable history of accepted transactions (see the module docstring).

    Args:
        path: the SQLite file (created mode 0600; missing folders 0700: :func:`private_dirs`).
        sync: ``"full"`` (default) or ``"normal"`` (:data:`SYNC_MODES`).
    Raises:
        sqlite3.DatabaseError: not a SQLite file.
    """

    def __init__(self, path: str | Path, sync: str = "full"):
        self.path = Path(path)
        private_dirs(self.path.parent)
        new = not self.path.exists()
        self.conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0, check_same_thread=False)
        if new:
            self.path.chmod(0o600)
        self.conn.execute("PRAGMA journal_mode=WAL")
        if sync not in SYNC_MODES:
            raise ValueError(f"sync: expected one of {sorted(SYNC_MODES)}, got {sync!r}")
        self.conn.execute(f"PRAGMA synchronous={SYNC_MODES[sync]}")
        for s in SCHEMA:
            self.conn.execute(s)

    def close(self) -> None:
        self.conn.close()

    # ------------------------------------------------------------------ writes
    def append(self, records: Iterable[tuple]) -> None:
        """Append rows ``(transaction_id, entity_id, ts_ns, row_json, logit, probability, decision,
        flagged, model_sha256, received_at)`` in one durable transaction (fsynced on return).

        Raises:
            sqlite3.IntegrityError: a transaction id is already stored (nothing is appended).
        """
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        try:
            c.executemany(
                "INSERT INTO transactions(transaction_id, entity_id, ts_ns, row_json, logit, probability, decision, "
                "flagged, model_sha256, received_at) VALUES (?,?,?,?,?,?,?,?,?,?)", records)
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = "
                          "excluded.value", (key, value))

    def put_explanation(self, transaction_id: str, entity_id: str, case_id: int | None, method: str,
                        explanation: dict) -> None:
        self.conn.execute(
            "INSERT INTO explanations(transaction_id, entity_id, case_id, method, explanation_json, created_at) "
            "VALUES (?,?,?,?,?,?) ON CONFLICT(transaction_id) DO UPDATE SET explanation_json = "
            "excluded.explanation_json, case_id = excluded.case_id, created_at = excluded.created_at",
            (transaction_id, entity_id, case_id, method, json.dumps(explanation, allow_nan=False), utcnow()))

    # ------------------------------------------------------------------ reads
    def get(self, transaction_id: str) -> dict[str, Any] | None:
        """The stored row of ``transaction_id`` (:data:`STORED` keys), or None."""
        r = self.conn.execute(f"SELECT {', '.join(STORED)} FROM transactions WHERE transaction_id = ?",
                              (transaction_id,)).fetchone()
        return None if r is None else dict(zip(STORED, r))

    def meta(self, key: str) -> str | None:
        r = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if r is None else r[0]

    def count(self, entity_id: str | None = None) -> int:
        """Transactions stored (of ``entity_id``, or all: the last ``seq``, as rows are never deleted)."""
        if entity_id is None:
            return int(self.conn.execute("SELECT coalesce(max(seq), 0) FROM transactions").fetchone()[0])
        return int(self.conn.execute("SELECT count(*) FROM transactions WHERE entity_id = ?",
                                     (entity_id,)).fetchone()[0])

    def entity_rows(self, entity_id: str, offset: int = 0) -> list[dict[str, Any]]:
        """The canonical rows of ``entity_id`` in arrival order, from its ``offset``-th one on."""
        cur = self.conn.execute("SELECT row_json FROM transactions WHERE entity_id = ? ORDER BY seq "
                                "LIMIT -1 OFFSET ?", (entity_id, int(offset)))
        return [row_from_json(r[0]) for r in cur]

    def entity_frame(self, entity_id: str) -> pd.DataFrame:
        """The entity's whole history as a canonical frame (arrival order, ``row_number`` = seq),
        with ``probability`` per row."""
        cur = self.conn.execute("SELECT seq, row_json, probability FROM transactions WHERE entity_id = ? "
                                "ORDER BY seq", (entity_id,))
        rows = []
        for seq, text, prob in cur:
            d = row_from_json(text)
            d["row_number"], d["probability"] = seq, prob
            rows.append(d)
        f = pd.DataFrame(rows)
        if len(f) and "label" in f:
            f["label"] = pd.array(f["label"], dtype="Int8")
        return f

    def entity_summary(self, entity_id: str, since: dict[str, Any] | None = None) -> dict[str, Any]:
        """Facts for the entity's case (:data:`engine.cases.store.CASE_INPUT_COLUMNS`): highest
        probability and its transaction (the earliest of equal ones), first/last timestamp, largest
        amount, count, known frauds; and ``through_seq``, the last history row they cover.

        Args:
            since: a summary this method returned before for the same entity: only the rows
                after its ``through_seq`` are read and merged into it (rows are append-only, so
                the result equals a summary of the whole history; the case worker calls this per
                flagged batch, and reading the whole history each time grew with its length).
                With no newer row, ``since`` itself is returned.
        Raises:
            KeyError: the entity has no transaction in the store (and no ``since``).
        """
        c = self.conn
        after = int(since["through_seq"]) if since is not None else -1
        # both reads bounded by the last row seen now: rows committed between them (autocommit, WAL) are
        # left to the next call instead of being counted by one read and missed by the other
        hi = c.execute("SELECT max(seq) FROM transactions WHERE entity_id = ? AND seq > ?",
                       (entity_id, after)).fetchone()[0]
        if hi is None:  # no new row
            if since is None:
                raise KeyError(f"entity {entity_id!r} has no transaction in the history store")
            return since
        top = c.execute("SELECT transaction_id, probability FROM transactions WHERE entity_id = ? AND seq > ? "
                        "AND seq <= ? ORDER BY probability DESC, seq LIMIT 1", (entity_id, after, hi)).fetchone()
        agg = c.execute("SELECT min(ts_ns), max(ts_ns), count(*), max(json_extract(row_json, '$.amount')), "
                        "sum(json_extract(row_json, '$.label') = 1) FROM transactions "
                        "WHERE entity_id = ? AND seq > ? AND seq <= ?", (entity_id, after, hi)).fetchone()
        new = {"entity_id": entity_id, "max_probability": float(top[1]), "max_transaction_id": top[0],
               "first_ts": pd.Timestamp(agg[0], unit="ns"), "last_ts": pd.Timestamp(agg[1], unit="ns"),
               "max_amount": agg[3], "n_transactions": int(agg[2]), "n_known_fraud": int(agg[4] or 0),
               "through_seq": int(hi)}
        if since is None:
            return new
        old = since
        amounts = [a for a in (old["max_amount"], new["max_amount"]) if a is not None]
        keep_top = old["max_probability"] >= new["max_probability"]  # equal: the earlier row, as ORDER BY seq
        return {"entity_id": entity_id,
                "max_probability": old["max_probability"] if keep_top else new["max_probability"],
                "max_transaction_id": old["max_transaction_id"] if keep_top else new["max_transaction_id"],
                "first_ts": min(old["first_ts"], new["first_ts"]), "last_ts": max(old["last_ts"], new["last_ts"]),
                "max_amount": max(amounts) if amounts else None,
                "n_transactions": old["n_transactions"] + new["n_transactions"],
                "n_known_fraud": old["n_known_fraud"] + new["n_known_fraud"], "through_seq": new["through_seq"]}

    def flagged_after(self, seq: int, limit: int = 100) -> list[tuple[int, str, str]]:
        """``(seq, transaction_id, entity_id)`` of flagged transactions after ``seq``, oldest first."""
        return self.conn.execute("SELECT seq, transaction_id, entity_id FROM transactions WHERE flagged = 1 "
                                 "AND seq > ? ORDER BY seq LIMIT ?", (int(seq), int(limit))).fetchall()

    def flagged_count_after(self, seq: int) -> int:
        """How many flagged transactions come after ``seq`` (the case worker's backlog)."""
        return int(self.conn.execute("SELECT count(*) FROM transactions WHERE flagged = 1 AND seq > ?",
                                     (int(seq),)).fetchone()[0])

    def explanation(self, transaction_id: str) -> dict[str, Any] | None:
        r = self.conn.execute("SELECT entity_id, case_id, method, explanation_json, created_at FROM explanations "
                              "WHERE transaction_id = ?", (transaction_id,)).fetchone()
        if r is None:
            return None
        return {"transaction_id": transaction_id, "entity_id": r[0], "case_id": r[1], "method": r[2],
                "created_at": r[4], **json.loads(r[3])}

    def entities_by_recency(self, limit: int) -> list[str]:
        """Entity ids, the most recently active first (for warming the cache)."""
        return [r[0] for r in self.conn.execute(
            "SELECT entity_id FROM transactions GROUP BY entity_id ORDER BY max(seq) DESC LIMIT ?", (int(limit),))]


class RecordsRefused(ValueError):
    """The history store could not hold a request's records (not a storage failure)."""


class Ticket:
    """Records waiting for a group commit (:meth:`GroupCommitter.wait`)."""

    def __init__(self, records: list[tuple]):
        self.records, self.done, self.error = records, False, None
        self.refused = False  # True: the store could not hold these records (the committer still works)


class Checkpointer:
    """WAL checkpoints in a thread of their own, off the commit path.

    SQLite runs a checkpoint inside the commit that takes the WAL past 1,000 pages
    (``wal_autocheckpoint``, https://www.sqlite.org/wal.html#automatic_checkpoint): that commit
    then copies the WAL into the database file and fsyncs it, 4-5 ms on the bench machine about
    once in 100 dynamic batches, which made the slowest 1 % of the service's batches (measured
    with 4 rows per batch, ``sync="normal"``: batch p99 5.2 ms with it in the commit, 1.8 ms without).
    The committer's connection turns the automatic checkpoint off and this thread runs PASSIVE
    checkpoints on its own connection (they never block writers or readers:
    https://www.sqlite.org/c3ref/wal_checkpoint_v2.html), after every :attr:`every` commits
    and at least every :attr:`interval_s` seconds. Python's sqlite3 releases the interpreter lock
    while SQLite works, so the copy and its fsync run beside the scoring thread. Commits that land
    while it copies are left in the WAL, and SQLite rewrites the WAL from its start only when a
    commit begins on a fully copied one; so after each checkpoint the committer copies those few
    frames itself before its next commit (:attr:`catch_up`; ~0.1-0.3 ms), which then restarts the WAL
    (without it the WAL file grows without bound under steady load). Durability is
    unchanged: a commit is in the WAL (fsynced with ``sync="full"``) before it is acknowledged,
    whenever the checkpoint runs. A failed checkpoint is logged and retried at the next one.

    Args:
        path: the history store file.
        sync: ``"full"`` or ``"normal"`` (:data:`SYNC_MODES`), as the committer's.
    """

    #: commits between two checkpoints (a one-row commit writes ~4.5 WAL pages here: SQLite's 1,000-page
    #: threshold is ~220 commits)
    every = 100
    #: seconds between two checkpoints when fewer commits arrive
    interval_s = 1.0

    def __init__(self, path: str | Path, sync: str = "full"):
        self.conn = sqlite3.connect(Path(path), isolation_level=None, timeout=30.0, check_same_thread=False)
        self.conn.execute(f"PRAGMA synchronous={SYNC_MODES[sync]}")
        self.wake = threading.Event()
        self.stopping = False
        self.runs = self.failures = 0
        self.pending = 0  # commits since the last wake-up (the committer's thread writes it)
        self.catch_up = False  # set after a checkpoint: the committer copies the frames committed meanwhile
        self.thread = threading.Thread(target=self._loop, name="fraudlens-wal-checkpoint", daemon=True)
        self.thread.start()

    def committed(self) -> None:
        """Count one commit (called by the committer after each); wakes the thread every :attr:`every`."""
        self.pending += 1
        if self.pending >= self.every:
            self.pending = 0
            self.wake.set()

    def checkpoint(self) -> tuple[int, int, int]:
        """One PASSIVE checkpoint now. Returns SQLite's ``(busy, wal_frames, checkpointed_frames)``.

        Raises:
            sqlite3.Error: the checkpoint failed.
        """
        row = tuple(self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone())
        self.runs += 1
        if row[1] > 0:
            self.catch_up = True
        return row

    def _loop(self) -> None:
        while not self.stopping:
            self.wake.wait(self.interval_s)
            self.wake.clear()
            if self.stopping:
                break
            try:
                for _ in range(3):  # again while commits arrived during the copy: the committer's catch-up stays short
                    busy, frames, copied = self.checkpoint()
                    if frames - copied <= 16:
                        break
            except Exception as e:  # noqa: BLE001 - e.g. a full disk: the WAL keeps the commits; retried next time
                self.failures += 1  # (any error: the thread must not die, nothing else checkpoints the WAL)
                logging.getLogger("fraudlens.serve").warning("history WAL checkpoint failed: %s: %s",
                                                             type(e).__name__, e)

    def stop(self) -> None:
        """Stop the thread and close its connection (the committer's close checkpoints the rest)."""
        self.stopping = True
        self.wake.set()
        self.thread.join(10.0)
        if not self.thread.is_alive():  # a checkpoint still running on a very slow disk keeps its connection
            self.conn.close()


class GroupCommitter:
    """Group commit without a writer thread (leader / followers).

    :meth:`submit` queues a request's records (the service calls it under its scoring lock, so
    the queue is in scoring order). :meth:`wait` makes the caller the *leader* when no commit is
    running: it appends every queued record in one transaction (one fsync with ``sync="full"``)
    and marks all those tickets done; callers that arrive meanwhile wait for the leader and
    usually find their ticket committed. A lone request commits inline, concurrent requests share
    one fsync. After a failed commit :attr:`broken` is set and stays set (the service then refuses
    requests until restarted, so no score is computed on a state the history store lacks).
    WAL checkpoints run in a :class:`Checkpointer` thread, not inside a commit.

    Args:
        path: the history store file (own connection, used by the leader only).
        sync: ``"full"`` or ``"normal"`` (:data:`SYNC_MODES`).
    """

    def __init__(self, path: str | Path, sync: str = "full"):
        self.store = HistoryStore(path, sync)
        self.store.conn.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints run in :class:`Checkpointer`'s thread
        self.checkpointer = Checkpointer(path, sync)
        self.queue: list[Ticket] = []
        self.qlock = threading.Lock()
        self.write_lock = threading.Lock()
        self.broken: str | None = None
        self.commits = self.rows = 0

    def submit(self, records: list[tuple]) -> Ticket:
        t = Ticket(records)
        with self.qlock:
            self.queue.append(t)
        return t

    def _append(self, records: list[tuple]) -> None:
        if records:
            if self.checkpointer.catch_up:  # the frames the background checkpoint left (Checkpointer)
                self.checkpointer.catch_up = False
                try:
                    self.store.conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as e:  # as SQLite's own automatic checkpoint: never fails the commit
                    logging.getLogger("fraudlens.serve").warning("history WAL catch-up checkpoint failed: %s", e)
            self.store.append(records)
            self.commits += 1
            self.rows += len(records)
            self.checkpointer.committed()

    def _lead(self) -> None:
        """Commit everything queued (``write_lock`` held). A storage failure (``sqlite3.Error``,
        ``OSError``) breaks the committer; any other error (a record the store cannot bind, e.g.
        text that cannot be encoded as UTF-8) fails only the request that holds it: the group is
        rolled back and committed again request by request. Every ticket is marked done with its
        error (never acknowledged without its commit)."""
        with self.qlock:
            group, self.queue = self.queue, []
        try:
            if self.broken is None:
                try:
                    self._append([r for g in group for r in g.records])
                    for g in group:
                        g.done = True
                except (sqlite3.Error, OSError) as e:
                    self.broken = f"{type(e).__name__}: {e}"
                except Exception:  # noqa: BLE001 - retried request by request below
                    for g in group:
                        try:
                            self._append(g.records)
                        except (sqlite3.Error, OSError) as e:
                            self.broken = f"{type(e).__name__}: {e}"
                            break
                        except Exception as e:  # noqa: BLE001 - this request's records only
                            g.error, g.refused = f"{type(e).__name__}: {e}", True
                        g.done = True
        finally:
            for g in group:
                if not g.done:
                    g.error, g.done = self.broken or "the commit was interrupted", True

    def wait(self, ticket: Ticket) -> None:
        """Return once ``ticket``'s records are committed.

        Raises:
            RecordsRefused: the store could not hold this ticket's records (nothing of them was
                committed; other requests are unaffected).
            OSError: the commit failed (then every later one fails too: :attr:`broken`).
        """
        with self.write_lock:
            if not ticket.done:
                self._lead()
        if ticket.refused:
            raise RecordsRefused(f"the history store refused the records: {ticket.error}")
        if ticket.error is not None:
            raise OSError(f"history store commit failed: {ticket.error}")

    def flush(self) -> None:
        """Commit everything submitted so far (a cache rebuild reads the history store)."""
        with self.write_lock:
            self._lead()

    def stop(self) -> None:
        self.checkpointer.stop()
        self.flush()
        self.store.close()
