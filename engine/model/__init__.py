"""Model layer: the causal sequence transformer, its windows, training, scoring and checkpoints.

Map of the package, in data-flow order:

* :mod:`~engine.model.sequences` - per-entity context windows over the encoded frame and the
  validated :class:`TransactionBatch` (``[B, T, ...]`` tensors) the model reads;
* :mod:`~engine.model.transformer` - :class:`ModelConfig` and :class:`FraudTransformer` (row
  encoder ``[B, T, F, D]`` -> causal transformer -> logits ``[B, T]``);
* :mod:`~engine.model.ensemble` - :class:`SeedEnsemble`: ``K`` transformers from different seeds,
  one checkpoint, scored by their mean logit (``TrainConfig.members``);
* :mod:`~engine.model.train` - time split, training with early stopping, thresholds;
* :mod:`~engine.model.calibration` - the logit -> fraud probability map fitted on validation
  (isotonic / Platt), ECE and reliability tables (no torch);
* :mod:`~engine.model.operating_point` - thresholds against a stated target, bootstrap test check;
* :mod:`~engine.model.drift` - training-period field statistics and the population stability index;
* :mod:`~engine.model.scoring` - whole-file scoring (one output row per input row);
* :mod:`~engine.model.incremental` - scoring one new transaction from cached per-entity state;
* :mod:`~engine.model.checkpoint` - safetensors weights + JSON (config, statistics, spec,
  metrics, sha256), validated on load by :mod:`~engine.model.checkpoint_checks`.

Imports only :mod:`engine.data` below it. Public names are re-exported here, imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> submodule (imported on first access).
_EXPORTS = {
    "TransactionBatch": "sequences", "WindowIndex": "sequences", "build_windows": "sequences",
    "make_batch": "sequences", "entity_bounds": "sequences", "window_of_position": "sequences",
    "FraudTransformer": "transformer", "ModelConfig": "transformer", "ScoreOutput": "transformer",
    "SeedEnsemble": "ensemble",
    "TrainConfig": "train", "fit": "train", "train": "train", "time_split": "train",
    "NonFiniteScoreError": "scoring", "CheckpointError": "checkpoint_checks",
    "ScoreRun": "scoring", "score_encoded": "scoring", "score_file": "scoring", "score_frame": "scoring",
    "sigmoid": "scoring", "write_scores": "scoring", "check_compatible": "scoring",
    "IncrementalScorer": "incremental",
    "fit_calibration": "calibration", "apply_calibration": "calibration", "probability_word": "calibration",
    "expected_calibration_error": "calibration", "choose_operating_thresholds": "operating_point",
    "drift_reference": "drift", "psi": "drift",
    "ASSET_MODEL_DIR": "checkpoint", "ModelBundle": "checkpoint", "build_model": "checkpoint",
    "file_sha256": "checkpoint", "load_checkpoint": "checkpoint", "save_checkpoint": "checkpoint",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
