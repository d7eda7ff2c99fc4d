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

import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import (
    average_precision_score,
    roc_auc_score,
)

from engine.data import field_reference
from engine.data.features import EncodedFrame
from engine.data.spec import DatasetSpec
from engine.model.baseline import BaselineConfig, TabularBaseline
from engine.model.calibration import CALIBRATION_KEY, apply_calibration, calibration_summary, fit_calibration
from engine.model.checkpoint import ModelBundle
from engine.model.compare import paired_bootstrap
from engine.model.drift import DRIFT_KEY, drift_reference
from engine.model.ensemble import SeedEnsemble, member_seed
from engine.model.operating_point import (
    bootstrap_at_threshold,
    choose_operating_thresholds,
    curve_points,
    period_days,
    precision_warning,
)
from engine.model.scoring import score_encoded, sigmoid
from engine.model.train_loop import finish_fit, new_model, prepare_fit, run_epochs
from engine.model.split_checks import (
    MIN_FRAUD_ENTITIES,
    MIN_FRAUDS,
    date_outliers,
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
        batch_size: windows per optimisation step (at most; see ``min_steps_per_epoch``).
        min_steps_per_epoch: the batch size is lowered (down to 8 windows) until an epoch takes at
            least this many optimisation steps (``train_loop.effective_batch_size``): a small file
            (the demo data: 669 training windows, 11 steps per epoch at 64) otherwise stops early
            after about 80 steps in all. Files with 2,560+ windows per epoch keep ``batch_size``.
            0 = always ``batch_size``.
        epochs: maximum epochs. patience: epochs without validation-AP improvement before stopping.
        windows_per_epoch: training windows sampled per epoch (None = all).
        fill_epoch: when fewer training windows exist than ``windows_per_epoch``, sample them with
            replacement up to ``windows_per_epoch`` (a small file then still takes that many
            windows' worth of optimisation steps per epoch); False = each window once per epoch.
        ema_epochs: half-life, in epochs, of an exponential moving average of the weights that
            validation, early stopping and the checkpoint use instead of the last step's weights
            (``train_loop._Ema``, bias-corrected); 0 = off. Default 1.0 since 2026-12-03:
            validation AP over 5 seeds, demo 0.948 -> 0.954, BankSim 0.912 -> 0.923 (half-lives
            0.5 and 2 level or lower; bench/results/recipe_probe.md).
        train_end / val_end: split dates (ISO text) or None for the 70 % / 85 % rule.
        max_minutes: stop training after this wall time (checked every 20 steps; the best
            evaluated epoch is kept).
        seed: seed for init and sampling. threads: torch intra-op threads (None = torch default).
        activity: build the model with the recent-activity and first-seen fields
            (:mod:`engine.model.activity`). activity_ple: also embed piecewise-linear codes of the
            recent-activity inputs (``ModelConfig.activity_ple``).
        row_ff: see ModelConfig (0 = no row feed-forward layer). Default 128 since 2026-12-03:
            validation AP over 5 seeds, demo 0.930 -> 0.948, BankSim 0.900 -> 0.912
            (bench/results/recipe_probe.md).
        amount_by_value: give the amount field, per embedded categorical field, the amount's
            z-score against the training amounts of that field's value
            (:mod:`engine.data.features`; "a large amount for this merchant"). Default on since
            2026-12-03: validation AP over 5 seeds, demo 0.920 -> 0.930, BankSim 0.898 -> 0.900.
        members: members of a seed ensemble (:mod:`engine.model.ensemble`): ``members``
            transformers trained from seeds ``seed * members + k`` on the same split and scored by
            their mean logit, in one checkpoint; they share the ``max_minutes`` budget. 1 = one
            transformer. Default 3 since 2026-12-03: test AP over 5 seeds, demo 0.955 ± 0.017 ->
            0.965 ± 0.007, BankSim 0.887 ± 0.028 -> 0.913 ± 0.017, Handbook (seed 0, same 11-min
            budget) 0.795 -> 0.795, AUC ROC 0.907 -> 0.911 (bench/results/datasets.md). Whole-file
            scoring and explanations cost about ``members`` times one model's; the incremental
            scorer runs the members side by side (about one model's cost).
        calibration: ``"auto"``, ``"isotonic"``, ``"platt"`` or ``"none"`` (no map: the outputs
            stay scores), fitted on validation after model choice.
        target_precision / alerts_per_day: the review threshold's target on validation (at most
            one; neither = precision 0.5, see :mod:`engine.model.operating_point`).
        pretrain_minutes: self-supervised next-transaction pretraining on the training period and
            the history before it, before the fraud objective (:mod:`engine.model.pretrain`), for at most this many
            minutes of the ``max_minutes`` budget; 0 = none. A seed ensemble pretrains once and
            every member starts from those weights (a fresh fraud head from its own seed).
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
    epochs: int = 30
    patience: int = 4
    windows_per_epoch: int | None = 6000
    fill_epoch: bool = False
    ema_epochs: float = 1.0
    min_steps_per_epoch: int = 40
    train_end: str | None = None
    val_end: str | None = None
    max_minutes: float = 11.0
    seed: int = 0
    threads: int | None = None
    activity: bool = True
    activity_ple: bool = True
    amount_by_value: bool = True
    row_ff: int = 128
    members: int = 3
    calibration: str = "auto"
    target_precision: float | None = None
    alerts_per_day: float | None = None
    pretrain_minutes: float = 0.0


def check_members(cfg: TrainConfig) -> None:
    """Raises ValueError unless ``cfg.members`` is a whole number from 1 to 16."""
    if isinstance(cfg.members, bool) or not isinstance(cfg.members, int) or not 1 <= cfg.members <= 16:
        raise ValueError(f"members: expected a whole number from 1 to 16, got {cfg.members!r}")


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
    check_members(cfg)
    d = prepare_fit(frame, spec, split, cfg)
    K = cfg.members
    pre = _pretrained(d, split, cfg, log) if cfg.pretrain_minutes > 0 else None
    if K == 1:
        model = new_model(d.encoder, cfg)
        if pre is not None:
            model.load_state_dict(pre[0])
        log(f"model: {model.n_parameters():,} parameters; windows: {d.win.n_windows:,} "
            f"({len(d.train_windows):,} with training rows); train frauds {d.n_pos:,}; pos_weight {d.pos_weight.item():.1f}")
        history, best = run_epochs(model, d, cfg, log=log, progress=progress, early_stopping=early_stopping,
                                   stop_after=stop_after, t_start=t_start)
        bundle = finish_fit(model, d, spec, cfg, history, best)
        if pre is not None:
            bundle.meta["pretrain_history"] = pre[1]
        return bundle, history, d.enc
    return _fit_ensemble(d, spec, cfg, log=log, progress=progress, early_stopping=early_stopping,
                         stop_after=stop_after, t_start=t_start, pre=pre)


def _pretrained(d, split: np.ndarray, cfg: TrainConfig, log) -> tuple[dict, list[dict]]:
    """Weights of a model of ``cfg`` after next-transaction pretraining (:mod:`engine.model.pretrain`),
    with a fresh fraud head, and the pretraining history."""
    from engine.model.pretrain import pretrain_next_transaction, pretraining_targets

    if cfg.pretrain_minutes >= cfg.max_minutes:
        raise ValueError(f"pretrain_minutes ({cfg.pretrain_minutes}) must leave part of max_minutes "
                         f"({cfg.max_minutes}) for the fraud objective")
    model = new_model(d.encoder, cfg)
    head = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("head.")}
    log(f"pretraining: next-transaction prediction on the training period, at most {cfg.pretrain_minutes:g} min")
    targets = pretraining_targets(split, d.enc.time_s)
    log(f"pretraining targets: {int(targets.sum()):,} transactions (the training period and the history before it)")
    hist = pretrain_next_transaction(model, d.enc, d.win, d.ent_start, targets, minutes=cfg.pretrain_minutes,
                                     lr=cfg.lr, batch_size=cfg.batch_size, seed=cfg.seed,
                                     weight_decay=cfg.weight_decay, log=log)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    state.update(head)  # the fraud head was not trained: keep its initialisation
    return state, hist


def _fit_ensemble(d, spec: DatasetSpec, cfg: TrainConfig, *, log, progress, early_stopping, stop_after,
                  t_start: float, pre: tuple | None = None) -> tuple[ModelBundle, list[dict[str, Any]], EncodedFrame]:
    """:func:`fit` of a ``cfg.members``-member seed ensemble (:mod:`engine.model.ensemble`): the
    members are trained one after another on the same encoded data, member ``k`` from seed
    :func:`~engine.model.ensemble.member_seed`, each with its own early stopping on validation AP;
    member ``k`` gets the wall time left of ``cfg.max_minutes`` divided by the members still to
    train. The bundle's ``meta["members"]`` lists each member's seed, best epoch, validation AP and
    wall time; ``history`` entries carry their ``member``."""
    K = cfg.members
    members, history, info = [], [], []
    for k in range(K):
        t_k = time.perf_counter()
        left = cfg.max_minutes - (t_k - t_start) / 60
        cfg_k = replace(cfg, seed=member_seed(cfg.seed, k, K), members=1, max_minutes=max(left / (K - k), 0.05))
        model = new_model(d.encoder, cfg_k)
        if pre is not None:  # the pretrained weights, this member's own fraud head
            model.load_state_dict({n: v for n, v in pre[0].items() if not n.startswith("head.")}, strict=False)
        log(f"member {k + 1} of {K} (seed {cfg_k.seed}, at most {cfg_k.max_minutes:.1f} min): "
            f"{model.n_parameters():,} parameters; train frauds {d.n_pos:,}; pos_weight {d.pos_weight.item():.1f}")
        h, best = run_epochs(model, d, cfg_k, log=log, progress=progress, early_stopping=early_stopping,
                             stop_after=stop_after, t_start=t_k)
        b = finish_fit(model, d, spec, cfg_k, h, best)
        members.append(b.model)
        aps = [e.get("val_average_precision") for e in h if e.get("val_average_precision") is not None]
        info.append({"seed": cfg_k.seed, "best_epoch": b.meta["best_epoch"], "epochs": len(h),
                     "best_val_average_precision": max(aps) if aps else None,
                     "wall_s": round(time.perf_counter() - t_k, 1)})
        history += [{**e, "member": k} for e in h]
    ens = SeedEnsemble(replace(members[0].cfg, n_members=K), members).eval()
    meta = {"best_epoch": [m["best_epoch"] for m in info], "members": info, "train_config": asdict(cfg),
            "history": history, **({"pretrain_history": pre[1]} if pre is not None else {})}
    return ModelBundle(model=ens, encoder=d.encoder, spec=spec, meta=meta), history, d.enc



def _refuse_one_class_validation(frame: pd.DataFrame, split: np.ndarray, train_end, val_end,
                                 proposal, outliers: str | None) -> None:
    """Refuse, before any epoch, a validation period whose labels hold one class: the best epoch,
    the calibration map and the review threshold are all chosen on it, so training would run for
    minutes and save a model chosen by nothing. Names the dates that fix it when there are any."""
    if "label" not in frame:
        return  # fit names the missing label column
    y = frame["label"].to_numpy(dtype="float64", na_value=np.nan)[np.asarray(split) == 1]
    y = y[~np.isnan(y)]
    n_fraud = int((y == 1).sum())
    if 0 < n_fraud < len(y):
        return
    what = "no labelled fraud" if n_fraud == 0 else "only frauds"
    msg = (f"the validation period [{train_end.date()}, {val_end.date()}) holds {what} ({len(y):,} labelled "
           "transactions): the best epoch, the calibration map and the review threshold are chosen on it")
    fix = proposal or propose_split_dates(frame, min_frauds=1, min_entities=1)
    if fix is not None:
        msg += f"; --train-end {fix[0].date()} --val-end {fix[1].date()} gives both later periods frauds"
    else:
        total = int((frame["label"].to_numpy(dtype="float64", na_value=np.nan) == 1).sum())
        msg += ("; this file has no labelled fraud at all (check the spec's [label] positive values)" if total == 0
                else f"; this file's {total:,} frauds are too few to split into training, validation and test periods")
    raise ValueError(f"{msg}; {outliers}" if outliers else msg)


def train(
    frame: pd.DataFrame,
    spec: DatasetSpec,
    cfg: TrainConfig | None = None,
    *,
    log: Callable[[str], None] = print,
    progress: bool = True,
    baseline: BaselineConfig | None = None,
    fitter: Callable | None = None,
) -> tuple[ModelBundle, dict[str, Any]]:
    """Train on a canonical frame with a time split (see module doc), choose thresholds on
    validation, report test metrics.

    With ``baseline``, the LightGBM baseline of :mod:`engine.model.baseline` is trained on the
    same split and scored on the same test rows (:func:`compare_with_baseline`); its metrics
    and the paired bootstrap of the difference go to ``report["baseline"]`` and
    ``bundle.meta["baseline"]``.

    ``fitter`` replaces :func:`fit` (same arguments and result), e.g.
    :func:`engine.distributed.ray_train.ray_fitter` (data-parallel on Ray Train).

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
        ValueError: no label column, no fraud in the training period, a validation period with
            no fraud (or only frauds; the message proposes dates), an empty period, both
            threshold targets given or a target out of range, or an unknown calibration method.
    """
    cfg = cfg or TrainConfig()
    if cfg.target_precision is not None and cfg.alerts_per_day is not None:
        raise ValueError("state one threshold target: target_precision or alerts_per_day, not both")
    if cfg.target_precision is not None and not 0 < cfg.target_precision <= 1:
        raise ValueError(f"target precision: expected a number in (0, 1], got {cfg.target_precision}")
    if cfg.alerts_per_day is not None and not cfg.alerts_per_day > 0:
        raise ValueError(f"alerts per day: expected a number > 0, got {cfg.alerts_per_day}")
    check_members(cfg)
    if cfg.calibration not in ("auto", "isotonic", "platt", "none"):
        raise ValueError(f"calibration: expected auto, isotonic, platt or none, got {cfg.calibration!r}")
    t_start = time.perf_counter()
    outliers = date_outliers(frame, hint="fix or remove them" if cfg.train_end and cfg.val_end
                             else "fix or remove them, or pass --train-end / --val-end")
    if outliers:
        log(f"warning: {outliers}")
    try:
        split, train_end, val_end = time_split(frame["timestamp"], cfg.train_end, cfg.val_end)
    except ValueError as e:
        raise ValueError(f"{e}; {outliers}" if outliers else str(e)) from None
    log(f"split: train < {train_end.date()} <= validation < {val_end.date()} <= test; "
        f"rows {np.bincount(split, minlength=3).tolist()}")
    warnings = split_warnings(frame, split)
    proposal = propose_split_dates(frame) if warnings else None
    _refuse_one_class_validation(frame, split, train_end, val_end, proposal, outliers)
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
    if outliers:
        warnings.append(outliers)
    bundle, history, enc = (fitter or fit)(frame, spec, split, cfg, log=log, progress=progress)
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
    # the typical transaction explanations replace fields with (engine/data/field_reference.py)
    bundle.meta[field_reference.CHECKPOINT_KEY] = field_reference.compute(
        bundle.encoder, frame[split == 0], training=True).to_dict()
    report = {"history": history, "wall_s": wall, "test": test_m, "validation": val_m, "thresholds": thresholds,
              "operating_point": op, "calibration": cal_report}
    if baseline is not None:
        log("baseline: LightGBM over causal per-entity features, same split and test rows")
        import lightgbm as lgb

        try:  # the comparison is a report: its failure never throws away the trained transformer
            cmp, pb = compare_with_baseline(frame, spec, split, test_rows, pt, baseline, seed=cfg.seed)
        except (ValueError, lgb.basic.LightGBMError) as e:
            report["baseline_error"] = f"{type(e).__name__}: {e}"
            log(f"warning: the LightGBM baseline could not be trained ({report['baseline_error'][:300]}); the "
                "model is saved without the comparison")
        else:
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
            f"{t['probability']['ece']:.4f}, " + (
                f"sum of probabilities / frauds {t['score']['sum_over_frauds']:.2f} -> "
                f"{t['probability']['sum_over_frauds']:.2f}" if t["score"]["sum_over_frauds"] is not None
                else "sum of probabilities / frauds: no test fraud"))
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
