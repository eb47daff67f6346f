#!/usr/bin/env python3
"""The torch sampling path on cut rows: drawn among each row's top candidates against the
whole-row sort, side by side on the same rows (the same tokens, checked).

Rows with top-p 0.9 alone and with top-k 50 + top-p 0.9, at 8 and 64 rows of a 49,152
(SmolLM2) and a 128,256 (Llama 3) vocabulary, float32 logits of two kinds: "peaked" (a few
dozen tokens carry most of the mass, as a model's next-token distribution), "flat" (N(0, 3)
logits: the top-p share lies far past the candidates, so both sort the row) and "mixed" (a
quarter of the rows flat: only those sort their row). Best
of five wall-clock milliseconds per call and the whole-row/candidates ratio, on the CPU.

    python scripts/bench_sampling.py
"""

from __future__ import annotations

import platform
import time

import torch

from tide_fleet.kernels import sampling


def rows(kind: str, n: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if kind == "flat":
        return torch.randn(n, vocab, generator=g) * 3
    x = torch.randn(n, vocab, generator=g)
    x[:, torch.randperm(vocab, generator=g)[:30]] += torch.linspace(16.0, 6.0, 30)
    if kind == "mixed":  # a quarter of the rows flat
        x[: n // 4] = torch.randn(n // 4, vocab, generator=g) * 3
    return x


def best_ms(fn, repeats: int = 5) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def cpu_name() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it (the platform's name elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()


def paths(x, u, top_k, top_p, widest):  # type: ignore[no-untyped-def]
    """(candidates first, every whole row sorted): each a call returning the tokens."""

    def candidates() -> torch.Tensor:
        return sampling.sample_rows(x.clone(), u, top_k, top_p, widest)[0]

    def whole() -> torch.Tensor:
        threshold = sampling.cut_thresholds(x.clone(), top_k, top_p, widest)
        return sampling.inverse_cdf(x.clone(), u, threshold)[0]

    return candidates, whole


def main() -> int:
    print(f"# {cpu_name()}, {torch.get_num_threads()} threads")
    print("| logits | rows | vocab | cut | candidates ms | whole row ms | ratio | same tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for kind in ("peaked", "mixed", "flat"):
        for n, vocab in ((8, 49152), (64, 49152), (64, 128256)):
            x = rows(kind, n, vocab)
            u = torch.tensor([sampling.row_uniform(1, i) for i in range(n)], dtype=torch.float64)
            p = torch.full((n,), 0.9)
            for cut, k, widest in (("top-p", vocab, None), ("top-k 50 + top-p", 50, 50)):
                top_k = torch.full((n,), k, dtype=torch.long)

                candidates, whole = paths(x, u, top_k, p, widest)
                fast, slow = best_ms(candidates), best_ms(whole)
                same = bool((candidates() == whole()).all())
                print(f"| {kind} | {n} | {vocab:,} | {cut} | {fast:.2f} | {slow:.2f} | "
                      f"{slow / fast:.2f} | {same} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
