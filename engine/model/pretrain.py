"""Self-supervised pretraining of the sequence transformer: next-transaction prediction.

Before the fraud objective, the transformer learns to predict each entity's *next* transaction
from its history, on the training period's rows, without labels: from the hidden state of
position ``t`` (which sees transactions ``<= t``), heads predict transaction ``t + 1``'s
embedded categorical values (cross-entropy per column), its standardised numeric values (Huber)
and the log of the minutes until it (Huber). The heads are then dropped and the whole model is
fine-tuned on the fraud label as without pretraining (:func:`engine.model.train_loop.run_epochs`).
This is the pretraining of the payments foundation models that read transaction sequences:
TabBERT (Padhi et al., "Tabular Transformers for Modeling Multivariate Time Series", ICASSP
2021, arXiv:2011.01843) masks fields; Nubank's nuFormer ("Building a foundation model for
financial transactions", 2024) and Stripe's payments model predict the next transaction, which
suits a causal model: every position is a training example and nothing is masked.

The prediction targets are the training period's transactions and every transaction before the
training period (history without a training label, :func:`pretraining_targets`), never a
validation or test transaction or anything after the training period: those stay unseen until
they are scored, as without pretraining. Novelty-only columns (``embed = false``: hashed ids
compared for equality) are not predicted.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as Fnn

from engine.model.config import ModelConfig
from engine.model.sequences import TransactionBatch, make_batch

__all__ = ["NextTransactionHeads", "pretrain_next_transaction", "pretraining_targets", "hidden_states"]

#: standardised numeric targets are clipped to +- this (a few extreme values must not dominate)
NUM_TARGET_CLIP = 5.0


def pretraining_targets(split: np.ndarray, time_s: np.ndarray) -> np.ndarray:
    """``[N]`` bool: the rows pretraining may predict: training rows (split 0) and every row
    earlier than the first training row (the history before the training period; in the
    Handbook protocol the months before a fold's training week). Validation rows, test rows and
    anything at or after the training period's start that is not a training row are excluded.

    Args:
        split: ``[N]`` int per row (0 = training; see :func:`engine.model.train.fit`).
        time_s: ``[N]`` float64 seconds of each row.
    Raises:
        ValueError: no training row.
    """
    train = np.asarray(split) == 0
    if not train.any():
        raise ValueError("pretraining: no training row (split 0)")
    return train | (np.asarray(time_s) < np.asarray(time_s)[train].min())


def hidden_states(model, batch: TransactionBatch) -> torch.Tensor:
    """The transformer's output before the fraud head: ``[B, T] batch -> [B, T, D]`` float32
    (after the final LayerNorm; position ``t`` sees transactions ``<= t`` only)."""
    x = model.input_layer(model.rows.summed(batch))  # [B, T, D]
    allowed, log_gap = model.attention_mask(batch.present, batch.time_s)
    for blk in model.blocks:
        x, _ = blk(x, allowed, log_gap)
    return model.ln_out(x)


class NextTransactionHeads(nn.Module):
    """Prediction heads for the next transaction's fields, from a ``[.., D]`` hidden state.

    Args:
        cfg: the model's config: one head per embedded categorical column (``cat_cardinalities[j]``
            classes; novelty-only columns and single-value columns are skipped), one linear map to
            the ``Fn`` numeric columns, one to the log gap.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        D, skip = cfg.d_model, set(cfg.novelty_only_cols)
        self.cat_cols = [j for j, c in enumerate(cfg.cat_cardinalities) if j not in skip and c > 1]
        self.cat_heads = nn.ModuleList([nn.Linear(D, cfg.cat_cardinalities[j]) for j in self.cat_cols])
        self.n_num = len(cfg.num_field_index)
        self.num_head = nn.Linear(D, self.n_num) if self.n_num else None
        self.gap_head = nn.Linear(D, 1)

    def loss(self, h: torch.Tensor, batch: TransactionBatch, target: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Mean loss of predicting transaction ``t + 1`` from ``h[:, t]``.

        Args:
            h: ``[B, T, D]`` hidden states. batch: the ``[B, T]`` histories they came from.
            target: ``[B, T]`` bool, transaction ``t`` is a prediction target (present, and
                ``t - 1`` present); column 0 is never one.
        Returns:
            ``(loss, parts)``: the sum of the mean categorical cross-entropy (nats, averaged over
            the predicted columns), the numeric Huber loss and the gap Huber loss; ``parts`` their
            float values.
        """
        src = h[:, :-1][target[:, 1:]]  # [P, D] states of the positions whose next row is a target
        parts: dict[str, float] = {}
        total = src.new_zeros(())
        if self.cat_cols:
            cat = batch.cat[:, 1:][target[:, 1:]]  # [P, Fc]
            ce = torch.stack([Fnn.cross_entropy(head(src), cat[:, j]) for j, head in zip(self.cat_cols, self.cat_heads)])
            total = total + ce.mean()
            parts["categorical"] = float(ce.mean().detach())
        if self.num_head is not None:
            num = batch.num[:, 1:][target[:, 1:]].nan_to_num(0.0).clamp(-NUM_TARGET_CLIP, NUM_TARGET_CLIP)  # [P, Fn]
            nl = Fnn.huber_loss(self.num_head(src), num)
            total = total + nl
            parts["numeric"] = float(nl.detach())
        gap_min = ((batch.time_s[:, 1:] - batch.time_s[:, :-1])[target[:, 1:]]).float().clamp(min=0) / 60.0
        gl = Fnn.huber_loss(self.gap_head(src).squeeze(-1), torch.log1p(gap_min))
        parts["gap"] = float(gl.detach())
        return total + gl, parts


def pretrain_next_transaction(model, enc, win, ent_start: np.ndarray, targets: np.ndarray, *, minutes: float,
                              lr: float, batch_size: int, seed: int, weight_decay: float = 1e-4,
                              max_epochs: int = 20, log: Callable[[str], None] = print,
                              heads: NextTransactionHeads | None = None) -> list[dict]:
    """Pretrain ``model`` in place on next-transaction prediction (module docstring).

    Args:
        model: a :class:`~engine.model.transformer.FraudTransformer` (its fraud head is untouched).
        enc: the encoded frame (``N`` rows). win / ent_start: the windows of
            :func:`engine.model.sequences.build_windows` and their entity starts.
        targets: ``[N]`` bool, the rows that may be predicted (:func:`pretraining_targets`); a
            batch holds no row after its windows' last target.
        minutes: wall-time budget (checked after every step). lr / weight_decay: AdamW.
        batch_size: windows per step. seed: window order. max_epochs: passes over the windows.
        heads: the prediction heads to train (default: new ones, dropped afterwards).
    Returns:
        One record per epoch: ``epoch``, ``loss`` (mean over its steps) and its parts, ``minutes``.
    Raises:
        ValueError: ``minutes`` is not positive or no window has a target.
    """
    if not minutes > 0:
        raise ValueError(f"minutes: expected a positive budget, got {minutes!r}")
    t0 = time.perf_counter()
    rows = win.rows  # [W, T], -1 = padding
    valid = rows >= 0
    in_train = valid & np.asarray(targets, dtype=bool)[np.where(valid, rows, 0)]
    target = np.zeros_like(in_train)
    target[:, 1:] = in_train[:, 1:] & valid[:, :-1]
    windows = np.flatnonzero(target.any(axis=1))
    if not len(windows):
        raise ValueError("pretraining: no window has two consecutive transactions to predict")
    last = rows.shape[1] - 1 - np.argmax(target[:, ::-1], axis=1)  # [W] last target slot
    if heads is None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 7919)
            heads = NextTransactionHeads(model.cfg)
    params = list(model.parameters()) + list(heads.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    rng = np.random.default_rng(seed + 7919)
    history: list[dict] = []
    model.train()
    heads.train()
    for epoch in range(max_epochs):
        order = rng.permutation(windows)
        losses, parts_sum = [], {}
        out = False
        for i in range(0, len(order), batch_size):
            ids = order[i : i + batch_size]
            Tb = int(last[ids].max()) + 1
            r = rows[ids, :Tb].copy()
            r[np.arange(Tb)[None, :] > last[ids][:, None]] = -1  # rows after a window's last target: never read
            batch = make_batch(enc, r, ent_start[ids])
            loss, parts = heads.loss(hidden_states(model, batch), batch, torch.from_numpy(target[ids, :Tb]))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            losses.append(float(loss.detach()))
            for k, v in parts.items():
                parts_sum[k] = parts_sum.get(k, 0.0) + v
            if (time.perf_counter() - t0) / 60 >= minutes:
                out = True
                break
        rec = {"epoch": epoch + 1, "loss": float(np.mean(losses)) if losses else math.nan,
               **{k: v / max(1, len(losses)) for k, v in parts_sum.items()}, "minutes": (time.perf_counter() - t0) / 60}
        history.append(rec)
        log(f"pretrain epoch {epoch + 1}: next-transaction loss {rec['loss']:.4f} ("
            + ", ".join(f"{k} {rec[k]:.3f}" for k in parts_sum) + f"; {rec['minutes']:.1f} min)")
        if out:
            break
    return history
