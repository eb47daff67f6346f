"""The roofline cost model: FLOPs and bytes of one step of a Llama-family decoder, from its
shapes alone, and what a device's peaks make of them (memory and compute time, MFU, MBU).

Torch-free; the one home of this arithmetic for its three users: the worker's MFU/MBU
gauges (worker/metrics.py), the planner's decode estimate (planner.py) and the simulator's
roofline service model (infra/sim/service_model.py). docs/observability.md and
docs/plan.md write the formulas out.

- FLOPs = 2 x the weights every token multiplies x tokens + 2 x the LM head x sampled rows
  + 4 x layers x heads x head_dim per attended position (QK^T and PV).
- bytes = every weight once per step (whatever the batch) + KV bytes per token x (positions
  read + tokens written); activations are left out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass

from tide_fleet.infra.plan.devices import DeviceSpec
from tide_fleet.infra.plan.model_shape import (
    Dims,
    ModelShape,
    dtype_bytes,
    projection_parameters,
)


def peak_flops(device: DeviceSpec, weight_dtype: str) -> float:
    """The device's FLOP/s at a weight dtype: the fp32 peak for float32, else the 16-bit
    tensor peak (8-bit weights are taken to compute at the 16-bit rate: weight-only
    quantisation)."""
    return device.peak_flops_fp32 if weight_dtype == "float32" else device.peak_flops_16bit


@dataclass(frozen=True)
class DevicePeaks:
    flops: float  # FLOP/s at the model's dtype
    bandwidth: float  # bytes/s
    source: str  # table:<name> | measured | override

    @classmethod
    def from_spec(cls, spec: DeviceSpec, weight_dtype: str) -> DevicePeaks:
        """The device table's peaks (infra/plan/devices.py) at a weight dtype."""
        return cls(peak_flops(spec, weight_dtype), spec.mem_bandwidth, f"table:{spec.name}")

    def seconds(self, flops: float, nbytes: float) -> tuple[float, float]:
        """(memory time, compute time) of work at the peaks; the roofline takes the larger."""
        return nbytes / self.bandwidth, flops / self.flops


@dataclass(frozen=True)
class ModelCost:
    """Per-step FLOPs and bytes of a Llama-family model, from its shapes alone."""

    linear_params: int  # weights every token multiplies (all layers' projections)
    head_params: int  # the LM head: only sampled rows run it
    num_layers: int
    num_heads: int
    head_dim: int
    dtype_bytes: int
    kv_bytes_per_token: int

    @classmethod
    def from_config(
        cls, cfg: Dims, dtype_bytes: int, kv_dtype_bytes: int | None = None
    ) -> ModelCost:
        """The projections and the LM head only (norms and biases left out): the worker's
        MFU/MBU, from the engine's ModelConfig (or any shape with the same fields)."""
        kv_size = kv_dtype_bytes or dtype_bytes
        return cls(
            linear_params=projection_parameters(cfg),
            head_params=cfg.vocab_size * cfg.hidden_size,
            num_layers=cfg.num_layers,
            num_heads=cfg.num_heads,
            head_dim=cfg.head_dim,
            dtype_bytes=dtype_bytes,
            kv_bytes_per_token=2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * kv_size,
        )

    @classmethod
    def from_shape(
        cls,
        shape: ModelShape,
        weight_dtype: str = "bfloat16",
        kv_dtype: str | None = None,
        tensor_parallel_size: int = 1,
    ) -> ModelCost:
        """Every weight a decode step streams (ModelShape.streamed_parameters: norms and
        biases too) counts as multiplied by every token: the planner's and the simulator's.
        Split N ways it is one GPU's share: its weight shard, its heads, its KV heads."""
        n = tensor_parallel_size
        base = cls.from_config(
            shape, dtype_bytes(weight_dtype), dtype_bytes(kv_dtype or weight_dtype)
        )
        head = -(-shape.vocab_size // n) * shape.hidden_size
        return dataclasses.replace(
            base,
            linear_params=shape.streamed_parameters(n) - head,
            head_params=head,
            num_heads=shape.num_heads // n,
            kv_bytes_per_token=shape.kv_bytes_per_token(kv_dtype or weight_dtype, n),
        )

    @property
    def weight_bytes(self) -> int:
        """Read once per step whatever the batch (the embedding table's lookups are noise)."""
        return (self.linear_params + self.head_params) * self.dtype_bytes

    @property
    def attention_flops_per_position(self) -> int:
        """QK^T and PV of one query token over one attended position, all layers and heads."""
        return 4 * self.num_layers * self.num_heads * self.head_dim

    def flops(self, num_tokens: int, num_sampled: int, attn_context_sum: int) -> float:
        """2 x params per token for matmuls; 4 x layers x heads x head_dim per attended position."""
        matmul = 2 * (self.linear_params * num_tokens + self.head_params * num_sampled)
        return float(matmul + self.attention_flops_per_position * attn_context_sum)

    def flops_per_token(self, context_len: int) -> float:
        """FLOPs of one decoded (so sampled) token that attends to `context_len` positions."""
        return self.flops(1, 1, context_len)

    def bytes_moved(self, kv_tokens_read: int, kv_tokens_written: int) -> float:
        kv = self.kv_bytes_per_token * (kv_tokens_read + kv_tokens_written)
        return float(self.weight_bytes + kv)


def utilisation(
    flops: float, nbytes: float, seconds: float, peaks: DevicePeaks
) -> tuple[float, float]:
    """(MFU, MBU) of one step: achieved FLOP/s and bytes/s over the device's peaks."""
    if seconds <= 0:
        return 0.0, 0.0
    return flops / seconds / peaks.flops, nbytes / seconds / peaks.bandwidth


def decode_step_seconds(
    shape: ModelShape,
    device: DeviceSpec,
    batch: int,
    context_len: int,
    weight_dtype: str,
    kv_dtype: str,
    tensor_parallel_size: int = 1,
) -> tuple[float, float]:
    """(memory time, compute time) of one decode step of `batch` sequences at `context_len`:
    every streamed weight read once plus each sequence's KV; each sequence samples a token.
    Split N ways, one GPU's: its weight shard and its KV heads (all-reduces aside)."""
    cost = ModelCost.from_shape(shape, weight_dtype, kv_dtype, tensor_parallel_size)
    positions = batch * context_len
    flops = cost.flops(batch, batch, positions)
    nbytes = cost.bytes_moved(kv_tokens_read=positions, kv_tokens_written=0)
    return DevicePeaks.from_spec(device, weight_dtype).seconds(flops, nbytes)


def allreduce_bytes(
    shape: Dims, batch: int, tensor_parallel_size: int, weight_dtype: str = "bfloat16"
) -> int:
    """Bytes one GPU sends in one decode step of `batch` tokens split `tensor_parallel_size`
    ways: two all-reduces per layer (after attention's o projection and after the MLP's down
    projection) of batch x hidden activations each, and a ring all-reduce sends 2 x (N-1)/N
    of its buffer per GPU. Activations are 16-bit unless the weights are float32. 0 at N=1."""
    n = tensor_parallel_size
    act_bytes = 4 if weight_dtype == "float32" else 2
    buffer = batch * shape.hidden_size * act_bytes
    return 2 * shape.num_layers * buffer * 2 * (n - 1) // n


def saturation_batch(
    shape: ModelShape,
    device: DeviceSpec,
    context_len: int,
    weight_dtype: str,
    kv_dtype: str,
    tensor_parallel_size: int = 1,
) -> int:
    """Smallest batch whose decode step is compute bound (a huge number if none is)."""
    n = tensor_parallel_size
    mem_1, compute_1 = decode_step_seconds(shape, device, 1, context_len, weight_dtype, kv_dtype, n)
    kv_s = shape.kv_bytes_per_token(kv_dtype, n) * context_len / device.mem_bandwidth
    weights_s = mem_1 - kv_s
    per_seq_gain = compute_1 - kv_s  # each sequence adds compute_1 and kv_s
    return math.ceil(weights_s / per_seq_gain) if per_seq_gain > 0 else 1 << 30


def run_roofline_seconds(
    cost: ModelCost, steps: Iterable[tuple[int, int]], peaks: DevicePeaks
) -> float:
    """The fastest a whole engine run could go (scripts/bench_peers.py): one read of every
    weight per step that carries decode rows, at the read bandwidth, plus the prefill
    tokens' projection FLOPs at the matmul peak. `steps` is (decode rows, prefill tokens)
    per step. Decode rows' FLOPs, attention and the LM head's FLOPs are left out, so it is a
    lower bound on the time."""
    read_s = prefill_flops = 0.0
    for decode_rows, prefill_tokens in steps:
        if decode_rows < 0 or prefill_tokens < 0:
            raise ValueError(f"a step has {decode_rows} decode rows, {prefill_tokens} prefill")
        if decode_rows:
            read_s += cost.weight_bytes / peaks.bandwidth
        prefill_flops += 2.0 * cost.linear_params * prefill_tokens
    return read_s + prefill_flops / peaks.flops
