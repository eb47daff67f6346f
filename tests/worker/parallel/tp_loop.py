"""A tensor-parallel engine of two ranks generating until it is killed; prints its ranks'
process ids first (tests/worker/parallel/test_one_fate.py runs it)."""

from __future__ import annotations

import json
import sys

from tide_fleet.worker.engine import LLMEngine, SamplingParams


def main() -> None:
    engine = LLMEngine.from_pretrained(sys.argv[1], dtype="float32", device="cpu",
                                       num_kv_blocks=64, tensor_parallel_size=2)  # fmt: skip
    assert engine.ranks is not None
    print(json.dumps({"pids": [p.pid for p in engine.ranks.procs]}), flush=True)
    params = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)
    while True:
        engine.generate([[1, 400, 30, 50, 9]] * 4, params)


if __name__ == "__main__":
    main()
