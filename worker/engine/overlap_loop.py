"""LLMEngine's overlapped step (worker/engine/overlap.py): launch step n+1, then read step
n's tokens while the device runs it."""

from __future__ import annotations

import logging
import time

from tide_fleet.worker.engine.outputs import RequestOutput, StepStats
from tide_fleet.worker.engine.overlap import InFlight, overlappable
from tide_fleet.worker.engine.sampler import NO_TOKEN, NoTokenToSample
from tide_fleet.worker.engine.scheduled import SchedulerOutput
from tide_fleet.worker.engine.step_loop import StepLoop

log = logging.getLogger(__name__)


class OverlapLoop(StepLoop):
    """The overlapped step and the read of the step in flight."""

    _inflight: InFlight | None
    overlap: bool  # the config and the engine allow it (worker/engine/llm_engine.py)

    def _overlaps_now(self) -> bool:
        return self.overlap and all(overlappable(r) for r in self.requests.values())

    def _step_overlapped(self) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        sched: SchedulerOutput = self.scheduler.schedule()
        if sched.is_empty:
            return outputs + self._settle() + self._drain()
        self.counters["steps"] += 1
        previous, self._inflight = self._inflight, None
        try:
            result = self.runner.execute(sched, None if previous is None else previous.feed())
            requests = [self.requests[i] for i in result.sampled_ids]
            tokens, failed = self.sampler.sample_on_device(result.logits, requests)
        except Exception as e:
            log.exception("model step failed; failing its %d requests", len(sched.scheduled))
            if previous is not None:
                outputs += self._read(previous)
            outputs += self._drain()
            for s in sched.scheduled:
                if s.request_id in self.requests:
                    self._finish(self.requests[s.request_id], "error", f"model step failed: {e}")
            return outputs + self._pending_take()
        stats = StepStats(num_sampled=len(requests))
        for s in sched.scheduled:
            request = self.requests[s.request_id]
            n_prompt = request.num_prompt_tokens
            self.counters["prompt_tokens"] += stats.add(s.num_tokens, s.start_pos, n_prompt)
            request.num_computed_tokens += s.num_tokens
        for request in requests:
            request.pending += 1
        self._inflight = InFlight(tokens, failed, requests, stats)
        outputs += self._drain()  # the text deferred from the step before
        if previous is not None:
            outputs += self._read(previous)  # while the device runs this step
        for s in sched.scheduled:  # blocks whose tokens the host now knows
            if (live := self.requests.get(s.request_id)) is not None:
                self.block_manager.cache_full_blocks(live)
        self.last_step = stats
        return outputs + self._pending_take()

    def _settle(self) -> list[RequestOutput]:
        """Read the step in flight, if any (before a serial step, or with nothing to run)."""
        inflight, self._inflight = self._inflight, None
        return [] if inflight is None else self._read(inflight)

    def _read(self, step: InFlight) -> list[RequestOutput]:
        """The step's tokens, one host read: each live request's token appended and its end
        decided, as the serial loop does; rows of requests that ended since are dropped."""
        outputs = []
        now = time.time()
        for request, token, failed in step.read():
            request.pending -= 1
            if self.requests.get(request.request_id) is not request:
                continue  # it ended (or was aborted) after this step was launched
            taken = NoTokenToSample(NO_TOKEN) if failed else token
            if (out := self._take_token(request, taken, None, now)) is not None:
                outputs.append(out)
        return outputs
