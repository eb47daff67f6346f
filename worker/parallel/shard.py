"""Which part of each checkpoint tensor a tensor-parallel rank holds (Megatron-style).

Attention is split by heads: q, k and v by output rows (a rank's query heads and the KV
heads they read), o by input columns. The MLP's gate and up are split by output rows and
down by input columns. The embedding and lm_head are split by vocabulary rows, each rank's
part padded to the same size so their logits gather into one row. Norms are whole on every
rank. A bias on o or down is added once, by rank 0, since their outputs are summed.

Sharding happens at load, before q|k|v and gate|up are fused, so a rank's fused weight is
its own heads' q | k | v.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tide_fleet.infra.contract.model_config import ModelConfig, ModelLoadError


@dataclass(frozen=True)
class Shard:
    rank: int
    world: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} is outside a world of {self.world}")


def check_divides(config: ModelConfig, world: int) -> None:
    """ModelLoadError naming the sizes when N ranks cannot split this model."""
    if world < 1:
        raise ModelLoadError(f"tensor_parallel_size must be at least 1, got {world}")
    sizes = {
        "KV heads": config.num_kv_heads,
        "attention heads": config.num_heads,
        "intermediate size": config.intermediate_size,
    }
    for what, size in sizes.items():
        if size % world:
            fits = [n for n in range(1, config.num_kv_heads + 1) if _splits(config, n)]
            raise ModelLoadError(
                f"tensor_parallel_size {world} does not divide the model's {what} ({size}); "
                f"sizes that split this model: {', '.join(map(str, fits))}"
            )


def _splits(config: ModelConfig, n: int) -> bool:
    return not (config.num_kv_heads % n or config.num_heads % n or config.intermediate_size % n)


@dataclass(frozen=True)
class ShardLayout:
    """A rank's ranges in each split dimension of a model."""

    config: ModelConfig  # the whole model's
    shard: Shard

    @property
    def local_config(self) -> ModelConfig:
        """The shape one rank runs: its heads and its part of the intermediate size (the
        vocabulary stays whole: the engine checks ids against it)."""
        n = self.shard.world
        c = self.config
        return dataclasses.replace(
            c, num_heads=c.num_heads // n, num_kv_heads=c.num_kv_heads // n,
            intermediate_size=c.intermediate_size // n,
        )  # fmt: skip

    def q_rows(self) -> tuple[int, int]:
        return self._part(self.config.num_heads * self.config.head_dim)

    def kv_rows(self) -> tuple[int, int]:
        return self._part(self.config.num_kv_heads * self.config.head_dim)

    def mlp_rows(self) -> tuple[int, int]:
        return self._part(self.config.intermediate_size)

    @property
    def vocab_rows(self) -> int:
        """Rows of each rank's embedding and lm_head part (the last rank's padded)."""
        return -(-self.config.vocab_size // self.shard.world)

    def vocab_range(self) -> tuple[int, int]:
        """The token ids whose rows this rank holds (the last rank may hold fewer)."""
        start, vocab = self.shard.rank * self.vocab_rows, self.config.vocab_size
        return min(start, vocab), min(start + self.vocab_rows, vocab)

    @property
    def adds_row_bias(self) -> bool:
        """o's and down's biases: added by one rank, before the sum."""
        return self.shard.rank == 0

    def _part(self, size: int) -> tuple[int, int]:
        step = size // self.shard.world
        return self.shard.rank * step, (self.shard.rank + 1) * step
