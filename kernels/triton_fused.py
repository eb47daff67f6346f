"""Fused elementwise kernels for the CUDA path (ops norm, activation; rope in
``triton_rope``, re-exported here), behind the signatures of torch.ops.tide's CPU ops
(``kernels/csrc/elementwise``) and with their rounding (``round_to``):

- ``rms_norm`` / ``add_rms_norm_``: hidden += delta rounded to the dtype and written back,
  the sum of squares in float32 over the rounded row, out = round(w * round(h * inv_rms)),
  inv_rms = 1 / sqrt(ss / dim + eps) with IEEE division and square root (``div_rn``,
  ``sqrt_rn``) as in C++. One program per row, the whole row in registers
  (``MAX_NORM_DIM``).
- ``silu_mul``: [rows, 2 x inter] (gate | up) -> [rows, inter]: act = round(silu(gate)),
  out = round(act * up). One program per (row, ``SILU_BLOCK`` columns).
- ``rotary_``, ``rotary_kv_write_``: see ``triton_rope``.

float32, bfloat16 and float16; rows may be strided (unit last stride). Row counts are grid
sizes only, so no compile variant depends on them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tide_fleet.kernels.launch import launch
from tide_fleet.kernels.triton_rope import (
    rotary_,
    rotary_kv_write_,
    takes_rotary,
    takes_rotary_kv_write,
)
from tide_fleet.kernels.triton_rounding import DTYPES, STRICT, round_to

__all__ = [
    "DTYPES", "MAX_NORM_DIM", "add_rms_norm_", "rms_norm", "rotary_", "rotary_kv_write_",
    "silu_mul", "takes_norm", "takes_rotary", "takes_rotary_kv_write", "takes_silu_mul",
]  # fmt: skip

MAX_NORM_DIM = 8192  # a norm row held in registers by one program
SILU_BLOCK = 1024  # columns of the intermediate per silu_mul program


def _warps(block: int) -> int:
    return 16 if block >= 8192 else 8 if block >= 2048 else 4


@triton.jit  # type: ignore[untyped-decorator]
def _rms_norm_kernel(  # type: ignore[no-untyped-def]
    hidden, delta, weight, out, stride_h, stride_d, stride_o, eps,
    DIM: tl.constexpr, BLOCK: tl.constexpr, HAS_DELTA: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK)
    mask = i < DIM
    dtype = out.dtype.element_ty
    h = tl.load(hidden + row * stride_h + i, mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:
        d = tl.load(delta + row * stride_d + i, mask=mask, other=0.0).to(tl.float32)
        summed = round_to(h + d, dtype)
        tl.store(hidden + row * stride_h + i, summed, mask=mask)
        h = summed.to(tl.float32)
    ss = tl.sum(h * h, axis=0)
    inv = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(ss, DIM * 1.0) + eps))
    normed = round_to(h * inv, dtype).to(tl.float32)
    w = tl.load(weight + i, mask=mask, other=0.0).to(tl.float32)
    tl.store(out + row * stride_o + i, round_to(w * normed, dtype), mask=mask)


def takes_norm(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the norm kernel takes x [rows, dim] and weight [dim]."""
    return (
        x.dim() == 2 and x.stride(1) == 1 and x.dtype in DTYPES and x.size(1) <= MAX_NORM_DIM
        and w.dim() == 1 and w.is_contiguous() and w.dtype == x.dtype and w.size(0) == x.size(1)
    )  # fmt: skip


def _norm(
    hidden: torch.Tensor, delta: torch.Tensor | None, w: torch.Tensor, eps: float, check: bool
) -> torch.Tensor:
    if check and not takes_norm(hidden, w):
        raise ValueError(
            f"rms_norm: x must be [rows, <= {MAX_NORM_DIM}] with unit last stride in "
            f"{', '.join(map(str, DTYPES))}, weight [dim] of its dtype; got x "
            f"{tuple(hidden.shape)} {hidden.dtype}, weight {tuple(w.shape)} {w.dtype}"
        )
    if delta is not None and (  # checked always: Elementwise's takes_norm does not see it
        delta.shape != hidden.shape or delta.stride(1) != 1 or delta.dtype != hidden.dtype
    ):
        raise ValueError("add_rms_norm_: delta must match hidden (shape, dtype, unit last stride)")
    rows, dim = hidden.shape
    out = torch.empty((rows, dim), dtype=hidden.dtype, device=hidden.device)
    if rows == 0:
        return out
    block = triton.next_power_of_2(dim)
    args = dict(
        hidden=hidden, delta=hidden if delta is None else delta, weight=w, out=out,
        stride_h=hidden.stride(0), stride_d=0 if delta is None else delta.stride(0),
        stride_o=out.stride(0), eps=float(eps),
    )  # fmt: skip
    constexprs = dict(
        DIM=dim, BLOCK=block, HAS_DELTA=delta is not None, num_warps=_warps(block), **STRICT
    )
    name = "rms_norm" if delta is None else "add_rms_norm_"
    launch(_rms_norm_kernel, (rows,), name, args, constexprs)
    return out


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, check: bool = True) -> torch.Tensor:
    """out = round(w * round(x * inv_rms(x))) for x [rows, dim]. ``check=False``: the caller
    has asked ``takes_norm`` already (kernels/elementwise.py, once a call)."""
    return _norm(x, None, w, eps, check)


def add_rms_norm_(
    hidden: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float, check: bool = True
) -> torch.Tensor:
    """hidden += delta in place (rounded to its dtype); returns rms_norm(hidden) * w."""
    return _norm(hidden, delta, w, eps, check)


@triton.jit  # type: ignore[untyped-decorator]
def _silu_mul_kernel(  # type: ignore[no-untyped-def]
    gate_up, out, stride_g, stride_o, inter, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < inter
    dtype = out.dtype.element_ty
    g = tl.load(gate_up + row * stride_g + col, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gate_up + row * stride_g + inter + col, mask=mask, other=0.0).to(tl.float32)
    act = round_to(tl.div_rn(g, 1.0 + tl.exp(-g)), dtype).to(tl.float32)
    tl.store(out + row * stride_o + col, round_to(act * u, dtype), mask=mask)


def takes_silu_mul(gate_up: torch.Tensor) -> bool:
    return (
        gate_up.dim() == 2 and gate_up.stride(1) == 1 and gate_up.size(1) % 2 == 0
        and gate_up.dtype in DTYPES
    )  # fmt: skip


def silu_mul(gate_up: torch.Tensor, check: bool = True) -> torch.Tensor:
    """[rows, 2 * inter] (gate | up) -> [rows, inter]: round(round(silu(gate)) * up)."""
    if check and not takes_silu_mul(gate_up):
        raise ValueError(
            "silu_mul: gate_up must be [rows, 2 * intermediate] with unit last stride in "
            f"{', '.join(map(str, DTYPES))}; got {tuple(gate_up.shape)} {gate_up.dtype}"
        )
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((rows, inter), dtype=gate_up.dtype, device=gate_up.device)
    if rows == 0 or inter == 0:
        return out
    block = min(SILU_BLOCK, triton.next_power_of_2(inter))
    args = dict(
        gate_up=gate_up, out=out, stride_g=gate_up.stride(0), stride_o=out.stride(0), inter=inter
    )
    grid = (rows, triton.cdiv(inter, block))
    launch(_silu_mul_kernel, grid, "silu_mul", args, dict(BLOCK=block, **STRICT))
    return out
