"""A Parquet *dataset* (one file, a folder, or a glob) read through a spec with the row accounting
of :func:`engine.data.io.read_transactions`.

Several files are read as one table, in sorted path order, so every rule of the reader holds across
files (exact duplicates, a transaction id reused in another file, per-key aggregates of
:mod:`engine.data.aggregates`). ``row_number`` is then the 1-based record number in the dataset
(file after file, in that order); the ``file`` column of the rejected rows names the file the
record came from. The files are streamed one row group at a time into one temporary Parquet file
(under the system temporary folder, removed afterwards), which is then read like a single file.
"""

from __future__ import annotations

import glob
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from engine.data.io import LoadResult, read_transactions
from engine.data.spec import DatasetSpec

_GLOB_CHARS = set("*?[")


def dataset_files(data: str | Path) -> list[Path]:
    """The files of a dataset: ``data`` itself if it is a file; the ``*.parquet`` / ``*.pq`` files
    under a folder (recursively); the files a glob pattern matches (``**`` recurses). Sorted.

    Raises:
        FileNotFoundError: no such file or folder, or no file matches (names ``data``).
    """
    s = str(data)
    p = Path(s)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(q for q in p.rglob("*") if q.is_file() and q.suffix.lower() in (".parquet", ".pq"))
        if not files:
            raise FileNotFoundError(f"{p}: folder holds no .parquet file")
        return files
    if _GLOB_CHARS & set(s):
        files = sorted(Path(q) for q in glob.glob(s, recursive=True) if Path(q).is_file())
        if not files:
            raise FileNotFoundError(f"{s}: no file matches this pattern")
        return files
    raise FileNotFoundError(f"{s}: no such file or folder")


def _concat_parquet(files: list[Path], dest: Path) -> np.ndarray:
    """Stream ``files`` into one Parquet file ``dest`` (the first file's column order and types);
    return the number of records of each file.

    Raises:
        ValueError: a file is not Parquet, or its columns or types differ from the first file's
            (names the file and the columns).
    """
    schema = None
    counts = []
    writer = None
    try:
        for f in files:
            try:
                pf = pq.ParquetFile(f)
            except (pa.ArrowException, OSError) as e:
                raise ValueError(f"{f}: not a readable Parquet file ({str(e).splitlines()[0][:200]}); a dataset of "
                                 "several files must be Parquet") from None
            s = pf.schema_arrow
            if schema is None:
                schema = s
                writer = pq.ParquetWriter(dest, schema)
            elif set(s.names) != set(schema.names):
                extra, missing = sorted(set(s.names) - set(schema.names)), sorted(set(schema.names) - set(s.names))
                raise ValueError(f"{f}: columns differ from {files[0]}'s (extra {extra}, missing {missing})")
            else:
                bad = [n for n in schema.names if s.field(n).type != schema.field(n).type]
                if bad:
                    n = bad[0]
                    raise ValueError(f"{f}: column {n!r} is {s.field(n).type}, but {schema.field(n).type} in {files[0]}")
            for i in range(pf.num_row_groups):
                writer.write_table(pf.read_row_group(i).select(schema.names))
            counts.append(pf.metadata.num_rows)
    finally:
        if writer is not None:
            writer.close()
    return np.asarray(counts, dtype=np.int64)


def read_dataset(data: str | Path, spec: DatasetSpec, *, label_required: bool = True) -> LoadResult:
    """Read every record of the dataset ``data`` (see :func:`dataset_files`) through ``spec``
    (``label_required=False``: files without the label column are read unlabelled, as
    :func:`engine.data.io.read_transactions`).

    One file: exactly :func:`engine.data.io.read_transactions`. Several: one table in sorted path
    order (see the module doc); ``rows_read`` is the dataset's record count and
    ``rows_read == len(frame) + len(rejected)``.

    Raises:
        FileNotFoundError: nothing to read. ValueError: from the reader, or files that do not
            share one schema.
    """
    files = dataset_files(data)
    if len(files) == 1:
        return read_transactions(files[0], spec, label_required=label_required)
    with tempfile.TemporaryDirectory(prefix="fraudlens-dataset-") as tmp:
        joined = Path(tmp) / "dataset.parquet"
        counts = _concat_parquet(files, joined)
        res = read_transactions(joined, spec, label_required=label_required)
    ends = np.cumsum(counts)
    if len(res.rejected):
        which = np.searchsorted(ends, res.rejected["row_number"].to_numpy() - 1, side="right")
        res.rejected["file"] = np.asarray([str(f) for f in files], dtype=object)[which]
    res.file = Path(str(data))
    res.notes.append(f"dataset of {len(files):,} files read as one table in path order "
                     f"({files[0].name} .. {files[-1].name}); row_number counts records across the files")
    return res
