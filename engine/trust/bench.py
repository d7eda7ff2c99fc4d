"""Global evaluation of the explainers over the flagged cases of a test period.

:func:`run_explanation_bench` takes a model bundle and a canonical frame and, over the
**flagged cases** (probability >= the model's review threshold) of the **test period**
(timestamps >= the checkpoint's ``split.val_end``; the whole frame if the checkpoint has no
split), at most ``max_cases`` of them drawn uniformly with ``seed``:

* explains each case with every method (:func:`engine.explain.explain_all`);
* measures faithfulness (:mod:`engine.trust.faithfulness`): deletion AOPC over top 1..``k_max``
  of every method, of random orders (mean of ``n_random`` seeds) and of the attention order,
  and sufficiency (top-k only); all in logits;
* checks completeness (:func:`engine.trust.sanity.completeness_checks`: IG convergence delta;
  IG is re-run with more steps when its gap exceeds
  :data:`~engine.trust.sanity.COMPLETENESS_TOLERANCE`, and the re-run is what is evaluated;
  SHAP imposes additivity, so it has no completeness gap);
* measures the **SHAP estimator's error** (:func:`shap_accuracy_rows`,
  :mod:`engine.trust.shap_accuracy`): per case RMSE, rank correlation, top-6 overlap and
  standard-error coverage of the default SHAP values against the exact values
  (``P <= exact_max_players``) or a 20,000-coalition KernelSHAP reference, with mean standard
  error and wall time;
* scores **ground truth** where the data carries it (evaluation-only passthrough columns, never
  model input):

  - demo data (``engine.data.simulate``, spec ``demo``): ``Fraud Episode`` — the earlier context
    transactions of the query's own episode;
  - Fraud Detection Handbook (spec ``handbook``): ``TX_FRAUD_SCENARIO`` — scenario 3
    (compromised customer credentials): the earlier fraudulent (scenario 3) transactions of the
    same customer; scenario 2 (compromised terminal): the earlier fraudulent (scenario 2)
    transactions of the customer at the query's terminal; scenario 1 (amount > 220) and
    legitimate queries have no history ground truth.

  **precision@k** of a method = the share of its top-``k'`` earlier transactions (ranked as in
  the deletion curve) that belong to the ground-truth set ``G``, with ``k' = min(k, |G|)`` so
  that 1.0 is reachable; cases without ``G`` are left out. The random baseline is ``|G| / P``
  (expected precision of a random order).
* times every method per case (``Explanation.elapsed_s``, seconds on this machine).

:func:`main` reads a file through a spec, loads a checkpoint, runs the bench, prints a markdown
table and writes it (with machine and package info) to ``bench/results/explanations.md``, one
section per (data file, model), replaced on a re-run.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from engine.model.checkpoint import ModelBundle, package_versions
from engine.explain.context import QueryContext, build_context
from engine.explain import DEFAULT_METHODS, explain_all
from engine.explain.reference import attach_reference
from engine.model.scoring import score_encoded
from engine.trust.baselines import BASELINES, baseline_orders
from engine.trust.faithfulness import evaluate_faithfulness, ranking_order
from engine.trust.sanity import COMPLETENESS_TOLERANCE, completeness_checks
from engine.trust.shap_accuracy import REFERENCE_SAMPLES, accuracy_markdown, shap_accuracy

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "bench" / "results" / "explanations.md"
EPISODE_COLUMN = "Fraud Episode"
SCENARIO_COLUMN = "TX_FRAUD_SCENARIO"


def ground_truth(ctx: QueryContext) -> tuple[np.ndarray, str]:
    """Positions ``[n]`` of the earlier context transactions of the query's fraud episode, and
    the rule used (``""`` when the case has no ground truth). See the module docstring.
    Reads passthrough columns of ``ctx.rows`` only (evaluation; never model input)."""
    rows = ctx.rows
    q = ctx.T - 1
    if EPISODE_COLUMN in rows:
        ep = rows[EPISODE_COLUMN].astype("string").fillna("").str.strip().to_numpy()
        if ep[q] == "":
            return np.zeros(0, np.int64), ""
        return np.flatnonzero(ep[:q] == ep[q]).astype(np.int64), "demo Fraud Episode"
    if SCENARIO_COLUMN in rows:
        sc = pd.to_numeric(rows[SCENARIO_COLUMN], errors="coerce").fillna(0).astype(int).to_numpy()
        if sc[q] == 3:
            return np.flatnonzero(sc[:q] == 3).astype(np.int64), "handbook scenario 3 (same customer)"
        if sc[q] == 2 and "terminal" in rows:
            term = rows["terminal"].astype(str).to_numpy()
            return (np.flatnonzero((sc[:q] == 2) & (term[:q] == term[q])).astype(np.int64),
                    "handbook scenario 2 (same terminal)")
    return np.zeros(0, np.int64), ""


def precision_at_k(order: np.ndarray, truth: np.ndarray, k: int) -> float:
    """Share of the first ``min(k, |truth|)`` entries of ``order`` that are in ``truth``; NaN
    when ``truth`` is empty."""
    kk = min(int(k), len(truth))
    if kk == 0:
        return float("nan")
    return float(np.isin(np.asarray(order)[:kk], truth).mean())


def period_rows(bundle: ModelBundle, frame: pd.DataFrame) -> tuple[np.ndarray, str]:
    """Row indices of the test period (``timestamp >= split.val_end`` of the checkpoint) and a
    description; every row when the checkpoint has no split."""
    val_end = (bundle.meta.get("split") or {}).get("val_end")
    if not val_end:
        return np.arange(len(frame)), "all rows (the checkpoint records no split)"
    t = pd.Timestamp(val_end)
    return np.flatnonzero(frame["timestamp"].to_numpy() >= t.to_datetime64()), f"test period (from {t})"


def flagged_period_rows(bundle: ModelBundle, frame: pd.DataFrame, enc) -> tuple[np.ndarray, np.ndarray, str]:
    """``(rows, flagged, period)``: the test period's row indices (:func:`period_rows`), those the
    model flags (``bundle.probability`` of the logit >= ``bundle.threshold``, as the case queue
    flags them: the review threshold is chosen on the calibrated probability when the checkpoint
    has a calibration map; ``enc`` the frame's encoded batch),
    and the period's description. The cases of every explanation bench."""
    rows, period = period_rows(bundle, frame)
    logits = score_encoded(bundle.model, enc, frame["entity_id"].to_numpy(), rows=rows)
    prob = bundle.probability(logits[rows].astype(np.float64))
    return rows, rows[prob >= bundle.threshold], period


def run_explanation_bench(
    bundle: ModelBundle,
    frame: pd.DataFrame,
    *,
    max_cases: int = 50,
    methods: Iterable[str] = DEFAULT_METHODS,
    seed: int = 0,
    k: int = 5,
    k_max: int = 10,
    n_random: int = 5,
    ig_steps: int = 50,
    shap_samples: int | None = None,
    shap_reference_samples: int | None = REFERENCE_SAMPLES,
    log=None,
) -> pd.DataFrame:
    """Evaluate the explainers over flagged test-period cases (see the module docstring).

    Args:
        bundle: model bundle (threshold ``bundle.threshold``, split from ``bundle.meta``).
        frame: canonical frame (sorted, index 0..N-1) the model scores.
        max_cases: flagged cases explained at most (drawn uniformly, ``seed``).
        methods: explanation methods (``"attention"`` is always computed for the attention order).
        seed: case sampling, SHAP coalitions and random orders.
        k: precision@k. k_max: AOPC / sufficiency over top 1..k_max. n_random: random orders.
        ig_steps / shap_samples: as in :func:`engine.explain.explain_all`.
        shap_reference_samples: coalitions of the high-sample SHAP reference
            (:func:`shap_accuracy_rows`); ``None`` or 0 = no SHAP error section.
        log: optional ``callable(str)`` for progress lines.
    Returns:
        DataFrame, one row per method: ``method``, ``n_cases``, ``aopc``, ``aopc_random``,
        ``aopc_attention``, ``aopc_minus_random``, ``beats_random`` (share of cases with AOPC >
        random AOPC), ``sufficiency``, ``sufficiency_random``, ``n_truth_cases``,
        ``precision_at_k``, ``precision_random``, ``completeness_gap`` (mean |gap| after re-runs,
        IG/SHAP), ``gap_above_tolerance`` (cases still above it), ``retries`` (IG re-runs),
        ``seconds_per_case`` (mean wall time of the method's explanation + its curves).
        ``attrs["per_case"]``: one row per (case, method) with the per-case values;
        ``attrs["info"]``: counts and settings; ``attrs["shap_accuracy"]``: one row per case
        (:func:`engine.trust.shap_accuracy.shap_accuracy`), empty without SHAP.
    Raises:
        ValueError: unknown method, ``max_cases < 1``.
    """
    if max_cases < 1:
        raise ValueError(f"max_cases: expected >= 1, got {max_cases}")
    log = log or (lambda s: None)
    methods = list(methods)
    run_methods = methods if "attention" in methods else ["attention", *methods]
    t_all = time.perf_counter()
    frame = frame.reset_index(drop=True)
    attach_reference(bundle, frame)  # IG's typical transaction: the checkpoint's or this file's
    enc = bundle.encoder.transform(frame)
    from engine.trust.field_bench import flagged_cases  # same layer; it imports this module

    cases, drawn = flagged_cases(bundle, frame, enc, max_cases, seed)
    log(f"{drawn['period']}: {drawn['n_period_rows']:,} rows, {drawn['n_flagged']:,} flagged at "
        f"{bundle.threshold:.3f}; explaining {len(cases)}")
    per_case: list[dict[str, Any]] = []
    shap_rows: list[dict[str, Any]] = []
    for n, r in enumerate(cases):
        tid = str(frame["transaction_id"].iloc[r])
        ctx = build_context(bundle, frame, tid, enc=enc)
        if ctx.T < 2:
            continue
        t0 = time.perf_counter()
        expl = explain_all(ctx, run_methods, seed=seed, ig_steps=ig_steps, shap_samples=shap_samples)
        checks, expl = completeness_checks(ctx, expl, warn=False)  # IG re-run with more steps if needed
        retries = {c.method: c.retries for c in checks}
        base = baseline_orders(ctx)  # model-free orders every method must beat
        faith = evaluate_faithfulness(ctx, {**expl, **base}, k_max=k_max, curve_max=k_max, n_random=n_random,
                                      seed=seed)
        expl = {**expl, **base}
        truth, rule = ground_truth(ctx)
        P = ctx.T - 1
        label = frame["label"].iloc[r] if "label" in frame else pd.NA
        for m in [*methods, *BASELINES]:
            e, fr = expl[m], faith[m]
            gap = e.convergence_delta
            per_case.append({
                "case": tid, "entity_id": ctx.entity_id, "T": ctx.T, "logit": fr.full_logit,
                "label": None if pd.isna(label) else int(label), "method": m,
                "aopc": fr.aopc, "aopc_random": fr.aopc_random, "aopc_attention": fr.aopc_attention,
                "sufficiency": fr.sufficiency, "sufficiency_random": fr.sufficiency_random,
                "truth_rule": rule, "n_truth": int(len(truth)),
                "precision_at_k": precision_at_k(ranking_order(e), truth, k),
                "precision_random": len(truth) / P if len(truth) else float("nan"),
                "completeness_gap": None if gap is None else abs(float(gap)), "retries": retries.get(m, 0),
                "seconds": e.elapsed_s + fr.elapsed_s,
            })
        shap_rows += shap_accuracy_rows(ctx, expl, shap_reference_samples, seed)
        log(f"case {n + 1}/{len(cases)} {tid}: T={ctx.T} truth={len(truth)} ({time.perf_counter() - t0:.1f} s)")
    pc = pd.DataFrame(per_case)
    out = []
    rec = pc[pc.method == "recency"].set_index("case") if len(pc) else pc
    for m in [*methods, *BASELINES]:
        d = pc[pc.method == m] if len(pc) else pc
        if not len(d):
            continue
        t = d[d.n_truth > 0]
        gaps = d["completeness_gap"].dropna()
        r = rec.loc[d["case"]]
        rt = r[r.n_truth > 0]
        beats_rec_aopc = float((d.aopc.to_numpy() > r.aopc.to_numpy()).mean())
        prec_rec = rt.precision_at_k.mean() if len(rt) else float("nan")
        out.append({
            "aopc_recency": r.aopc.mean(), "beats_recency": beats_rec_aopc, "precision_recency": prec_rec,
            "below_recency": bool(m not in BASELINES and (d.aopc.mean() <= r.aopc.mean()
                                  or (len(t) and t.precision_at_k.mean() <= prec_rec))),
            "method": m, "n_cases": int(len(d)),
            "aopc": d.aopc.mean(), "aopc_random": d.aopc_random.mean(), "aopc_attention": d.aopc_attention.mean(),
            "aopc_minus_random": (d.aopc - d.aopc_random).mean(),
            "beats_random": float((d.aopc > d.aopc_random).mean()),
            "sufficiency": d.sufficiency.mean(), "sufficiency_random": d.sufficiency_random.mean(),
            "n_truth_cases": int(len(t)),
            "precision_at_k": t.precision_at_k.mean() if len(t) else float("nan"),
            "precision_random": t.precision_random.mean() if len(t) else float("nan"),
            "completeness_gap": gaps.mean() if len(gaps) else float("nan"),
            "gap_above_tolerance": int((gaps > COMPLETENESS_TOLERANCE).sum()), "retries": int(d.retries.sum()),
            "seconds_per_case": d.seconds.mean(),
        })
    res = pd.DataFrame(out)
    res.attrs["per_case"] = pc
    res.attrs["shap_accuracy"] = pd.DataFrame(shap_rows)
    res.attrs["info"] = {
        **drawn,
        "n_cases": int(len(cases)), "threshold": bundle.threshold, "k": k, "k_max": k_max, "n_random": n_random,
        "seed": seed, "ig_steps": ig_steps, "shap_samples": shap_samples,
        "shap_reference_samples": shap_reference_samples, "wall_s": time.perf_counter() - t_all,
        "truth_rules": sorted(set(pc["truth_rule"]) - {""}) if len(pc) else [],
    }
    return res


def shap_accuracy_rows(ctx: QueryContext, expl: dict[str, Any], reference_samples: int | None,
                       seed: int) -> list[dict[str, Any]]:
    """``[row]`` with the SHAP explanation's error against its exact / high-sample reference
    (:func:`engine.trust.shap_accuracy.shap_accuracy`), or ``[]`` without SHAP, without earlier
    transactions or with ``reference_samples`` ``None`` / 0."""
    if not reference_samples or "shap" not in expl or ctx.T < 2:
        return []
    return [shap_accuracy(ctx, expl["shap"], reference_samples=reference_samples, seed=seed)]


def shap_accuracy_section(res: pd.DataFrame) -> str:
    """Markdown of ``res.attrs["shap_accuracy"]`` under its own heading (``""`` when empty)."""
    acc = res.attrs.get("shap_accuracy")
    if acc is None or not len(acc):
        return ""
    n_ref = res.attrs.get("info", {}).get("shap_reference_samples")
    return "\n".join([
        "### SHAP error against the exact / high-sample reference", "",
        f"Default SHAP estimator per case against the exact Shapley values (P <= the exact limit) or a "
        f"{n_ref:,}-coalition KernelSHAP reference (10 independent rounds; its own mean standard error in "
        "'ref mean SE'). Logits. 'within 2 SE' = share of transactions with |estimate - reference| <= "
        "2 sqrt(SE^2 + SE_ref^2) (about 95 % if the standard errors are honest). 'single-run' = one KernelSHAP "
        "run of 2P+512 coalitions (the previous default) against the same reference. Top-6 overlap by |value|.",
        "", accuracy_markdown(acc), ""])


def _f(x: Any, fmt: str = ".3f") -> str:
    try:
        return "–" if x is None or pd.isna(x) else format(x, fmt)
    except (TypeError, ValueError):
        return str(x)


def markdown_table(res: pd.DataFrame) -> str:
    """The bench result as a GitHub markdown table (logits; lower sufficiency = better)."""
    k = res.attrs.get("info", {}).get("k", 5)
    km = res.attrs.get("info", {}).get("k_max", 10)
    head = (f"| method | cases | deletion AOPC@{km} | random AOPC | attention AOPC | most-recent-first AOPC | "
            f"beats random | beats most recent first | sufficiency@{km} (lower = better) | random sufficiency | "
            f"cases with truth | precision@{k} | random precision | most-recent-first precision | "
            f"mean abs completeness gap (IG re-runs) | s / case |")
    lines = [head, "|" + "---|" * 16]
    for _, r in res.iterrows():
        name = (f"baseline: {BASELINES[r.method]}" if r.method in BASELINES
                else r.method + (" (does not beat most recent first)" if r.get("below_recency") else ""))
        lines.append(
            f"| {name} | {r.n_cases} | {_f(r.aopc)} | {_f(r.aopc_random)} | {_f(r.aopc_attention)} | "
            f"{_f(r.aopc_recency)} | {_f(100 * r.beats_random, '.0f')}% | {_f(100 * r.beats_recency, '.0f')}% | "
            f"{_f(r.sufficiency)} | {_f(r.sufficiency_random)} | "
            f"{r.n_truth_cases} | {_f(r.precision_at_k, '.2f')} | {_f(r.precision_random, '.2f')} | "
            f"{_f(r.precision_recency, '.2f')} | "
            f"{_f(r.completeness_gap, '.2e')}{f' ({r.retries})' if r.retries else ''} | {_f(r.seconds_per_case, '.2f')} |")
    return "\n".join(lines)


def machine_info() -> dict[str, Any]:
    """Machine, threads and package versions (for the results file)."""
    import torch

    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    info.update(package_versions())
    return info


def _section(key: str, body: str) -> str:
    return f"<!-- bench:{key} -->\n{body.rstrip()}\n<!-- /bench:{key} -->\n"


def write_markdown(res: pd.DataFrame, out: str | Path, *, key: str, title: str, context: dict[str, Any]) -> Path:
    """Write (or replace) the section ``key`` of the markdown file ``out``."""
    info = res.attrs.get("info", {})
    lines = [f"## {title}", ""]
    lines += [f"- {k}: {v}" for k, v in context.items()]
    lines += [f"- {k}: {v}" for k, v in info.items() if k != "truth_rules"]
    lines.append(f"- ground truth: {', '.join(info.get('truth_rules') or []) or 'none in this data'}")
    lines += ["- machine: " + ", ".join(f"{k} {v}" for k, v in machine_info().items()), "", markdown_table(res), ""]
    lines += [shap_accuracy_section(res)]
    sec = _section(key, "\n".join(lines))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = ("# Explanation bench\n\nWritten by `engine.trust.bench` (`fraudlens bench explanations`). All values "
              "in logits. Deletion AOPC = mean over k = 1..K of f(x) - f(x without the top-k earlier "
              "transactions) (Samek et al. 2017; higher = more faithful); sufficiency = mean over k of "
              "f(x) - f(only the top-k) (DeYoung et al. 2020; lower = better); random = mean of seeded random "
              "orders; precision@k = share of the top-k earlier transactions in the query's own fraud episode "
              "(evaluation-only ground truth). See engine/trust/bench.py.\n\n")
    if not out.exists():
        out.write_text(header)
    _write_section(out, key, sec)
    return out


def field_attribution_section(bundle: ModelBundle, frame: pd.DataFrame, out: str | Path, *, key: str, title: str,
                              context: dict[str, Any], max_cases: int = 50, seed: int = 0, log=print) -> pd.DataFrame:
    """IG / field Shapley versus field ablation and the history effect
    (:func:`engine.trust.field_bench.run_field_bench`, same cases as the main bench), printed and
    written as the section ``key + "|fields"`` of ``out``. Returns the result DataFrame."""
    from engine.trust.field_bench import field_markdown, run_field_bench

    res = run_field_bench(bundle, frame, max_cases=max_cases, seed=seed, log=log)
    info = res.attrs["info"]
    lines = [f"## {title} — per-field attributions and history effect", ""]
    lines += [f"- {k}: {v}" for k, v in {**context, **info}.items()]
    lines += ["", field_markdown(res), ""]
    _write_section(out, f"{key}|fields", "\n".join(lines))
    log(field_markdown(res))
    return res


def main(data: str | Path, spec: str | Path | None = None, model: str | Path | None = None,
         out: str | Path = DEFAULT_OUT, max_cases: int = 50, *, methods: Iterable[str] = DEFAULT_METHODS,
         seed: int = 0, note: str = "", log=print, fields: bool = True,
         shap_reference_samples: int | None = REFERENCE_SAMPLES, planted_only: bool = False,
         randomisation_cases: int = 0, reasons_only: bool = False) -> pd.DataFrame:
    """Read ``data`` with ``spec`` (default: the model's spec), load the checkpoint ``model``,
    run :func:`run_explanation_bench`, print the markdown table and write it to ``out`` (``note``:
    an extra line for the section, e.g. how the model was trained). With ``fields`` the per-field
    section (:func:`field_attribution_section`) runs on the same cases and is written too.
    ``shap_reference_samples``: as in :func:`run_explanation_bench`. ``planted_only``: only the
    planted-cause section (:func:`planted_section`; demo-simulator data), returned.
    ``randomisation_cases`` > 0: also the cascading randomisation section over that many flagged
    cases (:mod:`engine.trust.randomisation_bench`, the dummies included), written to ``out`` too.
    The reason-code accuracy section (:func:`reason_audit_section`) runs on the same cases after
    the fields section; ``reasons_only``: only it (its check rows returned).

    Returns the result DataFrame. Raises FileNotFoundError / ValueError from reading the file,
    the spec or the checkpoint.
    """
    from engine.model.checkpoint import load_checkpoint
    from engine.data.io import read_transactions
    from engine.data.spec import DatasetSpec, load_spec

    if planted_only and reasons_only:
        raise ValueError("--planted-only and --reasons-only each run one section: choose one")
    t0 = time.perf_counter()
    bundle = load_checkpoint(model)
    sp = bundle.spec if spec is None else spec if isinstance(spec, DatasetSpec) else load_spec(spec)
    loaded = read_transactions(data, sp)
    log(f"read {data}: {len(loaded.frame):,} rows ({time.perf_counter() - t0:.0f} s)")
    name = Path(data).name
    key = f"{name}|{bundle.short_sha or 'unsaved'}"
    if planted_only:
        if "Fraud Cause" not in loaded.frame:
            raise ValueError(f"{data}: no 'Fraud Cause' column: planted causes exist only in fraudlens-simulated data")
        res = planted_section(bundle, loaded.frame, out, key=key, name=name, log=log,
                              data=f"{data} ({len(loaded.frame):,} rows)")
        log(f"written to {out}")
        return res
    if reasons_only:
        res = reason_audit_section(bundle, loaded.frame, out, key=key, title=f"{name} — model {bundle.short_sha}",
                                   context={"data": f"{data} (spec {sp.name}, {len(loaded.frame):,} rows)"},
                                   max_cases=max_cases, seed=seed, log=log)
        log(f"written to {out}")
        return res
    res = run_explanation_bench(bundle, loaded.frame, max_cases=max_cases, methods=methods, seed=seed,
                                shap_reference_samples=shap_reference_samples, log=log)
    ctx = {"data": f"{data} (spec {sp.name}, {len(loaded.frame):,} rows)",
           "model": f"{bundle.path} (sha256 {bundle.short_sha}, T={bundle.config.context_length}, "
                    f"d_model={bundle.config.d_model}, layers={bundle.config.n_layers})",
           "run": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "wall time": f"{time.perf_counter() - t0:.0f} s"}
    if note:
        ctx["note"] = note
    path = write_markdown(res, out, key=key, title=f"{name} — model {bundle.short_sha}", context=ctx)
    log(markdown_table(res))
    if len(res.attrs.get("shap_accuracy", [])):
        log(shap_accuracy_section(res))
    if fields:
        field_attribution_section(bundle, loaded.frame, out, key=key, title=f"{name} — model {bundle.short_sha}",
                                  context={k: v for k, v in ctx.items() if k != "wall time"},
                                  max_cases=max_cases, seed=seed, log=log)
    reason_audit_section(bundle, loaded.frame, out, key=key, title=f"{name} — model {bundle.short_sha}",
                         context={k: v for k, v in ctx.items() if k != "wall time"}, max_cases=max_cases, seed=seed,
                         log=log)
    if "Fraud Cause" in loaded.frame:  # demo-simulator data: planted causes that are not the latest rows
        planted_section(bundle, loaded.frame, out, key=key, name=name, log=log,
                        data=f"{data} ({len(loaded.frame):,} rows)")
    if randomisation_cases > 0:
        from engine.trust.randomisation_bench import write_section

        write_section(bundle, loaded.frame, out, key=key, name=name, max_cases=randomisation_cases, seed=seed,
                      context={k: v for k, v in ctx.items() if k != "wall time"}, log=log)
    log(f"written to {path}")
    return res


def planted_section(bundle: ModelBundle, frame: pd.DataFrame, out: str | Path, *, key: str, name: str,
                    log=print, kinds: Iterable[str] | None = None, data: str = "") -> pd.DataFrame:
    """Run :func:`engine.trust.planted.planted_cause_bench` (reason codes with the entity's visit
    facts, :func:`engine.trust.common_point.context_visit_facts`, for the common-point reason) and
    its controls (:func:`engine.trust.planted.control_bench`: queries that must not name a planted
    pattern), print them and write them as the section ``key + "|planted"`` of ``out`` (``data``: a
    line naming the data file). Returns its result."""
    from engine.trust.common_point import context_visit_facts
    from engine.trust.planted import control_bench, control_markdown, planted_cause_bench, planted_markdown

    t0 = time.perf_counter()
    facts = lambda ctx: context_visit_facts(frame, ctx)  # noqa: E731
    planted = planted_cause_bench(bundle, frame, log=log, kinds=kinds, link_facts=facts)
    controls = control_bench(bundle, frame, link_facts=facts, log=log)
    body = planted_markdown(planted) + "\n\n" + control_markdown(controls)
    run = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    _write_section(out, f"{key}|planted", f"## {name} — model {bundle.short_sha}: planted causes\n\n"
                   "Queries: the first fraud after each planted cause (engine/trust/planted.py); truth: the "
                   "`Fraud Cause` rows in the context; precision@|G| with k = |G|. A hit = one of the top-2 reason "
                   "codes is of the pattern's kind (`test_then_purchase` / `small_charges`; `common_point`) and "
                   f"cites a cause row. Run {run}, {time.perf_counter() - t0:.0f} s."
                   + (f" Data: {data}." if data else "") + "\n\n" + body)
    log(body)
    return planted


def reason_audit_section(bundle: ModelBundle, frame: pd.DataFrame, out: str | Path, *, key: str, title: str,
                         context: dict[str, Any], max_cases: int = 50, seed: int = 0, log=print) -> pd.DataFrame:
    """Reason-code accuracy (:func:`engine.trust.reason_audit.audit_reasons`) over the main bench's
    cases (same draw: ``max_cases`` flagged test-period cases with ``seed``): the reasons the case
    page shows (:func:`engine.trust.reasons.reason_codes` over SHAP, occlusion and IG, with the
    common point from the file's labels, :func:`engine.trust.common_point.context_visit_facts`, as
    ``engine.cases.links.case_reason_codes`` computes them without dispositions), every number
    recomputed from the rows. Printed and
    written as the section ``key + "|reasons"`` of ``out``; returns the check rows (``query``
    column added)."""
    from engine.trust.common_point import context_visit_facts
    from engine.trust.field_bench import flagged_cases
    from engine.trust.reason_audit import audit_markdown, audit_reasons
    from engine.trust.reasons import reason_codes

    t0 = time.perf_counter()
    frame = frame.reset_index(drop=True)
    attach_reference(bundle, frame)
    enc = bundle.encoder.transform(frame)
    cases, info = flagged_cases(bundle, frame, enc, max_cases, seed)
    parts, n = [], 0
    for r in cases:
        tid = str(frame["transaction_id"].iloc[r])
        ctx = build_context(bundle, frame, tid, enc=enc)
        if ctx.T < 2:
            continue
        expls = explain_all(ctx, ["shap", "occlusion", "integrated_gradients"], seed=seed)
        reasons = reason_codes(ctx, expls, links=context_visit_facts(frame, ctx))
        a = audit_reasons(ctx, reasons, expls, frame=frame)
        a.insert(0, "query", tid)
        parts.append(a)
        n += 1
        log(f"reasons {tid}: {' > '.join(x.kind for x in reasons)}; failed checks {int((a['ok'] == False).sum())}")  # noqa: E712
    res = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["query", "kind", "check", "ok"])
    body = audit_markdown(res, n)
    lines = [f"## {title} — reason-code accuracy", ""]
    lines += [f"- {k}: {v}" for k, v in context.items()]
    lines += [f"- {info['period']}: {info['n_flagged']} flagged; {n} cases (seed {seed}); wall time "
              f"{time.perf_counter() - t0:.0f} s",
              "", body, ""]
    _write_section(out, f"{key}|reasons", "\n".join(lines))
    log(body)
    return res


def _write_section(out: str | Path, key: str, body: str) -> None:
    """Write (or replace) the section ``key`` of ``out`` with ``body`` (wrapped in its markers
    unless it already is)."""
    out = Path(out)
    text = out.read_text() if out.exists() else ""
    sec = body if body.startswith(f"<!-- bench:{key} -->") else _section(key, body)
    start, end = f"<!-- bench:{key} -->", f"<!-- /bench:{key} -->"
    if start in text and end in text:
        a, b = text.index(start), text.index(end) + len(end)
        text = text[:a] + sec.rstrip("\n") + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + sec
    out.write_text(text)


__all__ = ["DEFAULT_OUT", "field_attribution_section", "reason_audit_section", "flagged_period_rows", "planted_section", "ground_truth", "main", "markdown_table", "precision_at_k",
           "run_explanation_bench", "period_rows", "shap_accuracy_rows", "shap_accuracy_section", "write_markdown"]
