"""The recent-activity and first-seen fields computed inside the row encoder
(engine/model/activity.py): every number recomputed by brute force, removal-honest, validated."""

import math

import numpy as np
import pytest
import torch

from engine.model.activity import activity_inputs, n_activity_inputs
from engine.model.config import ModelConfig

WINDOWS = [3600.0, 86400.0]


def _brute(time_s, present, z, cat, windows):
    """Per position, the features written out with Python loops over the earlier present rows."""
    T = len(time_s)
    recent, seen = [], []
    for t in range(T):
        prev = [s for s in range(t) if present[s]]
        row = []
        for w in windows:
            inside = [s for s in prev if time_s[t] - time_s[s] <= w]
            row += [math.log1p(len(inside)) / 3.0, (z[t] - np.mean([z[s] for s in inside])) if inside else 0.0]
        if len(prev) >= 2:
            zz = np.array([z[s] for s in prev])
            row.append(float(np.clip((z[t] - zz.mean()) / math.sqrt(zz.var() + 0.25), -6, 6)))
            row += [math.log1p((time_s[t] - time_s[prev[-2]]) / 60.0) / 5.0, 1.0]
        else:
            row += [0.0, 0.0, 0.0]
        recent.append(row)
        flags = [float(bool(prev) and all(cat[s][j] != cat[t][j] for s in prev)) for j in range(cat.shape[1])]
        seen.append(flags + [float(bool(prev))])
    return np.array(recent), np.array(seen)


def _example(seed=0, T=12):
    rng = np.random.default_rng(seed)
    time_s = np.cumsum(rng.exponential(1800.0, T))
    z = rng.normal(0, 1, T).astype(np.float32)
    cat = rng.integers(0, 3, (T, 2))
    present = rng.random(T) > 0.25
    return time_s, present, z, cat


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_activity_inputs_equal_brute_force(seed):
    time_s, present, z, cat = _example(seed)
    recent, seen = activity_inputs(torch.tensor(time_s)[None], torch.tensor(present)[None], torch.tensor(z)[None],
                                   torch.tensor(cat)[None], WINDOWS)
    want_r, want_s = _brute(time_s, present, z, cat, WINDOWS)
    assert recent.shape == (1, len(time_s), n_activity_inputs(len(WINDOWS)))
    np.testing.assert_allclose(recent[0].numpy(), want_r, atol=1e-5)
    np.testing.assert_array_equal(seen[0].numpy(), want_s)


def test_removing_an_earlier_transaction_changes_the_later_counts():
    time_s = np.array([0.0, 600.0, 1200.0, 1800.0])
    z = np.zeros(4, np.float32)
    cat = np.array([[1], [2], [2], [1]])
    args = lambda p: (torch.tensor(time_s)[None], torch.tensor(p)[None], torch.tensor(z)[None], torch.tensor(cat)[None])
    full, seen_full = activity_inputs(*args(np.array([True, True, True, True])), [3600.0])
    cut, seen_cut = activity_inputs(*args(np.array([False, True, True, True])), [3600.0])
    assert full[0, 3, 0].item() == pytest.approx(math.log1p(3) / 3)  # three earlier rows in the hour
    assert cut[0, 3, 0].item() == pytest.approx(math.log1p(2) / 3)  # one fewer once row 0 is removed
    assert seen_full[0, 3, 0].item() == 0.0  # value 1 was seen at row 0 ...
    assert seen_cut[0, 3, 0].item() == 1.0  # ... and is new once row 0 is removed


def _cfg(**kw):
    base = dict(cat_cardinalities=[3, 5], cat_field_index=[0, 1], num_field_index=[0], multi_slots=[],
                field_names=["amount", "time_since_prev", "recent_activity", "first_seen"],
                activity_windows_s=[3600.0], first_seen_cols=[1])
    return ModelConfig(**{**base, **kw})


def test_config_checks_the_activity_fields():
    assert _cfg().activity_windows_s == [3600.0]
    with pytest.raises(ValueError, match="activity_windows_s"):
        _cfg(activity_windows_s=[-1.0])
    with pytest.raises(ValueError, match="first_seen_cols"):
        _cfg(first_seen_cols=[5])
    with pytest.raises(ValueError, match="end with"):
        _cfg(field_names=["amount", "time_since_prev", "x", "y"])
    with pytest.raises(ValueError, match="first_seen_cols: expected \\[\\]"):
        _cfg(activity_windows_s=[], field_names=["amount", "time_since_prev", "a", "b"])
    legacy = ModelConfig.from_dict({k: v for k, v in _cfg().to_dict().items()
                                    if k not in ("activity_windows_s", "first_seen_cols")}
                                   | {"field_names": ["amount", "time_since_prev", "a", "b"]})
    assert legacy.activity_windows_s == [] and legacy.first_seen_cols == []


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_prefix_sum_path_equals_the_general_one(seed, monkeypatch):
    """Histories in time order take the O(B T log T) path (prefix sums, running maxima, a sort
    for first-seen); it equals the general [B, T, T] path on batches of different histories with
    ties, gaps of exactly a window length, left padding, all-absent rows and repeated values; an
    unsorted row falls back to the general path."""
    from engine.model import activity as act

    rng = np.random.default_rng(seed)
    B, T = 16, 40
    time_s = np.sort(np.round(rng.exponential(900.0, (B, T)).cumsum(1) / 300.0) * 300.0, axis=1)
    time_s[:, :5] = time_s[:, :1]  # left padding carries the first time, as pack_present does
    time_s[2] += 1.7e9 + 0.123  # epoch seconds with a fraction
    present = rng.random((B, T)) > rng.uniform(0.0, 0.8, (B, 1))
    present[:, :5] = False
    present[0] = False
    z = rng.normal(0, 1, (B, T)).astype(np.float32)
    cat = rng.integers(0, 4, (B, T, 3))
    args = (torch.tensor(time_s), torch.tensor(present), torch.tensor(z), torch.tensor(cat))
    windows = [600.0, 3600.0, 86400.0]
    fast = act._activity_inputs_sorted(*args, windows)
    assert fast is not None
    monkeypatch.setattr(act, "_activity_inputs_sorted", lambda *a: None)  # the general path
    general = act.activity_inputs(*args, windows)
    np.testing.assert_allclose(fast[0].numpy(), general[0].numpy(), atol=2e-5)
    np.testing.assert_array_equal(fast[1].numpy(), general[1].numpy())
    monkeypatch.undo()
    for b in (1, 2, 9):  # and the brute force of single rows
        want_r, want_s = _brute(time_s[b], present[b], z[b], cat[b], windows)
        np.testing.assert_allclose(fast[0][b].numpy(), want_r, atol=2e-5)
        np.testing.assert_array_equal(fast[1][b].numpy(), want_s)
    shuffled = args[0].clone()
    shuffled[3, 10] = float(shuffled[3, 11]) + 5.0  # later than its successor
    assert act._activity_inputs_sorted(shuffled, *args[1:], windows) is None
