"""A step's input tensors, built in buffers that live as long as the runner.

Every step the runner needs the flattened token ids, positions, KV slots, each decode row's
context length and block table, and the rows whose logits are sampled. Building those as
fresh ``torch.tensor(list, device=cuda)`` calls costs a pageable, blocking copy each, and
rebuilding every request's block table as nested lists costs Python time that grows with
context. Here instead:

- ``StepBuffers``: one host array per input, allocated once at the largest step (pinned
  on CUDA, so copies are asynchronous), written through numpy views, then copied to the
  device buffers in one non-blocking copy each. On CPU the device buffers are the host
  buffers: nothing is copied. A step's copies may still be queued behind the previous
  step's forward pass when the host moves on (a prefill chunk samples nothing, so
  nothing waits for the device), so the builder records an event after its copies and
  the next step waits for it before it writes the host buffers again.
- ``BlockTables`` (``worker/engine/block_tables.py``): one row per running request, kept
  across steps; a step writes only the blocks a request gained since its last step.

``StepBuilder.build`` orders the rows as the kernels expect (``kernels/attention.py``):
decode rows first (sorted by context, and for the torch reference split into groups of
similar length), then prefill chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tide_fleet.kernels import AttentionMetadata
from tide_fleet.kernels.attention_metadata import DecodeGroup, PrefillBatch, PrefillChunk
from tide_fleet.worker.engine.block_tables import BlockTables, host_and_device
from tide_fleet.worker.engine.scheduler import ScheduledRequest


class StepBuffers:
    """Host and device buffers for every per-step input, sized for the largest step."""

    def __init__(self, max_tokens: int, max_rows: int, device: torch.device, mirror: bool):
        self.copies_done: Any = None  # a CUDA event after the last step's copies
        self._cuda = device.type == "cuda"
        long, int32 = torch.long, torch.int32
        self.host: dict[str, torch.Tensor] = {}
        self.device: dict[str, torch.Tensor] = {}
        self.view: dict[str, np.ndarray] = {}
        for name, size, dtype in (
            ("input_ids", max_tokens, long), ("positions", max_tokens, long),
            ("slots", max_tokens, long), ("logits_rows", max_rows, long),
            ("context", max_rows, int32), ("decode_rows", max_rows, long),
            ("query_start", max_rows + 1, int32), ("start_pos", max_rows, int32),
            ("prefill_rows", max_rows, long),
        ):  # fmt: skip
            self.host[name], self.device[name] = host_and_device((size,), dtype, device, mirror)
            self.view[name] = self.host[name].numpy()

    def wait_for_copies(self) -> None:
        """Before the host buffers are written: the last step's copies out of them ran."""
        if self.copies_done is not None:
            self.copies_done.synchronize()
            self.copies_done = None

    def copies_queued(self) -> None:
        """After a step's copies: mark them, for ``wait_for_copies``."""
        if self._cuda:
            self.copies_done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self.copies_done.record()

    def upload(self, name: str, n: int) -> torch.Tensor:
        """The first n entries on the device (an asynchronous copy where they differ)."""
        dev = self.device[name]
        if dev is not self.host[name] and n:
            dev[:n].copy_(self.host[name][:n], non_blocking=True)
        return dev[:n]


@dataclass
class StepInputs:
    order: list[ScheduledRequest]  # row order of the flattened batch
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_rows: torch.Tensor
    sampled_ids: list[str]


class StepBuilder:
    """Turns a step's scheduled requests into StepInputs, reusing its buffers.

    split_decodes: group decode rows by length (the torch reference pads each group to its
    longest row); kernels that read each row's own length take them all in one group.
    varlen: also pack the prefill chunks for one kernel call (``PrefillBatch``: Triton, and
    the native CPU kernel).
    """

    mirror_on_cpu = False  # tests: separate "device" buffers on CPU, so copies are exercised

    def __init__(
        self,
        max_tokens: int,
        max_rows: int,
        max_blocks: int,
        block_size: int,
        device: torch.device,
        split_decodes: bool = True,
        varlen: bool = False,
    ) -> None:
        mirror = self.mirror_on_cpu
        self.buffers = StepBuffers(max_tokens, max_rows, device, mirror)
        self.tables = BlockTables(max_rows, max_blocks, device, mirror)
        self.block_size = block_size
        self.split_decodes = split_decodes
        self.varlen = varlen
        self.sampled_rows: torch.Tensor | None = None  # write_padded_decodes: rows to sample

    def build(self, scheduled: list[ScheduledRequest], pad_to: int = 0) -> StepInputs:
        """``pad_to``: also write padding tokens up to that many rows into the token, position
        and slot buffers (token 0 at position 0, slot -1: no KV write), for a step a graph
        runs at a fixed token count (``mixed_graphs``); the inputs stay the real rows."""
        self.buffers.wait_for_copies()
        decodes = sorted((s for s in scheduled if s.num_tokens == 1), key=lambda s: s.start_pos)
        prefills = [s for s in scheduled if s.num_tokens > 1]
        order = decodes + prefills
        buf, view, bs = self.buffers, self.buffers.view, self.block_size
        step_ids = {s.request_id for s in order}
        rows = np.array([self.tables.row(s, step_ids) for s in order], dtype=np.int64)
        nd, total = len(decodes), sum(s.num_tokens for s in order)
        self._write_decodes(decodes, rows[:nd])
        at = nd
        for s, row in zip(prefills, rows[nd:], strict=True):
            p = np.arange(s.start_pos, s.context_len, dtype=np.int64)
            view["positions"][at : at + len(p)] = p
            view["slots"][at : at + len(p)] = self.tables.view[row, p // bs] * bs + p % bs
            at += len(p)
        view["input_ids"][:total] = [t for s in order for t in s.token_ids]
        padded = max(pad_to, total)
        for name, pad in (("input_ids", 0), ("positions", 0), ("slots", -1)):
            view[name][total:padded] = pad
        # A one-token row is not always a decode: a prefill chunk cut to one token by the
        # step budget has no next token to sample yet.
        logits_rows, sampled_ids, end = [], [], 0
        for s in order:
            end += s.num_tokens
            if s.sample:
                logits_rows.append(end - 1)
                sampled_ids.append(s.request_id)
        view["logits_rows"][: len(logits_rows)] = logits_rows
        self.tables.upload()
        meta = AttentionMetadata(slot_mapping=buf.upload("slots", padded)[:total], block_size=bs)
        meta.decode_groups = self._decode_groups(decodes)
        meta.prefills = self._prefill_chunks(prefills, rows[nd:], nd)
        if self.varlen and prefills:
            meta.prefill_batch = self._prefill_batch(prefills, rows[nd:], nd)
        step = StepInputs(
            order=order,
            input_ids=buf.upload("input_ids", padded)[:total],
            positions=buf.upload("positions", padded)[:total],
            meta=meta,
            logits_rows=buf.upload("logits_rows", len(logits_rows)),
            sampled_ids=sampled_ids,
        )
        buf.copies_queued()
        return step

    def _write_decodes(self, decodes: list[ScheduledRequest], rows: np.ndarray) -> None:
        """Decode rows: one token each at position start_pos, read through table row rows[i]."""
        view, bs, nd = self.buffers.view, self.block_size, len(decodes)
        pos = np.array([s.start_pos for s in decodes], dtype=np.int64)
        view["positions"][:nd] = pos
        view["slots"][:nd] = self.tables.view[rows, pos // bs] * bs + pos % bs
        view["context"][:nd] = pos + 1
        view["decode_rows"][:nd] = rows

    def write_padded_decodes(self, decodes: list[ScheduledRequest], size: int) -> None:
        """A decode-only step padded to `size` rows, uploaded (``decode_graphs``): padding
        rows have token 0 at position 0, KV slot -1 (no write) and context 0 (reads
        nothing)."""
        self.buffers.wait_for_copies()
        view, nd = self.buffers.view, len(decodes)
        ids = {s.request_id for s in decodes}
        rows = np.array([self.tables.row(s, ids) for s in decodes], dtype=np.int64)
        self.tables.upload()
        self._write_decodes(decodes, rows)
        view["input_ids"][:nd] = [s.token_ids[0] for s in decodes]
        for name, pad in (("input_ids", 0), ("positions", 0), ("slots", -1), ("context", 0),
                          ("decode_rows", 0)):  # fmt: skip
            view[name][nd:size] = pad
            self.buffers.upload(name, size)
        sampled = [i for i, s in enumerate(decodes) if s.sample]
        if len(sampled) < nd:  # some rows are prefill chunks cut to one token: no logits
            view["logits_rows"][: len(sampled)] = sampled
            self.sampled_rows = self.buffers.upload("logits_rows", len(sampled))
        else:
            self.sampled_rows = None
        self.buffers.copies_queued()

    def _decode_groups(self, decodes: list[ScheduledRequest]) -> list[DecodeGroup]:
        """Split decode rows (sorted by length) where padding to the group's longest wastes
        much; one group when split_decodes is off."""
        if not decodes:
            return []
        bs, nd = self.block_size, len(decodes)
        context = self.buffers.upload("context", nd)
        table_rows = self.buffers.upload("decode_rows", nd)
        lengths = [-(-s.context_len // bs) for s in decodes]
        groups, start = [], 0
        for i in range(1, nd + 1):
            long_gap = i < nd and lengths[i] > 2 * lengths[start] and lengths[i] > 8
            if i < nd and not (self.split_decodes and long_gap):
                continue
            width = lengths[i - 1]
            tables = self.tables.device[:, :width].index_select(0, table_rows[start:i])
            groups.append(
                DecodeGroup(slice(start, i), tables, context[start:i], decodes[i - 1].context_len)
            )
            start = i
        return groups

    def _prefill_chunks(
        self, prefills: list[ScheduledRequest], rows: np.ndarray, first: int
    ) -> list[PrefillChunk]:
        chunks, at = [], first
        for s, row in zip(prefills, rows.tolist(), strict=True):
            table = self.tables.device[row, : -(-s.context_len // self.block_size)]
            chunks.append(PrefillChunk(slice(at, at + s.num_tokens), s.start_pos, table))
            at += s.num_tokens
        return chunks

    def _prefill_batch(
        self, prefills: list[ScheduledRequest], rows: np.ndarray, first: int
    ) -> PrefillBatch:
        view, n = self.buffers.view, len(prefills)
        view["query_start"][0] = 0
        view["query_start"][1 : n + 1] = np.cumsum([s.num_tokens for s in prefills])
        view["start_pos"][:n] = [s.start_pos for s in prefills]
        view["prefill_rows"][:n] = rows
        width = max(-(-s.context_len // self.block_size) for s in prefills)
        table_rows = self.buffers.upload("prefill_rows", n)
        return PrefillBatch(
            first_row=first,
            query_start=self.buffers.upload("query_start", n + 1),
            start_pos=self.buffers.upload("start_pos", n),
            block_tables=self.tables.device[:, :width].index_select(0, table_rows),
            max_query_len=max(s.num_tokens for s in prefills),
        )


def build_step_inputs(
    scheduled: list[ScheduledRequest],
    block_size: int,
    device: torch.device,
    split_decodes: bool = True,
    varlen: bool = False,
) -> StepInputs:
    """One step's inputs in buffers made for it (tests and one-off steps)."""
    total = max(1, sum(s.num_tokens for s in scheduled))
    rows = max(1, len(scheduled))
    blocks = max([1] + [len(s.block_table) for s in scheduled])
    builder = StepBuilder(total, rows, blocks, block_size, device, split_decodes, varlen)
    return builder.build(scheduled)
