"""The speed benchmark's measuring functions run on a tiny model and count what they claim
(no timing is asserted: speed is measured by `fraudlens bench speed`, never by unit tests)."""

import numpy as np
import pytest
import torch

from engine.bench.speed import case_open_times, incremental_latency, rescoring_rate
from engine.model.checkpoint import load_checkpoint

from tiny_models import tiny_checkpoint, tiny_frame, tiny_spec


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt")
    return load_checkpoint(tiny_checkpoint(tiny_frame(4, 40), tiny_spec(), out, {"thresholds": {"review": 0.5}}))


def test_incremental_latency_counts_every_new_transaction(bundle):
    fr = tiny_frame(3, 40, seed=2)
    before = torch.get_num_threads()
    p50, p99, n = incremental_latency(bundle, fr, n_entities=2, n_new=5)
    assert n == 10 and 0 < p50 <= p99
    assert torch.get_num_threads() == before  # the 1-thread setting does not leak into later measurements


def test_case_open_times_explains_full_contexts_after_a_warm_up(bundle):
    fr = tiny_frame(4, 40, seed=3)
    p50, p95, n, T = case_open_times(bundle, fr, n=2, ig_steps=4)
    assert n == 2 and T == bundle.config.context_length and 0 < p50 <= p95


def test_rescoring_rate_is_a_positive_rate(bundle):
    fr = tiny_frame(2, 30, seed=4)
    enc = bundle.encoder.transform(fr)
    assert np.isfinite(rescoring_rate(bundle, fr, enc, n=5)) and rescoring_rate(bundle, fr, enc, n=5) > 0
