"""The kernel table (kernels/dispatch.py): it covers every op on every hardware class, the
code takes what it names, TIDE_KERNELS forces an op (and is refused with the variable, the
op and the accepted implementations named), and docs/architecture.md shows the same table."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, make_engine
from tide_fleet.kernels import attention, dispatch
from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels.linear import Linear
from tide_fleet.worker.engine import SamplingParams

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def fresh_table(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.delenv(dispatch.FORCE_VAR, raising=False)
    dispatch.refresh()
    yield
    attention.set_attention_backend("auto")
    attention.set_native_prefill(True)
    monkeypatch.delenv(dispatch.FORCE_VAR, raising=False)
    dispatch.refresh()


def force(monkeypatch, value: str) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv(dispatch.FORCE_VAR, value)
    dispatch.refresh()


def test_the_table_covers_every_op_on_every_class():
    assert set(dispatch.TABLE) == set(dispatch.OPS) == set(dispatch.ALSO)
    for op in dispatch.OPS:
        assert set(dispatch.TABLE[op]) == set(dispatch.CLASSES), op
        for cls in dispatch.CLASSES:
            choice = dispatch.TABLE[op][cls]
            assert choice.reason, (op, cls)
            assert dispatch.runs_on(choice.impl, cls) or dispatch.is_native(choice.impl)
            assert dispatch.accepted(op, cls)[0] == choice.impl
    assert dispatch.cpu_class() in dispatch.CLASSES


def test_the_docs_show_the_table():
    docs = (ROOT / "docs" / "architecture.md").read_text()
    assert dispatch.markdown() in docs, "docs/architecture.md: paste dispatch.markdown()"
    assert dispatch.FORCE_VAR in docs


def test_describe_names_what_the_code_picks_here():
    table = {op: row.impl for op, row in dispatch.describe(CPU).items()}
    assert all(row.source == "default" for row in dispatch.describe(CPU).values())
    if dispatch.cpu_class() == "cpu-avx512bf16":
        assert table == {
            "gemv": "cpp-avx512bf16", "gemm": "onednn", "decode_attention": "cpp-avx512bf16",
            "prefill_attention": "cpp-avx512bf16", "norm": "cpp-avx512bf16",
            "rope": "cpp-avx512bf16", "activation": "cpp-avx512bf16", "kv_write": "cpp",
            "sampling": "torch", "lora": "cpp",
        }  # fmt: skip
    bf16 = Linear(torch.randn(64, 64).to(torch.bfloat16))
    assert (bf16.gemv_weight is not None) == dispatch.is_native(table["gemv"])
    assert bf16.gemm == (table["gemm"] == "cpp-amx")
    assert attention.decode_reads_rows_in_place(CPU, torch.bfloat16) == dispatch.is_native(
        table["decode_attention"]
    )
    assert attention.native_prefill(torch.bfloat16, 32) == dispatch.is_native(
        table["prefill_attention"]
    )
    assert (cpu_kernels.ops() is None) == (dispatch.cpu_class() == "cpu-no-native")


def test_the_variable_forces_ops(monkeypatch):
    force(monkeypatch, " gemm=torch, decode_attention=torch,gemv=gemm ")
    rows = dispatch.describe(CPU)
    assert (rows["gemm"].impl, rows["gemm"].source) == ("torch", "forced")
    assert (rows["decode_attention"].impl, rows["decode_attention"].source) == ("torch", "forced")
    assert rows["norm"].source == "default"
    linear = Linear(torch.randn(64, 64).to(torch.bfloat16))
    assert linear.gemv_weight is None and not linear.packed and not linear.gemm
    assert not attention.decode_reads_rows_in_place(CPU, torch.float32)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("gemx=torch", r"TIDE_KERNELS: unknown op 'gemx'; the ops are gemv, gemm, "),
        ("gemm", r"TIDE_KERNELS: 'gemm' is not op=impl"),
        ("norm=onednn", r"TIDE_KERNELS: norm='onednn' does not run on this machine .*; "
         r"norm accepts .*torch"),
    ],
)  # fmt: skip
def test_a_bad_force_names_the_variable_the_op_and_the_choices(monkeypatch, value, message):
    force(monkeypatch, value)
    with pytest.raises(ValueError, match=message):
        dispatch.impl("gemm", CPU)


def test_an_implementation_of_another_class_is_refused_here(monkeypatch):
    here = set(dispatch.machine_classes())
    elsewhere = {dispatch.TABLE["gemm"][cls].impl for cls in dispatch.CLASSES}
    foreign = sorted(elsewhere - {i for cls in here for i in dispatch.accepted("gemm", cls)})
    force(monkeypatch, f"gemm={foreign[0]}")
    with pytest.raises(ValueError, match=rf"gemm='{foreign[0]}' does not run on this machine"):
        dispatch.impl("gemm", CPU)


def test_the_attention_backend_forces_the_three_attention_ops(monkeypatch):
    attention.set_attention_backend("torch")
    rows = dispatch.describe(CPU)
    for op in attention.OPS:
        assert (rows[op].impl, rows[op].source) == ("torch", "forced")
        assert "--attention-backend" in rows[op].reason
    attention.set_attention_backend("auto")
    assert all(row.source == "default" for row in dispatch.describe(CPU).values())
    attention.set_native_prefill(False)
    assert dispatch.impl("prefill_attention", CPU) == "torch"
    assert not attention.native_prefill(torch.bfloat16, 32)
    force(monkeypatch, "decode_attention=torch")
    attention.set_attention_backend("auto")  # lifts its own forces only
    assert dispatch.impl("decode_attention", CPU) == "torch"
    assert dispatch.impl("prefill_attention", CPU) == "torch"


def test_sampling_takes_triton_on_cuda_and_may_be_forced_either_way(monkeypatch):
    assert dispatch.TABLE["sampling"]["cuda"].impl == "triton"
    assert dispatch.accepted("sampling", "cuda") == ("triton", "torch")
    for cls in dispatch.CLASSES[1:]:
        assert dispatch.accepted("sampling", cls) == ("torch", "triton")  # triton: interpreted
    force(monkeypatch, "sampling=triton")
    row = dispatch.describe(CPU)["sampling"]
    assert (dispatch.impl("sampling", CPU), row.impl, row.source) == ("triton", "triton", "forced")
    assert dispatch.impl("sampling", "meta") == "torch"


def test_other_devices_take_the_torch_reference():
    assert dispatch.impl("gemm", "meta") == "torch"
    assert dispatch.impl("gemv", torch.device("meta")) == "gemm"
    assert not dispatch.is_default(("norm",), torch.device("meta"))


def greedy(path, dtype: str) -> tuple[list[list[int]], list[torch.Tensor]]:  # type: ignore[no-untyped-def]
    engine = make_engine(path, dtype=dtype, num_kv_blocks=64, max_num_seqs=4)
    logits: list[torch.Tensor] = []
    forward = engine.runner.model.forward
    engine.runner.model.forward = lambda *args: logits.append(forward(*args)) or logits[-1]
    prompts = [[1, 40, 41, 42], [1, *range(7, 30)], [1, 5, 6]]
    out = engine.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    return [o.token_ids for o in out], logits


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forcing_torch_matmuls_and_attention_keeps_the_greedy_tokens(monkeypatch, tiny_path, dtype):
    default = greedy(tiny_path, dtype)
    force(monkeypatch, "gemm=torch,gemv=gemm,decode_attention=torch,prefill_attention=torch")
    forced = greedy(tiny_path, dtype)
    assert forced[0] == default[0]
    tolerance = 1e-4 if dtype == "float32" else 0.1
    for a, b in zip(default[1], forced[1], strict=True):
        torch.testing.assert_close(a, b, atol=tolerance, rtol=0)


def test_forcing_the_elementwise_ops_to_torch_keeps_the_greedy_tokens(monkeypatch, tiny_path):
    default = greedy(tiny_path, "float32")
    force(monkeypatch, "norm=torch,rope=torch,activation=torch,kv_write=torch")
    forced = greedy(tiny_path, "float32")
    assert forced[0] == default[0]
    for a, b in zip(default[1], forced[1], strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0)


def test_no_native_kernels_is_a_class_of_its_own():
    env = {**os.environ, "TIDE_CPU_KERNELS": "0", "TIDE_KERNELS": ""}
    out = subprocess.run(
        [sys.executable, "-m", "tide_fleet.kernels"], env=env, capture_output=True, text=True,
        timeout=120, check=True,
    ).stdout  # fmt: skip
    rows = {line.split()[1]: line.split()[2] for line in out.splitlines()}
    assert all(line.startswith("cpu-no-native") for line in out.splitlines())
    assert rows == {op: dispatch.TABLE[op]["cpu-no-native"].impl for op in dispatch.OPS}
