"""Steps that carry prefill under CUDA graphs, in pieces: each layer's work around its
attention captured at fixed token counts, the attention run eagerly between the pieces.

A decode-only step is one graph (``decode_graphs.py``). A step with prefill chunks cannot
be: its attention's launch follows how many chunks it has and how long each is, which
change every step. Everything else in a layer works row by row (the projections, norms,
RoPE, the KV write, SiLU x up), so at a fixed token count it replays. A step of n tokens
is padded to the next captured count T and runs L + 1 pieces with an attention call
between each two:

    piece 0       the embedding; layer 0 up to attention
    piece i       layer i-1 after attention; layer i up to attention
    piece L       the last layer after attention

then the final norm and the logits of its sampled rows, eagerly (their count varies).
Each piece ends by copying its q|k|v rows into a static buffer the attention reads, and
the attention writes its first n rows into the static buffer the next piece reads; so the
pieces hold no per-layer activations between them, only one residual stream per size.
Padding rows are token 0 at position 0 with KV slot -1 (nothing written); attention never
reads them and every other op is row-wise, so they touch no real row.

Per step this replaces every launch outside attention (on a Llama-3-8B shape 9 per layer
with the fused kernels) with L + 1 graph replays; the price is the padding rows' work and
one q|k|v copy per layer. Steps over the largest size (``mixed_graph_tokens``, 512 by
default, as vLLM's largest capture) run eagerly: there the matmuls dwarf the launches.

``capture=False`` runs exactly these padded pieces on the same buffers uncaptured (the
engine's ``cuda_graphs="eager"``): CI checks on CPU that they give the tokens of
unpadded steps.
"""

from __future__ import annotations

import logging
import time

import torch

from tide_fleet.kernels.elementwise import Elementwise
from tide_fleet.worker.engine.overlap import Feed, apply_feed
from tide_fleet.worker.engine.scheduler import ScheduledRequest
from tide_fleet.worker.engine.step_inputs import StepBuilder
from tide_fleet.worker.models.llama import LlamaModel

log = logging.getLogger(__name__)

SMALLEST = 16  # below this a step is decode rows and a short chunk: the next size up


def token_sizes(largest: int) -> list[int]:
    """Captured token counts: 16, 32, 48, then each power of two from 64 and 1.5x it (64,
    96, 128, 192, 256, 384, 512, ...), those below ``largest``, and ``largest``."""
    sizes = [SMALLEST, 2 * SMALLEST, 3 * SMALLEST]
    power = 64
    while power < largest:
        sizes += [power, power * 3 // 2]
        power *= 2
    return [*(s for s in sizes if s < largest), largest]


class MixedGraphs:
    def __init__(
        self,
        model: LlamaModel,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        builder: StepBuilder,
        largest: int,
        capture: bool,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.builder = builder
        self.sizes = token_sizes(largest)
        cfg, device, top = model.config, model.device, self.sizes[-1]
        width = model.q_size + 2 * model.kv_size
        # Static: written by a piece (q|k|v) or by the attention (its output), read by the
        # other. Zeros, so a padding row never holds a NaN.
        self.qkv = torch.zeros((top, width), dtype=model.dtype, device=device)
        self.attn = torch.zeros((top, cfg.num_heads * cfg.head_dim), dtype=model.dtype,
                                device=device)  # fmt: skip
        self.hidden: dict[int, torch.Tensor] = {}  # the residual stream, per size
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.capture_seconds = 0.0
        self.error: str | None = None  # why capturing failed: every step then runs eagerly
        if capture:
            try:
                self._capture()
            except Exception as e:  # a start-up that serves eagerly beats one that fails
                self.error = f"{type(e).__name__}: {e}"
                self.graphs.clear()
                self.hidden.clear()
                log.warning("CUDA graphs for steps with prefill could not be captured, so "
                            "those steps run eagerly: %s", self.error, exc_info=True)  # fmt: skip

    def fits(self, scheduled: list[ScheduledRequest]) -> bool:
        return self.error is None and sum(s.num_tokens for s in scheduled) <= self.sizes[-1]

    def run(
        self, scheduled: list[ScheduledRequest], feed: Feed | None = None
    ) -> tuple[torch.Tensor, list[str]]:
        """(logits of the sampling rows, their request ids); ``feed`` as ``DecodeGraphs``."""
        n = sum(s.num_tokens for s in scheduled)
        size = next(s for s in self.sizes if s >= n)
        step = self.builder.build(scheduled, pad_to=size)
        apply_feed(step.input_ids, step.order, feed)
        glue = Elementwise(None, self.model.device)
        pieces = self.graphs.get(size)
        for i in range(len(self.kv_caches) + 1):
            if pieces is None:
                self._piece(i, size, glue)
            else:
                pieces[i].replay()
            if i < len(self.kv_caches):
                k_cache, v_cache = self.kv_caches[i]
                qkv, out = self.qkv[:size], self.attn[:n]
                self.model.attend(qkv, n, k_cache, v_cache, step.meta, out)
        logits = self.model.finish(self.hidden[size], None, step.logits_rows, glue)
        return logits, step.sampled_ids

    def _piece(self, i: int, size: int, glue: Elementwise) -> None:
        """Piece i at ``size`` tokens, on the builder's static input buffers."""
        model, buf = self.model, self.builder.buffers.device
        if i == 0:
            self.hidden[size] = model.embed_tokens(buf["input_ids"][:size])
            delta = None
        else:
            delta = model.attention_out(i - 1, self.attn[:size], self.hidden[size], glue)
        if i == len(self.kv_caches):
            assert delta is not None  # piece L follows a layer
            self.hidden[size].add_(delta)
            return
        k_cache, v_cache = self.kv_caches[i]
        qkv = model.attention_in(
            i, self.hidden[size], delta, buf["positions"][:size], k_cache, v_cache,
            buf["slots"][:size], glue,
        )  # fmt: skip
        self.qkv[:size].copy_(qkv)

    def _capture(self) -> None:
        """Every piece of every size, largest first, from one memory pool: a piece's
        temporaries are free once it ends, and pieces replay one at a time on one stream.
        Inputs are all padding rows while capturing (nothing written to the cache)."""
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        glue = Elementwise(None, self.model.device)
        pieces = range(len(self.kv_caches) + 1)
        for size in reversed(self.sizes):
            self.builder.build([], pad_to=size)
            for i in pieces:  # warm-up: compiles and allocates outside the capture
                self._piece(i, size, glue)
            torch.cuda.synchronize(self.model.device)
            graphs = []
            for i in pieces:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._piece(i, size, glue)
                graphs.append(graph)
            self.graphs[size] = graphs
        torch.cuda.synchronize(self.model.device)
        self.capture_seconds = time.perf_counter() - start
        log.info(
            "CUDA graphs: steps with prefill at %d token counts (%s), %d pieces each, "
            "captured in %.1f s",
            len(self.sizes), ", ".join(map(str, self.sizes)), len(pieces), self.capture_seconds,
        )  # fmt: skip
