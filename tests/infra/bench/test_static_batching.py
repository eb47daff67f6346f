"""The static-batching switch: same greedy tokens, and nothing joins a batch once it runs."""

from __future__ import annotations

import random

import pytest

from tests.conftest import make_engine
from tide_fleet.worker.engine import SamplingParams
from tide_fleet.worker.engine.config import EngineConfig


def _workload(n: int) -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(7)
    prompts = [
        [1, *(rng.randrange(4, 260) for _ in range(rng.choice([2, 9, 33, 70])))] for _ in range(n)
    ]
    params = [
        SamplingParams(max_tokens=rng.choice([1, 6, 25]), temperature=0.0, ignore_eos=True)
        for _ in range(n)
    ]
    return prompts, params


def test_static_gives_the_same_greedy_tokens(tiny_path):
    prompts, params = _workload(12)
    continuous = make_engine(tiny_path).generate(prompts, params)
    # A small step budget chunks prefills; max_num_seqs=5 makes three successive batches.
    static = make_engine(tiny_path, batching="static", max_num_seqs=5, max_num_batched_tokens=48)
    outs = static.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in continuous]
    static.block_manager.assert_all_free()
    assert not static.scheduler.static_batch


def _run_until_first_token(engine, request_id: str) -> None:
    for _ in range(100):
        for out in engine.step():
            if out.request_id == request_id and out.new_token_ids:
                return
    raise AssertionError("no first token")


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_late_arrival_waits_for_the_batch_only_when_static(tiny_path, batching):
    engine = make_engine(tiny_path, batching=batching)
    greedy = dict(temperature=0.0, ignore_eos=True)
    engine.add_request("a", [1, 10, 11, 12], SamplingParams(max_tokens=3, **greedy))
    engine.add_request("b", [1, 20, 21], SamplingParams(max_tokens=12, **greedy))
    _run_until_first_token(engine, "a")
    assert engine.can_admit(3, 4) is (batching == "continuous")
    engine.add_request("late", [1, 30, 31], SamplingParams(max_tokens=2, **greedy))
    finished_at: dict[str, int] = {}
    first_token_at: dict[str, int] = {}
    step = 0
    while engine.has_unfinished():
        step += 1
        for out in engine.step():
            if out.new_token_ids:
                first_token_at.setdefault(out.request_id, step)
            if out.finished:
                finished_at[out.request_id] = step
    if batching == "static":
        # The late request starts only after the whole batch (a and the longer b) is done.
        assert first_token_at["late"] > finished_at["b"]
        assert finished_at["a"] < finished_at["b"]
    else:
        assert first_token_at["late"] < finished_at["b"]
    engine.block_manager.assert_all_free()


def test_batching_is_validated():
    with pytest.raises(ValueError, match="batching must be continuous or static"):
        EngineConfig(batching="dynamic")
