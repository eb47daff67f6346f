"""A spawned rank of a tensor-parallel worker (ranks 1..N-1): load its shard, build its
model runner and KV pool in lockstep with the others, then run every step rank 0 sends
until rank 0 says stop or goes away (worker/engine/ranks.py)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from tide_fleet.worker.engine.config import EngineConfig, model_len
from tide_fleet.worker.engine.model_runner import ModelRunner
from tide_fleet.worker.engine.scheduled import SchedulerOutput
from tide_fleet.worker.models.loader import load_model, resolve_device
from tide_fleet.worker.parallel.group import TensorParallel

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RankSpec:
    """What a spawned rank needs to build its part of the worker."""

    folder: str
    dtype: str | None
    device: str  # "cpu" or "cuda"
    config: EngineConfig
    address: str  # the rendezvous, host:port on loopback
    threads: int  # CPU: torch threads per rank


def rank_device(device: str, rank: int) -> torch.device:
    """The device a rank runs on: GPU ``rank`` of those visible to the worker, or the CPU."""
    dev = resolve_device(device)
    return torch.device("cuda", rank) if dev.type == "cuda" else dev


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when rank 0's ends, however it ends."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def rank_main(
    rank: int, world: int, spec: RankSpec, steps: Connection, reports: Connection
) -> None:
    _die_with_parent()
    # Rank 0 handles the signals (SIGTERM drains the worker) and stops the ranks after.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    form = f"%(asctime)s rank {rank} %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format=form)
    try:
        device = rank_device(spec.device, rank)
        if device.type == "cpu":
            torch.set_num_threads(spec.threads)
        tp = TensorParallel.join(rank, world, spec.address, device)
        model = load_model(spec.folder, spec.dtype, tp=tp)
        reports.send(("loaded", None))
        runner = ModelRunner(model, spec.config, model_len(spec.config, model.config))
        reports.send(("ready", runner.num_blocks))
    except Exception as e:
        reports.send(("error", f"{type(e).__name__}: {e}"))
        raise SystemExit(1) from e
    while True:
        try:
            scheduled = steps.recv()
        except EOFError:  # rank 0 is gone
            break
        if scheduled is None:
            break
        runner.execute(SchedulerOutput(scheduled))
    tp.close()
