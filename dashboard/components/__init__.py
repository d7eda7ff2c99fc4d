"""Shared dashboard pieces for the case queue, dispositions and exports (no torch here).

* :func:`get_store` - the :class:`engine.cases.store.CaseStore` (``$FRAUDLENS_DATA_DIR`` or the user
  data dir), one per process and database path;
* :func:`signed_in` / :func:`analyst` - the acting user: the signed-in identity of this session
  (dashboard/components/access.py), never a typed name or an environment variable;
* :func:`sync_cases` - upsert one case per entity of the scored source, keyed by model sha256;
* :func:`effective_thresholds` - the model's review/decline thresholds: stored in the case store
  when an analyst edited them, else the checkpoint's ``meta.thresholds``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pandas as pd
import streamlit as st

from dashboard.components import access
from engine.cases.store import CaseStore, default_db_path
from engine.serve.access import Identity


@st.cache_resource(show_spinner=False, max_entries=4)
def _store(path: str, four_eyes: bool) -> CaseStore:
    return CaseStore(path, four_eyes=four_eyes)


def get_store() -> CaseStore:
    """The case store of this process (path and four-eyes rule from the environment)."""
    from engine.cases.store import four_eyes_from_env

    return _store(str(default_db_path()), four_eyes_from_env())


def signed_in() -> Identity | None:
    """The signed-in identity of this session (``None`` only outside a signed-in page run)."""
    return access.current()


def analyst() -> str | None:
    """The signed-in user's name: what every store action records; ``None`` when nobody is."""
    ident = signed_in()
    return ident.name if ident is not None else None


def case_rows(loaded: Any) -> pd.DataFrame:
    """One row per entity of the scored source, in :data:`engine.cases.store.CASE_INPUT_COLUMNS`."""
    rk = loaded.ranking
    amt = loaded.source.frame.groupby("entity_id", sort=False)["amount"].max()
    return pd.DataFrame({
        "entity_id": rk["entity_id"].astype(str),
        "max_probability": rk["max_probability"].astype(float).clip(0, 1),
        "max_transaction_id": rk["top_transaction_id"].astype(str),
        "first_ts": rk["first_seen"],
        "last_ts": rk["last_seen"],
        "max_amount": rk["entity_id"].map(amt).astype(float),
        "n_transactions": rk["n_transactions"],
        "n_known_fraud": rk["known_frauds"],
    })


@st.cache_resource(show_spinner="Updating the case queue…", max_entries=8)
def _synced(db_path: str, key: tuple, _loaded: Any) -> dict[str, Any]:
    res = get_store().upsert_cases(_loaded.bundle.sha256, case_rows(_loaded))
    return {"created": res.created, "updated": res.updated, "unchanged": res.unchanged,
            "scored_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def sync_cases(loaded: Any) -> dict[str, Any]:
    """Upsert the cases of the loaded source + model once per process (only for a user whose
    role works cases: an auditor's view writes nothing); returns counts
    (created, updated, unchanged) and ``scored_at`` (UTC: when this process scored the source
    and upserted its cases)."""
    from engine.serve.access import ASSIGN, can

    if not can(signed_in(), ASSIGN):  # auditors and admins read; only case workers write cases
        return {"created": 0, "updated": 0, "unchanged": 0,
                "scored_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    return _synced(str(default_db_path()), tuple(loaded.key), loaded)


def effective_thresholds(bundle: Any, store: CaseStore | None = None) -> dict[str, Any]:
    """``review``, ``decline``, ``source`` for the model (stored thresholds win)."""
    store = store or get_store()
    t = store.get_thresholds(bundle.sha256) if bundle.sha256 else None
    if t is not None:
        return {"review": float(t.review), "decline": float(t.decline),
                "source": f"set by {t.updated_by} at {t.updated_at[:19]} UTC"}
    m = (bundle.meta or {}).get("thresholds", {}) or {}
    review = float(m.get("review", 0.5))
    decline = float(m.get("decline", max(review, 0.9)))
    return {"review": review, "decline": max(decline, review), "source": "checkpoint default"}


def case_for_entity(loaded: Any, entity_id: str) -> dict | None:
    """The case row of ``entity_id`` under the loaded model (after :func:`sync_cases`)."""
    store = get_store()
    q = store.queue(loaded.bundle.sha256, 0.0)
    hit = q.loc[q["entity_id"] == str(entity_id), "case_id"]
    return store.get_case(int(hit.iloc[0])) if len(hit) else None


STATE_LABELS = {"open": "open", "assigned": "assigned", "pending_approval": "pending approval",
                "confirmed_fraud": "confirmed fraud", "false_positive": "false positive", "escalated": "escalated"}
BAND_LABELS = {"below_review": "below review", "review": "review", "decline": "decline"}
