"""Which server files the dashboard may read, where uploads go, and errors that never echo a file.

* **Data roots** (:func:`data_roots`): the folders the operator lists in ``$FRAUDLENS_DATA_ROOTS``
  (separated by ``os.pathsep``), plus the bundled demo data and demo model, always. A path from
  the page is resolved with symlinks followed and must then lie inside a root
  (:func:`check_path`, ``Path.is_relative_to`` after ``resolve``): ``/etc/passwd``, ``../``
  traversal, a symlink out of a root and ``/proc/self/environ`` are refused with the same
  message whether or not the file exists. The page offers a choice among the files under the
  roots (:func:`list_files`), never a free-text path.
* **Uploads** (:class:`UploadArea`): one private folder per server process (``tempfile.mkdtemp``:
  mode 0700), files named by a random token (never the uploaded file's name), created 0600 with
  ``O_EXCL``; removed when the process exits.
* **Errors** (:func:`safe_error`): the cause class, the file's name and the row / line / column,
  never the text of the message of a reader that may quote the file's contents.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import secrets
import shutil
import tempfile
import threading
from pathlib import Path

ENV_DATA_ROOTS = "FRAUDLENS_DATA_ROOTS"
REPO_ROOT = Path(__file__).resolve().parents[2]
#: always readable: the bundled demo data and the demo model
BUILTIN_ROOTS = (REPO_ROOT / "demo_data", REPO_ROOT / "assets" / "demo_model")
DATA_SUFFIXES = (".csv", ".parquet", ".pq", ".csv.gz")
UPLOAD_SUFFIXES = DATA_SUFFIXES + (".gz",)
SPEC_SUFFIXES = (".toml",)
MAX_LISTED = 2000


class PathNotAllowed(PermissionError):
    """A path from the page is not a file (or folder) inside a configured data root."""


def data_roots(env: dict[str, str] | None = None) -> list[Path]:
    """The resolved data roots: ``$FRAUDLENS_DATA_ROOTS`` entries (``os.pathsep``-separated,
    ``~`` expanded, missing folders skipped) followed by :data:`BUILTIN_ROOTS`; no duplicates."""
    raw = (os.environ if env is None else env).get(ENV_DATA_ROOTS, "")
    out: list[Path] = []
    for part in [p for p in raw.split(os.pathsep) if p.strip()] + [str(p) for p in BUILTIN_ROOTS]:
        r = Path(part.strip()).expanduser().resolve()
        if r.is_dir() and r not in out:
            out.append(r)
    return out


def within_roots(path: str | Path, roots: list[Path]) -> Path | None:
    """``path`` resolved (symlinks followed) if it lies inside one of ``roots``, else ``None``."""
    try:
        p = Path(path).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return None
    return p if any(p.is_relative_to(r) for r in roots) else None


def check_path(path: str | Path, roots: list[Path] | None = None, *, kind: str = "file") -> Path:
    """``path`` resolved, if it is a ``kind`` (``file`` or ``dir``) inside a data root.

    Raises :class:`PathNotAllowed` with one message for every refusal outside the roots (so
    the page cannot probe which server files exist), and :class:`FileNotFoundError` for a
    missing file inside a root.
    """
    roots = data_roots() if roots is None else roots
    p = within_roots(path, roots)
    if p is None:
        raise PathNotAllowed(f"{Path(str(path)).name or 'path'}: not inside a data root "
                             f"(the operator lists them in ${ENV_DATA_ROOTS})")
    if (kind == "file" and not p.is_file()) or (kind == "dir" and not p.is_dir()):
        raise FileNotFoundError(f"{p.name}: no such {kind} in the data roots")
    return p


def list_files(roots: list[Path] | None = None, suffixes: tuple[str, ...] = DATA_SUFFIXES,
               limit: int = MAX_LISTED) -> list[Path]:
    """Files under the roots whose name ends with one of ``suffixes`` (any case), resolved and
    inside a root (a symlink leading out is left out), sorted, at most ``limit``. Hidden
    folders are not entered; symlinked folders are not followed."""
    roots = data_roots() if roots is None else roots
    out: list[Path] = []
    for root in roots:
        for d, dirs, files in os.walk(root, followlinks=False):
            dirs[:] = sorted(x for x in dirs if not x.startswith("."))
            for f in sorted(files):
                if f.lower().endswith(suffixes):
                    p = within_roots(Path(d) / f, roots)
                    if p is not None and p.is_file() and p not in out:
                        out.append(p)
                        if len(out) >= limit:
                            return out
    return out


def display_name(path: Path, roots: list[Path]) -> str:
    """``path`` relative to the root it lies in, prefixed by that root's folder name."""
    for r in roots:
        if path.is_relative_to(r):
            return f"{r.name}/{path.relative_to(r)}"
    return path.name


ENV_MAX_UPLOAD_MB = "FRAUDLENS_MAX_UPLOAD_MB"
#: default most megabytes (10**6 bytes) an upload may hold once decompressed
DEFAULT_MAX_UPLOAD_MB = 100.0


class UploadTooLarge(ValueError):
    """An upload larger than the limit once decompressed (a compression bomb, or a file that
    belongs in a data root)."""


def max_upload_bytes(env: dict[str, str] | None = None) -> int:
    """``$FRAUDLENS_MAX_UPLOAD_MB`` (default :data:`DEFAULT_MAX_UPLOAD_MB`) in bytes. Raises
    ``ValueError`` for a value that is not a positive number."""
    raw = (os.environ if env is None else env).get(ENV_MAX_UPLOAD_MB, "").strip()
    try:
        mb = float(raw) if raw else DEFAULT_MAX_UPLOAD_MB
    except ValueError:
        mb = -1.0
    if not mb > 0:
        raise ValueError(f"{ENV_MAX_UPLOAD_MB}: expected a positive number of megabytes, got {raw!r}")
    return int(mb * 1e6)


def check_upload_size(data: bytes, limit: int) -> int:
    """The size of ``data`` once decompressed, in bytes, read in 1 MiB steps and never past
    ``limit`` + 1: gzip / bzip2 / xz as the file reader opens them (magic bytes); for a Parquet
    file the larger of its uncompressed row-group bytes and 16 bytes per cell (rows x columns,
    from the footer: a dictionary-encoded column of one long value is tiny on disk and not in
    memory); else ``len(data)``. A corrupt stream or footer is measured as far as it reads (the
    file reader then names the problem).

    Raises :class:`UploadTooLarge` when that exceeds ``limit`` (a 1 MB gzip of 300 MB of text
    cost the dashboard 3.4 GB of memory before this check).
    """
    import io

    from engine.data.sniff import _OPENERS, _compression

    def too_large(what: str) -> UploadTooLarge:
        return UploadTooLarge(f"the upload {what} more than the {limit / 1e6:,.0f} MB an upload may hold "
                              f"({ENV_MAX_UPLOAD_MB}); put a file this large in a data root (FRAUDLENS_DATA_ROOTS) "
                              "and open it from there")

    comp = _compression(data[:8])
    if comp is not None:
        import lzma

        n = 0
        try:
            with _OPENERS[comp](io.BytesIO(data), "rb") as f:
                while chunk := f.read(1 << 20):
                    n += len(chunk)
                    if n > limit:
                        raise too_large("decompresses to")
        except (OSError, EOFError, lzma.LZMAError):  # corrupt: the reader says so when it opens the file
            pass
        return n
    if data[:4] == b"PAR1":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            md = pq.ParquetFile(io.BytesIO(data)).metadata
        except (pa.ArrowException, OSError):  # the reader names the problem
            return len(data)
        n = max(sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups)),
                16 * md.num_rows * md.num_columns)
        if n > limit:
            raise too_large("holds")
        return n
    if len(data) > limit:
        raise too_large("holds")
    return len(data)


class UploadArea:
    """A private upload folder for this process (created on first use with ``tempfile.mkdtemp``,
    mode 0700, removed at exit). :meth:`save` writes bytes to a random-token file name."""

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._by_digest: dict[str, Path] = {}
        self._lock = threading.Lock()

    @property
    def folder(self) -> Path:
        """The folder (created 0700 on first use)."""
        with self._lock:
            if self._dir is None or not self._dir.is_dir():
                self._dir = Path(tempfile.mkdtemp(prefix="fraudlens-uploads-"))
                atexit.register(shutil.rmtree, self._dir, True)
            return self._dir

    def save(self, name: str, data: bytes) -> Path:
        """Write ``data`` (an upload called ``name``) and return its path: a random 32-hex name
        plus the recognised suffix of ``name`` (:data:`UPLOAD_SUFFIXES`; otherwise ``.csv``), created 0600 and never overwritten. The same bytes in this process
        return the same path (so caches keyed by path hit).

        Raises :class:`UploadTooLarge` (nothing written) when ``data`` holds more than
        :func:`max_upload_bytes` once decompressed (:func:`check_upload_size`)."""
        check_upload_size(data, max_upload_bytes())
        digest = hashlib.sha256(data).hexdigest()
        low = (name or "").lower()
        suffix = next((s for s in sorted(UPLOAD_SUFFIXES, key=len, reverse=True) if low.endswith(s)), ".csv")
        folder = self.folder
        with self._lock:
            p = self._by_digest.get(digest)
            if p is not None and p.is_file():
                return p
            p = folder / f"{secrets.token_hex(16)}{suffix}"
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self._by_digest[digest] = p
            return p


_LOC_RES = (re.compile(r"\brow[s]?\s+(\d+)", re.I), re.compile(r"\bline\s+(\d+)", re.I),
            re.compile(r"\bcolumn\s+(\d+)", re.I))


def safe_error(e: BaseException, path: str | Path | None = None, known_columns: tuple[str, ...] = ()) -> str:
    """A one-line message for a failure to read ``path``, safe to show in the page: the cause
    class, the file's name, the row / line / column numbers in the original message, and the
    names among ``known_columns`` (the spec's columns, not the file's) it mentions. No other text
    of the message is kept, since a reader's message may quote the file."""
    msg = str(e)
    parts = []
    for rx, label in zip(_LOC_RES, ("row", "line", "column")):
        m = rx.search(msg)
        if m:
            parts.append(f"{label} {m.group(1)}")
    cols = [c for c in known_columns if f"'{c}'" in msg or f'"{c}"' in msg]
    if cols:
        parts.append("column" + ("s " if len(cols) > 1 else " ") + ", ".join(repr(c) for c in cols[:8])
                     + (" …" if len(cols) > 8 else ""))
    if "not found" in msg and cols:
        parts.insert(0, "required columns not found")
    where = f" reading {Path(str(path)).name}" if path else ""
    return f"{type(e).__name__}{where}" + (f": {'; '.join(parts)}" if parts else "") + " (details in the server log)"
