"""Tensor parallelism in the plan: which sizes split a model, and the smallest that fits."""

from __future__ import annotations

from tide_fleet.infra.plan.errors import PlanError
from tide_fleet.infra.plan.model_shape import ModelShape

MAX_TENSOR_PARALLEL = 8  # GPUs one node holds: the largest size the plan suggests


def check_tensor_parallel_size(shape: ModelShape, n: int) -> None:
    """PlanError unless `n` GPUs can split the model: n >= 1 and it divides both head counts."""
    if n < 1 or shape.num_kv_heads % n:
        sizes = ", ".join(map(str, shape.tensor_parallel_sizes()))
        raise PlanError(
            f"--tensor-parallel-size {n} must divide {shape.name}'s heads ({shape.num_heads} "
            f"attention, {shape.num_kv_heads} KV); sizes that work: {sizes}"
        )


def _fits(
    shape: ModelShape, n: int, usable: int, reserve: int, dtypes: tuple[str, str], avg_len: int
) -> bool:
    """The weight shard and reserve leave room for one average request's KV on each GPU."""
    free = usable - shape.weight_bytes(dtypes[0], n) - reserve
    return free >= shape.kv_bytes_per_token(dtypes[1], n) * avg_len


def min_tensor_parallel_size(
    shape: ModelShape, usable: int, reserve: int, dtypes: tuple[str, str], avg_len: int
) -> int | None:
    """The smallest N (dividing the heads, at most 8) at which the model fits; None if none."""
    for n in shape.tensor_parallel_sizes(MAX_TENSOR_PARALLEL):
        if _fits(shape, n, usable, reserve, dtypes, avg_len):
            return n
    return None


def fit_hint(smallest: int | None, shape: ModelShape) -> str:
    if smallest is not None:
        return f"; the smallest that fits is --tensor-parallel-size {smallest}"
    sizes = ", ".join(map(str, shape.tensor_parallel_sizes(MAX_TENSOR_PARALLEL)))
    return f"; no --tensor-parallel-size up to {MAX_TENSOR_PARALLEL} fits (tried {sizes})"
