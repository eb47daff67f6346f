"""LLMEngine's serial step (schedule, run, sample, then read the tokens) and what it does
with each token: append it, decide the request's end, make its output."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from tide_fleet.worker.engine.grammar import GrammarMatchers, PendingMasks
from tide_fleet.worker.engine.output_text import TextOutputs
from tide_fleet.worker.engine.outputs import RequestOutput, StepStats
from tide_fleet.worker.engine.request import Request, TokenLogprob
from tide_fleet.worker.engine.scheduler import ScheduledRequest

if TYPE_CHECKING:
    from tide_fleet.worker.engine.block_manager import BlockManager
    from tide_fleet.worker.engine.model_runner import ModelRunner
    from tide_fleet.worker.engine.sampler import Sampler
    from tide_fleet.worker.engine.scheduler import Scheduler

log = logging.getLogger(__name__)


class StepLoop:
    """The serial step and the token bookkeeping both loops share; the engine's fields."""

    requests: dict[str, Request]
    scheduler: Scheduler
    runner: ModelRunner
    sampler: Sampler
    block_manager: BlockManager
    grammar: GrammarMatchers | None
    text: TextOutputs
    counters: dict[str, int]
    _pending: list[RequestOutput]
    _text_ended: bool
    last_step: StepStats | None

    def _step_serial(self) -> list[RequestOutput]:
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
            if (out := self._take_token(request, token, logprob, now)) is not None:
                outputs.append(out)
        return outputs + self._pending_take()

    def _take_token(
        self, request: Request, token: int | Exception, logprob: TokenLogprob | None, now: float
    ) -> RequestOutput | None:
        """A sampled token (or the error its row raised) into its request; a failure ends
        that request alone."""
        try:
            if isinstance(token, Exception):
                raise token
            return self._process_token(request, token, logprob, now)
        except Exception as e:
            log.exception("request %s failed", request.request_id)
            self._finish(request, "error", f"{type(e).__name__}: {e}")
            return None

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
