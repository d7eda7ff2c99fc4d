"""Scale-out on Ray (optional extra ``pip install fraudlens[ray]``): batch scoring of a Parquet
dataset with an actor pool (:mod:`engine.distributed.ray_score`) and data-parallel training with
Ray Train (:mod:`engine.distributed.ray_train`). Ray is imported inside functions only, so the
single-process commands never pay for it."""
