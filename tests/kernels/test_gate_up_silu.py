"""tide::gate_up_silu_bf16 (cpu_gemv.cpp up to gemv_step_rows, cpu_gemm.cpp past them): SiLU(gate) *
up straight from gate|up's packed weight on AMX tiles, held bit for bit to silu_mul of the
projection it replaces; kernels/linear.py's Linear.silu_glu and the engine's steps take it."""

from __future__ import annotations

import pytest
import torch

from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels.linear import Linear

ops = cpu_kernels.ops()
pytestmark = pytest.mark.skipif(
    not cpu_kernels.gemm_rows_ready(), reason="no AMX tiles here: no fused gate|up"
)


def projection(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    if x.shape[0] <= cpu_kernels.gemv_step_rows():
        return ops.gemv_bf16(x, packed, None, n)
    return ops.gemm_bf16(x, packed, None, n)


@pytest.mark.parametrize("rows", [1, 2, 5, 16, 17, 33, 64, 65, 100, 300])
@pytest.mark.parametrize(("inter", "k"), [(2816, 1024), (48, 64), (16, 288)])
def test_fused_gate_up_equals_silu_mul_of_the_projection(rows, inter, k):
    gen = torch.Generator().manual_seed(rows * inter + k)
    w = (torch.randn(2 * inter, k, generator=gen) * 0.1).to(torch.bfloat16)
    x = (torch.randn(rows, k, generator=gen) * 2).to(torch.bfloat16)
    packed = ops.gemv_pack_bf16(w)
    want = ops.silu_mul(projection(x, packed, 2 * inter))
    got = ops.gate_up_silu_bf16(x, packed, inter)
    assert got.shape == (rows, inter) and got.dtype == torch.bfloat16
    assert torch.equal(got, want)


def test_fused_gate_up_rejects_what_it_cannot_split():
    w = torch.randn(96, 64).to(torch.bfloat16)
    packed = ops.gemv_pack_bf16(w)
    x = torch.randn(3, 64).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="intermediate must be a multiple of 16, got 24"):
        ops.gate_up_silu_bf16(x, packed, 24)
    with pytest.raises(RuntimeError, match="gate_up_silu_bf16"):
        ops.gate_up_silu_bf16(torch.randn(3, 32).to(torch.bfloat16), packed, 48)
    assert ops.gate_up_silu_bf16(x[:0], packed, 48).shape == (0, 48)


def test_linear_silu_glu_only_where_the_halves_are_whole_groups():
    gen = torch.Generator().manual_seed(3)
    w = (torch.randn(2 * 48, 64, generator=gen) * 0.1).to(torch.bfloat16)
    lin = Linear(w)
    assert lin.fuses_silu
    x = torch.randn(2, 70, 64, generator=gen).to(torch.bfloat16)  # 3-d, past the GEMV's rows
    assert torch.equal(lin.silu_glu(x), ops.silu_mul(lin(x).view(-1, 96)).view(2, 70, 48))
    assert not Linear(w, bias=torch.zeros(96, dtype=torch.bfloat16)).fuses_silu
    assert not Linear(w[:48]).fuses_silu  # halves of 24 columns


@pytest.mark.parametrize("one_call", [True, False])
def test_bf16_steps_take_the_fused_gate_up(tiny_path, one_call):
    from torch.profiler import ProfilerActivity, profile

    from tests.conftest import make_engine
    from tide_fleet.worker.engine import SamplingParams

    engine = make_engine(tiny_path, dtype="bfloat16", num_kv_blocks=64, max_num_seqs=8)
    model = engine.runner.model
    assert all(layer.gate_up.fuses_silu for layer in model.layers)
    if not one_call:
        model._packed_weights = []
    prompts = [[1, *range(10, 10 + n)] for n in (3, 17, 80, 9)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    names = {e.name for e in prof.events()}
    assert "tide::gate_up_silu_bf16" in names
    assert "tide::silu_mul" not in names
