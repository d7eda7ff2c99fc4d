"""Step versus centred isotonic calibration on one model: ties and ranking of the probabilities.

Scores a file with a checkpoint, fits on its validation period (the 70 % / 15 % / 15 % time split of
:func:`engine.model.train.time_split`) a plain isotonic map (:class:`sklearn.isotonic.IsotonicRegression`,
a step function) and the centred one fitted by :func:`engine.model.calibration.fit_calibration`
(``method="isotonic"``), and prints for the test period: average precision from the logits and from
each map's probabilities, distinct probability values, expected calibration error and Brier score.
A probe, not a verdict. Usage (repository root)::

    python bench/calibration_ties.py DATA SPEC [MODEL_DIR]
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("FRAUDLENS_DATA_DIR", "/tmp/fraudlens-calibration-ties")


def main(argv: list[str]) -> None:
    import numpy as np
    import torch
    from sklearn.isotonic import IsotonicRegression
    from sklearn.metrics import average_precision_score

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from engine.cases import view as cv
    from engine.model import calibration as cal
    from engine.model.train import time_split

    torch.set_num_threads(1)
    data, spec = argv[0], argv[1]
    model = argv[2] if len(argv) > 2 else None
    fr = cv.load_source(data, spec).frame
    b = cv.load_model(model)
    lg = cv.score_source(b, fr)["logit"].to_numpy(np.float64)
    split, _, _ = time_split(fr["timestamp"])
    y = fr["label"].to_numpy(dtype="float64", na_value=np.nan)
    va, te = (split == 1) & ~np.isnan(y), (split == 2) & ~np.isnan(y)
    ents = fr["entity_id"].astype(str).to_numpy()
    centred = cal.fit_calibration(lg[va], y[va], ents[va], method="isotonic")
    step = IsotonicRegression(y_min=0, y_max=1, out_of_bounds="clip").fit(lg[va], y[va])
    print(f"model {b.sha256[:12]}, data {os.path.basename(data)}: {int(va.sum()):,} validation and "
          f"{int(te.sum()):,} test transactions, {int(y[te].sum())} test frauds")
    print("| map | test AP | distinct test probabilities | ECE | Brier |")
    print("|---|---|---|---|---|")
    print(f"| none (logit) | {average_precision_score(y[te], lg[te]):.4f} | | | |")
    for name, p in (("step isotonic", step.predict(lg[te])), ("centred isotonic", cal.apply_calibration(centred, lg[te]))):
        print(f"| {name} | {average_precision_score(y[te], p):.4f} | {len(np.unique(p)):,} | "
              f"{cal.expected_calibration_error(y[te], p):.4f} | {np.mean((p - y[te]) ** 2):.5f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
