"""Native CPU kernels (kernels/csrc) against plain torch on the same data."""

from __future__ import annotations

import pytest
import torch

from kernels import cpu as cpu_kernels

ops = cpu_kernels.ops()
pytestmark = pytest.mark.skipif(ops is None, reason="native CPU kernels could not be built here")


def reference_decode(q, k_cache, v_cache, tables, lens, scale):
    """Per row: gather its blocks, attend with every key up to its length (fp32)."""
    kvh, _, bs, hd = k_cache.shape
    group = q.shape[1] // kvh
    out = []
    for i, n in enumerate(lens.tolist()):
        blocks = tables[i, : -(-n // bs)]
        k = k_cache[:, blocks].reshape(kvh, -1, hd)[:, :n].float().repeat_interleave(group, 0)
        v = v_cache[:, blocks].reshape(kvh, -1, hd)[:, :n].float().repeat_interleave(group, 0)
        p = (torch.einsum("hd,hkd->hk", q[i].float(), k) * scale).softmax(-1)
        out.append(torch.einsum("hk,hkd->hd", p, v))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("hd", "group", "block_size"),
    [(8, 1, 1), (32, 3, 8), (64, 4, 16), (128, 8, 32), (64, 7, 16), (48, 2, 4)],
)
def test_paged_decode_attention_matches_reference(dtype, hd, group, block_size):
    gen = torch.Generator().manual_seed(hd * 10 + group)
    kvh, lens = 2, [1, 15, 16, 17, 100, 333]
    width = max(-(-n // block_size) for n in lens)
    num_blocks = len(lens) * width + 1
    k_cache = torch.randn(kvh, num_blocks, block_size, hd, generator=gen).to(dtype)
    v_cache = torch.randn(kvh, num_blocks, block_size, hd, generator=gen).to(dtype)
    tables = torch.randperm(num_blocks, generator=gen)[: len(lens) * width].view(len(lens), width)
    # q as a strided view, the way the model hands it over (q and k share one buffer).
    qk = torch.randn(len(lens), kvh * group + kvh, hd, generator=gen).to(dtype)
    q = qk[:, : kvh * group]
    context = torch.tensor(lens, dtype=torch.int32)
    scale = hd**-0.5
    got = ops.paged_decode_attention(q, k_cache, v_cache, tables.contiguous(), context, scale)
    ref = reference_decode(q, k_cache, v_cache, tables, context, scale)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), ref, atol=tol, rtol=tol)


def test_paged_decode_attention_rejects_lengths_past_the_table():
    k_cache = torch.zeros(1, 4, 16, 64)
    tables = torch.zeros(1, 2, dtype=torch.long)
    lens = torch.tensor([33], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"context length 33 of row 0 is outside 1\.\.32"):
        ops.paged_decode_attention(torch.zeros(1, 1, 64), k_cache, k_cache, tables, lens, 1.0)
