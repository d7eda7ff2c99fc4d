"""Watch for any access of this test process to the user's real fraudlens data dir (used by
tests/conftest.py's ``private_data_dir`` fixture and tests/test_data_dir.py)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

#: folders being watched (empty: not watching)
REAL_DATA_DIRS: list[Path] = []
#: one line per access seen: "<audit event> <path>"
HITS: list[str] = []
WATCHED_EVENTS = {"open", "sqlite3.connect", "sqlite3.connect/handle", "os.mkdir", "os.rename",
                  "os.replace", "os.remove", "os.rmdir", "os.chmod", "os.truncate", "shutil.rmtree",
                  "shutil.copyfile", "shutil.move"}


def real_data_dirs() -> list[Path]:
    """The folders the user's own case store may be in, resolved from the current environment
    (call before the environment is redirected)."""
    dirs = [Path(platformdirs.user_data_dir("fraudlens")).expanduser()]
    env = os.environ.get("FRAUDLENS_DATA_DIR", "").strip()
    if env:
        dirs.append(Path(env).expanduser())
    return list(dict.fromkeys(d.resolve() for d in dirs))


def touches_real_dir(path: object, real: list[Path] | tuple[Path, ...]) -> bool:
    """True if ``path`` (str, bytes or os.PathLike; anything else: False) lies in one of ``real``."""
    if isinstance(path, int) or path is None:
        return False
    try:
        p = os.fsdecode(os.fspath(path))
    except TypeError:
        return False
    if not p or p == ":memory:" or p.startswith("file:"):
        return False
    full = Path(os.path.abspath(os.path.expanduser(p)))
    return any(full == d or d in full.parents for d in real)


def audit_hook(event: str, args: tuple) -> None:
    """``sys.addaudithook`` callback: record watched events on paths in :data:`REAL_DATA_DIRS`."""
    if REAL_DATA_DIRS and args and event in WATCHED_EVENTS:
        if touches_real_dir(args[0], REAL_DATA_DIRS):
            HITS.append(f"{event} {args[0]!r}")
