"""The training loop of :func:`engine.model.train.fit`, in pieces a data-parallel worker can
run too (:mod:`engine.distributed.ray_train`): :func:`prepare_fit` (feature statistics, windows,
loss masks), :func:`new_model`, :func:`run_epochs` (AdamW, clipping, schedule, validation AP,
early stopping, time budget; with an optional :class:`DataParallel` hook) and :func:`finish_fit`.
With no hook the computation is exactly the single-process one.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from engine.data.features import EncodedFrame, FeatureEncoder
from engine.data.spec import DatasetSpec
from engine.model.checkpoint import ModelBundle, build_model
from engine.model.scoring import score_encoded, sigmoid
from engine.model.sequences import build_windows, make_batch, window_entity_start

if TYPE_CHECKING:
    from engine.model.train import TrainConfig


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
    encoder = FeatureEncoder.fit(frame.loc[split == 0], spec, amount_by_value=getattr(cfg, "amount_by_value", False))
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
        encoder, seed=cfg.seed, activity=cfg.activity,
        **{k: getattr(cfg, k) for k in ("d_model", "n_heads", "n_layers", "d_ff", "dropout", "context_length", "min_history")},
        **({"activity_ple": True} if cfg.activity and getattr(cfg, "activity_ple", False) else {}),
        **({"row_ff": cfg.row_ff} if getattr(cfg, "row_ff", 0) else {}),
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
    from engine.model.train import binary_metrics  # engine.model.train imports this module

    t_start = time.perf_counter() if t_start is None else t_start
    core = getattr(model, "module", model)  # the model itself, not its DDP wrapper
    rank0 = dp is None or dp.rank == 0
    rng = np.random.default_rng(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    history: list[dict[str, Any]] = []
    best = (-1.0, None, -1)
    n_train = len(d.train_windows)
    per_epoch = n_train if cfg.windows_per_epoch is None else (
        cfg.windows_per_epoch if getattr(cfg, "fill_epoch", False) else min(cfg.windows_per_epoch, n_train))
    if cfg.lr_schedule not in ("constant", "cosine"):
        raise ValueError(f"lr_schedule: expected 'constant' or 'cosine', got {cfg.lr_schedule!r}")
    bs = effective_batch_size(cfg.batch_size, per_epoch, getattr(cfg, "min_steps_per_epoch", 0))
    if bs != cfg.batch_size and rank0:
        log(f"batch size {bs} (not {cfg.batch_size}): {per_epoch} training windows per epoch give at least "
            f"{cfg.min_steps_per_epoch} optimisation steps")
    total_steps = max(1, cfg.epochs * math.ceil(per_epoch / bs))
    step = 0
    ema = _Ema(core, getattr(cfg, "ema_epochs", 0.0), math.ceil(per_epoch / bs))
    last_state = None
    for epoch in range(cfg.epochs):
        model.train()
        order = rng.choice(d.train_windows, size=per_epoch, replace=per_epoch > n_train)
        # similar lengths together: sort within chunks of 16 batches
        chunk = bs * 16
        order = np.concatenate([c[np.argsort(d.last_slot[c])] for c in np.array_split(order, max(1, len(order) // chunk))])
        batches = [order[i : i + bs] for i in range(0, len(order), bs)]
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
            ema.update()
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
        ema.swap()  # evaluate (and keep) the averaged weights; the optimiser's own come back below
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
        if ema.active and best[1] is None:  # no kept epoch (no early stopping): the averaged weights of this one
            last_state = {k: v.detach().clone() for k, v in core.state_dict().items()}
        ema.swap()
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
    if ema.active and best[1] is None:  # no early stopping: the averaged weights of the last epoch
        best = (-1.0, last_state, len(history))
    return history, best


#: the smallest batch :func:`effective_batch_size` goes down to (windows)
MIN_AUTO_BATCH = 8


def effective_batch_size(batch_size: int, windows_per_epoch: int, min_steps: int) -> int:
    """Windows per optimisation step: ``batch_size``, lowered (not below :data:`MIN_AUTO_BATCH`)
    until an epoch of ``windows_per_epoch`` windows takes at least ``min_steps`` steps.

    A small file has few windows (the demo data: 669, 11 steps per epoch at 64), so early
    stopping at epoch 5-9 would keep a model that took about 80 steps. ``min_steps <= 0`` keeps
    ``batch_size``. Large files are unaffected (the Handbook's 6,000 windows per epoch give 94
    steps at 64)."""
    if min_steps <= 0 or windows_per_epoch <= 0:
        return batch_size
    return max(min(batch_size, MIN_AUTO_BATCH), min(batch_size, windows_per_epoch // min_steps))


class _Ema:
    """Exponential moving average of the weights (Polyak & Juditsky 1992; the "EMA" of Izmailov
    et al., "Averaging Weights Leads to Wider Optima and Better Generalization", UAI 2018,
    arXiv:1803.05407), with a half-life in epochs: ``decay = 0.5 ** (1 / (half_life * steps_per_epoch))``
    per optimiser step, so the same setting means the same averaging on a small and a large file.

    Bias-corrected as Adam's moments (Kingma & Ba, "Adam", ICLR 2015, section 3): after ``t``
    updates with weights ``w_1 .. w_t`` the average is
    ``sum_i decay**(t - i) * (1 - decay) * w_i / (1 - decay**t)``, a weighted mean of the weights
    seen so far in which the initial (random) weights have no share; computed as a running
    ``lerp(avg, w_t, (1 - decay) / (1 - decay**t))`` (weight 1 at the first update). Without the
    correction a run that ends after 3 half-lives keeps 1/8 of its initial weights.
    Validation and the kept checkpoint use the averaged weights; ``half_life <= 0`` turns it off
    (every method is then a no-op)."""

    def __init__(self, model, half_life_epochs: float, steps_per_epoch: int):
        self.active = half_life_epochs > 0
        if not self.active:
            return
        self.params = [p for p in model.parameters()]
        self.avg = [p.detach().clone() for p in self.params]
        self.decay = 0.5 ** (1.0 / max(1.0, half_life_epochs * steps_per_epoch))
        self.updates = 0

    def update(self) -> None:
        if self.active:
            self.updates += 1
            weight = (1.0 - self.decay) / (1.0 - self.decay ** self.updates)  # bias correction (class doc)
            with torch.no_grad():
                torch._foreach_lerp_(self.avg, [p.detach() for p in self.params], weight)

    def swap(self) -> None:
        """Exchange the model's weights with the averaged ones (call twice to restore)."""
        if self.active:
            with torch.no_grad():
                for p, a in zip(self.params, self.avg):
                    tmp = p.detach().clone()
                    p.copy_(a)
                    a.copy_(tmp)


def finish_fit(model, d: FitData, spec: DatasetSpec, cfg: TrainConfig, history: list, best: tuple) -> ModelBundle:
    """The bundle of a finished loop: the best epoch's weights (if early stopping kept one), eval mode."""
    if best[1] is not None:
        model.load_state_dict(best[1])
    model.eval()
    meta = {"best_epoch": best[2] if best[1] is not None else len(history), "train_config": asdict(cfg), "history": history}
    return ModelBundle(model=model, encoder=d.encoder, spec=spec, meta=meta)
