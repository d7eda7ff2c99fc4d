"""Can an explanation be trusted? Checks of the explainers in :mod:`engine.explain`.

One module per question (each returns plain dataclasses / DataFrames; figures are pure Plotly
functions in :mod:`engine.trust.figures`, no Streamlit anywhere here):

====================  ========================================================================
module                question
====================  ========================================================================
``faithfulness``      Does removing the transactions a method ranks first change the score more
                      than removing random ones? (deletion curve, AOPC, insertion/sufficiency)
``sanity``            Does the method depend on the model at all? (Adebayo et al. 2018 cascading
                      parameter randomisation) Is IG complete? (convergence gap; SHAP reports
                      standard errors instead, its additivity is imposed)
``agreement``         Do the methods rank the transactions alike? (Spearman / Kendall matrix)
``reasons``           Plain-language reason codes, numbers taken from the data, citing only
                      transactions and fields the attributions rank highly.
``whatif``            Edit the history (amount, merchant, remove, add, ...), re-score and
                      re-explain without retraining.
``bench``             All of the above over the flagged cases of a test period, with ground truth
                      (demo "Fraud Episode", Handbook TX_FRAUD_SCENARIO) -> markdown table.
====================  ========================================================================

Removing a transaction always means the presence-mask rule of :mod:`engine.explain.removal`
(:data:`engine.explain.removal.REMOVAL_RULE`). Nothing here changes the shared model: the
randomisation check works on a deep copy.

Units: scores and attributions are **logits** unless a column or field says ``probability``.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> submodule; imported lazily so that ``engine.trust.figures`` (pure Plotly, used by
#: the dashboard, which never imports torch) does not pull in torch through this package.
_EXPORTS = {
    "DISAGREE_BOUND": "agreement", "AgreementResult": "agreement", "method_agreement": "agreement",
    "FaithfulnessResult": "faithfulness", "evaluate_faithfulness": "faithfulness",
    "faithfulness_table": "faithfulness", "ranking_order": "faithfulness",
    "Reason": "reasons", "reason_codes": "reasons",
    "COMPLETENESS_TOLERANCE": "sanity", "RANDOMISATION_BOUND": "sanity", "CompletenessCheck": "sanity",
    "RandomisationResult": "sanity", "completeness_checks": "sanity", "randomisation_check": "sanity",
    "Edit": "whatif", "WhatIfResult": "whatif", "apply_edits": "whatif", "what_if": "whatif",
    "run_explanation_bench": "bench",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
