"""Validation of an untrusted checkpoint, run by :func:`engine.model.checkpoint.load_checkpoint`
before anything is allocated from it.

* :func:`parse_meta` - strict JSON (UTF-8, no NaN/Infinity, no duplicate keys);
* :func:`check_thresholds` - numbers in [0, 1], review <= decline;
* :func:`check_layout` - the config's input layout is the one the feature statistics imply;
* :func:`expected_state_shapes` - every tensor a config implies, computed without building the
  model, so the parameter count is bounded (:data:`MAX_PARAMETERS`) before allocation;
* :func:`load_weights` - the safetensors header is parsed and checked (names, float32, shapes)
  before the tensors are materialised; then every value must be finite.

Every error is a :class:`CheckpointError` (a ``ValueError``) whose one-line message names the
file and the cause.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any

import torch
from safetensors.torch import load as _st_load

from engine.data.features import TIME_GAP_BOUNDARIES_S
from engine.model.activity import activity_ple_edges, n_activity_inputs
from engine.model.transformer import ModelConfig

#: most parameters a checkpoint may imply (float32: 256 MiB), checked before allocation
MAX_PARAMETERS = 64 * 2**20
MAX_HEADER_BYTES = 16 * 2**20  # safetensors JSON header


class CheckpointError(ValueError):
    """A checkpoint that fails validation; the message names the file and the cause."""


def _short(v: Any, n: int = 60) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 1] + "…"


def _strict_loads(text: str, source: str) -> Any:
    def no_constant(name: str):
        raise CheckpointError(f"{source}: {name} is not allowed (JSON numbers must be finite)")

    def finite_float(s: str) -> float:
        v = float(s)
        if not math.isfinite(v):
            raise CheckpointError(f"{source}: number {_short(s)} is not finite")
        return v

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise CheckpointError(f"{source}: duplicate key {_short(k)} (a checkpoint's JSON keys must be unique)")
            out[k] = v
        return out

    try:
        return json.loads(text, parse_constant=no_constant, parse_float=finite_float, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{source}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except (ValueError, RecursionError) as e:  # e.g. an integer of 4300+ digits, or deep nesting
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{source}: not valid JSON ({str(e).splitlines()[0][:120]})") from None


def parse_meta(raw: bytes, source: str) -> dict[str, Any]:
    """``checkpoint.json`` bytes -> its object, parsed strictly.

    Raises:
        CheckpointError: not UTF-8, not JSON (or nested too deep to parse), a NaN/Infinity/
            overflowing number, a duplicate key, or not an object.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    meta = _strict_loads(text, source)
    if not isinstance(meta, dict):
        raise CheckpointError(f"{source}: expected a JSON object, got {type(meta).__name__}")
    if "sha256" in meta and not isinstance(meta["sha256"], str):
        raise CheckpointError(f"{source}: sha256: expected a hex string, got {_short(meta['sha256'])}")
    return meta


def check_thresholds(th: Any, source: str) -> None:
    """``thresholds`` (absent = the defaults) must map ``review`` / ``decline`` to numbers in
    [0, 1] (probabilities) with review <= decline.

    Raises:
        CheckpointError: names the threshold and its value.
    """
    if th is None:
        return
    if not isinstance(th, dict):
        raise CheckpointError(f"{source}: thresholds: expected an object, got {_short(th)}")
    for k in ("review", "decline"):
        if k in th:
            v = th[k]
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (math.isfinite(v) and 0 <= v <= 1):
                raise CheckpointError(f"{source}: thresholds.{k}: expected a probability in [0, 1], got {_short(v)}")
    if "review" in th and "decline" in th and th["review"] > th["decline"]:
        raise CheckpointError(f"{source}: thresholds: expected review <= decline, got review {th['review']} > "
                              f"decline {th['decline']}")


def _coded(edges: list) -> list[tuple[int, list]]:
    return [(j, list(e)) for j, e in enumerate(edges) if len(e) > 1]


def check_layout(cfg: ModelConfig, implied: dict[str, Any], source: str) -> None:
    """The config's input layout equals ``implied`` (what the feature statistics give; see
    ``checkpoint._layout``); ``num_ple_edges`` compare by their coded columns ([] = none).

    Raises:
        CheckpointError: names the first field that differs.
    """
    for k, want in implied.items():
        got = getattr(cfg, k)
        if k == "num_ple_edges":
            ok = _coded(got) == _coded(want)
        else:
            ok = [tuple(x) if isinstance(x, (list, tuple)) else x for x in got] == \
                 [tuple(x) if isinstance(x, (list, tuple)) else x for x in want]
        if not ok:
            raise CheckpointError(f"{source}: model_config.{k} is {_short(got)} but the feature statistics imply "
                                  f"{_short(want)}")


def expected_state_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of ``model_from_config(cfg).state_dict()``, computed from the
    config alone (tested equal to the built model's): one transformer's tensors, or with
    ``n_members = K > 1`` (a :class:`~engine.model.ensemble.SeedEnsemble`) each of them once per
    member under ``members.{k}.``."""
    one = _member_state_shapes(cfg)
    if cfg.n_members == 1:
        return one
    return {f"members.{k}.{name}": shape for k in range(cfg.n_members) for name, shape in one.items()}


def _member_state_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of ``FraudTransformer(cfg).state_dict()``."""
    D, F, Fn, H, Dff = cfg.d_model, cfg.n_fields, len(cfg.num_field_index), cfg.n_heads, cfg.d_ff
    s: dict[str, tuple[int, ...]] = {
        "rows.num_w": (Fn, D), "rows.num_b": (Fn, D), "rows.hist_none": (D,), "rows.field_bias": (F, D),
        "rows.cat_emb.weight": (max(1, sum(cfg.embedding_cardinalities)), D),
    }
    for i, (_, w) in enumerate(cfg.multi_slots):
        s[f"rows.multi_proj.{i}.weight"] = (D, w)
    ple = _coded(cfg.num_ple_edges)
    if ple:
        s["rows.ple_w"] = (len(ple), max(len(e) - 1 for _, e in ple), D)
    s["rows.hist_lin.weight"] = (D, 1 + max(0, len(cfg.history_edges) - 1))
    s["rows.hist_lin.bias"] = (D,)
    s["rows.gap_bins.weight"] = (len(TIME_GAP_BOUNDARIES_S) + 2, D)
    s["rows.gap_lin.weight"], s["rows.gap_lin.bias"] = (D, 1), (D,)
    if cfg.activity_windows_s:
        s["rows.activity.recent.weight"] = (D, n_activity_inputs(len(cfg.activity_windows_s)))
        s["rows.activity.recent.bias"] = (D,)
        s["rows.activity.seen.weight"], s["rows.activity.seen.bias"] = (D, len(cfg.first_seen_cols) + 1), (D,)
        if cfg.activity_ple:
            edges = activity_ple_edges(len(cfg.activity_windows_s))
            s["rows.activity.ple_w"] = (len(edges), max(len(e) - 1 for e in edges), D)
    s["ln_in.weight"], s["ln_in.bias"] = (D,), (D,)
    if cfg.row_ff:
        s["row_ff.0.weight"], s["row_ff.0.bias"] = (cfg.row_ff, D), (cfg.row_ff,)
        s["row_ff.2.weight"], s["row_ff.2.bias"] = (D, cfg.row_ff), (D,)
    for i in range(cfg.n_layers):
        b = f"blocks.{i}."
        s.update({
            b + "ln1.weight": (D,), b + "ln1.bias": (D,), b + "attn.slope_raw": (H,),
            b + "attn.qkv.weight": (3 * D, D), b + "attn.qkv.bias": (3 * D,),
            b + "attn.out.weight": (D, D), b + "attn.out.bias": (D,),
            b + "ln2.weight": (D,), b + "ln2.bias": (D,),
            b + "ff.0.weight": (Dff, D), b + "ff.0.bias": (Dff,), b + "ff.2.weight": (D, Dff), b + "ff.2.bias": (D,),
        })
    s["ln_out.weight"], s["ln_out.bias"] = (D,), (D,)
    s["head.weight"], s["head.bias"] = (1, D), (1,)
    return s


def _header(raw: bytes, source: str) -> dict[str, Any]:
    """The safetensors JSON header of ``raw``: ``{name: {"dtype", "shape", "data_offsets"}}``."""
    hint = ""
    if raw[:1] == b"\x80" or raw[:2] == b"PK":
        hint = " (it looks like a pickle / torch.save file: fraudlens never unpickles a checkpoint)"
    if len(raw) < 8:
        raise CheckpointError(f"{source}: not a safetensors file ({len(raw)} bytes){hint}")
    n = int.from_bytes(raw[:8], "little")
    if n > min(len(raw) - 8, MAX_HEADER_BYTES):
        raise CheckpointError(f"{source}: not a safetensors file (header length {n:,} exceeds the file){hint}")
    try:
        header = _strict_loads(raw[8 : 8 + n].decode("utf-8"), source)
    except (UnicodeDecodeError, CheckpointError):
        raise CheckpointError(f"{source}: not a safetensors file (its header is not JSON){hint}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{source}: not a safetensors file (its header is not an object)")
    header.pop("__metadata__", None)
    for name, info in header.items():
        shape = info.get("shape") if isinstance(info, dict) else None
        if not isinstance(shape, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                  for x in shape):
            raise CheckpointError(f"{source}: tensor {_short(name)}: malformed header entry {_short(info)}")
    return header


def load_weights(raw: bytes, expected: dict[str, tuple[int, ...]], source: str) -> dict[str, torch.Tensor]:
    """Parse safetensors bytes into tensors after checking them against ``expected`` shapes.

    Order: parameter count of ``expected`` <= :data:`MAX_PARAMETERS`; header names, dtypes
    (float32 only) and shapes; only then the tensors are materialised (at most the file's
    size) and every value must be finite.

    Raises:
        CheckpointError: names the tensor and what is wrong with it.
    """
    n_params = sum(math.prod(s) for s in expected.values())
    if n_params > MAX_PARAMETERS:
        raise CheckpointError(f"{source}: the model config implies {n_params:,} parameters, above the limit of "
                              f"{MAX_PARAMETERS:,}")
    header = _header(raw, source)
    missing, extra = sorted(set(expected) - set(header)), sorted(set(header) - set(expected))
    if missing or extra:
        raise CheckpointError(f"{source}: tensors do not match the model config: missing {missing[:5]}, "
                              f"unexpected {extra[:5]}")
    for name, shape in expected.items():
        info = header[name]
        if info.get("dtype") != "F32":
            raise CheckpointError(f"{source}: tensor {name}: expected dtype F32 (float32), got {_short(info.get('dtype'))}")
        if tuple(info["shape"]) != shape:
            raise CheckpointError(f"{source}: tensor {name}: expected shape {list(shape)} (from the model config), "
                                  f"got {info['shape']}")
    try:
        state = _st_load(raw)
    except Exception as e:  # noqa: BLE001 - the safetensors parser's own errors (offsets, truncation)
        raise CheckpointError(f"{source}: not a valid safetensors file ({str(e).splitlines()[0][:120]})") from None
    for name, t in state.items():
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            raise CheckpointError(f"{source}: tensor {name}: {bad:,} of {t.numel():,} values are NaN or infinite")
    return state
