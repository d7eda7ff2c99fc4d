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
report both); ``rho = max(|spearman|, |spearman of magnitudes|)`` per case and step, so a
ranking that is merely reversed (rho -0.62) counts as kept, not as changed.

**Decision rule** (every step is judged, not only the last):

* the method's *noise floor*: its own seed-to-seed agreement on the unchanged model (the same
  ``rho`` between two runs with different seeds: 1 for deterministic methods, lower for sampled
  ones such as KernelSHAP with few coalitions), mean and 95 % t-interval over the cases. The
  randomised models are explained with that second seed too, so a step's ``rho`` and the floor
  carry the same sampling noise (with the original seed a sampled method would reuse its
  coalitions on the randomised model and look more stable than it is; until 2026-12-03 it did). If the
  interval's lower end is not above :data:`RANDOMISATION_BOUND`, the method disagrees with
  itself about as much as a randomised model would: **"undetermined"** (too noisy to judge);
* at every step ``s >= 1``: the mean ``rho`` over the cases and its two-sided 95 % t-interval
  (Student t, ``n - 1`` degrees of freedom); with ``draws > 1`` independent re-draws of the whole
  cascade, a case's ``rho`` is first averaged over the draws (one random model alone can be
  unusually kind or unkind to a method). The step **changed** the method when the interval
  lies wholly below the lower end of the noise floor's interval (for a deterministic method:
  below 1): randomising those layers moved the ranking more than re-running the method does;
* after the last step (every layer random) the mean ``rho`` must be at most
  :data:`RANDOMISATION_BOUND` (0.5): the ranking is *destroyed*, not merely perturbed;
* **"evidence"** when every step changed the method and the last step destroyed its ranking;
  **"not evidence"** otherwise, with ``first_unchanged`` naming the first step that left it in
  place (``head`` for a method that reads only the row encoder, or for attention, which no
  head randomisation can change) or ``reason`` the level it kept; **"undetermined"** with fewer
  than :data:`MIN_CASES` cases or when every correlation is NaN.

(For unrelated rankings of ``P`` items Spearman has standard deviation about ``1/sqrt(P-1)``:
0.27 at ``P = 15``, so use several cases; the t-interval widens when they are few.)

Completeness
------------
Integrated Gradients satisfies ``sum(values) = f(x) - f(baseline)`` in the limit of quadrature
steps; the gap is in ``Explanation.convergence_delta`` (logit). SHAP is **not** checked here:
every SHAP estimator (exact enumeration, KernelSHAP) imposes efficiency ``sum(values) = f(x) -
f(query alone)`` whatever its sampling error, so that gap detects nothing; SHAP's accuracy is its
per-value ``Explanation.standard_errors`` (:mod:`engine.explain.shap_values`).
:func:`completeness_checks` flags a case whose
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
from engine.model.ensemble import SeedEnsemble, members_of
from engine.model.transformer import FraudTransformer

#: rank correlation (upper end of its 95 % interval) a randomisation step must bring a method below
RANDOMISATION_BOUND = 0.5
#: fewest cases for a randomisation verdict other than "undetermined"
MIN_CASES = 3
#: |completeness gap| (logit) above which a case is flagged (see module doc)
COMPLETENESS_TOLERANCE = 0.05

AttributionFn = Callable[[QueryContext], "Explanation | np.ndarray"]


class CompletenessWarning(UserWarning):
    """An attribution's completeness gap is above the tolerance (after retries)."""


# ------------------------------------------------------------------------------ randomisation
def cascade_steps(model: FraudTransformer | SeedEnsemble) -> list[tuple[str, list[str]]]:
    """The cascade, top layer first: ``[(step name, [module names of model])]`` (see module doc).
    For a seed ensemble each step re-draws that layer in every member (``members.{k}.``), so a
    step leaves no member's copy of the layer trained."""
    one = members_of(model)[0]
    steps = [("head", ["head", "ln_out"])]
    for i in reversed(range(len(one.blocks))):
        steps.append((f"block {i}", [f"blocks.{i}"]))
    steps.append(("row encoder", ["ln_in"] + (["row_ff"] if one.row_ff is not None else []) + ["rows"]))
    if isinstance(model, SeedEnsemble):
        steps = [(name, [f"members.{k}.{m}" for k in range(len(model.members)) for m in mods]) for name, mods in steps]
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
        table: one row per (case, method, step, draw): ``case`` (query transaction id),
            ``case_index`` (its position in ``contexts``), ``method``, ``step`` (0 = original, in
            draw 0 only), ``randomised`` (step name, ``"none"`` at 0), ``draw``, ``spearman``,
            ``spearman_abs`` (rank correlation of the signed values / of the magnitudes with the
            original attributions; NaN when a ranking is constant or ``P < 3``) and ``rho``
            (``max`` of their absolute values: what the verdict reads).
        steps_table: one row per (method, step >= 1): ``method``, ``step``, ``randomised``,
            ``mean_rho``, ``ci_low``, ``ci_high`` (95 % t-interval over cases, each case's ``rho``
            averaged over the draws), ``n_cases``,
            ``changed`` (``ci_high`` below the noise floor's lower end). The figure plots these.
        self_agreement: one row per (case, method): ``rho`` between two runs of the method with
            different seeds on the unchanged model (the noise floor).
        summary: one row per method: ``method``, ``final_spearman``, ``final_spearman_abs``
            (means over the last step's rows, every case and draw, as reported before), ``stat`` (mean ``rho`` at the
            last step, compared with ``bound``), ``bound``, ``self_agreement`` and ``self_agreement_low``
            (mean and lower end of its interval), ``n_cases``, ``first_unchanged`` (step name or
            ``""``), ``evidence`` (bool), ``verdict`` (``"evidence"`` / ``"not evidence"`` /
            ``"undetermined"``), ``reason`` (one sentence).
        steps: step names in order (``["none", "head", "block L-1", ..., "row encoder"]``).
        bound: the bound used. seed: the randomisation seed. draws: re-draws of the cascade.
        elapsed_s: wall time.
    """

    table: pd.DataFrame
    summary: pd.DataFrame
    steps: list[str]
    bound: float
    seed: int
    elapsed_s: float = 0.0
    steps_table: pd.DataFrame | None = None
    self_agreement: pd.DataFrame | None = None
    draws: int = 1

    def verdicts(self) -> dict[str, str]:
        return dict(zip(self.summary["method"], self.summary["verdict"]))


def _t_interval(x: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)`` of the mean of ``x`` (NaNs dropped); NaN without values."""
    from scipy.stats import t as student_t

    x = x[~np.isnan(x)]
    if not len(x):
        return float("nan"), float("nan"), float("nan")
    m = float(x.mean())
    if len(x) < 2:
        return m, float("-inf"), float("inf")
    half = float(student_t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return m, m - half, m + half


def _rho(a: np.ndarray, b: np.ndarray) -> float:
    """``max(|spearman|, |spearman of magnitudes|)`` of two attribution vectors (NaN if both are)."""
    return _rho_from(_spearman(a, b), _spearman(np.abs(a), np.abs(b)))


def _reseeded(methods, configs: Mapping[str, Any] | None, offset: int = 1) -> dict[str, AttributionFn]:
    """The same attribution functions with every seeded config's seed moved by ``offset``
    (callables and unseeded, deterministic methods are simply run again)."""
    if isinstance(methods, Mapping):
        return dict(methods)
    configs = dict(configs or {})
    out: dict[str, AttributionFn] = {}
    for m in methods:
        cfg = configs.get(m) or METHODS[m].config_class()
        if dataclasses.is_dataclass(cfg) and any(f.name == "seed" for f in dataclasses.fields(cfg)):
            cfg = dataclasses.replace(cfg, seed=cfg.seed + offset)
        out[m] = METHODS[m](cfg).explain
    return out


def _judge(m: str, steps_m: pd.DataFrame, self_rho: np.ndarray, bound: float) -> dict[str, Any]:
    """Verdict of one method from its per-step intervals and its noise floor (module doc)."""
    sa, sa_low, _ = _t_interval(self_rho)
    floor = min(sa_low, 1.0) if not math.isnan(sa_low) else float("nan")
    changed = steps_m["ci_high"] < floor
    n = int(steps_m["n_cases"].max()) if len(steps_m) else 0
    unchanged = steps_m[~changed]
    first = str(unchanged["randomised"].iloc[0]) if len(unchanged) else ""
    final = float(steps_m["mean_rho"].iloc[-1]) if len(steps_m) else float("nan")
    if n < MIN_CASES or steps_m["mean_rho"].isna().all():
        verdict, reason = "undetermined", f"{n} case(s) with a defined rank correlation; at least {MIN_CASES} needed"
    elif not sa_low > bound:
        verdict, reason = "undetermined", (f"the method agrees with itself across seeds only at rho {sa:.2f} "
                                           f"(interval low {sa_low:.2f} <= {bound}): too noisy to judge")
    elif first:
        row = unchanged.iloc[0]
        verdict, reason = "not evidence", (f"randomising the {first} left its ranking in place (rho {row.mean_rho:.2f}, "
                                           f"interval up to {row.ci_high:.2f}, not below its own seed-to-seed "
                                           f"agreement {floor:.2f})")
    elif not final <= bound:
        verdict, reason = "not evidence", (f"with every layer random its ranking still correlates at rho {final:.2f} "
                                           f"> {bound} with the original")
    else:
        verdict, reason = "evidence", (f"every randomisation step changed its ranking, and with every layer random "
                                       f"rho is {final:.2f} <= {bound}")
    return {"stat": final, "self_agreement": sa, "self_agreement_low": sa_low, "n_cases": n,
            "first_unchanged": first, "evidence": verdict == "evidence", "verdict": verdict, "reason": reason,
            "_changed": list(changed)}


def randomisation_check(
    contexts: QueryContext | list[QueryContext],
    methods: Iterable[str] | Mapping[str, AttributionFn] = ("integrated_gradients",),
    *,
    seed: int = 0,
    bound: float = RANDOMISATION_BOUND,
    configs: Mapping[str, Any] | None = None,
    draws: int = 1,
) -> RandomisationResult:
    """Cascading model-parameter randomisation (Adebayo et al. 2018) on a deep copy of the model.

    Args:
        contexts: one or several query contexts (all of the same bundle).
        methods: method names of :data:`engine.explain.METHODS` (run with ``configs[name]`` or the
            method's default config), or ``{name: callable(ctx) -> Explanation or [T] values}``
            (any attribution function, e.g. a deliberately broken one).
        seed: seed of the re-drawn weights (draw ``d`` uses ``seed + d``).
        draws: independent re-draws of the whole cascade (each from a fresh copy of the trained
            model). A case's ``rho`` at a step is its mean over the draws, so one unusually kind or
            unkind random model does not decide the verdict: on a tiny trained model the last step's
            mean ``rho`` of SHAP over 24 cases was 0.42, 0.48, 0.61 and 0.41 for four single draws.
        bound: decision bound on each step's rank correlation (default :data:`RANDOMISATION_BOUND`;
            see the module doc for the rule, the noise floor and the intervals).
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
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws: expected an integer >= 1, got {draws!r}")
    fns = _attribution_fns(methods, configs)
    # the randomised models are explained with the re-seeded methods, as the noise floor is: a sampled
    # method (KernelSHAP) run with the original seed on a randomised model draws the same coalitions, so
    # its sampling noise is shared with the original run and its rho is inflated above the floor (a
    # change would hide behind it); deterministic methods and callables are unaffected
    again = _reseeded(methods, configs)
    steps = [("none", [])] + cascade_steps(model)
    original: dict[tuple[int, str], np.ndarray] = {}
    rows = []
    for d in range(draws):
        work = copy.deepcopy(model).eval()
        gen = torch.Generator().manual_seed(seed + d)
        for s, (step_name, names) in enumerate(steps):
            randomise_modules_(work, names, gen)
            if s == 0 and d > 0:
                continue  # the original attributions do not depend on the draw
            for ci, ctx in enumerate(ctxs):
                c = _with_model(ctx, work)
                for m, fn in (fns if s == 0 else again).items():
                    v = _values(fn(c), ctx.T)
                    if s == 0:
                        original[(ci, m)] = v
                    o = original[(ci, m)]
                    rows.append({"case": ctx.query_transaction_id, "case_index": ci, "method": m, "step": s,
                                 "randomised": step_name, "draw": d, "spearman": _spearman(o, v),
                                 "spearman_abs": _spearman(np.abs(o), np.abs(v))})
    table = pd.DataFrame(rows, columns=["case", "case_index", "method", "step", "randomised", "draw", "spearman",
                                        "spearman_abs"])
    table["rho"] = [_rho_from(a, b) for a, b in zip(table["spearman"], table["spearman_abs"])]
    # noise floor: a second run of each method with another seed (the seed the steps use), on the unchanged model
    self_rows = []
    for ci, ctx in enumerate(ctxs):
        for m, fn in again.items():
            v = _values(fn(ctx), ctx.T)
            self_rows.append({"case": ctx.query_transaction_id, "method": m, "rho": _rho(original[(ci, m)], v)})
    self_df = pd.DataFrame(self_rows, columns=["case", "method", "rho"])
    step_rows = []
    for m in fns:
        for s_i, (step_name, _) in enumerate(steps[1:], start=1):
            # one value per case: its mean over the draws
            r = table[(table.method == m) & (table.step == s_i)].groupby("case_index")["rho"].mean()
            r = r.to_numpy(np.float64)
            mean, lo, hi = _t_interval(r)
            step_rows.append({"method": m, "step": s_i, "randomised": step_name, "mean_rho": mean, "ci_low": lo,
                              "ci_high": hi, "n_cases": int((~np.isnan(r)).sum()), "changed": False})
    steps_df = pd.DataFrame(step_rows, columns=["method", "step", "randomised", "mean_rho", "ci_low", "ci_high",
                                                "n_cases", "changed"])
    last = table[table.step == len(steps) - 1]
    summ = []
    for m in fns:
        r = last[last.method == m]
        fs = float(r.spearman.mean()) if r.spearman.notna().any() else float("nan")
        fa = float(r.spearman_abs.mean()) if r.spearman_abs.notna().any() else float("nan")
        judged = _judge(m, steps_df[steps_df.method == m], self_df[self_df.method == m]["rho"].to_numpy(np.float64),
                        bound)
        steps_df.loc[steps_df.method == m, "changed"] = judged.pop("_changed")
        summ.append({"method": m, "final_spearman": fs, "final_spearman_abs": fa, "bound": bound, **judged})
    return RandomisationResult(table=table, summary=pd.DataFrame(summ), steps=[n for n, _ in steps],
                               bound=bound, seed=seed, elapsed_s=time.perf_counter() - t0,
                               steps_table=steps_df, self_agreement=self_df, draws=draws)


def _rho_from(spearman: float, spearman_abs: float) -> float:
    r = [abs(spearman), abs(spearman_abs)]
    return float("nan") if all(math.isnan(x) for x in r) else float(np.nanmax(r))


# ------------------------------------------------------------------------------ completeness
@dataclass
class CompletenessCheck:
    """Completeness of one explanation of one query.

    Attributes:
        method: ``"integrated_gradients"``.
        query_transaction_id: the case.
        initial_delta: the gap of the explanation as given (logit).
        delta: the gap after retries (logit; equals ``initial_delta`` without a retry).
        tolerance: the tolerance (logit).
        ok: ``|delta| <= tolerance``.
        retries: IG re-runs made.
        n_steps: IG quadrature points of the final explanation.
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
    """Check IG's convergence delta against ``tolerance``; re-run IG
    with 4x the quadrature points (``IGConfig(n_steps=4n, max_steps=8 * 4n, target_delta=
    tolerance / 10)``, n_steps capped at 4096) while ``|delta| > tolerance``, at most
    ``max_retries`` times.

    Returns:
        ``(checks, explanations)``: one :class:`CompletenessCheck` for the IG explanation if
        present (none for SHAP: see the module docstring), and a copy of ``explanations`` where
        IG is replaced by the best re-run.
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
                           path_breakpoints=tuple(ig.params.get("path_breakpoints", IGConfig().path_breakpoints)),
                           baseline=ig.params.get("baseline", "reference"), scope=ig.params.get("scope", "context"))
            e = METHODS["integrated_gradients"](cfg).explain(ctx)
            retries += 1
            if abs(e.convergence_delta) < abs(best.convergence_delta):
                best = e
        out["integrated_gradients"] = best
        d = float(best.convergence_delta)
        ok = abs(d) <= tolerance
        gap = f"{d:+.4f}" if d == 0 or abs(d) >= 5e-5 else f"{d:+.1e}"  # never "-0.0000" (engine.cases.fmt.format_gap)
        msg = (f"IG completeness gap {gap} logit (tolerance {tolerance})"
               + (f" after {retries} re-run(s) with more steps" if retries else "")
               + ("" if ok else ": the attributions do not add up to f(x) - f(baseline); treat with care"))
        checks.append(CompletenessCheck("integrated_gradients", ctx.query_transaction_id, d0, d, tolerance, ok,
                                        retries, int(best.params.get("n_steps_total", n)), msg))
    if warn:
        for c in checks:
            if not c.ok:
                warnings.warn(f"{c.query_transaction_id}: {c.message}", CompletenessWarning, stacklevel=2)
    return checks, out


def completeness_table(checks: list[CompletenessCheck]) -> pd.DataFrame:
    """Checks as a DataFrame (one row each, the dataclass fields as columns)."""
    return pd.DataFrame([dataclasses.asdict(c) for c in checks],
                        columns=[f.name for f in dataclasses.fields(CompletenessCheck)])


__all__ = ["COMPLETENESS_TOLERANCE", "MIN_CASES", "RANDOMISATION_BOUND", "CompletenessCheck", "CompletenessWarning",
           "RandomisationResult", "cascade_steps", "completeness_checks", "completeness_table",
           "randomisation_check", "randomise_modules_"]

