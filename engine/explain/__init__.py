"""Explanations of one query transaction's score: registry and one-call entry points.

Methods (one file each; every one returns an :class:`~engine.explain.base.Explanation` with
``values [T]`` over the context, query last):

=========================  ==================  ======  =====================================
name                       units               signed  file
=========================  ==================  ======  =====================================
``attention``              attention weight    no      attention.py
``attention_rollout``      attention weight    no      attention.py (Abnar & Zuidema 2020)
``integrated_gradients``   logit               yes     integrated_gradients.py (Sundararajan 2017)
``shap``                   logit               yes     shap_values.py + shapley.py (exact / TimeSHAP
                                                       pruning / repeated KernelSHAP, with standard
                                                       errors)
``occlusion``              logit               yes     occlusion.py (leave-one-out)
=========================  ==================  ======  =====================================

Removing a transaction (occlusion, SHAP) always means the presence-mask rule of
:mod:`engine.explain.removal`. No explainer leaves hooks on, or changes, the shared model.

Package map: :mod:`~engine.explain.context` (the :class:`QueryContext`: exactly the window the
scorer used, query last), :mod:`~engine.explain.base` (the :class:`Explanation` type),
:mod:`~engine.explain.removal` (the shared presence-mask machinery), then one file per method
(table above). Imports :mod:`engine.data` and :mod:`engine.model`; never :mod:`engine.trust` or
:mod:`engine.cases`.
"""

from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

from engine.explain.attention import AttentionConfig, AttentionExplainer, AttentionRolloutExplainer, RolloutConfig
from engine.explain.base import ATTENTION_CAVEAT, Explanation
from engine.explain.integrated_gradients import IGConfig, IntegratedGradientsExplainer
from engine.explain.occlusion import OcclusionConfig, OcclusionExplainer
from engine.explain.shap_values import ShapConfig, ShapExplainer

METHODS: dict[str, type] = {
    e.name: e
    for e in (
        AttentionExplainer,
        AttentionRolloutExplainer,
        IntegratedGradientsExplainer,
        ShapExplainer,
        OcclusionExplainer,
    )
}
DEFAULT_METHODS: tuple[str, ...] = ("attention", "attention_rollout", "integrated_gradients", "shap", "occlusion")

from engine.explain.context import QueryContext, build_context  # noqa: E402

__all__ = [
    "QueryContext", "build_context",
    "ATTENTION_CAVEAT", "DEFAULT_METHODS", "METHODS", "AttentionConfig", "Explanation", "IGConfig",
    "OcclusionConfig", "RolloutConfig", "ShapConfig", "explain_all", "explain_transaction",
]


def explain_all(
    ctx,
    methods: Iterable[str] = DEFAULT_METHODS,
    *,
    seed: int = 0,
    ig_steps: int = 50,
    shap_samples: int | None = None,
    configs: dict[str, Any] | None = None,
) -> dict[str, Explanation]:
    """Run several explainers on one :class:`~engine.explain.context.QueryContext`.

    Args:
        ctx: the query context (``engine.explain.context.build_context``).
        methods: names from :data:`METHODS`, run in this order.
        seed: SHAP coalition-sampling seed.
        ig_steps: Integrated Gradients initial path points (``IGConfig.n_steps``; adaptive
            refinement may add up to ``8 * ig_steps`` in all, see ``IGConfig.target_delta``).
        shap_samples: SHAP coalitions per KernelSHAP round (``ShapConfig.nsamples``; ``None`` =
            ``2 * P + 512``); rounds, exact enumeration and pruning follow :class:`ShapConfig`.
        configs: optional ``{method: config}`` overriding the config built from the
            arguments above (e.g. ``{"attention": AttentionConfig(layer=0, head=1)}``).
    Returns:
        ``{method: Explanation}`` in the order of ``methods``.
    Raises:
        ValueError: an unknown method name or a config of the wrong type.
    """
    methods = list(methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"methods: unknown {unknown}; expected names from {sorted(METHODS)}")
    configs = dict(configs or {})
    defaults = {
        "integrated_gradients": IGConfig(n_steps=ig_steps, max_steps=8 * ig_steps),
        "shap": ShapConfig(nsamples=shap_samples, seed=seed),
    }
    out: dict[str, Explanation] = {}
    for m in methods:
        cls = METHODS[m]
        cfg = configs.get(m, defaults.get(m))
        if cfg is not None and not isinstance(cfg, cls.config_class):
            raise ValueError(f"configs[{m!r}]: expected {cls.config_class.__name__}, got {type(cfg).__name__}")
        out[m] = cls(cfg).explain(ctx)
    return out


def explain_transaction(bundle, frame: pd.DataFrame, transaction_id: str, **kw) -> dict[str, Explanation]:
    """Build the context of ``transaction_id`` in a canonical frame and run :func:`explain_all`
    (``kw`` as there). Without a reference already attached to ``bundle``
    (:func:`engine.explain.reference.attach_reference`), the typical transaction of Integrated
    Gradients comes from the checkpoint or from ``frame``'s rows.

    Raises:
        KeyError: the transaction id is not in the frame.
    """
    from engine.explain.context import build_context
    from engine.explain.reference import attach_reference

    if getattr(bundle, "_field_reference", None) is None:  # IG's typical transaction, from this frame's rows
        attach_reference(bundle, frame)
    return explain_all(build_context(bundle, frame, transaction_id), **kw)
