"""Sanity checks of the explainers: do they depend on the model, and are they complete?

Model-parameter randomisation (cascading)
-----------------------------------------
Adebayo, Gilmer, Muelly, Goodfellow, Hardt & Kim (2018), "Sanity Checks for Saliency Maps",
NeurIPS, arXiv:1810.03292. An explanation that is evidence about *this model* must change when
the model's learned weights are destroyed. On a **deep copy** of the model (the shared model is
never touched) the parameters are re-drawn layer by layer from the top:

====  ===========================================================================
step  randomised so far (cumulative)
====  ===========================================================================
0     nothing (the original attributions)
1     ``head`` (logit head and final LayerNorm)
2     ``block L-1`` (the last transformer block: attention incl. time-decay slopes, MLP)
...   ... down to ``block 0``
L+2   ``row encoder`` (input LayerNorm and every field embedding): fully random model
====  ===========================================================================

*Re-drawing* a parameter tensor ``p`` means replacing it by i.i.d. ``N(0, rms(p)^2)`` values
(``rms`` = root mean square of the original tensor): the learned values are gone but the scale
of the activations stays in the trained range (a zero tensor, e.g. an unused bias, stays zero).
Buffers (bucket edges, offsets) are not parameters and are kept.

At every step and for every method the attributions of the earlier context transactions (the
query excluded: SHAP and occlusion give it 0 by definition) are compared with the original ones
by Spearman rank correlation, of the signed values and of their magnitudes (Adebayo et al.
report both). **Decision rule**: after full randomisation, ``stat = max(mean Spearman,
mean |.| Spearman)`` over the cases; a method with ``stat >`` :data:`RANDOMISATION_BOUND`
(0.5) is marked **"not evidence"** for that model: its ranking survives the destruction of
everything the model learned, so it reflects the input or the architecture, not the learned
function. (For unrelated rankings of ``P`` items Spearman has standard deviation about
``1/sqrt(P-1)``: 0.27 at ``P = 15``, so use several cases with short contexts.) Attention is
expected to keep some rank correlation through the cascade: the causal mask and the
time-decay bias (a random but still positive slope) favour recent transactions in any model.

Completeness
------------
Integrated Gradients satisfies ``sum(values) = f(x) - f(baseline)`` in the limit of quadrature
steps; KernelSHAP satisfies efficiency ``sum(values) = f(x) - E[f]``. The gaps are in
``Explanation.convergence_delta`` (logit). :func:`completeness_checks` flags a case whose
``|gap|`` exceeds :data:`COMPLETENESS_TOLERANCE` (0.05 logit: a shift of at most ~1.25
percentage points of probability anywhere on the sigmoid) and, for IG, automatically re-runs
it with 4x the steps (up to ``max_retries`` times) before warning (:class:`CompletenessWarning`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr

from engine.explain.context import QueryContext
from engine.explain import METHODS, IGConfig
from engine.explain.base import Explanation
from engine.model.transformer import FraudTransformer

#: full-randomisation rank correlation above which a method is "not evidence" (see module doc)
RANDOMISATION_BOUND = 0.5
#: |completeness gap| (logit) above which a case is flagged (see module doc)
COMPLETENESS_TOLERANCE = 0.05

AttributionFn = Callable[[QueryContext], "Explanation | np.ndarray"]


class CompletenessWarning(UserWarning):
    """An attribution's completeness gap is above the tolerance (after retries)."""


# ------------------------------------------------------------------------------ randomisation
def cascade_steps(model: FraudTransformer) -> list[tuple[str, list[str]]]:
    """The cascade, top layer first: ``[(step name, [module names of model])]`` (see module doc)."""
    steps = [("head", ["head", "ln_out"])]
    for i in reversed(range(len(model.blocks))):
        steps.append((f"block {i}", [f"blocks.{i}"]))
    steps.append(("row encoder", ["ln_in", "rows"]))
    return steps


@torch.no_grad()
def randomise_modules_(model: torch.nn.Module, names: Iterable[str], generator: torch.Generator) -> int:
    """Re-draw, **in place**, every parameter of the named submodules of ``model`` as
    ``N(0, rms(p)^2)`` (see module doc). Only ever call on a copy. Returns the number of values
    re-drawn.

    Raises:
        AttributeError: a name is not a submodule of ``model``.
    """
    n = 0
    for name in names:
        for p in model.get_submodule(name).parameters():
            rms = float(p.detach().double().pow(2).mean().sqrt())
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float64).to(p.dtype) * rms)
            n += p.numel()
    return n


def _with_model(ctx: QueryContext, model: FraudTransformer) -> QueryContext:
    return dataclasses.replace(ctx, bundle=dataclasses.replace(ctx.bundle, model=model))


def _attribution_fns(methods, configs: Mapping[str, Any] | None) -> dict[str, AttributionFn]:
    if isinstance(methods, Mapping):
        return dict(methods)
    configs = dict(configs or {})
    out: dict[str, AttributionFn] = {}
    for m in methods:
        if m not in METHODS:
            raise ValueError(f"methods: unknown {m!r}; expected names from {sorted(METHODS)} or a mapping of callables")
        out[m] = METHODS[m](configs.get(m)).explain
    return out


def _values(x: "Explanation | np.ndarray", T: int) -> np.ndarray:
    v = np.asarray(x.values if isinstance(x, Explanation) else x, dtype=np.float64).reshape(-1)
    if v.shape != (T,):
        raise ValueError(f"attribution: expected {T} values (one per context transaction), got {v.shape}")
    return v[:-1]  # earlier transactions only


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)


@dataclass
class RandomisationResult:
    """Result of :func:`randomisation_check`.

    Attributes:
        table: one row per (case, method, step): ``case`` (query transaction id), ``method``,
            ``step`` (0 = original), ``randomised`` (step name, ``"none"`` at 0), ``spearman``,
            ``spearman_abs`` (rank correlation of the signed values / of the magnitudes with the
            original attributions; NaN when a ranking is constant or ``P < 3``).
        summary: one row per method: ``method``, ``final_spearman``, ``final_spearman_abs``
            (means over cases at the last step), ``stat`` (their max), ``bound``, ``evidence``
            (bool), ``verdict`` (``"evidence"`` / ``"not evidence"`` / ``"undetermined"`` when
            every correlation is NaN).
        steps: step names in order (``["none", "head", "block L-1", ..., "row encoder"]``).
        bound: the bound used. seed: the randomisation seed. elapsed_s: wall time.
    """

    table: pd.DataFrame
    summary: pd.DataFrame
    steps: list[str]
    bound: float
    seed: int
    elapsed_s: float = 0.0

    def verdicts(self) -> dict[str, str]:
        return dict(zip(self.summary["method"], self.summary["verdict"]))


def randomisation_check(
    contexts: QueryContext | list[QueryContext],
    methods: Iterable[str] | Mapping[str, AttributionFn] = ("integrated_gradients",),
    *,
    seed: int = 0,
    bound: float = RANDOMISATION_BOUND,
    configs: Mapping[str, Any] | None = None,
) -> RandomisationResult:
    """Cascading model-parameter randomisation (Adebayo et al. 2018) on a deep copy of the model.

    Args:
        contexts: one or several query contexts (all of the same bundle).
        methods: method names of :data:`engine.explain.METHODS` (run with ``configs[name]`` or the
            method's default config), or ``{name: callable(ctx) -> Explanation or [T] values}``
            (any attribution function, e.g. a deliberately broken one).
        seed: seed of the re-drawn weights.
        bound: decision bound on the final rank correlation (default :data:`RANDOMISATION_BOUND`).
        configs: ``{method name: config}`` for named methods.
    Returns:
        :class:`RandomisationResult`. The shared model's weights are unchanged (a deep copy is
        randomised).
    Raises:
        ValueError: no context, contexts of different models, or an unknown method name.
    """
    t0 = time.perf_counter()
    ctxs = [contexts] if isinstance(contexts, QueryContext) else list(contexts)
    if not ctxs:
        raise ValueError("contexts: expected at least one QueryContext")
    model = ctxs[0].bundle.model
    if any(c.bundle.model is not model for c in ctxs):
        raise ValueError("contexts: expected contexts of one and the same model")
    fns = _attribution_fns(methods, configs)
    work = copy.deepcopy(model).eval()
    gen = torch.Generator().manual_seed(seed)
    steps = [("none", [])] + cascade_steps(work)
    original: dict[tuple[int, str], np.ndarray] = {}
    rows = []
    for s, (step_name, names) in enumerate(steps):
        randomise_modules_(work, names, gen)
        for ci, ctx in enumerate(ctxs):
            c = _with_model(ctx, work)
            for m, fn in fns.items():
                v = _values(fn(c), ctx.T)
                if s == 0:
                    original[(ci, m)] = v
                o = original[(ci, m)]
                rows.append({"case": ctx.query_transaction_id, "method": m, "step": s, "randomised": step_name,
                             "spearman": _spearman(o, v), "spearman_abs": _spearman(np.abs(o), np.abs(v))})
    table = pd.DataFrame(rows, columns=["case", "method", "step", "randomised", "spearman", "spearman_abs"])
    last = table[table.step == len(steps) - 1]
    summ = []
    for m in fns:
        r = last[last.method == m]
        fs = float(r.spearman.mean()) if r.spearman.notna().any() else float("nan")
        fa = float(r.spearman_abs.mean()) if r.spearman_abs.notna().any() else float("nan")
        stat = float(np.nanmax([fs, fa])) if not (math.isnan(fs) and math.isnan(fa)) else float("nan")
        ev = bool(stat <= bound) if not math.isnan(stat) else False
        verdict = "undetermined" if math.isnan(stat) else ("evidence" if ev else "not evidence")
        summ.append({"method": m, "final_spearman": fs, "final_spearman_abs": fa, "stat": stat, "bound": bound,
                     "evidence": ev, "verdict": verdict})
    return RandomisationResult(table=table, summary=pd.DataFrame(summ), steps=[n for n, _ in steps],
                               bound=bound, seed=seed, elapsed_s=time.perf_counter() - t0)


# ------------------------------------------------------------------------------ completeness
@dataclass
class CompletenessCheck:
    """Completeness of one explanation of one query.

    Attributes:
        method: ``"integrated_gradients"`` or ``"shap"``.
        query_transaction_id: the case.
        initial_delta: the gap of the explanation as given (logit).
        delta: the gap after retries (logit; equals ``initial_delta`` without a retry).
        tolerance: the tolerance (logit).
        ok: ``|delta| <= tolerance``.
        retries: IG re-runs made (0 for SHAP).
        n_steps: IG quadrature points of the final explanation (``None`` for SHAP).
        message: plain-language result (the warning text when not ok).
    """

    method: str
    query_transaction_id: str
    initial_delta: float
    delta: float
    tolerance: float
    ok: bool
    retries: int = 0
    n_steps: int | None = None
    message: str = ""


def completeness_checks(
    ctx: QueryContext,
    explanations: Mapping[str, Explanation],
    *,
    tolerance: float = COMPLETENESS_TOLERANCE,
    max_retries: int = 2,
    warn: bool = True,
) -> tuple[list[CompletenessCheck], dict[str, Explanation]]:
    """Check IG's convergence delta and SHAP's efficiency gap against ``tolerance``; re-run IG
    with 4x the quadrature points (``IGConfig(n_steps=4n, max_steps=8 * 4n, target_delta=
    tolerance / 10)``, n_steps capped at 4096) while ``|delta| > tolerance``, at most
    ``max_retries`` times.

    Returns:
        ``(checks, explanations)``: one :class:`CompletenessCheck` per IG / SHAP explanation
        present, and a copy of ``explanations`` where IG is replaced by the best re-run.
    Warns:
        :class:`CompletenessWarning` for every check still above the tolerance (if ``warn``).
    Raises:
        ValueError: ``tolerance <= 0`` or ``max_retries < 0``.
    """
    if not tolerance > 0:
        raise ValueError(f"tolerance: expected > 0, got {tolerance}")
    if max_retries < 0:
        raise ValueError(f"max_retries: expected >= 0, got {max_retries}")
    out = dict(explanations)
    checks = []
    ig = out.get("integrated_gradients")
    if ig is not None:
        d0 = float(ig.convergence_delta)
        best, retries = ig, 0
        n = int(ig.params.get("n_steps", 50))
        while abs(float(best.convergence_delta)) > tolerance and retries < max_retries and n < 4096:
            n = min(4096, 4 * n)
            cfg = IGConfig(n_steps=n, max_steps=8 * n, target_delta=tolerance / 10,
                           method=ig.params.get("method", "gausslegendre"),
                           path_breakpoints=tuple(ig.params.get("path_breakpoints", IGConfig().path_breakpoints)))
            e = METHODS["integrated_gradients"](cfg).explain(ctx)
            retries += 1
            if abs(e.convergence_delta) < abs(best.convergence_delta):
                best = e
        out["integrated_gradients"] = best
        d = float(best.convergence_delta)
        ok = abs(d) <= tolerance
        msg = (f"IG completeness gap {d:+.4f} logit (tolerance {tolerance})"
               + (f" after {retries} re-run(s) with more steps" if retries else "")
               + ("" if ok else ": the attributions do not add up to f(x) - f(baseline); treat with care"))
        checks.append(CompletenessCheck("integrated_gradients", ctx.query_transaction_id, d0, d, tolerance, ok,
                                        retries, int(best.params.get("n_steps_total", n)), msg))
    sh = out.get("shap")
    if sh is not None:
        d = float(sh.convergence_delta)
        ok = abs(d) <= tolerance
        msg = (f"SHAP efficiency gap {d:+.4f} logit (tolerance {tolerance})"
               + ("" if ok else ": the values do not add up to f(x) - f(query alone); treat with care"))
        checks.append(CompletenessCheck("shap", ctx.query_transaction_id, d, d, tolerance, ok, 0, None, msg))
    if warn:
        for c in checks:
            if not c.ok:
                warnings.warn(f"{c.query_transaction_id}: {c.message}", CompletenessWarning, stacklevel=2)
    return checks, out


def completeness_table(checks: list[CompletenessCheck]) -> pd.DataFrame:
    """Checks as a DataFrame (one row each, the dataclass fields as columns)."""
    return pd.DataFrame([dataclasses.asdict(c) for c in checks],
                        columns=[f.name for f in dataclasses.fields(CompletenessCheck)])


__all__ = ["COMPLETENESS_TOLERANCE", "RANDOMISATION_BOUND", "CompletenessCheck", "CompletenessWarning",
           "RandomisationResult", "cascade_steps", "completeness_checks", "completeness_table",
           "randomisation_check", "randomise_modules_"]

