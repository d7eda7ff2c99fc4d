"""Checkpoints: everything needed to rebuild model + features + spec, loaded safely.

A checkpoint is a directory with two files:

* ``model.safetensors`` — the weights (safetensors: no pickle, nothing executes on load);
* ``checkpoint.json`` — model config, feature statistics, dataset spec, metrics, thresholds,
  training-data hash, package versions, creation time, and ``sha256`` (see below).

Identity. A model's identity (:attr:`ModelBundle.sha256`, the key of its cases and reports) is
always *computed* from the bytes read: SHA-256 of the weights file's bytes followed by the
canonical JSON (sorted keys, no whitespace) of ``checkpoint.json`` without its ``sha256`` key. The
``sha256`` the file states about itself is only compared with it (a mismatch is an error), never
used. The bundled demo model is also pinned to :data:`DEMO_MODEL_SHA256`.

Untrusted input. A checkpoint folder may come from anyone, so loading validates everything before
allocating from it (:func:`load_checkpoint`, see :mod:`engine.model.checkpoint_checks`): both files
must be regular files in the folder (no symbolic links, devices or FIFOs) within size limits;
the JSON is strict (no NaN/Infinity, no duplicate keys); config ranges and the parameter count
they imply are bounded; every tensor's name, dtype (float32) and shape must be the ones the
config implies and every value finite; thresholds lie in [0, 1] with review <= decline; an
optional calibration map must be monotone, finite and within [0, 1], an optional drift reference
bounded and well-formed (:func:`check_optional_sections`). Weights are never unpickled
(safetensors only).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import stat
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from engine import __version__
from engine.data.io import file_sha256  # noqa: F401 (re-exported: training-data provenance)
from engine.data import field_reference
from engine.data.features import FeatureEncoder
from engine.data.spec import DatasetSpec, spec_from_dict
from engine.model.activity import ACTIVITY_FIELDS, DEFAULT_ACTIVITY_WINDOWS_S
from engine.model.checkpoint_checks import (
    CheckpointError,
    check_layout,
    check_thresholds,
    expected_state_shapes,
    load_weights,
    parse_meta,
)
from engine.model.ensemble import SeedEnsemble, model_from_config
from engine.model.transformer import FraudTransformer, ModelConfig
from engine.model.calibration import (
    CALIBRATION_KEY,
    apply_calibration,
    calibration_of,
    check_calibration,
    is_calibrated,
)
from engine.model.drift import DRIFT_KEY, check_drift_reference

WEIGHTS, META = "model.safetensors", "checkpoint.json"
ASSET_MODEL_DIR = Path(__file__).resolve().parents[2] / "assets" / "demo_model"
#: identity of the bundled demo model: ``load_checkpoint`` refuses ``assets/demo_model`` if its files
#: hash to anything else (retraining it means updating this constant in the same commit).
DEMO_MODEL_SHA256 = "9ab353a3bcd40575e67ae3b293998c4722340fb265150a5064d36a83ce28eb33"
FORMAT = "fraudlens-checkpoint/1"
MAX_META_BYTES = 16 * 2**20  #: size limit of ``checkpoint.json``
MAX_WEIGHTS_BYTES = 512 * 2**20  #: size limit of ``model.safetensors``

__all__ = ["CheckpointError", "ModelBundle", "load_checkpoint", "save_checkpoint", "build_model", "file_sha256",
           "checkpoint_sha256", "ASSET_MODEL_DIR", "DEMO_MODEL_SHA256"]


@dataclass
class ModelBundle:
    """A model with the feature encoder, spec and metadata it was trained with.

    Attributes:
        model: the :class:`FraudTransformer` (or :class:`~engine.model.ensemble.SeedEnsemble` of
            them, ``config.n_members > 1``) in eval mode.
        encoder: fitted :class:`FeatureEncoder`.
        spec: the :class:`DatasetSpec` of the training data.
        meta: metrics, thresholds, data hash, versions, ``name``, ``created_at``.
        sha256: checkpoint hash (hex), or "" for an unsaved bundle.
        path: directory it was loaded from, if any.
    """

    model: FraudTransformer | SeedEnsemble
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

    @property
    def calibrated(self) -> bool:
        """True when the checkpoint carries a calibration map (its ``probability`` is one)."""
        return is_calibrated(self.meta)

    def probability(self, logits) -> "np.ndarray":
        """``[N]`` float64 fraud probabilities of ``[N]`` logits: the calibration map's when the
        checkpoint has one, else ``sigmoid(logit)`` (a score; see :mod:`engine.model.calibration`)."""
        return apply_calibration(calibration_of(self.meta), logits)


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


def checkpoint_sha256(weights: bytes, meta: dict) -> str:
    """A checkpoint's identity (hex): SHA-256 of the weights bytes followed by the canonical JSON
    (sorted keys, no whitespace) of ``meta`` without its ``sha256`` key."""
    return _digest(weights, {k: v for k, v in meta.items() if k != "sha256"})


def save_checkpoint(bundle: ModelBundle, out_dir: str | Path) -> str:
    """Write ``model.safetensors`` + ``checkpoint.json`` to ``out_dir``; returns the sha256.

    Raises:
        CheckpointError: a weight is not finite or the thresholds are out of range (such a
            checkpoint would be refused on load, so it is never written).
    """
    out = Path(out_dir)
    state = {k: v.detach().contiguous().cpu() for k, v in bundle.model.state_dict().items()}
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise CheckpointError(f"{out}: not written: tensor(s) {bad[:5]} hold NaN or inf values")
    check_thresholds(bundle.meta.get("thresholds"), str(out / META))
    check_optional_sections(bundle.meta, str(out / META))
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / WEIGHTS))
    meta = {
        "format": FORMAT,
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


def check_optional_sections(meta: dict, source: str) -> None:
    """Validate the optional sections of a checkpoint's meta: the calibration map
    (``calibration``, :func:`engine.model.calibration.check_calibration`) and the drift
    reference (``drift_reference``, :func:`engine.model.drift.check_drift_reference`).
    A checkpoint without them is valid (its outputs are scores; no drift is shown).

    Raises:
        CheckpointError: names the file, the section and the cause.
    """
    for key, check in ((CALIBRATION_KEY, check_calibration), (DRIFT_KEY, check_drift_reference)):
        if key in meta:
            try:
                check(meta[key])
            except ValueError as e:
                raise CheckpointError(f"{source}: {key}: {e}") from None


def _read_regular(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, which must be a regular file (not a symbolic link, device, FIFO or
    folder) of at most ``limit`` bytes; read once through one descriptor (no re-open)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: not found (a checkpoint directory holds {WEIGHTS} and {META})") from None
    if stat.S_ISLNK(st.st_mode):
        raise CheckpointError(f"{path}: is a symbolic link (to {os.readlink(path)!r}); a checkpoint's files "
                              "must be regular files inside its folder")
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{path}: not a regular file; a checkpoint's files must be regular files")
    if st.st_size > limit:
        raise CheckpointError(f"{path}: {st.st_size:,} bytes, above the limit of {limit:,} bytes")
    try:  # O_NOFOLLOW: a link swapped in after the lstat is refused too
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise CheckpointError(f"{path}: cannot be opened ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:  # replaced between lstat and open
            raise CheckpointError(f"{path}: changed while being opened; load it again")
        data = f.read(st.st_size + 1)  # read(n) allocates n bytes up front: never more than the file
    if len(data) != st.st_size:
        raise CheckpointError(f"{path}: changed while being read ({st.st_size:,} bytes expected); load it again")
    return data


def load_checkpoint(path: str | Path | None = None) -> ModelBundle:
    """Load and validate a checkpoint directory (default: the demo model in ``assets/demo_model``).

    Every check runs before the model is built (see the module docstring); the bundle's
    ``sha256`` is computed from the bytes read, never taken from the file.

    Raises:
        FileNotFoundError: the directory or one of its two files is missing.
        CheckpointError (a ValueError): one line naming the file and the cause: a symbolic link
            or non-regular file, a file above its size limit, invalid or non-strict JSON, a
            stored sha256 that does not match the files (corrupted or edited), a changed demo
            model, a config value out of range, thresholds outside [0, 1] or review > decline,
            a config that does not match the feature statistics, or a tensor that is missing,
            unexpected, not float32, of the wrong shape or not finite; weights that are not a
            safetensors file (a pickle is refused, never unpickled); an invalid stored per-field
            reference (``field_reference``, :func:`engine.data.field_reference.from_dict`).
    """
    d = Path(path) if path is not None else ASSET_MODEL_DIR
    if d.exists() and not d.is_dir():
        raise FileNotFoundError(f"{d}: not a directory (a checkpoint directory holds {WEIGHTS} and {META})")
    for f in (WEIGHTS, META):
        if not os.path.lexists(d / f):
            raise FileNotFoundError(f"{d / f}: not found (a checkpoint directory holds {WEIGHTS} and {META})")
    src = str(d / META)
    meta = parse_meta(_read_regular(d / META, MAX_META_BYTES), src)
    weights = _read_regular(d / WEIGHTS, MAX_WEIGHTS_BYTES)
    stated = meta.pop("sha256", None)
    sha = _digest(weights, meta)
    if stated is not None and stated != sha:
        raise CheckpointError(f"{d}: checkpoint sha256 mismatch: {META} states {str(stated)[:12]}…, the files hash "
                              f"to {sha[:12]}…; the files were changed after saving")
    if d.resolve() == ASSET_MODEL_DIR.resolve() and sha != DEMO_MODEL_SHA256:
        raise CheckpointError(f"{d}: the bundled demo model was changed (its files hash to {sha[:12]}…, this release "
                              f"pins {DEMO_MODEL_SHA256[:12]}…); restore assets/demo_model")
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{src}: format: expected {FORMAT!r}, got {meta.get('format')!r}")
    check_thresholds(meta.get("thresholds"), src)
    check_optional_sections(meta, src)
    try:
        cfg = ModelConfig.from_dict(meta.get("model_config"))
    except ValueError as e:
        raise CheckpointError(f"{src}: model_config: {e}") from None
    try:
        spec = spec_from_dict(meta.get("spec"), source=src)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{src}: spec: {str(e).splitlines()[0]}") from None
    if not isinstance(meta.get("feature_state"), dict):
        raise CheckpointError(f"{src}: feature_state: expected an object")
    enc = FeatureEncoder.from_state_dict(spec, meta["feature_state"])
    check_layout(cfg, _layout(enc, src, activity=bool(cfg.activity_windows_s)), src)
    if field_reference.CHECKPOINT_KEY in meta:  # the typical transaction of the explanations
        try:
            field_reference.from_dict(meta[field_reference.CHECKPOINT_KEY], enc, src)
        except ValueError as e:
            raise CheckpointError(str(e)) from None
    state = load_weights(weights, expected_state_shapes(cfg), str(d / WEIGHTS))
    model = model_from_config(cfg)  # sizes bounded by the checks above
    model.load_state_dict(state, strict=True)
    model.eval()
    keep = {k: v for k, v in meta.items() if k not in {"model_config", "feature_state", "spec"}}
    return ModelBundle(model=model, encoder=enc, spec=spec, meta=keep, sha256=sha, path=d)


def build_model(encoder: FeatureEncoder, seed: int = 0, activity: bool = True, **overrides) -> FraudTransformer:
    """A fresh model whose input layout matches ``encoder`` (``overrides``: ModelConfig fields),
    initialised from ``torch.manual_seed(seed)``. ``activity``: with the recent-activity and
    first-seen fields (:mod:`engine.model.activity`, default windows unless
    ``activity_windows_s`` is overridden)."""
    if activity:
        overrides.setdefault("activity_windows_s", list(DEFAULT_ACTIVITY_WINDOWS_S))
    cfg = ModelConfig(**{**_layout(encoder, activity=activity), **overrides})
    torch.manual_seed(seed)
    return FraudTransformer(cfg)


def _layout(encoder: FeatureEncoder, source: str = "", activity: bool = False) -> dict[str, Any]:
    """The input-layout fields of :class:`ModelConfig` that ``encoder`` implies (``activity``: plus
    the activity fields, checking every categorical spec field for "first seen").

    Raises:
        CheckpointError: (with ``source``) the encoder's statistics are malformed.
    """
    try:
        names = encoder.field_names()
        fidx = {n: i for i, n in enumerate(names)}
        cat_cols = encoder.cat_columns()
        out = dict(
            cat_cardinalities=[c for _, _, c in cat_cols],
            cat_field_index=[fidx[f] for _, f, _ in cat_cols],
            num_field_index=[fidx[f] for _, f in encoder.num_columns()],
            multi_slots=[(fidx[n], w) for n, w in encoder.multi_slots()],
            field_names=names,
            num_ple_edges=encoder.num_ple_edges(),
            novelty_only_cols=[j for j, (col, _, _) in enumerate(cat_cols)
                               if encoder.state["categorical"].get(col, {}).get("embed", True) is False],
        )
        if activity:
            categorical = set(encoder.state["categorical"])
            out["field_names"] = names + list(ACTIVITY_FIELDS)
            out["first_seen_cols"] = [j for j, (col, _, _) in enumerate(cat_cols) if col in categorical]
        return out
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
        if not source:
            raise
        raise CheckpointError(f"{source}: feature_state: malformed ({type(e).__name__}: {e})") from None
