"""Dense projections, y = x W^T + b, on the implementation kernels/dispatch.py names for the
ops gemv (a decode step's few rows) and gemm (every other row count).

On CPU in bfloat16 the weight is packed once at load: for the native GEMV and the AMX GEMM
(one layout, one copy for every row count, no padding), or for oneDNN's packed matmul. A
weight keeps oneDNN's copy beside the GEMV's where the GEMM is oneDNN's (no AMX): twice the
weight memory, ``TIDE_KERNELS=gemv=gemm`` trades the decode speed for it back. float32 takes
the native AVX2 GEMM on ``cpu-avx2``, else oneDNN's packed matmul; whatever the chosen
implementation cannot take (dtype, shape, a oneDNN that disagrees with ``F.linear`` on a
probe) falls back to ``F.linear``.

oneDNN builds (JITs) a matmul for every new row count, and a mixed step's row count is new
almost every time (a first call at 400 rows takes twice the next). So the packed matmul
runs at fixed row counts (``packed_rows``: multiples of 8 up to 64 rows, of 64 above), the
rows padded with zeros, and ``Linear.warm_up`` builds them all when the model loads.

oneDNN's rate also falls off a cliff past some row count for some shapes: on the bench
model's o projection (1,024 x 1,024, AMX, 2 threads) 1,024 rows ran at 1.19 TFLOP/s in one
call and 1.76 in two of 512 (``python scripts/bench_linear_split.py``). So at load the model
times each shape's largest bucket in one call against ``SPLIT_ROWS``-row pieces, over every
layer's weights (``choose_row_split``: about 0.4 s), and a shape whose pieces won runs its
large calls as pieces: long prompts 1.05-1.07x (``scripts/bench_peers.py --workloads long``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels import dispatch

# The row count oneDNN lays the packed weight out for: packed for 64 rows instead of 1, a
# decode-heavy run (32 requests x 48 tokens, dummy:bench) took 1.20x less time and a
# prefill-heavy one (4 x 2,000-token prompts) 1.015x, alternating in one process.
PACK_BATCH_HINT = 64

# Row buckets of the packed matmul: small steps (decode batches) are bound by the weight
# read, so 8 more rows cost almost nothing; above SMALL_ROWS a step pads at most 63 rows.
SMALL_ROWS, SMALL_STEP, LARGE_STEP = 64, 8, 64

# Large calls run in pieces of this many rows where that was faster at load (a multiple of
# LARGE_STEP, so every piece is a warmed bucket); a split must win by SPLIT_MARGIN.
SPLIT_ROWS = 512
SPLIT_MARGIN = 0.95


def packed_rows(rows: int) -> int:
    """The row count the packed matmul runs a call of ``rows`` rows at."""
    step = SMALL_STEP if rows <= SMALL_ROWS else LARGE_STEP
    return -(-rows // step) * step


def packed_row_buckets(max_rows: int) -> list[int]:
    """Every row count ``packed_rows`` gives for 1..max_rows rows."""
    small = range(SMALL_STEP, min(max_rows, SMALL_ROWS) + SMALL_STEP, SMALL_STEP)
    large = range(SMALL_ROWS + LARGE_STEP, packed_rows(max_rows) + 1, LARGE_STEP)
    return [*small, *(large if max_rows > SMALL_ROWS else ())]


@functools.cache
def _packed_linear_works(dtype: torch.dtype = torch.bfloat16) -> bool:
    try:
        w = torch.randn(32, 16, dtype=dtype)
        x = torch.randn(3, 16, dtype=dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_BATCH_HINT)
        got = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        return bool(torch.allclose(got.float(), F.linear(x, w).float(), atol=1e-2, rtol=1e-2))
    except (AttributeError, RuntimeError):
        return False


def _onednn_pack(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's packed copy of a weight [out, in], laid out for PACK_BATCH_HINT rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_HINT)


class Linear:
    """y = x W^T + b, with W [out, in] as stored in Hugging Face checkpoints."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.dtype = weight.dtype
        gemv, gemm = dispatch.impl("gemv", weight.device), dispatch.impl("gemm", weight.device)
        cpu_bf16 = weight.device.type == "cpu" and weight.dtype == torch.bfloat16
        cpu_fp32 = weight.device.type == "cpu" and weight.dtype == torch.float32
        self.gemv_rows = 0  # rows up to this many take the native GEMV
        self.gemv_weight: torch.Tensor | None = None  # its packed weight, the AMX GEMM's too
        takes_pack = gemv != "gemm" or gemm == "cpp-amx"
        if takes_pack and cpu_bf16 and self.in_features % 32 == 0 and cpu_kernels.gemv_max_rows():
            self.gemv_weight = cpu_kernels.ops().gemv_pack_bf16(weight)
            self.gemv_rows = cpu_kernels.gemv_step_rows() if gemv != "gemm" else 0
        # More rows on the native GEMM over the GEMV's weight (AMX): then it is the only copy.
        self.gemm = (
            gemm == "cpp-amx" and self.gemv_weight is not None and cpu_kernels.gemm_rows_ready()
        )
        # float32 on Tide's AVX2 GEMM (its packed weight the only copy).
        self.f32 = gemm == "cpp-avx2" and cpu_fp32 and cpu_kernels.gemm_f32_preferred()
        self.packed = (
            gemm != "torch"
            and not self.gemm
            and not self.f32
            and (cpu_bf16 or cpu_fp32)
            and torch.backends.mkldnn.is_available()
            and _packed_linear_works(weight.dtype)
        )
        if self.gemm:
            self.weight = self.gemv_weight  # what step_layers_packed takes (5-d: the GEMM's)
        elif self.f32:
            self.weight = cpu_kernels.ops().gemm_f32_pack(weight)  # 1-d: the AVX2 GEMM's
        elif self.packed:
            self.weight = _onednn_pack(weight)
        else:
            self.weight = weight
        self.split_rows = 0  # > 0: packed calls of more rows run in pieces of this many
        # A gate|up projection whose SiLU(gate) * up the GEMV's and GEMM's tiles produce
        # directly (``silu_glu``; activation cpp-amx): no bias, whole 16-column groups per half.
        half = self.out_features // 2
        self.fuses_silu = (
            dispatch.impl("activation", weight.device) == "cpp-amx"
            and self.gemm
            and self.gemv_rows > 0
            and bias is None
            and self.out_features % 2 == 0
            and half % 16 == 0
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if 0 < x.shape[0] <= self.gemv_rows and x.dim() == 2:
            return cpu_kernels.ops().gemv_bf16(x, self.gemv_weight, self.bias, self.out_features)
        if self.gemm:
            rows = x.reshape(-1, self.in_features)
            y = cpu_kernels.ops().gemm_bf16(rows, self.gemv_weight, self.bias, self.out_features)
            return y.view(*x.shape[:-1], self.out_features)
        if self.f32:
            rows = x.reshape(-1, self.in_features)
            y = cpu_kernels.ops().gemm_f32(rows, self.weight, self.bias, self.out_features)
            return y.view(*x.shape[:-1], self.out_features)
        if self.packed:
            return self._packed(x)
        return F.linear(x, self.weight, self.bias)

    def silu_glu(self, x: torch.Tensor) -> torch.Tensor:
        """SiLU(x W_gate^T) * (x W_up^T) for a fused gate|up weight (``fuses_silu``), without
        writing the [rows, 2I] projection: bit for bit silu_mul of this projection."""
        rows = x.reshape(-1, self.in_features)
        y = cpu_kernels.ops().gate_up_silu_bf16(rows, self.gemv_weight, self.out_features // 2)
        return y.view(*x.shape[:-1], self.out_features // 2)

    def _packed(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0] if x.dim() == 2 else 0
        if 0 < self.split_rows < rows:
            step = self.split_rows
            return torch.cat([self._packed(x[i : i + step]) for i in range(0, rows, step)])
        padded = packed_rows(rows) if rows else 0
        if padded > rows:
            buf = x.new_empty((padded, x.shape[1]))
            buf[:rows].copy_(x)
            buf[rows:].zero_()
            x = buf
        y = self._onednn(x)
        return y[:rows] if padded > rows else y

    def _onednn(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")

    def warm_up(self, max_rows: int) -> None:
        """Build the packed matmul for every row bucket up to max_rows now, not mid-serving
        (oneDNN caches them per process: one build per bucket and weight shape)."""
        if not self.packed:
            return
        for rows in packed_row_buckets(max_rows):
            if rows > self.gemv_rows:
                self._packed(torch.zeros(rows, self.in_features, dtype=self.dtype))


def choose_row_split(linears: Sequence[Linear], max_rows: int, repeats: int = 2) -> int:
    """For projections of one shape (one per layer), time a pass over all of them at the
    largest row bucket in one call each against the same rows in SPLIT_ROWS pieces (every
    layer's weights, streamed from memory as a step streams them, not one layer's from
    cache); keep the pieces where they win by SPLIT_MARGIN. Sets and returns split_rows
    (0: whole calls). warm_up must have built the buckets. bf16 only, where the cliff was
    measured: float32 matmuls are 2-4x slower, so timing them would add seconds to a
    worker's start for a gain no one has seen."""
    top = packed_rows(max_rows)
    for lin in linears:
        lin.split_rows = 0
    if not linears or not linears[0].packed or top <= SPLIT_ROWS:
        return 0
    if linears[0].dtype != torch.bfloat16:
        return 0
    x = torch.randn(top, linears[0].in_features).to(linears[0].dtype)

    def best_pass() -> float:
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            for lin in linears:
                lin(x)
            best = min(best, time.perf_counter() - started)
        return best

    whole = best_pass()
    for lin in linears:
        lin.split_rows = SPLIT_ROWS
    pieces = best_pass()
    split = SPLIT_ROWS if pieces < SPLIT_MARGIN * whole else 0
    for lin in linears:
        lin.split_rows = split
    return split
