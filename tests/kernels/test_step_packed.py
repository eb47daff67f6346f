"""tide::step_layers_packed: a step past decode_layers' rows (decode rows, prefill chunks,
or both), every layer in one native call, its projections on the GEMV's weights up to its
rows (bf16) and past them on the native GEMM (AMX) or oneDNN's packed weights, against the
op-by-op Python loop it replaces (LlamaModel._forward_native): the same tokens and the same
logits, bit for bit."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import assert_same_run, make_engine, record_logits
from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels.linear import _packed_linear_works
from tide_fleet.worker.engine import SamplingParams

ops = cpu_kernels.ops()
pytestmark = [
    pytest.mark.skipif(ops is None, reason="native CPU kernels could not be built here"),
    pytest.mark.skipif(
        not torch.backends.mkldnn.is_available() or not _packed_linear_works(torch.float32),
        reason="no oneDNN packed matmul in this torch",
    ),
]


def take_onednn(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Engines built after this take oneDNN's packed matmul past the GEMV, as on a CPU
    without AMX (on one with AMX, bf16 takes the native GEMM there by default), and in
    float32 as on a CPU with AVX-512 (without it, float32 takes the native AVX2 GEMM)."""
    monkeypatch.setattr(cpu_kernels, "gemm_rows_ready", lambda: False)
    monkeypatch.setattr(cpu_kernels, "gemm_f32_preferred", lambda: False)


class Spy:
    """torch.ops.tide, remembering which ops the model looked up."""

    def __init__(self) -> None:
        self.called: set[str] = set()

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        self.called.add(name)
        return getattr(ops, name)


def run(path, dtype: str, prompts: list[list[int]], one_call: bool, warm: list[int] | None = None,
        split: int = 0, **config):  # fmt: skip
    engine = make_engine(path, dtype=dtype, num_kv_blocks=128, max_num_seqs=8, **config)
    model = engine.runner.model
    for layer in model.layers:  # row pieces, as choose_row_split may pick them
        for lin in (layer.qkv, layer.o, layer.gate_up, layer.down):
            lin.split_rows = split
    gemm = dtype == "bfloat16" and cpu_kernels.gemm_rows_ready()
    if dtype == "bfloat16" and not gemm and not _packed_linear_works(torch.bfloat16):
        pytest.skip("no oneDNN packed bf16 matmul here")
    assert model._packed_weights, "the packed one-call step was not set up"
    assert all(lin.gemm == gemm for lay in model.layers for lin in (lay.qkv, lay.down))
    if not one_call:
        model._packed_weights = []
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    if warm is not None:  # cache a prefix first: the prompts then share its blocks
        engine.generate([warm], SamplingParams(max_tokens=1, temperature=0.0))
    model.native = spy = Spy()
    logits = record_logits(model)
    packed_step = model._packed_step

    def recording_step(hidden, positions, kv_caches, meta):  # type: ignore[no-untyped-def]
        step_kinds.add((bool(meta.decode_groups), bool(meta.prefills)))
        return packed_step(hidden, positions, kv_caches, meta)

    model._packed_step = recording_step
    out = engine.generate(prompts, params)
    assert ("step_layers_packed" in spy.called) == one_call
    return [o.token_ids for o in out], logits


step_kinds: set[tuple[bool, bool]] = set()  # (decode rows, prefill chunks) of the one-call steps


@pytest.mark.parametrize(
    ("dtype", "matmul"),
    [("float32", "onednn"), ("float32", "native"), ("bfloat16", "native"), ("bfloat16", "onednn")],
)
def test_one_call_packed_step_equals_the_op_by_op_loop(tiny_path, dtype, matmul, monkeypatch):
    """Five rows of different lengths: in float32 on oneDNN padded to the packed bucket (8),
    the padding rows never written to the cache nor attended, or on the native AVX2 GEMM
    (CPUs without AVX-512), unpadded; in bf16 on the GEMV's weights where it takes five
    rows (AMX), unpadded, and past them on the GEMM or oneDNN's."""
    if matmul == "onednn":
        take_onednn(monkeypatch)
    elif dtype == "float32" and not cpu_kernels.gemm_f32_preferred():
        pytest.skip("AVX-512 or no AVX2 here: float32 takes oneDNN's packed matmul")
    prompts = [[1, *range(10, 10 + n)] for n in (3, 17, 40, 9, 26)]
    a = run(tiny_path, dtype, prompts, one_call=True)
    b = run(tiny_path, dtype, prompts, one_call=False)
    assert_same_run(a, b, min_steps=8)


def test_rows_sharing_a_cached_prefix_take_the_shared_kernel(monkeypatch):
    """Five rows behind a cached 288-token prefix (head_dim 32, bf16): the step attends the
    prefix once for all rows (decode_shared_prefix), in one call as op by op."""
    import tide_fleet.worker.models.llama_native as llama
    from tide_fleet.kernels.attention import native_prefill
    from tide_fleet.worker.models.resolve import resolve_model_path

    if not native_prefill(torch.bfloat16, 32):
        pytest.skip("no AMX or AVX-512 BF16: no shared-prefix decode kernel here")
    shared: list[int] = []
    real = llama.cpp_decode_shared_tokens

    def spy(*args):  # type: ignore[no-untyped-def]
        shared.append(real(*args))
        return shared[-1]

    monkeypatch.setattr(llama, "cpp_decode_shared_tokens", spy)
    path = resolve_model_path("dummy:small")
    prefix = [1, *((7 * i) % 250 + 4 for i in range(287))]
    prompts = [[*prefix, 40 + i, 41 + i] for i in range(5)]
    a = run(path, "bfloat16", prompts, one_call=True, warm=prefix)
    assert max(shared) >= 256, shared
    b = run(path, "bfloat16", prompts, one_call=False, warm=prefix)
    assert_same_run(a, b, min_steps=8)


@pytest.mark.parametrize("matmul", ["native", "onednn"])
def test_mixed_steps_and_row_pieces_equal_the_op_by_op_loop(matmul, monkeypatch):
    """Prefill chunks beside decode rows (bf16, head_dim 32: the native prefill kernel), a
    700-token prompt in one step, on the native GEMM (AMX) or oneDNN's packed matmul with
    every projection also forced into 256-row pieces."""
    from tide_fleet.kernels.attention import native_prefill
    from tide_fleet.worker.models.resolve import resolve_model_path

    if not native_prefill(torch.bfloat16, 32):
        pytest.skip("no AMX or AVX-512 BF16: prefill chunks take SDPA here")
    if matmul == "native" and not cpu_kernels.gemm_rows_ready():
        pytest.skip("no AMX here: no native GEMM")
    if matmul == "onednn":
        take_onednn(monkeypatch)
    path = resolve_model_path("dummy:small")
    prompts = [[1, *((5 * i + n) % 250 + 4 for i in range(n))] for n in (700, 6, 90, 13, 300)]
    step_kinds.clear()
    for split in (0, 256) if matmul == "onednn" else (0,):
        a = run(path, "bfloat16", prompts, one_call=True, split=split, max_num_batched_tokens=1024)
        b = run(path, "bfloat16", prompts, one_call=False, split=split, max_num_batched_tokens=1024)
        assert_same_run(a, b, min_steps=8)
    assert step_kinds == {(False, True), (True, True), (True, False)}, step_kinds


def test_more_decode_rows_than_padded_rows_is_refused(tiny_path):
    engine = make_engine(tiny_path, dtype="float32", num_kv_blocks=16)
    model = engine.runner.model
    cfg, layers = model.config, len(model.layers)
    kv = engine.runner.kv_caches
    with pytest.raises(RuntimeError, match="9 decode rows and 9 step rows in 8 padded rows"):
        ops.step_layers_packed(
            torch.zeros(8, cfg.hidden_size), torch.zeros(8, dtype=torch.long),
            model._packed_weights, [], [k for k, _ in kv][:layers], [v for _, v in kv][:layers],
            torch.zeros(9, dtype=torch.long), torch.zeros(9, 4, dtype=torch.long),
            torch.ones(9, dtype=torch.int32), 0, None, None, None, 0, [0, 0, 0, 0], [1, 1, 1, 1],
            [], 0,
            model.rope.cos, model.rope.sin, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
            1e-5, 0.25,
        )  # fmt: skip


def test_a_profile_of_a_whole_step_call_names_the_kernels_inside(tiny_path):
    """bench_peers' op split reads the profiler: the one-call steps record every kernel
    they call under its own name (cpu_ops.h), not as one opaque op."""
    from torch.profiler import ProfilerActivity, profile

    engine = make_engine(tiny_path, dtype="float32", num_kv_blocks=64, max_num_seqs=8)
    prompts = [[1, *range(10, 10 + n)] for n in (3, 17, 40, 9)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    under_step = {
        e.name
        for e in prof.events()
        if e.cpu_parent is not None and e.cpu_parent.name == "tide::step_layers_packed"
    }
    f32 = engine.runner.model.layers[0].qkv.f32
    matmul = "tide::gemm_f32" if f32 else "mkldnn::_linear_pointwise"
    inside = {"tide::paged_decode_attention", "tide::write_kv_cache", "tide::rotary_",
              "tide::silu_mul", "tide::add_rms_norm_", matmul}  # fmt: skip
    assert inside <= under_step, inside - under_step
