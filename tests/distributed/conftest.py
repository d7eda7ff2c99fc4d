"""Ray for the distributed tests: one local Ray (2 CPUs, no dashboard, quiet) for the whole
session, shut down at its end. Tests here are skipped where Ray is not installed."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(scope="session")
def ray_local(tmp_path_factory):
    """A local Ray with ``num_cpus=2`` (started once; the engine's ``ray_session`` reuses it)."""
    ray = pytest.importorskip("ray")
    from engine.distributed.runtime import quiet_ray_data, ray_temp_dir

    tmp = ray_temp_dir()
    tmp.mkdir(parents=True, exist_ok=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
             _temp_dir=str(tmp))
    quiet_ray_data(ray)
    try:
        yield ray
    finally:
        ray.shutdown()
