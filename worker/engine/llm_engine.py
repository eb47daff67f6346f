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
from tide_fleet.worker.engine.grammar import GrammarMatchers, PendingMasks
from tide_fleet.worker.engine.model_runner import ModelRunner
from tide_fleet.worker.engine.output_text import TextOutputs
from tide_fleet.worker.engine.outputs import RequestOutput, StepStats
from tide_fleet.worker.engine.ranks import Ranks, load_rank0
from tide_fleet.worker.engine.request import Request, TokenLogprob
from tide_fleet.worker.engine.sampler import Sampler
from tide_fleet.worker.engine.scheduler import ScheduledRequest, Scheduler
from tide_fleet.worker.models.llama import LlamaModel
from tide_fleet.worker.models.loader import load_model
from tide_fleet.worker.models.resolve import resolve_model_path

log = logging.getLogger(__name__)

__all__ = ["LLMEngine", "RequestOutput", "StepHook", "StepStats"]


StepHook = Callable[[StepStats | None, list[RequestOutput]], None]


class LLMEngine(EngineAdapters):
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
        return bool(self.requests) or bool(self._pending) or self.text.has_deferred

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
        outputs, self._pending = self._pending, []
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return outputs + self._drain()
        self.counters["steps"] += 1
        pending = self._start_masks(sched.scheduled)
        try:
            result = self.runner.execute(sched)
            # The last step's deferred text, while the device runs this one (on CUDA).
            outputs += self._drain()
            if self._text_ended:  # a deferred text failed and ended its request: drop its rows
                live = [i for i, rid in enumerate(result.sampled_ids) if rid in self.requests]
                result.logits, result.sampled_ids = result.logits[live], [
                    result.sampled_ids[i] for i in live]  # fmt: skip
                self._text_ended = False
            masks = None
            if pending is not None:
                assert self.grammar is not None
                masks = self.grammar.wait(pending, result.sampled_ids)
        except Exception as e:
            log.exception("model step failed; failing its %d requests", len(sched.scheduled))
            outputs += self._drain()
            for s in sched.scheduled:
                if s.request_id in self.requests:
                    self._finish(self.requests[s.request_id], "error", f"model step failed: {e}")
            return outputs + self._pending_take()
        stats = StepStats(num_sampled=len(result.sampled_ids))
        for s in sched.scheduled:
            if (request := self.requests.get(s.request_id)) is None:
                continue
            n_prompt = request.num_prompt_tokens
            self.counters["prompt_tokens"] += stats.add(s.num_tokens, s.start_pos, n_prompt)
            request.num_computed_tokens += s.num_tokens
            self.block_manager.cache_full_blocks(request)
        requests = [self.requests[i] for i in result.sampled_ids]
        sampled = self.sampler.sample(result.logits, requests, masks)
        self.last_step = stats
        now = time.time()
        for request, token, logprob in zip(
            requests, sampled.token_ids, sampled.logprobs, strict=True
        ):
            try:
                if isinstance(token, Exception):
                    raise token
                out = self._process_token(request, token, logprob, now)
                if out is not None:
                    outputs.append(out)
            except Exception as e:
                log.exception("request %s failed", request.request_id)
                self._finish(request, "error", f"{type(e).__name__}: {e}")
        return outputs + self._pending_take()

    def _pending_take(self) -> list[RequestOutput]:
        out, self._pending = self._pending, []
        return out

    def _start_masks(self, scheduled: list[ScheduledRequest]) -> PendingMasks | None:
        """Grammar masks for the constrained rows that sample this step, computed while
        the model runs."""
        if self.grammar is None or not self.grammar.num_matchers:
            return None
        return self.grammar.start_masks([s.request_id for s in scheduled if s.sample])

    def _process_token(
        self, request: Request, token: int, logprob: TokenLogprob | None, now: float
    ) -> RequestOutput | None:
        """Append the token and decide whether the request ends; its output, or None when
        its text comes with the next step (``self.text``)."""
        request.append_token(token, logprob)
        self.counters["generation_tokens"] += 1
        if request.timings.first_token is None:
            request.timings.first_token = now
        params = request.params
        deferred = self.text.deferrable(request)
        reason, grammar_done = None, False
        if params.structured is not None:
            assert self.grammar is not None
            grammar_done = self.grammar.accept(request.request_id, token)
        is_stop_token = token in request.stop_token_ids
        # Text is added at once only where it decides the end (a stop token adds none).
        text_stop = not is_stop_token and not deferred and self.text.stopped_by_text(request, token)
        if is_stop_token or text_stop or grammar_done:
            reason = "stop"
        if reason is None and request.num_output_tokens >= params.max_tokens:
            reason = "length"
        if deferred:
            if reason is not None:
                self._release(request, reason)
            self.text.defer_token(request, token, logprob, not is_stop_token, reason is not None)
            return None
        if reason is None:
            return self.text.delta(request, token, logprob)
        out = self._finish(request, reason, queue=False)
        out.new_token_ids = [token]
        out.new_logprobs = [logprob] if logprob is not None else []
        return out

    def _drain(self) -> list[RequestOutput]:
        return self.text.drain(self._text_failed)

    def _text_failed(self, request: Request, e: Exception) -> RequestOutput:
        log.error("request %s failed", request.request_id, exc_info=e)
        error = f"{type(e).__name__}: {e}"
        if request.request_id in self.requests:
            self._text_ended = True
            return self._finish(request, "error", error, queue=False)
        request.finish_reason, request.error = "error", error  # it had ended with that token
        return self.text.final(request)

    def _release(self, request: Request, reason: str, error: str | None = None) -> None:
        """End the request in the scheduler, sampler and grammar; its output comes apart."""
        self.scheduler.finish(request)
        self.sampler.forget(request.request_id)
        if self.grammar is not None:
            self.grammar.remove(request.request_id)
        self.requests.pop(request.request_id, None)
        request.finish_reason, request.error = reason, error
        request.timings.finished = time.time()

    def _finish(
        self, request: Request, reason: str, error: str | None = None, queue: bool = True
    ) -> RequestOutput:
        self._release(request, reason, error)
        out = self.text.final(request)
        if queue:
            self._pending.append(out)
        return out

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
