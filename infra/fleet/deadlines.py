"""Deadline-aware sizing: the fewest workers that finish every queued job by its deadline.

Pure functions over a pool's deadline backlog, used by infra/fleet/autoscale.py `decide`
(and so by the controller and the simulator alike). A deadline backlog is a list of
(deadline in unix seconds, work tokens = prompt + max_tokens x n), sorted by deadline, as
infra/wire/backlog.py `deadline_backlog` reads it from one (model, bucket) backlog field.

The rule, with d_1 <= d_2 <= ... the queued deadlines, C_k the tokens due by d_k (all jobs
up to k: a queue served earliest deadline first finishes them before job k), now t, a
worker's rate r (work tokens/s) and the pool's cold start s:

    demand = max_k C_k / (r x window_k),   window_k = max(d_k - t - s, max(s, 1 s))

- the start-up is taken off every window: a worker launched now serves nothing before it
  is ready (it overstates the need by at most s / window when workers are already up);
- a window that is already shorter than a cold start (a late or nearly late job) is
  floored at one, as the size rule floors its drain window: the work is then finished as
  fast as new capacity can arrive, instead of asking for max_workers at every poll;
- target = ceil(demand) once demand >= WAKE_LOAD, else 0: a far deadline does not wake a
  pool from zero. It waits until one worker would need WAKE_LOAD of the time left (its
  latest start, with a factor 1 / WAKE_LOAD of slack for a rate that is off); a near
  deadline wakes it at once. A pool that is already up serves deadline work as it pulls it;
- jobs without a deadline are not counted here: interactive work comes before batch work
  in the queue and keeps the size rule (arrivals + backlog drained within target_wait_s).
  The pool's target is the larger of the two, not their sum: the deadline rule assumes
  the workers' whole rate; interactive load beside it is what the slack covers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

WAKE_LOAD = 0.5  # a pool at zero wakes once one worker would be busy this share of the time left
MIN_WINDOW_S = 1.0


def deadline_demand(
    deadlines: Sequence[tuple[float, int]], now: float, rate: float, startup_s: float
) -> float:
    """Workers (fractional) that finish every job by its deadline at `rate` tokens/s each,
    launched now with `startup_s` before they serve. `deadlines` sorted by deadline."""
    rate = max(rate, 1e-9)
    floor = max(startup_s, MIN_WINDOW_S)
    demand = 0.0
    due = 0
    for deadline, tokens in deadlines:
        due += tokens
        window = max(deadline - now - startup_s, floor)
        demand = max(demand, due / (rate * window))
    return demand


def deadline_target(demand: float) -> int:
    """Workers to ask for: none while one worker would still finish the work with room to
    spare (demand < WAKE_LOAD), else enough for it all."""
    if demand < WAKE_LOAD:
        return 0
    return max(math.ceil(demand - 1e-9), 1)


def merge_deadlines(lists: Sequence[Sequence[tuple[float, int]]]) -> list[tuple[float, int]]:
    """Several backlog fields' deadline lists (a pool's home buckets) as one, by deadline."""
    return sorted(item for items in lists for item in items)
