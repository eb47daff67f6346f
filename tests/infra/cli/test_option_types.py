"""Dtype spellings and sizes with units, wherever a command takes a dtype or a byte size."""

from __future__ import annotations

import argparse

import pytest

from tide_fleet.infra.cli.engine_flags import worker_argv
from tide_fleet.infra.cli.main import build_parser
from tide_fleet.infra.cli.option_types import byte_size, dtype_option
from tide_fleet.infra.plan.devices import GiB

SPELLINGS = {
    "float32": ["float32", "fp32", "float", "f32", "FP32", "torch.float32"],
    "bfloat16": ["bfloat16", "bf16", "BF16"],
    "float16": ["float16", "fp16", "half", "f16"],
}


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize(("canonical", "spelling"),
                         [(c, s) for c, ss in SPELLINGS.items() for s in ss])  # fmt: skip
def test_every_dtype_option_reads_a_spelling_as_its_canonical_name(canonical, spelling, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("{}\n")
    for argv in (["generate"], ["up"], ["worker"], ["controller"],
                 ["batch", "run", str(src), "-o", "out.jsonl"]):  # fmt: skip
        assert parse(*argv, "--dtype", spelling).dtype == canonical, argv
    plan = parse("plan", "--model", "m", "--device", "h100",
                 "--weight-dtype", spelling, "--kv-dtype", spelling)  # fmt: skip
    assert plan.weight_dtype == plan.kv_dtype == canonical
    if canonical != "float16":  # the bench's workers run float32 or bfloat16
        assert parse("bench", "--dtype", spelling).dtype == canonical


def test_a_worker_gets_the_canonical_dtype():
    assert worker_argv(parse("up", "--dtype", "bf16"))[:2] == ["--dtype", "bfloat16"]


def test_plan_keeps_fp8_and_int8():
    assert parse("plan", "--model", "m", "--device", "h100", "--kv-dtype", "fp8").kv_dtype == "fp8"
    assert dtype_option("int8", "fp8")("INT8") == "int8"


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096), ("0", 0), ("64MB", 64 * 10**6), ("64mb", 64 * 10**6),
        ("64MiB", 64 * 2**20), ("2GiB", 2 * 2**30), ("1.5GB", 1_500_000_000),
        ("3KB", 3000), ("3KiB", 3072), ("512B", 512), ("1 TiB", 2**40), ("1_000", 1000),
    ],
)  # fmt: skip
def test_sizes_with_units(text, size):
    assert byte_size(text) == size
    for command in ("generate", "up", "worker", "controller"):
        assert parse(command, "--kv-cache-memory", text).kv_cache_memory == size


def test_a_size_goes_to_the_worker_in_bytes():
    argv = worker_argv(parse("up", "--kv-cache-memory", "64MiB"))
    assert argv[argv.index("--kv-cache-memory") + 1] == str(64 * 2**20)


def test_plan_sizes_are_gib_unless_a_unit_says_otherwise():
    args = parse("plan", "--model", "m", "--memory-gb", "24", "--reserve-gb", "512MiB",
                 "--kv-budget-gb", "8GB")  # fmt: skip
    assert args.memory_gb == 24 and args.reserve_gb == 0.5
    assert args.kv_budget_gb * GiB == pytest.approx(8e9)
    assert parse("plan", "--model", "m", "--device", "h100", "--reserve-gb", "0").reserve_gb == 0


@pytest.mark.parametrize("text", ["", "MB", "1.5", "-1MB", "1XB", "inf", "nan", "1e", "0x10"])
def test_bad_sizes(text):
    with pytest.raises(argparse.ArgumentTypeError):
        byte_size(text)
