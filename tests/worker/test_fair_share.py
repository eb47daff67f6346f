"""Fair shares between jobs in the scheduler: a job of many sequences runs alone on every
slot, yet a job that arrives after it starts within a step, and every output is the one an
unshared run gives (a preempted sequence recomputes its KV and carries on)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import make_engine
from tide_fleet.worker.engine import SamplingParams
from tide_fleet.worker.engine.fair_share import water_fill

PROMPT = [1, *range(40, 60)]
GREEDY_LONG = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
SHORT = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)


@given(st.dictionaries(st.text(min_size=1, max_size=3), st.integers(0, 50), max_size=12),
       st.integers(0, 80))  # fmt: skip
def test_water_fill_is_max_min_fair(demand, capacity):
    alloc = water_fill(demand, capacity)
    assert set(alloc) == set(demand)
    assert sum(alloc.values()) <= capacity
    assert all(0 <= alloc[g] <= demand[g] for g in demand)
    if sum(demand.values()) <= capacity:
        assert alloc == demand  # everyone gets what they want
    # Max-min: a group short of its demand got at least as much as any other group, less
    # the rounding of one slot.
    for g in demand:
        if alloc[g] < demand[g]:
            assert all(alloc[g] >= alloc[h] - 1 for h in demand), (g, alloc)


def _engine(tiny_path, **config):  # type: ignore[no-untyped-def]
    return make_engine(tiny_path, max_num_seqs=8, **config)


def _add_big(engine, count: int = 12) -> list[str]:  # type: ignore[no-untyped-def]
    ids = [f"big#{i}" for i in range(count)]
    for i, rid in enumerate(ids):
        engine.add_request(rid, [*PROMPT, i + 2], GREEDY_LONG, group="big")
    return ids


def _run(engine, until: set[str] | None = None) -> tuple[dict[str, list[int]], int]:  # type: ignore[no-untyped-def]
    """Step until every request ends (or those of `until`); tokens by id and steps taken."""
    tokens: dict[str, list[int]] = {}
    steps = 0
    while engine.has_unfinished():
        steps += 1
        for out in engine.step():
            if out.finished:
                tokens[out.request_id] = out.token_ids
        if until is not None and until <= set(tokens):
            break
    return tokens, steps


def test_a_job_running_alone_takes_every_slot(tiny_path):
    engine = _engine(tiny_path)
    _add_big(engine)
    engine.step()
    assert len(engine.scheduler.running) == 8
    assert engine.room() == 4  # a new job would get half: 2 groups share 8 slots


def test_a_job_that_arrives_later_starts_within_a_step(tiny_path):
    alone = _engine(tiny_path)
    big = _add_big(alone)
    reference, _ = _run(alone)

    engine = _engine(tiny_path)
    _add_big(engine)
    for _ in range(5):
        engine.step()
    assert engine.can_admit(len(PROMPT), SHORT.max_tokens)  # every slot is taken, yet
    engine.add_request("small", PROMPT, SHORT)
    done, steps = _run(engine, until={"small"})
    # Its prompt and 4 tokens: 5 steps when it is admitted at once (was: after a big
    # sequence ended, 55 steps later).
    assert steps <= 6, steps
    assert engine.scheduler.num_preemptions >= 1
    rest, _ = _run(engine)
    done.update(rest)
    assert {rid: done[rid] for rid in big} == reference  # preemption changed no token
    engine.block_manager.assert_all_free()


def test_kv_blocks_are_taken_back_for_a_job_under_its_share(tiny_path):
    # 24 blocks of 16 tokens: 8 big sequences of 21 + 60 tokens hold all of them.
    engine = _engine(tiny_path, num_kv_blocks=24, enable_prefix_caching=False)
    _add_big(engine, 8)
    for _ in range(30):
        engine.step()
    assert engine.block_manager.num_free_blocks <= 2
    engine.add_request("small", PROMPT, SHORT)
    _, steps = _run(engine, until={"small"})
    assert steps <= 6, steps
    _run(engine)
    engine.block_manager.assert_all_free()


@pytest.mark.parametrize("groups", [1, 3])
def test_sequences_without_a_group_are_served_in_order(tiny_path, groups):
    # Requests of their own groups (n = 1 jobs): first come, first served, as before.
    engine = _engine(tiny_path)
    for i in range(12):
        engine.add_request(f"r{i}", [*PROMPT, i + 2], SHORT, group=f"g{i % groups}" if
                           groups > 1 else None)  # fmt: skip
    engine.step()
    running = sorted(r.request_id for r in engine.scheduler.running)
    if groups == 1:
        assert running == sorted(f"r{i}" for i in range(8))
    else:  # 3 groups of 4 share 8 slots
        by_group = [sum(1 for r in engine.scheduler.running if r.group == f"g{k}")
                    for k in range(3)]  # fmt: skip
        assert sorted(by_group) == [2, 3, 3], by_group
