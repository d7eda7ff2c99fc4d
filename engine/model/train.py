"""Training: time-based split, class-imbalance handling, early stopping on validation average
precision, test-period metrics, checkpoint.

Split (documented rule): rows are split by timestamp, never by entity or at random —
``train`` = before ``train_end``, ``validation`` = [``train_end``, ``val_end``), ``test`` = from
``val_end``. Without explicit dates the cut points are the 70 % and 85 % points of the time span,
rounded down to midnight. Feature statistics are fitted on training rows only. Earlier rows
of any period are visible as *history* (inputs, never labels), as they would be in production.

Imbalance: binary cross-entropy with ``pos_weight = min(sqrt(n_neg / n_pos), 30)`` on the
logit of every scored, labelled training-period transaction.

Calibration: after model choice (the best epoch), a calibration map from logit to fraud
probability is fitted on the validation period (:mod:`engine.model.calibration`; default
``auto``: isotonic or Platt by a cross-validated Brier score) and stored in the checkpoint.

Thresholds (:mod:`engine.model.operating_point`): on the calibrated validation probabilities,
the review threshold meets a stated target - ``target_precision`` (default 0.5: the lowest
threshold with validation precision >= 0.5) or ``alerts_per_day``; the decline threshold is
the lowest with validation precision >= 0.8 (never below review). Test metrics are reported at
the review threshold, with a bootstrap interval over entities for precision, recall and
alerts per day, and a warning when the validation precision lies outside the test interval.
AUC ROC and average precision are computed on the uncalibrated score (ranking metrics; a
monotone map changes them only through ties).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import (
    average_precision_score,
    roc_auc_score,
)
from tqdm.auto import tqdm

from engine.data.features import EncodedFrame, FeatureEncoder
from engine.data.spec import DatasetSpec
from engine.model.baseline import BaselineConfig, TabularBaseline
from engine.model.calibration import CALIBRATION_KEY, apply_calibration, calibration_summary, fit_calibration
from engine.model.checkpoint import ModelBundle, build_model
from engine.model.compare import paired_bootstrap
from engine.model.drift import DRIFT_KEY, drift_reference
from engine.model.operating_point import (
    bootstrap_at_threshold,
    choose_operating_thresholds,
    curve_points,
    period_days,
    precision_warning,
)
from engine.model.scoring import score_encoded, sigmoid
from engine.model.sequences import build_windows, make_batch, window_entity_start
from engine.model.split_checks import (
    MIN_FRAUD_ENTITIES,
    MIN_FRAUDS,
    history_warning,
    propose_split_dates,
    split_warnings,
)


@dataclass
class TrainConfig:
    """Training hyper-parameters (stored in the checkpoint).

    Attributes:
        context_length / min_history / d_model / n_heads / n_layers / d_ff / dropout: see ModelConfig.
        lr: AdamW learning rate. weight_decay: AdamW weight decay.
        lr_schedule: ``"constant"``, or ``"cosine"``: the learning rate follows a half cosine from
            ``lr`` down to ``lr / 20`` over all steps of ``epochs`` epochs (Loshchilov & Hutter,
            "SGDR", ICLR 2017, without restarts), so the last epochs take small steps.
        batch_size: windows per optimisation step.
        epochs: maximum epochs. patience: epochs without validation-AP improvement before stopping.
        windows_per_epoch: training windows sampled per epoch (None = all).
        train_end / val_end: split dates (ISO text) or None for the 70 % / 85 % rule.
        max_minutes: stop training after this wall time (checked every 20 steps; the best
            evaluated epoch is kept).
        seed: seed for init and sampling. threads: torch intra-op threads (None = torch default).
        activity: build the model with the recent-activity and first-seen fields
            (:mod:`engine.model.activity`).
        calibration: ``"auto"``, ``"isotonic"``, ``"platt"`` or ``"none"`` (no map: the outputs
            stay scores), fitted on validation after model choice.
        target_precision / alerts_per_day: the review threshold's target on validation (at most
            one; neither = precision 0.5, see :mod:`engine.model.operating_point`).
    """

    context_length: int = 128
    min_history: int = 32
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 128
    dropout: float = 0.1
    lr: float = 2e-3
    weight_decay: float = 1e-4
    lr_schedule: str = "constant"
    batch_size: int = 64
    epochs: int = 8
    patience: int = 2
    windows_per_epoch: int | None = 6000
    train_end: str | None = None
    val_end: str | None = None
    max_minutes: float = 11.0
    seed: int = 0
    threads: int | None = None
    activity: bool = True
    calibration: str = "auto"
    target_precision: float | None = None
    alerts_per_day: float | None = None


def time_split(ts: pd.Series, train_end=None, val_end=None) -> tuple[np.ndarray, pd.Timestamp, pd.Timestamp]:
    """Split labels per row: 0 train, 1 validation, 2 test (see module doc).

    Raises:
        ValueError: a period would be empty or the dates are not increasing.
    """
    ts = pd.to_datetime(ts)
    lo, hi = ts.min(), ts.max()
    a = pd.Timestamp(train_end) if train_end else (lo + 0.70 * (hi - lo)).normalize()
    b = pd.Timestamp(val_end) if val_end else (lo + 0.85 * (hi - lo)).normalize()
    if not lo < a < b <= hi:
        raise ValueError(f"time split: expected {lo} < train_end {a} < val_end {b} <= {hi}")
    split = np.where(ts < a, 0, np.where(ts < b, 1, 2)).astype(np.int8)
    for i, name in enumerate(("train", "validation", "test")):
        if not (split == i).any():
            raise ValueError(f"time split: the {name} period is empty")
    return split, a, b


def binary_metrics(y: np.ndarray, p: np.ndarray, threshold: float | None = None,
                   rank: np.ndarray | None = None) -> dict[str, float]:
    """AUC ROC, average precision and precision/recall/F1 at ``threshold`` (probabilities).

    ``rank`` (optional, ``[N]``): the scores AUC ROC and average precision are computed on
    (e.g. the uncalibrated score), default ``p``."""
    y = np.asarray(y).astype(int)
    out: dict[str, float] = {"n": int(len(y)), "n_fraud": int(y.sum())}
    r = p if rank is None else rank
    if 0 < y.sum() < len(y):
        out["auc_roc"] = float(roc_auc_score(y, r))
        out["average_precision"] = float(average_precision_score(y, r))
    if threshold is not None:
        pred = p >= threshold
        tp = int((pred & (y == 1)).sum())
        out.update(
            threshold=float(threshold),
            precision=tp / max(1, int(pred.sum())),
            recall=tp / max(1, int(y.sum())),
            alerts=int(pred.sum()),
        )
        out["f1"] = 2 * out["precision"] * out["recall"] / max(1e-12, out["precision"] + out["recall"])
    return out


def fit(
    frame: pd.DataFrame,
    spec: DatasetSpec,
    split: np.ndarray,
    cfg: TrainConfig | None = None,
    *,
    log: Callable[[str], None] = print,
    progress: bool = True,
    early_stopping: bool = True,
    stop_after: int | None = None,
) -> tuple[ModelBundle, list[dict[str, Any]], EncodedFrame]:
    """Fit feature statistics and a model given a per-row split.

    Args:
        frame: canonical frame with a ``label`` column, sorted by (entity_id, timestamp).
        split: ``[N]`` int8 per row: 0 = training label, 1 = validation (evaluated after every
            epoch), anything else = history only (input, never a label).
        early_stopping: keep the epoch with the best validation AP and stop after ``patience``
            epochs without gain; if False (or no validation rows), train ``cfg.epochs`` epochs and
            keep the last one (validation AP is still recorded per epoch when there are rows).
        stop_after: stop after this many epochs (the learning-rate schedule still spans
            ``cfg.epochs``): the snapshot a validation run chose, reproduced without it.
    Returns:
        ``(bundle, history, enc)``; ``history[i]`` holds loss and validation metrics of epoch
        ``i + 1``; ``enc`` is ``frame`` encoded with the fitted statistics (for scoring it again).
    Raises:
        ValueError: no label column or no fraud among the training rows.
    """
    cfg = cfg or TrainConfig()
    t_start = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    if "label" not in frame:
        raise ValueError("training needs a label column (spec [label])")
    rng = np.random.default_rng(cfg.seed)
    label = frame["label"].to_numpy(dtype="float64", na_value=np.nan)
    known = ~np.isnan(label)
    n_pos = int(((split == 0) & known & (label == 1)).sum())
    n_neg = int(((split == 0) & known & (label == 0)).sum())
    if n_pos == 0:
        raise ValueError("training period has no fraud-labelled transaction")

    encoder = FeatureEncoder.fit(frame.loc[split == 0], spec)
    enc = encoder.transform(frame)
    model = build_model(
        encoder, seed=cfg.seed, activity=cfg.activity,
        **{k: getattr(cfg, k) for k in ("d_model", "n_heads", "n_layers", "d_ff", "dropout", "context_length", "min_history")},
    )
    ents = frame["entity_id"].to_numpy()
    win = build_windows(ents, cfg.context_length, cfg.min_history)
    ent_start = window_entity_start(win, ents)

    # per-slot loss mask: scored in this window, training split, label known
    slot_rows = win.rows
    valid = slot_rows >= 0
    safe = np.where(valid, slot_rows, 0)
    scored = valid & (np.arange(cfg.context_length)[None, :] >= win.scored_from[:, None])
    train_slot = scored & (split[safe] == 0) & known[safe]
    train_windows = np.flatnonzero(train_slot.any(axis=1))
    # a window only needs to run up to its last training slot (causal: later slots change nothing)
    last_slot = np.where(train_slot.any(axis=1), cfg.context_length - 1 - np.argmax(train_slot[:, ::-1], axis=1), 0)
    y_all = np.nan_to_num(label, nan=0.0).astype(np.float32)
    pos_weight = torch.tensor(min(math.sqrt(n_neg / n_pos), 30.0))
    log(f"model: {model.n_parameters():,} parameters; windows: {win.n_windows:,} "
        f"({len(train_windows):,} with training rows); train frauds {n_pos:,}; pos_weight {pos_weight.item():.1f}")

    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    val_rows = np.flatnonzero((split == 1) & known)

    history: list[dict[str, Any]] = []
    best = (-1.0, None, -1)
    per_epoch = len(train_windows) if cfg.windows_per_epoch is None else min(cfg.windows_per_epoch, len(train_windows))
    if cfg.lr_schedule not in ("constant", "cosine"):
        raise ValueError(f"lr_schedule: expected 'constant' or 'cosine', got {cfg.lr_schedule!r}")
    total_steps = max(1, cfg.epochs * math.ceil(per_epoch / cfg.batch_size))
    step = 0
    for epoch in range(cfg.epochs):
        model.train()
        order = rng.choice(train_windows, size=per_epoch, replace=False)
        # similar lengths together: sort within chunks of 16 batches
        chunk = cfg.batch_size * 16
        order = np.concatenate([c[np.argsort(last_slot[c])] for c in np.array_split(order, max(1, len(order) // chunk))])
        batches = [order[i : i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
        rng.shuffle(batches)
        losses = []
        out_of_time = False
        bar = tqdm(batches, desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=not progress, leave=False)
        for ids in bar:
            Tb = int(last_slot[ids].max()) + 1
            batch = make_batch(enc, win.rows[ids, :Tb], ent_start[ids])
            logits = model(batch).logits  # [b, Tb]
            m = torch.from_numpy(train_slot[ids, :Tb])
            y = torch.from_numpy(y_all[safe[ids, :Tb]])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits[m], y[m], pos_weight=pos_weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if cfg.lr_schedule == "cosine":
                frac = min(step / total_steps, 1.0)
                for g in opt.param_groups:
                    g["lr"] = cfg.lr * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * frac)))
            opt.step()
            step += 1
            losses.append(loss.item())
            if len(losses) % 20 == 0:
                bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}")
                if (time.perf_counter() - t_start) / 60 >= cfg.max_minutes:
                    out_of_time = True
                    break  # time budget: evaluate this partial epoch, then stop
        rec: dict[str, Any] = {"epoch": epoch + 1, "loss": float(np.mean(losses)) if losses else float("nan")}
        if len(val_rows):
            pv = sigmoid(score_encoded(model, enc, ents, rows=val_rows)[val_rows].astype(np.float64))
            rec.update({f"val_{k}": v for k, v in binary_metrics(label[val_rows], pv).items()})
        rec["minutes"] = (time.perf_counter() - t_start) / 60
        history.append(rec)
        log(f"epoch {epoch + 1}: loss {rec['loss']:.4f}  val AP {rec.get('val_average_precision', float('nan')):.4f}  "
            f"val AUC {rec.get('val_auc_roc', float('nan')):.4f}  ({rec['minutes']:.1f} min)")
        if early_stopping and len(val_rows):
            ap = rec.get("val_average_precision", 0.0)
            if ap > best[0]:
                best = (ap, {k: v.detach().clone() for k, v in model.state_dict().items()}, epoch + 1)
            elif epoch + 1 - best[2] >= cfg.patience:
                log(f"early stop: no validation AP gain for {cfg.patience} epochs")
                break
        if out_of_time:
            log(f"time budget of {cfg.max_minutes} min reached")
            break
        if stop_after is not None and epoch + 1 >= stop_after:
            break
    if best[1] is not None:
        model.load_state_dict(best[1])
    model.eval()
    meta = {"best_epoch": best[2] if best[1] is not None else len(history), "train_config": asdict(cfg), "history": history}
    return ModelBundle(model=model, encoder=encoder, spec=spec, meta=meta), history, enc


def train(
    frame: pd.DataFrame,
    spec: DatasetSpec,
    cfg: TrainConfig | None = None,
    *,
    log: Callable[[str], None] = print,
    progress: bool = True,
    baseline: BaselineConfig | None = None,
) -> tuple[ModelBundle, dict[str, Any]]:
    """Train on a canonical frame with a time split (see module doc), choose thresholds on
    validation, report test metrics.

    With ``baseline``, the LightGBM baseline of :mod:`engine.model.baseline` is trained on the
    same split and scored on the same test rows (:func:`compare_with_baseline`); its metrics
    and the paired bootstrap of the difference go to ``report["baseline"]`` and
    ``bundle.meta["baseline"]``.

    Returns:
        ``(bundle, report)``: the best-epoch model bundle (meta holds metrics and thresholds) and a
        report dict with the per-epoch history, wall time, ``test_rows`` (positions of the
        labelled test rows) and ``test_probability`` (the model's uncalibrated scores
        ``sigmoid(logit)`` on them, for ranking comparisons; with ``baseline`` also
        ``baseline_test_probability``), ``operating_point`` (targets, thresholds, validation and
        bootstrapped test figures, warnings) and ``calibration`` (:func:`calibrate`'s report).
        ``bundle.meta`` also holds ``calibration`` (the map), ``operating_point``,
        ``calibration_metrics`` and ``drift_reference`` (:func:`engine.model.drift.drift_reference`
        of the training-period rows).
    Raises:
        ValueError: no label column, no fraud in the training period, an empty period, both
            threshold targets given or a target out of range, or an unknown calibration method.
    """
    cfg = cfg or TrainConfig()
    if cfg.target_precision is not None and cfg.alerts_per_day is not None:
        raise ValueError("state one threshold target: target_precision or alerts_per_day, not both")
    if cfg.target_precision is not None and not 0 < cfg.target_precision <= 1:
        raise ValueError(f"target precision: expected a number in (0, 1], got {cfg.target_precision}")
    if cfg.alerts_per_day is not None and not cfg.alerts_per_day > 0:
        raise ValueError(f"alerts per day: expected a number > 0, got {cfg.alerts_per_day}")
    if cfg.calibration not in ("auto", "isotonic", "platt", "none"):
        raise ValueError(f"calibration: expected auto, isotonic, platt or none, got {cfg.calibration!r}")
    t_start = time.perf_counter()
    split, train_end, val_end = time_split(frame["timestamp"], cfg.train_end, cfg.val_end)
    log(f"split: train < {train_end.date()} <= validation < {val_end.date()} <= test; "
        f"rows {np.bincount(split, minlength=3).tolist()}")
    warnings = split_warnings(frame, split)
    proposal = propose_split_dates(frame) if warnings else None
    for w in warnings:
        log(f"warning: {w}")
    if proposal is not None:
        log(f"warning: --train-end {proposal[0].date()} --val-end {proposal[1].date()} would give both periods "
            f"at least {MIN_FRAUDS} frauds on {MIN_FRAUD_ENTITIES} entities")
    elif warnings:
        log("warning: no split of this file gives both periods enough frauds; treat its metrics as anecdotes")
    hist = history_warning(frame, cfg.min_history)
    if hist:
        log(f"warning: {hist}")
        warnings.append(hist)
    bundle, history, enc = fit(frame, spec, split, cfg, log=log, progress=progress)
    label = frame["label"].to_numpy(dtype="float64", na_value=np.nan)
    known = ~np.isnan(label)
    val_rows = np.flatnonzero((split == 1) & known)
    test_rows = np.flatnonzero((split == 2) & known)
    ents = frame["entity_id"].to_numpy()
    both = np.concatenate([val_rows, test_rows])
    lg = score_encoded(bundle.model, enc, ents, rows=both).astype(np.float64)
    pv, pt = sigmoid(lg[val_rows]), sigmoid(lg[test_rows])  # scores (uncalibrated)
    yv, yt = label[val_rows].astype(int), label[test_rows].astype(int)
    cal, cal_report = calibrate(bundle, lg[val_rows], lg[test_rows], yv, yt, ents[val_rows], cfg, log=log)
    cv, ct = apply_calibration(cal, lg[val_rows]), apply_calibration(cal, lg[test_rows])
    days_v = period_days(train_end, val_end)
    days_t = period_days(val_end, pd.to_datetime(frame["timestamp"]).max())
    try:
        op = choose_operating_thresholds(yv, cv, days_v, target_precision=cfg.target_precision,
                                         alerts_per_day=cfg.alerts_per_day)
    except ValueError as e:
        if 0 < yv.sum() < len(yv):
            raise  # a bad target
        op = {"review": 0.5, "decline": 0.9, "target": None, "met": False, "validation": {"precision": None},
              "warning": f"thresholds left at 0.5 / 0.9: {e}"}
    thresholds = {"review": op["review"], "decline": op["decline"]}
    test_m = binary_metrics(yt, ct, thresholds["review"], rank=pt)
    val_m = binary_metrics(yv, cv, thresholds["review"], rank=pv)
    op["test"] = bootstrap_at_threshold(yt, ct, ents[test_rows], op["review"], days_t, seed=cfg.seed)
    op["precision_warning"] = precision_warning(op["validation"]["precision"], op["test"])
    if yt.sum():
        op["test_curve"] = curve_points(yt, ct, days_t, max_points=200)
    op["units"] = "calibrated probability" if cal is not None else "score (uncalibrated)"
    bundle.meta[DRIFT_KEY] = drift_reference(frame.loc[split == 0], spec)
    wall = time.perf_counter() - t_start
    bundle.meta.update(
        metrics={"test": test_m, "validation": val_m},
        thresholds=thresholds,
        operating_point=op,
        calibration_metrics=cal_report,
        split={"train_end": str(train_end), "val_end": str(val_end), "rule": "time; see engine/model/train.py",
               "warnings": warnings,
               "proposed": {"train_end": str(proposal[0]), "val_end": str(proposal[1])} if proposal else None},
        train_wall_s=wall,
    )
    report = {"history": history, "wall_s": wall, "test": test_m, "validation": val_m, "thresholds": thresholds,
              "operating_point": op, "calibration": cal_report}
    if baseline is not None:
        log("baseline: LightGBM over causal per-entity features, same split and test rows")
        cmp, pb = compare_with_baseline(frame, spec, split, test_rows, pt, baseline, seed=cfg.seed)
        bundle.meta["baseline"] = report["baseline"] = cmp
        report["baseline_test_probability"] = pb
    report["test_rows"], report["test_probability"] = test_rows, pt
    return bundle, report


def calibrate(
    bundle: ModelBundle,
    lg_val: np.ndarray,
    lg_test: np.ndarray,
    y_val: np.ndarray,
    y_test: np.ndarray,
    ents_val: np.ndarray,
    cfg: TrainConfig,
    *,
    log: Callable[[str], None] = print,
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Fit the calibration map on the validation logits (``cfg.calibration``) and store it in
    ``bundle.meta["calibration"]``; measure score and probability on both periods.

    Returns:
        ``(map or None, report)``: ``report`` holds ``method``, ``choice`` and, per period
        (``validation`` in-sample, ``test`` held out), ``score`` and ``probability``
        :func:`engine.model.calibration.calibration_summary`. No map (``"none"``, or the
        validation labels hold one class): ``method`` is ``None`` and a ``reason`` is given.
    """
    report: dict[str, Any] = {"method": None}
    cal = None
    if cfg.calibration == "none":
        report["reason"] = "calibration 'none' requested"
    elif not 0 < y_val.sum() < len(y_val):
        report["reason"] = "the validation labels hold one class only"
        log("warning: no calibration map (the validation labels hold one class only); outputs are scores")
    else:
        cal = fit_calibration(lg_val, y_val, ents_val, method=cfg.calibration, seed=cfg.seed)
        bundle.meta[CALIBRATION_KEY] = cal
        report.update(method=cal["method"], choice=cal["choice"])
    for period, lg, y in (("validation", lg_val, y_val), ("test", lg_test, y_test)):
        report[period] = {"score": calibration_summary(y, sigmoid(lg))}
        if cal is not None:
            report[period]["probability"] = calibration_summary(y, apply_calibration(cal, lg))
    t = report["test"]
    if cal is not None and t["score"]["ece"] is not None:
        log(f"calibration: {cal['method']} ({cal['choice']['rule']}); test ECE {t['score']['ece']:.4f} -> "
            f"{t['probability']['ece']:.4f}, sum of probabilities / frauds {t['score']['sum_over_frauds'] or 0:.2f} "
            f"-> {t['probability']['sum_over_frauds'] or 0:.2f}")
    return cal, report


def compare_with_baseline(
    frame: pd.DataFrame,
    spec: DatasetSpec,
    split: np.ndarray,
    test_rows: np.ndarray,
    p_model: np.ndarray,
    config: BaselineConfig | None = None,
    *,
    n_boot: int = 500,
    seed: int = 0,
) -> dict[str, Any]:
    """Train :class:`~engine.model.baseline.TabularBaseline` on ``split`` and compare it with
    the model's test probabilities ``p_model`` (``[len(test_rows)]``) on the same rows.

    Returns:
        ``(summary, probabilities)``: ``summary`` is a JSON-able dict: ``test`` (the baseline's
        :func:`binary_metrics`), ``model`` (``describe()``), ``bootstrap``
        (``{"average_precision": ..., "auc_roc": ...}``, each the
        :func:`engine.model.compare.paired_bootstrap` of model minus baseline over entities;
        absent when the test rows hold one class only), ``wall_s`` (seconds, fit + scoring);
        ``probabilities`` the baseline's ``[len(test_rows)]`` float64 test probabilities.
    """
    t0 = time.perf_counter()
    label = frame["label"].to_numpy(dtype="float64", na_value=np.nan)
    gbt, pb = TabularBaseline.fit_predict(frame, spec, split, test_rows, config)
    y = label[test_rows].astype(int)
    out: dict[str, Any] = {"test": binary_metrics(y, pb), "model": gbt.describe()}
    if 0 < y.sum() < len(y):
        ents = frame["entity_id"].to_numpy()[test_rows]
        out["bootstrap"] = {m: paired_bootstrap(y, p_model, pb, ents, metric=m, n_boot=n_boot, seed=seed)
                            for m in ("average_precision", "auc_roc")}
    out["wall_s"] = time.perf_counter() - t0
    return out, pb
