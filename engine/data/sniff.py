"""Look at a raw input file before parsing it: what it is, how it is compressed, encoded and delimited.

:func:`probe` is called by :mod:`engine.data.io` before any parsing, so that a file that is not a
UTF-8 CSV or a Parquet file fails with one clear line naming the file and the cause, instead of
being parsed into mojibake column names:

* not a regular file (a directory, a device such as ``/dev/zero``, a pipe) -> ``ValueError``;
* compression is read from the magic bytes, not the name: gzip, bzip2 and xz are read
  transparently (``data.csv`` that is really gzip works), a zip archive is refused;
* Parquet is recognised by its ``PAR1`` magic (whatever the suffix); a ``.parquet`` name on a file
  without it is refused;
* text must be UTF-8 (a UTF-8 byte-order mark is fine): a UTF-16/UTF-32 byte-order mark, UTF-16
  without a mark (NUL bytes at every other position), a header line that is not UTF-8 or holds a
  NUL byte are refused;
* binary data is refused: a known binary signature (PNG, JPEG, GIF, PDF, ELF, SQLite, OLE2 / old
  Excel, 7-Zip, HDF5, as :func:`binary_kind`), or more than :data:`MAX_CONTROL_FRACTION` of the first
  :data:`SAMPLE_BYTES` being NUL or other control bytes (at least 8 of them). A few NUL bytes in an
  otherwise textual CSV do not refuse the file: the records holding them are rejected by the
  reader, naming row and column ("cell contains a NUL character");
* the delimiter is ``","`` unless the header has one column with a comma but several with one
  of ``";"``, tab or ``"|"`` (a semicolon-delimited export from a spreadsheet): then that one is
  used and :attr:`Probe.note` says so.

:func:`file_sha256` is a file's content identity (provenance, case-store keys, caches).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import hashlib
import io
import lzma
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Probe", "probe", "SAMPLE_BYTES", "binary_kind", "MAX_CONTROL_FRACTION", "file_sha256"]

#: bytes (after decompression) looked at to judge encoding and delimiter
SAMPLE_BYTES = 1 << 16
#: above this share of NUL / control bytes (not tab, line feed, carriage return) the sample is binary
MAX_CONTROL_FRACTION = 0.01
#: signatures of binary formats, refused by name (:func:`binary_kind`)
_SIGNATURES = ((b"\x89PNG\r\n\x1a\n", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF87a", "a GIF image"),
               (b"GIF89a", "a GIF image"), (b"%PDF-", "a PDF document"), (b"\x7fELF", "an executable (ELF)"),
               (b"SQLite format 3\x00", "a SQLite database"), (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1",
                                                                "an OLE2 file (old Excel .xls or Word .doc)"),
               (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"), (b"\x89HDF\r\n\x1a\n", "an HDF5 file"))
_CONTROL = bytes(b for b in range(32) if b not in (9, 10, 13)) + b"\x7f"
_OPENERS = {"gzip": gzip.open, "bz2": bz2.open, "xz": lzma.open}
_OTHER_DELIMITERS = (";", "\t", "|")
_DELIMITER_NAMES = {",": "comma", ";": "semicolon", "\t": "tab", "|": "pipe"}


@dataclass(frozen=True)
class Probe:
    """What :func:`probe` found out about a file.

    Attributes:
        format: ``"csv"`` or ``"parquet"``.
        compression: ``None``, ``"gzip"``, ``"bz2"`` or ``"xz"`` (CSV only), from the magic bytes.
        delimiter: the CSV delimiter (``","`` unless detected otherwise).
        note: a sentence for the user when something was detected (``""`` otherwise).
    """

    format: str
    compression: str | None = None
    delimiter: str = ","
    note: str = ""

    def open_text(self, path: Path):
        """Open ``path`` as text (UTF-8, BOM skipped, undecodable bytes kept as surrogates)."""
        opener = _OPENERS.get(self.compression or "", open)
        return opener(path, "rt", encoding="utf-8-sig", errors="surrogateescape", newline="")


def _check_regular(p: Path) -> None:
    if p.is_dir():
        raise ValueError(f"{p}: is a directory, not a data file (give the CSV or Parquet file inside it)")
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file")
    if not p.is_file():
        raise ValueError(f"{p}: not a regular file (a device, pipe or socket); give a CSV or Parquet file")


def _compression(head: bytes) -> str | None:
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head[:3] == b"BZh":
        return "bz2"
    if head[:6] == b"\xfd7zXZ\x00":
        return "xz"
    return None


def binary_kind(sample: bytes) -> str | None:
    """What binary data ``sample`` (the first bytes of a file, decompressed) is, or None for text.

    ``"a PNG image"`` (etc.) for a known signature (:data:`_SIGNATURES`); ``"NUL bytes"`` or
    ``"control bytes"`` when more than :data:`MAX_CONTROL_FRACTION` of the sample (and at least 8
    bytes) are NUL or control bytes other than tab, line feed and carriage return. A text CSV with
    a few stray NUL bytes is text (its affected records are rejected by the reader).
    """
    for sig, name in _SIGNATURES:
        if sample.startswith(sig):
            return name
    n = len(sample) - len(sample.translate(None, _CONTROL))  # NUL and control bytes
    if n >= 8 and n > MAX_CONTROL_FRACTION * len(sample):
        return "NUL bytes" if b"\x00" in sample else "control bytes"
    return None


def probe(path: str | Path, spec_format: str = "auto") -> Probe:
    """Check that ``path`` is a readable CSV or Parquet file and find its format, compression and delimiter.

    Args:
        path: the file.
        spec_format: ``"csv"``, ``"parquet"`` or ``"auto"`` (the spec's ``format``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a directory or special file; a zip archive; a ``.parquet`` file without the
            Parquet magic; UTF-16/UTF-32 text; binary data (:func:`binary_kind`); a header line
            that is not UTF-8 or holds a NUL byte. The message names the file and the cause, never
            the file's contents.
    """
    p = Path(path)
    _check_regular(p)
    with open(p, "rb") as f:
        head = f.read(8)
    if head[:4] == b"PK\x03\x04":
        raise ValueError(f"{p}: a zip archive, not a CSV or Parquet file; unzip it and give the file inside")
    suffixes = [s.lower() for s in p.suffixes]
    fmt = spec_format
    if fmt == "auto":
        if head[:4] == b"PAR1":
            fmt = "parquet"
        elif suffixes and suffixes[-1] in (".parquet", ".pq"):
            raise ValueError(f"{p}: named .parquet but not a Parquet file (no PAR1 magic bytes)")
        else:
            fmt = "csv"
    if fmt == "parquet":
        return Probe("parquet")
    comp = _compression(head)
    opener = _OPENERS.get(comp or "", open)
    try:
        with opener(p, "rb") as f:
            sample = f.read(SAMPLE_BYTES)
    except (OSError, EOFError, lzma.LZMAError) as e:
        raise ValueError(f"{p}: a {comp} file that cannot be decompressed ({e})") from None
    if sample[:4] in (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff"):
        raise ValueError(f"{p}: the file is UTF-32 text; save it as UTF-8 (e.g. 'CSV UTF-8')")
    if sample[:2] in (b"\xff\xfe", b"\xfe\xff"):
        raise ValueError(f"{p}: the file is UTF-16 text; save it as UTF-8 (e.g. 'CSV UTF-8')")
    kind = binary_kind(sample)
    if kind is not None and kind[0] == "a":  # a known signature
        raise ValueError(f"{p}: the file is {kind}: binary data, not a CSV text file")
    if b"\x00" in sample:
        half = sample[: len(sample) - len(sample) % 2]
        if half and (half[1::2].count(0) > 0.4 * len(half) / 2 or half[0::2].count(0) > 0.4 * len(half) / 2):
            raise ValueError(f"{p}: the file looks like UTF-16 text without a byte-order mark; save it as UTF-8")
    if kind is not None:
        raise ValueError(f"{p}: the file contains {kind}: binary data, not a CSV text file")
    if sample.startswith(b"\xef\xbb\xbf"):
        sample = sample[3:]
    end = min((i for i in (sample.find(b"\n"), sample.find(b"\r")) if i >= 0), default=len(sample))
    header = sample[:end]
    if b"\x00" in header:
        raise ValueError(f"{p}: the header line (line 1, the column names) contains a NUL byte: binary data or a "
                         "damaged file; the column names must be text")
    try:
        header.decode("utf-8")
    except UnicodeDecodeError as e:
        if not (end == len(sample) == SAMPLE_BYTES and e.start >= len(header) - 3):  # not a cut character
            raise ValueError(
                f"{p}: the header line is not UTF-8 text (byte {e.start + 1}): binary data or another "
                "encoding such as Latin-1; save the file as UTF-8"
            ) from None
    delimiter, note = ",", ""
    text = header.decode("utf-8", "replace")
    if text and len(next(csv.reader(io.StringIO(text)), [])) == 1:
        best = max(_OTHER_DELIMITERS, key=lambda d: len(next(csv.reader(io.StringIO(text), delimiter=d), [])))
        if len(next(csv.reader(io.StringIO(text), delimiter=best), [])) > 1:
            delimiter = best
            note = f"{p}: read as {_DELIMITER_NAMES[best]}-delimited (detected from the header line)"
    return Probe("csv", comp, delimiter, note)


class _Lines:
    """Iterate the lines of a text file, remembering the first line of the current record."""

    def __init__(self, f):
        self.f = f
        self.first: str | None = None

    def __iter__(self):
        return self

    def __next__(self) -> str:
        line = next(self.f)
        if self.first is None:
            self.first = line
        return line


def _open_quote_column(line: str | None, header: list[str], pr: Probe) -> str:
    """The column whose cell opens the unclosed quote on ``line`` (the last cell a lenient parse of
    that line alone finds)."""
    if not line:
        return "?"
    i = len(next(csv.reader([line], delimiter=pr.delimiter), [""])) - 1
    return header[i] if 0 <= i < len(header) else f"#{i + 1}"


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """SHA-256 (hex) of a file's bytes, read in ``chunk``-byte pieces: the identity of a data file
    (training-data provenance in checkpoints, the case store's data-source key, dashboard caches).

    Raises:
        FileNotFoundError / OSError: the file cannot be read.
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()
