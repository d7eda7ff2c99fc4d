"""Integrated Gradients on the per-field input embeddings of the context.

Sundararajan, Taly & Yan (2017), "Axiomatic Attribution for Deep Networks", arXiv:1703.01365,
computed with Captum's :class:`captum.attr.IntegratedGradients`.

* **Input** ``x``: the per-field input embeddings ``[1, T, F, D]`` float32 of the context
  (``FraudTransformer.embed``), i.e. what the transformer sees after the row encoder and *before*
  its first LayerNorm (the path interpolates field embeddings, never normalised activations).
* **Target**: the query's logit (last position) of
  ``FraudTransformer.forward_from_embeddings(x, batch)``.
* **Baseline** ``x'`` (``IGConfig.baseline`` and ``IGConfig.scope``), built from the typical
  transaction of :mod:`engine.data.field_reference` (:mod:`engine.explain.reference`):

  - ``baseline="reference", scope="context"`` (default): the embeddings of the *same timeline
    with every transaction a typical one*: each context transaction's content fields (every
    field but hour, weekday and time since previous) at the reference, timestamps kept — a real
    model input, so ``f(x')`` is the score of a transaction the analyst can picture, and it
    differs from case to case (timing differs). The timing fields are identical in ``x`` and
    ``x'`` and get attribution 0.
  - ``baseline="reference", scope="query"``: the history as it is and the *query* replaced by
    the typical transaction (every one of its ``F`` fields at the reference, the time since
    previous at the median gap and the amount at the usual amount). Only the query row moves:
    its ``F`` field values are the per-field attribution of the query, checked against field
    ablation (:mod:`engine.explain.field_attribution`).
  - ``baseline="zero"``: every field of every transaction (or of the query, ``scope="query"``)
    the zero vector — kept for comparison only: after the first LayerNorm every zeroed row is
    the same vector, so ``f(x')`` is one constant for every case and, LayerNorm being scale
    invariant, all change happens at ``alpha * std ~ sqrt(eps)`` (the split path below).

  The presence mask and timestamps are unchanged, so the attention mask and time-decay bias are
  the same for ``x`` and ``x'``. ``f(x')`` is reported as ``reference_logit``.
* **Attribution** of embedding element ``(t, f, d)``: ``(x - x')_{tfd} * mean_alpha grad_{tfd}
  f(x' + alpha (x - x'))`` with ``n_steps`` points of a quadrature rule. Summed over ``D`` ->
  ``field_values [T, F]``, summed over ``F`` -> ``values [T]``. Units: **logit**; signed
  (positive pushes the score towards fraud).
* **Completeness**: ``sum(values) = f(x) - f(x')`` up to the quadrature error, reported by
  Captum as ``convergence_delta = sum(attributions) - (f(x) - f(x'))`` (logit).

What IG cannot do here: an earlier transaction also acts through fields the row encoder computes
from the history (the query's amount versus the entity's usual amount, its time since the
previous transaction). IG on embeddings credits that effect to the *query's* computed field, never
to the earlier transaction; the cell-level Shapley values of
:mod:`engine.explain.field_attribution` replace cells in the input and do credit it.

Quadrature on a split path
--------------------------
With the zero baseline the straight path is flat above ``alpha ~ 1e-2`` (LayerNorm's scale
invariance): a plain rule misses completeness by logits. So for ``baseline="zero"`` the path is
split at ``path_breakpoints`` (default the decades ``1e-4, 1e-3, 1e-2, 1e-1``: 5 segments of 10
points for the default 50) and Captum integrates every segment with its own
``ceil(n_steps / K)`` points, all segments in one batched call (segment ``k`` is one example with
input ``x' + a_{k+1} (x - x')`` and baseline ``x' + a_k (x - x')``). The segments tile the same
straight line, so the sum of their attributions *is* IG from ``x'``. The reference baselines
need no split (default one segment): both ends are real rows, the row sums never pass near 0.

By default the quadrature is **adaptive**: while ``|delta| > target_delta``, the segments with the
largest ``|delta|`` are halved (geometric midpoint on the zero baseline's decades, arithmetic
otherwise) and integrated again, up to ``max_steps`` points in all (``params["n_steps_total"]``,
``params["path"]``, ``extras["segment_deltas"]``). A segment's delta is its own completeness gap,
so it is an honest error signal, though a necessary condition only (it can cancel within a
segment).

Gradients are taken with respect to the input embeddings only (``torch.autograd.grad``); the
model's parameters, their ``requires_grad`` flags and ``.grad`` are left untouched, and Captum's
``IntegratedGradients`` registers no hooks.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import ClassVar

import numpy as np
import torch

from engine.explain.context import QueryContext
from engine.explain.base import Explanation
from engine.explain.reference import (
    describe_reference,
    reference_context_batch,
    reference_of,
    reference_row_embedding,
)
from engine.explain.removal import eval_mode

UNITS = "logit"
DEFAULT_BREAKPOINTS: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1)
METHODS = ("gausslegendre", "riemann_trapezoid", "riemann_middle", "riemann_left", "riemann_right")
BASELINES = ("reference", "zero")
SCOPES = ("context", "query")
BASELINE_TEXT = {
    ("reference", "context"): (
        "typical timeline: every context transaction's content (all fields but hour, weekday and time "
        "since previous) set to the typical transaction (per-field reference), timestamps kept; "
        "embeddings interpolated before the first LayerNorm"),
    ("reference", "query"): (
        "typical query: the history as it is, the query replaced by the typical transaction (every "
        "field at its per-field reference); embeddings interpolated before the first LayerNorm"),
    ("zero", "context"): (
        "zero embedding: every field of every context transaction (query included) set to the zero "
        "vector in the per-field input-embedding space [T, F, D]; presence mask and timestamps "
        "unchanged (same attention mask and time-decay bias)"),
    ("zero", "query"): "zero embedding of the query's fields; history unchanged",
}
BASELINE = BASELINE_TEXT[("zero", "context")]


@dataclass
class IGConfig:
    """Integrated Gradients settings.

    Attributes:
        n_steps: total quadrature points on the path baseline -> input, ``1 <= n_steps <= 4096``
            (default 50), split evenly over the ``K = len(path_breakpoints) + 1`` segments,
            ``ceil(n_steps / K)`` each. The completeness gap shrinks as steps grow.
        method: Captum integration rule per segment, one of :data:`METHODS` (default
            ``"gausslegendre"``).
        internal_batch_size: path points per forward/backward pass, ``>= 1`` (default 64: all
            default points in one pass). Bounds memory to about ``internal_batch_size``
            copies of the context's activations.
        path_breakpoints: interior points ``0 < a_1 < ... < a_{K-1} < 1`` where the straight
            path is split (see the module docstring); ``()`` = one segment (plain Captum);
            ``None`` (default) = the decades for ``baseline="zero"``, ``()`` otherwise.
        baseline: ``"reference"`` (default, the typical transaction) or ``"zero"`` (see the module
            docstring). scope: ``"context"`` (default: every transaction moves) or ``"query"``
            (only the query's fields move, the history stays as it is).
        target_delta: adaptive refinement: while ``|convergence_delta| > target_delta`` (logit),
            split the segments with the largest ``|delta|`` at their geometric midpoint and
            integrate the halves again (``ceil(n_steps / K)`` points each), until ``max_steps``.
            ``None`` = no refinement (exactly the initial points). Default ``5e-3``; ``> 0``.
        max_steps: budget of quadrature points with refinement, ``>= n_steps`` (default 400).
    """

    n_steps: int = 50
    method: str = "gausslegendre"
    internal_batch_size: int = 64
    path_breakpoints: tuple[float, ...] | None = None
    target_delta: float | None = 5e-3
    max_steps: int = 400
    baseline: str = "reference"
    scope: str = "context"

    def __post_init__(self) -> None:
        if self.baseline not in BASELINES:
            raise ValueError(f"baseline: expected one of {BASELINES}, got {self.baseline!r}")
        if self.scope not in SCOPES:
            raise ValueError(f"scope: expected one of {SCOPES}, got {self.scope!r}")
        if self.path_breakpoints is None:
            self.path_breakpoints = DEFAULT_BREAKPOINTS if self.baseline == "zero" else ()
        self.path_breakpoints = tuple(float(a) for a in self.path_breakpoints)
        a = (0.0, *self.path_breakpoints, 1.0)
        if any(a[i] >= a[i + 1] for i in range(len(a) - 1)):
            raise ValueError(f"path_breakpoints: expected strictly increasing values in (0, 1), got {self.path_breakpoints}")
        if not 1 <= self.n_steps <= 4096:
            raise ValueError(f"n_steps: expected 1 <= n_steps <= 4096, got {self.n_steps}")
        if self.method not in METHODS:
            raise ValueError(f"method: expected one of {METHODS}, got {self.method!r}")
        if self.internal_batch_size < 1:
            raise ValueError(f"internal_batch_size: expected >= 1, got {self.internal_batch_size}")
        if self.target_delta is not None and not self.target_delta > 0:
            raise ValueError(f"target_delta: expected > 0 or None, got {self.target_delta}")
        if self.max_steps < self.n_steps:
            raise ValueError(f"max_steps: expected >= n_steps={self.n_steps}, got {self.max_steps}")


def explain(ctx: QueryContext, cfg: IGConfig | None = None) -> Explanation:
    """Integrated Gradients of the query logit w.r.t. the context's per-field embeddings.

    Returns an :class:`Explanation` with ``method="integrated_gradients"``, ``values [T]`` and
    ``field_values [T, F]`` float64 in logits (signed), ``reference_logit = f(baseline)``,
    ``convergence_delta`` (Captum's completeness gap summed over path segments, logit);
    ``params["path"]``: the final segment boundaries, ``params["n_steps_total"]``: points used.

    Raises:
        RuntimeError: called under ``torch.inference_mode()`` (gradients impossible).
    """
    from captum.attr import IntegratedGradients  # lazy: captum import is slow

    cfg = cfg or IGConfig()
    if torch.is_inference_mode_enabled():
        raise RuntimeError("integrated_gradients: cannot run under torch.inference_mode()")
    t0 = time.perf_counter()
    model, batch = ctx.bundle.model, ctx.batch
    T = ctx.T

    def query_logit(emb: torch.Tensor) -> torch.Tensor:  # [n, T, F, D] -> [n]
        return model.query_logits(batch, field_embeddings=emb)  # == forward_from_embeddings(...)[0][:, -1]

    with eval_mode(model):
        with torch.no_grad():
            x = model.embed(batch).detach()  # [1, T, F, D]
            x0 = baseline_embeddings(ctx, x, cfg.baseline, cfg.scope)  # [1, T, F, D]
            f_x = float(query_logit(x)[0])
            f_0 = float(query_logit(x0)[0])
        dx = x - x0
        ig = IntegratedGradients(query_logit)
        bounds = (0.0, *cfg.path_breakpoints, 1.0)
        steps = -(-cfg.n_steps // (len(bounds) - 1))  # ceil: points per segment

        def integrate(segs: list[tuple[float, float]]) -> list[tuple[float, float, np.ndarray, float]]:
            """IG over straight-path segments [a x, b x], one Captum call: [(a, b, attr [T, F], delta)]."""
            K = len(segs)
            lo = torch.tensor([a for a, _ in segs], dtype=x.dtype).view(K, 1, 1, 1)
            hi = torch.tensor([b for _, b in segs], dtype=x.dtype).view(K, 1, 1, 1)
            with torch.enable_grad():
                attr, delta = ig.attribute(
                    x0 + hi * dx, baselines=x0 + lo * dx, n_steps=steps, method=cfg.method,  # [K, T, F, D]
                    internal_batch_size=max(cfg.internal_batch_size, K), return_convergence_delta=True,
                )
            fv = attr.detach().sum(-1).double().cpu().numpy()  # [K, T, F, D] -> [K, T, F]
            d = delta.detach().double().cpu().numpy().reshape(K)
            return [(a, b, fv[k], float(d[k])) for k, (a, b) in enumerate(segs)]

        done = integrate(list(zip(bounds[:-1], bounds[1:])))
        used, refinements = steps * len(done), 0
        while cfg.target_delta is not None and abs(sum(s[3] for s in done)) > cfg.target_delta:
            # split the worst segments (largest |delta|), two new segments each, within the budget
            budget = (cfg.max_steps - used) // (2 * steps)
            worst = sorted(range(len(done)), key=lambda k: -abs(done[k][3]))
            pick = [k for k in worst if abs(done[k][3]) > cfg.target_delta / (2 * len(done))][:budget]
            if not pick:
                break
            new = []
            for k in pick:
                a, b = done[k][:2]
                geometric = cfg.baseline == "zero" and a > 0
                m = math.sqrt(a * b) if geometric else (a + b) / 2  # geometric midpoint on the decades
                new += [(a, m), (m, b)]
            done = sorted([s for k, s in enumerate(done) if k not in set(pick)] + integrate(new))
            used += steps * len(new)
            refinements += 1
    field_values = np.sum([s[2] for s in done], axis=0)  # [T, F]
    values = field_values.sum(-1)  # [T, F] -> [T]
    delta_total = float(sum(s[3] for s in done))
    return Explanation(
        method="integrated_gradients",
        entity_id=ctx.entity_id,
        transaction_ids=list(ctx.transaction_ids),
        query_transaction_id=ctx.query_transaction_id,
        values=values,
        field_values=field_values,
        field_names=list(ctx.field_names),
        units=UNITS,
        signed=True,
        baseline=BASELINE_TEXT[(cfg.baseline, cfg.scope)],
        params={**asdict(cfg), "segments": len(done), "n_steps_per_segment": steps, "n_steps_total": used,
                "refinements": refinements, "path": [s[0] for s in done] + [1.0],
                "target": "query logit (last position)",
                "input": f"per-field input embeddings [1, {T}, {x.shape[2]}, {x.shape[3]}]",
                "cost": IntegratedGradientsExplainer.cost},
        score_logit=f_x,
        reference_logit=f_0,
        convergence_delta=delta_total,
        extras={"sum_values": float(values.sum()), "f_x_minus_f_baseline": f_x - f_0,
                "segment_deltas": [s[3] for s in done], "baseline_kind": cfg.baseline, "scope": cfg.scope,
                **({"reference_sources": reference_of(ctx).sources,
                    "reference_values": describe_reference(ctx)}
                   if cfg.baseline == "reference" else {})},
        elapsed_s=time.perf_counter() - t0,
    )


def baseline_embeddings(ctx: QueryContext, x: torch.Tensor, baseline: str, scope: str) -> torch.Tensor:
    """The baseline ``x' [1, T, F, D]`` float32 for the context embeddings ``x [1, T, F, D]`` (see the
    module docstring for the four kinds)."""
    if scope == "query":
        x0 = x.clone()
        x0[0, -1] = 0.0 if baseline == "zero" else reference_row_embedding(ctx)  # [F, D]
        return x0
    if baseline == "zero":
        return torch.zeros_like(x)
    with torch.no_grad():
        return ctx.bundle.model.embed(reference_context_batch(ctx)).detach()


class IntegratedGradientsExplainer:
    """``"integrated_gradients"`` (see :func:`explain`)."""

    name: ClassVar[str] = "integrated_gradients"
    cost: ClassVar[str] = (
        "n_steps forward+backward passes of the context (up to max_steps when the completeness gap "
        "exceeds target_delta), batched internal_batch_size at a time, + 2 forward passes per Captum call"
    )
    signed: ClassVar[bool] = True
    units: ClassVar[str] = UNITS
    config_class: ClassVar[type] = IGConfig

    def __init__(self, cfg: IGConfig | None = None):
        self.cfg = cfg or IGConfig()

    def explain(self, ctx: QueryContext) -> Explanation:
        return explain(ctx, self.cfg)
