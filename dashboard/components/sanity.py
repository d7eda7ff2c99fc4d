"""Case page, Trust tab: the model-parameter randomisation check of the loaded model and data.

Run on demand (a button), once per model and data: :func:`sanity_result` caches it with
``st.cache_data`` keyed by (model sha256, data sha256, spec, max_rows, number of cases);
``st.session_state["trust_sanity_models"]`` lists the model sha256s the analyst asked for in
this session. The engine (:func:`engine.trust.sanity.randomisation_check`) does the work.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import state

SANITY_MODELS = "trust_sanity_models"
SANITY_CASES = 3
SANITY_METHODS = ("attention", "integrated_gradients", "shap", "occlusion")
SANITY_SHAP_SAMPLES = 256


def sanity_cases(scores: pd.DataFrame, n: int = SANITY_CASES, min_position: int = 3) -> list[str]:
    """The ``n`` highest-scored flagged transactions with at least ``min_position`` earlier ones
    (topped up with the highest-scored others when fewer are flagged)."""
    pos = scores.groupby("entity_id", sort=False).cumcount().to_numpy()
    s = scores.assign(_pos=pos)
    s = s[s["_pos"] >= min_position].sort_values("probability", ascending=False, kind="stable")
    flagged = s[s["flagged"]] if "flagged" in s else s.iloc[:0]
    ids = flagged["transaction_id"].astype(str).tolist()[:n]
    ids += [t for t in s["transaction_id"].astype(str) if t not in set(ids)][: n - len(ids)]
    return ids


@st.cache_data(show_spinner="Randomising the model's parameters layer by layer…", max_entries=8)
def _sanity(model_sha: str, data_sha: str, spec: str, max_rows: int | None, n_cases: int, _path: str,
            _model_path: str) -> dict[str, Any]:
    from engine.explain.context import build_context
    from engine.explain import ShapConfig
    from engine.trust.sanity import randomisation_check

    source = state._source(_path, spec, data_sha, max_rows)
    bundle = state.get_bundle(_model_path)
    scores = state._scores(_path, spec, data_sha, max_rows, _model_path, model_sha)
    cases = sanity_cases(scores, n_cases)
    ctxs = [build_context(bundle, source.frame, t) for t in cases]
    # kept cheap (it runs L + 3 times per case): two rounds of SANITY_SHAP_SAMPLES coalitions, no stopping rule
    res = randomisation_check(ctxs, SANITY_METHODS, configs={"shap": ShapConfig(
        nsamples=SANITY_SHAP_SAMPLES, min_rounds=2, stop_when_stable=False)})
    return {"cases": cases, "result": res}


def sanity_result(loaded: "state.Loaded", n_cases: int = SANITY_CASES) -> dict[str, Any]:
    """Randomisation check of the loaded model on ``n_cases`` flagged cases of the loaded data
    (cached per model sha256, data sha256, spec)."""
    path, spec, sha, max_rows, model_path, model_sha = loaded.key
    return _sanity(model_sha, sha, spec, max_rows, int(n_cases), path, model_path)


def _sanity_requested(loaded) -> bool:
    return loaded.bundle.sha256 in (st.session_state.get(SANITY_MODELS) or [])


def _request_sanity(model_sha: str) -> None:
    ss = st.session_state
    ss[SANITY_MODELS] = sorted(set(ss.get(SANITY_MODELS) or []) | {model_sha})
