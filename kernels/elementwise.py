"""A layer's elementwise ops (norm, rope, activation) on the implementation kernels/dispatch.py
names for them: the fused native kernels of csrc/elementwise, or their torch reference."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from tide_fleet.kernels import dispatch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, weight.shape, weight, eps)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x [..., head_dim] with cos/sin broadcast to it."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return torch.addcmul(x * cos, rotated, sin)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class Elementwise:
    """The ops as a step takes them on one device: ``ops`` (torch.ops.tide) where the
    table names a native implementation, else torch. The native ops' signatures."""

    def __init__(self, ops: Any, device: torch.device) -> None:
        self.ops = ops
        native = [
            ops is not None and dispatch.is_native(dispatch.impl(op, device))
            for op in ("norm", "rope", "activation")
        ]
        self.native_norm, self.native_rope, self.native_activation = native

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return self.ops.rms_norm(x, w, eps) if self.native_norm else rms_norm(x, w, eps)

    def add_rms_norm_(
        self, hidden: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """hidden += delta in place; returns rms_norm(hidden) * w."""
        if self.native_norm:
            return self.ops.add_rms_norm_(hidden, delta, w, eps)
        return rms_norm(hidden.add_(delta), w, eps)

    def rotary_(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        heads: int,
        head_dim: int,
    ) -> None:
        """Rotate the first ``heads`` heads of each row of x [rows, >= heads * head_dim] in
        place, at the rows' positions in the cos/sin tables [max_pos, head_dim]."""
        if self.native_rope:
            self.ops.rotary_(x, positions, cos, sin, heads, head_dim)
            return
        part = x[:, : heads * head_dim].view(x.shape[0], heads, head_dim)
        part.copy_(apply_rotary(part, cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)))

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self.ops.silu_mul(gate_up) if self.native_activation else silu_mul(gate_up)
