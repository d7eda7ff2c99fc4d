"""Data-parallel training on Ray Train: ``fraudlens train --workers N`` (N >= 2).

Ray Train's ``TorchTrainer`` starts ``N`` workers (``ScalingConfig(num_workers=N, use_gpu=False)``)
joined in a gloo process group (``TorchConfig(backend="gloo")``); ``ray.train.torch.prepare_model``
wraps the model in ``DistributedDataParallel`` (PyTorch DDP: gradients averaged by all-reduce,
https://pytorch.org/docs/stable/notes/ddp.html). Each worker runs the single-process training loop,
:func:`engine.model.train_loop.run_epochs`, with a :class:`~engine.model.train_loop.DataParallel` hook:

* every worker draws the same batches from the same seed and computes its share of each batch
  (``ids[rank::N]``); the loss is scaled so the averaged gradient is that of the whole batch's
  mean loss: the same optimisation steps, batch size and learning rate as one process;
* worker 0 evaluates validation average precision after each epoch, keeps the best epoch and
  decides early stopping and the time budget (broadcast to the others).

What differs from one process: dropout masks (each worker draws its own) and the order of floating
point sums, so the runs are equal in distribution, not bit for bit; with ``dropout = 0`` they agree
to float rounding (the test asserts it). The measured difference is in README.md ("Scale-out with
Ray").

Worker 0 sends the best epoch's weights back as a Ray Train checkpoint holding a safetensors file
and a JSON file (never a pickle); the driver rebuilds the model, loads them, and
:func:`engine.model.train.train` continues as after a single-process fit (thresholds on
validation, test metrics, baseline), then ``save_checkpoint`` writes the usual checkpoint.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from engine.data.spec import DatasetSpec
from engine.distributed.runtime import ray_session, ray_temp_dir, unwrap_ray_error
from engine.model.train import TrainConfig
from engine.model.train_loop import DataParallel, finish_fit, new_model, prepare_fit, run_epochs

_WEIGHTS, _STATE = "model.safetensors", "state.json"


def _train_worker(config: dict) -> None:
    """Ray Train loop of one worker (see the module doc); worker 0 reports the checkpoint."""
    import ray
    import ray.train
    import torch
    from ray.train.torch import prepare_model
    from safetensors.torch import save_file

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(config["threads"])
    frame, split = ray.get(config["frame"]), ray.get(config["split"])
    cfg = TrainConfig(**config["cfg"])
    d = prepare_fit(frame, config["spec"], split, cfg)
    model = new_model(d.encoder, cfg)
    wrapped = prepare_model(model) if world > 1 else model
    history, best = run_epochs(wrapped, d, cfg, log=lambda s: None, progress=False,
                               early_stopping=config["early_stopping"], stop_after=config["stop_after"],
                               dp=DataParallel(rank, world) if world > 1 else None)
    metrics = {"epochs": len(history)}
    if rank != 0:
        ray.train.report(metrics, checkpoint=None)
        return
    state = best[1] if best[1] is not None else model.state_dict()
    with tempfile.TemporaryDirectory(prefix="fraudlens-train-") as tmp:
        save_file({k: v.detach().contiguous() for k, v in state.items()}, str(Path(tmp) / _WEIGHTS))
        (Path(tmp) / _STATE).write_text(json.dumps(
            {"history": history, "best": [best[0], best[1] is not None, best[2]]}))
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))


def fit_on_ray(
    frame: pd.DataFrame,
    spec: DatasetSpec,
    split: np.ndarray,
    cfg: TrainConfig | None = None,
    *,
    workers: int = 2,
    address: str | None = None,
    storage_path: str | None = None,
    threads: int = 1,
    log: Callable[[str], None] = print,
    progress: bool = True,
    early_stopping: bool = True,
    stop_after: int | None = None,
):
    """:func:`engine.model.train.fit` on ``workers`` Ray Train workers (DDP, gloo, CPU).

    Args:
        frame, spec, split, cfg, log, early_stopping, stop_after: as :func:`engine.model.train.fit`
            (``progress`` is accepted for the same signature; workers show no bars).
        workers: data-parallel workers (one CPU each); also ``num_cpus`` of a local Ray started
            here when ``address`` is None.
        address: Ray cluster address (see :func:`engine.distributed.runtime.ray_session`).
        storage_path: Ray Train's run folder (default: a temporary folder under the system
            temporary folder, removed afterwards). On a multi-node cluster, a path every node
            can write (shared file system or cloud URI).
        threads: torch intra-op threads per worker.
    Returns:
        ``(bundle, history, enc)`` as :func:`engine.model.train.fit`; ``bundle.meta["distributed"]``
        records the engine and the number of workers.
    Raises:
        ValueError: as :func:`fit` (checked on the driver before Ray starts); ``workers < 1``;
            ``cfg.members > 1`` (ensembles train in one process); ``cfg.pretrain_minutes > 0``
            (pretraining runs in one process).
        RuntimeError: Ray missing or unreachable, or a worker failed (its error in the message).
    """
    cfg = cfg or TrainConfig()
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if cfg.members != 1:
        raise ValueError(f"--workers trains one transformer; a {cfg.members}-member ensemble (--members) trains on "
                         "one machine only (leave out --workers, or use --members 1)")
    if cfg.pretrain_minutes > 0:
        raise ValueError("--workers: next-transaction pretraining (--pretrain-minutes) runs on one machine only "
                         "(leave out --workers, or --pretrain-minutes 0)")
    d = prepare_fit(frame, spec, split, cfg)  # errors (no label, no fraud) before any Ray work
    log(f"Ray Train: {workers} workers (DDP, gloo, CPU); windows: {d.win.n_windows:,} "
        f"({len(d.train_windows):,} with training rows); train frauds {d.n_pos:,}")
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory(prefix="fraudlens-raytrain-", dir=str(_tmp_base())) as tmp:
        with ray_session(workers, address) as ray:
            from ray.train import RunConfig, ScalingConfig
            from ray.train.torch import TorchConfig, TorchTrainer

            trainer = TorchTrainer(
                _train_worker,
                train_loop_config={"frame": ray.put(frame), "split": ray.put(split), "spec": spec, "cfg": asdict(cfg),
                                   "threads": threads, "early_stopping": early_stopping, "stop_after": stop_after},
                scaling_config=ScalingConfig(num_workers=workers, use_gpu=False, resources_per_worker={"CPU": 1}),
                torch_config=TorchConfig(backend="gloo"),
                run_config=RunConfig(name="fraudlens-train", storage_path=storage_path or tmp),
            )
            try:
                result = trainer.fit()
            except Exception as e:  # noqa: BLE001 - Ray wraps the worker's error
                cause = unwrap_ray_error(e)
                raise RuntimeError(f"Ray Train failed: {type(cause).__name__}: {str(cause).strip()[:2000]}") from None
            if result.checkpoint is None:
                raise RuntimeError("Ray Train finished without a checkpoint from worker 0")
            with result.checkpoint.as_directory() as ck:
                state = load_file(str(Path(ck) / _WEIGHTS))
                info = json.loads((Path(ck) / _STATE).read_text())
    history: list[dict[str, Any]] = info["history"]
    for rec in history:
        log(f"epoch {rec['epoch']}: loss {rec['loss']:.4f}  val AP {rec.get('val_average_precision', float('nan')):.4f}"
            f"  val AUC {rec.get('val_auc_roc', float('nan')):.4f}  ({rec['minutes']:.1f} min)")
    model = new_model(d.encoder, cfg)
    model.load_state_dict(state)  # strict: every tensor, the shapes the config implies
    ap, kept, epoch = info["best"]
    bundle = finish_fit(model, d, spec, cfg, history, (ap, state if kept else None, epoch))
    bundle.meta["distributed"] = {"engine": "ray-train", "workers": workers, "backend": "gloo",
                                  "address": address or "local"}
    return bundle, history, d.enc


def ray_fitter(workers: int, address: str | None = None, storage_path: str | None = None) -> Callable:
    """A ``fitter`` for :func:`engine.model.train.train`: :func:`fit_on_ray` with these settings.

    Raises:
        RuntimeError: Ray is not installed (names ``pip install 'fraudlens[ray]'``)."""
    from engine.distributed import runtime

    runtime.require_ray()
    return partial(fit_on_ray, workers=workers, address=address, storage_path=storage_path)


def _tmp_base() -> Path:
    p = ray_temp_dir()
    p.mkdir(parents=True, exist_ok=True)
    return p
