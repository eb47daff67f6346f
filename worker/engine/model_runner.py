"""Turns a SchedulerOutput into tensors, runs the model, returns logits of sampling rows.

Owns the KV cache: one K and one V tensor per layer, ``[kv_heads, num_blocks,
block_size, head_dim]`` (the layout ``kernels.attention`` documents), sized from a
memory budget.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from kernels import AttentionMetadata
from kernels.attention import decode_reads_rows_in_place, set_attention_backend
from kernels.attention_metadata import DecodeGroup, PrefillChunk
from worker.engine.config import EngineConfig
from worker.engine.scheduler import ScheduledRequest, SchedulerOutput
from worker.models.llama import LlamaModel

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    logits: torch.Tensor  # [num_sampled, vocab] float32
    sampled_ids: list[str]  # request ids, row order of logits


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux); a conservative 4 GiB elsewhere."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


class ModelRunner:
    def __init__(self, model: LlamaModel, config: EngineConfig, max_model_len: int) -> None:
        self.model = model
        self.config = config
        self.block_size = config.block_size
        self.device = model.device
        cfg = model.config
        self.block_bytes = cfg.kv_bytes_per_token(model.dtype.itemsize) * self.block_size
        set_attention_backend(config.attention_backend)
        self.one_decode_group = decode_reads_rows_in_place(self.device, model.dtype)
        triton = config.attention_backend == "triton" or (
            config.attention_backend == "auto" and self.device.type == "cuda"
        )
        if triton and (self.block_size < 16 or model.config.head_dim < 16):
            raise ValueError(
                f"the Triton attention kernels need block_size >= 16 and head_dim >= 16, "
                f"got block_size {self.block_size}, head_dim {model.config.head_dim}"
            )
        self.num_blocks = self._plan_num_blocks(max_model_len)
        shape = (cfg.num_kv_heads, self.num_blocks, self.block_size, cfg.head_dim)
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=model.dtype, device=self.device),
                torch.zeros(shape, dtype=model.dtype, device=self.device),
            )
            for _ in range(cfg.num_layers)
        ]
        log.info(
            "KV cache: %d blocks of %d tokens (%.1f MiB)",
            self.num_blocks,
            self.block_size,
            self.num_blocks * self.block_bytes / 2**20,
        )

    def _plan_num_blocks(self, max_model_len: int) -> int:
        cfg = self.config
        if cfg.num_kv_blocks is not None:
            return cfg.num_kv_blocks
        # Never more than every sequence slot at full length needs.
        useful = cfg.max_num_seqs * -(-max_model_len // self.block_size)
        if cfg.kv_cache_memory is not None:
            budget = cfg.kv_cache_memory
        elif self.device.type == "cuda":
            budget = self._profile_cuda_budget()
        else:
            budget = int(available_memory_bytes() * cfg.kv_cache_fraction)
        num = min(budget // self.block_bytes, useful)
        if num < 1:
            raise ValueError(
                f"KV cache budget of {budget} bytes is below one block ({self.block_bytes} bytes)"
            )
        return int(num)

    def _profile_cuda_budget(self) -> int:
        """Like vLLM's gpu_memory_utilization: total x fraction minus the peak of a full step."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        n = self.config.max_num_batched_tokens
        cfg = self.model.config
        shape = (cfg.num_kv_heads, -(-n // self.block_size), self.block_size, cfg.head_dim)
        caches = [
            (torch.zeros(shape, dtype=self.model.dtype, device=self.device),) * 2
            for _ in range(cfg.num_layers)
        ]
        ids = torch.zeros(n, dtype=torch.long, device=self.device)
        pos = torch.arange(n, device=self.device)
        meta = AttentionMetadata(slot_mapping=pos, block_size=self.block_size)
        meta.prefills.append(PrefillChunk(slice(0, n), 0, torch.arange(shape[1])))
        self.model.forward(ids, pos, caches, meta, pos[-1:])
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        del caches
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(self.device).total_memory
        return int(total * self.config.kv_cache_fraction) - peak

    def execute(self, out: SchedulerOutput) -> StepResult:
        step = build_step_inputs(
            out.scheduled, self.block_size, self.device, not self.one_decode_group
        )
        logits = self.model.forward(
            step.input_ids, step.positions, self.kv_caches, step.meta, step.logits_rows
        )
        return StepResult(logits=logits, sampled_ids=step.sampled_ids)


@dataclass
class StepInputs:
    order: list[ScheduledRequest]  # row order of the flattened batch
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_rows: torch.Tensor
    sampled_ids: list[str]


def build_step_inputs(
    scheduled: list[ScheduledRequest],
    block_size: int,
    device: torch.device,
    split_decodes: bool = True,
) -> StepInputs:
    """Flatten a step: decode rows first (sorted by context, grouped), then prefill chunks.

    split_decodes=False keeps every decode row in one group: for attention that reads
    each row's own length (the native CPU kernel), padding costs nothing, and one group
    is one kernel call.
    """
    decodes = sorted((s for s in scheduled if s.num_tokens == 1), key=lambda s: s.start_pos)
    prefills = [s for s in scheduled if s.num_tokens > 1]
    order = decodes + prefills
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    bs = block_size
    for s in order:
        input_ids.extend(s.token_ids)
        table = s.block_table
        for pos in range(s.start_pos, s.context_len):
            positions.append(pos)
            slots.append(table[pos // bs] * bs + pos % bs)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device), block_size=bs
    )
    meta.decode_groups = _decode_groups(decodes, bs, device, split_decodes)
    # A one-token row is not always a decode: a prefill chunk cut to one token by the
    # step budget has no next token to sample yet.
    logits_rows = [i for i, s in enumerate(decodes) if s.sample]
    sampled_ids = [s.request_id for s in decodes if s.sample]
    row = len(decodes)
    for s in prefills:
        num_blocks = -(-s.context_len // bs)
        table_t = torch.tensor(s.block_table[:num_blocks], dtype=torch.long, device=device)
        meta.prefills.append(PrefillChunk(slice(row, row + s.num_tokens), s.start_pos, table_t))
        row += s.num_tokens
        if s.sample:
            logits_rows.append(row - 1)
            sampled_ids.append(s.request_id)
    return StepInputs(
        order=order,
        input_ids=torch.tensor(input_ids, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        meta=meta,
        logits_rows=torch.tensor(logits_rows, dtype=torch.long, device=device),
        sampled_ids=sampled_ids,
    )


def _decode_groups(
    decodes: list[ScheduledRequest], block_size: int, device: torch.device, split: bool = True
) -> list[DecodeGroup]:
    """Split decode rows (sorted by length) where padding to the group's longest wastes much."""
    groups, start = [], 0
    lengths = [-(-s.context_len // block_size) for s in decodes]
    for i in range(1, len(decodes) + 1):
        long_gap = i < len(decodes) and lengths[i] > 2 * lengths[start] and lengths[i] > 8
        if i < len(decodes) and not (split and long_gap):
            continue
        rows, width = decodes[start:i], lengths[i - 1]
        tables = [s.block_table[:width] + [0] * (width - len(s.block_table)) for s in rows]
        context = torch.tensor([s.context_len for s in rows], dtype=torch.int32, device=device)
        mask = torch.arange(width * block_size, device=device).unsqueeze(0) < context.unsqueeze(1)
        groups.append(
            DecodeGroup(
                rows=slice(start, i),
                block_tables=torch.tensor(tables, dtype=torch.long, device=device),
                mask=mask[None, :, None, :],
                context_lens=context,
                max_context=rows[-1].context_len,
            )
        )
        start = i
    return groups
