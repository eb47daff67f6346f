"""An adapter's tensors in host memory, laid out for the device slots (``slots.py``).

The model fuses q|k|v and gate|up into one projection each; an adapter's module maps to
*sub-blocks* of one of the four projections (qkv, o, gate_up, down). Every slot holds, per
layer and projection, ``A`` as ``[n_sub * R, in]`` (sub-block i's rows at rank block i)
and ``B`` as ``[out, R]``, with the module's scaling folded into B. A fused module
(``qkv_proj``, ``gate_up_proj``) spans several sub-blocks: its A is repeated at each one's
rank block and its B split by rows, which gives the same product.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from safetensors import safe_open

from tide_fleet.infra.contract.adapters import AdapterSpec
from tide_fleet.infra.contract.model_config import ModelConfig

PROJECTIONS = ("qkv", "o", "gate_up", "down")
# Tide's module name -> (projection, the sub-blocks it spans).
MODULE_SUBS = {
    "q": ("qkv", (0,)), "k": ("qkv", (1,)), "v": ("qkv", (2,)), "qkv": ("qkv", (0, 1, 2)),
    "o": ("o", (0,)), "gate": ("gate_up", (0,)), "up": ("gate_up", (1,)),
    "gate_up": ("gate_up", (0, 1)), "down": ("down", (0,)),
}  # fmt: skip


@dataclass(frozen=True)
class Geometry:
    """Per projection: input width and the output column range of each sub-block."""

    inputs: dict[str, int]
    subs: dict[str, list[tuple[int, int]]]

    @classmethod
    def of(cls, config: ModelConfig) -> Geometry:
        h, inter = config.hidden_size, config.intermediate_size
        q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        return cls(
            inputs={"qkv": h, "o": q, "gate_up": h, "down": inter},
            subs={
                "qkv": [(0, q), (q, q + kv), (q + kv, q + 2 * kv)], "o": [(0, h)],
                "gate_up": [(0, inter), (inter, 2 * inter)], "down": [(0, h)],
            },
        )  # fmt: skip

    def outputs(self, proj: str) -> int:
        return self.subs[proj][-1][1]


@dataclass(frozen=True)
class SubBlock:
    """One (layer, projection, sub-block) piece of an adapter: A [r, in], B [width, r]."""

    layer: int
    proj: str
    sub: int
    a: torch.Tensor
    b: torch.Tensor  # scaled


@dataclass
class HostAdapter:
    spec: AdapterSpec
    blocks: list[SubBlock]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for blk in self.blocks for t in (blk.a, blk.b))


def load_host(spec: AdapterSpec, geometry: Geometry, dtype: torch.dtype) -> HostAdapter:
    """Read the adapter's tensors (checked by ``read_adapter``) into host memory, split into
    sub-blocks, B scaled, in the model's dtype."""
    blocks = []
    with safe_open(str(spec.folder / "adapter_model.safetensors"), "pt") as f:
        for mod in spec.modules:
            proj, subs = MODULE_SUBS[mod.module]
            a = f.get_tensor(mod.key_a).to(torch.float32)
            b = f.get_tensor(mod.key_b).to(torch.float32) * mod.scaling
            at = 0
            for sub in subs:
                lo, hi = geometry.subs[proj][sub]
                width = hi - lo
                blocks.append(SubBlock(
                    mod.layer, proj, sub, a.to(dtype).contiguous(),
                    b[at : at + width].to(dtype).contiguous(),
                ))  # fmt: skip
                at += width
    return HostAdapter(spec, blocks)
