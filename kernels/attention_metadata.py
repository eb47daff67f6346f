"""What one step tells the attention kernels: decode groups and prefill chunks (flattened rows,
block tables, context lengths), built by the model runner."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class DecodeGroup:
    """Decode rows batched into one kernel call (for the torch reference: of similar context
    length, as it pads every row to the group's longest)."""

    rows: slice
    block_tables: torch.Tensor  # [n, max_blocks] int64, padded with block 0
    context_lens: torch.Tensor  # [n] int32; 0 marks a padding row (attends to nothing)
    max_context: int  # at least the longest context (sizes the Triton split; not read)


@dataclass
class PrefillChunk:
    rows: slice  # this chunk's rows in the flattened token batch
    start_pos: int  # tokens before the chunk that are already in the cache
    block_table: torch.Tensor  # [num_blocks_for_context] int64


@dataclass
class PrefillBatch:
    """Every prefill chunk of a step packed for one kernel call (Triton's varlen launch; on
    CPU ``tide::prefill_attention_varlen``, which packs a prefix the chunks share once).

    Chunk p's query rows are ``first_row + query_start[p] .. first_row + query_start[p+1]``
    of the flattened batch, at positions ``start_pos[p] ..``; its K/V (its own included:
    the KV write runs first) are read through ``block_tables[p]``.
    """

    first_row: int  # the flattened batch's row of the first prefill token
    query_start: torch.Tensor  # [P + 1] int32, cumulative query lengths from 0
    start_pos: torch.Tensor  # [P] int32: tokens of chunk p already in the cache
    block_tables: torch.Tensor  # [P, max_blocks] int64, padded with block 0
    max_query_len: int  # the longest chunk (sizes the launch grid)


@dataclass
class AttentionMetadata:
    """Everything attention needs for one step, built once and shared by all layers."""

    slot_mapping: torch.Tensor  # [num_tokens] int64
    block_size: int
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    prefill_batch: PrefillBatch | None = None  # the same chunks, packed (Triton, native CPU)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor, by a readable name (device checks)."""
        out = {"slot_mapping": self.slot_mapping}
        for i, g in enumerate(self.decode_groups):
            out |= {f"decode_groups[{i}].{name}": getattr(g, name)
                    for name in ("block_tables", "context_lens")}  # fmt: skip
        for i, c in enumerate(self.prefills):
            out[f"prefills[{i}].block_table"] = c.block_table
        if self.prefill_batch is not None:
            b = self.prefill_batch
            out |= {f"prefill_batch.{name}": getattr(b, name)
                    for name in ("query_start", "start_pos", "block_tables")}  # fmt: skip
        return out
