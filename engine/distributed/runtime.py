"""Starting and joining Ray for the scale-out commands: quiet, without a dashboard, temporary
files under the system temporary folder (never the user's home).

Ray is imported lazily: :func:`require_ray` raises a clear error naming the extra to install.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Iterator

RAY_MISSING = ("Ray is not installed; the scale-out commands (--engine ray, --workers N > 1) need the optional "
               "extra: pip install 'fraudlens[ray]'")


def require_ray():
    """Import and return the ``ray`` module.

    Raises:
        RuntimeError: Ray is not installed (the message names ``pip install 'fraudlens[ray]'``).
    """
    try:
        import ray
    except ImportError:
        raise RuntimeError(RAY_MISSING) from None
    return ray


def ray_temp_dir() -> Path:
    """Ray's session folder for a local cluster started here: ``$TMPDIR/fraudlens-ray-<uid>``
    (Ray's default would be ``/tmp/ray``; both are outside the user's home). Kept short: Ray
    puts Unix sockets in it, whose paths are limited to 107 bytes."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"fraudlens-ray-{uid}"


@contextlib.contextmanager
def ray_session(workers: int, address: str | None = None) -> Iterator[object]:
    """Use a running Ray, or start one for the duration of the ``with`` block.

    Args:
        workers: CPUs of a local Ray started here (``num_cpus``); ignored with ``address``.
        address: ``ray.init(address=...)``: ``"auto"`` (a cluster started with ``ray start --head``
            on this machine), ``"ray://host:10001"`` (Ray Client) or ``"host:6379"``. None starts
            a private local Ray with ``num_cpus=workers``, no dashboard, worker logs not sent to
            the terminal.
    Yields:
        the ``ray`` module. A Ray that was already initialised (e.g. by a test) is used as is and
        left running; one started here is shut down at the end.
    Raises:
        RuntimeError: Ray is not installed, or cannot be started / reached (names the address).
    """
    ray = require_ray()
    if ray.is_initialized():
        yield ray
        return
    kw = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    try:
        if address:
            ray.init(address=address, **kw)
        else:
            tmp = ray_temp_dir()
            tmp.mkdir(parents=True, exist_ok=True)
            ray.init(num_cpus=workers, _temp_dir=str(tmp), **kw)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = f"the Ray cluster at {address!r}" if address else "a local Ray"
        raise RuntimeError(f"cannot start or reach {where}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    quiet_ray_data(ray)
    try:
        yield ray
    finally:
        ray.shutdown()


def quiet_ray_data(ray) -> None:
    """Ray Data without progress bars or the per-run execution banner."""
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    for name in ("ray.data", "ray.train", "ray.tune"):
        logging.getLogger(name).setLevel(logging.ERROR)


def unwrap_ray_error(e: BaseException) -> BaseException:
    """The user's exception inside a Ray task/actor error (``RayTaskError.cause``), else ``e``."""
    seen = 0
    while getattr(e, "cause", None) is not None and seen < 8:
        e, seen = e.cause, seen + 1
    return e
