"""Memory and batch planner: how a model fits a device, and what to set the engine to.

Torch-free and pure. ``tide plan`` (infra/cli/plan.py) prints a Plan; the controller calls
estimate_pool_tokens_per_s() as a worker's service rate before any measurement exists. The
step costs come from the roofline (roofline.py). Every rule is written out in docs/plan.md.
"""

from __future__ import annotations

import math
from typing import Any

from tide_fleet.infra.plan.devices import DeviceSpec, GiB, get_device
from tide_fleet.infra.plan.errors import PlanError
from tide_fleet.infra.plan.model_shape import (
    PRESETS,
    ModelShape,
    ShapeError,
    dtype_bytes,
    kv_bytes,
    load_shape,
)
from tide_fleet.infra.plan.plan_result import Plan
from tide_fleet.infra.plan.roofline import (
    ModelCost,
    allreduce_bytes,
    decode_step_seconds,
    peak_flops,
    saturation_batch,
)
from tide_fleet.infra.plan.tensor_parallel import (
    check_tensor_parallel_size,
    fit_hint,
    min_tensor_parallel_size,
)

__all__ = [
    "PRESETS",
    "ModelShape",
    "Plan",
    "PlanError",
    "ShapeError",
    "check_tensor_parallel_size",
    "estimate_decode_tokens_per_s",
    "estimate_pool_tokens_per_s",
    "kv_bytes",
    "load_shape",
    "min_tensor_parallel_size",
    "plan",
]
DEFAULT_HEADROOM = 0.2  # keep a fifth of device memory free
DEFAULT_RESERVE_BYTES = 3 * GiB // 2  # CUDA context and activations: 1-2 GB
MAX_HEADROOM = 0.9
MAX_NUM_SEQS_CAP = 256  # past this, per-step latency grows for little extra throughput
SHORT_MIN_CONCURRENT = 16  # short bucket: this many maximal short requests fit at once
MEDIUM_MIN_CONCURRENT = 4  # medium bucket: this many; a long request then still fits
CHUNK_MIN, CHUNK_MAX, CHUNK_NO_DEVICE = 512, 8192, 2048  # prefill tokens per step


def estimate_decode_tokens_per_s(
    shape: ModelShape,
    device: DeviceSpec,
    batch: int,
    context_len: int,
    weight_dtype: str = "bfloat16",
    kv_dtype: str | None = None,
    efficiency: float = 1.0,
    tensor_parallel_size: int = 1,
    interconnect_bandwidth: float | None = None,
) -> float:
    """Roofline decode rate: each step reads the weights once plus every sequence's KV, and
    cannot beat the compute peak. `efficiency` scales it to what real kernels reach. Split N
    ways, each GPU reads its shard and the step adds its all-reduces over the interconnect
    (default: the device's), with no overlap."""
    if batch < 1 or context_len < 1:
        raise PlanError(f"batch and context_len must be positive, got {batch}, {context_len}")
    if not 0 < efficiency <= 1:
        raise PlanError(f"efficiency must be in (0, 1], got {efficiency}")
    n = tensor_parallel_size
    mem_s, compute_s = decode_step_seconds(
        shape, device, batch, context_len, weight_dtype, kv_dtype or weight_dtype, n
    )
    link = interconnect_bandwidth or device.interconnect_bandwidth
    allreduce_s = allreduce_bytes(shape, batch, n, weight_dtype) / link if n > 1 else 0.0
    return efficiency * batch / (max(mem_s, compute_s) + allreduce_s)


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _pow2_ceil(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def _check_inputs(
    lengths: dict[str, int],
    headroom: float,
    reserve_bytes: int,
    memory_bytes: int | None,
    kv_budget_bytes: int | None,
) -> None:
    for name, v in lengths.items():
        if v < 1:
            raise PlanError(f"{name} must be a positive number of tokens, got {v}")
    if not 0.0 <= headroom <= MAX_HEADROOM:
        raise PlanError(f"headroom must be in [0, {MAX_HEADROOM}], got {headroom}")
    if reserve_bytes < 0:
        raise PlanError(f"reserve must be >= 0 bytes, got {reserve_bytes}")
    if memory_bytes is not None and memory_bytes <= 0:
        raise PlanError(f"memory must be positive, got {memory_bytes} bytes")
    if kv_budget_bytes is not None and kv_budget_bytes <= 0:
        raise PlanError(f"kv budget must be positive, got {kv_budget_bytes} bytes")


def plan(
    shape: ModelShape,
    memory_bytes: int | None = None,
    *,
    device: DeviceSpec | None = None,
    weight_dtype: str = "bfloat16",
    kv_dtype: str | None = None,
    prompt_len: int = 512,
    output_len: int = 256,
    p99_len: int = 4096,
    reserve_bytes: int = DEFAULT_RESERVE_BYTES,
    headroom: float = DEFAULT_HEADROOM,
    kv_budget_bytes: int | None = None,
    tensor_parallel_size: int = 1,
    interconnect_bytes_per_s: float | None = None,
) -> Plan:
    """Plan `shape` on `memory_bytes` (default: the device's memory). `kv_budget_bytes`, when
    given, replaces the derived budget (usable - weights - reserve), e.g. a worker's pool.
    With `tensor_parallel_size` N > 1 the model is split over N such devices: memory, the
    budget and `kv_budget_bytes` are per GPU; `interconnect_bytes_per_s` replaces the
    device's GPU-to-GPU bandwidth."""
    n = tensor_parallel_size
    check_tensor_parallel_size(shape, n)
    if interconnect_bytes_per_s is not None and interconnect_bytes_per_s <= 0:
        raise PlanError(f"interconnect bandwidth must be positive, got {interconnect_bytes_per_s}")
    kv_dtype = kv_dtype or weight_dtype
    wbytes = dtype_bytes(weight_dtype)
    dtype_bytes(kv_dtype)  # validates the name
    lengths = {"prompt_len": prompt_len, "output_len": output_len, "p99_len": p99_len}
    _check_inputs(lengths, headroom, reserve_bytes, memory_bytes, kv_budget_bytes)
    if memory_bytes is None:
        if device is None:
            raise PlanError("give a device or a memory size")
        memory_bytes = device.memory_bytes
    usable = int(memory_bytes * (1.0 - headroom))
    weights = shape.num_parameters() * wbytes
    shard = shape.num_parameters(n) * wbytes
    avg_len = prompt_len + output_len
    dtypes = (weight_dtype, kv_dtype)
    smallest = min_tensor_parallel_size(shape, usable, reserve_bytes, dtypes, avg_len)
    if shard + reserve_bytes >= usable:
        per_gpu = f" per GPU (split {n} ways)" if n > 1 else ""
        raise PlanError(
            f"weights do not fit: {shard / GiB:.2f} GiB of {weight_dtype} weights{per_gpu} + "
            f"{reserve_bytes / GiB:.2f} GiB reserve need more than the {usable / GiB:.2f} GiB "
            f"usable ({memory_bytes / GiB:.2f} GiB less {headroom:.0%} headroom)"
            + fit_hint(smallest, shape)
        )
    warnings: list[str] = []
    derived = usable - shard - reserve_bytes
    budget = kv_budget_bytes if kv_budget_bytes is not None else derived
    if budget > derived:
        warnings.append(
            f"the given KV budget ({budget / GiB:.2f} GiB) exceeds what the memory leaves "
            f"after weights, reserve and headroom ({derived / GiB:.2f} GiB)"
        )
    kvpt = shape.kv_bytes_per_token(kv_dtype, n)  # per GPU: its share of the KV heads
    tokens = budget // kvpt
    concurrent = budget // (kvpt * avg_len)
    if concurrent < 1:
        hint = fit_hint(smallest, shape) if kv_budget_bytes is None and (smallest or 0) != n else ""
        raise PlanError(
            f"the KV budget ({budget / GiB:.2f} GiB = {tokens} tokens) holds less than one "
            f"average request ({avg_len} tokens)" + hint
        )
    concurrent_p99 = budget // (kvpt * p99_len)
    ctx = prompt_len + output_len // 2
    seqs = min(concurrent, MAX_NUM_SEQS_CAP)
    chunk = CHUNK_NO_DEVICE
    rate_1 = rate = work = None
    bound = None
    link_name = device.interconnect if device is not None else None
    link = interconnect_bytes_per_s or (device.interconnect_bandwidth if device else None)
    if interconnect_bytes_per_s is not None:
        link_name = "given"
    read_s = allreduce_s = step_s = None
    if device is not None:
        assert link is not None
        seqs = min(seqs, saturation_batch(shape, device, ctx, weight_dtype, kv_dtype, n))
        # A step of `ridge` tokens takes as long to compute as to read the weights; at 4x
        # that, the weight read costs at most a fifth of the step even without overlap.
        ridge = peak_flops(device, weight_dtype) * wbytes / (2 * device.mem_bandwidth)
        chunk = min(max(_pow2_ceil(math.ceil(4 * ridge)), CHUNK_MIN), CHUNK_MAX)
        rate_1 = estimate_decode_tokens_per_s(
            shape, device, 1, ctx, weight_dtype, kv_dtype,
            tensor_parallel_size=n, interconnect_bandwidth=link,
        )  # fmt: skip
        rate = estimate_decode_tokens_per_s(
            shape, device, seqs, ctx, weight_dtype, kv_dtype,
            tensor_parallel_size=n, interconnect_bandwidth=link,
        )  # fmt: skip
        mem_s, compute_s = decode_step_seconds(shape, device, seqs, ctx, weight_dtype, kv_dtype, n)
        bound = "compute" if compute_s > mem_s else "memory"
        read_s = max(mem_s, compute_s)
        allreduce_s = allreduce_bytes(shape, seqs, n, weight_dtype) / link if n > 1 else 0.0
        step_s = read_s + allreduce_s
        # Prefill and decode share the device: a request costs its output at the batch's
        # decode rate plus its prompt at the compute peak (and, split, its all-reduces).
        cost = ModelCost.from_shape(shape, weight_dtype, kv_dtype, n)
        prefill_rate = peak_flops(device, weight_dtype) / cost.flops_per_token(prompt_len // 2)
        prefill_allreduce_s = allreduce_bytes(shape, 1, n, weight_dtype) / link if n > 1 else 0.0
        work = avg_len / (
            output_len / rate + prompt_len / prefill_rate + prompt_len * prefill_allreduce_s
        )
    batched = seqs + chunk
    q, kv = shape.num_heads * shape.head_dim // n, shape.num_kv_heads * shape.head_dim // n
    act_bytes = 4 if weight_dtype == "float32" else 2
    inter = -(-shape.intermediate_size // n)
    per_token = 4 * shape.hidden_size + q + 2 * kv + 3 * inter
    activations = batched * per_token * act_bytes + seqs * shape.vocab_size * 4  # fp32 logits
    short_max = _pow2_floor(max(tokens // SHORT_MIN_CONCURRENT, 16))
    medium_max = max(_pow2_floor(tokens // MEDIUM_MIN_CONCURRENT), 2 * short_max)
    max_len = shape.max_position_embeddings
    if p99_len < avg_len:
        warnings.append(f"p99_len ({p99_len}) is below the average length ({avg_len})")
    if concurrent_p99 < 1:
        warnings.append(
            f"a p99 request ({p99_len} tokens) does not fit even alone "
            f"(the KV budget holds {tokens} tokens)"
        )
    if p99_len > max_len:
        warnings.append(f"p99_len ({p99_len}) exceeds the model's context ({max_len})")
    if medium_max >= max_len:
        which = "short" if short_max >= max_len else "short or medium"
        warnings.append(
            f"every request this model accepts ({max_len} tokens of context) is {which} "
            "on this device: it needs no long pool"
        )
    if n > 1:
        warnings.append(
            f"the step time split {n} ways is a model (reads plus all-reduces, no overlap), "
            f"not a measurement; serve it with tide worker --tensor-parallel-size {n} "
            f"(fleet.toml: gpus_per_worker = {n})"
        )
    if activations > reserve_bytes:
        warnings.append(
            f"estimated activations ({activations / GiB:.2f} GiB) exceed the "
            f"reserve ({reserve_bytes / GiB:.2f} GiB)"
        )
    return Plan(
        model=shape.name,
        device=device.name if device else None,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        num_parameters=shape.num_parameters(),
        weight_bytes=weights,
        kv_bytes_per_token=shape.kv_bytes_per_token(kv_dtype),
        memory_bytes=memory_bytes,
        headroom=headroom,
        reserve_bytes=reserve_bytes,
        usable_bytes=usable,
        kv_budget_bytes=budget,
        kv_budget_tokens=tokens,
        prompt_len=prompt_len,
        output_len=output_len,
        avg_len=avg_len,
        p99_len=p99_len,
        max_concurrent_seqs=concurrent,
        max_concurrent_seqs_p99=concurrent_p99,
        recommended_max_num_seqs=seqs,
        recommended_max_num_batched_tokens=batched,
        prefill_chunk_tokens=chunk,
        activation_bytes_estimate=activations,
        decode_context_len=ctx,
        decode_tokens_per_s_batch1=rate_1,
        decode_tokens_per_s=rate,
        decode_bound=bound,
        work_tokens_per_s=work,
        bucket_short_max=short_max,
        bucket_medium_max=medium_max,
        max_model_len=max_len,
        tensor_parallel_size=n,
        weight_bytes_per_gpu=shard,
        kv_bytes_per_token_per_gpu=kvpt,
        min_tensor_parallel_size=smallest,
        interconnect=link_name,
        interconnect_bytes_per_s=link,
        step_allreduce_bytes=allreduce_bytes(shape, seqs, n, weight_dtype),
        step_read_seconds=read_s,
        step_allreduce_seconds=allreduce_s,
        step_seconds=step_s,
        warnings=tuple(warnings),
    )


def estimate_pool_tokens_per_s(pool: Any, efficiency: float = 0.6) -> float:
    """A pool worker's service rate in work tokens/s (what the controller divides backlog by)
    from its `device` and `model` (a preset, config.json or model folder), at the default
    lengths. Real kernels reach 60-90% of the roofline; the default takes the low end."""
    if not pool.model:
        raise PlanError("the pool names no model to plan")
    p = plan(load_shape(pool.model), device=get_device(pool.device))
    assert p.work_tokens_per_s is not None  # a device was given
    return efficiency * p.work_tokens_per_s
