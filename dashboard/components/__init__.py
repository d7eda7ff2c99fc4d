"""Shared dashboard pieces for the case queue, dispositions and exports (no torch here).

* :func:`get_store` - the :class:`engine.cases.store.CaseStore` (``$FRAUDLENS_DATA_DIR`` or the user
  data dir), one per process and database path;
* :func:`signed_in` / :func:`analyst` - the acting user: the signed-in identity of this session
  (dashboard/components/access.py), never a typed name or an environment variable;
* :func:`sync_cases` - upsert one case per entity of the scored source, keyed by model sha256
  and data source (:func:`data_source_id`: the file's content sha256 + spec name), so the same
  entity id in another file is another case;
* :func:`effective_thresholds` - the model's review/decline thresholds: stored in the case store
  when an analyst edited them, else the checkpoint's ``meta.thresholds``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pandas as pd
import streamlit as st

from dashboard.components import access
from engine.cases.store import CaseStore, default_db_path, source_id
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


def data_source_id(loaded: Any) -> str:
    """The case store's data-source key of the loaded source (file content sha256 + spec key:
    :func:`engine.data.spec.spec_key`, the spec's content, not only its name)."""
    src = loaded.source
    from engine.data.spec import source_spec_key

    return source_id(src.file_sha256, source_spec_key(src.spec))


@st.cache_resource(show_spinner="Updating the case queue…", max_entries=8)
def _synced(db_path: str, key: tuple, _loaded: Any) -> dict[str, Any]:
    res = get_store().upsert_cases(_loaded.bundle.sha256, case_rows(_loaded),
                                   source_id=data_source_id(_loaded))
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
    """``review``, ``decline``, ``source`` for the model (stored thresholds win):
    :func:`engine.cases.thresholds.thresholds_in_force` on this process's case store."""
    from engine.cases.thresholds import thresholds_in_force

    return thresholds_in_force(bundle, store or get_store())


def case_for_entity(loaded: Any, entity_id: str) -> dict | None:
    """The case row of ``entity_id`` in the loaded source under the loaded model (after
    :func:`sync_cases`); ``None`` if it has none. Another file's entity with the same id is
    another case and never returned here."""
    return get_store().find_case(loaded.bundle.sha256, data_source_id(loaded), str(entity_id))


STATE_LABELS = {"open": "open", "assigned": "assigned", "pending_approval": "pending approval",
                "confirmed_fraud": "confirmed fraud", "false_positive": "false positive", "escalated": "escalated",
                "closed_no_action": "closed, no action"}
from engine.cases.thresholds import BAND_LABELS  # noqa: E402,F401 - re-exported for the pages
