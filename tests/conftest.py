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


# ------------------------------------------------------------------------------------------------
# The user's real data dir is never touched.
#
# The case store and the pseudonymisation key live in ``$FRAUDLENS_DATA_DIR`` or, without it,
# ``platformdirs.user_data_dir("fraudlens")`` (``$XDG_DATA_HOME/fraudlens``, else
# ``~/.local/share/fraudlens``). The audit log is append-only: a test case written there can never
# be removed. So for the whole session both variables point into a temporary folder (set in
# ``os.environ``, so every subprocess, CLI run and the browser tests' dashboard server inherit
# them), and an audit hook (``sys.addaudithook``: ``open``, ``sqlite3.connect``, ``os.mkdir``,
# ``os.rename``, ``os.remove``, ...) records any access of this test process to the real folders;
# the session fails at its end if there was one (tests/data_dir_guard.py). tests/test_data_dir.py
# proves it from a subprocess as well.


@pytest.fixture(scope="session", autouse=True)
def private_data_dir(tmp_path_factory) -> Path:
    """Session-wide, automatic: ``FRAUDLENS_DATA_DIR`` and ``XDG_DATA_HOME`` point into a temporary
    folder for the whole session (subprocesses included); fails the session if this process
    opened, created or changed anything in the user's real data dir. Yields the folder:
    ``<it>/data`` is the data dir, ``<it>/xdg-data`` the platformdirs base."""
    import os
    import sys

    import data_dir_guard as guard

    guard.REAL_DATA_DIRS[:] = guard.real_data_dirs()
    base = tmp_path_factory.mktemp("fraudlens-user")
    mp = pytest.MonkeyPatch()
    mp.setenv("FRAUDLENS_DATA_DIR", str(base / "data"))
    mp.setenv("XDG_DATA_HOME", str(base / "xdg-data"))
    mp.setenv("FRAUDLENS_TEST_REAL_DATA_DIRS", os.pathsep.join(map(str, guard.REAL_DATA_DIRS)))
    if not getattr(sys, "_fraudlens_audit_hook", False):  # hooks cannot be removed: add once
        sys.addaudithook(guard.audit_hook)
        sys._fraudlens_audit_hook = True
    try:
        yield base
    finally:
        mp.undo()
        hits = list(guard.HITS)
        guard.REAL_DATA_DIRS.clear()
        if hits:
            pytest.fail(f"the tests touched the user's real data dir: {hits[:5]}", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def no_background_precompute():
    """Session-wide, automatic: ``FRAUDLENS_PRECOMPUTE_S=0`` so the dashboard does not start its
    background explanation thread (dashboard/state.py ``start_precompute``) in tests that do not
    ask for it; a test of the thread sets it itself."""
    mp = pytest.MonkeyPatch()
    mp.setenv("FRAUDLENS_PRECOMPUTE_S", "0")
    # a test that starts the precompute process runs it at normal priority: at niceness 15 it gets
    # almost no CPU while the other pytest worker runs (the niceness test sets its own value)
    mp.setenv("FRAUDLENS_PRECOMPUTE_NICENESS", "0")
    mp.setenv("FRAUDLENS_LEAD_PAUSE_S", "0")  # the Case page's pause after the reasons box (dashboard/timing.py)
    yield
    mp.undo()
