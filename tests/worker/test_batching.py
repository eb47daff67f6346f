"""Continuous batching must not change results: chunked prefill, prefix hits, preemption."""

from __future__ import annotations

import random

import pytest
import torch

from tests.conftest import make_engine
from tide_fleet.worker.engine import Priority, SamplingParams


def _workload(seed: int, n: int) -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(seed)
    shared = [1, *(rng.randrange(4, 260) for _ in range(40))]  # a 41-token common prefix
    prompts, params = [], []
    for i in range(n):
        own = [rng.randrange(4, 260) for _ in range(rng.choice([1, 3, 17, 60, 150]))]
        prompts.append(shared + own if i % 2 else [1, *own])
        params.append(
            SamplingParams(max_tokens=rng.choice([1, 5, 20, 40]), temperature=0.0, ignore_eos=True)
        )
    return prompts, params


@pytest.fixture(scope="module")
def sequential_reference(tiny_path):
    prompts, params = _workload(0, 24)
    engine = make_engine(tiny_path, enable_prefix_caching=False)
    return [engine.generate([p], [sp])[0].token_ids for p, sp in zip(prompts, params, strict=True)]


def test_batching_changes_nothing(tiny_path, sequential_reference):
    prompts, params = _workload(0, 24)
    # A tiny pool and a small step budget force chunked prefill, prefix hits and preemption.
    engine = make_engine(tiny_path, num_kv_blocks=24, max_num_batched_tokens=48, max_num_seqs=16)
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == sequential_reference
    stats = engine.stats()
    assert stats["num_preemptions"] > 0
    assert stats["prefix_cache_hits"] > 0
    assert all(o.finish_reason == "length" for o in outs)
    engine.block_manager.assert_all_free()


def test_roomy_pool_batches_without_preemption(tiny_path, sequential_reference):
    prompts, params = _workload(0, 24)
    engine = make_engine(tiny_path, max_num_batched_tokens=256)
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == sequential_reference
    assert engine.stats()["num_preemptions"] == 0
    engine.block_manager.assert_all_free()


def test_prefix_cache_hit_recomputes_last_token(tiny_path):
    engine = make_engine(tiny_path)
    prompt = [1, *range(10, 10 + 63)]  # exactly 4 full blocks of 16
    first = engine.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0))[0]
    hits_before = engine.stats()["prefix_cache_hits"]
    second = engine.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0))[0]
    assert second.token_ids == first.token_ids
    # 4 full blocks cached, but the last token must be recomputed, so only 3 are served.
    assert engine.stats()["prefix_cache_hits"] - hits_before == 48


def test_interactive_runs_before_batch(tiny_path):
    engine = make_engine(tiny_path, max_num_seqs=1)
    sp = SamplingParams(max_tokens=3, temperature=0.0)
    engine.add_request("batch-1", [1, 5, 6], sp, Priority.BATCH)
    engine.add_request("inter-1", [1, 7, 8], sp, Priority.INTERACTIVE)
    engine.add_request("batch-2", [1, 9, 9], sp, Priority.BATCH)
    engine.add_request("inter-2", [1, 7, 9], sp, Priority.INTERACTIVE)
    order = []
    while engine.has_unfinished():
        order += [o.request_id for o in engine.step() if o.finished]
    assert order == ["inter-1", "inter-2", "batch-1", "batch-2"]


def test_abort_frees_blocks_at_once(tiny_path):
    engine = make_engine(tiny_path)
    sp = SamplingParams(max_tokens=50, temperature=0.0)
    engine.add_request("a", [1, *range(20, 90)], sp)
    engine.add_request("b", [1, 2, 3], sp)
    engine.step()
    engine.step()
    assert engine.abort("a")
    assert "a" not in engine.block_manager.block_tables
    outs = engine.step()
    aborted = [o for o in outs if o.request_id == "a"]
    assert aborted and aborted[0].finish_reason == "abort" and aborted[0].finished
    assert not engine.abort("a")
    engine.abort("b")
    engine.step()
    engine.block_manager.assert_all_free()


@pytest.mark.parametrize("overlap", ["off", "on"], ids=["text-at-once", "text-a-step-late"])
def test_a_failing_request_fails_alone(tiny_path, monkeypatch, overlap):
    engine = make_engine(tiny_path, overlap_detokenize=overlap)
    sp = SamplingParams(max_tokens=6, temperature=0.0)
    engine.add_request("ok", [1, 10, 11], sp)
    engine.add_request("bad", [1, 12, 13], sp)

    def explode(token_id: int) -> None:
        raise RuntimeError("detokenizer broke")

    monkeypatch.setattr(engine.text._detoks["bad"], "add_token", explode)
    results = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                results[out.request_id] = out
    assert results["bad"].finish_reason == "error" and "detokenizer broke" in results["bad"].error
    assert results["ok"].finish_reason == "length" and len(results["ok"].token_ids) == 6
    engine.block_manager.assert_all_free()


def test_can_admit_tracks_slots_and_blocks(tiny_path):
    engine = make_engine(tiny_path, num_kv_blocks=8, max_num_seqs=2)
    assert engine.can_admit(100, 10)
    assert not engine.can_admit(8 * 16, 1), "never fits in the pool"
    sp = SamplingParams(max_tokens=2, temperature=0.0)
    engine.add_request("x", [1] * 90, sp)  # 6 blocks once admitted
    assert not engine.can_admit(40, 1), "the waiting request's blocks are reserved"
    assert engine.can_admit(10, 1)
    engine.add_request("y", [1, 2], sp)
    assert not engine.can_admit(1, 1), "no sequence slot left"
    engine.generate([], [])
    while engine.has_unfinished():
        engine.step()
    assert engine.can_admit(100, 10)


def test_timings_are_ordered(tiny_path):
    engine = make_engine(tiny_path)
    out = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=3, temperature=0.0))[0]
    t = out.timings
    assert t.arrival <= t.first_scheduled <= t.first_token <= t.finished


def test_a_one_token_prefill_chunk_samples_nothing(tiny_path):
    # Regression: a budget that cuts a prefill to one token made that row look like a
    # decode, and a token was sampled before the prompt was done.
    from tide_fleet.worker.engine.scheduler import ScheduledRequest
    from tide_fleet.worker.engine.step_inputs import build_step_inputs

    rows = [
        ScheduledRequest("decode", [7], 20, [0, 1], True),
        ScheduledRequest("cut-prefill", [9], 30, [2, 3], False),
    ]
    step = build_step_inputs(rows, 16, torch.device("cpu"))
    assert step.sampled_ids == ["decode"] and step.logits_rows.tolist() == [0]


def test_heavy_preemption_with_one_token_chunks_changes_nothing(tiny_path):
    prompts, params = _workload(0, 12)
    alone = make_engine(tiny_path, enable_prefix_caching=False)
    expected = [
        alone.generate([p], [sp])[0].token_ids for p, sp in zip(prompts, params, strict=True)
    ]
    engine = make_engine(tiny_path, num_kv_blocks=16, max_num_batched_tokens=48, max_num_seqs=8)
    assert [o.token_ids for o in engine.generate(prompts, params)] == expected
    assert engine.stats()["num_preemptions"] > 0
    engine.block_manager.assert_all_free()
