"""Parquet files read into the raw frame :mod:`engine.data.io` validates.

Integer columns with nulls stay exact (nullable pandas integers), decimal columns become their exact
text (read by the same number rules as a CSV cell), nested columns (list / struct / map) become one
JSON text per cell, so a spec can never read them as a field and ``inspect`` sees text.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


def parquet_file(p: Path) -> pq.ParquetFile:
    """Open ``p`` as Parquet.

    Raises:
        ValueError: not a readable Parquet file (names the file and the reader's first line).
    """
    try:
        return pq.ParquetFile(p)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{p}: not a readable Parquet file ({str(e).splitlines()[0][:200]})") from None


def _read_parquet_table(pf: pq.ParquetFile, max_rows: int | None, columns: list[str] | None) -> pa.Table:
    if max_rows is None:
        return pf.read(columns=columns)
    schema = pf.schema_arrow if columns is None else pa.schema([pf.schema_arrow.field(c) for c in columns])
    batches, n = [], 0
    for b in pf.iter_batches(batch_size=max(1, min(max_rows, 1 << 16)), columns=columns):
        batches.append(b)
        n += b.num_rows
        if n >= max_rows:
            break
    return pa.Table.from_batches(batches, schema=schema).slice(0, max_rows)


def _num_rows(pf: pq.ParquetFile, table: pa.Table, max_rows: int | None) -> int:
    """Rows of a read with no column (pyarrow gives a 0-row table then): the file's row count."""
    if table.num_columns:
        return table.num_rows
    n = pf.metadata.num_rows
    return n if max_rows is None else min(n, max_rows)


def read_parquet(path: Path, max_rows: int | None,
                 columns: list[str] | None = None) -> tuple[pd.DataFrame, np.ndarray, list[dict]]:
    """Read at most ``max_rows`` rows of ``path`` as (raw frame, 1-based row numbers int64 [N], rejected records []).

    ``columns``: read only these (those the file lacks are left out; the caller names them), so
    a column no spec reads is never decoded (a nested column is converted to JSON text cell by
    cell: 5 s for 1.75M rows). ``None``: every column. The row count is the file's either way.

    Raises:
        ValueError: not a readable Parquet file, or duplicate column names.
    """
    pf = parquet_file(path)
    names = pf.schema_arrow.names
    dup = sorted({c for c in names if names.count(c) > 1})
    if dup:
        raise ValueError(f"{path}: duplicate column names: {dup}")
    if columns is not None:
        wanted = set(columns)
        columns = [c for c in names if c in wanted]
    try:
        table = _read_parquet_table(pf, max_rows, columns)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0][:200]})") from None
    cols = {}
    for name, col in zip(table.column_names, table.columns):
        if pa.types.is_integer(col.type) and col.null_count:
            # keep integers exact (default to_pandas would turn them into float64)
            nullable = {pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(), pa.int32(): pd.Int32Dtype(),
                        pa.int64(): pd.Int64Dtype(), pa.uint8(): pd.UInt8Dtype(), pa.uint16(): pd.UInt16Dtype(),
                        pa.uint32(): pd.UInt32Dtype(), pa.uint64(): pd.UInt64Dtype()}
            cols[name] = col.to_pandas(types_mapper=nullable.get)
        elif pa.types.is_decimal(col.type):
            # exact text ("1234.50"), read by the same number rules as a CSV cell (to_pandas gives
            # decimal.Decimal objects, which the text rules refused with a raw AttributeError)
            cols[name] = col.cast(pa.string()).to_pandas()
        elif pa.types.is_nested(col.type):
            # a list / struct / map per cell: its JSON text (a spec never reads it as a field,
            # _check_parquet_types; inspect sees a text column instead of unhashable arrays)
            cols[name] = pd.Series([None if v is None else json.dumps(v, default=str, ensure_ascii=False)
                                    for v in col.to_pylist()], dtype=object)
        else:
            cols[name] = col.to_pandas()
    raw = pd.DataFrame(cols, copy=False) if cols else pd.DataFrame(index=range(_num_rows(pf, table, max_rows)))
    return raw, np.arange(1, len(raw) + 1, dtype=np.int64), []
