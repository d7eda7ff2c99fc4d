"""LightGBM with every input the transformer gets, on the Handbook protocol (the equally informed GBT).

The GBT of :mod:`engine.bench.gbt` reads the Handbook's 15 Chapter 3.3 features only. The
transformer also reads the delayed terminal label history of the ``handbook`` spec (five
aggregate columns: fraud rate and count over 1/7/30 days ending 7 days before, fraud run length
and age), the amount against the customer's history, the time since the previous transactions
and, inside its row encoder, per-customer counts, amount deviations and first-seen flags
(:mod:`engine.model.activity`). This bench gives LightGBM all of that: the 15 book features
**plus** every input of :class:`engine.model.baseline.TabularBaseline` (causal per-entity
features of :func:`engine.data.entity_features.causal_entity_features`, the amount and its log,
the spec's numeric / categorical / multi-valued model inputs and every aggregate column), all
causal (no row sees a later row or an undelayed label). Hyper-parameters are chosen on the 4
validation folds with the same grid as :mod:`engine.bench.gbt`, then evaluated on the 4 test folds.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from engine.bench.gbt import METRICS, evaluate_gbt, summarize, tune_gbt
from engine.bench.handbook_features import INPUT_FEATURES, load_handbook_dataset
from engine.data.io import read_transactions
from engine.data.spec import FieldKind, load_spec
from engine.model.baseline import BaselineConfig, TabularBaseline

PREFIX = "ti_"


def same_inputs_dataset(path: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """The Handbook dataset of :func:`load_handbook_dataset` joined (by ``TRANSACTION_ID``) with the
    transformer's inputs; returns ``(frame, feature names)`` (the 15 book features first).

    Raises:
        ValueError: the spec has categorical or multi-valued model inputs (their vocabularies
            would have to be fitted per fold; the ``handbook`` spec has none).
    """
    spec = load_spec("handbook")
    if spec.fields_of(FieldKind.CATEGORICAL, model_inputs_only=True) or \
            spec.fields_of(FieldKind.MULTI_VALUED, model_inputs_only=True):
        raise ValueError("same_inputs_dataset: categorical / multi-valued model inputs need per-fold vocabularies")
    raw = load_handbook_dataset(path)
    frame = read_transactions(path, spec).frame
    x = TabularBaseline(spec=spec, config=BaselineConfig())._inputs(frame)
    x.columns = [PREFIX + c for c in x.columns]
    x.index = frame["transaction_id"].astype(str).to_numpy()
    joined = x.reindex(raw["TRANSACTION_ID"].astype(str).to_numpy())
    if joined.isna().all(axis=1).any():
        raise ValueError("same_inputs_dataset: a Handbook transaction has no canonical row")
    joined.index = raw.index
    feats = list(INPUT_FEATURES) + list(x.columns)
    return pd.concat([raw, joined.astype("float64")], axis=1), feats


def run(path: str | Path, grid: Mapping[str, Sequence] | None = None, num_threads: int = 2,
        log=print) -> pd.DataFrame:
    """Tune on the validation folds, evaluate on the test folds; returns the per-fold frame
    (``.attrs``: ``best_params``, ``features``, ``summary``, ``seconds``)."""
    t0 = time.perf_counter()
    df, feats = same_inputs_dataset(path)
    log(f"same-inputs features: {len(feats)} columns over {len(df):,} rows ({time.perf_counter() - t0:.0f} s)")
    best, _ = tune_gbt(df, grid=grid, num_threads=num_threads, features=feats)
    per_fold = evaluate_gbt(df, best, kind="test", num_threads=num_threads, features=feats)
    per_fold.attrs.update(best_params=best, features=feats, summary=summarize(per_fold),
                          seconds=time.perf_counter() - t0)
    s = per_fold.attrs["summary"]
    log("LightGBM, same inputs as the transformer: " + ", ".join(
        f"{m} {s.loc[m, 'mean']:.3f} ± {s.loc[m, 'std']:.3f}" for m in METRICS) + f" (params {best})")
    return per_fold


__all__ = ["PREFIX", "run", "same_inputs_dataset"]
