"""Warm start of the scoring service from a transactions file, and the service token.

:func:`warm_start` reads a file through the model's spec (:func:`engine.data.io.read_transactions`,
every row accepted or reported rejected), appends the rows whose transaction id is not yet in
the history store, in (entity, time) order, and fills the entity cache with the most recently
active entities up to its memory cap. The rows are history, not live decisions: they are stored
with their scores (whole-file scoring, :func:`engine.model.scoring.score_frame`, when none of
their entities has history yet; otherwise one incremental step each, in order) and
``flagged = 0``, so they open no cases.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engine.cases.thresholds import decision_band
from engine.serve.history import row_json, utcnow
from engine.serve.service import ahead_message

#: environment variable holding the service token
ENV_TOKEN = "FRAUDLENS_SERVE_TOKEN"
#: shortest token accepted (characters)
MIN_TOKEN_CHARS = 32
#: fewest distinct characters in a token (refuses "aaaa..." and other repeated patterns)
MIN_TOKEN_DISTINCT = 10
_TOKEN_HINT = "e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`"


class TokenError(ValueError):
    """The token file or variable is unusable, or one is needed and missing."""


def resolve_token(token_file: Path | None, host: str, env: dict | None = None) -> str | None:
    """The bearer token: from ``token_file`` (its first non-empty line, stripped), else
    ``$FRAUDLENS_SERVE_TOKEN`` (stripped).

    A token needs at least :data:`MIN_TOKEN_CHARS` characters, :data:`MIN_TOKEN_DISTINCT` of
    them distinct.

    Raises:
        TokenError: the file is unreadable or has no non-empty line; the token is too short or
            has too few distinct characters; or ``host`` is not a loopback address and there is
            no token.
    """
    from engine.serve.access import is_loopback

    env = os.environ if env is None else env
    token, where = None, f"${ENV_TOKEN}"
    if token_file is not None:
        where = f"--token-file {token_file}"
        try:
            lines = token_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise TokenError(f"{where}: cannot be read ({e})") from None
        token = next((ln.strip() for ln in lines if ln.strip()), None)
        if token is None:
            raise TokenError(f"{where}: the file has no token (every line is empty); put the token on its first "
                             f"non-empty line ({_TOKEN_HINT})")
    elif env.get(ENV_TOKEN):
        token = env[ENV_TOKEN].strip()
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise TokenError(f"{where}: the service token has {len(token)} characters; it must have at least "
                         f"{MIN_TOKEN_CHARS} characters, at least {MIN_TOKEN_DISTINCT} of them distinct ({_TOKEN_HINT})")
    if token is not None and len(set(token)) < MIN_TOKEN_DISTINCT:
        raise TokenError(f"{where}: the service token has only {len(set(token))} distinct characters; it must have "
                         f"at least {MIN_TOKEN_DISTINCT} distinct characters ({_TOKEN_HINT})")
    if token is None and not is_loopback(host):
        raise TokenError(f"refusing to listen on {host} without a token: pass --token-file FILE or set ${ENV_TOKEN} "
                         "(clients then send 'Authorization: Bearer <token>')")
    return token


def frame_rows(frame: pd.DataFrame, spec) -> list[dict[str, Any]]:
    """Canonical-frame rows as the service's row dicts (as :func:`engine.serve.record.canonical_row`)."""
    keep = [c for c in frame.columns if c != "row_number"]
    ts_ns = frame["timestamp"].to_numpy("datetime64[ns]").view(np.int64)
    rows = []
    for r, t in zip(frame[keep].to_dict("records"), ts_ns.tolist()):
        r["ts_ns"] = int(t)
        lab = r.get("label")
        r["label"] = None if lab is None or lab is pd.NA or (isinstance(lab, float) and math.isnan(lab)) else int(lab)
        rows.append(r)
    return rows


def content_id(row: dict[str, Any], spec) -> str:
    """The warm-start transaction id of a row of a spec without an id column:
    ``"sha256:<16 hex>"`` of the row's entity, timestamp, amount and fields (canonical JSON,
    :func:`engine.serve.history.row_json`), not its label, passthrough or aggregate columns.

    A transaction is then known by its content, as the reader knows an exact duplicate: the
    same row in two files (an export that grew) is the same transaction ("already there"), a row
    whose label was corrected later is a conflict (reported), and row 5 of two files never share
    an id (the reader's ``"r<row_number>"`` would)."""
    key = {"entity_id": row["entity_id"], "ts_ns": row["ts_ns"], "amount": row["amount"],
           **{f.name: row.get(f.name) for f in spec.fields}}
    return "sha256:" + hashlib.sha256(row_json(key).encode("utf-8")).hexdigest()[:16]


def warm_start(service, path: str | Path, log=print) -> dict[str, Any]:
    """Load ``path`` into ``service``'s history and cache (module docstring).

    Every row read is appended, already there (its transaction id is in the history store with
    the same content), or rejected with its reason: rejected by the reader
    (:func:`engine.data.io.read_transactions`), a transaction id already in the history store
    with other content, a row older than its entity's last transaction in the store, or
    (without an id column) a row with the same :func:`content_id` as an earlier one. If
    anything fails half way, the entities the warm start touched are evicted from the cache
    (rebuilt from what was committed).

    Returns:
        ``{"rows_read", "rejected", "appended", "skipped" (same rows already in history),
        "conflicts" (ids in history with other content; counted in "rejected"), "cached"}`` (ints;
        ``rows_read == appended + skipped + rejected``) and ``"rejected_rows"``: a frame of
        :data:`engine.data.io.REJECTED_COLUMNS`, sorted by row.
    Raises:
        ValueError / FileNotFoundError: from reading the file.
    """
    from engine.data.io import REJECTED_COLUMNS, read_transactions
    from engine.model.scoring import score_frame

    spec = service.spec
    res = read_transactions(path, spec)
    frame = res.frame
    rows, numbers = frame_rows(frame, spec), frame["row_number"].tolist()
    same_as: dict[int, int] = {}  # no id column: row -> the earlier row with the same content id
    if not spec.id:
        first: dict[str, int] = {}
        for k, row in enumerate(rows):
            row["transaction_id"] = tid = content_id(row, spec)
            same_as[k] = first.setdefault(tid, k)
        same_as = {k: f for k, f in same_as.items() if f != k}
        frame = frame.assign(transaction_id=[r["transaction_id"] for r in rows])
    id_col = spec.id or ""
    h, cache = service.history, service.cache
    rejected = [dict(r) for r in res.rejected.to_dict("records")]
    if not spec.id:  # the reader's "r<row_number>" is not a warm row's id (content_id is, of a valid row)
        for r in rejected:
            r["transaction_id"] = ""

    def reject(k: int, column: str, value: str, reason: str) -> None:
        rejected.append({"file": str(path), "row_number": numbers[k], "transaction_id": rows[k]["transaction_id"],
                         "entity_id": rows[k]["entity_id"], "column": column, "value": value, "reason": reason})

    touched: set[str] = set()
    max_ahead = getattr(service, "max_ahead_ns", None)
    latest = None if max_ahead is None else time.time_ns() + max_ahead
    with service.lock:
        service.committer.flush()  # rows in flight first: the history store is read below
        keep, skipped, conflicts = [], 0, 0
        for k, row in enumerate(rows):
            if latest is not None and row["ts_ns"] > latest:  # as a posted row: it would lock its entity out
                reject(k, service.ts_column, str(row["timestamp"]), ahead_message(row["ts_ns"], max_ahead))
                continue
            if k in same_as:
                reject(k, "", "", f"the same transaction as row {numbers[same_as[k]]} (entity, time, amount and "
                       "fields equal; without an id column a transaction is known by them)")
                continue
            stored = h.get(row["transaction_id"])
            if stored is None:
                keep.append(k)
            elif stored["row_json"] == row_json(row):
                skipped += 1
            else:
                conflicts += 1
                reject(k, id_col, row["transaction_id"], "transaction id already in the history store with different "
                       "content (another transaction)" if spec.id else "the same transaction (entity, time, amount, "
                       "fields) is in the history store with other label or passthrough values")
        new = frame.iloc[keep].reset_index(drop=True)
        had_history = any(h.count(e) for e in new["entity_id"].unique())  # every entity: one with history is stepped
        thr = service.thresholds
        recs = []
        try:
            if not had_history and len(new):
                touched.update(new["entity_id"].unique().tolist())
                probs = score_frame(service.bundle, new)
                for k, logit, p in zip(keep, probs["logit"], probs["probability"]):
                    recs.append(_record(service, rows[k], float(logit), float(p), thr))
            else:
                for k in keep:
                    row = rows[k]
                    last = cache.last_time_ns(row["entity_id"])
                    if last is not None and row["ts_ns"] < last:
                        reject(k, service.ts_column, str(row["timestamp"]), f"older than entity {row['entity_id']}'s "
                               "last transaction in the history store (an entity's history is kept in time order)")
                        continue
                    touched.add(row["entity_id"])
                    logit, _ = cache.score(row["entity_id"], row)
                    recs.append(_record(service, row, logit, service.probability(logit), thr))
            for i in range(0, len(recs), 5000):
                h.append(recs[i:i + 5000])
            if not had_history:  # scored as a whole file: a cached (empty) state of these entities is stale
                for e in touched:
                    cache.evict(e)
        except BaseException:
            for e in touched:
                cache.evict(e)
            raise
        cached = 0
        for e in h.entities_by_recency(100_000):
            if cache.bytes >= 0.9 * cache.max_bytes:
                break
            if e not in cache.sizes:
                cache.rebuild(e)
            cached += 1
    rej = pd.DataFrame(rejected, columns=REJECTED_COLUMNS).sort_values("row_number", kind="stable")
    out = {"rows_read": res.rows_read, "rejected": len(rej), "appended": len(recs), "skipped": skipped,
           "conflicts": conflicts, "cached": cached, "rejected_rows": rej.reset_index(drop=True)}
    assert out["rows_read"] == out["appended"] + out["skipped"] + out["rejected"]
    log(f"warm start from {path}: {out['rows_read']:,} rows read, {out['rejected']:,} rejected, "
        f"{out['appended']:,} appended to history, {out['skipped']:,} already there, {cached:,} entities cached")
    for r in rej.head(10).to_dict("records"):
        log(f"  rejected row {r['row_number']}" + (f", column {r['column']!r}" if r["column"] else "")
            + f": {r['reason']}")
    if len(rej) > 10:
        log(f"  ... and {len(rej) - 10:,} more rejected rows")
    return out


def _record(service, row: dict, logit: float, p: float, thr: dict) -> tuple:
    return (row["transaction_id"], row["entity_id"], row["ts_ns"], row_json(row), logit, p,
            decision_band(p, thr["review"], thr["decline"]), 0, service.bundle.sha256, utcnow())
