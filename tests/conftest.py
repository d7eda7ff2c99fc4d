"""Shared pytest fixtures. Others may append fixtures below; keep each one documented."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` next to the repository (real public datasets, read in place, never
    copied into the repo). Tests that use it are skipped where it is missing."""
    p = (REPO_ROOT / ".." / "shared" / "data").resolve()
    if not p.is_dir():
        pytest.skip(f"shared data folder not found: {p}")
    return p
