"""The test suite never reaches the user's real data dir (issue 12, item 7): the session-wide
``private_data_dir`` fixture of tests/conftest.py points ``FRAUDLENS_DATA_DIR`` and
``XDG_DATA_HOME`` into a temporary folder, subprocesses included, and watches this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import data_dir_guard as guard

ROOT = Path(__file__).resolve().parent.parent

_PROBE = """
import json, platformdirs
from engine.cases.store import CaseStore, default_db_path
from engine.cases.report.model import pseudonym_salt
with CaseStore() as s:
    path = str(s.path)
    s.set_thresholds("a" * 64, 0.5, 0.9, actor="probe")
pseudonym_salt()
print(json.dumps({"db": path, "default": str(default_db_path()),
                  "platform": platformdirs.user_data_dir("fraudlens")}))
"""


def _under(p: str | Path, base: Path) -> bool:
    return Path(p).resolve().is_relative_to(base.resolve())


def test_subprocess_resolves_the_session_temp_dir(private_data_dir):
    """A child process (as the CLI and the browser tests' dashboard server are) writes its case
    store and key into the session's temporary folder, never into the real data dir."""
    env = {k: v for k, v in os.environ.items() if k != "FRAUDLENS_PSEUDONYM_SALT"}
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    real = [Path(p) for p in os.environ["FRAUDLENS_TEST_REAL_DATA_DIRS"].split(os.pathsep) if p]
    assert real, "the real data dirs were not recorded"
    for key in ("db", "default", "platform"):
        assert _under(got[key], private_data_dir), (key, got[key])
        assert not any(_under(got[key], r) for r in real), (key, got[key])
    assert (private_data_dir / "data" / "cases.sqlite3").is_file()
    assert (private_data_dir / "data" / "pseudonym_salt").is_file()


def test_default_store_in_process_is_private(private_data_dir):
    """``CaseStore()`` without a path, here, lands in the temp folder; the audit hook saw no
    access to the real folders (the same check fails the session at its end)."""
    from engine.cases.store import CaseStore, default_db_path

    assert _under(default_db_path(), private_data_dir)
    with CaseStore() as s:
        assert _under(s.path, private_data_dir)
    assert guard.REAL_DATA_DIRS, "the watch is not on"
    assert guard.HITS == []


def test_real_dir_watch_recognises_paths(tmp_path):
    """The watch's path test (pure: nothing is opened)."""
    real = (tmp_path / "real" / "fraudlens",)
    assert guard.touches_real_dir(str(real[0] / "cases.sqlite3"), real)
    assert guard.touches_real_dir(real[0], real)
    assert guard.touches_real_dir(os.fsencode(str(real[0] / "x")), real)
    assert not guard.touches_real_dir(str(tmp_path / "real" / "fraudlens-other" / "x"), real)
    assert not guard.touches_real_dir(3, real)
    assert not guard.touches_real_dir(":memory:", real)
