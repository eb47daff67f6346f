#!/usr/bin/env python3
"""The sampler before and after batching (issue 15, item 5), side by side in one run.

    python scripts/bench_sampler.py                  # vocab 32k, batch 1/16/64, CPU
    python scripts/bench_sampler.py --device cuda --vocab 128256

"old" is the previous sampler's choice step, kept only here: a full-vocabulary sort of
every random row, then one torch.multinomial and one .item() (a host sync) per row, with
one torch.Generator per seeded request. "new" is tide_fleet.worker.engine.sampler.Sampler. Both get
the same logits and the same requests; the last line is one JSON object with the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from tide_fleet.kernels.sampling import top_k_top_p_mask
from tide_fleet.worker.engine.request import Request
from tide_fleet.worker.engine.sampler import Sampler
from tide_fleet.worker.engine.sampling_params import SamplingParams


class OldChoose:
    """The previous Sampler._choose, verbatim in behaviour."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.generators: dict[str, torch.Generator] = {}
        self.default = torch.Generator(device=device)
        self.default.seed()

    def generator(self, request: Request) -> torch.Generator:
        seed = request.params.seed
        if seed is None:
            return self.default
        gen = self.generators.get(request.request_id)
        if gen is None:
            gen = torch.Generator(device=self.device).manual_seed(seed)
            self.generators[request.request_id] = gen
        return gen

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        greedy = logits.argmax(dim=-1).tolist()
        params = [r.params for r in requests]
        random_rows = [i for i, p in enumerate(params) if not p.is_greedy]
        if not random_rows:
            return list(greedy)
        out = list(greedy)
        dev, vocab = logits.device, logits.shape[-1]
        rows = torch.tensor(random_rows, device=dev)
        temps = torch.tensor([params[i].temperature for i in random_rows], device=dev)
        top_k = torch.tensor(
            [params[i].top_k if params[i].top_k > 0 else vocab for i in random_rows], device=dev
        )
        top_p = torch.tensor([params[i].top_p for i in random_rows], device=dev)
        scaled = logits[rows] / temps.unsqueeze(1)
        sorted_logits, sorted_ids = scaled.sort(dim=-1, descending=True)
        sorted_logits = sorted_logits.masked_fill(
            top_k_top_p_mask(sorted_logits, top_k, top_p), float("-inf")
        )
        probs = torch.softmax(sorted_logits, dim=-1)
        for j, i in enumerate(random_rows):
            pick = torch.multinomial(probs[j], 1, generator=self.generator(requests[i]))
            out[i] = int(sorted_ids[j, pick].item())
        return out


CASES = {
    "greedy": dict(temperature=0.0),
    "t1": dict(temperature=1.0),
    "t1_seeded": dict(temperature=1.0, seed=1),
    "t0.8_topk50_topp0.9": dict(temperature=0.8, top_k=50, top_p=0.9),
}


def median_ms(fn, device: torch.device, reps: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    results = {}
    print(f"{'case':<22}{'batch':>6}{'old ms':>10}{'new ms':>10}{'old/new':>9}")
    for name, kwargs in CASES.items():
        for batch in (int(b) for b in args.batches.split(",")):
            logits = torch.randn(batch, args.vocab, device=device) * 3
            reqs = [Request(f"r{i}", [1], SamplingParams(**kwargs)) for i in range(batch)]
            old, new = OldChoose(device), Sampler(device, seed=0)
            old(logits.clone(), reqs)  # warm both
            new.sample(logits.clone(), reqs)
            old_ms = median_ms(lambda o=old, x=logits, r=reqs: o(x.clone(), r), device, args.reps)
            new_ms = median_ms(
                lambda s=new, x=logits, r=reqs: s.sample(x.clone(), r), device, args.reps
            )
            key = f"{name}_b{batch}"
            results[key] = {"old_ms": round(old_ms, 3), "new_ms": round(new_ms, 3),
                            "ratio": round(old_ms / new_ms, 2)}  # fmt: skip
            print(f"{name:<22}{batch:>6}{old_ms:>10.3f}{new_ms:>10.3f}{old_ms / new_ms:>8.2f}x")
    print(json.dumps({"vocab": args.vocab, "device": str(device), "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
