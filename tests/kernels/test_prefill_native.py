"""The native bf16 prefill attention kernel (kernels/csrc/cpu_prefill.cpp) and the shared-prefix
decode kernel against fp32 attention on the same bf16 data: query groups, head sizes, block
sizes, chunks after cached prefixes that are not block aligned, scattered blocks, strided
queries, and the inputs they refuse. Every test runs on each pass this CPU has: AVX-512
BF16 dot products, and AMX tiles where present."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tide_fleet.kernels import cpu as cpu_kernels


def cpu_flags() -> set[str]:
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0]
    except OSError:
        return set()
    return {f for line in first.splitlines() if line.startswith("flags") for f in line.split()}


FLAGS = cpu_flags()
PASSES = ["avx512_bf16"] + (["amx"] if "amx_bf16" in FLAGS else [])

# Skipped only on CPUs without AVX-512 BF16: where it has it, a kernel that fails to build
# fails here.
pytestmark = pytest.mark.skipif("avx512_bf16" not in FLAGS, reason="this CPU has no AVX-512 BF16")


@pytest.fixture(params=PASSES, autouse=True)
def attention_pass(request):
    """Each test once per pass: the vector pass forced where tiles would run."""
    ops = cpu_kernels.ops()
    ops.attention_pass_prefer_vector(request.param == "avx512_bf16")
    try:
        assert cpu_kernels.attention_pass_isa() == request.param
        yield request.param
    finally:
        ops.attention_pass_prefer_vector(False)


def test_the_kernel_is_offered_here():
    assert cpu_kernels.native_prefill(), "AVX-512 BF16 CPU, but the kernel is not built"


def reference(q, k_cache, v_cache, table, start, scale):
    """fp32 softmax attention of q [L, H, D] at positions start.. against the cached K/V."""
    L, H, D = q.shape
    kvh, _, bs, _ = k_cache.shape
    ctx = start + L
    k = k_cache.view(kvh, -1, bs * D).index_select(1, table).view(kvh, -1, D)[:, :ctx].float()
    v = v_cache.view(kvh, -1, bs * D).index_select(1, table).view(kvh, -1, D)[:, :ctx].float()
    k, v = (t.repeat_interleave(H // kvh, dim=0) for t in (k, v))
    scores = torch.einsum("qhd,hkd->hqk", q.float(), k) * scale
    visible = torch.arange(ctx)[None, :] <= torch.arange(start, ctx)[:, None]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return torch.einsum("hqk,hkd->qhd", probs, v)


def cache_and_table(gen, kvh, ctx, bs, d):
    num_blocks = -(-ctx // bs) + 5
    k_cache = torch.randn(kvh, num_blocks, bs, d, generator=gen).to(torch.bfloat16)
    v_cache = torch.randn(kvh, num_blocks, bs, d, generator=gen).to(torch.bfloat16)
    table = torch.randperm(num_blocks, generator=gen)[: -(-ctx // bs) + 1]  # one spare block
    return k_cache, v_cache, table


@pytest.mark.parametrize(
    ("L", "start", "heads", "kvh", "d", "bs"),
    [
        (1, 0, 4, 4, 64, 16),  # one token, no group
        (5, 3, 4, 2, 64, 16),  # a prefix inside the first block
        (100, 0, 16, 4, 64, 16),  # a fresh prompt, group 4 (the bench model's shape)
        (17, 1000, 16, 4, 64, 16),  # a short chunk after a long prefix: mostly unmasked
        (64, 64, 8, 1, 32, 32),  # group 8, head_dim 32, block 32
        (300, 77, 12, 4, 128, 16),  # head_dim 128 (output rows in memory), group 3
        (130, 63, 6, 6, 64, 4),  # block size 4; key blocks cross the diagonal mid-tile
    ],
)
def test_matches_fp32_attention(L, start, heads, kvh, d, bs):
    gen = torch.Generator().manual_seed(L * 1000 + start + d)
    k_cache, v_cache, table = cache_and_table(gen, kvh, start + L, bs, d)
    # q as the model passes it: a view into the fused qkv rows (row stride > heads * d).
    qkv = torch.randn(L, heads * d + 2 * kvh * d, generator=gen).to(torch.bfloat16)
    q = qkv[:, : heads * d].view(L, heads, d)
    scale = d**-0.5
    got = cpu_kernels.ops().prefill_attention(q, k_cache, v_cache, table, start, scale)
    want = reference(q, k_cache, v_cache, table, start, scale)
    assert got.shape == (L, heads, d) and got.dtype == torch.bfloat16
    # bf16 output rounding is 2^-8 relative; the probabilities go through bf16 too.
    torch.testing.assert_close(got.float(), want, atol=1.5e-2, rtol=1.5e-2)


def test_large_scores_stay_finite_and_exact():
    """Scores far apart (one key dominating by ~100 nats, then a later larger one): the
    running maximum has to move mid-row and rescale what was accumulated."""
    gen = torch.Generator().manual_seed(7)
    L, heads, kvh, d, bs = 200, 4, 1, 64, 16
    k_cache, v_cache, table = cache_and_table(gen, kvh, L, bs, d)
    q = torch.randn(L, heads, d, generator=gen).to(torch.bfloat16)
    first, later = table[0].item(), table[9].item()  # keys 0 and 144
    k_cache[0, first, 0] = (q[:, 0].float().mean(0) * 12).to(torch.bfloat16)
    k_cache[0, later, 0] = (q[:, 0].float().mean(0) * 40).to(torch.bfloat16)
    got = cpu_kernels.ops().prefill_attention(q, k_cache, v_cache, table, 0, d**-0.5)
    want = reference(q, k_cache, v_cache, table, 0, d**-0.5)
    assert torch.isfinite(got.float()).all()
    torch.testing.assert_close(got.float(), want, atol=1.5e-2, rtol=1.5e-2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dtype": torch.float32}, "bfloat16 only"),
        ({"d": 48}, "multiple of 32"),
        ({"short_table": True}, "the chunk needs"),
        ({"heads": 6}, "not a multiple of kv heads"),
    ],
)
def test_refuses_what_it_cannot_do(change, message):
    d, heads, kvh, L = change.get("d", 64), change.get("heads", 8), 4, 40
    k_cache = torch.zeros(kvh, 8, 16, d, dtype=change.get("dtype", torch.bfloat16))
    q = torch.zeros(L, heads, d, dtype=k_cache.dtype)
    table = torch.arange(2 if change.get("short_table") else 4)
    with pytest.raises(RuntimeError, match=message):
        cpu_kernels.ops().prefill_attention(q, k_cache, k_cache.clone(), table, 10, 0.125)


def shared_prefix_rows(gen, n, kvh, heads, d, bs, shared_blocks, own):
    """n decode rows whose tables start with the same `shared_blocks` blocks, then `own[i]`
    keys of their own in blocks of their own; their K/V random."""
    own_blocks = [-(-o // bs) for o in own]
    num_blocks = shared_blocks + sum(own_blocks) + 2
    k_cache = torch.randn(kvh, num_blocks, bs, d, generator=gen).to(torch.bfloat16)
    v_cache = torch.randn(kvh, num_blocks, bs, d, generator=gen).to(torch.bfloat16)
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    prefix, rest = perm[:shared_blocks], perm[shared_blocks:]
    width = shared_blocks + max(own_blocks)
    tables = torch.zeros(n, width, dtype=torch.long)
    for i, nb in enumerate(own_blocks):
        row, rest = prefix + rest[:nb], rest[nb:]
        tables[i, : len(row)] = torch.tensor(row)
    lens = torch.tensor([shared_blocks * bs + o for o in own], dtype=torch.int32)
    q = torch.randn(n, heads, d, generator=gen).to(torch.bfloat16)
    return q, k_cache, v_cache, tables, lens


@pytest.mark.parametrize(
    ("n", "heads", "kvh", "d", "bs", "shared_blocks"),
    [(64, 16, 4, 64, 16, 64), (5, 8, 1, 32, 16, 7), (9, 12, 4, 128, 32, 3), (3, 4, 4, 64, 4, 33)],
)
def test_shared_prefix_decode_matches_each_row_alone(n, heads, kvh, d, bs, shared_blocks):
    gen = torch.Generator().manual_seed(n * 7 + d)
    own = [int(x) for x in torch.randint(0, 90, (n,), generator=gen)]  # 0: only the prefix
    q, k_cache, v_cache, tables, lens = shared_prefix_rows(
        gen, n, kvh, heads, d, bs, shared_blocks, own
    )
    scale = d**-0.5
    got = cpu_kernels.ops().decode_shared_prefix(
        q, k_cache, v_cache, tables, lens, shared_blocks * bs, scale
    )
    for i in range(n):  # row i is the last query of its sequence: it sees every key
        ctx = int(lens[i])
        want = reference(q[i : i + 1], k_cache, v_cache, tables[i], ctx - 1, scale)
        torch.testing.assert_close(got[i : i + 1].float(), want, atol=1.5e-2, rtol=1.5e-2)


def test_shared_prefix_decode_refuses_rows_that_do_not_share():
    gen = torch.Generator().manual_seed(3)
    q, k_cache, v_cache, tables, lens = shared_prefix_rows(gen, 4, 2, 8, 64, 16, 4, [5, 6, 7, 8])
    tables[2, 1] = tables[2, 4]  # row 2's second block is its own, not the shared one
    with pytest.raises(RuntimeError, match="does not share"):
        cpu_kernels.ops().decode_shared_prefix(q, k_cache, v_cache, tables, lens, 64, 0.125)
    with pytest.raises(RuntimeError, match="multiple of block_size"):
        cpu_kernels.ops().decode_shared_prefix(q, k_cache, v_cache, tables, lens, 40, 0.125)
