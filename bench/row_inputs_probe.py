"""Is the transformer's gap to LightGBM in its inputs or in its learner? A probe on one file.

It rebuilds, for every transaction, the per-row inputs the transformer's row encoder reads at the
position where the transaction is scored (``engine.model.train_loop.prepare_fit`` windows): the
encoded ``num`` / ``cat`` / ``multi`` columns, ``log1p(minutes since the previous transaction)``, the
amount versus the window's earlier mean, and the raw ``recent_activity`` / ``first_seen`` inputs
(:func:`engine.model.activity.activity_inputs`, default windows). Then it fits, on the training
rows of the 70 % / 85 % time split, early-stopped on validation AP:

* LightGBM over those per-row inputs (no attention: each row alone);
* a two-layer MLP over the same inputs, standardised, with and without quantile piecewise-linear
  codes (16 bins per input fitted on the training rows; Gorishniy et al. 2022, arXiv:2203.05556);

and prints validation / test average precision next to the built-in LightGBM baseline
(:class:`engine.model.baseline.TabularBaseline`, features over each entity's whole history).
If LightGBM on the per-row inputs comes close to the baseline while the transformer does not, the
information is in the inputs and the gap is in how the network learns from them. A probe, not a
benchmark with a verdict. Usage (repository root; FRAUDLENS_DATA_DIR set to a scratch folder)::

    python bench/row_inputs_probe.py demo demo_data/transactions.csv

2026-12-02 result on the demo file: bench/results/recipe_probe.md, section "Inputs or learner?". Caveat: the
categorical codes enter the MLP as standardised numbers (no embedding), which handicaps it against LightGBM,
which can split on them; the MLP is not early-stopped either (40 epochs, the epoch with the best validation AP
is reported).
"""

from __future__ import annotations

import math
import os
import sys

os.environ.setdefault("FRAUDLENS_DATA_DIR", "/tmp/fraudlens-row-inputs-probe")


def row_inputs(spec_name: str, path: str):
    """``(feats [N, K] float32 with NaN for "none", label [N] float64, split [N], frame, spec)``."""
    import numpy as np
    import torch

    from engine.data.io import read_transactions
    from engine.data.spec import load_spec
    from engine.model.activity import DEFAULT_ACTIVITY_WINDOWS_S, activity_inputs
    from engine.model.sequences import make_batch
    from engine.model.train import TrainConfig, time_split
    from engine.model.train_loop import new_model, prepare_fit
    from engine.model.transformer import amount_vs_history, time_since_previous

    spec = load_spec(spec_name)
    fr = read_transactions(path, spec).frame
    split, _, _ = time_split(fr["timestamp"])
    cfg = TrainConfig(members=1)
    d = prepare_fit(fr, spec, split, cfg)
    cols = torch.tensor(new_model(d.encoder, cfg).cfg.first_seen_cols, dtype=torch.int64)
    N, W = len(fr), d.win.n_windows
    feats = None
    for s in range(0, W, 256):
        ids = np.arange(s, min(W, s + 256))
        b = make_batch(d.enc, d.win.rows[ids], d.ent_start[ids])
        rec, seen = activity_inputs(b.time_s, b.present, b.num[..., 0], b.cat.index_select(-1, cols),
                                    DEFAULT_ACTIVITY_WINDOWS_S)
        gap, has_prev = time_since_previous(b.time_s, b.present, b.prev_time_s)
        dev, has_hist = amount_vs_history(b.num[..., 0], b.present)
        dev = dev.masked_fill(~has_hist, float("nan"))
        log_gap = torch.log1p(gap / 60).float().masked_fill(~has_prev, float("nan")).unsqueeze(-1)
        x = torch.cat([b.num, b.cat.float(), b.multi, log_gap, dev.unsqueeze(-1), rec, seen], -1).numpy()
        if feats is None:
            feats = np.full((N, x.shape[-1]), np.nan, np.float32)
        rows = d.win.rows[ids]
        scored = (np.arange(rows.shape[1])[None] >= d.win.scored_from[ids][:, None]) & (rows >= 0)
        feats[rows[scored]] = x[scored]
    return feats, d.label, split, fr, spec


def main(argv: list[str]) -> None:
    import lightgbm as lgb
    import numpy as np
    import torch
    from sklearn.metrics import average_precision_score as ap

    from engine.model.baseline import BaselineConfig, TabularBaseline

    torch.set_num_threads(1)
    feats, y, split, fr, spec = row_inputs(argv[0], argv[1])
    known = ~np.isnan(y)
    tr, va, te = (split == 0) & known, (split == 1) & known, (split == 2) & known
    pw = min(math.sqrt((y[tr] == 0).sum() / y[tr].sum()), 30.0)
    bc = BaselineConfig()  # the built-in baseline's LightGBM settings, so only the inputs differ
    params = {"objective": "binary", "learning_rate": bc.learning_rate, "num_leaves": bc.num_leaves,
              "min_child_samples": bc.min_child_samples, "feature_fraction": bc.feature_fraction,
              "feature_fraction_seed": bc.seed, "seed": bc.seed, "deterministic": True, "scale_pos_weight": pw,
              "verbose": -1, "metric": "average_precision"}
    dt = lgb.Dataset(feats[tr], y[tr])
    bst = lgb.train(params, dt, bc.n_estimators, valid_sets=[lgb.Dataset(feats[va], y[va], reference=dt)],
                    callbacks=[lgb.early_stopping(bc.early_stopping_rounds, verbose=False)])
    g = bst.predict(feats, num_iteration=bst.best_iteration)
    print(f"LightGBM on the per-row inputs: val AP {ap(y[va], g[va]):.4f}  test AP {ap(y[te], g[te]):.4f}")
    for ple in (False, True):
        for seed in (0, 1):
            v, t = _mlp(feats, y, tr, va, te, pw, ple, seed)
            print(f"MLP on the per-row inputs (quantile codes {ple}), seed {seed}: best val AP {v:.4f}  test AP {t:.4f}")
    rows = np.flatnonzero(va | te)
    _, pb = TabularBaseline.fit_predict(fr, spec, split, rows, bc)
    pv, pt = pb[va[rows]], pb[te[rows]]
    print(f"built-in LightGBM baseline (whole-history features): val AP {ap(y[va], pv):.4f}  test AP {ap(y[te], pt):.4f}")


def _mlp(feats, y, tr, va, te, pw: float, ple: bool, seed: int, epochs: int = 40) -> tuple[float, float]:
    """Best validation AP over ``epochs`` and the test AP of that epoch, of a 2 x 128 ReLU MLP."""
    import numpy as np
    import torch
    from sklearn.metrics import average_precision_score as ap

    X = feats.copy()
    nan = np.isnan(X)
    X[nan] = 0
    parts = [(X - X[tr].mean(0)) / (X[tr].std(0) + 1e-6), nan[:, nan[tr].any(0)].astype(np.float32)]
    if ple:
        for j in range(X.shape[1]):
            q = np.unique(np.quantile(X[tr, j], np.linspace(0, 1, 17)))
            if len(q) > 2:
                parts.append(np.clip((X[:, j : j + 1] - q[:-1]) / (q[1:] - q[:-1]), 0, 1).astype(np.float32))
    Xt = torch.tensor(np.concatenate(parts, 1), dtype=torch.float32)
    Y = torch.tensor(np.nan_to_num(y), dtype=torch.float32)
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(Xt.shape[1], 128), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                              torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
    opt = torch.optim.AdamW(net.parameters(), 1e-3, weight_decay=1e-4)
    rows, best = np.flatnonzero(tr), (0.0, 0.0)
    for ep in range(epochs):
        net.train()
        np.random.default_rng(ep + 100 * seed).shuffle(rows)
        for i in range(0, len(rows), 256):
            b = rows[i : i + 256]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(net(Xt[b]).squeeze(-1), Y[b],
                                                                        pos_weight=torch.tensor(pw))
            opt.zero_grad()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            out = net(Xt).squeeze(-1).numpy()
        if ap(y[va], out[va]) > best[0]:
            best = (ap(y[va], out[va]), ap(y[te], out[te]))
    return best


if __name__ == "__main__":
    main(sys.argv[1:])
