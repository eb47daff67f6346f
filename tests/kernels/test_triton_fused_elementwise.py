"""The fused elementwise Triton kernels through ``Elementwise`` (kernels/elementwise.py):
taken where the kernel table names triton (on CPU: forced, in Triton's interpreter), the
torch reference for a call they do not take, the fused RoPE + KV write only where rope and
kv_write both take triton, and a model's greedy tokens kept on them."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_engine
from tests.kernels.test_triton_fused import (
    DEVICE,
    EPS,
    INTERPRETED,
    fused,
    kv_case,
    needs_triton,
    randn,
    ref_norm,
    ref_rotary,
    same,
    strided,
)
from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels import dispatch
from tide_fleet.kernels.elementwise import Elementwise
from tide_fleet.kernels.launch import record_launches
from tide_fleet.worker.engine import SamplingParams

pytestmark = needs_triton


@pytest.fixture
def forced(monkeypatch):  # type: ignore[no-untyped-def]
    def force(value: str) -> None:
        monkeypatch.setenv(dispatch.FORCE_VAR, value)
        dispatch.refresh()

    monkeypatch.delenv(dispatch.FORCE_VAR, raising=False)
    dispatch.refresh()
    yield force
    monkeypatch.delenv(dispatch.FORCE_VAR, raising=False)
    dispatch.refresh()


def test_elementwise_takes_triton_where_the_table_names_it(forced):
    force_all = "norm=triton,rope=triton,activation=triton,kv_write=triton"
    forced(force_all if INTERPRETED else "")
    glue = Elementwise(cpu_kernels.ops() if INTERPRETED else None, torch.device(DEVICE))
    assert (glue.triton_norm, glue.triton_rope, glue.triton_activation) == (True,) * 3
    assert not (glue.native_norm or glue.native_rope or glue.native_activation)
    dtype, rows, hd = torch.bfloat16, 3, 64
    x, w = strided(rows, 256, dtype), randn(256, dtype=dtype, seed=1)
    same(glue.rms_norm(x, w, EPS), fused().rms_norm(x, w, EPS), exact=True)
    gate_up = randn(rows, 512, dtype=dtype)
    same(glue.silu_mul(gate_up), fused().silu_mul(gate_up), exact=True)
    wide = randn(rows, fused().MAX_NORM_DIM + 8)  # past the kernel: the torch reference
    torch.testing.assert_close(glue.rms_norm(wide, wide[0], EPS), ref_norm(wide, None, wide[0])[0])
    case = kv_case(rows, hd, dtype, [5, -1, 40])
    qkv, positions, cos, sin, k_cache, v_cache, slot_mapping = case
    want = ref_rotary(qkv, positions, cos, sin, 10, hd)
    assert glue.rotary_kv_write_(qkv, positions, cos, sin, 8, 2, hd, k_cache, v_cache,
                                 slot_mapping)  # fmt: skip
    same(qkv, want, exact=True)
    same(k_cache.view(2, -1, hd)[:, 40], want[2].view(12, hd)[8:10], exact=True)


@pytest.mark.skipif(not INTERPRETED, reason="forces triton on the CPU")
def test_the_fused_rope_and_kv_write_needs_both_on_triton(forced):
    forced("rope=triton,kv_write=torch")
    glue = Elementwise(cpu_kernels.ops(), torch.device("cpu"))
    qkv, positions, cos, sin, k_cache, v_cache, slot_mapping = kv_case(3, 64, torch.float32,
                                                                       [0, 1, 2])  # fmt: skip
    before = qkv.clone()
    assert not glue.rotary_kv_write_(qkv, positions, cos, sin, 8, 2, 64, k_cache, v_cache,
                                     slot_mapping)  # fmt: skip
    assert torch.equal(qkv, before) and bool((k_cache == 7).all())
    glue.rotary_(qkv, positions, cos, sin, 10, 64)  # what the caller then does
    same(qkv, ref_rotary(before, positions, cos, sin, 10, 64), exact=True)
    forced("")
    assert not Elementwise(cpu_kernels.ops(), torch.device("cpu")).rotary_kv_write_(
        qkv, positions, cos, sin, 8, 2, 64, k_cache, v_cache, slot_mapping
    )


def greedy_bf16(path) -> tuple[list[int], list[torch.Tensor]]:  # type: ignore[no-untyped-def]
    """One short greedy request on the tiny model in bf16: its tokens and its steps' logits."""
    engine = make_engine(
        path, dtype="bfloat16", num_kv_blocks=16, max_num_seqs=1, max_num_batched_tokens=16
    )
    logits: list[torch.Tensor] = []
    forward = engine.runner.model.forward
    engine.runner.model.forward = lambda *args: logits.append(forward(*args)) or logits[-1]
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    return engine.generate([[1, 40, 41, 42, 7]], params)[0].token_ids, logits


@pytest.mark.skipif(not INTERPRETED, reason="forces triton on the CPU")
def test_a_model_on_the_triton_elementwise_ops_keeps_the_greedy_tokens(forced, tiny_path):
    default = greedy_bf16(tiny_path)
    forced("norm=triton,rope=triton,activation=triton")
    with record_launches() as keys:
        triton = greedy_bf16(tiny_path)
    assert {"rms_norm", "add_rms_norm_", "rotary_"} <= {key[0] for key in keys}
    assert triton[0] == default[0]
    for a, b in zip(default[1], triton[1], strict=True):
        torch.testing.assert_close(a, b, atol=0.1, rtol=0)


@pytest.mark.skipif(not INTERPRETED, reason="forces triton on the CPU")
def test_the_cuda_forward_takes_the_fused_kernels_and_keeps_the_tokens(forced, tiny_path):
    """The model's own loop (what CUDA runs), on the CPU: with the table on its torch
    references, then with the elementwise ops and the KV write on Triton, where RoPE and the
    cache write are one launch. float32: the same greedy tokens."""
    prompts = [[1, 40, 41, 42, 7], [1, *range(60, 90)]]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)

    def run() -> tuple[list[list[int]], set[str]]:
        engine = make_engine(tiny_path, "float32", num_kv_blocks=32, max_num_batched_tokens=16)
        engine.runner.model.native = None  # the loop CUDA runs
        with record_launches() as keys:
            tokens = [o.token_ids for o in engine.generate(prompts, params)]
        return tokens, {key[0] for key in keys}

    forced("norm=torch,rope=torch,activation=torch,kv_write=torch")
    reference, _ = run()
    forced("norm=triton,rope=triton,activation=triton,kv_write=triton")
    fused, launched = run()
    assert {"rms_norm", "add_rms_norm_", "rotary_kv_write_", "silu_mul"} <= launched
    assert "rotary_" not in launched and "write_kv_cache" not in launched
    assert fused == reference
