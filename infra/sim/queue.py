"""One simulated (model, bucket) queue, in the live queue's order: jobs without a deadline
first, first come first served; then jobs with one (the batch class), earliest deadline
first (ties by arrival)."""

from __future__ import annotations

import heapq
from collections import deque

from tide_fleet.infra.sim.traces import Job


class SimQueue:
    """Interactive jobs in a deque, deadline jobs in a heap; the oldest job's age and the
    tokens due per deadline kept as jobs come and go, so a poll reads them cheaply."""

    def __init__(self) -> None:
        self.interactive: deque[Job] = deque()
        self.by_deadline: list[tuple[float, int, Job]] = []
        self.arrived: deque[Job] = deque()  # deadline jobs by arrival; taken ones skipped
        self.taken: set[int] = set()
        self.due: dict[float, int] = {}  # deadline -> work tokens queued with it

    def __len__(self) -> int:
        return len(self.interactive) + len(self.by_deadline)

    def ahead_of(self, job: Job) -> bool:
        """Whether a queued job comes before `job` would (then it waits behind it)."""
        return bool(self.interactive) if job.deadline is None else bool(self)

    def push(self, job: Job) -> None:
        if job.deadline is None:
            self.interactive.append(job)
            return
        heapq.heappush(self.by_deadline, (job.deadline, job.idx, job))
        self.arrived.append(job)
        self.due[job.deadline] = self.due.get(job.deadline, 0) + job.work

    def head(self) -> Job:
        return self.interactive[0] if self.interactive else self.by_deadline[0][2]

    def pop(self) -> Job:
        if self.interactive:
            return self.interactive.popleft()
        deadline, _, job = heapq.heappop(self.by_deadline)
        self.taken.add(job.idx)
        self.due[deadline] -= job.work
        if not self.due[deadline]:
            del self.due[deadline]
        return job

    def oldest_arrival(self) -> float:
        """The earliest arrival among queued jobs (the queue must not be empty)."""
        while self.arrived and self.arrived[0].idx in self.taken:
            self.taken.discard(self.arrived.popleft().idx)
        times = [q[0].arrival for q in (self.interactive, self.arrived) if q]
        return min(times)

    def deadlines(self) -> list[tuple[float, int]]:
        """(deadline, work tokens) of the queued deadline jobs, one entry per deadline, by
        deadline: what infra/wire/backlog.py deadline_backlog gives, jobs of one deadline
        summed (the sizing rule's result is the same)."""
        return sorted(self.due.items())
