#!/usr/bin/env python3
"""vLLM's CPU backend on a workload file: the peer of scripts/bench_peers.py.

Runs in the peers' own virtualenv (`make bench-peers` makes .venv-peers), never Tide's:

    .venv-peers/bin/python scripts/peer_vllm.py --model FOLDER --workload work.json

The workload file is a list of [prompt token ids, output tokens]. Every request is greedy
with ignore_eos, so both engines produce exactly the asked number of tokens. Model load and
vLLM's compile are excluded from the timing (reported apart). The last line is one JSON
object: output tokens, seconds, tok/s, TTFT p50/p99 (from vLLM's per-request metrics, when it
keeps them), load seconds.
"""

from __future__ import annotations

import json
import os
import statistics
import time

# Only standard-library modules from Tide: this runs in the peers' virtualenv.
from tide_fleet.infra.bench.peer_args import peer_parser
from tide_fleet.infra.stats import percentile


def ttft_of(out: object) -> float | None:
    """Seconds from arrival to the first token: vLLM v1 keeps it as `first_token_latency`
    (its other timestamps mix a wall clock and a monotonic one); older ones as times."""
    m = getattr(out, "metrics", None)
    if m is None:
        return None
    latency = getattr(m, "first_token_latency", None)
    if latency:
        return float(latency)
    first, arrival = getattr(m, "first_token_time", None), getattr(m, "arrival_time", None)
    return float(first) - float(arrival) if first and arrival else None


def main() -> None:
    parser = peer_parser(__doc__)
    parser.add_argument("--kv-cache-gib", type=int, default=4)
    parser.add_argument("--no-prefix-caching", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.kv_cache_gib))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with open(args.workload) as f:
        work = json.load(f)
    t0 = time.perf_counter()
    llm = LLM(
        model=args.model, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=not args.no_prefix_caching, disable_log_stats=False, seed=0,
    )  # fmt: skip
    warm = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=[1, 5, 6])], warm, use_tqdm=False)
    load_s = time.perf_counter() - t0
    prompts = [TokensPrompt(prompt_token_ids=p) for p, _ in work]
    params = [SamplingParams(max_tokens=o, temperature=0.0, ignore_eos=True) for _, o in work]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    ttfts = [t for t in (ttft_of(o) for o in outs) if t is not None]
    result = {
        "tokens": tokens, "seconds": wall, "tok_per_s": tokens / wall, "load_s": load_s,
        "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
        "ttft_p99_s": percentile(ttfts, 99) if ttfts else None,
    }  # fmt: skip
    print(json.dumps(result))


if __name__ == "__main__":
    main()
