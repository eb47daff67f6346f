"""Decode-only steps at fixed batch sizes: CUDA graphs on CUDA, the same path eagerly elsewhere.

A decode step of an 8B model is a few milliseconds of GPU work spread over hundreds of
kernel launches; launched one by one from Python, the GPU waits on the host. Captured
once per batch size as a CUDA graph, the whole step is one replay.

A graph replays fixed addresses and shapes, so the step runs on static inputs: the step
builder's device buffers (``worker/engine/step_inputs.py``), a block-table buffer filled
inside the graph from the persistent tables, and a fixed decode split (the Triton kernel
sizes its partitions for ``max_model_len``, not the step's longest context). A batch of n
rows is padded to the next captured size: padding rows write no KV (slot -1) and attend
to nothing (context 0), and their logits are dropped. Prefill-carrying steps stay eager.

``mode="eager"`` runs exactly these padded, static-buffer inputs without capturing
(any device whose decode kernel reads each row's own length): CI checks on CPU that
padded steps give the tokens of unpadded ones.
"""

from __future__ import annotations

import logging
import time

import torch

from tide_fleet.kernels import AttentionMetadata
from tide_fleet.kernels.attention_metadata import DecodeGroup
from tide_fleet.worker.engine.overlap import Feed, apply_feed
from tide_fleet.worker.engine.scheduler import ScheduledRequest
from tide_fleet.worker.engine.step_inputs import StepBuilder
from tide_fleet.worker.models.llama import LlamaModel

log = logging.getLogger(__name__)

MODES = ("auto", "off", "eager")


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, 32, then every 32, up to and including max_num_seqs."""
    sizes = [s for s in (1, 2, 4, 8, 16) if s < max_num_seqs]
    sizes += range(32, max_num_seqs, 32)
    return [*sizes, max_num_seqs]


def graph_mode(requested: str, device: torch.device, one_decode_group: bool) -> str:
    """What a runner does: 'cuda' (capture), 'eager' (padded, uncaptured) or 'off'."""
    if requested not in MODES:
        raise ValueError(f"cuda_graphs must be one of {', '.join(MODES)}, got {requested!r}")
    if requested == "off":
        return "off"
    if not one_decode_group:
        if requested == "eager":
            raise ValueError(
                "cuda_graphs 'eager' needs a decode kernel that reads each row's own length "
                "(attention backend triton or cpp), not the torch reference"
            )
        return "off"
    if requested == "eager":
        return "eager"
    return "cuda" if device.type == "cuda" else "off"


class DecodeGraphs:
    def __init__(
        self,
        model: LlamaModel,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        builder: StepBuilder,
        max_num_seqs: int,
        max_context: int,
        capture: bool,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.builder = builder
        self.sizes = capture_sizes(max_num_seqs)
        self.max_context = max_context
        device, largest = model.device, self.sizes[-1]
        self.logits_rows = torch.arange(largest, device=device)
        self.tables = torch.zeros(
            (largest, builder.tables.max_blocks), dtype=torch.long, device=device
        )
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.capture_seconds = 0.0
        if capture:
            self._capture()

    def fits(self, scheduled: list[ScheduledRequest]) -> bool:
        return len(scheduled) <= self.sizes[-1] and all(s.num_tokens == 1 for s in scheduled)

    def run(
        self, scheduled: list[ScheduledRequest], feed: Feed | None = None
    ) -> tuple[torch.Tensor, list[str]]:
        """(logits of the sampling rows, their request ids) for a decode-only step; ``feed``
        fills the inputs sampled in a step the host has not read (worker/engine/overlap.py)."""
        decodes = sorted(scheduled, key=lambda s: s.start_pos)
        size = next(s for s in self.sizes if s >= len(decodes))
        self.builder.write_padded_decodes(decodes, size)
        apply_feed(self.builder.buffers.device["input_ids"], decodes, feed)
        if size in self.graphs:
            graph, logits = self.graphs[size]
            graph.replay()
        else:
            logits = self._forward(size)
        ids = [s.request_id for s in decodes if s.sample]
        rows = self.builder.sampled_rows  # uploaded with the step's inputs
        return (logits[: len(decodes)] if rows is None else logits[rows]), ids

    def _forward(self, size: int) -> torch.Tensor:
        """The padded step on the static buffers (what a graph captures)."""
        buf = self.builder.buffers.device
        tables = self.tables[:size]
        torch.index_select(self.builder.tables.device, 0, buf["decode_rows"][:size], out=tables)
        group = DecodeGroup(slice(0, size), tables, buf["context"][:size], self.max_context)
        meta = AttentionMetadata(
            slot_mapping=buf["slots"][:size],
            block_size=self.builder.block_size,
            decode_groups=[group],
        )
        return self.model.forward(
            buf["input_ids"][:size], buf["positions"][:size], self.kv_caches, meta,
            self.logits_rows[:size],
        )  # fmt: skip

    def _capture(self) -> None:
        """One graph per size, largest first (the others reuse its memory pool); inputs of
        all padding rows while capturing (nothing written, nothing read)."""
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):
            self.builder.write_padded_decodes([], size)
            self._forward(size)  # warm-up: compiles and allocates outside the capture
            torch.cuda.synchronize(self.model.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._forward(size)
            self.graphs[size] = (graph, logits)
        torch.cuda.synchronize(self.model.device)
        self.capture_seconds = time.perf_counter() - start
        log.info(
            "CUDA graphs: %d decode batch sizes (%s) captured in %.1f s",
            len(self.sizes), ", ".join(map(str, self.sizes)), self.capture_seconds,
        )  # fmt: skip
