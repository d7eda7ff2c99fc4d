"""The one CSV writer of fraudlens: every CSV the project writes goes through :func:`write_csv`
or :func:`csv_bytes`, which neutralise formula-like text cells first (CSV / formula injection,
OWASP: https://owasp.org/www-community/attacks/CSV_Injection).

* :func:`neutralise_csv_cell` / :func:`neutralise_csv_frame` - the neutralisation rule (a text
  cell starting with a formula trigger gets a leading single quote);
* :func:`csv_bytes` - a frame as neutralised CSV bytes (UTF-8, ``\\n`` line ends, no index);
* :func:`write_csv` - the same bytes to a path or an open binary / text buffer;
* :func:`write_private_bytes` / :func:`write_private_text` - how a path is written: atomically,
  0600, never through a symlink (score, explain and rejected-row files hold card numbers and
  personal data).

``tests/test_csv_writer_only.py`` fails on any ``.to_csv(`` or ``csv.writer(`` outside this
module, so a new CSV output cannot bypass the rule. This is the lowest layer (``engine.data``),
so every layer can use it; :mod:`engine.cases.redact` re-exports the two neutralise functions.
"""

from __future__ import annotations

import csv
import io
import os
import re
import secrets
import stat
from pathlib import Path
from typing import IO, Any

import pandas as pd

OWASP_CSV_INJECTION_URL = "https://owasp.org/www-community/attacks/CSV_Injection"

#: First characters that make a spreadsheet treat a cell as a formula (OWASP list, plus NUL
#: from OWASP ASVS 5.0 V1.2.10, plus the full-width forms of ``= + - @`` (U+FF1D, U+FF0B,
#: U+FF0D, U+FF20) that some spreadsheet locales fold to their ASCII forms on input).
CSV_FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r", "\x00", "\uff1d", "\uff0b", "\uff0d", "\uff20")
#: a trigger after leading white space (any Unicode space, line feed included) or invisible
#: characters (BOM U+FEFF, zero-width and direction marks U+200B-U+200F, bidi embeddings U+202A-U+202E,
#: U+2060-U+2064, U+180E, soft hyphen U+00AD, U+034F) counts too: some
#: importers trim those before deciding that a cell is a formula
_FORMULA_START = re.compile("[\\s\ufeff\u200b-\u200f\u202a-\u202e\u2060-\u2064\u180e\u00ad\u034f]*["
                            + re.escape("".join(CSV_FORMULA_TRIGGERS)) + "]")


def neutralise_csv_cell(value: Any) -> Any:
    """Make one CSV cell safe to open in a spreadsheet (CSV / formula injection).

    Per OWASP (https://owasp.org/www-community/attacks/CSV_Injection): a *string* starting with
    ``=``, ``+``, ``-``, ``@``, tab (0x09) or carriage return (0x0D) - and NUL (0x00, OWASP
    ASVS 5.0 V1.2.10), and the full-width ``＝ ＋ － ＠`` - gets a leading single quote, so the
    spreadsheet shows it as text instead of evaluating it (``"=HYPERLINK(...)"`` ->
    ``"'=HYPERLINK(...)"``; a string ``"-5"`` becomes ``"'-5"``).

    The first character is tested after any leading white space and invisible characters
    (``" =x"``, ``"\\n=x"``, ``"\\ufeff=x"`` are quoted too: some importers trim those first); ``"a=b"``
    is unchanged, and an already-quoted ``"'=x"`` is not quoted twice.

    Non-strings are returned unchanged - numbers stay numbers (a negative amount ``-12.5`` as a
    float stays the float ``-12.5``), as do ``None``, NaN, bools, timestamps. Quoting of embedded
    quotes, commas and newlines (the other half of the OWASP advice) is the CSV writer's job:
    :func:`write_csv` / :func:`csv_bytes` (RFC 4180 quoting), never string concatenation.
    """
    if isinstance(value, str) and _FORMULA_START.match(value):
        return "'" + value
    return value


def neutralise_csv_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``frame`` with :func:`neutralise_csv_cell` applied to every cell of its
    object / string / categorical columns (and to string column names). Numeric columns are
    untouched, and a column without a cell to change keeps its values and dtype.
    OWASP: https://owasp.org/www-community/attacks/CSV_Injection
    """
    out = frame.copy()
    for col in out.columns:
        s = out[col]
        if isinstance(s.dtype, pd.CategoricalDtype):
            s = s.astype(object)
        elif not (s.dtype == object or pd.api.types.is_string_dtype(s.dtype)):
            continue
        mapped = s.map(neutralise_csv_cell)
        if isinstance(out[col].dtype, pd.CategoricalDtype) or not mapped.equals(s):
            out[col] = mapped
    out.columns = [neutralise_csv_cell(c) for c in out.columns]
    return out


#: control characters written as the text ``\\xNN``: C0 but tab, line feed and carriage return
#: (kept: valid inside a quoted field), DEL, and C1 (0x9B is a terminal's CSI on its own); and,
#: written as ``\\uNNNN``, the Unicode bidirectional controls (U+061C, U+200E, U+200F,
#: U+202A-U+202E, U+2066-U+2069: "Trojan Source", CVE-2021-42574, https://trojansource.codes/) that
#: make a cell read in another order than it is stored (an amount or an id shown reversed), and
#: the line / paragraph separators U+2028 and U+2029 that some viewers break a row at
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def show_controls(v: str) -> str:
    """``v`` with its control characters written as visible text: C0 (but tab, line feed, carriage
    return), DEL and C1 as ``\\xNN``, bidi controls and U+2028 / U+2029 as ``\\uNNNN``
    (``"a\\u202eb"`` -> ``"a\\\\u202eb"``). Used for CSV cells and for text printed on a terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                        else f"\\u{ord(m.group()):04x}", v)


def _visible_controls(frame: pd.DataFrame) -> pd.DataFrame:
    """Control characters inside a text cell (and a column name) written as the text ``\\xNN``
    (NUL as ``\\x00``, ESC as ``\\x1b``) and bidi controls as ``\\uNNNN`` (U+202E as
    ``\\u202e``): a raw NUL byte ends the field in C-based CSV readers
    and spreadsheets, and an ESC or CSI sequence from the data would drive the terminal of whoever
    runs ``cat`` or ``less -r`` on the file (clear the screen, set the title, forge lines). Tab,
    line feed and carriage return are valid inside a quoted field and kept."""
    for col in frame.columns:
        s = frame[col]
        if s.dtype == object or pd.api.types.is_string_dtype(s.dtype):
            hit = s.map(lambda v: isinstance(v, str) and _CONTROL.search(v) is not None)
            if hit.any():
                frame[col] = s.map(lambda v: show_controls(v) if isinstance(v, str) else v)
    frame.columns = [show_controls(c) if isinstance(c, str) else c for c in frame.columns]
    return frame


def csv_bytes(frame: pd.DataFrame, *, index: bool = False) -> bytes:
    """``frame`` as CSV bytes: neutralised (:func:`neutralise_csv_frame`), control characters shown
    as the text ``\\xNN`` (:func:`_visible_controls`), UTF-8, ``\\n`` line ends, RFC 4180 quoting
    (every text field quoted when one holds a carriage return), without the index unless ``index``.
    A frame with no formula-like or control-character text cell gives exactly
    ``frame.to_csv(index=False, lineterminator="\\n")`` encoded."""
    if index:
        frame = frame.reset_index()
    out = _visible_controls(neutralise_csv_frame(frame))
    # the csv module quotes a field holding "\n" but not one holding a bare "\r" when the line end
    # is "\n": a spreadsheet would then split the row there. Quote every text field in that case.
    has_cr = any(out[c].map(lambda v: isinstance(v, str) and "\r" in v).any() for c in out.columns
                 if out[c].dtype == object or pd.api.types.is_string_dtype(out[c].dtype))
    has_cr = has_cr or any(isinstance(c, str) and "\r" in c for c in out.columns)
    quoting = csv.QUOTE_NONNUMERIC if has_cr else csv.QUOTE_MINIMAL
    return out.to_csv(index=False, lineterminator="\n", quoting=quoting).encode("utf-8")


class PrivateFile:
    """A new file written in pieces and put at ``path`` only when complete, readable by its owner
    only, never through a link: the rules of :func:`write_private_bytes` for streamed outputs (the
    Parquet file of ``fraudlens score --partitions``, written partition by partition).

    ``file`` is the open binary file: a new temporary file in ``path``'s folder (created
    ``O_CREAT | O_EXCL | O_NOFOLLOW``, mode 0600), or ``path`` itself when it is a stream (a
    character device such as ``/dev/stdout``, a FIFO). :meth:`commit` flushes it to disk and
    :func:`os.replace` puts it at ``path`` (a symlink at ``path`` is replaced, its target never
    written; an existing file is replaced); :meth:`abort` removes it. Parent folders are created.

    Raises ``IsADirectoryError`` when ``path`` is a directory (not a link to one), ``OSError``
    when it cannot be created.
    """

    def __init__(self, path: "str | Path"):
        p = self.path = Path(path)
        if p.is_dir() and not p.is_symlink():
            raise IsADirectoryError(f"{p}: is a directory, not a file to write")
        try:
            mode = os.stat(p).st_mode  # follows a link: /dev/stdout, a pipe of the shell's >(...)
        except OSError:
            mode = 0
        self.tmp: Path | None = None
        if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):  # a stream, not a file: written to as it is
            self.file = open(p, "wb")
            return
        p.parent.mkdir(parents=True, exist_ok=True)
        # a random name in the target's folder: os.replace is atomic only within one file system, and
        # O_EXCL | O_NOFOLLOW refuse a file or link planted at a guessable name
        self.tmp = p.parent / f".{p.name}.{secrets.token_hex(8)}.tmp"
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        self.file = os.fdopen(fd, "wb")

    def commit(self) -> Path:
        """Flush to disk, close, and put the file at ``path`` (returned); on failure it is removed."""
        try:
            self.file.flush()
            if self.tmp is not None:
                os.fsync(self.file.fileno())  # the data is on disk before the name points at it
            self.file.close()
            if self.tmp is not None:
                os.replace(self.tmp, self.path)  # rename(2) replaces a link at ``path`` itself, never its target
        except BaseException:
            self.abort()
            raise
        return self.path

    def abort(self) -> None:
        """Close and remove the temporary file (``path`` is left as it was). Idempotent."""
        try:
            self.file.close()
        except OSError:
            pass
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)


def write_private_bytes(path: "str | Path", data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically, readable by its owner only, never through a link.

    The bytes go to a new temporary file in the same folder (created ``O_CREAT | O_EXCL |
    O_NOFOLLOW``, mode 0600), are flushed to disk, then :func:`os.replace` puts that file at
    ``path``: a reader sees the old file or the whole new one, never half of it. A symlink at
    ``path`` is itself replaced (its target is never written), and so is an existing regular file
    (re-running ``fraudlens score`` with the same ``--out`` is normal); the result is a new file
    of mode 0600 whatever the old one's mode was. A stream at ``path`` (``/dev/stdout``, a FIFO)
    is written to. Parent folders are created. Returns the path (:class:`PrivateFile`).

    Raises ``IsADirectoryError`` when ``path`` is a directory (not a link to one), ``OSError``
    when it cannot be written; the temporary file is removed on any failure.
    """
    out = PrivateFile(path)
    try:
        out.file.write(data)
    except BaseException:
        out.abort()
        raise
    return out.commit()


def write_private_text(path: "str | Path", text: str, encoding: str = "utf-8") -> Path:
    """:func:`write_private_bytes` of ``text`` encoded (UTF-8 by default; line ends kept as
    given, no platform translation). Same errors; returns the path."""
    return write_private_bytes(path, text.encode(encoding))


def write_csv(frame: pd.DataFrame, path_or_buffer: "str | Path | IO[bytes] | IO[str]", *,
              index: bool = False) -> "Path | IO[Any]":
    """Write ``frame`` as neutralised CSV (:func:`csv_bytes`) to ``path_or_buffer``.

    A path: written by :func:`write_private_bytes` (atomically, mode 0600, a symlink at the path
    replaced rather than written through, an existing file replaced; the rows may hold card
    numbers and personal data); parent folders are created and the path is returned. An open
    buffer: binary buffers get the bytes, text buffers (:class:`io.TextIOBase`) the UTF-8 text;
    the buffer is returned. Raises ``IsADirectoryError`` when the path is a directory, ``OSError``
    when it cannot be written.
    """
    data = csv_bytes(frame, index=index)
    if isinstance(path_or_buffer, (str, Path)):
        return write_private_bytes(path_or_buffer, data)  # refuses a directory itself
    if isinstance(path_or_buffer, io.TextIOBase):
        path_or_buffer.write(data.decode("utf-8"))
    else:
        path_or_buffer.write(data)
    return path_or_buffer


def write_private_parquet(frame, path: "str | Path") -> Path:
    """``frame`` (a DataFrame) as Parquet at ``path`` (no index), written as
    :func:`write_private_bytes` writes: 0600, atomically, never through a link (the file is built
    in memory first). Raises like :func:`write_private_bytes` and ``DataFrame.to_parquet``."""
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return write_private_bytes(path, buf.getvalue())
