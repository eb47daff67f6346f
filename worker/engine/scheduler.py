"""Iteration-level scheduler: decode tokens first, then chunked prefill, under a token budget.

Pure Python. Each step it emits one SchedulerOutput that says which requests run, how
many tokens each, and where their KV lives; the model runner turns that into tensors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from worker.engine.block_manager import BlockManager
from worker.engine.config import EngineConfig
from worker.engine.request import Request, RequestStatus


@dataclass
class ScheduledRequest:
    """One request's share of a step: tokens [start, start + len(token_ids))."""

    request_id: str
    token_ids: list[int]
    start_pos: int
    block_table: list[int]
    sample: bool

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.num_preemptions = 0
        # Static batching: the ids of the batch being run; nothing else is admitted
        # until it is empty. Running requests are always members.
        self.static_batch: set[str] = set()

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def is_static(self) -> bool:
        return self.config.batching == "static"

    def add(self, request: Request) -> None:
        self._insert_waiting(request)

    def _insert_waiting(self, request: Request, front: bool = False) -> None:
        request.status = RequestStatus.WAITING
        if front:
            self.waiting.insert(0, request)
            return
        key = request.sort_key()
        i = len(self.waiting)
        while i > 0 and self.waiting[i - 1].sort_key() > key:
            i -= 1
        self.waiting.insert(i, request)

    def can_admit(
        self, num_prompt_tokens: int, max_tokens: int, prompt_token_ids: list[int] | None = None
    ) -> bool:
        """Would a new request of this size start now: a seq slot and blocks for its prompt."""
        if self.is_static and self.static_batch:
            return False  # a static batch is running: new work waits until it is done
        if self.num_unfinished >= self.config.max_num_seqs:
            return False
        bm = self.block_manager
        if num_prompt_tokens + max_tokens > bm.num_blocks * bm.block_size:
            return False
        num_hit_tokens = 0
        if prompt_token_ids is not None:
            num_hit_tokens = len(bm.lookup_prefix(prompt_token_ids, record=False)) * bm.block_size
        reserved = sum(bm.blocks_for(r.num_tokens + 1) for r in self.waiting)
        needed = bm.blocks_for(num_prompt_tokens + 1) - num_hit_tokens // bm.block_size
        return needed + reserved <= bm.num_free_blocks

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        now = time.time()
        if self.is_static and not self.static_batch:
            # Seal the next static batch: whatever is waiting now, up to max_num_seqs.
            batch = self.waiting[: self.config.max_num_seqs]
            self.static_batch = {r.request_id for r in batch}
        # Running requests first, decodes before partial prefills, so a long prompt
        # being chunked never stalls the sequences that are already generating.
        ordered = sorted(self.running, key=lambda r: r.num_tokens - r.num_computed_tokens > 1)
        for request in ordered:
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if not self._allocate_or_preempt(request, num_new, out):
                continue
            out.scheduled.append(self._scheduled(request, num_new))
            budget -= num_new
        if not out.preempted_ids:
            budget = self._admit_waiting(out, budget, now)
        return out

    def _allocate_or_preempt(self, request: Request, num_new: int, out: SchedulerOutput) -> bool:
        while not self.block_manager.allocate_slots(request, num_new):
            victim = self.running[-1]  # the most recently admitted
            self._preempt(victim)
            out.preempted_ids.append(victim.request_id)
            out.scheduled = [s for s in out.scheduled if s.request_id != victim.request_id]
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.block_manager.free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._insert_waiting(request, front=True)

    def _admit_waiting(self, out: SchedulerOutput, budget: int, now: float) -> int:
        bm = self.block_manager
        while budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self._next_admissible()
            if request is None:
                break
            hits = bm.get_computed_blocks(request)
            num_cached = len(hits) * bm.block_size
            num_new = min(request.num_tokens - num_cached, budget)
            if not bm.allocate_slots(request, num_new, hits):
                break
            self.waiting.remove(request)
            request.num_computed_tokens = num_cached
            request.status = RequestStatus.RUNNING
            if request.timings.first_scheduled is None:
                request.timings.first_scheduled = now
            self.running.append(request)
            out.scheduled.append(self._scheduled(request, num_new))
            budget -= num_new
        return budget

    def _next_admissible(self) -> Request | None:
        if not self.is_static:
            return self.waiting[0] if self.waiting else None
        return next((r for r in self.waiting if r.request_id in self.static_batch), None)

    def _scheduled(self, request: Request, num_new: int) -> ScheduledRequest:
        start = request.num_computed_tokens
        return ScheduledRequest(
            request_id=request.request_id,
            token_ids=request.all_token_ids[start : start + num_new],
            start_pos=start,
            block_table=self.block_manager.get_block_table(request.request_id),
            sample=start + num_new == request.num_tokens,
        )

    def finish(self, request: Request) -> None:
        """Remove a request wherever it is and release its blocks."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.block_manager.free(request)
        self.static_batch.discard(request.request_id)
        request.status = RequestStatus.FINISHED
