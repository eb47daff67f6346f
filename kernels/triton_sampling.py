"""Every row of a step sampled in one Triton launch: greedy, temperature, top-k and top-p, with
the semantics of ``kernels/sampling.py`` (its docstring defines them; its torch path is the
reference this kernel is held to, token for token, in tests/kernels/test_triton_sampling.py).

One program per row loops over the vocabulary in ``BLOCK``-wide chunks (a 128k-256k row does
not fit on chip). Passes over a row's logits:

1. max and first argmax of s = x / T (x for a greedy row), the row's smallest and largest
   order-preserving int32 keys of s, and whether it holds a NaN. A greedy row ends here.
2. top-k (0 < k < V): the k-th largest value by bisection over the keys in [min, max]:
   the largest key K with count(key >= K) >= k. Each step is one counting pass; the range
   closes in at most 32 steps, and the result is exact (it is an element's key).
3. top-p (p < 1): one pass for the mass of the top-k-kept tokens, then bisection in
   [t_k, max] for the smallest key K whose strictly-larger kept mass is < p x that mass;
   each step one pass summing exp(s - max) in float64.
4. the kept tokens' float64 total, then the inverse CDF at u in vocabulary order: a
   ``tl.cumsum`` per chunk with the running float64 offset folded into its first element
   (the offset after the last chunk is the total, so the CDF ends exactly there), stopping
   at the first chunk holding an index past the target.

Cost model (unmeasured on a GPU): a greedy or temperature-only row reads its logits 1 or 3
times; a row with top-k or top-p about 3 + 32 times, with both about 4 + 64 (the bisection
stops early when the keys' range is narrow). On the GPU ``exp`` is libdevice's (CUDA's
``expf``, what torch uses, though Triton links it flushing subnormal results, weights below
e^-87 of the top one, to zero) rather than Triton's approximate ``ex2``; float64 sums are
added in another order than torch's, so the paths can differ only where u x total or p x
mass falls within a few ulps of a boundary.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from tide_fleet.kernels.launch import launch
from tide_fleet.kernels.triton_rounding import STRICT

__all__ = ["BLOCK", "sample"]

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK = 1024  # vocabulary entries per chunk
KEY_HI = tl.constexpr(2147483647)  # above every key
KEY_LO = tl.constexpr(-2147483647)  # below every key but a negative NaN's (-inf: -2139095041)


@triton.jit  # type: ignore[untyped-decorator]
def _exp(x, ACCURATE: tl.constexpr):  # type: ignore[no-untyped-def]
    if ACCURATE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit  # type: ignore[untyped-decorator]
def _chunk(base, start, V, t, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    """(indices, in the row, s = x / t with -0.0 made +0.0, its int32 order key)."""
    i = start + tl.arange(0, BLOCK)
    valid = i < V
    x = tl.load(base + i, mask=valid, other=float("-inf")).to(tl.float32)
    s = tl.div_rn(x, t)
    s = tl.where(s == 0.0, 0.0, s)
    bits = s.to(tl.int32, bitcast=True)
    return i, valid, s, tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit  # type: ignore[untyped-decorator]
def _count_from(base, V, t, cut, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    """How many tokens have key >= cut."""
    count = tl.zeros((), tl.int64)
    for start in range(0, V, BLOCK):
        _, valid, _, key = _chunk(base, start, V, t, BLOCK)
        count += tl.sum((valid & (key >= cut)).to(tl.int64), 0)
    return count


@triton.jit  # type: ignore[untyped-decorator]
def _mass_from(  # type: ignore[no-untyped-def]
    base, V, t, top, cut, BLOCK: tl.constexpr, ABOVE: tl.constexpr, ACCURATE: tl.constexpr
):
    """The float64 sum of exp(s - top) over tokens with key > cut (ABOVE) or >= cut."""
    mass = tl.zeros((), tl.float64)
    for start in range(0, V, BLOCK):
        _, valid, s, key = _chunk(base, start, V, t, BLOCK)
        if ABOVE:  # noqa: SIM108 (a constexpr branch, not a select)
            kept = valid & (key > cut)
        else:
            kept = valid & (key >= cut)
        w = tl.where(kept, _exp(s - top, ACCURATE), 0.0)
        mass += tl.sum(w.to(tl.float64), 0)
    return mass


@triton.jit  # type: ignore[untyped-decorator]
def _sample_kernel(  # type: ignore[no-untyped-def]
    logits, stride, temperature, top_k, top_p, uniform, tokens, bad, V,
    BLOCK: tl.constexpr, ACCURATE: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    base = logits + row * stride
    t = tl.load(temperature + row).to(tl.float32)
    is_random = t > 0.0
    t = tl.where(is_random, t, 1.0)  # greedy: s = x
    lane = tl.arange(0, BLOCK)

    # 1. max, first argmax, key range, NaN
    top = tl.full((), float("-inf"), tl.float32)
    arg = tl.zeros((), tl.int64)
    key_min = tl.full((), KEY_HI, tl.int32)
    key_max = tl.full((), KEY_LO, tl.int32)
    nans = tl.zeros((), tl.int32)
    for start in range(0, V, BLOCK):
        i, valid, s, key = _chunk(base, start, V, t, BLOCK)
        nans += tl.sum((s != s).to(tl.int32), 0)
        key_min = tl.minimum(key_min, tl.min(tl.where(valid, key, KEY_HI), 0))
        key_max = tl.maximum(key_max, tl.max(tl.where(valid, key, KEY_LO), 0))
        chunk_max = tl.max(s, 0)
        chunk_arg = tl.min(tl.where(s == chunk_max, i, V), 0).to(tl.int64)
        arg = tl.where(chunk_max > top, chunk_arg, arg)
        top = tl.maximum(top, chunk_max)
    token = arg
    failed = (nans > 0) | (top == float("-inf"))

    if is_random:
        failed = failed | (top == float("inf"))
        k = tl.load(top_k + row).to(tl.int64)
        p = tl.load(top_p + row).to(tl.float32)
        cut = key_min.to(tl.int64)  # the smallest kept key
        # 2. top-k: the largest key K with count(key >= K) >= k
        if (k > 0) & (k < V):
            hi = key_max.to(tl.int64)
            while cut < hi:
                mid = cut + (hi - cut + 1) // 2
                enough = _count_from(base, V, t, mid.to(tl.int32), BLOCK) >= k
                cut = tl.where(enough, mid, cut)
                hi = tl.where(enough, hi, mid - 1)
        # 3. top-p: the smallest K >= t_k whose strictly larger kept mass is < p x kept mass
        if p < 1.0:
            kept_mass = _mass_from(base, V, t, top, cut.to(tl.int32), BLOCK, False, ACCURATE)
            need = p.to(tl.float64) * kept_mass
            hi = key_max.to(tl.int64)
            while cut < hi:
                mid = cut + (hi - cut) // 2
                above = _mass_from(base, V, t, top, mid.to(tl.int32), BLOCK, True, ACCURATE)
                small = above < need
                hi = tl.where(small, mid, hi)
                cut = tl.where(small, cut, mid + 1)
        # 4. the kept tokens' total, as the CDF pass below adds it up
        total = tl.zeros((), tl.float64)
        for start in range(0, V, BLOCK):
            _, valid, s, key = _chunk(base, start, V, t, BLOCK)
            w = tl.where(valid & (key >= cut), _exp(s - top, ACCURATE), 0.0).to(tl.float64)
            total = tl.max(tl.cumsum(tl.where(lane == 0, w + total, w), 0), 0)
        target = tl.load(uniform + row).to(tl.float64) * total
        at_end = target >= total  # u x total rounded up to the total: the last kept mass
        found = tl.full((), -1, tl.int64)
        offset = tl.zeros((), tl.float64)
        start = tl.zeros((), tl.int32)
        while (found < 0) & (start < V):
            i, valid, s, key = _chunk(base, start, V, t, BLOCK)
            w = tl.where(valid & (key >= cut), _exp(s - top, ACCURATE), 0.0).to(tl.float64)
            cdf = tl.cumsum(tl.where(lane == 0, w + offset, w), 0)
            hit = valid & tl.where(at_end, cdf >= target, cdf > target)
            first = tl.min(tl.where(hit, i, V), 0).to(tl.int64)
            found = tl.where(first < V, first, found)
            offset = tl.max(cdf, 0)
            start += BLOCK
        token = tl.where(found >= 0, found, arg)
    tl.store(tokens + row, tl.minimum(tl.maximum(token, 0), V - 1))  # in range, even if bad
    tl.store(bad + row, failed)


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    uniform: torch.Tensor,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [N] int64, bad [N] bool) for logits [N, V] (float; unit last stride) and per
    row temperature (0: greedy), top_k (<= 0 or >= V: off), top_p (1: off) and u in [0, 1)
    (any numeric dtypes, read as float32, int64, float32, float64), all on one device.

    One launch, nothing read back to the host. ``block``: the chunk width (tests use small
    ones to cross chunk edges); by default ``BLOCK``, or the vocabulary rounded up to a
    power of two where that is smaller."""
    if logits.dim() != 2 or logits.stride(1) != 1 or not logits.dtype.is_floating_point:
        raise ValueError(
            "sample: logits must be [rows, vocab] floats with unit last stride; got "
            f"{tuple(logits.shape)} {logits.dtype} strides {logits.stride()}"
        )
    n, vocab = logits.shape
    options = [t.contiguous() for t in (temperature, top_k, top_p, uniform)]
    if any(t.shape != (n,) for t in options):
        raise ValueError(f"sample: temperature, top_k, top_p and u must be [{n}]")
    tokens = torch.empty(n, dtype=torch.long, device=logits.device)
    bad = torch.empty(n, dtype=torch.bool, device=logits.device)
    if n == 0:
        return tokens, bad
    width = block or min(BLOCK, triton.next_power_of_2(vocab))
    args = dict(
        logits=logits, stride=logits.stride(0), temperature=options[0], top_k=options[1],
        top_p=options[2], uniform=options[3], tokens=tokens, bad=bad, V=vocab,
    )  # fmt: skip
    constexprs = dict(
        BLOCK=width, ACCURATE=not INTERPRETED, num_warps=8 if width >= 1024 else 4, **STRICT
    )
    launch(_sample_kernel, (n,), "sample", args, constexprs)
    return tokens, bad
