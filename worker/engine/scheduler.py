"""Iteration-level scheduler: decode tokens first, then chunked prefill, under a token budget.

Pure Python. Each step it emits one SchedulerOutput that says which requests run, how
many tokens each, and where their KV lives; the model runner turns that into tensors.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter

from tide_fleet.worker.engine import fair_share
from tide_fleet.worker.engine.block_manager import BlockManager
from tide_fleet.worker.engine.config import EngineConfig
from tide_fleet.worker.engine.request import Request, RequestStatus
from tide_fleet.worker.engine.scheduled import PLACEHOLDER, ScheduledRequest, SchedulerOutput
from tide_fleet.worker.lora.slots import Adapters, BaseOnly

__all__ = ["ScheduledRequest", "Scheduler", "SchedulerOutput"]


class Scheduler:
    def __init__(
        self, config: EngineConfig, block_manager: BlockManager,
        adapters: Adapters | None = None,
    ) -> None:  # fmt: skip
        self.config = config
        self.block_manager = block_manager
        # A request under a LoRA adapter starts only when the adapter holds a device slot
        # or can get one; it holds the slot while it runs.
        self.adapters = adapters or BaseOnly()
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

    def _shares(self, newcomer: str | None = None) -> tuple[dict[str, int], Counter[str]]:
        """Each group's fair share of the slots (with ``newcomer`` wanting them all, when
        given) and how many each runs now."""
        demand = fair_share.demands(self.running, self.waiting)
        if newcomer is not None:
            demand[newcomer] = self.config.max_num_seqs
        alloc = fair_share.water_fill(demand, self.config.max_num_seqs)
        return alloc, Counter(r.group for r in self.running)

    def _ahead(self, alloc: dict[str, int], running_by: Counter[str]) -> list[Request]:
        """Waiting requests that a newcomer would not pass: those under their share."""
        return [r for r in self.waiting if fair_share.under_share(r.group, running_by, alloc)]

    def room(self) -> int:
        """Sequences a new group could start now: the free slots, or the fair share it
        would take back from groups over theirs."""
        if self.is_static and self.static_batch:
            return 0
        if self.is_static or not self._grouped():  # one sequence per job: the free slots
            return self.config.max_num_seqs - self.num_unfinished
        alloc, running_by = self._shares("\0new")
        free = self.config.max_num_seqs - len(self.running) - len(self._ahead(alloc, running_by))
        return max(free, alloc["\0new"])

    def can_admit(
        self,
        num_prompt_tokens: int,
        max_tokens: int,
        prompt_token_ids: list[int] | None = None,
        group: str | None = None,
        lora: str | None = None,
    ) -> bool:
        """Would a new request of this size start now: a seq slot and blocks for its prompt
        (counting what its group's fair share would take back from groups over theirs), and
        a device slot for its LoRA adapter."""
        if self.is_static and self.static_batch:
            return False  # a static batch is running: new work waits until it is done
        if not self.adapters.can_run(lora):
            return False
        bm = self.block_manager
        if num_prompt_tokens + max_tokens > bm.num_blocks * bm.block_size:
            return False
        if self.is_static or not self._grouped():  # one sequence per job: as they came
            ahead, reclaim = self.waiting, None
        else:
            alloc, running_by = self._shares()
            ahead = self._ahead(alloc, running_by)
            key = group if group is not None else "\0new"
            mine, _ = self._shares(key)
            reclaim = fair_share.victim(self.running, mine) if running_by[key] < mine[key] else None
        if len(self.running) + len(ahead) >= self.config.max_num_seqs and reclaim is None:
            return False
        num_hit_tokens = 0
        if prompt_token_ids is not None:
            salt = self.adapters.salt(lora)
            hits = bm.lookup_prefix(prompt_token_ids, record=False, salt=salt)
            num_hit_tokens = len(hits) * bm.block_size
        reserved = sum(bm.blocks_for(r.num_tokens + 1) for r in ahead)
        needed = bm.blocks_for(num_prompt_tokens + 1) - num_hit_tokens // bm.block_size
        freeable = len(bm.get_block_table(reclaim.request_id)) if reclaim is not None else 0
        return needed + reserved <= bm.num_free_blocks + freeable

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
        shared = not self.is_static and self._grouped()
        # Fair shares, once a step: demand does not change within it (a preempted request
        # waits again); what each group runs is kept up to date as requests move.
        alloc, running_by = self._shares() if shared else ({}, Counter[str]())
        if shared:
            self._reclaim(out, alloc, running_by)
        fair_preemptions = len(out.preempted_ids)
        ordered = sorted(
            self.running, key=lambda r: r.num_sampled_tokens - r.num_computed_tokens > 1
        )
        for request in ordered:
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            if request.num_output_tokens + request.pending >= request.params.max_tokens:
                continue  # its last token is sampled already (overlapped loop): it ends
            num_new = min(request.num_sampled_tokens - request.num_computed_tokens, budget)
            if not self._allocate_or_preempt(request, num_new, out):
                continue
            out.scheduled.append(self._scheduled(request, num_new))
            budget -= num_new
        if len(out.preempted_ids) == fair_preemptions:  # no KV pressure in this step
            budget = self._admit_waiting(out, budget, now, alloc if shared else None, running_by)
        return out

    def _grouped(self) -> bool:
        """Some job has several sequences in: fair shares apply. (With one sequence per job
        they change nothing: requests are served in order, and it costs nothing to ask.)"""
        seen: set[str] = set()
        for r in itertools.chain(self.running, self.waiting):
            if r.group in seen:
                return True
            seen.add(r.group)
        return False

    def _reclaim(
        self, out: SchedulerOutput, alloc: dict[str, int], running_by: Counter[str]
    ) -> None:
        """Preempt requests of groups over their fair share for the slots that waiting
        groups under theirs are owed and cannot get from the free ones."""
        if not self.waiting:
            return
        need = fair_share.owed(self.waiting, running_by, alloc)
        need -= self.config.max_num_seqs - len(self.running)
        while need > 0 and (victim := fair_share.victim(self.running, alloc)) is not None:
            self._preempt(victim)
            running_by[victim.group] -= 1
            out.preempted_ids.append(victim.request_id)
            need -= 1

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
        self.adapters.unpin(request.lora)
        self.block_manager.free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._insert_waiting(request, front=True)

    def _admit_waiting(
        self, out: SchedulerOutput, budget: int, now: float, alloc: dict[str, int] | None,
        running_by: Counter[str],
    ) -> int:  # fmt: skip
        """Admit waiting requests under the budget; by fair shares when ``alloc`` is given."""
        bm = self.block_manager
        while budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self._next_admissible(alloc, running_by)
            if request is None:
                break
            hits = bm.get_computed_blocks(request)
            num_cached = len(hits) * bm.block_size
            num_new = min(request.num_tokens - num_cached, budget)
            if not bm.allocate_slots(request, num_new, hits):
                if alloc is None or not self._free_blocks_for(request, alloc, running_by, out):
                    break
                continue  # blocks freed: look its prefix up again
            self.waiting.remove(request)
            self.adapters.pin(request.lora)
            request.num_computed_tokens = num_cached
            request.status = RequestStatus.RUNNING
            if request.timings.first_scheduled is None:
                request.timings.first_scheduled = now
            self.running.append(request)
            running_by[request.group] += 1
            out.scheduled.append(self._scheduled(request, num_new))
            budget -= num_new
        return budget

    def _free_blocks_for(
        self, request: Request, alloc: dict[str, int], running_by: Counter[str],
        out: SchedulerOutput,
    ) -> bool:  # fmt: skip
        """KV blocks for a request under its group's share of the sequences the KV pool
        holds now (as many as run): preempt one request of a group over its share; False
        when there is none to preempt."""
        demand = fair_share.demands(self.running, self.waiting)
        held = fair_share.water_fill(demand, len(self.running))
        if not fair_share.under_share(request.group, running_by, held):
            return False
        victim = fair_share.victim(self.running, held)
        if victim is None:
            return False
        self._preempt(victim)
        running_by[victim.group] -= 1
        out.preempted_ids.append(victim.request_id)
        out.scheduled = [s for s in out.scheduled if s.request_id != victim.request_id]
        return True

    def _next_admissible(
        self, alloc: dict[str, int] | None, running_by: Counter[str]
    ) -> Request | None:
        """Best priority class first; within it, groups under their fair share before groups
        over it, groups running fewer sequences first; then the waiting order (arrival,
        preempted requests first)."""
        if self.is_static:
            return next((r for r in self.waiting if r.request_id in self.static_batch
                         and self._can_start(r)), None)  # fmt: skip
        if alloc is None:
            return next((r for r in self.waiting if self._can_start(r)), None)
        best: tuple[int, bool, int, int] | None = None
        for k, r in enumerate(self.waiting):
            if not self._can_start(r):
                continue  # its adapter has no device slot to get now, or a token is pending
            over = not fair_share.under_share(r.group, running_by, alloc)
            key = (int(r.priority), over, running_by[r.group], k)
            if best is None or key < best:
                best = key
                if key[:3] == (0, False, 0):
                    break  # no later request can come before it
        return None if best is None else self.waiting[best[3]]

    def _can_start(self, request: Request) -> bool:
        """A waiting request may start: its adapter can get a slot, and it has no token
        pending (preempted while its last token was being read: it starts a step later)."""
        return request.pending == 0 and self.adapters.can_run(request.lora)

    def _scheduled(self, request: Request, num_new: int) -> ScheduledRequest:
        start = request.num_computed_tokens
        tokens = request.all_token_ids[start : start + num_new]
        tokens += [PLACEHOLDER] * (num_new - len(tokens))  # a pending token: fed on the device
        return ScheduledRequest(
            request_id=request.request_id,
            token_ids=tokens,
            start_pos=start,
            block_table=self.block_manager.get_block_table(request.request_id),
            sample=start + num_new == request.num_sampled_tokens,
            lora_slot=self.adapters.slot(request.lora),
        )

    def finish(self, request: Request) -> None:
        """Remove a request wherever it is and release its blocks."""
        if request in self.running:
            self.running.remove(request)
            self.adapters.unpin(request.lora)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.block_manager.free(request)
        self.static_batch.discard(request.request_id)
        request.status = RequestStatus.FINISHED
