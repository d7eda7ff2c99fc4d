"""Checkpoints: everything needed to rebuild model + features + spec, loaded safely.

A checkpoint is a directory with two files:

* ``model.safetensors`` — the weights (safetensors: no pickle, nothing executes on load);
* ``checkpoint.json`` — model config, feature statistics, dataset spec, metrics, thresholds,
  training-data hash, package versions, creation time, and ``sha256``: the SHA-256 of the
  weights bytes followed by the canonical JSON of everything else. Loading verifies it.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from engine import __version__
from engine.data.features import FeatureEncoder
from engine.data.spec import DatasetSpec, spec_from_dict
from engine.model.transformer import FraudTransformer, ModelConfig

WEIGHTS, META = "model.safetensors", "checkpoint.json"
ASSET_MODEL_DIR = Path(__file__).resolve().parents[2] / "assets" / "demo_model"


@dataclass
class ModelBundle:
    """A model with the feature encoder, spec and metadata it was trained with.

    Attributes:
        model: the :class:`FraudTransformer` in eval mode.
        encoder: fitted :class:`FeatureEncoder`.
        spec: the :class:`DatasetSpec` of the training data.
        meta: metrics, thresholds, data hash, versions, ``name``, ``created_at``.
        sha256: checkpoint hash (hex), or "" for an unsaved bundle.
        path: directory it was loaded from, if any.
    """

    model: FraudTransformer
    encoder: FeatureEncoder
    spec: DatasetSpec
    meta: dict[str, Any] = field(default_factory=dict)
    sha256: str = ""
    path: Path | None = None

    @property
    def config(self) -> ModelConfig:
        return self.model.cfg

    @property
    def threshold(self) -> float:
        """Decision threshold on the fraud probability (chosen on validation), default 0.5."""
        return float(self.meta.get("thresholds", {}).get("review", 0.5))

    @property
    def short_sha(self) -> str:
        return self.sha256[:12]


def package_versions() -> dict[str, str]:
    """Versions of the packages that shape results (for provenance)."""
    out = {"fraudlens": __version__, "python": platform.python_version()}
    for p in ("torch", "numpy", "pandas", "captum", "shap", "safetensors"):
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            pass
    return out


def _digest(weights: bytes, meta_wo_sha: dict) -> str:
    h = hashlib.sha256(weights)
    h.update(json.dumps(meta_wo_sha, sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()


def save_checkpoint(bundle: ModelBundle, out_dir: str | Path) -> str:
    """Write ``model.safetensors`` + ``checkpoint.json`` to ``out_dir``; returns the sha256."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in bundle.model.state_dict().items()}
    save_file(state, str(out / WEIGHTS))
    meta = {
        "format": "fraudlens-checkpoint/1",
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model_config": bundle.model.cfg.to_dict(),
        "feature_state": bundle.encoder.state_dict(),
        "spec": bundle.spec.model_dump(mode="json"),
        "versions": package_versions(),
        **{k: v for k, v in bundle.meta.items() if k not in {"sha256"}},
    }
    sha = _digest((out / WEIGHTS).read_bytes(), meta)
    meta["sha256"] = sha
    (out / META).write_text(json.dumps(meta, indent=1))  # key order matters: field order
    bundle.sha256, bundle.path = sha, out
    return sha


def load_checkpoint(path: str | Path | None = None, *, verify: bool = True) -> ModelBundle:
    """Load a checkpoint directory (default: the demo model in ``assets/demo_model``).

    Raises:
        FileNotFoundError: the directory or one of its two files is missing.
        ValueError: the stored sha256 does not match the files (corrupted or edited checkpoint).
    """
    d = Path(path) if path is not None else ASSET_MODEL_DIR
    for f in (WEIGHTS, META):
        if not (d / f).exists():
            raise FileNotFoundError(f"{d / f}: not found (a checkpoint directory holds {WEIGHTS} and {META})")
    meta = json.loads((d / META).read_text())
    weights = (d / WEIGHTS).read_bytes()
    sha = meta.pop("sha256", "")
    if verify and _digest(weights, meta) != sha:
        raise ValueError(f"{d}: checkpoint sha256 mismatch (expected {sha[:12]}…); the files were changed")
    cfg = ModelConfig.from_dict(meta["model_config"])
    spec = spec_from_dict(meta["spec"], source=str(d / META))
    model = FraudTransformer(cfg)
    model.load_state_dict(load_file(str(d / WEIGHTS)))
    model.eval()
    enc = FeatureEncoder.from_state_dict(spec, meta["feature_state"])
    keep = {k: v for k, v in meta.items() if k not in {"model_config", "feature_state", "spec"}}
    return ModelBundle(model=model, encoder=enc, spec=spec, meta=keep, sha256=sha, path=d)


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """SHA-256 (hex) of a file's bytes (training-data provenance)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


def build_model(encoder: FeatureEncoder, seed: int = 0, **overrides) -> FraudTransformer:
    """A fresh model whose input layout matches ``encoder`` (``overrides``: ModelConfig fields),
    initialised from ``torch.manual_seed(seed)``."""
    names = encoder.field_names()
    fidx = {n: i for i, n in enumerate(names)}
    cat_cols = encoder.cat_columns()
    cfg = ModelConfig(
        cat_cardinalities=[c for _, _, c in cat_cols],
        cat_field_index=[fidx[f] for _, f, _ in cat_cols],
        num_field_index=[fidx[f] for _, f in encoder.num_columns()],
        multi_slots=[(fidx[n], w) for n, w in encoder.multi_slots()],
        field_names=names,
        **{"num_ple_edges": encoder.num_ple_edges(), **overrides},
    )
    torch.manual_seed(seed)
    return FraudTransformer(cfg)
