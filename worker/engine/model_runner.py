"""Turns a SchedulerOutput into tensors, runs the model, returns logits of sampling rows.

Owns the KV cache: one K and one V tensor per layer, ``[kv_heads, num_blocks,
block_size, head_dim]`` (the layout ``tide_fleet.kernels.attention`` documents), sized from a
memory budget.

Off the CPU, ``__init__`` first runs ``profile_run``: the largest steps the scheduler can
make, with every tensor on the model's device (checked), so each kernel shape is compiled
before serving and, on CUDA, the peak is measured for the KV budget
(``worker/engine/kv_budget.py``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from tide_fleet.kernels import dispatch
from tide_fleet.kernels.attention import (
    decode_reads_rows_in_place,
    native_prefill,
    resolve_backend,
    set_attention_backend,
)
from tide_fleet.kernels.launch import check_devices
from tide_fleet.kernels.linear import SPLIT_ROWS
from tide_fleet.worker.engine.config import EngineConfig
from tide_fleet.worker.engine.decode_graphs import DecodeGraphs, graph_mode
from tide_fleet.worker.engine.host_memory import keep_step_buffers
from tide_fleet.worker.engine.kv_budget import (
    GpuMemory,
    available_memory_bytes,
    gpu_kv_budget,
    model_weight_bytes,
)
from tide_fleet.worker.engine.mixed_graphs import MixedGraphs
from tide_fleet.worker.engine.overlap import Feed, apply_feed
from tide_fleet.worker.engine.peers import StepPeers
from tide_fleet.worker.engine.sampler import profile_sampling
from tide_fleet.worker.engine.scheduler import ScheduledRequest, SchedulerOutput
from tide_fleet.worker.engine.step_inputs import StepBuilder
from tide_fleet.worker.lora.slots import Adapters, LoraManager
from tide_fleet.worker.lora.step import LoraStep
from tide_fleet.worker.models.llama import LlamaModel

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    logits: torch.Tensor  # [num_sampled, vocab] float32
    sampled_ids: list[str]  # request ids, row order of logits


class ModelRunner:
    def __init__(
        self, model: LlamaModel, config: EngineConfig, max_model_len: int,
        loras: Adapters | None = None, peers: StepPeers | None = None,
    ) -> None:  # fmt: skip
        self.model = model
        # Tensor parallel, on rank 0: the other ranks, sent each step (worker/engine/ranks.py).
        self.peers = peers
        # Adapter slots, allocated already: on CUDA the KV budget sees them in use.
        self.loras = loras if isinstance(loras, LoraManager) else None
        self.config = config
        self.block_size = config.block_size
        self.max_model_len = max_model_len
        self.device = model.device
        cfg = model.config
        self.block_bytes = cfg.kv_bytes_per_token(model.dtype.itemsize) * self.block_size
        backend = resolve_backend(
            config.attention_backend, self.device, self.block_size, cfg.head_dim
        )
        if backend != config.attention_backend:
            log.info("attention: %s on %s for head_dim %d, block_size %d", backend,
                     self.device, cfg.head_dim, self.block_size)  # fmt: skip
        set_attention_backend(backend)
        triton = dispatch.impl("decode_attention", self.device) == "triton"
        # Kernels that read each row's own length take every decode row in one launch.
        self.one_decode_group = triton or decode_reads_rows_in_place(self.device, model.dtype)
        # Every prefill chunk of a step in one call: Triton's varlen launch, or the native
        # CPU kernel (which packs a prefix the chunks share once for all of them).
        varlen = dispatch.impl("prefill_attention", self.device) == "triton" or native_prefill(
            model.dtype, cfg.head_dim, self.device
        )
        # Persistent step inputs (worker/engine/step_inputs.py), sized for the largest step.
        largest = max(config.max_num_batched_tokens, config.max_num_seqs)
        self.builder = StepBuilder(
            largest, config.max_num_seqs, -(-max(max_model_len, largest) // self.block_size) + 1,
            self.block_size, self.device, split_decodes=not self.one_decode_group, varlen=varlen,
        )  # fmt: skip
        self.graph_mode = graph_mode(config.cuda_graphs, self.device, self.one_decode_group)
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
        if self.device.type == "cpu":
            keep_step_buffers()
            started = time.perf_counter()
            split = model.warm_up_matmuls(largest, config.max_num_seqs)
            # The largest steps once, so the first real one does not fault in its
            # activations (the first 1,024-token step of the shared bench took 185-202 ms
            # without this, 146-150 ms with it).
            self.profile_run()
            log.info(
                "CPU matmuls ready (%s) and the largest steps run in %.2f s",
                "native AMX GEMM past the GEMV: nothing to build"
                if model.layers[0].qkv.gemm
                else f"oneDNN built for every row bucket, in row pieces past {SPLIT_ROWS} "
                f"rows: {', '.join(split) or 'none'}",
                time.perf_counter() - started,
            )
        self.graphs: DecodeGraphs | None = None
        self.mixed: MixedGraphs | None = None  # steps with prefill, in pieces
        capture = self.graph_mode == "cuda"
        if self.graph_mode != "off":
            self.graphs = DecodeGraphs(model, self.kv_caches, self.builder,
                                       config.max_num_seqs, max_model_len, capture)  # fmt: skip
        if self.graph_mode != "off" and config.mixed_graph_tokens:
            top = min(config.mixed_graph_tokens, config.max_num_batched_tokens)
            self.mixed = MixedGraphs(model, self.kv_caches, self.builder, top, capture)

    def _plan_num_blocks(self, max_model_len: int) -> int:
        cfg = self.config
        profile_cache_bytes = 0
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.device.type != "cpu":
            profile_cache_bytes = self.profile_run()
        if cfg.num_kv_blocks is not None:
            return cfg.num_kv_blocks
        # Never more than every sequence slot at full length needs.
        useful = cfg.max_num_seqs * -(-max_model_len // self.block_size)
        # The LoRA slots' bytes come out of an explicit or CPU budget (CUDA measures them).
        lora_bytes = 0 if self.loras is None else self.loras.nbytes
        if cfg.kv_cache_memory is not None:
            num = (cfg.kv_cache_memory - lora_bytes) // self.block_bytes
        elif self.device.type == "cuda":
            num = self._cuda_num_blocks(profile_cache_bytes)
        elif self.device.type == "cpu":
            share = cfg.kv_cache_fraction / cfg.tensor_parallel_size  # ranks share the host
            budget = int(available_memory_bytes() * share) - lora_bytes
            num = budget // self.block_bytes
        else:
            raise ValueError(
                f"no KV budget rule for device {self.device}: set kv_cache_memory or num_kv_blocks"
            )
        if num < 1:
            raise ValueError(
                f"KV cache budget is below one block ({self.block_bytes} bytes) after "
                f"{lora_bytes} bytes of LoRA slots: raise kv_cache_memory or kv_cache_fraction"
                + (", or lower max_loras or max_lora_rank" if lora_bytes else "")
            )
        num = int(min(num, useful))
        # Every rank holds the same block ids: the count the tightest rank can hold.
        return num if self.model.tp is None else self.model.tp.agree_min(num)

    def _cuda_num_blocks(self, profile_cache_bytes: int) -> int:
        """vLLM's rule: utilization x total - in use - the profiled step's activations."""
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        mem = GpuMemory(
            total=total,
            free=free,
            peak_allocated=torch.cuda.max_memory_allocated(self.device),
            allocated=torch.cuda.memory_allocated(self.device),
        )
        budget = gpu_kv_budget(
            mem,
            self.config.gpu_memory_utilization,
            self.block_bytes,
            self.block_size,
            model_weight_bytes(self.model),
            profile_cache_bytes,
            self.config.max_num_batched_tokens,
        )
        log.info(
            "KV budget: %.2f GiB (total %.2f GiB x %.2f, in use %.2f GiB, activations %.2f GiB)",
            budget.budget_bytes / 2**30, total / 2**30, self.config.gpu_memory_utilization,
            mem.used / 2**30, budget.activation_bytes / 2**30,
        )  # fmt: skip
        return budget.num_blocks

    @torch.inference_mode()
    def profile_run(self) -> int:
        """The largest steps, on the model's device; returns its stand-in KV cache's bytes.

        1. max_num_batched_tokens tokens sampling max_num_seqs rows (decodes and one
           prefill), then the sampler's sorted path over those logits: the peak;
        2. a decode-only step at max_num_seqs rows, and a 16-token chunk after a cached
           prefix: every decode and prefill kernel shape compiled before serving.
        Every step's tensors are checked to be on the model's device.
        """
        cfg, mcfg, bs = self.config, self.model.config, self.block_size
        n, seqs = cfg.max_num_batched_tokens, cfg.max_num_seqs
        rows = min(seqs, n)
        chunk = min(16, n, max(1, self.max_model_len - bs))  # a small tile after one block
        # The step's prefill tokens as prompts no longer than the model's context, with as
        # many decode rows beside them as the step's max_num_seqs rows leave room for.
        # k prompts of at most cap tokens hold the n - rows + k tokens beside rows - k decodes
        # when n - rows <= k (cap - 1): the fewest such k, and never more than rows.
        cap = self.max_model_len
        pieces = min(rows, max(1, -(-(n - rows) // max(cap - 1, 1))))
        decode_rows, total = rows - pieces, min(n - rows + pieces, pieces * cap)
        lengths = [min(cap, total - start) for start in range(0, total, cap)]
        spans = [-(-length // bs) for length in lengths]
        num_blocks = seqs + max(sum(spans), -(-(bs + chunk) // bs))
        shape = (mcfg.num_kv_heads, num_blocks, bs, mcfg.head_dim)
        caches = [
            tuple(torch.zeros(shape, dtype=self.model.dtype, device=self.device) for _ in "kv")
            for _ in range(mcfg.num_layers)
        ]
        prefills, first = [], seqs
        for i, (length, span) in enumerate(zip(lengths, spans, strict=True)):
            blocks = list(range(first, first + span))
            prefills.append(ScheduledRequest(f"p{i}", [0] * length, 0, blocks, True))
            first += span

        def decodes(count: int) -> list[ScheduledRequest]:  # one block each, context bs
            return [ScheduledRequest(f"d{i}", [0], bs - 1, [i], True) for i in range(count)]

        steps = [
            [*decodes(decode_rows), *prefills],
            decodes(seqs),
            [ScheduledRequest("c", [0] * chunk, bs, list(range(seqs, num_blocks)), True)],
        ]
        for i, scheduled in enumerate(steps):
            logits = self._run(scheduled, caches)  # type: ignore[arg-type]
            if i == 0:
                profile_sampling(logits)
            del logits
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        del caches
        return 2 * mcfg.num_layers * torch.Size(shape).numel() * self.model.dtype.itemsize

    def _run(
        self, scheduled: list[ScheduledRequest], caches: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        step = self.builder.build(scheduled)
        check_devices(
            "profile step",
            {"weights": self.model.embed, "input_ids": step.input_ids,
             "positions": step.positions, "logits_rows": step.logits_rows,
             **step.meta.tensors()},
        )  # fmt: skip
        return self.model.forward(
            step.input_ids, step.positions, caches, step.meta, step.logits_rows
        )

    def execute(self, out: SchedulerOutput, feed: Feed | None = None) -> StepResult:
        """Run the step; ``feed``: the step before's sampled ids on the device, for the
        inputs scheduled before the host read them (worker/engine/overlap.py)."""
        if self.peers is None:
            return self._execute(out, feed)
        # Tensor parallel: every rank runs the same step, its collectives in lockstep. A
        # step that fails here leaves the others inside one: the ranks end together.
        self.peers.send_step(out.scheduled)
        try:
            return self._execute(out)
        except Exception as e:
            self.peers.lost(f"a step failed on rank 0: {type(e).__name__}: {e}")
        finally:
            self.peers.step_done()

    def _execute(self, out: SchedulerOutput, feed: Feed | None = None) -> StepResult:
        adapted = any(s.lora_slot >= 0 for s in out.scheduled)
        if self.graphs is not None and not adapted and self.graphs.fits(out.scheduled):
            logits, ids = self.graphs.run(out.scheduled, feed)
            return StepResult(logits=logits, sampled_ids=ids)
        if self.mixed is not None and not adapted and self.mixed.fits(out.scheduled):
            logits, ids = self.mixed.run(out.scheduled, feed)
            return StepResult(logits=logits, sampled_ids=ids)
        step = self.builder.build(out.scheduled)
        apply_feed(step.input_ids, step.order, feed)
        lora = None
        if adapted:  # the rows in the step's order: decodes first (StepInputs.order)
            slots = [s.lora_slot for s in step.order for _ in range(s.num_tokens)]
            lora = LoraStep.build(self.loras, slots, self.device)
        logits = self.model.forward(
            step.input_ids, step.positions, self.kv_caches, step.meta, step.logits_rows, lora
        )
        return StepResult(logits=logits, sampled_ids=step.sampled_ids)
