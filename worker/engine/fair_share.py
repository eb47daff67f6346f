"""Fair shares of a step between jobs: how many sequences each job (a *group*) may run.

A job's ``n`` choices, and the jobs of one multi-prompt request, are one group. The
engine's sequence slots (``max_num_seqs``) are split max-min fairly between the groups
that have unfinished requests: a group that needs less than an equal share gets what it
needs, and the rest is split equally between the others (``water_fill``). The split is
work-conserving: a group may run past its share while slots are free, so a job running
alone keeps the whole batch. When a group under its share has a request waiting and no
slot or KV block is free, the scheduler preempts requests of the groups furthest over
their share, cheapest to recompute first (``victim``), and admits the waiting group's
request before theirs. A preempted request keeps its tokens and recomputes its KV
(usually from the prefix cache) when it is admitted again.

So a 128-sequence request shares each step with a short job that arrives after it: the
short job starts within a step or two and decodes in a batch no larger than before.

Pure Python, no torch.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping

from tide_fleet.worker.engine.request import Request


def water_fill(demand: Mapping[str, int], capacity: int) -> dict[str, int]:
    """Max-min fair allocation of ``capacity`` slots to groups wanting ``demand`` each.

    Groups are served smallest demand first, each getting min(its demand, an equal part of
    what is left, rounded up). Sum <= capacity; no group gets more than it wants; a group
    below its equal part leaves the difference to the others. Among equal demands the
    rounding goes to the groups given first (``demand``'s order: running, then waiting),
    so with more groups than slots the later ones get nothing and wait, oldest first."""
    alloc: dict[str, int] = {}
    left = capacity
    ordered = sorted(demand.items(), key=lambda kv: kv[1])
    for k, (group, want) in enumerate(ordered):
        part = -(-left // (len(ordered) - k))
        alloc[group] = min(want, part)
        left -= alloc[group]
    return alloc


def demands(running: Iterable[Request], waiting: Iterable[Request]) -> Counter[str]:
    """Unfinished requests per group, running ones' groups first (water_fill's order)."""
    return Counter(r.group for r in itertools.chain(running, waiting))


def under_share(group: str, running_by: Mapping[str, int], alloc: Mapping[str, int]) -> bool:
    return running_by.get(group, 0) < alloc.get(group, 0)


def owed(
    waiting: Iterable[Request], running_by: Mapping[str, int], alloc: Mapping[str, int]
) -> int:
    """Slots that waiting groups under their share are owed (each up to its share)."""
    waiting_by = Counter(r.group for r in waiting)
    return sum(
        min(count, alloc.get(g, 0) - running_by.get(g, 0))
        for g, count in waiting_by.items()
        if under_share(g, running_by, alloc)
    )


def victim(running: list[Request], alloc: Mapping[str, int]) -> Request | None:
    """The running request to preempt for a group under its share: from the group furthest
    over its share, the one with the fewest tokens computed (cheapest to redo); None when
    no group is over its share."""
    running_by = Counter(r.group for r in running)
    over = {g: n - alloc.get(g, 0) for g, n in running_by.items() if n > alloc.get(g, 0)}
    if not over:
        return None
    worst = max(over, key=lambda g: over[g])
    return min((r for r in running if r.group == worst), key=lambda r: r.num_computed_tokens)
