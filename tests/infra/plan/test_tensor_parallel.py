"""`tide plan --tensor-parallel-size`: per-GPU shares, the all-reduce cost and which N fits."""

from __future__ import annotations

import json

import pytest

from tide_fleet.infra.cli.main import main
from tide_fleet.infra.plan.devices import GiB, get_device
from tide_fleet.infra.plan.planner import ModelShape, PlanError, plan
from tide_fleet.infra.plan.roofline import allreduce_bytes

LLAMA3_70B = ModelShape.from_preset("llama-3-70b")
H100 = get_device("h100")


def test_llama_3_70b_preset_has_the_published_shape():
    s = LLAMA3_70B
    shape = (s.vocab_size, s.hidden_size, s.intermediate_size, s.num_layers)
    assert shape == (128256, 8192, 28672, 80)
    assert (s.num_heads, s.num_kv_heads, s.head_dim) == (64, 8, 128)
    assert s.tensor_parallel_sizes() == [1, 2, 4, 8]


@pytest.mark.parametrize("n", [4, 8])
def test_70b_fits_h100s_with_per_gpu_shares(n):
    p = plan(LLAMA3_70B, device=H100, tensor_parallel_size=n)
    assert p.tensor_parallel_size == n and p.min_tensor_parallel_size == 4
    assert p.weight_bytes == LLAMA3_70B.num_parameters() * 2
    assert p.weight_bytes_per_gpu == pytest.approx(p.weight_bytes / n, rel=1e-3)
    # Everything splits exactly but the norms (two a layer and a final one), replicated.
    norm_bytes = (2 * 80 + 1) * 8192 * 2
    assert p.weight_bytes_per_gpu * n - p.weight_bytes == (n - 1) * norm_bytes
    assert p.kv_bytes_per_token_per_gpu * n == p.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert p.kv_budget_bytes == p.usable_bytes - p.weight_bytes_per_gpu - p.reserve_bytes
    assert p.kv_budget_tokens == p.kv_budget_bytes // p.kv_bytes_per_token_per_gpu
    assert p.max_concurrent_seqs == p.kv_budget_bytes // (p.kv_bytes_per_token_per_gpu * 768)
    assert p.step_seconds == pytest.approx(p.step_read_seconds + p.step_allreduce_seconds)
    assert p.step_allreduce_seconds == pytest.approx(p.step_allreduce_bytes / 450e9)
    assert p.interconnect == "NVLink 4"
    assert p.decode_tokens_per_s == pytest.approx(p.recommended_max_num_seqs / p.step_seconds)
    # The flags serve it: each rank's KV pool, the model split n ways.
    assert p.worker_flags().endswith(
        f"--kv-cache-memory {p.kv_budget_bytes} --tensor-parallel-size {n}"
    )


def test_allreduce_bytes_formula():
    # Two all-reduces a layer of batch x hidden x 2 bytes; a ring sends 2(N-1)/N of each.
    for n in (2, 4, 8):
        expected = 2 * 80 * (32 * 8192 * 2) * 2 * (n - 1) / n
        assert allreduce_bytes(LLAMA3_70B, 32, n, "bfloat16") == expected
    assert allreduce_bytes(LLAMA3_70B, 32, 1, "bfloat16") == 0
    assert allreduce_bytes(LLAMA3_70B, 1, 2, "float32") == 2 * 80 * 8192 * 4


def test_tensor_parallel_one_adds_neutral_fields_only():
    p = plan(ModelShape.from_preset("llama-3-8b"), device=H100)
    assert p.tensor_parallel_size == 1 and p.step_allreduce_bytes == 0
    assert p.weight_bytes_per_gpu == p.weight_bytes
    assert p.kv_bytes_per_token_per_gpu == p.kv_bytes_per_token
    assert p.step_allreduce_seconds == 0.0 and p.step_seconds == p.step_read_seconds
    assert p.decode_tokens_per_s == pytest.approx(p.recommended_max_num_seqs / p.step_seconds)


def test_interconnect_override_slows_the_step():
    fast = plan(LLAMA3_70B, device=H100, tensor_parallel_size=4)
    slow = plan(LLAMA3_70B, device=H100, tensor_parallel_size=4, interconnect_bytes_per_s=32e9)
    assert slow.interconnect == "given" and slow.interconnect_bytes_per_s == 32e9
    assert slow.step_allreduce_seconds == pytest.approx(slow.step_allreduce_bytes / 32e9)
    assert slow.decode_tokens_per_s < fast.decode_tokens_per_s


def test_a_size_that_does_not_divide_the_heads_is_refused():
    with pytest.raises(
        PlanError, match=r"--tensor-parallel-size 3 .*64 attention, 8 KV.*1, 2, 4, 8"
    ):
        plan(LLAMA3_70B, device=H100, tensor_parallel_size=3)


def test_no_fit_names_the_smallest_size_that_fits():
    with pytest.raises(PlanError, match="smallest that fits is --tensor-parallel-size 4"):
        plan(LLAMA3_70B, device=H100)
    with pytest.raises(PlanError, match="up to 8 fits"):
        plan(LLAMA3_70B, 8 * GiB)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tensor-parallel-size", "3"], "--tensor-parallel-size 3 must divide llama-3-70b's "
         "heads (64 attention, 8 KV); sizes that work: 1, 2, 4, 8"),
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size: must be >= 1"),
        ([], "the smallest that fits is --tensor-parallel-size 4"),
        (["--tensor-parallel-size", "2"], "per GPU (split 2 ways)"),
    ],
)  # fmt: skip
def test_cli_errors(argv, message, capsys):
    try:
        rc = main(["plan", "--model", "llama-3-70b", "--device", "h100", *argv])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("n", ["4", "8"])
def test_cli_table_and_json(n, capsys):
    argv = ["plan", "--model", "llama-3-70b", "--device", "h100", "--tensor-parallel-size", n]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for text in (
        f"on {n} x h100",
        "weights per GPU",
        "all-reduce per step",
        "a model: not measured",
    ):
        assert text in out
    assert main([*argv, "--interconnect-gbs", "64", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["tensor_parallel_size"] == int(n) and d["interconnect_bytes_per_s"] == 64e9
    assert d["weight_bytes_per_gpu"] < d["weight_bytes"] and d["step_seconds"] > 0


def test_single_device_table_has_no_tensor_parallel_rows(capsys):
    assert main(["plan", "--model", "llama-3-8b", "--device", "h100"]) == 0
    out = capsys.readouterr().out
    assert "per GPU" not in out and "all-reduce" not in out and "x h100" not in out
