"""``fraudlens bench ...``: benchmark commands that print tables and write ``bench/results/*.md``.

Speed and quality are measured here, never by timed unit tests. Each command imports its bench
module when it runs (torch, LightGBM and the data load only then).
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

ROOT = Path(__file__).resolve().parents[2]
DEMO_DATA = ROOT / "demo_data" / "transactions.csv"
console = Console(width=None if sys.stdout.isatty() else 150)
#: bench logs carry "[transformer]"-style prefixes and markdown: printed as is, not as rich markup
plain_log = partial(console.print, markup=False)


def _fail(msg: str) -> None:
    """One error line (the message may quote file text: never rich markup), exit 2."""
    console.print(f"[red]error:[/red] {escape(' '.join(str(msg).split()))}", soft_wrap=True)
    raise typer.Exit(2)


bench_app = typer.Typer(no_args_is_help=True, help="benchmarks that print tables and write bench/results/*.md")
HANDBOOK = ROOT.parent / "shared" / "data" / "handbook" / "transactions.parquet"
SMALL_GBT_GRID = {"num_leaves": [31], "learning_rate": [0.05, 0.1], "min_child_samples": [100],
                  "max_bin": [1023], "n_estimators": [100, 200]}


@bench_app.command("gbt-same-inputs")
def bench_gbt_same_inputs(
    data: Path = typer.Option(HANDBOOK, exists=True, help="the Handbook transactions file"),
    full_gbt_grid: bool = typer.Option(False, help="the full validation grid (48 settings) instead of 4"),
    out: Path = typer.Option(ROOT / "bench" / "results" / "quality_same_inputs.md"),
):
    """LightGBM given every input the transformer gets, on the Handbook protocol (validation-fold
    tuning, 4 test folds); prints and writes a table."""
    from datetime import datetime, timezone

    from engine.bench import gbt_same_inputs
    from engine.bench.gbt import METRICS

    res = gbt_same_inputs.run(str(data), grid=None if full_gbt_grid else SMALL_GBT_GRID, log=plain_log)
    s = res.attrs["summary"]
    lines = ["# LightGBM with the transformer's inputs, Handbook protocol", "",
             f"Run {datetime.now(timezone.utc).isoformat(timespec='seconds')} on `{data}`; "
             f"{res.attrs['seconds'] / 60:.1f} min. Chosen on the validation folds: {res.attrs['best_params']}.",
             f"Inputs ({len(res.attrs['features'])}): " + ", ".join(f"`{f}`" for f in res.attrs["features"]), "",
             "| fold | " + " | ".join(METRICS) + " |", "|---|" + "---|" * len(METRICS)]
    for _, r in res.iterrows():
        lines.append(f"| {r['fold']} ({r['start']}) | " + " | ".join(f"{r[m]:.3f}" for m in METRICS) + " |")
    lines.append("| mean ± std (ddof=0) | " + " | ".join(f"{s.loc[m, 'mean']:.3f} ± {s.loc[m, 'std']:.3f}"
                                                      for m in METRICS) + " |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    plain_log("\n".join(lines))
    plain_log(f"written to {out}")


@bench_app.command("quality")
def bench_quality(
    data: Path = typer.Option(HANDBOOK, exists=True, help="the Handbook transactions file"),
    epochs: Optional[int] = typer.Option(None, min=1, help="epochs of the learning-rate schedule (default: the bench configuration's)"),
    seeds: int = typer.Option(5, min=1, help="models per fold (seeds 0..n-1, as engine.bench.quality.BENCH_SEEDS); the transformer row averages their probabilities"),
    full_gbt_grid: bool = typer.Option(False, help="the GBT's full validation grid (48 settings) instead of 4"),
    recipe: str = typer.Option("recorded", help="recorded: the recipe of the recorded runs (one model per seed); "
                               "default: the levers of `fraudlens train`'s default recipe, with --members"),
    members: int = typer.Option(3, min=1, max=16, help="with --recipe default: members of each seed's ensemble"),
    gbt: str = typer.Option("run", help="run: train both LightGBM rows (about 50 min); recorded: take the equally "
                            "informed GBT from bench/results/quality_same_inputs.md; none"),
    out: Path = typer.Option(ROOT / "bench" / "results" / "quality.md"),
    validation_log: Optional[Path] = typer.Option(None, exists=True, dir_okay=False, help="reuse the epoch choice "
                                                  "printed by an earlier run with the same recipe and seeds (its line "
                                                  "'validation AP by epoch [...] -> N epochs') instead of training the "
                                                  "validation folds again"),
    pretrain_minutes: float = typer.Option(0.0, min=0.0, help="self-supervised next-transaction pretraining "
                                           "before each fold's fraud training (TrainConfig.pretrain_minutes; 0 = none)"),
):
    """Transformer vs LightGBM vs the Handbook's published numbers on the Handbook protocol."""
    from dataclasses import replace

    from engine.bench import quality

    if recipe not in ("recorded", "default"):
        _fail(f"--recipe: expected recorded or default, got {recipe!r}")
    if gbt not in ("run", "recorded", "none"):
        _fail(f"--gbt: expected run, recorded or none, got {gbt!r}")
    grid = None if full_gbt_grid else SMALL_GBT_GRID
    cfg = quality.BENCH_CONFIG if recipe == "recorded" else quality.default_recipe_config(members)
    cfg = cfg if epochs is None else replace(cfg, epochs=epochs)
    cfg = replace(cfg, pretrain_minutes=pretrain_minutes)
    quality.run(str(data), out=out, cfg=cfg, seeds=tuple(range(seeds)), gbt_grid=grid, log=plain_log,
                with_gbt=gbt == "run",
                same_recorded=ROOT / "bench" / "results" / "quality_same_inputs.md" if gbt == "recorded" else None,
                validation_log=validation_log)


@bench_app.command("ceiling")
def bench_ceiling(
    data: Path = typer.Option(HANDBOOK, exists=True, help="the Handbook transactions file"),
    draws: int = typer.Option(10, min=1, help="random tie-breaks averaged per fold"),
    out: Path = typer.Option(ROOT / "bench" / "results" / "ceiling.md"),
):
    """Oracle reference for the Handbook protocol (no model, ~1-2 min): AUC ROC / AP / CP@100 when every fraud but the silent scenario-2 ones is ranked perfectly."""
    from engine.bench import ceiling

    ceiling.run(str(data), out=out, draws=draws, log=plain_log)


@bench_app.command("datasets")
def bench_datasets(
    datasets: str = typer.Option("demo,tabformer,banksim,handbook",
                                 help="comma-separated: demo, tabformer, banksim, handbook"),
    seeds: int = typer.Option(3, min=1, help="seeds 0..n-1 per model and dataset"),
    out: Path = typer.Option(ROOT / "bench" / "results" / "datasets.md"),
    members: int = typer.Option(None, min=1, max=16, help="transformer: a seed ensemble of this many members "
                                "(default: `fraudlens train`'s, TrainConfig.members)"),
    pretrain_minutes: float = typer.Option(0.0, min=0.0, help="transformer: self-supervised next-transaction "
                                           "pretraining before fraud training (TrainConfig.pretrain_minutes; 0 = none)"),
):
    """Transformer vs the LightGBM baseline on every labelled dataset, same split and test rows:
    AUC ROC, AP, recall at 1 % alerts, detection and value detection at a 5:1 false-positive
    ratio, ECE; mean ± std over seeds; paired bootstrap over entities (Handbook: ~15 min a seed)."""
    from engine.bench import datasets as ds

    try:
        from engine.model.train import TrainConfig

        ds.main([n.strip() for n in datasets.split(",") if n.strip()], list(range(seeds)), out, log=plain_log,
                train_config=TrainConfig(pretrain_minutes=pretrain_minutes,
                                         **({} if members is None else {"members": members})))
    except ValueError as e:
        _fail(str(e))


@bench_app.command("speed")
def bench_speed(
    data: Path = typer.Option(HANDBOOK, exists=True),
    spec: str = typer.Option("handbook"),
    model: Optional[Path] = typer.Option(None, help="checkpoint (default: default configuration, untrained)"),
    train_run: Optional[Path] = typer.Option(Path("runs/handbook"), help="checkpoint of a Handbook training run, for its wall time"),
    out: Path = typer.Option(ROOT / "bench" / "results" / "speed.md"),
):
    """Scoring throughput vs re-scoring, incremental latency, case-open time, memory, training time."""
    from engine.bench import speed

    speed.run(str(data), spec, model, train_run, out)


@bench_app.command("scale")
def bench_scale(
    model: Path = typer.Option(..., exists=True, help="checkpoint for the handbook spec"),
    data: Path = typer.Option(HANDBOOK, exists=True, help="the Handbook file (1.75M rows)"),
    rows: list[int] = typer.Option([20_000_000, 50_000_000], help="sizes of the generated files (repeat the option)"),
    tmp: Path = typer.Option(Path("/tmp/fraudlens-scale"), help="folder for generated files, scores and partitions"),
    memory_limit: str = typer.Option("1GB", help="DuckDB's memory limit for --partitions"),
    in_memory: bool = typer.Option(True, help="also measure the Handbook file (in memory and partitioned)"),
    keep_files: bool = typer.Option(False, help="keep the generated files"),
    report_only: bool = typer.Option(False, help="only write scale.md from scale.json and the logs in --tmp "
                                     "(runs stopped before the end are listed with the last line they logged)"),
    also_tmp: list[Path] = typer.Option([], help="with --report-only: more folders with logs of unfinished runs"),
):
    """Rows/s and peak RSS of `fraudlens score` at 1.75M rows and on generated 20M and 50M-row files."""
    from engine.bench import scale

    if report_only:
        plain_log(scale.report(model, [tmp, *also_tmp]))
        return
    text = scale.run(model, data, rows, tmp, memory_limit=memory_limit, keep_files=keep_files,
                     in_memory=in_memory, log=plain_log)
    plain_log(text)


# the data / spec / model options of the explanation benches (explanations, randomisation): one definition
DATA_OPTION = typer.Option(DEMO_DATA, exists=True, help="transactions file (default: bundled demo data)")
SPEC_OPTION = typer.Option(None, help="spec name or TOML file (default: the model's spec)")
MODEL_OPTION = typer.Option(None, help="checkpoint directory (default: the demo model)")


@bench_app.command("explanations")
def bench_explanations(
    data: Path = DATA_OPTION,
    spec: Optional[str] = SPEC_OPTION,
    model: Optional[Path] = MODEL_OPTION,
    max_cases: int = typer.Option(50, min=1, help="flagged test-period cases explained at most"),
    methods: str = typer.Option("attention,attention_rollout,integrated_gradients,shap,occlusion",
                                help="comma-separated explanation methods"),
    seed: int = typer.Option(0, help="case sampling, SHAP coalitions and random orders"),
    shap_reference_samples: int = typer.Option(
        20_000, min=0, help="coalitions of the high-sample SHAP reference the SHAP error is measured against "
                            "(cases with more players than exact enumeration handles); 0 = no SHAP error section"),
    out: Path = typer.Option(ROOT / "bench" / "results" / "explanations.md"),
    fields: bool = typer.Option(True, "--fields/--no-fields",
                                help="also bench the query's per-field attributions against field ablation "
                                     "and the history effect (same cases)"),
    planted_only: bool = typer.Option(False, "--planted-only",
                                      help="only the planted-cause section (demo-simulator data: top-2 reason codes "
                                           "naming the planted pattern, precision@|G|); minutes, not the full bench"),
    randomisation_cases: int = typer.Option(12, min=0, help="flagged cases of the cascading randomisation section "
                                            "(every method and 3 broken explainers; ~4 min for 12); 0 = none"),
    reasons_only: bool = typer.Option(False, "--reasons-only",
                                      help="only the reason-code accuracy section (every number of the case "
                                           "page's reasons recomputed from the rows, same cases); minutes"),
):
    """Faithfulness (AOPC vs random / attention), sufficiency, precision@k against fraud-episode
    ground truth, completeness and time per method over flagged test-period cases, the SHAP
    estimator's error against exact or high-sample reference values; with --fields (default) IG /
    field Shapley versus field ablation and the query alone versus with history; reason-code
    accuracy (every number recomputed from the rows, citations, ranking); planted causes on
    demo-simulator data; the cascading randomisation verdicts of every method and three broken
    explainers (--randomisation-cases)."""
    from engine.trust.bench import main as explanations_main

    names = tuple(m.strip() for m in methods.split(",") if m.strip())
    try:
        explanations_main(data, spec, model, out, max_cases, methods=names, seed=seed, log=console.print,
                          fields=fields, shap_reference_samples=shap_reference_samples or None,
                          planted_only=planted_only, randomisation_cases=randomisation_cases,
                          reasons_only=reasons_only)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))


@bench_app.command("randomisation")
def bench_randomisation(
    data: Path = DATA_OPTION,
    spec: Optional[str] = SPEC_OPTION,
    model: Optional[Path] = MODEL_OPTION,
    max_cases: int = typer.Option(12, min=3, help="flagged test-period cases (at least 3)"),
    seed: int = typer.Option(0, help="case sampling and the re-drawn weights"),
    shap_budget_s: float = typer.Option(5.0, min=0.1, help="SHAP time budget per explanation (seconds; 5 = its default)"),
    draws: int = typer.Option(1, min=1, help="independent re-draws of the random weights; each case's rank "
                              "correlation is averaged over them (the time grows with it)"),
    out: Path = typer.Option(ROOT / "bench" / "results" / "randomisation.md"),
):
    """Cascading model-parameter randomisation (Adebayo et al. 2018) of every explanation method and of
    three deliberately broken explainers (amount, recency, row encoder only) over flagged test-period
    cases: per method the verdict and each step's mean rank correlation with its 95 % interval."""
    from engine.trust.randomisation_bench import main as randomisation_main

    try:
        randomisation_main(data, spec, model, out, max_cases=max_cases, seed=seed, shap_budget_s=shap_budget_s,
                           draws=draws, log=plain_log)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))


@bench_app.command("serve")
def bench_serve(
    model: Optional[Path] = typer.Option(None, help="TabFormer checkpoint (default: the demo model)"),
    tabformer: Path = typer.Option(ROOT.parent / "shared" / "data" / "tabformer" / "User0_credit_card_transactions.csv",
                                   exists=True, help="TabFormer file (the spec's raw columns)"),
    handbook_model: Optional[Path] = typer.Option(None, help="Handbook checkpoint; without it the Handbook runs are skipped"),
    handbook: Path = typer.Option(HANDBOOK, help="the Handbook transactions file"),
    handbook_rows: int = typer.Option(30_000, min=100, help="first N Handbook transactions (time order) replayed"),
    clients: str = typer.Option("1,8,32", help="comma-separated concurrent clients"),
    rate: str = typer.Option("250,500,1000", help="paced runs: comma-separated rates, transactions per second in all"),
    seconds: float = typer.Option(5.0, min=1.0, max=60.0, help="time limit per run"),
    sync: str = typer.Option("full,normal", help="comma-separated history commit modes (fraudlens serve --sync)"),
    processes: str = typer.Option("two", help="comma-separated: one, two (fraudlens serve --processes)"),
    out: Path = typer.Option(ROOT / "bench" / "results" / "serve.md"),
):
    """Load test of `fraudlens serve` on loopback: throughput, p50/p99/p99.9 and errors at 1/8/32 clients, paced
    and unpaced, and a kill -9 mid-run (acknowledged transactions lost). Bounded in count and time."""
    from engine.bench import serve_load

    cl = tuple(int(c) for c in clients.split(",") if c.strip())
    try:
        rates = tuple(float(r) for r in rate.split(",") if r.strip())
    except ValueError:
        _fail(f"--rate: expected comma-separated numbers, got {rate!r}")
    if not rates or min(rates) < 1.0:
        _fail(f"--rate: expected rates of at least 1 transaction per second, got {rate!r}")
    try:
        serve_load.run(model, handbook_model, tabformer, handbook if handbook_model else None, out, clients=cl,
                       rates=rates, seconds=seconds, handbook_rows=handbook_rows,
                       syncs=tuple(x.strip() for x in sync.split(",") if x.strip()),
                       processes=tuple(x.strip() for x in processes.split(",") if x.strip()), log=plain_log)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        _fail(str(e))
    plain_log(f"written to {out}")


@bench_app.command("links")
def bench_links(
    data: Path = typer.Option(HANDBOOK, exists=True, help="the Handbook transactions file"),
    cf_cases: int = typer.Option(20, min=0, help="flagged demo transactions for the counterfactual table (0: none)"),
    out: Path = typer.Option(ROOT / "bench" / "results" / "links.md"),
):
    """Common point of compromise on the Handbook (precision@k of the ranked terminals against the
    compromised ones, per window) and counterfactuals with the demo model."""
    from engine.bench import links

    links.run(data, out, cf_cases=cf_cases, log=plain_log)


@bench_app.command("ray")
def bench_ray(
    data: Path = typer.Option(HANDBOOK, exists=True, help="transactions file (default: the Handbook file)"),
    spec: str = typer.Option("handbook", help="spec name or TOML file"),
    model: Optional[Path] = typer.Option(None, help="checkpoint (default: default configuration, untrained)"),
    rows: int = typer.Option(200_000, min=1, help="score the first N records of the file"),
    train: bool = typer.Option(True, help="also compare Ray Train (2 workers) with one process on those records"),
    out: Path = typer.Option(ROOT / "bench" / "results" / "ray.md"),
):
    """Ray batch scoring at 1 and 2 workers vs one process (throughput, score agreement) and Ray
    Train vs one process (metrics); needs fraudlens[ray]."""
    from engine.bench import ray_scaling

    try:
        text = ray_scaling.run(str(data), spec, model, rows, out, train=train, log=plain_log)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        _fail(str(e))
    plain_log(text)
