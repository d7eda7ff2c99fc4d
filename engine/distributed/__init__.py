"""Scoring and training beyond one process: partitioned (out-of-core) scoring on one machine with
DuckDB (:mod:`engine.distributed.partition`), batch scoring of a Parquet dataset on a Ray actor pool
(:mod:`engine.distributed.ray_score`) and data-parallel training with Ray Train
(:mod:`engine.distributed.ray_train`; optional extra ``pip install fraudlens[ray]``). Ray is imported
inside functions only, so the single-process commands never pay for it (layer 5: may use
engine.data, engine.model and the layers below)."""
