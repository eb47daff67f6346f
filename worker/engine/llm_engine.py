"""The engine loop: schedule, run the model, sample, detokenize, report.

Contract (DESIGN.md): ``add_request``, ``step() -> outputs``, ``abort``, ``can_admit``,
``stats``. The engine knows nothing of queues or Redis.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from tide_fleet.infra.contract.sampling_params import Priority, SamplingParams
from tide_fleet.infra.contract.tokenizer import Tokenizer
from tide_fleet.worker.engine.adapters import EngineAdapters, lora_slots
from tide_fleet.worker.engine.admission import check_prompt_ids, check_request, stop_token_ids
from tide_fleet.worker.engine.block_manager import BlockManager
from tide_fleet.worker.engine.config import EngineConfig, model_len
from tide_fleet.worker.engine.grammar import GrammarMatchers
from tide_fleet.worker.engine.model_runner import ModelRunner
from tide_fleet.worker.engine.output_text import TextOutputs
from tide_fleet.worker.engine.outputs import RequestOutput, StepStats
from tide_fleet.worker.engine.overlap_loop import OverlapLoop
from tide_fleet.worker.engine.ranks import Ranks, load_rank0
from tide_fleet.worker.engine.request import Request
from tide_fleet.worker.engine.sampler import Sampler
from tide_fleet.worker.engine.scheduler import Scheduler
from tide_fleet.worker.models.llama import LlamaModel
from tide_fleet.worker.models.loader import load_model
from tide_fleet.worker.models.resolve import resolve_model_path

log = logging.getLogger(__name__)

__all__ = ["LLMEngine", "RequestOutput", "StepHook", "StepStats"]


StepHook = Callable[[StepStats | None, list[RequestOutput]], None]


class LLMEngine(EngineAdapters, OverlapLoop):
    def __init__(
        self, model: LlamaModel, tokenizer: Tokenizer | None, config: EngineConfig | None = None,
        ranks: Ranks | None = None,
    ) -> None:  # fmt: skip
        """``ranks``: with a tensor-parallel ``model`` (rank 0's shard), the other ranks."""
        self.model, self.tokenizer, cuda = model, tokenizer, model.device.type == "cuda"
        self.config = config or EngineConfig()
        self.max_model_len = model_len(self.config, model.config)
        cfg = self.config
        self.ranks = ranks
        self.loras = lora_slots(model, cfg)  # first: their bytes come out of the KV budget
        self.runner = ModelRunner(model, cfg, self.max_model_len, self.loras, ranks)
        if ranks is not None:
            ranks.wait("ready")
            ranks.watch()
        self.block_manager = BlockManager(
            self.runner.num_blocks, cfg.block_size, cfg.enable_prefix_caching
        )
        self.scheduler = Scheduler(cfg, self.block_manager, self.loras)
        self.sampler = Sampler(model.device)
        if tokenizer is not None and tokenizer.eos_token_ids:
            self.eos_token_ids = set(tokenizer.eos_token_ids)
        else:
            self.eos_token_ids = set(model.config.eos_token_ids)
        self.grammar: GrammarMatchers | None = None  # structured outputs; needs a tokenizer
        if tokenizer is not None:
            eos = sorted(self.eos_token_ids)
            self.grammar = GrammarMatchers(tokenizer.to_json(), model.config.vocab_size, eos)
            self.grammar.overlap = cuda  # see worker/engine/grammar.py
        self.requests: dict[str, Request] = {}
        overlap = self.config.overlap_detokenize  # text a step late: on CUDA by default
        self.text = TextOutputs(tokenizer, overlap == "on" or (overlap == "auto" and cuda))
        self._pending: list[RequestOutput] = []
        self._text_ended = False  # a failed deferred text ended a request this step
        self._arrivals = itertools.count()
        self.counters = {"prompt_tokens": 0, "generation_tokens": 0, "steps": 0}
        self.model_name = "model"  # from_pretrained sets the name it was given
        self.last_step: StepStats | None = None  # None when the last step ran no model
        # The overlapped loop (worker/engine/overlap.py): on CUDA by default, one rank only.
        ov = cfg.overlap_schedule
        self.overlap = ranks is None and (ov == "on" or (ov == "auto" and cuda))
        self._inflight = None
        self.on_step: StepHook | None = None  # called after every step (worker metrics)

    @classmethod
    def from_pretrained(
        cls, model: str, dtype: str | None = None, device: str = "auto", **config: Any
    ) -> LLMEngine:
        folder, cfg = resolve_model_path(model), EngineConfig(**config)
        if cfg.tensor_parallel_size == 1:
            engine = cls(load_model(folder, dtype, device), Tokenizer(folder), cfg)
        else:
            model_, ranks = load_rank0(folder, dtype, device, cfg)
            try:
                engine = cls(model_, Tokenizer(folder), cfg, ranks)
            except BaseException:
                ranks.close()
                raise
        engine.model_name = model
        return engine

    def close(self) -> None:
        """Stop a tensor-parallel engine's other ranks (nothing to do for one process)."""
        if self.ranks is not None:
            self.ranks.close()

    # -- admission ---------------------------------------------------------------

    @property
    def kv_capacity_tokens(self) -> int:
        return self.block_manager.num_blocks * self.config.block_size

    def validate(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """Raise ValueError naming the numbers when a request can never run here."""
        check_request(
            num_prompt_tokens, params, max_model_len=self.max_model_len,
            kv_capacity_tokens=self.kv_capacity_tokens, vocab_size=self.model.config.vocab_size,
            has_grammar=self.grammar is not None,
        )  # fmt: skip

    def can_admit(
        self,
        num_prompt_tokens: int,
        max_tokens: int,
        prompt_token_ids: list[int] | None = None,
        group: str | None = None,
        lora: str | None = None,
    ) -> bool:
        """Would a request of this size be scheduled now (blocks after prefix hits, a slot,
        or a slot its group's fair share would take back from a group over its share; a
        device slot for its LoRA adapter)?"""
        return self.scheduler.can_admit(
            num_prompt_tokens, max_tokens, prompt_token_ids, group, lora
        )

    def room(self) -> int:
        """How many sequences a new job could start now (free slots, or its fair share)."""
        return self.scheduler.room()

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: Priority = Priority.INTERACTIVE,
        group: str | None = None,
        output_token_ids: list[int] | None = None,
        lora: str | None = None,
    ) -> None:
        """``group``: the job this request is part of (a job's choices, the prompts of one
        request); the scheduler shares steps fairly between groups. None: its own group.
        ``output_token_ids``: its first generated tokens, already known (a resumed job,
        ``tide_fleet.worker.resume``): prefilled after the prompt but counted as output, so
        max_tokens, min_tokens, penalties, seeded draws, stop strings and the grammar go on
        from them; the outputs carry only the tokens generated here (``token_ids`` and
        ``text`` at the end cover all of them). A request they already end finishes with the
        next step. ``lora``: the registered adapter it runs under (None: the base)."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in the engine")
        if self.text.is_deferred(request_id):  # ended, its last text not made yet
            self._pending.extend(self._drain())
        self.validate(len(prompt_token_ids), params)
        if lora is not None and not self.loras.known(lora):
            raise ValueError(f"lora: adapter {lora!r} is not registered in this engine")
        kept = list(output_token_ids or [])
        check_prompt_ids([*prompt_token_ids, *kept], self.model.config.vocab_size)
        grammar_done = False
        if params.structured is not None:
            assert self.grammar is not None
            self.grammar.add(request_id, params.structured)  # ValueError for a bad grammar
            try:
                grammar_done = self.grammar.advance(request_id, kept)
            except ValueError:
                self.grammar.remove(request_id)
                raise
        request = Request(
            request_id,
            prompt_token_ids,
            params,
            priority,
            next(self._arrivals),
            group,
            lora,
            0 if self.loras is None else self.loras.salt(lora),
        )
        request.stop_token_ids = stop_token_ids(params, self.eos_token_ids)
        for token in kept:
            request.append_token(token)
        self.requests[request_id] = request
        text_stop = self.text.add(request)
        self.scheduler.add(request)
        if kept and (reason := self._resumed_end(request, text_stop or grammar_done)):
            self._finish(request, reason).delta_text = ""  # the last kept token's delta had it

    def _resumed_end(self, request: Request, stopped: bool) -> str | None:
        """How a request's known output tokens already end it (None: they do not)."""
        if stopped or request.output_token_ids[-1] in request.stop_token_ids:
            return "stop"
        return "length" if request.num_output_tokens >= request.params.max_tokens else None

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its blocks; its final output comes with the next step."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        self._pending.extend(self._drain())  # its earlier outputs before its last
        self._finish(request, "abort")
        return True

    def has_unfinished(self) -> bool:
        return (bool(self.requests) or bool(self._pending) or self.text.has_deferred
                or self._inflight is not None)  # fmt: skip

    # -- the loop ----------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        start = time.perf_counter()
        self.last_step = None
        outputs = self._step()
        if self.last_step is not None:
            self.last_step.duration_s = time.perf_counter() - start
        if self.on_step is not None:
            self.on_step(self.last_step, outputs)
        return outputs

    def _step(self) -> list[RequestOutput]:
        if self._overlaps_now():
            return self._step_overlapped()
        settled = self._settle()  # a step still in flight is read before a serial one
        return settled + self._step_serial()

    # -- conveniences ------------------------------------------------------------

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams],
        priorities: list[Priority] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion concurrently; finished outputs in input order."""
        plist = params if isinstance(params, list) else [params] * len(prompts)
        ids = [f"gen-{next(self._arrivals)}" for _ in prompts]
        for i, (rid, prompt) in enumerate(zip(ids, prompts, strict=True)):
            prio = priorities[i] if priorities else Priority.INTERACTIVE
            self.add_request(rid, prompt, plist[i], prio)
        done: dict[str, RequestOutput] = {}
        while len(done) < len(ids):
            for out in self.step():
                if out.finished:
                    done[out.request_id] = out
        return [done[i] for i in ids]

    def stats(self) -> dict[str, Any]:
        sched = self.scheduler
        return {"num_running": len(sched.running), "num_waiting": len(sched.waiting),
                **self.block_manager.stats(), "num_preemptions": sched.num_preemptions,
                **self.counters,
                **self.adapter_stats()}  # fmt: skip
