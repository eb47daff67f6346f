"""Rounding a float32 value to the dtype a Triton kernel stores: an explicit round to
nearest even on the bits for bfloat16, the same compiled and under Triton's CPU interpreter
(whose float-to-bf16 cast truncates); float16 and float32 through the plain cast (round to
nearest even both ways). And the launch options that keep the arithmetic in that order."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what the fused kernels take
# Launch options of the fused kernels: every product rounded before it is added, as in the
# C++ kernels' AVX-512 loops (no multiply-add contraction), so a bf16 result matches theirs.
STRICT = dict(enable_fp_fusion=False)


@triton.jit  # type: ignore[untyped-decorator]
def round_to(x, dtype: tl.constexpr):  # type: ignore[no-untyped-def]
    """float32 x rounded to nearest even in dtype."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        rounded = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        return tl.where(x == x, rounded, x.to(tl.bfloat16))  # NaN stays NaN
    else:
        return x.to(dtype)
