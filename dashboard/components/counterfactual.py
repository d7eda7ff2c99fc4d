"""Case page: "what is the smallest change that clears this flag?", beside the reason codes.

Two sentences, from :mod:`engine.trust.counterfactual` (the what-if engine re-scores every
candidate change; nothing here imports torch): the fewest earlier transactions to remove so the
query falls below the review threshold in force (greedy in the ranking method's order, then pruned;
exact when the smaller sets are few enough to try), and the largest amount in ``[0, amount]`` at
which it does. Rendered by :func:`render_counterfactual`, called from the Trust tab
(``dashboard/components/trust.py``) right after the reason codes. Cached with ``st.cache_data``
per (data sha256, spec, max_rows, model sha256, transaction id, review threshold).
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import state
from dashboard.components.safe import error_text, md
from engine.cases import view as cv
from engine.cases.figures import transaction_labels


@st.cache_data(show_spinner="Looking for the smallest change that clears the flag…", max_entries=64)
def _counterfactuals(data_sha: str, spec: str, max_rows: int | None, model_sha: str, transaction_id: str,
                     threshold: float, _path: str, _model_path: str, _expls: Any = None) -> dict[str, Any]:
    from engine.trust.counterfactual import amount_counterfactual, removal_counterfactual

    source = state._source(_path, spec, data_sha, max_rows)
    bundle = state.get_bundle(_model_path)
    frame = source.frame
    ent = frame.loc[frame["transaction_id"].astype(str) == str(transaction_id), "entity_id"].iloc[0]
    rows = frame.loc[frame["entity_id"] == ent]
    labels = dict(zip(rows["transaction_id"].astype(str),
                      (str(cv.mask(x)) for x in transaction_labels(rows["timestamp"], rows["amount"], source.currency))))
    removal = removal_counterfactual(bundle, frame, transaction_id, threshold, _expls,
                                     describe=lambda t: labels.get(t, str(cv.mask(t))))
    amount = amount_counterfactual(bundle, frame, transaction_id, threshold)
    return {"removal": removal, "amount": amount}


def counterfactuals(loaded: "state.Loaded", query: str, expls: dict | None = None) -> dict[str, Any]:
    """``{"removal": RemovalCounterfactual, "amount": AmountCounterfactual}`` of ``query`` against
    the review threshold in force (cached). ``expls`` rank the removal candidates (default:
    occlusion is computed)."""
    path, spec, sha, max_rows, model_path, model_sha = loaded.key
    return _counterfactuals(sha, spec, max_rows, model_sha, str(query), float(loaded.threshold), path, model_path,
                            expls)


def render_counterfactual(loaded: "state.Loaded", query: str, res: dict[str, Any]) -> None:
    """The two counterfactual sentences of ``query`` (``res``: the Trust tab's cached result,
    whose explanations rank the removal candidates)."""
    st.markdown("#### Smallest change that clears this flag")
    try:
        cf = counterfactuals(loaded, query, res.get("explanations"))
    except Exception as e:  # noqa: BLE001
        st.warning(f"The counterfactual could not be computed: {error_text(e)}")
        return
    r, a = cf["removal"], cf["amount"]
    st.markdown(f"**Remove earlier transactions.** {md(r.text)}")
    st.markdown(f"**Change the amount.** {md(a.text)}")
    st.caption(f"Each change is re-scored with the what-if engine (same model, the edited history re-encoded); "
               f"{r.evaluations + a.evaluations} re-scores. The removal search is greedy unless it says "
               "\"the fewest\"; the amount is the largest found on a scan, not a guarantee for every amount. "
               "Try either change on the What-if tab.")


__all__ = ["counterfactuals", "render_counterfactual"]
