"""Hostile checkpoints, generated here from one valid tiny checkpoint (issue 12, item 8).

Each case asserts the exact error and that it comes before the model is built (nothing large
is allocated): ``FraudTransformer`` is watched, and the file-level attacks run under tracemalloc.
A non-finite score is an error in batch, incremental and CLI scoring, never "not flagged".
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import engine.model.checkpoint as ck
from engine.cli import app
from engine.data.io import read_transactions
from engine.data.spec import load_spec
from engine.model.checkpoint import META, WEIGHTS, CheckpointError, checkpoint_sha256, load_checkpoint
from engine.model.scoring import NonFiniteScoreError, score_frame
from tiny_models import demo_slice, tiny_checkpoint


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A valid tiny checkpoint (demo spec, d_model 16) and a 300-row demo slice it scores."""
    d = tmp_path_factory.mktemp("ck")
    data = demo_slice(d / "slice.csv", 300)
    frame = read_transactions(data, load_spec("demo")).frame
    tiny_checkpoint(frame, load_spec("demo"), d / "model", {"name": "tiny", "thresholds": {"review": 0.3, "decline": 0.6}})
    return d / "model", data, frame


@pytest.fixture
def built(monkeypatch):
    """Counts the models built (each refusal must come before building one)."""
    calls = []
    real = ck.FraudTransformer

    def watch(cfg):
        calls.append(cfg)
        return real(cfg)

    monkeypatch.setattr(ck, "FraudTransformer", watch)
    return calls


def variant(base_dir: Path, out: Path, *, state=None, meta=None, rehash: bool = True) -> Path:
    """A copy of ``base_dir`` with its tensors and/or JSON edited by ``state(dict)`` / ``meta(dict)``,
    its stored sha256 recomputed unless ``rehash`` is False (an attacker can always recompute it)."""
    shutil.copytree(base_dir, out)
    if state is not None:
        tensors = load_file(str(out / WEIGHTS))
        state(tensors)
        save_file(tensors, str(out / WEIGHTS))
    m = json.loads((out / META).read_text())
    if meta is not None:
        meta(m)
    if rehash:
        m["sha256"] = checkpoint_sha256((out / WEIGHTS).read_bytes(), m)
    (out / META).write_text(json.dumps(m, indent=1))  # NaN is written as NaN (allow_nan)
    return out


def _set(t: dict, name: str, value) -> None:
    t[name] = value


def _cfg(**kw):
    return lambda m: m["model_config"].update(kw)


def _thr(**kw):
    return lambda m: m["thresholds"].update(kw)


# ---------------------------------------------------------------------------------- tensors
TENSOR_CASES = {
    "nan_weight": (lambda t: t["head.weight"].__setitem__((0, 3), float("nan")),
                   "tensor head.weight: 1 of 16 values are NaN or infinite"),
    "inf_weight": (lambda t: t["blocks.0.attn.qkv.bias"].fill_(float("inf")),
                   "tensor blocks.0.attn.qkv.bias: 48 of 48 values are NaN or infinite"),
    "int_weights": (lambda t: _set(t, "head.weight", torch.ones(1, 16, dtype=torch.int64)),
                    "tensor head.weight: expected dtype F32 (float32), got 'I64'"),
    "bool_weights": (lambda t: _set(t, "head.bias", torch.ones(1, dtype=torch.bool)),
                     "tensor head.bias: expected dtype F32 (float32), got 'BOOL'"),
    "float64_weights": (lambda t: _set(t, "ln_out.bias", t["ln_out.bias"].double()),
                        "tensor ln_out.bias: expected dtype F32 (float32), got 'F64'"),
    "wrong_shape": (lambda t: _set(t, "head.weight", torch.zeros(1, 17)),
                    "tensor head.weight: expected shape [1, 16] (from the model config), got [1, 17]"),
    "missing_tensor": (lambda t: t.pop("blocks.1.ff.2.bias"),
                       "tensors do not match the model config: missing ['blocks.1.ff.2.bias'], unexpected []"),
    "extra_tensor": (lambda t: _set(t, "blocks.2.ln1.weight", torch.zeros(16)),
                     "tensors do not match the model config: missing [], unexpected ['blocks.2.ln1.weight']"),
}


@pytest.mark.parametrize("case", sorted(TENSOR_CASES))
def test_bad_tensors_are_refused_before_the_model_is_built(case, base, tmp_path, built):
    edit, msg = TENSOR_CASES[case]
    d = variant(base[0], tmp_path / case, state=edit)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    assert str(e.value) == f"{d / WEIGHTS}: {msg}"
    assert built == []


# ---------------------------------------------------------------------------------- config
CONFIG_CASES = {
    "huge_d_model": (_cfg(d_model=1_000_000, n_heads=1), "d_model: expected an integer in [1, 1,024], got 1000000"),
    "huge_context": (_cfg(context_length=10**9), "context_length: expected an integer in [2, 1,024], got 1000000000"),
    "huge_layers": (_cfg(n_layers=100_000), "n_layers: expected an integer in [1, 32], got 100000"),
    "huge_d_ff": (_cfg(d_ff=2**40), "d_ff: expected an integer in [1, 8,192], got 1099511627776"),
    # column 8 (mcc) is embedded; 4-7 (merchant, city, state, zip) are novelty only: codes, no table rows
    "huge_cardinality": (lambda m: m["model_config"]["cat_cardinalities"].__setitem__(8, 10**12),
                         "cat_cardinalities[8]: expected an integer in [1, 4,194,304], got 1000000000000"),
    "huge_novelty_codes": (lambda m: m["model_config"]["cat_cardinalities"].__setitem__(4, 2**41),
                           "cat_cardinalities[4]: expected an integer in [1, 1,099,511,627,778], got 2199023255552"),
    "novelty_col_unhashable": (_cfg(novelty_only_cols=[[4], 5]), "novelty_only_cols[0]: expected an integer in [0, 9], got [4]"),
    "novelty_col_repeated": (_cfg(novelty_only_cols=[4, 4]),
                             "novelty_only_cols: expected a list of at most 64 distinct column indices, got [4, 4]"),
    "novelty_col_out_of_range": (_cfg(novelty_only_cols=[99]), "novelty_only_cols[0]: expected an integer in [0, 9], got 99"),
    "huge_multi_width": (_cfg(multi_slots=[[11, 10**10]]),
                         "multi_slots[0] width: expected an integer in [1, 100,000], got 10000000000"),
    "bool_as_int": (_cfg(n_layers=True), "n_layers: expected an integer in [1, 32], got True"),
    "float_as_int": (_cfg(d_model=16.0), "d_model: expected an integer in [1, 1,024], got 16.0"),
    "negative_heads": (_cfg(n_heads=-2), "n_heads: expected an integer in [1, 64], got -2"),
    "field_index_out_of_range": (lambda m: m["model_config"]["cat_field_index"].__setitem__(0, 99),
                                 "cat_field_index[0]: expected an integer in [0, 13], got 99"),
    "dropout_nan_string": (_cfg(dropout="0.1"), "dropout: expected a number in [0, 1), got '0.1'"),
    "missing_field": (lambda m: m["model_config"].pop("field_names"), "missing field(s) ['field_names']"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_config_ranges_are_checked_before_any_allocation(case, base, tmp_path, built):
    d = variant(base[0], tmp_path / case, meta=CONFIG_CASES[case][0])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    assert str(e.value) == f"{d / META}: model_config: {CONFIG_CASES[case][1]}"
    assert built == []


def test_in_range_values_that_imply_too_many_parameters_are_refused(base, tmp_path, built):
    """Every value within its range, yet 32 layers x (1024 wide, 8192 feed-forward) = 671M parameters."""
    d = variant(base[0], tmp_path / "big", meta=_cfg(d_model=1024, n_heads=8, n_layers=32, d_ff=8192))
    with pytest.raises(CheckpointError, match=r"model.safetensors: the model config implies 6\d\d,\d{3},\d{3} "
                                              r"parameters, above the limit of 67,108,864$"):
        load_checkpoint(d)
    assert built == []


def test_a_config_that_disagrees_with_the_feature_statistics_is_refused(base, tmp_path, built):
    def edit(m):
        m["model_config"]["cat_cardinalities"][8] += 1

    d = variant(base[0], tmp_path / "layout", meta=edit)
    with pytest.raises(CheckpointError, match=r"checkpoint.json: model_config.cat_cardinalities is \[3, .* but the "
                                              r"feature statistics imply \[3, "):
        load_checkpoint(d)
    d = variant(base[0], tmp_path / "fs", meta=lambda m: m["feature_state"].pop("amount_bin_edges"))
    with pytest.raises(CheckpointError, match=r"checkpoint.json: feature_state: malformed \(KeyError: "
                                              r"'amount_bin_edges'\)$"):
        load_checkpoint(d)
    assert built == []


# ---------------------------------------------------------------------------------- thresholds
THRESHOLD_CASES = {
    "review_5": (_thr(review=5.0), "thresholds.review: expected a probability in [0, 1], got 5.0"),
    "decline_minus_1": (_thr(decline=-1), "thresholds.decline: expected a probability in [0, 1], got -1"),
    "review_text": (_thr(review="0.2"), "thresholds.review: expected a probability in [0, 1], got '0.2'"),
    "review_bool": (_thr(review=True), "thresholds.review: expected a probability in [0, 1], got True"),
    "review_above_decline": (_thr(review=0.9, decline=0.2),
                             "thresholds: expected review <= decline, got review 0.9 > decline 0.2"),
    "review_nan": (_thr(review=float("nan")), "NaN is not allowed (JSON numbers must be finite)"),
    "review_inf": (_thr(review=float("inf")), "Infinity is not allowed (JSON numbers must be finite)"),
}


@pytest.mark.parametrize("case", sorted(THRESHOLD_CASES))
def test_thresholds_must_be_probabilities_with_review_at_most_decline(case, base, tmp_path, built):
    d = variant(base[0], tmp_path / case, meta=THRESHOLD_CASES[case][0])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    assert str(e.value) == f"{d / META}: {THRESHOLD_CASES[case][1]}"
    assert built == []


# ---------------------------------------------------------------------------------- files
def _devzero(d: Path, outside: Path):
    (d / WEIGHTS).unlink()
    os.symlink("/dev/zero", d / WEIGHTS)
    return d / WEIGHTS, "is a symbolic link (to '/dev/zero'); a checkpoint's files must be regular files inside its folder"


def _escape(d: Path, outside: Path):
    """A valid weights file outside the folder, linked in by a relative path."""
    shutil.move(d / WEIGHTS, outside / WEIGHTS)
    os.symlink(os.path.relpath(outside / WEIGHTS, d), d / WEIGHTS)
    target = os.readlink(d / WEIGHTS)
    return d / WEIGHTS, f"is a symbolic link (to {target!r}); a checkpoint's files must be regular files inside its folder"


def _json_to_passwd(d: Path, outside: Path):
    (d / META).unlink()
    os.symlink("/etc/passwd", d / META)
    return d / META, "is a symbolic link (to '/etc/passwd'); a checkpoint's files must be regular files inside its folder"


def _fifo(d: Path, outside: Path):
    (d / WEIGHTS).unlink()
    os.mkfifo(d / WEIGHTS)  # reading it would block forever
    return d / WEIGHTS, "not a regular file; a checkpoint's files must be regular files"


def _folder(d: Path, outside: Path):
    (d / WEIGHTS).unlink()
    (d / WEIGHTS).mkdir()
    return d / WEIGHTS, "not a regular file; a checkpoint's files must be regular files"


def _huge_json(d: Path, outside: Path):
    with open(d / META, "r+b") as f:  # sparse: no disk used, but above the limit
        f.truncate(ck.MAX_META_BYTES + 1)
    return d / META, f"{ck.MAX_META_BYTES + 1:,} bytes, above the limit of {ck.MAX_META_BYTES:,} bytes"


def _huge_weights(d: Path, outside: Path):
    with open(d / WEIGHTS, "r+b") as f:
        f.truncate(ck.MAX_WEIGHTS_BYTES + 1)
    return d / WEIGHTS, f"{ck.MAX_WEIGHTS_BYTES + 1:,} bytes, above the limit of {ck.MAX_WEIGHTS_BYTES:,} bytes"


FILE_CASES = {f.__name__.strip("_"): f for f in (_devzero, _escape, _json_to_passwd, _fifo, _folder, _huge_json,
                                                  _huge_weights)}


@pytest.mark.parametrize("case", sorted(FILE_CASES))
def test_links_special_files_and_oversized_files_are_refused_unread(case, base, tmp_path, built):
    d = variant(base[0], tmp_path / case)
    (tmp_path / "outside").mkdir()
    path, msg = FILE_CASES[case](d, tmp_path / "outside")
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(d)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(e.value) == f"{path}: {msg}"
    assert peak < 1 << 20, peak  # the file was never read
    assert built == []


# ---------------------------------------------------------------------------------- JSON
def _raw_json(edit):
    def go(d: Path) -> None:
        (d / META).write_bytes(edit((d / META).read_text()).encode("utf-8", "surrogateescape"))
    return go


JSON_CASES = {
    # a second "thresholds" key: the parser would keep the last one
    "duplicate_key": (_raw_json(lambda s: s.replace('"thresholds": {', '"thresholds": {"review": 0.0}, "thresholds": {', 1)),
                      "duplicate key 'thresholds' (a checkpoint's JSON keys must be unique)"),
    "overflow_number": (_raw_json(lambda s: s.replace('"review": 0.3', '"review": 1e999', 1)),
                        "number '1e999' is not finite"),
    "not_utf8": (lambda d: (d / META).write_bytes(b'{"format": "\xff"}'), "not UTF-8 text (invalid start byte at byte 12)"),
    "not_json": (lambda d: (d / META).write_text("{'format': 1}"),
                 "not valid JSON (line 1, column 2: Expecting property name enclosed in double quotes)"),
    "deep_nesting": (lambda d: (d / META).write_text("[" * 200_000 + "]" * 200_000),
                     "not valid JSON (maximum recursion depth exceeded while decoding a JSON array from a unicode string)"),
    "not_an_object": (lambda d: (d / META).write_text("[1, 2]"), "expected a JSON object, got list"),
    "wrong_format": (_raw_json(lambda s: s.replace('"fraudlens-checkpoint/1"', '"pytorch-pickle/9"', 1)),
                     "format: expected 'fraudlens-checkpoint/1', got 'pytorch-pickle/9'"),
}


@pytest.mark.parametrize("case", sorted(JSON_CASES))
def test_checkpoint_json_is_parsed_strictly(case, base, tmp_path, built):
    d = variant(base[0], tmp_path / case)
    JSON_CASES[case][0](d)
    if case == "wrong_format":  # the stored hash no longer matches: recompute it, as an attacker would
        m = json.loads((d / META).read_text())
        m["sha256"] = checkpoint_sha256((d / WEIGHTS).read_bytes(), m)
        (d / META).write_text(json.dumps(m))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    assert str(e.value) == f"{d / META}: {JSON_CASES[case][1]}"
    assert built == []


# ---------------------------------------------------------------------------------- pickles
class _Payload:
    """Unpickling this makes a folder: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_a_pickle_named_like_a_checkpoint_is_refused_never_unpickled(base, tmp_path, built):
    marker = tmp_path / "pwned"
    d = variant(base[0], tmp_path / "pickle")
    (d / WEIGHTS).write_bytes(pickle.dumps(_Payload(marker), protocol=4))
    m = json.loads((d / META).read_text())
    m["sha256"] = checkpoint_sha256((d / WEIGHTS).read_bytes(), m)
    (d / META).write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match=r"model.safetensors: not a safetensors file \(header length [\d,]+ "
                                              r"exceeds the file\) \(it looks like a pickle / torch.save file: "
                                              r"fraudlens never unpickles a checkpoint\)$"):
        load_checkpoint(d)
    # torch.save writes a zip of pickles: refused the same way
    torch.save({"head.weight": torch.zeros(1, 16)}, d / WEIGHTS)
    m["sha256"] = checkpoint_sha256((d / WEIGHTS).read_bytes(), m)
    (d / META).write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="looks like a pickle / torch.save file"):
        load_checkpoint(d)
    # a folder with only the usual pickle names is not a checkpoint at all
    only = tmp_path / "only_pickle"
    only.mkdir()
    (only / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(marker)))
    (only / "model.pt").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(FileNotFoundError, match=r"model.safetensors: not found"):
        load_checkpoint(only)
    assert not marker.exists() and built == []


def test_truncated_safetensors_is_refused(base, tmp_path, built):
    d = variant(base[0], tmp_path / "trunc")
    raw = (d / WEIGHTS).read_bytes()
    (d / WEIGHTS).write_bytes(raw[:-100])
    m = json.loads((d / META).read_text())
    m["sha256"] = checkpoint_sha256((d / WEIGHTS).read_bytes(), m)
    (d / META).write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match=r"model.safetensors: not a valid safetensors file \("):
        load_checkpoint(d)
    assert built == []


# ---------------------------------------------------------------------------------- identity
def test_identity_is_computed_from_the_files_never_taken_from_them(base, tmp_path):
    original = load_checkpoint(base[0]).sha256
    # edited weights, stored hash left as it was: a clear mismatch
    d = variant(base[0], tmp_path / "edited", state=lambda t: t["head.bias"].add_(1.0), rehash=False)
    with pytest.raises(CheckpointError, match=r"checkpoint sha256 mismatch: checkpoint.json states [0-9a-f]{12}…, the "
                                              r"files hash to [0-9a-f]{12}…; the files were changed after saving$"):
        load_checkpoint(d)
    # edited weights with a recomputed stored hash: loads, but as a different model (its own cases)
    d = variant(base[0], tmp_path / "rehashed", state=lambda t: t["head.bias"].add_(1.0))
    assert load_checkpoint(d).sha256 == checkpoint_sha256((d / WEIGHTS).read_bytes(), json.loads((d / META).read_text()))
    assert load_checkpoint(d).sha256 != original
    # no stored hash at all: the identity is still the files' hash, the same as the original's
    d = variant(base[0], tmp_path / "unstated", meta=lambda m: m.pop("sha256"), rehash=False)
    assert load_checkpoint(d).sha256 == original


def test_an_edited_demo_model_with_a_recomputed_hash_does_not_pass_as_the_demo(tmp_path, monkeypatch, built):
    d = variant(ck.ASSET_MODEL_DIR, tmp_path / "demo_model", state=lambda t: t["members.0.head.bias"].sub_(5.0))  # "no fraud"
    monkeypatch.setattr(ck, "ASSET_MODEL_DIR", d)
    with pytest.raises(CheckpointError, match=r"demo_model: the bundled demo model was changed \(its files hash to "
                                              r"[0-9a-f]{12}…, this release pins 9ab353a3bcd4…\); restore assets/demo_model$"):
        load_checkpoint()
    assert built == []


# ---------------------------------------------------------------------------------- scores
def _overflowing(base_dir: Path, out: Path) -> Path:
    """Finite weights whose logits overflow float32: head weights of +-3e38."""
    def edit(t):
        t["head.weight"].copy_(torch.tensor([3e38, -3e38] * 8).view(1, 16))
    return variant(base_dir, out, state=edit)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning")
def test_a_non_finite_score_is_an_error_not_a_pass(base, tmp_path, monkeypatch):
    _, data, frame = base
    d = _overflowing(base[0], tmp_path / "overflow")
    bundle = load_checkpoint(d)  # every weight is finite
    with pytest.raises(NonFiniteScoreError, match=r"^model [0-9a-f]{12} gave a NaN or infinite score for [\d,]+ "
                                                  r"transaction\(s\) \(r\d+, r\d+, .* more\); the model or its input "
                                                  r"is broken, so no score is reported$") as e:
        score_frame(bundle, frame)
    assert len(e.value.rows) > 5
    from engine.model.incremental import IncrementalScorer

    with pytest.raises(NonFiniteScoreError, match=r"^the model gave a NaN or infinite score for transaction r\d+ of "
                                                  r"entity \S+; "):
        IncrementalScorer(bundle).add_frame(frame)
    # the CLI: exit 2 and the message, never "0 transactions at or above the review threshold"
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "data_dir"))
    r = CliRunner().invoke(app, ["score", "--data", str(data), "--model", str(d), "--out", str(tmp_path / "s.csv")])
    assert r.exit_code == 2 and "gave a NaN or infinite score" in r.output and "at or above" not in r.output
    assert not (tmp_path / "s.csv").exists()


def test_the_cli_refuses_a_nan_checkpoint_in_one_line(base, tmp_path, monkeypatch):
    _, data, _ = base
    d = variant(base[0], tmp_path / "nan", state=lambda t: t["head.bias"].fill_(float("nan")))
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "data_dir"))
    for cmd in (["score", "--data", str(data), "--out", str(tmp_path / "s.csv")],
                ["explain", "--data", str(data), "--entity", "0:0", "--position", "-1"],
                ["dashboard"]):
        r = CliRunner().invoke(app, [*cmd, "--model", str(d)])
        out = " ".join(r.output.split())  # rich wraps long lines
        assert r.exit_code == 2, (cmd, r.output)
        assert out == f"error: checkpoint refused: {d / WEIGHTS}: tensor head.bias: 1 of 1 values are NaN or infinite"
    assert not (tmp_path / "s.csv").exists()


def test_the_shipped_checkpoints_still_load_and_score(base):
    bundle = load_checkpoint(base[0])
    s = score_frame(bundle, base[2])
    assert np.isfinite(s["logit"]).all() and s["probability"].between(0, 1).all()
    demo = load_checkpoint()
    assert demo.sha256 == ck.DEMO_MODEL_SHA256 and math.isclose(demo.threshold, 0.014283409899880266)


def test_text_from_a_checkpoint_is_printed_as_text_by_the_cli(base, tmp_path, monkeypatch):
    """A config value like ``[/red]`` would be rich markup (or crash the error printer) if not escaped."""
    _, data, _ = base
    d = variant(base[0], tmp_path / "markup", meta=_cfg(dropout="[/red][bold]x"))
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "data_dir"))
    r = CliRunner().invoke(app, ["score", "--data", str(data), "--model", str(d), "--out", str(tmp_path / "s.csv")])
    assert r.exit_code == 2, r.output
    assert " ".join(r.output.split()) == (f"error: checkpoint refused: {d / META}: model_config: dropout: expected a "
                                          "number in [0, 1), got '[/red][bold]x'")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_dashboard_shows_a_non_finite_score_as_an_error_not_flagged_0(base, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from dashboard.components.access import SESSION_KEY
    from engine.serve import access as ac

    _, data, _ = base
    d = _overflowing(base[0], tmp_path / "overflow")
    monkeypatch.setenv("FRAUDLENS_DATA_DIR", str(tmp_path / "data_dir"))
    monkeypatch.setenv("FRAUDLENS_DATA", str(data))
    monkeypatch.setenv("FRAUDLENS_SPEC", "demo")
    monkeypatch.setenv("FRAUDLENS_MODEL", str(d))
    monkeypatch.delenv("FRAUDLENS_MAX_ROWS", raising=False)
    monkeypatch.delenv("FRAUDLENS_DEMO", raising=False)
    monkeypatch.delenv("FRAUDLENS_DATA_ROOTS", raising=False)
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py"), default_timeout=60)
    at.session_state[SESSION_KEY] = ac.Identity("alice", "analyst", "password")  # as the sign-in form does
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.error and "gave a NaN or infinite score for" in at.error[0].value
    assert not [m for m in at.metric if m.label.startswith("Flagged")]


def test_an_unreadable_or_swapped_file_is_a_one_line_error(base, tmp_path, monkeypatch, built):
    """Permission denied, or a link swapped in between the check and the open (O_NOFOLLOW: ELOOP)."""
    d = variant(base[0], tmp_path / "unreadable")
    real = os.open

    for err, text in ((PermissionError(13, "Permission denied"), "Permission denied"),
                      (OSError(40, "Too many levels of symbolic links"), "Too many levels of symbolic links")):
        def fake(path, *a, _err=err, **k):
            if str(path).endswith(WEIGHTS):
                raise _err
            return real(path, *a, **k)

        monkeypatch.setattr(os, "open", fake)
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(d)
        assert str(e.value) == f"{d / WEIGHTS}: cannot be opened ({text})"
    assert built == []
