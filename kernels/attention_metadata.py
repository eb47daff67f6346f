"""What one step tells the attention kernels: decode groups and prefill chunks (flattened rows,
block tables, context lengths), built by the model runner."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DecodeGroup:
    """Decode rows of similar context length, batched into one SDPA call."""

    rows: slice
    block_tables: torch.Tensor  # [n, max_blocks] int64, padded with block 0
    mask: torch.Tensor  # [1, n, 1, max_blocks * block_size] bool: key is visible
    context_lens: torch.Tensor  # [n] int32 (the Triton kernel reads these, not the mask)
    max_context: int


@dataclass
class PrefillChunk:
    rows: slice  # this chunk's rows in the flattened token batch
    start_pos: int  # tokens before the chunk that are already in the cache
    block_table: torch.Tensor  # [num_blocks_for_context] int64


@dataclass
class AttentionMetadata:
    """Everything attention needs for one step, built once and shared by all layers."""

    slot_mapping: torch.Tensor  # [num_tokens] int64
    block_size: int
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor, by a readable name (device checks)."""
        out = {"slot_mapping": self.slot_mapping}
        for i, g in enumerate(self.decode_groups):
            out |= {f"decode_groups[{i}].{name}": getattr(g, name)
                    for name in ("block_tables", "mask", "context_lens")}  # fmt: skip
        for i, c in enumerate(self.prefills):
            out[f"prefills[{i}].block_table"] = c.block_table
        return out
