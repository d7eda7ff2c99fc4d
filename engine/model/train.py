"""Training: time-based split, class-imbalance handling, early stopping on validation average
precision, test-period metrics, checkpoint.

Split (documented rule): rows are split by timestamp, never by entity or at random —
``train`` = before ``train_end``, ``validation`` = [``train_end``, ``val_end``), ``test`` = from
``val_end``. Without explicit dates the cut points are the 70 % and 85 % points of the time span,
rounded down to midnight. Feature statistics are fitted on training rows only. Earlier rows
of any period are visible as *history* (inputs, never labels), as they would be in production.

Imbalance: binary cross-entropy with ``pos_weight = min(sqrt(n_neg / n_pos), 30)`` on the
logit of every scored, labelled training-period transaction.

Threshold: the review threshold maximises F1 on the validation period; the decline threshold is
the lowest threshold whose validation precision is >= 0.8 (or the review threshold if none).
Test metrics are reported at the review threshold.
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
    precision_recall_curve,
    roc_auc_score,
)
from tqdm.auto import tqdm

from engine.data.features import EncodedFrame, FeatureEncoder
from engine.data.spec import DatasetSpec
from engine.model.baseline import BaselineConfig, TabularBaseline
from engine.model.checkpoint import ModelBundle, build_model
from engine.model.compare import paired_bootstrap
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


def binary_metrics(y: np.ndarray, p: np.ndarray, threshold: float | None = None) -> dict[str, float]:
    """AUC ROC, average precision and precision/recall/F1 at ``threshold`` (probabilities)."""
    y = np.asarray(y).astype(int)
    out: dict[str, float] = {"n": int(len(y)), "n_fraud": int(y.sum())}
    if 0 < y.sum() < len(y):
        out["auc_roc"] = float(roc_auc_score(y, p))
        out["average_precision"] = float(average_precision_score(y, p))
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


def choose_thresholds(y: np.ndarray, p: np.ndarray, min_precision: float = 0.8) -> dict[str, float]:
    """Review threshold = argmax F1; decline = lowest threshold with precision >= min_precision."""
    prec, rec, thr = precision_recall_curve(y, p)
    f1 = 2 * prec[:-1] * rec[:-1] / np.maximum(prec[:-1] + rec[:-1], 1e-12)
    review = float(thr[int(np.argmax(f1))]) if len(thr) else 0.5
    ok = np.flatnonzero(prec[:-1] >= min_precision)
    decline = float(thr[ok[0]]) if len(ok) else review
    return {"review": review, "decline": max(decline, review)}


@dataclass
class FitData:
    """What the training loop reads, built by :func:`prepare_fit` (deterministic: every
    data-parallel worker builds the same from the same frame).

    Attributes:
        encoder: fitted on the training rows. enc: the whole frame encoded (``N`` rows).
        ents: ``[N]`` entity ids. win / ent_start: windows and their entity starts
            (:mod:`engine.model.sequences`). safe: ``[W, T]`` row index per window slot (0 for
            padding). train_slot: ``[W, T]`` bool, slot carries a training loss. train_windows:
            windows with a training slot. last_slot: ``[W]`` last training slot per window.
        y_all: ``[N]`` float32 label (unknown = 0, masked out). label: ``[N]`` float64 with NaN.
        pos_weight: scalar tensor. val_rows: labelled validation rows. n_pos / n_neg: training
            frauds / legitimate transactions.
    """

    encoder: FeatureEncoder
    enc: EncodedFrame
    ents: np.ndarray
    win: Any
    ent_start: np.ndarray
    safe: np.ndarray
    train_slot: np.ndarray
    train_windows: np.ndarray
    last_slot: np.ndarray
    y_all: np.ndarray
    label: np.ndarray
    pos_weight: torch.Tensor
    val_rows: np.ndarray
    n_pos: int
    n_neg: int


def prepare_fit(frame: pd.DataFrame, spec: DatasetSpec, split: np.ndarray, cfg: TrainConfig) -> FitData:
    """Fit the feature statistics on the training rows and build the windows and loss masks
    (see :func:`fit` for the arguments).

    Raises:
        ValueError: no label column or no fraud among the training rows.
    """
    if "label" not in frame:
        raise ValueError("training needs a label column (spec [label])")
    label = frame["label"].to_numpy(dtype="float64", na_value=np.nan)
    known = ~np.isnan(label)
    n_pos = int(((split == 0) & known & (label == 1)).sum())
    n_neg = int(((split == 0) & known & (label == 0)).sum())
    if n_pos == 0:
        raise ValueError("training period has no fraud-labelled transaction")
    encoder = FeatureEncoder.fit(frame.loc[split == 0], spec)
    enc = encoder.transform(frame)
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
    return FitData(encoder=encoder, enc=enc, ents=ents, win=win, ent_start=ent_start, safe=safe,
                   train_slot=train_slot, train_windows=train_windows, last_slot=last_slot, y_all=y_all,
                   label=label, pos_weight=pos_weight, val_rows=np.flatnonzero((split == 1) & known),
                   n_pos=n_pos, n_neg=n_neg)


def new_model(encoder: FeatureEncoder, cfg: TrainConfig):
    """The untrained model of ``cfg`` for ``encoder`` (initialised from ``cfg.seed``)."""
    return build_model(
        encoder, seed=cfg.seed,
        **{k: getattr(cfg, k) for k in ("d_model", "n_heads", "n_layers", "d_ff", "dropout", "context_length", "min_history")},
    )


class DataParallel:
    """How one of ``world`` data-parallel workers takes part in :func:`run_epochs` (the process
    group, e.g. gloo, is set up by the caller, e.g. Ray Train; the model is wrapped in
    ``DistributedDataParallel``, which averages gradients over workers).

    Every worker draws the same batches (same seed); each runs the forward and backward pass of
    its share ``ids[rank::world]`` of every batch, with the loss scaled so that the averaged
    gradient is the gradient of the whole batch's mean loss (same steps and learning rate as one
    process). Worker 0 alone evaluates on the validation rows and decides early stopping and the
    time budget; its decision is broadcast (:meth:`agree`).
    """

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def agree(self, flag: bool) -> bool:
        """Worker 0's ``flag``, on every worker (a broadcast)."""
        t = torch.tensor([1 if flag else 0], dtype=torch.int64)
        torch.distributed.broadcast(t, src=0)
        return bool(t.item())

    def total(self, x: float) -> float:
        """Sum of ``x`` over the workers (an all-reduce)."""
        t = torch.tensor([x], dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return float(t.item())


def _batch_loss(model, d: FitData, ids: np.ndarray, dp: DataParallel | None) -> tuple[torch.Tensor, float]:
    """Loss to back-propagate for batch ``ids`` and the batch's mean loss (for the history)."""
    if dp is None:
        Tb = int(d.last_slot[ids].max()) + 1
        batch = make_batch(d.enc, d.win.rows[ids, :Tb], d.ent_start[ids])
        logits = model(batch).logits  # [b, Tb]
        m = torch.from_numpy(d.train_slot[ids, :Tb])
        y = torch.from_numpy(d.y_all[d.safe[ids, :Tb]])
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits[m], y[m], pos_weight=d.pos_weight)
        return loss, loss.item()
    n_all = int(d.train_slot[ids].sum())  # loss slots of the whole batch (every worker knows them)
    mine = ids[dp.rank :: dp.world]
    scale = 1.0
    if len(mine) == 0:  # fewer windows than workers: take part in the gradient average with weight 0
        mine, scale = ids[:1], 0.0
    Tb = int(d.last_slot[mine].max()) + 1
    batch = make_batch(d.enc, d.win.rows[mine, :Tb], d.ent_start[mine])
    logits = model(batch).logits
    m = torch.from_numpy(d.train_slot[mine, :Tb])
    y = torch.from_numpy(d.y_all[d.safe[mine, :Tb]])
    part = torch.nn.functional.binary_cross_entropy_with_logits(logits[m], y[m], pos_weight=d.pos_weight,
                                                                reduction="sum") * (scale / n_all)
    return part * dp.world, dp.total(part.item())


def run_epochs(model, d: FitData, cfg: TrainConfig, *, log: Callable[[str], None] = print, progress: bool = True,
               early_stopping: bool = True, stop_after: int | None = None, t_start: float | None = None,
               dp: DataParallel | None = None) -> tuple[list[dict[str, Any]], tuple]:
    """The training loop of :func:`fit` (see there): AdamW, gradient clipping at norm 1, the
    learning-rate schedule, validation AP after each epoch, early stopping, time budget.

    Args:
        model: the model to train (with ``dp``: wrapped in ``DistributedDataParallel``).
        dp: data-parallel worker (None: one process, the single-process path).
    Returns:
        ``(history, best)``; ``best = (val AP, state dict or None, epoch)`` (worker 0's with ``dp``).
    """
    t_start = time.perf_counter() if t_start is None else t_start
    core = getattr(model, "module", model)  # the model itself, not its DDP wrapper
    rank0 = dp is None or dp.rank == 0
    rng = np.random.default_rng(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    history: list[dict[str, Any]] = []
    best = (-1.0, None, -1)
    n_train = len(d.train_windows)
    per_epoch = n_train if cfg.windows_per_epoch is None else min(cfg.windows_per_epoch, n_train)
    if cfg.lr_schedule not in ("constant", "cosine"):
        raise ValueError(f"lr_schedule: expected 'constant' or 'cosine', got {cfg.lr_schedule!r}")
    total_steps = max(1, cfg.epochs * math.ceil(per_epoch / cfg.batch_size))
    step = 0
    for epoch in range(cfg.epochs):
        model.train()
        order = rng.choice(d.train_windows, size=per_epoch, replace=False)
        # similar lengths together: sort within chunks of 16 batches
        chunk = cfg.batch_size * 16
        order = np.concatenate([c[np.argsort(d.last_slot[c])] for c in np.array_split(order, max(1, len(order) // chunk))])
        batches = [order[i : i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
        rng.shuffle(batches)
        losses = []
        out_of_time = False
        bar = tqdm(batches, desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=not (progress and rank0), leave=False)
        for ids in bar:
            loss, value = _batch_loss(model, d, ids, dp)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if cfg.lr_schedule == "cosine":
                frac = min(step / total_steps, 1.0)
                for g in opt.param_groups:
                    g["lr"] = cfg.lr * (0.05 + 0.95 * 0.5 * (1.0 + math.cos(math.pi * frac)))
            opt.step()
            step += 1
            losses.append(value)
            if len(losses) % 20 == 0:
                bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}")
                out_of_time = (time.perf_counter() - t_start) / 60 >= cfg.max_minutes
                if dp is not None:
                    out_of_time = dp.agree(out_of_time)
                if out_of_time:
                    break  # time budget: evaluate this partial epoch, then stop
        rec: dict[str, Any] = {"epoch": epoch + 1, "loss": float(np.mean(losses)) if losses else float("nan")}
        if len(d.val_rows) and rank0:
            pv = sigmoid(score_encoded(core, d.enc, d.ents, rows=d.val_rows)[d.val_rows].astype(np.float64))
            rec.update({f"val_{k}": v for k, v in binary_metrics(d.label[d.val_rows], pv).items()})
        rec["minutes"] = (time.perf_counter() - t_start) / 60
        history.append(rec)
        if rank0:
            log(f"epoch {epoch + 1}: loss {rec['loss']:.4f}  val AP {rec.get('val_average_precision', float('nan')):.4f}  "
                f"val AUC {rec.get('val_auc_roc', float('nan')):.4f}  ({rec['minutes']:.1f} min)")
        stop = False
        if early_stopping and len(d.val_rows) and rank0:
            ap = rec.get("val_average_precision", 0.0)
            if ap > best[0]:
                best = (ap, {k: v.detach().clone() for k, v in core.state_dict().items()}, epoch + 1)
            elif epoch + 1 - best[2] >= cfg.patience:
                log(f"early stop: no validation AP gain for {cfg.patience} epochs")
                stop = True
        if dp is not None and early_stopping and len(d.val_rows):
            stop = dp.agree(stop)
        if stop:
            break
        if out_of_time:
            if rank0:
                log(f"time budget of {cfg.max_minutes} min reached")
            break
        if stop_after is not None and epoch + 1 >= stop_after:
            break
    return history, best


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
    d = prepare_fit(frame, spec, split, cfg)
    model = new_model(d.encoder, cfg)
    log(f"model: {model.n_parameters():,} parameters; windows: {d.win.n_windows:,} "
        f"({len(d.train_windows):,} with training rows); train frauds {d.n_pos:,}; pos_weight {d.pos_weight.item():.1f}")
    history, best = run_epochs(model, d, cfg, log=log, progress=progress, early_stopping=early_stopping,
                               stop_after=stop_after, t_start=t_start)
    return finish_fit(model, d, spec, cfg, history, best), history, d.enc


def finish_fit(model, d: FitData, spec: DatasetSpec, cfg: TrainConfig, history: list, best: tuple) -> ModelBundle:
    """The bundle of a finished loop: the best epoch's weights (if early stopping kept one), eval mode."""
    if best[1] is not None:
        model.load_state_dict(best[1])
    model.eval()
    meta = {"best_epoch": best[2] if best[1] is not None else len(history), "train_config": asdict(cfg), "history": history}
    return ModelBundle(model=model, encoder=d.encoder, spec=spec, meta=meta)


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
        labelled test rows) and ``test_probability`` (the model's on them; with ``baseline`` also
        ``baseline_test_probability``).
    Raises:
        ValueError: no label column, no fraud in the training period, or an empty period.
    """
    cfg = cfg or TrainConfig()
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
    bundle, history, enc = (fitter or fit)(frame, spec, split, cfg, log=log, progress=progress)
    label = frame["label"].to_numpy(dtype="float64", na_value=np.nan)
    known = ~np.isnan(label)
    val_rows = np.flatnonzero((split == 1) & known)
    test_rows = np.flatnonzero((split == 2) & known)
    ents = frame["entity_id"].to_numpy()
    both = np.concatenate([val_rows, test_rows])
    lg = score_encoded(bundle.model, enc, ents, rows=both).astype(np.float64)
    pv, pt = sigmoid(lg[val_rows]), sigmoid(lg[test_rows])
    thresholds = choose_thresholds(label[val_rows].astype(int), pv)
    test_m = binary_metrics(label[test_rows], pt, thresholds["review"])
    val_m = binary_metrics(label[val_rows], pv, thresholds["review"])
    wall = time.perf_counter() - t_start
    bundle.meta.update(
        metrics={"test": test_m, "validation": val_m},
        thresholds=thresholds,
        split={"train_end": str(train_end), "val_end": str(val_end), "rule": "time; see engine/model/train.py",
               "warnings": warnings,
               "proposed": {"train_end": str(proposal[0]), "val_end": str(proposal[1])} if proposal else None},
        train_wall_s=wall,
    )
    report = {"history": history, "wall_s": wall, "test": test_m, "validation": val_m, "thresholds": thresholds}
    if baseline is not None:
        log("baseline: LightGBM over causal per-entity features, same split and test rows")
        cmp, pb = compare_with_baseline(frame, spec, split, test_rows, pt, baseline, seed=cfg.seed)
        bundle.meta["baseline"] = report["baseline"] = cmp
        report["baseline_test_probability"] = pb
    report["test_rows"], report["test_probability"] = test_rows, pt
    return bundle, report


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
