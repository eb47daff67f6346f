"""Every prefill chunk of a step in one native call (tide::prefill_attention_varlen): the same
answer as one tide::prefill_attention call per chunk, bit for bit, whether chunks share
whole key blocks of a cached prefix (packed once), share blocks only partly, or share
nothing; and the inputs it refuses. On each pass this CPU has (the fixture)."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_prefill_native import FLAGS, attention_pass, reference  # noqa: F401
from tide_fleet.kernels import cpu as cpu_kernels

pytestmark = pytest.mark.skipif("avx512_bf16" not in FLAGS, reason="this CPU has no AVX-512 BF16")

HEADS, KVH, D, BS = 8, 2, 64, 16


def step(chunks, gen, first_row=3):
    """chunks: (start_pos, length, table) per chunk. Returns the step's q (with first_row
    decode-like rows in front), caches and the varlen arguments."""
    width = max(len(t) for _, _, t in chunks)
    blocks = 1 + max(max(t) for _, _, t in chunks)
    k_cache = torch.randn(KVH, blocks, BS, D, generator=gen).to(torch.bfloat16)
    v_cache = torch.randn(KVH, blocks, BS, D, generator=gen).to(torch.bfloat16)
    total = first_row + sum(n for _, n, _ in chunks)
    q = torch.randn(total, HEADS, D, generator=gen).to(torch.bfloat16)
    lens = torch.tensor([0] + [n for _, n, _ in chunks]).cumsum(0).to(torch.int32)
    starts = torch.tensor([s for s, _, _ in chunks], dtype=torch.int32)
    tables = torch.zeros(len(chunks), width, dtype=torch.long)
    for i, (_, _, t) in enumerate(chunks):
        tables[i, : len(t)] = torch.tensor(t)
    return q, k_cache, v_cache, lens, starts, tables, first_row


def per_chunk(q, k_cache, v_cache, lens, starts, tables, first_row, scale):
    ops, out = cpu_kernels.ops(), []
    for i in range(len(starts)):
        rows = slice(first_row + int(lens[i]), first_row + int(lens[i + 1]))
        n_blocks = -(-(int(starts[i]) + rows.stop - rows.start) // BS)
        table = tables[i, :n_blocks].contiguous()
        out.append(ops.prefill_attention(q[rows], k_cache, v_cache, table, int(starts[i]), scale))
    return torch.cat(out)


SHARED = list(range(64))  # a 1,024-token prefix: 16 whole 64-key blocks
CASES = {
    "shared prefix, own tails": [(1024, 16, [*SHARED, 64 + i]) for i in range(5)],
    "shared prefix, one chunk still prefilling it": [
        (0, 300, SHARED[:19]),
        (1024, 20, [*SHARED, 70, 71]),
    ],
    "partly shared blocks": [(40, 10, [0, 1, 2, 3]), (40, 30, [0, 1, 2, 4, 5])],
    "nothing shared": [(0, 40, [5, 6, 7]), (17, 50, [1, 2, 3, 4, 8]), (0, 1, [9])],
    "same tables, different lengths": [
        (64, 5, [0, 1, 2, 3, 4]),
        (64, 60, [0, 1, 2, 3, 4, 5, 6, 7]),
    ],
}


@pytest.mark.parametrize("case", list(CASES))
def test_one_call_equals_one_call_per_chunk(case):
    gen = torch.Generator().manual_seed(len(case))
    q, k_cache, v_cache, lens, starts, tables, first = step(CASES[case], gen)
    scale = D**-0.5
    out = torch.full_like(q, 7.0)
    cpu_kernels.ops().prefill_attention_varlen(
        q, k_cache, v_cache, lens, starts, tables, first, scale, out
    )
    expected = per_chunk(q, k_cache, v_cache, lens, starts, tables, first, scale)
    assert torch.equal(out[first:], expected)
    assert (out[:first] == 7.0).all(), "rows before first_row are left alone"
    s0, n0, t0 = CASES[case][0]  # and against fp32 attention, for the first chunk
    ref = reference(q[first : first + n0], k_cache, v_cache, torch.tensor(t0), s0, scale)
    torch.testing.assert_close(out[first : first + n0].float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lens": torch.tensor([0, 5, 900], dtype=torch.int32)}, "run past q's"),
        ({"starts": torch.tensor([1024, 2000], dtype=torch.int32)}, "chunk 1 needs"),
        ({"lens": torch.tensor([0, 5, 10])}, "query_start int32"),
        ({"tables": torch.zeros(3, 66, dtype=torch.long)}, r"block_tables int64 \[P, width\]"),
    ],
)
def test_refuses_what_it_cannot_do(change, message):
    gen = torch.Generator().manual_seed(3)
    q, k_cache, v_cache, lens, starts, tables, first = step(
        [(1024, 5, [*SHARED, 64]), (1024, 5, [*SHARED, 65])], gen
    )
    args = {"lens": lens, "starts": starts, "tables": tables} | change
    with pytest.raises(RuntimeError, match=message):
        cpu_kernels.ops().prefill_attention_varlen(
            q, k_cache, v_cache, args["lens"], args["starts"], args["tables"], first, 0.1,
            torch.empty_like(q),
        )  # fmt: skip
