"""Dense projections. On CPU in bfloat16, weights are pre-packed once for oneDNN.

oneDNN's packed layout streams bf16 weights about a third faster than ``F.linear``
on plain tensors at decode batch sizes (measured in scripts/bench_engine.py's
roofline section). Where the packed op is missing or disagrees with ``F.linear`` on a
probe, the plain path is used; the choice is made once per process.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


@functools.cache
def _packed_linear_works() -> bool:
    try:
        w = torch.randn(32, 16, dtype=torch.bfloat16)
        x = torch.randn(3, 16, dtype=torch.bfloat16)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 1)
        got = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        return bool(torch.allclose(got.float(), F.linear(x, w).float(), atol=1e-2, rtol=1e-2))
    except (AttributeError, RuntimeError):
        return False


class Linear:
    """y = x W^T + b, with W [out, in] as stored in Hugging Face checkpoints."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.packed = (
            weight.device.type == "cpu"
            and weight.dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available()
            and _packed_linear_works()
        )
        if self.packed:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        else:
            self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
