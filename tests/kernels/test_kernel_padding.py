"""What padded rows (CUDA graphs pad a decode batch to a captured size) must not break:
a KV write to slot -1 is skipped, and a zero-length context attends to nothing (zeros,
never 0/0). Torch reference, native CPU kernel and Triton (interpreter on CPU) alike."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_attention import dense_reference
from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels import set_attention_backend, write_kv_cache
from tide_fleet.kernels import torch_attention as ta
from tide_fleet.kernels.attention_metadata import DecodeGroup

GUARD = 4096  # elements either side of the cache, so a stray write lands somewhere we can see


@pytest.fixture(params=["torch", "cpp", "triton"])
def backend(request):
    if request.param == "triton":
        pytest.importorskip("triton")
    if request.param == "cpp" and cpu_kernels.ops() is None:
        pytest.skip("the native CPU kernels did not build here")
    set_attention_backend(request.param)
    yield request.param
    set_attention_backend("auto")


def guarded_cache(shape: tuple[int, ...], fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, cache): the cache is a view into the middle of a larger filled buffer."""
    numel = torch.Size(shape).numel()
    buf = torch.full((GUARD + numel + GUARD,), fill)
    return buf, buf[GUARD : GUARD + numel].view(shape)


def test_kv_write_skips_padding_slots(backend):
    kvh, blocks, bs, hd = 2, 3, 16, 16
    kbuf, k_cache = guarded_cache((kvh, blocks, bs, hd), 7.0)
    vbuf, v_cache = guarded_cache((kvh, blocks, bs, hd), 7.0)
    slots = torch.tensor([-1, 5, -1, 40, -1])
    key = torch.randn(5, kvh, hd)
    value = torch.randn(5, kvh, hd)
    write_kv_cache(key, value, k_cache, v_cache, slots)
    for buf, cache, src in ((kbuf, k_cache, key), (vbuf, v_cache, value)):
        flat = cache.view(kvh, -1, hd)
        torch.testing.assert_close(flat[:, 5], src[1])
        torch.testing.assert_close(flat[:, 40], src[3])
        untouched = torch.ones(blocks * bs, dtype=torch.bool)
        untouched[[5, 40]] = False
        assert (flat[:, untouched] == 7.0).all(), "a padding row wrote into the cache"
        assert (buf[:GUARD] == 7.0).all() and (buf[-GUARD:] == 7.0).all(), (
            "a padding row wrote outside the cache"
        )


def _decode(backend, query, k_cache, v_cache, tables, context, scale):
    if backend == "triton":
        from tide_fleet.kernels import triton_decode

        return triton_decode.decode_attention(
            query, k_cache, v_cache, tables, context, scale, int(context.max())
        )
    if backend == "cpp":
        return cpu_kernels.ops().paged_decode_attention(
            query, k_cache, v_cache, tables, context, scale
        )
    group = DecodeGroup(slice(0, len(context)), tables, context, int(context.max()))
    return ta.decode_attention(query, k_cache, v_cache, group, scale)


@pytest.mark.parametrize("lengths", [[0, 20], [0], [37, 0, 5]])
def test_zero_length_context_gives_zeros_not_nan(backend, lengths):
    gen = torch.Generator().manual_seed(len(lengths))
    kvh, heads, bs, hd = 2, 4, 16, 16
    width = max(1, -(-max(lengths) // bs))
    k_cache = torch.randn(kvh, width * len(lengths), bs, hd, generator=gen)
    v_cache = torch.randn(kvh, width * len(lengths), bs, hd, generator=gen)
    tables = torch.arange(width * len(lengths)).view(len(lengths), width)
    query = torch.randn(len(lengths), heads, hd, generator=gen)
    context = torch.tensor(lengths, dtype=torch.int32)
    out = _decode(backend, query, k_cache, v_cache, tables, context, hd**-0.5)
    assert torch.isfinite(out).all(), "0/0 in the reduction"
    for i, n in enumerate(lengths):
        if n == 0:
            assert (out[i] == 0).all()
            continue
        # The sequence's K/V in order, then the last query row of a dense causal pass.
        k = k_cache[:, tables[i]].reshape(kvh, -1, hd)[:, :n].transpose(0, 1)
        v = v_cache[:, tables[i]].reshape(kvh, -1, hd)[:, :n].transpose(0, 1)
        q = torch.zeros(n, heads, hd)
        q[-1] = query[i]
        ref = dense_reference(q, k, v, hd**-0.5)[-1]
        torch.testing.assert_close(out[i], ref, atol=2e-3, rtol=2e-3)
