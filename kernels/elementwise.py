"""A layer's elementwise ops (norm, rope, activation) on the implementation kernels/dispatch.py
names for them: the fused native kernels of csrc/elementwise, the Triton kernels of
triton_fused.py (CUDA; on CPU under ``TRITON_INTERPRET=1``), or their torch reference. A call
the Triton kernels do not take (another dtype, a norm row past ``MAX_NORM_DIM``) takes torch."""

from __future__ import annotations

from types import ModuleType
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


def _triton_fused() -> ModuleType:
    # Here, not at the top: Triton is optional (a dev extra; CPU-only installs lack it).
    from tide_fleet.kernels import triton_fused

    return triton_fused


class Elementwise:
    """The ops as a step takes them on one device: ``ops`` (torch.ops.tide) where the
    table names a native implementation, the Triton kernels where it names triton, else
    torch. The native ops' signatures."""

    def __init__(self, ops: Any, device: torch.device) -> None:
        self.ops = ops
        impls = {op: dispatch.impl(op, device) for op in ("norm", "rope", "activation")}
        native = [ops is not None and dispatch.is_native(impls[op]) for op in impls]
        self.native_norm, self.native_rope, self.native_activation = native
        triton = [impls[op] == "triton" for op in impls]
        self.triton_norm, self.triton_rope, self.triton_activation = triton
        self.triton_kv_write = dispatch.impl("kv_write", device) == "triton"

    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        if self.native_norm:
            return self.ops.rms_norm(x, w, eps)
        if self.triton_norm and _triton_fused().takes_norm(x, w):
            return _triton_fused().rms_norm(x, w, eps, check=False)
        return rms_norm(x, w, eps)

    def add_rms_norm_(
        self, hidden: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float
    ) -> torch.Tensor:
        """hidden += delta in place; returns rms_norm(hidden) * w."""
        if self.native_norm:
            return self.ops.add_rms_norm_(hidden, delta, w, eps)
        if self.triton_norm and _triton_fused().takes_norm(hidden, w):
            return _triton_fused().add_rms_norm_(hidden, delta, w, eps, check=False)
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
        if self.triton_rope and _triton_fused().takes_rotary(
            x, positions, cos, sin, heads, head_dim
        ):
            _triton_fused().rotary_(x, positions, cos, sin, heads, head_dim, check=False)
            return
        part = x[:, : heads * head_dim].view(x.shape[0], heads, head_dim)
        part.copy_(apply_rotary(part, cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)))

    def rotary_kv_write_(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> bool:
        """RoPE of q and k in the fused qkv rows and the KV-cache write of k and v in one
        launch, where rope and kv_write both take triton here and the kernel takes the call:
        True. Else False, having done nothing: the caller rotates and writes separately."""
        if not (self.triton_rope and self.triton_kv_write):
            return False
        fused = _triton_fused()
        call = (qkv, positions, cos, sin, num_heads, num_kv_heads, head_dim, k_cache, v_cache,
                slot_mapping)  # fmt: skip
        if not fused.takes_rotary_kv_write(*call):
            return False
        fused.rotary_kv_write_(*call, check=False)
        return True

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.native_activation:
            return self.ops.silu_mul(gate_up)
        if self.triton_activation and _triton_fused().takes_silu_mul(gate_up):
            return _triton_fused().silu_mul(gate_up, check=False)
        return silu_mul(gate_up)
