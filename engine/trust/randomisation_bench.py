"""``fraudlens bench randomisation``: the cascading model-parameter randomisation check
(:func:`engine.trust.sanity.randomisation_check`, Adebayo et al. 2018, arXiv:1810.03292) of every
explanation method over flagged test-period cases of a trained model, beside three deliberately
broken "explainers" that must fail it:

* ``dummy_amount``: ``|amount|`` of each transaction, whatever the model;
* ``dummy_recency``: the later the transaction the larger, whatever the model;
* ``dummy_row_encoder``: the norm of each transaction's row embedding. It reads the model, but
  only its row encoder, so randomising the head or the blocks cannot change it: a check that
  judged only the last cascade step would pass it.

A method's verdict is ``evidence`` only if every cascade step (head, each block, row encoder)
changed its ranking beyond its own seed-to-seed noise and the fully random model destroyed it
(mean rho <= the bound); see :mod:`engine.trust.sanity` for the rule. The cases are the flagged
test-period transactions the explanation bench uses (:func:`engine.trust.bench.period_rows`),
drawn with ``seed``; SHAP runs with the time budget ``shap_budget_s`` per explanation (default 5 s,
its own default): its seed-to-seed agreement is its noise floor (on the demo model 0.89 at 5 s, 0.70
at 1 s, where the head step no longer stands out of its noise and the verdict is "not evidence").
"""

from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path
from typing import Iterable

import numpy as np
import pandas as pd
import torch

from engine.explain.context import QueryContext, build_context
from engine.model.checkpoint import ModelBundle

#: the real methods benched by default
METHODS = ("integrated_gradients", "shap", "occlusion", "attention", "attention_rollout")


def dummy_amount(ctx: QueryContext) -> np.ndarray:
    """``[T]`` float64: ``|amount|`` of each context transaction (file currency), no model."""
    return np.abs(ctx.rows["amount"].to_numpy(np.float64))


def dummy_recency(ctx: QueryContext) -> np.ndarray:
    """``[T]`` float64: the position ``0..T-1``, no model."""
    return np.arange(ctx.T, dtype=np.float64)


def dummy_row_encoder(ctx: QueryContext) -> np.ndarray:
    """``[T]`` float64: the L2 norm of each transaction's summed row embedding (the row encoder
    only; a seed ensemble's members' embeddings side by side)."""
    with torch.no_grad():
        x = ctx.bundle.model.embed(ctx.batch).sum(dim=2)  # [1, T, F, D] -> [1, T, D] (D: K*D for K members)
    return x[0].norm(dim=-1).double().numpy()


DUMMIES = {"dummy_amount": dummy_amount, "dummy_recency": dummy_recency, "dummy_row_encoder": dummy_row_encoder}


def flagged_contexts(bundle: ModelBundle, frame: pd.DataFrame, max_cases: int, seed: int = 0,
                     min_context: int = 4) -> tuple[list[QueryContext], str]:
    """Up to ``max_cases`` query contexts of flagged test-period transactions with at least
    ``min_context`` transactions (the query included), drawn uniformly with ``seed``; and the
    period's description."""
    from engine.explain.reference import attach_reference
    from engine.trust.bench import flagged_period_rows

    frame = frame.reset_index(drop=True)
    attach_reference(bundle, frame)
    enc = bundle.encoder.transform(frame)
    _, flagged, period = flagged_period_rows(bundle, frame, enc)
    order = np.random.default_rng(seed).permutation(flagged)
    ctxs = []
    for r in order:
        ctx = build_context(bundle, frame, str(frame["transaction_id"].iloc[r]), enc=enc)
        if ctx.T >= min_context:
            ctxs.append(ctx)
        if len(ctxs) >= max_cases:
            break
    return ctxs, f"{period}; {len(flagged):,} flagged at {bundle.threshold:.3f}"


def run(bundle: ModelBundle, frame: pd.DataFrame, *, max_cases: int = 12, methods: Iterable[str] = METHODS,
        seed: int = 0, shap_budget_s: float = 5.0, draws: int = 1, log=print):
    """The randomisation check of ``methods`` and :data:`DUMMIES` over flagged test-period cases
    (``draws``: independent re-draws of the cascade, each case's rho averaged over them; see
    :func:`engine.trust.sanity.randomisation_check`).

    Returns:
        ``(RandomisationResult, info dict)``.
    Raises:
        ValueError: fewer than 3 usable cases, or an unknown method.
    """
    from engine.explain import ShapConfig
    from engine.trust.sanity import randomisation_check

    t0 = time.perf_counter()
    ctxs, period = flagged_contexts(bundle, frame, max_cases, seed)
    if len(ctxs) < 3:
        raise ValueError(f"{len(ctxs)} flagged test-period cases with history: the check needs at least 3")
    log(f"{period}; {len(ctxs)} cases, contexts of {min(c.T for c in ctxs)}-{max(c.T for c in ctxs)} transactions")
    names = list(methods)
    res_real = randomisation_check(ctxs, names, seed=seed, configs={"shap": ShapConfig(time_budget_s=shap_budget_s)},
                                   draws=draws)
    res_dummy = randomisation_check(ctxs, DUMMIES, seed=seed, draws=draws)
    info = {"period": period, "n_cases": len(ctxs), "context": f"{min(c.T for c in ctxs)}-{max(c.T for c in ctxs)}",
            "seed": seed, "draws": draws, "shap_budget_s": shap_budget_s, "wall_s": time.perf_counter() - t0,
            "steps": res_real.steps, "bound": res_real.bound}
    return (res_real, res_dummy), info


def markdown(results, info: dict, title: str, context: dict) -> str:
    """The bench's section: per method the verdict, the noise floor and each step's mean rho [95 % CI]."""
    real, dummy = results
    lines = [f"## {title}", ""] + [f"- {k}: {v}" for k, v in context.items()]
    lines += [f"- cases: {info['n_cases']} flagged ({info['period']}), contexts of {info['context']} transactions",
              f"- seed {info['seed']}, {info.get('draws', 1)} draw(s) of the random weights, SHAP time budget {info['shap_budget_s']:g} s per run, bound {info['bound']}, "
              f"wall time {info['wall_s']:.0f} s", "",
              "rho per case and step = max(|Spearman|, |Spearman of magnitudes|) against the original attributions "
              "(the query excluded); a step *changed* the method when its 95 % t-interval lies below the lower end "
              "of the method's own seed-to-seed agreement; **evidence** = every step changed it and the fully "
              "random model leaves mean rho <= the bound.", ""]
    steps = info["steps"][1:]
    lines += ["| method | verdict | first step that left it in place | noise floor (self-agreement) | "
              + " | ".join(f"{s}: mean rho [95 % CI]" for s in steps) + " |",
              "|---|---|---|---|" + "---|" * len(steps)]
    for res in (real, dummy):
        st = res.steps_table
        for _, row in res.summary.iterrows():
            m = row["method"]
            sa = res.self_agreement[res.self_agreement.method == m]["rho"].to_numpy(np.float64)
            cells = []
            for s in steps:
                r = st[(st.method == m) & (st.randomised == s)].iloc[0]
                mark = "" if r["changed"] else " (kept)"
                cells.append(f"{r['mean_rho']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]{mark}")
            lines.append(f"| {m} | {row['verdict']} | {row['first_unchanged'] or '-'} | "
                         f"{np.nanmean(sa):.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(data: str | Path, spec: str | Path | None = None, model: str | Path | None = None,
         out: str | Path = Path("bench/results/randomisation.md"), *, max_cases: int = 12, seed: int = 0,
         shap_budget_s: float = 5.0, methods: Iterable[str] = METHODS, draws: int = 1, log=print) -> str:
    """Read ``data``, load ``model``, :func:`run`, write the section to ``out`` (replacing the
    section of the same data file and model), print it and return it.

    Raises:
        FileNotFoundError / ValueError: reading the file, the spec or the checkpoint; too few cases.
    """
    from engine.data.io import read_transactions
    from engine.data.spec import DatasetSpec, load_spec
    from engine.model.checkpoint import load_checkpoint
    from engine.trust.bench import machine_info

    torch.set_num_threads(1)
    bundle = load_checkpoint(model)
    sp = bundle.spec if spec is None else spec if isinstance(spec, DatasetSpec) else load_spec(spec)
    loaded = read_transactions(data, sp)
    name = Path(data).name
    ctx = {"data": f"{data} (spec {sp.name}, {len(loaded.frame):,} rows)",
           "model": f"{bundle.path} (sha256 {bundle.short_sha}, d_model={bundle.config.d_model}, "
                    f"layers={bundle.config.n_layers})",
           "run": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "machine": ", ".join(f"{k} {v}" for k, v in machine_info().items())}
    out = Path(out)
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("# Cascading model-parameter randomisation (`fraudlens bench randomisation`)\n")
    body = write_section(bundle, loaded.frame, out, key=f"{name}|{bundle.short_sha}", name=name,
                         max_cases=max_cases, seed=seed, shap_budget_s=shap_budget_s, methods=methods, context=ctx,
                         draws=draws, log=log)
    log(f"written to {out}")
    return body


def write_section(bundle: ModelBundle, frame: pd.DataFrame, out: str | Path, *, key: str, name: str,
                  context: dict, max_cases: int = 12, seed: int = 0, shap_budget_s: float = 5.0,
                  methods: Iterable[str] = METHODS, draws: int = 1, log=print) -> str:
    """:func:`run`, then its :func:`markdown` as the section ``key + "|randomisation"`` of ``out``
    (replacing the one there), printed and returned. Used by this command and by
    ``fraudlens bench explanations``."""
    from engine.trust.bench import _write_section

    results, info = run(bundle, frame, max_cases=max_cases, methods=methods, seed=seed,
                        shap_budget_s=shap_budget_s, draws=draws, log=log)
    body = markdown(results, info, f"{name} — model {bundle.short_sha}: cascading randomisation", context)
    _write_section(out, f"{key}|randomisation", body)
    log(body)
    return body

__all__ = ["DUMMIES", "METHODS", "dummy_amount", "dummy_recency", "dummy_row_encoder", "flagged_contexts", "main",
           "markdown", "run", "write_section"]
