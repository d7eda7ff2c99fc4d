"""Data layer: from a raw file to the canonical, validated, encoded frame (no torch here).

Map of the package, in data-flow order:

* :mod:`~engine.data.spec` - the dataset spec (TOML: which column plays which role) and the
  built-in specs in ``engine/data/specs/``;
* :mod:`~engine.data.inspect` - guessing a spec from an unknown file;
* :mod:`~engine.data.sniff` - what an input file is (format, compression, encoding, delimiter)
  before it is parsed;
* :mod:`~engine.data.io` - reading CSV / Parquet into the canonical frame with row accounting
  (``rows read = accepted + rejected``), using the per-column parsers of
  :mod:`~engine.data.validate`;
* :mod:`~engine.data.aggregates` - delayed-label aggregates (e.g. the Handbook's terminal risk);
* :mod:`~engine.data.features` - feature statistics fitted on training rows and the encoded frame
  the model reads;
* :mod:`~engine.data.simulate` - the demo transaction simulator (TabFormer format + ground truth).

Nothing here imports a higher layer (:mod:`engine.model`, :mod:`engine.explain`, ...). Public names
are re-exported here and imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> submodule (imported on first access).
_EXPORTS = {
    "ColumnRole": "spec", "DatasetSpec": "spec", "DelayedAggregateSpec": "spec", "FieldKind": "spec",
    "FieldSpec": "spec", "builtin_specs": "spec", "load_spec": "spec", "spec_from_dict": "spec",
    "LoadResult": "io", "REJECTED_COLUMNS": "io", "detect_format": "io", "read_raw": "io",
    "read_transactions": "io",
    "guess_spec": "inspect", "write_spec": "inspect",
    "add_aggregates": "aggregates", "delayed_aggregates": "aggregates",
    "EncodedFrame": "features", "FeatureEncoder": "features", "piecewise_linear": "features",
    "simulate": "simulate", "write_csv": "simulate",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
