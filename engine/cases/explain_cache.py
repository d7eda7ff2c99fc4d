"""Explanations stored when a transaction is flagged, so a case opens without recomputing them.

Opening a case used to run every explainer (attention, IG, SHAP with standard errors,
occlusion) while the analyst waited. :func:`precompute` explains the flagged transactions of a
loaded file ahead of time (most risky first, within a time budget) and stores each result in an
:class:`ExplanationCache`; the dashboard reads it first and computes only on a miss.

Storage: one SQLite file (``explanations.sqlite`` in the fraudlens data dir, mode 0600, WAL),
one row per key. The key is the SHA-256 of (:data:`CACHE_VERSION`, fraudlens version, model
checkpoint sha256, source id — the data file's sha256 and the spec, as the case store keys
cases —, transaction id, explainer parameters), so a new model, an edited file, other settings or
a new explainer version never read an old result. Payloads are JSON (arrays tagged with their
dtype and restored exactly; NaN kept), never pickle: a tampered file can at worst give a wrong
or unreadable entry, which is treated as a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from engine import __version__
from engine.explain.base import Explanation

#: bump when what an explanation means changes (methods, baselines, estimators)
CACHE_VERSION = 2  # 2: SHAP with standard errors (repeated KernelSHAP / exact), convergence_delta None
MAX_PAYLOAD_BYTES = 64 * 2**20
#: seconds a caller waits for another thread computing the same key (:meth:`ExplanationCache.get_or_compute`)
#: before computing it itself
WAIT_S = 120.0
#: :meth:`ExplanationCache.get_json` kind of the Case page's fields view (:func:`engine.cases.fields_view.query_fields`)
FIELDS_KIND = "fields"


def _enc(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return {"__nd__": x.tolist(), "dtype": str(x.dtype)}
    if isinstance(x, dict):
        return {str(k): _enc(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_enc(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def _dec(x: Any) -> Any:
    if isinstance(x, dict):
        if set(x) == {"__nd__", "dtype"}:
            return np.asarray(x["__nd__"], dtype=np.dtype(x["dtype"]))
        return {k: _dec(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_dec(v) for v in x]
    return x


def encode_explanations(expls: Mapping[str, Explanation]) -> str:
    """``{method: Explanation}`` -> JSON text (lossless: arrays keep dtype and NaN)."""
    return json.dumps({m: _enc(asdict(e)) for m, e in expls.items()}, allow_nan=True)


def decode_explanations(text: str) -> dict[str, Explanation]:
    """Inverse of :func:`encode_explanations`.

    Raises:
        ValueError: not the JSON of explanations (malformed or wrong fields).
    """
    try:
        raw = json.loads(text)
        out = {}
        for m, d in raw.items():
            d = _dec(d)
            out[str(m)] = Explanation(**d)
        return out
    except (TypeError, KeyError, json.JSONDecodeError) as e:
        raise ValueError(f"not a stored explanation: {type(e).__name__}: {e}") from None


def cache_key(model_sha: str, source_id: str, transaction_id: str, params: Mapping[str, Any]) -> str:
    """The SHA-256 hex key of one stored explanation (module docstring)."""
    text = json.dumps([CACHE_VERSION, __version__, str(model_sha), str(source_id), str(transaction_id),
                       sorted((str(k), repr(v)) for k, v in params.items())])
    return hashlib.sha256(text.encode()).hexdigest()


def _kind(params: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """``params`` with the payload kind of :meth:`ExplanationCache.get_json` (never an explainer
    parameter name: the leading underscores)."""
    if not kind or not isinstance(kind, str):
        raise ValueError(f"kind: expected a non-empty name, got {kind!r}")
    return {**dict(params), "__payload__": kind}


class ExplanationCache:
    """Explanations keyed by (model, source, transaction, parameters) in one SQLite file.

    Thread-safe (one connection per thread); ``get`` returns None on a miss or an unreadable
    entry. Raises ``OSError`` / ``sqlite3.Error`` only when the file cannot be opened.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.path.exists():
            fd = os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600)
            os.close(fd)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}  # key -> set when its computation ends
        with self._conn() as c:
            c.execute("CREATE TABLE IF NOT EXISTS explanations (key TEXT PRIMARY KEY, model_sha TEXT NOT NULL, "
                      "source_id TEXT NOT NULL, transaction_id TEXT NOT NULL, payload TEXT NOT NULL, "
                      "seconds REAL NOT NULL, created_at REAL NOT NULL)")

    def _conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None:
            c = sqlite3.connect(self.path, timeout=30, check_same_thread=False)
            c.execute("PRAGMA journal_mode=WAL")
            self._local.conn = c
        return c

    def get(self, model_sha: str, source_id: str, transaction_id: str,
            params: Mapping[str, Any]) -> dict[str, Explanation] | None:
        """The stored explanations, or None (miss, or an entry that does not decode)."""
        text = self._payload(cache_key(model_sha, source_id, transaction_id, params))
        if text is None:
            return None
        try:
            return decode_explanations(text)
        except ValueError:
            return None

    def put(self, model_sha: str, source_id: str, transaction_id: str, params: Mapping[str, Any],
            expls: Mapping[str, Explanation], seconds: float = 0.0) -> None:
        """Store (or replace) the explanations of one transaction."""
        self._store(cache_key(model_sha, source_id, transaction_id, params), model_sha, source_id, transaction_id,
                    encode_explanations(expls), seconds)

    def _payload(self, key: str) -> str | None:
        """The stored payload text under ``key``, or None (miss, or above :data:`MAX_PAYLOAD_BYTES`)."""
        row = self._conn().execute("SELECT payload FROM explanations WHERE key = ?", (key,)).fetchone()
        if row is None or len(row[0]) > MAX_PAYLOAD_BYTES:
            return None
        return row[0]

    def _store(self, key: str, model_sha: str, source_id: str, transaction_id: str, payload: str,
               seconds: float) -> None:
        """Insert or replace the row of ``key``."""
        with self._conn() as c:
            c.execute("INSERT OR REPLACE INTO explanations VALUES (?, ?, ?, ?, ?, ?, ?)",
                      (key, str(model_sha), str(source_id), str(transaction_id), payload, float(seconds), time.time()))

    def get_json(self, model_sha: str, source_id: str, transaction_id: str, params: Mapping[str, Any],
                 kind: str) -> dict[str, Any] | None:
        """A stored JSON object of another ``kind`` than the explanations (e.g. ``"fields"``: the
        Case page's history effect and validated per-field attributions,
        :func:`engine.cases.fields_view.query_fields`), or None (miss, or not a JSON object).
        Keyed as the explanations with ``kind`` added to ``params``; arrays and NaN round-trip
        as in :func:`encode_explanations`."""
        text = self._payload(cache_key(model_sha, source_id, transaction_id, _kind(params, kind)))
        if text is None:
            return None
        try:
            out = _dec(json.loads(text))
        except (ValueError, TypeError):
            return None
        return out if isinstance(out, dict) else None

    def put_json(self, model_sha: str, source_id: str, transaction_id: str, params: Mapping[str, Any], kind: str,
                 obj: Mapping[str, Any], seconds: float = 0.0) -> None:
        """Store (or replace) one JSON object of ``kind`` (:meth:`get_json`).

        Raises:
            TypeError: ``obj`` is not JSON-able. sqlite3.Error / OSError: the file is not writable.
        """
        self._store(cache_key(model_sha, source_id, transaction_id, _kind(params, kind)), model_sha, source_id,
                    transaction_id, json.dumps(_enc(dict(obj)), allow_nan=True), seconds)

    def get_or_compute(self, model_sha: str, source_id: str, transaction_id: str, params: Mapping[str, Any],
                       compute: Callable[[], Mapping[str, Explanation]], *,
                       wait_s: float = WAIT_S) -> tuple[dict[str, Explanation], str]:
        """The stored explanations of one transaction, else ``compute()`` stored - computed ONCE
        per key in this process: a caller that finds the same key being computed by another
        thread (the background :func:`precompute` and a page asking for the case it is on, or
        two sessions) waits up to ``wait_s`` seconds for that result instead of computing it a
        second time; after that wait, or when the other computation failed, it computes itself.

        Returns:
            ``(explanations, how)`` with ``how`` one of ``"stored"`` (read from the file),
            ``"waited"`` (another thread's computation) or ``"computed"`` (by this call).
        Raises:
            whatever ``compute`` raises (nothing is stored then).
        """
        hit = self.get(model_sha, source_id, transaction_id, params)
        if hit is not None:
            return hit, "stored"
        key = cache_key(model_sha, source_id, transaction_id, params)
        with self._lock:
            ev = self._inflight.get(key)
            owner = ev is None
            if owner:
                ev = self._inflight[key] = threading.Event()
        if not owner:
            ev.wait(wait_s)
            hit = self.get(model_sha, source_id, transaction_id, params)
            if hit is not None:
                return hit, "waited"
            return self._compute_put(model_sha, source_id, transaction_id, params, compute), "computed"
        try:
            hit = self.get(model_sha, source_id, transaction_id, params)  # stored between the first get and the lock
            if hit is not None:
                return hit, "stored"
            return self._compute_put(model_sha, source_id, transaction_id, params, compute), "computed"
        finally:
            with self._lock:
                self._inflight.pop(key, None)
            ev.set()

    def _compute_put(self, model_sha: str, source_id: str, transaction_id: str, params: Mapping[str, Any],
                     compute: Callable[[], Mapping[str, Explanation]]) -> dict[str, Explanation]:
        t0 = time.perf_counter()
        out = dict(compute())
        try:
            self.put(model_sha, source_id, transaction_id, params, out, time.perf_counter() - t0)
        except (OSError, sqlite3.Error):  # an unwritable cache: the result is still returned
            pass
        return out

    def in_flight(self) -> int:
        """How many keys are being computed now through :meth:`get_or_compute`."""
        with self._lock:
            return len(self._inflight)

    def count(self, model_sha: str | None = None) -> int:
        q, a = "SELECT COUNT(*) FROM explanations", ()
        if model_sha is not None:
            q, a = q + " WHERE model_sha = ?", (str(model_sha),)
        return int(self._conn().execute(q, a).fetchone()[0])


def precompute(
    explain: Callable[[str], Mapping[str, Explanation]],
    transaction_ids: Iterable[str],
    cache: ExplanationCache,
    *,
    model_sha: str,
    source_id: str,
    params: Mapping[str, Any],
    budget_s: float = 300.0,
    stop: threading.Event | None = None,
    log: Callable[[str], None] | None = None,
    after: Callable[[str, Mapping[str, Explanation]], None] | None = None,
) -> dict[str, int]:
    """Explain ``transaction_ids`` in order (pass the flagged ones, most risky first) and store
    each result, skipping those already stored, until ``budget_s`` seconds or ``stop`` is set.

    Args:
        explain: ``transaction_id -> {method: Explanation}`` (e.g. a partial of
            :func:`engine.cases.view.explain_query` over the loaded frame).
        after: called as ``after(transaction_id, explanations)`` once each transaction's
            explanations are stored (computed or read), e.g. to build what the page shows from them
            ahead of time; its KeyError, ValueError or RuntimeError counts as ``"failed"``.
    Returns:
        ``{"computed", "cached", "failed", "left"}`` counts ("cached": stored already, or computed
        meanwhile by another thread of this process, :meth:`ExplanationCache.get_or_compute`).
    """
    t0 = time.perf_counter()
    counts = {"computed": 0, "cached": 0, "failed": 0, "left": 0}
    ids = [str(t) for t in transaction_ids]
    for i, tid in enumerate(ids):
        if (stop is not None and stop.is_set()) or time.perf_counter() - t0 > budget_s:
            counts["left"] = len(ids) - i
            break
        try:  # through get_or_compute: a transaction the page is computing now is not computed again
            out, how = cache.get_or_compute(model_sha, source_id, tid, params, lambda: explain(tid))
            if after is not None:
                after(tid, out)
        except (KeyError, ValueError, RuntimeError) as e:  # a bad row must not stop the others
            counts["failed"] += 1
            if log:
                log(f"precompute {tid}: {type(e).__name__}: {e}")
            continue
        counts["computed" if how == "computed" else "cached"] += 1
    return counts


__all__ = ["CACHE_VERSION", "FIELDS_KIND", "WAIT_S", "ExplanationCache", "cache_key", "decode_explanations",
           "encode_explanations", "precompute"]
