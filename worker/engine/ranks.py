"""Rank 0's side of a tensor-parallel worker: start the other ranks, send them each step,
and keep one fate for all of them.

A worker of ``tensor_parallel_size`` N is N processes on one machine: this one (rank 0:
scheduler, block manager, sampler, detokenizer, and its own shard of the model) and N-1
spawned ranks (``rank_main.py``), each holding its shard and a KV pool of its heads. Rank 0
sends each rank every step's scheduled requests over a pipe; every rank builds the same
step inputs from them and runs its shard, the collectives in lockstep.

One fate: a rank that exits, a step that fails on rank 0, or a step that has not returned
within ``TIDE_TP_STEP_TIMEOUT_S`` (a collective that hangs) ends every rank and this
process (exit code EXIT_RANKS_LOST); so does a rank that dies while starting, unless rank 0
raises its error from ``wait`` within START_GRACE_S (it cannot while it waits for that rank
in the rendezvous or a collective); its jobs go back to the queue when their leases lapse
and the supervisor or controller starts a new worker. A rank dies with rank 0 too: the
kernel kills it when rank 0's process ends (PR_SET_PDEATHSIG), and its pipe closes.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, NoReturn

import torch

from tide_fleet.infra.contract.model_config import ModelConfig, ModelLoadError
from tide_fleet.worker.engine.config import EngineConfig
from tide_fleet.worker.engine.rank_main import RankSpec, rank_device, rank_main
from tide_fleet.worker.engine.scheduled import ScheduledRequest
from tide_fleet.worker.models.llama import LlamaModel
from tide_fleet.worker.models.loader import load_model, resolve_device
from tide_fleet.worker.parallel.group import TensorParallel, free_address
from tide_fleet.worker.parallel.shard import check_divides

log = logging.getLogger(__name__)

EXIT_RANKS_LOST = 75
STEP_TIMEOUT_S = float(os.environ.get("TIDE_TP_STEP_TIMEOUT_S", "300"))
START_GRACE_S = 10.0


class Ranks:
    """The other ranks of this worker, as rank 0 sees them."""

    tp: TensorParallel  # rank 0's place in the group, once joined

    def __init__(self, procs: Sequence[BaseProcess], steps: list[Connection],
                 reports: list[Connection]) -> None:  # fmt: skip
        self.procs, self.steps, self.reports = procs, steps, reports
        self.step_since: float | None = None
        self.step_timeout_s = STEP_TIMEOUT_S
        self._closing = False
        self._serving = False
        self._watch = threading.Thread(target=self._watch_loop, name="tide-ranks", daemon=True)

    @classmethod
    def start(cls, folder: Path, dtype: str | None, device: str, config: EngineConfig) -> Ranks:
        """Spawn ranks 1..N-1 and join their group as rank 0 (nothing is loaded yet)."""
        world = config.tensor_parallel_size
        check_divides(ModelConfig.from_folder(folder), world)  # before anything starts
        if config.max_loras:
            raise ValueError(
                "max_loras: LoRA adapters are not served with tensor_parallel_size "
                f"{world}; set max_loras 0 (--max-loras 0)"
            )
        dev = resolve_device(device)
        if dev.type == "cuda" and torch.cuda.device_count() < world:
            raise ModelLoadError(
                f"tensor_parallel_size {world} needs {world} GPUs; "
                f"{torch.cuda.device_count()} are visible (CUDA_VISIBLE_DEVICES)"
            )
        threads = max(1, (os.cpu_count() or 1) // world)
        if dev.type == "cpu":
            torch.set_num_threads(threads)
        spec = RankSpec(str(folder), dtype, dev.type, config, free_address(), threads)
        ctx = mp.get_context("spawn")
        procs, steps, reports = [], [], []
        for rank in range(1, world):
            step_out, step_in = ctx.Pipe(duplex=False)  # (receive end, send end)
            report_out, report_in = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=rank_main, args=(rank, world, spec, step_out, report_in),
                               name=f"tide-rank-{rank}", daemon=True)  # fmt: skip
            proc.start()
            step_out.close()
            report_in.close()
            procs.append(proc)
            steps.append(step_in)
            reports.append(report_out)
        ranks = cls(procs, steps, reports)
        atexit.register(ranks.close)  # before multiprocessing's own exit joins them
        ranks._watch.start()  # a rank that dies while starting must not leave rank 0 waiting
        try:
            ranks.tp = TensorParallel.join(0, world, spec.address, rank_device(device, 0))
        except BaseException:
            ranks.close()
            raise
        log.info("tensor parallel: %d ranks on %s (rendezvous %s)", world, dev.type, spec.address)
        return ranks

    def wait(self, what: str) -> list[Any]:
        """Each rank's report that it reached ``what`` ("loaded", "ready"); a rank that
        failed instead ends them all and raises its error here."""
        values = []
        for rank, (proc, conn) in enumerate(zip(self.procs, self.reports, strict=True), 1):
            try:
                kind, value = conn.recv()
            except EOFError:
                proc.join(5)
                kind, value = "error", f"exited with code {proc.exitcode}"
            if kind == "error":
                self.close()
                raise ModelLoadError(f"tensor-parallel rank {rank}: {value}")
            if kind != what:
                self.close()
                raise RuntimeError(f"tensor-parallel rank {rank} reported {kind}, not {what}")
            values.append(value)
        return values

    def watch(self) -> None:
        """Every rank is ready: from now on a rank's exit or a hung step ends the worker at
        once (one fate)."""
        self._serving = True

    def send_step(self, scheduled: list[ScheduledRequest]) -> None:
        self.step_since = time.monotonic()
        try:
            for conn in self.steps:
                conn.send(scheduled)
        except OSError as e:
            self.lost(f"a rank's pipe closed: {e}")

    def step_done(self) -> None:
        self.step_since = None

    def lost(self, reason: str) -> NoReturn:
        log.critical("tensor-parallel worker ends, every rank with it: %s", reason)
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        logging.shutdown()
        os._exit(EXIT_RANKS_LOST)

    def close(self) -> None:
        """Stop the other ranks (a drained worker's last act) and leave the group."""
        if self._closing:
            return
        self._closing = True
        for conn in self.steps:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        if hasattr(self, "tp"):
            self.tp.close()

    def _watch_loop(self) -> None:
        sentinels = {proc.sentinel: rank for rank, proc in enumerate(self.procs, 1)}
        while not self._closing:
            ended = wait(list(sentinels), timeout=1.0)
            if self._closing:
                return
            if ended:
                rank = sentinels[ended[0]]  # type: ignore[index]
                proc = self.procs[rank - 1]
                proc.join(1)  # its sentinel closes as it exits, before it can be reaped
                if not self._serving and self._starting_handled():
                    return
                self.lost(f"rank {rank} exited with code {proc.exitcode}"
                          + ("" if self._serving else " while starting"))  # fmt: skip
            since = self.step_since
            if since is not None and time.monotonic() - since > self.step_timeout_s:
                self.lost(f"a step has not returned in {self.step_timeout_s:g} s "
                          "(TIDE_TP_STEP_TIMEOUT_S)")  # fmt: skip

    def _starting_handled(self) -> bool:
        """A rank died while starting: rank 0's thread raises its error from ``wait`` and
        stops the rest, unless it is waiting inside the rendezvous or a collective for the
        rank that is gone. True when it did so within START_GRACE_S."""
        deadline = time.monotonic() + START_GRACE_S
        while time.monotonic() < deadline:
            if self._closing:
                return True
            time.sleep(0.1)
        return False


def load_rank0(
    folder: Path, dtype: str | None, device: str, config: EngineConfig
) -> tuple[LlamaModel, Ranks]:
    """Start the other ranks and load rank 0's shard; every rank has loaded when this
    returns (a rank's load error ends them all and is raised here)."""
    ranks = Ranks.start(folder, dtype, device, config)
    try:
        model = load_model(folder, dtype, tp=ranks.tp)
    except BaseException:
        ranks.close()
        raise
    ranks.wait("loaded")
    return model, ranks
