"""The token workloads the engine benchmarks replay (scripts/bench_engine.py,
scripts/bench_peers.py, scripts/bench_serve.py): (prompt ids, output length) pairs made
from a seed, so every engine in a comparison gets the same work. Standard library only."""

from __future__ import annotations

import math
import random

WORKLOADS = ("mixed", "long", "shared")


def mixed(n: int, seed: int, max_len: int) -> list[tuple[list[int], int]]:
    """Lognormal lengths, about 80% short and 20% long (heavy-tailed, like real traffic)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        long = rng.random() < 0.2
        p_mu, o_mu = (math.log(512), math.log(128)) if long else (math.log(48), math.log(32))
        plen = int(min(max(rng.lognormvariate(p_mu, 0.5), 4), 2048))
        olen = int(min(max(rng.lognormvariate(o_mu, 0.5), 4), 384))
        plen = min(plen, max_len - olen - 1)
        out.append(([1, *(rng.randrange(4, 260) for _ in range(plen - 1))], olen))
    return out


def make_workload(name: str, seed: int, max_len: int) -> list[tuple[list[int], int]]:
    """mixed: 200 requests of the mix above; long: 64 prompts of 2,000 tokens, 64 out each;
    shared: 64 requests behind one 1,024-token system prompt, 16 tokens of their own."""
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(4, 260) for _ in range(n)]

    if name == "mixed":
        return mixed(200, seed, max_len)
    if name == "long":
        plen = min(2000, max_len - 65)
        return [([1, *tokens(plen - 1)], 64) for _ in range(64)]
    if name == "shared":
        system = [1, *tokens(1023)]
        return [(system + tokens(16), 64) for _ in range(64)]
    raise ValueError(f"unknown workload {name!r}: {', '.join(WORKLOADS)}")
