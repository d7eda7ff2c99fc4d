"""The ``fraudlens`` command line (typer). Every command prints the row accounting it did."""

from __future__ import annotations

import json
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Optional

import typer
import typer.rich_utils as _typer_rich_utils
from rich.markup import escape
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help="fraudlens: explainable sequence models for fraud investigation")
from engine.cli_common import (  # noqa: F401 (DEMO_MODEL_HINT: re-exported)
    _print_baseline,
    _ranked,
    _print_calibration,
    DEMO_MODEL_HINT,
    _fail,
    _load_model,
    _note,
    _print_unseen,
    _read,
    _reject_report,
    _require_accepted,
    _safe,
    _trial_read,
    _table_out,
    _unseen_notes,
    _writable,
    _write,
    console,
    plain_log,
    wide_help_console,
)

# typer's rich help ignores click's max_content_width; its console is made here at every --help:
# never the 80-column fallback that cuts option names when stdout is not a terminal
_typer_rich_utils._get_rich_console = wide_help_console(_typer_rich_utils._get_rich_console)
ROOT = Path(__file__).resolve().parent.parent
DEMO_DATA = ROOT / "demo_data" / "transactions.csv"


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("fraudlens")
        except PackageNotFoundError:  # run from a source tree that was not installed
            v = "unknown (not installed)"
        console.print(f"fraudlens {v}", markup=False)
        raise typer.Exit()


@app.callback()
def _main(version_: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                        help="print the installed version and exit")) -> None:
    """fraudlens: explainable sequence models for fraud investigation."""


@app.command()
def inspect(
    file: Path = typer.Argument(..., exists=True, help="CSV or Parquet file to look at"),
    out: Optional[Path] = typer.Option(None, help="where to write the guessed spec (default: the file's name "
                                     "with .spec.toml, e.g. tx.csv -> tx.spec.toml)"),
    name: Optional[str] = typer.Option(None, help="name of the spec"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing spec file"),
    allow_personal: bool = typer.Option(False, "--allow-personal",
                                        help="use columns that look like the cardholder's personal data (gender, "
                                             "age, names, street, city, zip, ...) as model inputs"),
):
    """Guess a dataset spec (column roles) for an unknown file and write it for you to edit."""
    from engine.data.inspect import guess_spec, write_spec

    out = out or file.with_suffix(".spec.toml")
    _writable(out, "--out", "my_spec.toml")
    notes: list[str] = []
    try:
        spec = guess_spec(file, name=name, allow_personal=allow_personal, notes_out=notes)
        _write(lambda: write_spec(spec, out, overwrite=force), out, "--out",
               exists=f"{out} exists; edit it, choose another --out, or pass --force to overwrite it")
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    t = Table("column", "role")
    for col, role in spec.roles().items():
        t.add_row(_safe(col), role.value)
    console.print(t)
    for n in notes:
        _note(n)
    _trial_read(file, spec)
    console.print(f"spec written to {escape(str(out))}: check the roles, then use --spec {escape(str(out))}")


@app.command()
def simulate(
    customers: int = typer.Option(400, min=1, help="number of customers (each has 1-3 cards)"),
    seed: int = typer.Option(7, help="random seed (same seed -> same file)"),
    out: Path = typer.Option(DEMO_DATA, help="output CSV (TabFormer format + episode columns); with --rows a .parquet"),
    rows: Optional[int] = typer.Option(None, min=1, help="instead: exactly N Handbook-like rows (--spec handbook) "
                                       "written to a Parquet --out in chunks, in bounded memory"),
    shared_compromise: int = typer.Option(0, min=0, help="other cards per compromised store that swipe there "
                                          "within 3 days and get counterfeit fraud 7-30 days later (a common point "
                                          "of compromise; 0 = off, the demo data)"),
):
    """Write synthetic TabFormer-format transactions with injected, tagged fraud episodes
    (or, with --rows, Handbook-format transactions with the Handbook's three fraud scenarios)."""
    if rows is not None:
        from engine.data.simulate.handbook import generate_handbook_like

        if out.suffix.lower() not in (".parquet", ".pq"):
            _fail(f"--rows writes Parquet: give an --out ending in .parquet (got {out})")
        _writable(out, "--out", "transactions.parquet")
        r = _write(lambda: generate_handbook_like(rows, out, seed=seed), out, "--out")
        console.print(f"{r['rows']:,} transactions of {r['customers']:,} customers at {r['terminals']:,} terminals "
                      f"({r['frauds']:,} frauds) written to {escape(str(out))}")
        return
    from engine.data.simulate import main

    console.print(main(customers, seed, str(out), shared_compromise=shared_compromise))


@app.command()
def train(
    data: Path = typer.Option(..., exists=True, help="training file (CSV or Parquet)"),
    spec: str = typer.Option(..., help="built-in spec name or TOML path"),
    out: Path = typer.Option(Path("runs/model"), help="checkpoint directory"),
    epochs: int = typer.Option(30, min=1, help="maximum epochs (--max-minutes and early stopping usually end sooner)"),
    patience: int = typer.Option(4, min=1, help="epochs without validation-AP gain before stopping"),
    windows_per_epoch: int = typer.Option(6000, min=1, help="training windows sampled per epoch"),
    context_length: int = typer.Option(128, min=4),
    min_history: int = typer.Option(32, min=0),
    d_model: int = typer.Option(64, min=8),
    n_layers: int = typer.Option(2, min=1),
    n_heads: int = typer.Option(4, min=1),
    batch_size: int = typer.Option(64, min=1),
    lr: float = typer.Option(2e-3),
    train_end: Optional[str] = typer.Option(None, help="first day of validation (ISO date)"),
    val_end: Optional[str] = typer.Option(None, help="first day of test (ISO date)"),
    max_minutes: float = typer.Option(11.0, help="time budget of the transformer's epochs, in minutes (best epoch "
                                       "kept; reading the file, the baseline, calibration and test scoring come on top)"),
    max_rows: Optional[int] = typer.Option(None, help="read only the first N rows (for quick tries)"),
    seed: int = typer.Option(0),
    name: Optional[str] = typer.Option(None, help="model name (default: out directory name)"),
    progress: bool = typer.Option(True, help="show progress bars"),
    baseline: bool = typer.Option(True, help="also train the LightGBM baseline on the same split and compare"),
    activity: bool = typer.Option(True, help="recent-activity and first-seen fields inside the model"),
    activity_ple: bool = typer.Option(True, help="also embed piecewise-linear codes of the recent-activity "
                                      "inputs (sharp thresholds such as 'second-previous transaction under 10 "
                                      "minutes ago'); on by default: demo validation AP +0.016 (5 of 5 seeds >= 0), "
                                      "BankSim -0.002 (6 seeds), bench/results/recipe_probe.md"),
    amount_by_value: bool = typer.Option(True, help="give the amount, per embedded categorical field, its z-score "
                                         "against the training amounts of that value ('large for this merchant')"),
    row_ff: int = typer.Option(128, min=0, max=8192, help="hidden width of the feed-forward layer on each "
                               "transaction's row vector before attention (0 = none); bench/results/recipe_probe.md"),
    ema_epochs: float = typer.Option(1.0, min=0.0, max=1000.0, help="half-life in epochs of the moving average of "
                                     "the weights that validation and the checkpoint use (0 = the last step's weights)"),
    members: Optional[int] = typer.Option(
        None, min=1, max=16, help="seed ensemble: train this many transformers from different seeds and score their "
        "mean logit, one checkpoint (they share --max-minutes; whole-file scoring and explanations cost about this many "
        "times one model's); default 3, or 1 with --workers; bench/results/datasets.md"),
    target_precision: Optional[float] = typer.Option(
        None, min=0.0, max=1.0, help="review threshold: lowest with validation precision >= P, raised to the highest with the same recall (default 0.5)"),
    alerts_per_day: Optional[float] = typer.Option(
        None, min=0.0, help="review threshold: lowest with validation alerts per day <= X (instead of a precision)"),
    pretrain_minutes: float = typer.Option(0.0, min=0.0, help="self-supervised next-transaction pretraining on the "
                                           "training period (and any history before it) first, for at most this "
                                           "many of the --max-minutes "
                                           "(engine/model/pretrain.py; 0 = none)"),
    calibration: str = typer.Option("auto", help="calibration map fitted on validation: auto, isotonic, platt or none"),
    workers: int = typer.Option(1, min=1, help="data-parallel workers; >= 2: Ray Train (DDP, gloo, CPU; fraudlens[ray])"),
    address: Optional[str] = typer.Option(None, help="--workers >= 2: Ray address (auto, host:6379); default: a local Ray"),
):
    """Train the sequence transformer with a time split; print and save test metrics.

    By default the LightGBM baseline over causal per-entity features (engine.model.baseline) is
    trained on the same split and scored on the same test rows, with a paired bootstrap over
    entities of the difference."""
    from engine.model.baseline import BaselineConfig
    from engine.model.checkpoint import file_sha256, save_checkpoint
    from engine.distributed.ray_train import ray_fitter
    from engine.model.train import TrainConfig, train as train_fn

    if members is None:
        members = 1 if workers > 1 else 3
    if workers > 1 and members > 1:
        _fail(f"--workers trains one transformer; a {members}-member ensemble (--members) trains on one machine only "
              "(leave out --workers, or use --members 1)")
    try:
        fitter = ray_fitter(workers, address) if workers > 1 else None
    except RuntimeError as e:  # Ray is not installed
        _fail(str(e))
    t0 = time.perf_counter()
    sp, res = _read(data, spec, max_rows)
    if sp.label is None:  # before the split checks, which would only count no frauds
        _fail(f"training needs a label column: spec {sp.name!r} has no [label] (add its column and positive values)")
    out_existed = out.exists()
    _reject_report(res, out / "rejected.csv")  # before any refusal: every rejected row's reason is kept
    _require_accepted(res, data, sp, written=out / "rejected.csv")
    cfg = TrainConfig(
        epochs=epochs, patience=patience, windows_per_epoch=windows_per_epoch, context_length=context_length, min_history=min_history,
        d_model=d_model, n_layers=n_layers, n_heads=n_heads, batch_size=batch_size, lr=lr, train_end=train_end,
        val_end=val_end, max_minutes=max_minutes, seed=seed, activity=activity, activity_ple=activity_ple,
        amount_by_value=amount_by_value, row_ff=row_ff, ema_epochs=ema_epochs, members=members,
        target_precision=target_precision,
        alerts_per_day=alerts_per_day, calibration=calibration, pretrain_minutes=pretrain_minutes,
    )
    try:
        bundle, report = train_fn(res.frame, sp, cfg, log=plain_log, progress=progress,
                                  baseline=BaselineConfig(seed=seed) if baseline else None, fitter=fitter)
    except (ValueError, RuntimeError if fitter else ValueError) as e:  # Ray: unreachable, or a worker failed
        _fail(str(e) + _no_model_written(out, out_existed, len(res.rejected)))
    bundle.meta.update(
        name=name or out.name,
        training_data={"path": str(data), "sha256": file_sha256(data), "rows_read": res.rows_read,
                       "rows_used": len(res.frame), "rows_rejected": len(res.rejected), "max_rows": max_rows},
    )
    wall = time.perf_counter() - t0
    bundle.meta["command_wall_s"] = wall
    try:
        sha = save_checkpoint(bundle, out)
    except ValueError as e:  # non-finite weights or thresholds: never written
        _fail(str(e))
    t = Table("period", "transactions", "frauds", "AUC ROC", "average precision", "threshold", "precision", "recall")
    for period in ("validation", "test"):
        m = report[period]
        t.add_row(period, f"{m['n']:,}", f"{m['n_fraud']:,}", _ranked(m, "auc_roc"),
                  _ranked(m, "average_precision"), f"{m['threshold']:.4f}",
                  f"{m['precision']:.4f}", f"{m['recall']:.4f}")
    console.print(t)
    _print_calibration(report["calibration"], report["operating_point"])
    if "baseline" in report:
        _print_baseline(report["test"], report["baseline"])
    (out / "metrics.json").write_text(json.dumps({"test": report["test"], "validation": report["validation"],
                                                  "thresholds": report["thresholds"], "wall_s": wall,
                                                  "operating_point": report["operating_point"],
                                                  "calibration": report["calibration"],
                                                  **({"baseline": report["baseline"]} if "baseline" in report else {})},
                                                 indent=1))
    console.print(f"checkpoint {out} sha256 {sha[:12]}…  wall time {wall / 60:.1f} min")


def _no_model_written(out: Path, out_existed: bool, n_rejected: int) -> str:
    """After a refused training: say where the rejected rows are, or remove the header-only
    rejected.csv (and ``out`` when this command created it) so no model-less folder is left."""
    if n_rejected:
        rows = "rejected row is" if n_rejected == 1 else "rejected rows are"
        return f". No model written; the {n_rejected:,} {rows} in {out / 'rejected.csv'}"
    (out / "rejected.csv").unlink(missing_ok=True)
    if not out_existed and out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    return ". No model written"


@app.command()
def score(
    data: Path = typer.Option(..., help="file to score (--engine ray: a Parquet file, a folder of them, or a glob)"),
    spec: Optional[str] = typer.Option(None, help="spec name or path (default: the model's spec)"),
    out: Path = typer.Option(Path("scores.parquet"), help="output .parquet/.csv; --engine ray: a new folder of parts"),
    model: Optional[Path] = typer.Option(None, help="checkpoint directory (default: demo model in assets/)"),
    rejected: Optional[Path] = typer.Option(None, help="also write the rejected rows to this file"),
    engine: str = typer.Option("local", help="local (one process) or ray (entity partitions on a Ray actor pool)"),
    workers: int = typer.Option(2, min=1, help="--engine ray: scoring actors, one CPU each (and a local Ray's CPUs)"),
    address: Optional[str] = typer.Option(None, help="--engine ray: Ray address (auto, host:6379); default: a local Ray"),
    partitions: int = typer.Option(0, min=0, help="files larger than memory: split by entity into N partitions "
                                   "(DuckDB) and score one at a time (Parquet --out); 0 = whole file in memory"),
    memory_limit: str = typer.Option("1GB", help="with --partitions: DuckDB's memory limit (it spills beyond it)"),
    tmp_dir: Optional[Path] = typer.Option(None, help="with --partitions: folder for the partition files"),
):
    """Score every transaction; write scored and rejected rows; print the row accounting.

    Columns: logit, score (sigmoid of the logit) and, only for a model with a calibration map,
    probability (the calibrated fraud probability the thresholds apply to)."""
    from engine.model.scoring import score_frame, ScoreRun, write_scores

    if engine not in ("local", "ray"):
        _fail(f"--engine: expected local or ray, got {engine!r}")
    if engine == "local" and not data.exists():
        _fail(f"--data {data}: no such file")
    if engine == "local" and not partitions:
        _table_out(out, "--out", "scores.parquet")  # ray: a folder, checked there; --partitions: Parquet, checked there
    else:
        _writable(out if engine == "local" else None, "--out", "scores.parquet")
    _table_out(rejected, "--rejected", "rejected.csv")
    bundle = _load_model(model)
    demo = model is None and spec is None
    if partitions:
        return _score_partitioned(bundle, data, spec, out, rejected, partitions, memory_limit, tmp_dir, demo)
    t0 = time.perf_counter()
    if engine == "ray":
        from engine.distributed.ray_score import score_command

        res, run = score_command(bundle, data, spec, out, workers, address,
                                 read=partial(_read, demo_model=demo, label_required=False),
                                 fail=_fail, log=console.print)
        prob = run.probability
    else:
        sp, res = _read(data, spec or bundle.spec, demo_model=demo, label_required=False)
        _reject_report(res, rejected)
        _require_accepted(res, data, sp, written=rejected, option="--rejected")
        try:
            scores = score_frame(bundle, res.frame)
        except ValueError as e:
            _fail(f"{data}: {e}")
        run = ScoreRun(scores=scores, rejected=res.rejected, rows_read=res.rows_read, seconds=time.perf_counter() - t0,
                       calibrated=bundle.calibrated)
        _write(lambda: write_scores(run, out), out, "--out")
        prob = scores["probability"].to_numpy()
    _unseen_notes(bundle, res.frame)
    if engine == "ray":  # the local path reported them before scoring
        _reject_report(res, rejected)
    from engine.cases.fmt import format_threshold
    from engine.cases.thresholds import thresholds_in_force

    thr = thresholds_in_force(bundle)  # the case store's for this model (if any), else the checkpoint's
    flagged = int((prob >= thr["review"]).sum())
    console.print(run.accounting())
    from engine.model.split_checks import date_outliers, history_warning

    for w in (history_warning(res.frame, bundle.config.min_history), date_outliers(res.frame, hint="fix or remove them")):
        if w:
            console.print(f"warning: {w}", markup=False)
    word = "calibrated fraud probability" if bundle.calibrated else "score (uncalibrated: not a probability)"
    console.print(f"{flagged:,} transactions at or above the review threshold {format_threshold(thr['review'])} on "
                  f"the {word} "
                  f"({escape(thr['source'])}); "
                  f"written to {escape(str(out))} ({run.seconds:.1f} s, model {bundle.short_sha})")


def _score_partitioned(bundle, data, spec, out, rejected, partitions, memory_limit, tmp_dir, demo_model=False) -> None:
    """``score --partitions N``: engine.distributed.partition.score_partitioned, with the same
    accounting, rejected-row report, unseen-value notes and warnings as the in-memory path."""
    from engine.cases.fmt import format_threshold
    from engine.cases.thresholds import thresholds_in_force
    from engine.data.spec import load_spec
    from engine.data.io import spec_for_scoring
    from engine.distributed.partition import score_partitioned
    from engine.model.split_checks import history_warning_from_sizes

    thr = thresholds_in_force(bundle)
    try:
        sp, unlabelled = spec_for_scoring(data, load_spec(spec) if spec else bundle.spec)
        if unlabelled:
            _note(unlabelled)
        run = _write(lambda: score_partitioned(bundle, data, sp, out, partitions=partitions,
                                               review_threshold=thr["review"], memory_limit=memory_limit,
                                               tmp_dir=tmp_dir, log=plain_log), out, "--out")
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        msg = f"{data}: {e}" if str(data) not in str(e) else str(e)
        _fail(f"{msg}. Note: {DEMO_MODEL_HINT}" if demo_model and "required by spec" in msg else msg)
    if run.rows_read == 0:
        _fail(f"{data}: no transactions (the file has a header line and no data rows)")
    _print_unseen(run.unseen)
    _reject_report(run.load, rejected)
    console.print(run.accounting())
    for w in (history_warning_from_sizes(run.entity_sizes, bundle.config.min_history), run.date_warning):
        if w:
            console.print(f"warning: {w}", markup=False)
    console.print(f"{run.flagged:,} transactions at or above the review threshold {format_threshold(thr['review'])} "
                  f"({escape(thr['source'])}); written to {escape(str(out))} ({run.seconds:.1f} s, "
                  f"{run.partitions} partitions, at most {run.peak_partition_rows:,} rows in one; model {bundle.short_sha})")


@app.command()
def explain(
    data: Path = typer.Option(..., exists=True),
    spec: Optional[str] = typer.Option(None, help="spec name or path (default: the model's spec)"),
    entity: str = typer.Option(..., help="entity id, e.g. '0:0' for TabFormer user 0 card 0"),
    row: Optional[int] = typer.Option(None, help="row number of the query in the file (as in rejections)"),
    position: Optional[int] = typer.Option(None, help="or: the query's position in the entity's timeline (0-based, -1 = last)"),
    out: Path = typer.Option(Path("explanation.json")),
    model: Optional[Path] = typer.Option(None),
    methods: str = typer.Option("attention,attention_rollout,integrated_gradients,shap,occlusion"),
    ig_steps: int = typer.Option(50, min=2),
    seed: int = typer.Option(0),
):
    """Explain one scored transaction with every method; write one JSON file."""
    from engine.explain import explain_transaction

    _writable(out, "--out", "explanation.json")
    bundle = _load_model(model)
    sp, res = _read(data, spec or bundle.spec, demo_model=model is None and spec is None, label_required=False)
    _require_accepted(res, data, sp)
    fr = res.frame
    from engine.model.scoring import check_compatible

    try:
        check_compatible(bundle, fr, str(data))
    except ValueError as e:
        _fail(str(e))
    ent = fr[fr["entity_id"] == entity]
    if ent.empty:
        some = ", ".join(fr["entity_id"].drop_duplicates().head(5))
        _fail(f"entity {entity!r} not in {data} (entities look like: {some})")
    _unseen_notes(bundle, ent)
    if (row is None) == (position is None):
        _fail("give exactly one of --row or --position")
    if row is not None:
        hit = ent[ent["row_number"] == row]
        if hit.empty:
            rej = res.rejected[res.rejected["row_number"] == row]
            if len(rej):
                from engine.cases.redact import mask_card_number

                r = rej.iloc[0]  # a label reason quotes the cell: masked on the console, as the reject table
                _fail(f"row {row} of {data} was rejected ({r['column']}: {mask_card_number(r['reason'])}), so it has "
                      "no score to explain")
            _fail(f"row {row} of {data} is not a transaction of entity {entity!r}")
    else:
        try:
            hit = ent.iloc[[position]]
        except IndexError:
            _fail(f"entity {entity!r} has {len(ent)} transactions; position {position} is out of range")
    tid = str(hit["transaction_id"].iloc[0])
    t0 = time.perf_counter()
    try:
        expls = explain_transaction(bundle, fr, tid, methods=tuple(m.strip() for m in methods.split(",")),
                                    ig_steps=ig_steps, seed=seed)
    except ValueError as e:
        _fail(str(e))
    from engine.cases.thresholds import thresholds_in_force

    first = next(iter(expls.values()))
    prob = float(bundle.probability([first.score_logit])[0])  # what the thresholds apply to
    thr = thresholds_in_force(bundle)  # the case store's when a supervisor set them, as score uses
    doc = {
        "schema": "fraudlens-explanation/1",
        "model": {"name": bundle.meta.get("name"), "sha256": bundle.sha256},
        "data": str(data),
        "entity_id": entity,
        "query": {"transaction_id": tid, "row_number": int(hit["row_number"].iloc[0])},
        # the explanations' score_probability is sigmoid(logit), the explainers' units; this is the
        # model's answer: calibrated when the checkpoint is, and the thresholds that apply to it
        "score": {"logit": first.score_logit, "probability": prob, "calibrated": bool(bundle.calibrated),
                  "review_threshold": float(thr["review"]), "decline_threshold": float(thr["decline"]),
                  "thresholds_source": str(thr["source"]), "flagged": prob >= float(thr["review"])},
        "explanations": {k: v.to_dict() for k, v in expls.items()},
    }
    from engine.data.csv_writer import write_private_text  # raw ids: 0600, never through a link at --out

    _write(lambda: write_private_text(out, json.dumps(doc, indent=1)), out, "--out")
    value = f"probability {prob:.4f}" if bundle.calibrated else f"score {prob:.4f} (uncalibrated)"
    console.print(_safe(f"query {tid} (row {int(hit['row_number'].iloc[0])}): {value} "
                  f"(logit {first.score_logit:.3f}); {len(first.transaction_ids)} transactions in context"))
    for k, e in expls.items():
        top = sorted(zip(e.transaction_ids[:-1], e.values[:-1], [*(e.standard_errors if e.standard_errors is not None else [None] * e.values.size)][:-1]), key=lambda x: -abs(x[1]))[:3]  # noqa: E501
        extra = (f" delta {e.convergence_delta:.2e}" if e.convergence_delta is not None else "") + (f" ({e.extras['estimator']}, ± = standard error)" if "estimator" in e.extras else "")  # noqa: E501
        listed = ", ".join(f"{t} {v:+.3f}" + (f" ± {s:.3f}" if s is not None else "") for t, v, s in top) or "no earlier transaction"  # noqa: E501
        console.print(_safe(f"  {k:20s} top earlier: {listed}{extra}"))
    console.print(f"written to {escape(str(out))} ({time.perf_counter() - t0:.2f} s)")


from engine.bench.commands import bench_app  # noqa: E402 (the ``fraudlens bench ...`` group)

app.add_typer(bench_app, name="bench")
from engine.serve.commands import serve as _serve  # noqa: E402 (``fraudlens serve``: the scoring service)

app.command("serve")(_serve)


@app.command()
def dashboard(
    data: Optional[Path] = typer.Option(None, help="open this file (default: bundled demo)"),
    spec: Optional[str] = typer.Option(None, help="spec of --data (default: the model's spec with --model, "
                                       "else the demo spec)"),
    model: Optional[Path] = typer.Option(None, help="checkpoint directory (default: demo model)"),
    port: int = typer.Option(8501, min=1, max=65535),
    address: str = typer.Option("127.0.0.1", help="interface to listen on; anything but loopback needs sign-in "
                                "($FRAUDLENS_USERS or \\[auth] in .streamlit/secrets.toml)"),
    demo: bool = typer.Option(False, "--demo", help="sign in a demo user automatically (127.0.0.1 only; a banner "
                              "on every page says so)"),
    headless: bool = typer.Option(True, help="do not try to open a browser"),
):
    """Open the Streamlit dashboard: checks, then serves in this process (same PID: SIGTERM stops it).

    Prints "ready" once the model and data are loaded and the server answers (the first page
    then renders at once). Fails with exit 2 if the address needs sign-in that is not
    configured, or the port is taken.
    """
    from engine.serve import access as ac

    env = dict(os.environ)
    users = ac.users_path(env)
    password_signin = False
    if users is not None:
        try:
            password_signin = bool(ac.load_users(users))
        except ac.UsersFileError as e:
            _fail(str(e))
    demo = demo or ac.demo_enabled(env)
    try:
        ac.check_bind(address, password_signin=password_signin, oidc_signin=secrets_have_auth(ROOT), demo=demo)
    except ac.BindError as e:
        _fail(str(e))
    if not port_free(address, port):
        _fail(f"port {port} on {address} is already in use: stop what listens there or pass --port")
    if data:
        env["FRAUDLENS_DATA"] = str(data.resolve())
    bundle = _load_model(model) if model else None  # a refused checkpoint fails here, in one line, not in the browser
    if data and not spec and bundle is not None:
        try:
            spec = str(model_spec_file(bundle))
        except OSError as e:
            _fail(f"cannot write the model's spec into the data folder ({e}); pass --spec")
        console.print(f"--spec not given: reading {escape(data.name)} with the model's spec "
                      f"({escape(bundle.spec.name)}, {escape(spec)})")
    if spec:
        env["FRAUDLENS_SPEC"] = spec if not Path(spec).exists() else str(Path(spec).resolve())
    if model:
        env["FRAUDLENS_MODEL"] = str(model.resolve())
    env[ac.ENV_DEMO] = "1" if demo else ""
    shown = f"http://{'localhost' if ac.is_loopback(address) else address}:{port}"
    console.print(f"fraudlens dashboard: loading the model and data, then serving on {shown} "
                  f"({'demo mode' if demo else 'sign-in required'}); wait for 'ready'")
    sys.stdout.flush()
    sys.stderr.flush()
    cmd = [sys.executable, "-m", "dashboard.launch", "--address", address, "--port", str(port)]
    if not headless:
        cmd.append("--no-headless")
    os.chdir(ROOT)
    os.execve(sys.executable, cmd, env)  # Streamlit replaces this process: same PID


from engine.serve.launch_checks import model_spec_file, port_free, secrets_have_auth  # noqa: E402
from engine.cli_report import report  # noqa: E402 (fraudlens report: a case's compliance report)

app.command()(report)
from engine.serve.users_commands import users_app  # noqa: E402 (fraudlens users add / list)

app.add_typer(users_app, name="users")
from engine.cli_audit import audit_app  # noqa: E402 (fraudlens audit head / verify)

app.add_typer(audit_app, name="audit")


if __name__ == "__main__":
    app()
