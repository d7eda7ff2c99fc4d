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

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engine.cases.thresholds import decision_band
from engine.serve.history import row_json, utcnow

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


def warm_start(service, path: str | Path, log=print) -> dict[str, int]:
    """Load ``path`` into ``service``'s history and cache (module docstring).

    Returns:
        ``{"rows_read", "rejected", "appended", "skipped" (ids already in history), "cached"}``.
    Raises:
        ValueError / FileNotFoundError: from reading the file; ValueError for a row older than
            its entity's history in the store.
    """
    from engine.data.io import read_transactions
    from engine.model.scoring import score_frame

    res = read_transactions(path, service.spec)
    frame = res.frame
    h = service.history
    with service.lock:
        known = {t for t in frame["transaction_id"] if h.get(t) is not None}
        new = frame[~frame["transaction_id"].isin(known)].reset_index(drop=True)
        had_history = any(h.count(e) for e in new["entity_id"].unique()[:10_000])
        thr = service.thresholds
        recs = []
        if not had_history and len(new):
            probs = score_frame(service.bundle, new)
            for row, logit, p in zip(frame_rows(new, service.spec), probs["logit"], probs["probability"]):
                recs.append(_record(service, row, float(logit), float(p), thr))
        else:
            for row in frame_rows(new, service.spec):
                last = service.cache.last_time_ns(row["entity_id"])
                if last is not None and row["ts_ns"] < last:
                    raise ValueError(f"{path}: transaction {row['transaction_id']} is older than entity "
                                     f"{row['entity_id']}'s history in the store")
                logit, _ = service.cache.score(row["entity_id"], row)
                recs.append(_record(service, row, logit, 1.0 / (1.0 + math.exp(-logit)), thr))
        for i in range(0, len(recs), 5000):
            h.append(recs[i:i + 5000])
        cached = 0
        for e in h.entities_by_recency(100_000):
            if service.cache.bytes >= 0.9 * service.cache.max_bytes:
                break
            if e not in service.cache.sizes:
                service.cache.rebuild(e)
            cached += 1
    out = {"rows_read": res.rows_read, "rejected": len(res.rejected), "appended": len(recs), "skipped": len(known),
           "cached": cached}
    log(f"warm start from {path}: {out['rows_read']:,} rows read, {out['rejected']:,} rejected, "
        f"{out['appended']:,} appended to history, {out['skipped']:,} already there, {cached:,} entities cached")
    return out


def _record(service, row: dict, logit: float, p: float, thr: dict) -> tuple:
    return (row["transaction_id"], row["entity_id"], row["ts_ns"], row_json(row), logit, p,
            decision_band(p, thr["review"], thr["decline"]), 0, service.bundle.sha256, utcnow())
