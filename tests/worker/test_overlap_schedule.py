"""The overlapped loop (step n+1 launched before step n's tokens are read) gives exactly the
serial loop's outputs: greedy and seeded tokens, texts, finish reasons, under chunked
prefill, preemption, prefix-cache hits, stop strings, aborts, and requests that need the
host between steps (which run serially)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_engine
from tide_fleet.worker.engine import SamplingParams

CONFIG = dict(block_size=8, max_num_batched_tokens=32, max_num_seqs=4)


def prompts(count: int, seed: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 70, (count,), generator=g).tolist()
    return [[1, *torch.randint(3, 500, (n,), generator=g).tolist()] for n in lengths]


MIX = [
    SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True),
    SamplingParams(max_tokens=12, temperature=0.8, seed=7, ignore_eos=True),
    SamplingParams(max_tokens=25, temperature=0.0),  # may end at EOS
    SamplingParams(max_tokens=1, temperature=0.0),
    SamplingParams(max_tokens=40, temperature=1.0, top_p=0.9, seed=3, ignore_eos=True),
    SamplingParams(max_tokens=20, temperature=0.0, stop=["e"]),
]


def run_both(path, batch, params, **config):  # type: ignore[no-untyped-def]
    """(serial outputs, overlapped outputs, their engines), outputs as comparable tuples."""
    results, engines = [], []
    for mode in ("off", "on"):
        engine = make_engine(path, overlap_schedule=mode, **{**CONFIG, **config})
        outs = engine.generate(batch, params)
        results.append([(o.token_ids, o.finish_reason, o.text) for o in outs])
        engines.append(engine)
        assert not engine.has_unfinished()
        engine.block_manager.check_invariants()
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    return results[0], results[1], engines


@pytest.mark.parametrize("blocks", [200, 24])  # plenty, and few enough to preempt
def test_overlapped_outputs_equal_the_serial_loop(stories_path, blocks):
    batch = prompts(12)
    serial, overlapped, engines = run_both(stories_path, batch, MIX * 2, num_kv_blocks=blocks)
    assert serial == overlapped
    if blocks == 24:
        assert all(e.stats()["num_preemptions"] > 0 for e in engines)
    assert {o[1] for o in serial} >= {"length", "stop"}


def test_prefix_hits_and_the_padded_graph_path(stories_path):
    """A second round sharing the first's prompts' 32-token prefixes; decode steps on the
    padded static buffers the CUDA-graph path uses (run eagerly on CPU), fed on the device."""
    first = prompts(4, seed=5)
    batch = first + [[*p[:33], 7, 8, 9] for p in first if len(p) > 33]
    params = [SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)] * len(batch)
    serial, overlapped, engines = run_both(
        stories_path, batch, params, num_kv_blocks=200, cuda_graphs="eager"
    )
    assert serial == overlapped
    assert engines[1].runner.graph_mode == "eager"
    assert engines[1].stats()["prefix_cache_hits"] > 0


def test_host_bound_requests_run_serially_and_agree(stories_path):
    """A logprobs request and a penalised one need the host between steps: while they run,
    steps are serial; the outputs are the serial loop's."""
    params = [
        *MIX[:3],
        SamplingParams(max_tokens=10, temperature=0.0, logprobs=2, ignore_eos=True),
        SamplingParams(max_tokens=10, temperature=0.0, presence_penalty=1.0, ignore_eos=True),
    ]
    batch = prompts(len(params), seed=9)
    serial, overlapped, _ = run_both(stories_path, batch, params, num_kv_blocks=200)
    assert serial == overlapped


def test_tokens_are_read_one_step_late_and_an_abort_ends_cleanly(stories_path):
    engine = make_engine(stories_path, overlap_schedule="on", num_kv_blocks=200, **CONFIG)
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    engine.add_request("a", [1, 400, 30], params)
    engine.add_request("b", [1, 72, 101, 108], params)
    outputs = engine.step()  # prefill of both, sampled on the device: nothing read yet
    assert outputs == [] and engine._inflight is not None
    assert engine.requests["a"].pending == 1 and engine.requests["a"].num_output_tokens == 0
    outputs = engine.step()  # launches step 2, reads step 1
    assert sorted(o.request_id for o in outputs) == ["a", "b"]
    assert engine.requests["a"].num_output_tokens == 1
    engine.abort("a")
    finished = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert finished["a"].finish_reason == "abort" and len(finished["b"].token_ids) == 50
    engine.block_manager.check_invariants()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
