"""Tensor parallelism on CPU (gloo on loopback): N ranks give the same greedy tokens as one
process, in float32, on real and random-weight models, with chunked prefill, prefix-cache
hits and preemption; and the llama2.c references for stories260K."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import make_engine
from tide_fleet.worker.engine import LLMEngine, SamplingParams
from tide_fleet.worker.engine.config import EngineConfig
from tide_fleet.worker.models.loader import load_model
from tide_fleet.worker.parallel.group import TensorParallel, free_address

GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)


def run(path: Path | str, tp: int, prompts: list[list[int]], **config) -> tuple[list, dict]:
    """Each prompt's greedy tokens and the engine's stats, the ranks stopped after."""
    engine = make_engine(path, tensor_parallel_size=tp, **config)
    try:
        outputs = engine.generate(prompts, GREEDY)
        return [o.token_ids for o in outputs], engine.stats()
    finally:
        engine.close()


def long_prompts(count: int, length: int, vocab: int = 512) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [[1, *torch.randint(3, vocab, (length,), generator=g).tolist()] for _ in range(count)]


def test_two_and_four_ranks_give_llama2c_greedy_tokens(stories_path, stories_refs):
    prompts = [r["prompt_ids"] for r in stories_refs]
    params = [SamplingParams(max_tokens=r["max_new_tokens"], temperature=0.0) for r in stories_refs]
    for tp in (2, 4):
        engine = make_engine(stories_path, tensor_parallel_size=tp, num_kv_blocks=64)
        try:
            outputs = engine.generate(prompts, params)
        finally:
            engine.close()
        for ref, out in zip(stories_refs, outputs, strict=True):
            assert out.token_ids == ref["new_ids"], (tp, ref["prompt"])


def test_chunked_prefill_and_prefix_hits_match_one_process(stories_path):
    """16-token steps split the 60-token prompts into chunks; the second round's prompts
    share the first round's 48-token prefix, read from the prefix cache."""
    first = long_prompts(3, 60)
    second = [p[:49] + q[49:] for p, q in zip(first, long_prompts(3, 60), strict=True)]
    config = dict(num_kv_blocks=96, block_size=8, max_num_batched_tokens=16, max_num_seqs=4)
    results = []
    for tp in (1, 2):
        engine = make_engine(stories_path, tensor_parallel_size=tp, **config)
        try:
            tokens = [o.token_ids for o in engine.generate(first, GREEDY)]
            tokens += [o.token_ids for o in engine.generate(second, GREEDY)]
            results.append((tokens, engine.stats()["prefix_cache_hits"]))
        finally:
            engine.close()
    assert results[0][0] == results[1][0]
    assert results[1][1] >= 3 * 6  # each second-round prompt found its 6 full blocks


def test_preemption_matches_one_process(stories_path):
    """Six 40-token prompts growing by 32 in a pool of 24 blocks of 8: some are preempted
    and recomputed."""
    prompts = long_prompts(6, 40)
    config = dict(num_kv_blocks=24, block_size=8, max_num_seqs=6)
    one, _ = run(stories_path, 1, prompts, **config)
    two, stats = run(stories_path, 2, prompts, **config)
    assert stats["num_preemptions"] > 0
    assert one == two


def test_random_weight_model_matches_one_process(tiny_path):
    prompts = long_prompts(4, 20, vocab=260)
    one, _ = run(tiny_path, 1, prompts, num_kv_blocks=64)
    two, _ = run(tiny_path, 2, prompts, num_kv_blocks=64)
    assert one == two


def test_one_rank_through_the_distributed_path_matches_one_process(stories_path):
    """TP=1 through the collectives (the path a single GPU checks with NCCL): one process
    joins a group of one, loads as rank 0 of 1 and serves."""
    prompts = long_prompts(3, 30)
    plain, _ = run(stories_path, 1, prompts, num_kv_blocks=64)
    tp = TensorParallel.join(0, 1, free_address(), torch.device("cpu"))
    try:
        model = load_model(stories_path, "float32", tp=tp)
        engine = LLMEngine(model, None, EngineConfig(num_kv_blocks=64))
        assert [o.token_ids for o in engine.generate(prompts, GREEDY)] == plain
    finally:
        tp.close()


def test_a_size_that_does_not_split_the_model_is_refused_before_any_rank_starts(stories_path):
    with pytest.raises(ValueError, match=r"tensor_parallel_size 3 does not divide"):
        make_engine(stories_path, tensor_parallel_size=3)
    with pytest.raises(ValueError, match=r"max_loras: LoRA adapters are not served"):
        make_engine(stories_path, tensor_parallel_size=2, max_loras=2)
