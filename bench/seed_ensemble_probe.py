"""Seed-ensemble probe: validation and test AP of K seeds of one training recipe, each alone and
averaged (mean probability, mean logit), on one file.

One run trains ``engine.model.train.fit`` once per seed (TrainConfig defaults plus the JSON
overrides; 20-minute budget per seed; one torch thread) on the 70 % / 15 % / 15 % time split of
:func:`engine.model.train.time_split`, scores every row with ``sigmoid(logit)`` and prints one
line per seed and per average. The logits are saved to ``$FRAUDLENS_PROBE_OUT/TAG.npz`` (default
``/tmp/fraudlens-recipe-probe``). A probe, not a
benchmark with a verdict: choose on validation AP, never on test. Results:
bench/results/recipe_probe.md ("Amount by value, row feed-forward layer and seed ensembles").

Usage (repository root; FRAUDLENS_DATA_DIR set to a scratch folder)::

    python bench/seed_ensemble_probe.py demo_data/transactions.csv demo TAG 0,1,2,3,4 ['{"row_ff": 0}']
    python bench/seed_ensemble_probe.py ../shared/data/banksim/banksim_sample.csv banksim TAG 0,1,2,3,4
"""
import os, sys, json, time
os.environ.setdefault("FRAUDLENS_DATA_DIR", "/tmp/fraudlens-recipe-probe")
import numpy as np, torch
from sklearn.metrics import average_precision_score as aps, roc_auc_score as auc
from engine.data.io import read_transactions
from engine.data.spec import load_spec
from engine.model.scoring import score_encoded, sigmoid
from engine.model.train import TrainConfig, fit, time_split
torch.set_num_threads(1)
data, specname, tag = sys.argv[1], sys.argv[2], sys.argv[3]
seeds = [int(s) for s in sys.argv[4].split(",")]
over = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
spec = load_spec(specname)
fr = read_transactions(data, spec).frame
split, _, _ = time_split(fr["timestamp"])
y = fr["label"].to_numpy(dtype="float64", na_value=np.nan)
out = {}
for s in seeds:
    t = time.perf_counter()
    cfg = TrainConfig(**{"seed": s, "max_minutes": 20.0, "members": 1, **over})  # one transformer per seed
    b, h, enc = fit(fr, spec, split, cfg, log=lambda m: None, progress=False)
    lg = score_encoded(b.model, enc, fr["entity_id"].to_numpy()).astype(np.float64)
    out[f"logit{s}"] = lg
    print(tag, "seed", s, "best", b.meta["best_epoch"], "min", round((time.perf_counter()-t)/60, 2), flush=True)
probe_out = os.environ.get("FRAUDLENS_PROBE_OUT", "/tmp/fraudlens-recipe-probe")
os.makedirs(probe_out, exist_ok=True)
np.savez(os.path.join(probe_out, f"{tag}.npz"), split=split, y=y, **out)
m1 = (split == 1) & ~np.isnan(y); m2 = (split == 2) & ~np.isnan(y)
for s in seeds:
    p = sigmoid(out[f"logit{s}"])
    print(tag, s, "val", round(aps(y[m1], p[m1]), 4), "test", round(aps(y[m2], p[m2]), 4), round(auc(y[m2], p[m2]), 4))
P = np.mean([sigmoid(out[f"logit{s}"]) for s in seeds], axis=0)
L = sigmoid(np.mean([out[f"logit{s}"] for s in seeds], axis=0))
for nm, p in (("meanprob", P), ("meanlogit", L)):
    print(tag, nm, "val", round(aps(y[m1], p[m1]), 4), "test", round(aps(y[m2], p[m2]), 4), round(auc(y[m2], p[m2]), 4))
