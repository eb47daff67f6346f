"""The collectives a tensor-parallel model runs, over ``torch.distributed``: NCCL between
GPUs, gloo between CPU processes (on loopback).

Every rank runs the same steps in the same order, so each collective below is entered by
all ranks together: two all-reduces per layer (after o and after down), one after the
embedding, and a gather of the vocabulary-split logits.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from tide_fleet.worker.parallel.shard import Shard

# How long a rank waits for the others at start (loading and profiling run at each rank's
# own pace). A hung step while serving is caught sooner, by the rank-0 watchdog.
SETUP_TIMEOUT_S = 1800.0


def free_address() -> str:
    """A loopback host:port free now, for the ranks' rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


class TensorParallel:
    """This process's rank in the group and the collectives the model calls."""

    def __init__(self, shard: Shard, device: torch.device) -> None:
        self.shard = shard
        self.device = device

    @classmethod
    def join(
        cls, rank: int, world: int, address: str, device: torch.device,
        timeout_s: float = SETUP_TIMEOUT_S,
    ) -> TensorParallel:  # fmt: skip
        """Join the group at ``address`` (rank 0's rendezvous): NCCL on CUDA, else gloo."""
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend, init_method=f"tcp://{address}", rank=rank, world_size=world,
            timeout=timedelta(seconds=timeout_s),
        )  # fmt: skip
        return cls(Shard(rank, world), device)

    @property
    def rank(self) -> int:
        return self.shard.rank

    @property
    def world(self) -> int:
        return self.shard.world

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the ranks, in place; returns it (a group of one has nothing to
        add: no collective is launched, as in vLLM)."""
        if self.world > 1:
            dist.all_reduce(t)
        return t

    def gather_vocab(self, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Every rank's logit columns side by side, the padding past the vocabulary cut."""
        if self.world == 1:
            return logits[:, :vocab_size]
        logits = logits.contiguous()
        parts = [torch.empty_like(logits) for _ in range(self.world)]
        dist.all_gather(parts, logits)
        return torch.cat(parts, dim=-1)[:, :vocab_size]

    def agree_min(self, value: int) -> int:
        """The smallest of every rank's value (the KV block count all ranks can hold)."""
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
