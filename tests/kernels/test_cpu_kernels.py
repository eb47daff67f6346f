"""Native CPU kernels (kernels/csrc) against plain torch on the same data."""

from __future__ import annotations

import pytest
import torch

from tide_fleet.kernels import cpu as cpu_kernels

ops = cpu_kernels.ops()
pytestmark = pytest.mark.skipif(ops is None, reason="native CPU kernels could not be built here")
# The bf16 GEMV, and the one-call decode step built on it, need AVX-512 BF16: on a CPU
# without it (AMD Zen 2/3: AVX2 only) they are not offered and the engine runs torch's.
needs_gemv = pytest.mark.skipif(
    cpu_kernels.gemv_max_rows() == 0, reason="this CPU lacks AVX-512 BF16: no native GEMV"
)


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


@pytest.mark.parametrize("group", [1, 2, 4, 8, 16])
@pytest.mark.parametrize(("hd", "block_size"), [(32, 16), (64, 16), (128, 32)])
def test_bf16_decode_attention_on_tiles_matches_reference(group, hd, block_size):
    """Where AMX is granted, bf16 Q.K and P.V run on tiles 16 keys at a time, reading whole
    blocks: the rows past a context in its last block (NaN here) never reach an output."""
    gen = torch.Generator().manual_seed(group * 1000 + hd)
    kvh, lens = 2, [1, 15, 16, 17, 31, 100, 333]
    width = max(-(-n // block_size) for n in lens)
    num_blocks = len(lens) * width
    k_cache = torch.randn(kvh, num_blocks, block_size, hd, generator=gen).to(torch.bfloat16)
    v_cache = torch.randn(kvh, num_blocks, block_size, hd, generator=gen).to(torch.bfloat16)
    tables = torch.randperm(num_blocks, generator=gen).view(len(lens), width).contiguous()
    for i, n in enumerate(lens):  # every slot no context reaches is NaN
        rows = torch.arange(n, width * block_size)
        blocks, slots = tables[i, rows // block_size], rows % block_size
        k_cache[:, blocks, slots] = float("nan")
        v_cache[:, blocks, slots] = float("nan")
    q = torch.randn(len(lens), kvh * group, hd, generator=gen).to(torch.bfloat16)
    context = torch.tensor(lens, dtype=torch.int32)
    got = ops.paged_decode_attention(q, k_cache, v_cache, tables, context, hd**-0.5)
    ref = reference_decode(q, k_cache, v_cache, tables, context, hd**-0.5)
    torch.testing.assert_close(got.float(), ref, atol=2e-2, rtol=2e-2)


def test_bf16_decode_attention_takes_tiles_where_the_cpu_has_them():
    """The case above ran on tiles, not the VDPBF16PS loop, wherever the CPU has AMX."""
    has_amx = torch.cpu._is_amx_tile_supported() and torch.cpu._is_avx512_bf16_supported()
    assert ops.decode_attention_tiles() == has_amx


def test_paged_decode_attention_runs_rows_out_of_order_into_their_own_outputs():
    """The kernel runs (row, kv head) tasks longest first, not in row order: every row's
    output still lands in its own place, padding rows (length 0) stay zeros."""
    gen = torch.Generator().manual_seed(7)
    kvh, group, hd, bs = 4, 4, 64, 16
    lens = [700, 0, 650, 20, 3, 0, 400, 17, 90, 1, 64, 300] * 3
    width = max(-(-n // bs) for n in lens)
    num_blocks = len(lens) * width
    k_cache = torch.randn(kvh, num_blocks, bs, hd, generator=gen).to(torch.bfloat16)
    v_cache = torch.randn(kvh, num_blocks, bs, hd, generator=gen).to(torch.bfloat16)
    tables = torch.randperm(num_blocks, generator=gen).view(len(lens), width).contiguous()
    q = torch.randn(len(lens), kvh * group, hd, generator=gen).to(torch.bfloat16)
    context = torch.tensor(lens, dtype=torch.int32)
    got = ops.paged_decode_attention(q, k_cache, v_cache, tables, context, hd**-0.5)
    live = [i for i, n in enumerate(lens) if n]
    ref = reference_decode(q[live], k_cache, v_cache, tables[live], context[live], hd**-0.5)
    torch.testing.assert_close(got[live].float(), ref, atol=2e-2, rtol=2e-2)
    assert not got[[i for i, n in enumerate(lens) if not n]].any()


def test_decode_attention_runs_on_this_cpus_widest_vector_unit():
    """The cases above exercise the path this CPU built: on an AVX2-only CPU (AMD Zen 2/3)
    that is decode_avx2.h, not the scalar loop (which ran 23% of a mixed bench there)."""
    if torch.cpu._is_avx512_supported():
        expected = "avx512"
    elif torch.cpu._is_avx2_supported():
        expected = "avx2"
    else:
        expected = "scalar"
    assert ops.decode_attention_isa() == expected


def test_paged_decode_attention_rejects_lengths_past_the_table():
    k_cache = torch.zeros(1, 4, 16, 64)
    tables = torch.zeros(1, 2, dtype=torch.long)
    lens = torch.tensor([33], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"context length 33 of row 0 is outside 0\.\.32"):
        ops.paged_decode_attention(torch.zeros(1, 1, 64), k_cache, k_cache, tables, lens, 1.0)


GEMV_CASES = [
    *(("gemv_bf16", rows) for rows in (1, 2, 3, 16, 17, 33, 48, 64)),
    *(("gemv_bf16_vector", rows) for rows in (1, 2)),
]


@needs_gemv
@pytest.mark.parametrize(("path", "rows"), GEMV_CASES)
@pytest.mark.parametrize(("n", "k"), [(260, 1024), (1027, 64), (8, 32), (48, 2816)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_matches_linear(path, rows, n, k, with_bias):
    """Both paths (AMX tiles where the CPU has them, and the AVX-512 one CPUs without AMX
    run) at every row count they take: partial row tiles, a second pass of 32 rows, column
    groups past N (odd group counts padded to pairs)."""
    limit = cpu_kernels.gemv_max_rows()
    if path == "gemv_bf16_vector":
        limit = min(2, limit)
    if rows > limit:
        pytest.skip(f"{path} takes up to {limit} rows here")
    gen = torch.Generator().manual_seed(rows * n + k)
    w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    bias = torch.randn(n, generator=gen).to(torch.bfloat16) if with_bias else None
    got = getattr(ops, path)(x, ops.gemv_pack_bf16(w), bias, n)
    ref = torch.nn.functional.linear(x.float(), w.float(), None if bias is None else bias.float())
    assert got.shape == (rows, n) and got.dtype == torch.bfloat16
    # fp32 sums rounded once to bf16: within bf16 resolution of the exact result.
    torch.testing.assert_close(got.float(), ref, atol=2e-2 * k**0.5 / 8, rtol=1e-2)


@needs_gemv
def test_gemv_rejects_bad_shapes():
    w = ops.gemv_pack_bf16(torch.zeros(8, 64, dtype=torch.bfloat16))
    top = cpu_kernels.gemv_max_rows()
    with pytest.raises(RuntimeError, match=rf"gemv_bf16 takes 1\.\.{top} rows, got {top + 1}"):
        ops.gemv_bf16(torch.zeros(top + 1, 64, dtype=torch.bfloat16), w, None, 8)
    with pytest.raises(RuntimeError, match=r"gemv_bf16 takes 1\.\.2 rows, got 3"):
        ops.gemv_bf16_vector(torch.zeros(3, 64, dtype=torch.bfloat16), w, None, 8)
    with pytest.raises(RuntimeError, match="N 40 does not match the packed weight"):
        ops.gemv_bf16(torch.zeros(1, 64, dtype=torch.bfloat16), w, None, 40)
    with pytest.raises(RuntimeError, match="K % 32 == 0, got 48"):
        ops.gemv_pack_bf16(torch.zeros(8, 48, dtype=torch.bfloat16))


def test_linear_small_and_large_batches_agree_with_f_linear():
    from tide_fleet.kernels.linear import Linear

    gen = torch.Generator().manual_seed(3)
    w = torch.randn(96, 64, generator=gen).to(torch.bfloat16)
    layer = Linear(w)
    if cpu_kernels.gemv_max_rows():
        assert layer.gemv_rows == cpu_kernels.gemv_step_rows(), "bf16 weights take the native GEMV"
    else:
        assert layer.gemv_rows == 0, "no native GEMV on this CPU: every batch through torch"
    for rows in (1, 2, 7, 64, 65):
        x = torch.randn(rows, 64, generator=gen).to(torch.bfloat16)
        ref = torch.nn.functional.linear(x.float(), w.float())
        torch.testing.assert_close(layer(x).float(), ref, atol=5e-2, rtol=1e-2)


def hf_rms_norm(x, w, eps):
    """Hugging Face LlamaRMSNorm: fp32 statistics, rounded to the input dtype, times w."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * normed.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim", [96, 100])  # bf16: 16 lanes a step, and the loop past them
def test_rms_norm_and_residual_add(dtype, dim):
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(37, dim, generator=gen).to(dtype)
    delta = torch.randn(37, dim, generator=gen).to(dtype)
    w = torch.randn(dim, generator=gen).to(dtype)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.02, "rtol": 0.01}
    torch.testing.assert_close(ops.rms_norm(hidden, w, 1e-6), hf_rms_norm(hidden, w, 1e-6), **tol)
    summed = hidden + delta
    out = ops.add_rms_norm_(hidden, delta, w, 1e-6)
    assert torch.equal(hidden, summed), "the residual sum is written back into hidden"
    torch.testing.assert_close(out, hf_rms_norm(summed, w, 1e-6), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inter", [45, 2816])
def test_silu_mul(dtype, inter):
    gate_up = (torch.randn(5, 2 * inter, generator=torch.Generator().manual_seed(6)) * 8).to(dtype)
    gate_up[0, :6] = torch.tensor([-200.0, -90.0, -80.0, 0.0, 90.0, 200.0])  # past exp's range
    gate, up = gate_up.chunk(2, dim=-1)
    ref = torch.nn.functional.silu(gate) * up  # the module's own rounding in bf16
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.02, "rtol": 0.01}
    got = ops.silu_mul(gate_up)
    assert got.isfinite().all()
    torch.testing.assert_close(got, ref, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hd", [16, 48, 64, 128])  # 16 lanes per half from 32 up, a tail at 48
def test_rotary_in_place_touches_only_the_rotated_heads(dtype, hd):
    from tide_fleet.worker.models.rope import RotaryEmbedding, apply_rotary

    heads, extra = 3, 2
    rope = RotaryEmbedding(hd, 64, 10000.0, None, dtype, torch.device("cpu"))
    x = torch.randn(6, (heads + extra) * hd, generator=torch.Generator().manual_seed(7)).to(dtype)
    positions = torch.tensor([0, 5, 9, 63, 1, 2])
    cos, sin = rope.tables(positions)
    ref = apply_rotary(x[:, : heads * hd].view(6, heads, hd), cos, sin).reshape(6, -1)
    untouched = x[:, heads * hd :].clone()
    ops.rotary_(x, positions, rope.cos, rope.sin, heads, hd)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 0.02, "rtol": 0.01}
    torch.testing.assert_close(x[:, : heads * hd], ref, **tol)
    assert torch.equal(x[:, heads * hd :], untouched)
    with pytest.raises(RuntimeError, match=r"position 64 outside 0\.\.63"):
        ops.rotary_(x, torch.full((6,), 64), rope.cos, rope.sin, heads, hd)


class RecordingOps:
    """torch.ops.tide, remembering which ops the model looked up."""

    def __init__(self):
        self.called: set[str] = set()

    def __getattr__(self, name):
        self.called.add(name)
        return getattr(ops, name)


@needs_gemv
def test_one_call_decode_step_equals_the_op_by_op_loop(tiny_path):
    """tide::decode_layers runs the same kernels as LlamaModel._forward_native's loop."""
    from tests.conftest import assert_same_run, make_engine, record_logits
    from tide_fleet.worker.engine import SamplingParams

    def run(one_call: bool):
        engine = make_engine(tiny_path, dtype="bfloat16", num_kv_blocks=64)
        model = engine.runner.model
        assert model.decode_rows == 2
        if not one_call:  # neither whole-step call: the loop, op by op
            model.decode_rows = 0
            model._packed_weights = []
        model.native = counting = RecordingOps()
        calls = record_logits(model)
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        out = engine.generate([[1, 40, 41, 42], [1, 7, 8]], params)
        assert ("decode_layers" in counting.called) == one_call
        assert one_call or "step_layers_packed" not in counting.called
        return [o.token_ids for o in out], calls

    assert_same_run(run(one_call=True), run(one_call=False), min_steps=10)


@needs_gemv
def test_forced_attention_backend_bypasses_the_one_call_step(tiny_path):
    from tests.conftest import make_engine
    from tide_fleet.kernels import set_attention_backend
    from tide_fleet.worker.engine import SamplingParams

    engine = make_engine(tiny_path, dtype="bfloat16", num_kv_blocks=64, attention_backend="torch")
    try:
        model = engine.runner.model
        assert model.decode_rows == 2
        model.native = recording = RecordingOps()
        engine.generate([[1, 5, 6]], SamplingParams(max_tokens=5, temperature=0.0))
        assert "rms_norm" in recording.called and "decode_layers" not in recording.called
    finally:
        set_attention_backend("auto")
