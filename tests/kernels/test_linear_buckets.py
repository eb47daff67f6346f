"""The packed CPU matmul's row buckets (kernels/linear.py): every row count maps to a bucket
at least as large and at most one step larger, the warm-up list holds exactly the buckets
real calls land in, and padded calls give F.linear's answer on the real rows, for bf16 and
float32 weights with and without a bias."""

from __future__ import annotations

import pytest
import torch

from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels import linear
from tide_fleet.kernels.linear import Linear, packed_row_buckets, packed_rows


@pytest.fixture
def onednn(monkeypatch):  # type: ignore[no-untyped-def]
    """Linears built in the test take oneDNN's packed matmul past the GEMV, as on a CPU
    without AMX (with AMX, bf16 takes the native GEMM there: no buckets, no pieces), and in
    float32 as on a CPU with AVX-512 (without it, float32 takes the native AVX2 GEMM)."""
    monkeypatch.setattr(cpu_kernels, "gemm_rows_ready", lambda: False)
    monkeypatch.setattr(cpu_kernels, "gemm_f32_preferred", lambda: False)


def test_every_row_count_lands_in_a_listed_bucket_close_above_it():
    max_rows = 1024
    buckets = packed_row_buckets(max_rows)
    assert buckets == sorted(set(buckets)), "buckets are distinct and ascending"
    seen = set()
    for rows in range(1, max_rows + 1):
        padded = packed_rows(rows)
        step = linear.SMALL_STEP if rows <= linear.SMALL_ROWS else linear.LARGE_STEP
        assert rows <= padded < rows + step, (rows, padded)
        seen.add(padded)
    assert seen == set(buckets), "warm-up builds exactly the buckets calls use"
    assert len(buckets) == 64 // 8 + (1024 - 64) // 64  # 8 small, 15 large


@pytest.mark.parametrize("max_rows", [1, 5, 64, 65, 100, 1000])
def test_buckets_cover_small_limits(max_rows):
    buckets = packed_row_buckets(max_rows)
    assert {packed_rows(r) for r in range(1, max_rows + 1)} == set(buckets)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("matmul", ["default", "onednn"])
def test_padded_calls_match_f_linear_on_the_real_rows(dtype, with_bias, matmul, request):
    if matmul == "onednn":
        request.getfixturevalue("onednn")
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(80, 64, generator=gen).to(dtype)
    bias = torch.randn(80, generator=gen).to(dtype) if with_bias else None
    layer = Linear(w, bias)
    layer.warm_up(200)
    for rows in (3, 9, 64, 65, 130, 200):
        x = torch.randn(rows, 64, generator=gen).to(dtype)
        got = layer(x)
        assert got.shape == (rows, 80)
        ref = torch.nn.functional.linear(
            x.float(), w.float(), None if bias is None else bias.float()
        )
        tol = dict(atol=5e-2, rtol=1e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.float(), ref, **tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_calls_split_into_row_pieces_match_f_linear(dtype, onednn):
    gen = torch.Generator().manual_seed(12)
    w = torch.randn(48, 32, generator=gen).to(dtype)
    layer = Linear(w, torch.randn(48, generator=gen).to(dtype))
    if not layer.packed:
        pytest.skip("oneDNN's packed matmul is not available here")
    layer.split_rows = 128
    for rows in (100, 128, 129, 300, 513):
        x = torch.randn(rows, 32, generator=gen).to(dtype)
        ref = torch.nn.functional.linear(x.float(), w.float(), layer.bias.float())
        tol = dict(atol=5e-2, rtol=1e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(layer(x).float(), ref, **tol)


class FakeClock:
    """Stands in for time.perf_counter: each oneDNN call advances it by cost(rows)."""

    def __init__(self, cost) -> None:  # type: ignore[no-untyped-def]
        self.now, self.cost = 0.0, cost

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("cost", "expected"),
    [
        (lambda rows: rows * (2.0 if rows > 512 else 1.0), linear.SPLIT_ROWS),  # a cliff
        (lambda rows: float(rows), 0),  # linear in rows: pieces gain nothing
        (lambda rows: 10.0 + rows, 0),  # a fixed cost per call: pieces lose
    ],
)
def test_choose_row_split_keeps_pieces_only_where_they_are_faster(
    monkeypatch, cost, expected, onednn
):
    clock = FakeClock(cost)
    monkeypatch.setattr(linear.time, "perf_counter", clock)

    def fake_onednn(self, x):  # type: ignore[no-untyped-def]
        clock.now += clock.cost(x.shape[0])
        return torch.zeros(x.shape[0], self.out_features, dtype=x.dtype)

    monkeypatch.setattr(Linear, "_onednn", fake_onednn)
    monkeypatch.setattr(linear, "_packed_linear_works", lambda dtype=None: True)
    # No real packing: oneDNN refuses bf16 weights on CPUs without AVX-512 (an AVX2 EPYC).
    monkeypatch.setattr(linear, "_onednn_pack", lambda weight: weight)
    layers = [Linear(torch.zeros(16, 32, dtype=torch.bfloat16)) for _ in range(3)]
    assert linear.choose_row_split(layers, 1000) == expected
    assert [lin.split_rows for lin in layers] == [expected] * 3
    assert linear.choose_row_split(layers, linear.SPLIT_ROWS) == 0, "nothing to split"
    fp32 = [Linear(torch.zeros(16, 32)) for _ in range(3)]
    assert linear.choose_row_split(fp32, 1000) == 0, "float32 is not timed"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_steps_padded_once_in_the_model_equal_projections_padded_each(tiny_path, dtype, onednn):
    """LlamaModel pads a step's rows to the packed matmul's bucket once (token 0 at position
    0, never attended) instead of each projection padding its input: the logits and tokens
    are bit for bit those of the per-projection padding."""
    from tests.conftest import assert_same_run, make_engine, record_logits
    from tide_fleet.worker.engine import SamplingParams

    def run(pad_once: bool):
        engine = make_engine(tiny_path, dtype=dtype, num_kv_blocks=64)
        model = engine.runner.model
        if not model.layers[0].qkv.packed:
            pytest.skip("oneDNN's packed matmul is not available here")
        if not pad_once:
            model._padded_rows = lambda n: n
        qkv, seen = model.layers[0].qkv, []
        packed = qkv._packed

        def recording_packed(x):
            seen.append(x.shape[0])
            return packed(x)

        qkv._packed = recording_packed
        logits = record_logits(model)
        prompts = [[1, *range(40, 40 + n)] for n in (3, 10, 21, 5, 30)]
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        tokens = [o.token_ids for o in engine.generate(prompts, params)]
        # Padded once, every call of the packed matmul already has a bucket's row count.
        assert all(packed_rows(r) == r for r in seen) == pad_once, seen
        return tokens, logits

    assert_same_run(run(pad_once=True), run(pad_once=False), min_steps=3)
