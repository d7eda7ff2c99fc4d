"""Bench of the query's per-field attributions against field ablation, and of the history effect.

Over the same flagged test-period cases as :func:`engine.trust.bench.run_explanation_bench`
(same ``seed`` and ``max_cases`` draw the same cases), for each case:

* field ablation ``a [F]`` of the query (:func:`engine.explain.field_attribution.field_ablation`);
* the query's per-field values ``phi [F]`` of four attributions: IG from the typical query
  (``scope="query"``, what the page shows when it passes), IG from the typical timeline (the
  query row of the default ``integrated_gradients`` explanation), IG from the zero embedding
  (the former baseline, for comparison) and exact field Shapley values;
* per method: **sign agreement** with ablation over the fields whose ablation moves the score by
  at least ``tol`` logit (pooled over all cases' counted fields, and the per-case mean), the
  **magnitude ratio** ``sum |phi| / sum |a|`` (median over cases), the share of cases that pass
  :func:`engine.explain.field_attribution.validate`, ``f(reference)`` (mean and standard deviation
  over cases: a degenerate baseline gives one constant) and the mean absolute completeness gap;
* the **history effect** (:mod:`engine.trust.history_effect`): share of flagged cases already
  flagged alone, mean alone / with-history score and difference.

All values in logits except scores (``sigmoid(logit)``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pandas as pd

from engine.explain.context import build_context
from engine.explain.field_attribution import DEFAULT_TOL, field_ablation, field_shapley, validate
from engine.explain.integrated_gradients import IGConfig
from engine.explain.integrated_gradients import explain as explain_ig
from engine.explain.reference import attach_reference
from engine.model.checkpoint import ModelBundle
from engine.trust.history_effect import history_effect

FIELD_METHODS = {
    "ig_typical_query": "IG from the typical query (history kept; shown when it passes)",
    "ig_typical_timeline": "IG from the typical timeline (query row of the default IG)",
    "ig_zero": "IG from the zero embedding (former baseline)",
    "field_shapley": "exact field Shapley values",
}


def flagged_cases(bundle: ModelBundle, frame: pd.DataFrame, enc, max_cases: int, seed: int) -> tuple[np.ndarray, dict]:
    """Rows of the flagged test-period cases (:func:`engine.trust.bench.flagged_period_rows`), at
    most ``max_cases`` drawn uniformly with ``seed`` and sorted, and counts: the cases of every
    explanation bench section."""
    from engine.trust.bench import flagged_period_rows  # same layer; bench imports this module

    rows, flagged, period = flagged_period_rows(bundle, frame, enc)
    rng = np.random.default_rng(seed)
    cases = np.sort(rng.choice(flagged, size=min(max_cases, len(flagged)), replace=False)) if len(flagged) else flagged
    return cases, {"period": period, "n_period_rows": int(len(rows)), "n_flagged": int(len(flagged))}


def run_field_bench(bundle: ModelBundle, frame: pd.DataFrame, *, max_cases: int = 50, seed: int = 0,
                    ig_steps: int = 50, tol: float = DEFAULT_TOL, log=None) -> pd.DataFrame:
    """IG / field Shapley versus field ablation and the history effect over flagged cases
    (module docstring).

    Returns:
        DataFrame, one row per method of :data:`FIELD_METHODS`: ``method``, ``n_cases``,
        ``sign_agreement`` (pooled), ``sign_agreement_case_mean``, ``opposite_sign_share``,
        ``magnitude_ratio_median``, ``magnitude_ratio_max``, ``pass_rate``, ``f_reference_mean``,
        ``f_reference_std``, ``abs_delta_mean``, ``seconds_per_case``. ``attrs["per_case"]``: one
        row per (case, method); ``attrs["history"]``: one row per case; ``attrs["info"]``: counts.
    Raises:
        ValueError: ``max_cases < 1``.
    """
    if max_cases < 1:
        raise ValueError(f"max_cases: expected >= 1, got {max_cases}")
    log = log or (lambda s: None)
    t_all = time.perf_counter()
    frame = frame.reset_index(drop=True)
    ref = attach_reference(bundle, frame)
    enc = bundle.encoder.transform(frame)
    cases, info = flagged_cases(bundle, frame, enc, max_cases, seed)
    per_case: list[dict[str, Any]] = []
    hist: list[dict[str, Any]] = []
    for n, r in enumerate(cases):
        ctx = build_context(bundle, frame, str(frame["transaction_id"].iloc[r]), enc=enc)
        t0 = time.perf_counter()
        abl, f_x, f_ref = field_ablation(ctx)
        total = f_x - f_ref
        t_abl = time.perf_counter() - t0
        runs: dict[str, tuple[np.ndarray, float | None, float | None, float]] = {}
        for m, cfg in (("ig_typical_query", IGConfig(n_steps=ig_steps, max_steps=8 * ig_steps, scope="query")),
                       ("ig_typical_timeline", IGConfig(n_steps=ig_steps, max_steps=8 * ig_steps)),
                       ("ig_zero", IGConfig(n_steps=ig_steps, max_steps=8 * ig_steps, baseline="zero"))):
            e = explain_ig(ctx, cfg)
            runs[m] = (e.field_values[-1], e.reference_logit, e.convergence_delta, e.elapsed_s)
        t1 = time.perf_counter()
        runs["field_shapley"] = (field_shapley(ctx), f_ref, 0.0, time.perf_counter() - t1)
        for m, (phi, fr, delta, secs) in runs.items():
            v = validate(phi, abl, total, tol=tol)
            counted = np.abs(abl) >= tol
            per_case.append({
                "case": ctx.query_transaction_id, "T": ctx.T, "method": m, "n_counted": int(counted.sum()),
                "n_agree": int((np.sign(phi[counted]) == np.sign(abl[counted])).sum()),
                "n_opposite": int((np.sign(phi[counted]) == -np.sign(abl[counted])).sum()),
                "sign_agreement": v.sign_agreement, "magnitude_ratio": v.magnitude_ratio, "ok": v.ok,
                "f_reference": fr, "abs_delta": None if delta is None else abs(float(delta)),
                "max_abs_value": float(np.abs(phi).max()), "score_logit": f_x, "seconds": secs + t_abl,
            })
        h = history_effect(ctx)
        hist.append({"case": ctx.query_transaction_id, "alone": h.alone, "with_history": h.with_history,
                     "difference": h.difference, "alone_flagged": h.alone_flagged})
        log(f"fields case {n + 1}/{len(cases)} {ctx.query_transaction_id}: T={ctx.T} "
            f"({time.perf_counter() - t0:.1f} s)")
    pc = pd.DataFrame(per_case)
    out = []
    for m in FIELD_METHODS:
        d = pc[pc.method == m] if len(pc) else pc
        if not len(d):
            continue
        cnt = int(d.n_counted.sum())
        out.append({
            "method": m, "n_cases": int(len(d)), "n_fields_counted": cnt,
            "sign_agreement": d.n_agree.sum() / cnt if cnt else float("nan"),
            "sign_agreement_case_mean": d.sign_agreement.mean(),
            "opposite_sign_share": d.n_opposite.sum() / cnt if cnt else float("nan"),
            "magnitude_ratio_median": d.magnitude_ratio.median(), "magnitude_ratio_max": d.magnitude_ratio.max(),
            "pass_rate": d.ok.mean(), "f_reference_mean": d.f_reference.mean(),
            "f_reference_std": d.f_reference.std(ddof=0), "abs_delta_mean": d.abs_delta.mean(),
            "max_abs_value_median": d.max_abs_value.median(), "seconds_per_case": d.seconds.mean(),
        })
    res = pd.DataFrame(out)
    hd = pd.DataFrame(hist)
    res.attrs["per_case"], res.attrs["history"] = pc, hd
    res.attrs["info"] = {**info, "n_cases": int(len(cases)), "threshold": bundle.threshold, "seed": seed,
                         "ig_steps": ig_steps, "tol_logit": tol, "reference": ref.origin,
                         "wall_s": time.perf_counter() - t_all}
    return res


def _f(x: Any, fmt: str = ".3f") -> str:
    try:
        return "–" if x is None or pd.isna(x) else format(x, fmt)
    except (TypeError, ValueError):
        return str(x)


def field_markdown(res: pd.DataFrame) -> str:
    """The field bench as markdown: the attribution table and the history-effect line."""
    info = res.attrs.get("info", {})
    lines = [f"Per-field attributions of the query versus field ablation (each field replaced by its typical "
             f"value, history kept); fields counted for signs: |ablation| >= {info.get('tol_logit', DEFAULT_TOL)} "
             f"logit; magnitude ratio = sum |value| / sum |ablation|.", "",
             "| method | cases | fields counted | sign agreement (pooled) | opposite sign | per-case mean | "
             "magnitude ratio median (max) | median max abs value (logit) | passes validation | f(reference) mean ± std "
             "(logit) | mean abs completeness gap | s / case |", "|" + "---|" * 12]
    for _, r in res.iterrows():
        lines.append(
            f"| {FIELD_METHODS.get(r.method, r.method)} | {r.n_cases} | {r.n_fields_counted} | "
            f"{_f(100 * r.sign_agreement, '.1f')}% | {_f(100 * r.opposite_sign_share, '.1f')}% | "
            f"{_f(100 * r.sign_agreement_case_mean, '.1f')}% | {_f(r.magnitude_ratio_median, '.2f')} "
            f"({_f(r.magnitude_ratio_max, '.1f')}) | {_f(r.max_abs_value_median, '.2f')} | "
            f"{_f(100 * r.pass_rate, '.0f')}% | {_f(r.f_reference_mean)} ± {_f(r.f_reference_std)} | "
            f"{_f(r.abs_delta_mean, '.1e')} | {_f(r.seconds_per_case, '.2f')} |")
    hd = res.attrs.get("history")
    if hd is not None and len(hd):
        lines += ["", f"History effect over the same {len(hd)} flagged cases: already flagged alone (no earlier "
                      f"transaction) in {int(hd.alone_flagged.sum())} of {len(hd)}; mean score alone "
                      f"{hd.alone.mean():.3f}, with history {hd.with_history.mean():.3f}, mean difference "
                      f"{hd.difference.mean():+.3f} (median {hd.difference.median():+.3f})."]
    return "\n".join(lines)


__all__ = ["FIELD_METHODS", "field_markdown", "flagged_cases", "run_field_bench"]
