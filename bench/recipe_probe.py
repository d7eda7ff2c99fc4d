"""Recipe probe on the demo data: validation and test AP of one transformer training recipe.

One run = :func:`engine.model.train.fit` on ``demo_data/transactions.csv`` (spec ``demo``, the
70 % / 15 % / 15 % time split of :func:`engine.model.train.time_split`, 30 epochs at most,
patience 4, early stopping on validation AP, one torch thread), then the average precision and
AUC ROC of ``sigmoid(logit)`` on the labelled validation and test rows. It prints one JSON line:
``name``, ``seed``, the TrainConfig overrides, the spec edit, the data file's sha256 (12 hex), best / last epoch, minutes,
``val_ap``, ``val_auc``, ``test_ap``, ``test_auc``.

Usage (from the repository root; FRAUDLENS_DATA_DIR set to a scratch folder)::

    python bench/recipe_probe.py NAME SEED ['{"batch_size": 16}'] ['{"drop": ["merchant"], "buckets": {"zip": 64}}']
    python bench/recipe_probe.py novelty3 0 '{}' '{"novelty": ["merchant", "merchant_city", "zip"]}'

``PROBE_DATA`` and ``PROBE_SPEC`` (environment) run it on another file and spec (default the demo
file and spec ``demo``), e.g. ``PROBE_DATA=../shared/data/banksim/... PROBE_SPEC=banksim``.

The third argument overrides TrainConfig fields; the fourth edits the spec: ``drop`` turns fields
into passthrough columns (so they are no model input; they are also removed from ``link_points``),
``buckets`` sets ``hashed_buckets`` of fields, ``novelty`` sets ``embed = false`` (novelty only: the
field feeds ``first_seen`` but gets no identity embedding), ``embed`` sets ``embed = true``. A probe, not a benchmark with a verdict: choose a
recipe on ``val_ap`` over 3+ seeds, never on ``test_ap``. Results of the 2026-12-01 session are in
bench/results/recipe_probe.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

os.environ.setdefault("FRAUDLENS_DATA_DIR", "/tmp/fraudlens-recipe-probe")


def main(argv: list[str]) -> dict:
    import numpy as np
    import torch
    from sklearn.metrics import average_precision_score, roc_auc_score

    from engine.data.io import read_transactions
    from engine.data.spec import DatasetSpec, load_spec
    from engine.model.scoring import score_encoded, sigmoid
    from engine.model.train import TrainConfig, fit, time_split

    torch.set_num_threads(1)
    name, seed = argv[0], int(argv[1])
    over = json.loads(argv[2]) if len(argv) > 2 else {}
    specmod = json.loads(argv[3]) if len(argv) > 3 else {}
    data = os.environ.get("PROBE_DATA", "demo_data/transactions.csv")
    spec = load_spec(os.environ.get("PROBE_SPEC", "demo"))
    if specmod:
        d = spec.model_dump(mode="json")
        drop = set(specmod.get("drop", []))
        d["passthrough"] = d["passthrough"] + [f["column"] for f in d["fields"] if f["name"] in drop]
        d["fields"] = [f for f in d["fields"] if f["name"] not in drop]
        d["link_points"] = [x for x in d.get("link_points", []) if x not in drop]
        for f in d["fields"]:
            if f["name"] in specmod.get("novelty", []):
                f["embed"] = False
            if f["name"] in specmod.get("embed", []):
                f["embed"] = True
            if f["name"] in specmod.get("buckets", {}):
                f["hashed_buckets"] = specmod["buckets"][f["name"]]
        spec = DatasetSpec.model_validate(d)
    sha = hashlib.sha256(open(data, "rb").read()).hexdigest()
    fr = read_transactions(data, spec).frame
    split, _, _ = time_split(fr["timestamp"])
    y = fr["label"].to_numpy(dtype="float64", na_value=np.nan)
    cfg = TrainConfig(**{"epochs": 30, "patience": 4, "max_minutes": 20.0, "seed": seed, "members": 1, **over})
    t = time.perf_counter()
    bundle, hist, enc = fit(fr, spec, split, cfg, log=lambda m: None, progress=False)
    p = sigmoid(score_encoded(bundle.model, enc, fr["entity_id"].to_numpy()).astype(np.float64))
    out = {"name": name, "data": os.path.basename(data), "seed": seed, "over": over, "spec": specmod, "data_sha256": sha[:12],
           "best_epoch": bundle.meta["best_epoch"],
           "epochs": len(hist), "min": round((time.perf_counter() - t) / 60, 1)}
    for key, s in (("val", 1), ("test", 2)):
        m = (split == s) & ~np.isnan(y)
        out[f"{key}_ap"] = round(float(average_precision_score(y[m], p[m])), 4)
        out[f"{key}_auc"] = round(float(roc_auc_score(y[m], p[m])), 4)
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
