"""Fixtures shared by the scoring-service tests (module scope: one tiny checkpoint per test file)."""

import pytest

from engine.model.checkpoint import load_checkpoint
from serve_helpers import batch_probabilities, make_checkpoint, raw_records


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    """A tiny checkpoint directory fitted to :func:`serve_helpers.raw_records`' data."""
    return make_checkpoint(tmp_path_factory.mktemp("serve-ck"))


@pytest.fixture(scope="module")
def bundle(ck):
    return load_checkpoint(ck)


@pytest.fixture(scope="module")
def records():
    return raw_records()


@pytest.fixture(scope="module")
def batch_probs(bundle, records, tmp_path_factory):
    """Whole-file scoring of the records: transaction id -> probability."""
    return batch_probabilities(bundle, records, tmp_path_factory.mktemp("raw"))
