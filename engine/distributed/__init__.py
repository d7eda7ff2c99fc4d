"""Scoring beyond one process's memory: partitioned (out-of-core) scoring on one machine and
distributed execution (layer 5: may use engine.data, engine.model and the layers below)."""
