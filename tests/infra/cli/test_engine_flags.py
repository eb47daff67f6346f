"""The engine-flag table: one declaration for argparse, the engine and a worker's argv."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from tide_fleet.infra.cli.engine_flags import (
    ENGINE_FLAGS,
    GENERATE_FLAGS,
    engine_kwargs,
    worker_argv,
)
from tide_fleet.infra.cli.main import build_parser
from tide_fleet.worker.engine import LLMEngine
from tide_fleet.worker.engine.config import EngineConfig

LOAD_KEYWORDS = {"dtype", "device"}  # from_pretrained's own; the rest go to EngineConfig
# A served engine keeps LoRA slots (the engine alone: none); the slot rank, left unset, is
# the largest its model's adapters declare (tide worker reads them).
SERVING_DEFAULTS = {"max_loras": 4, "max_lora_rank": None}
LORA_KWARGS = {"max_loras", "max_cpu_loras", "max_lora_rank"}


def parse(*argv: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(list(argv))


def test_every_flag_sets_an_engine_keyword_with_the_engine_default():
    fields = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    load = inspect.signature(LLMEngine.from_pretrained).parameters
    for flag in ENGINE_FLAGS:
        if flag.kwarg in LOAD_KEYWORDS:
            engine_default = load[flag.kwarg].default
        else:
            assert flag.kwarg in fields, f"{flag.dest}: {flag.kwarg} is not an EngineConfig field"
            engine_default = fields[flag.kwarg]
        if flag.kwarg in SERVING_DEFAULTS:
            assert flag.default == SERVING_DEFAULTS[flag.kwarg], flag.dest
            continue
        # A switch (--no-x) left off keeps the engine's default (True).
        assert (not flag.default if flag.negates else flag.default) == engine_default, flag.dest


@pytest.mark.parametrize("command", ["up", "worker", "controller"])
def test_serving_commands_take_every_engine_flag(command):
    args = parse(command)
    assert engine_kwargs(args) == {
        "dtype": None, "device": "auto", "kv_cache_memory": None,
        "gpu_memory_utilization": 0.9, "max_num_seqs": 64,
        "max_num_batched_tokens": 1024, "attention_backend": "auto", "cuda_graphs": "auto",
        "mixed_graph_tokens": 512, "overlap_schedule": "auto", "enable_prefix_caching": True,
        "batching": "continuous",
        "tensor_parallel_size": 1,
        "max_loras": 4, "max_cpu_loras": None, "max_lora_rank": None,
    }  # fmt: skip


def test_generate_takes_all_but_batching():
    args = parse("generate", "--no-prefix-caching", "--max-num-seqs", "3")
    kwargs = engine_kwargs(args, GENERATE_FLAGS)
    assert set(kwargs) == {f.kwarg for f in ENGINE_FLAGS} - {"batching"} - LORA_KWARGS
    assert kwargs["enable_prefix_caching"] is False and kwargs["max_num_seqs"] == 3


def test_default_worker_argv_is_what_tide_up_always_passed():
    argv = worker_argv(parse("up"))
    assert argv == [
        "--device", "auto", "--gpu-memory-utilization", "0.9", "--max-num-seqs", "64",
        "--max-num-batched-tokens", "1024", "--attention-backend", "auto",
        "--cuda-graphs", "auto", "--mixed-graph-tokens", "512", "--overlap-schedule", "auto",
        "--batching", "continuous",
        "--tensor-parallel-size", "1",
        "--max-loras", "4",
    ]  # fmt: skip


def test_lora_flags_reach_the_worker_and_the_engine():
    given = parse("up", "--max-loras", "2", "--max-cpu-loras", "8", "--max-lora-rank", "32")
    argv = worker_argv(given)
    assert argv[-6:] == ["--max-loras", "2", "--max-cpu-loras", "8", "--max-lora-rank", "32"]
    kwargs = engine_kwargs(parse("worker", *argv))
    assert (kwargs["max_loras"], kwargs["max_cpu_loras"], kwargs["max_lora_rank"]) == (2, 8, 32)
    EngineConfig(**{k: kwargs[k] for k in LORA_KWARGS})  # the engine takes them as they are


@pytest.mark.parametrize("size", ["0", "-2", "two"])
def test_a_rank_count_below_one_is_refused_naming_the_flag(size, capsys):
    with pytest.raises(SystemExit):
        parse("worker", "--tensor-parallel-size", size)
    assert "--tensor-parallel-size: must be a whole number of ranks" in capsys.readouterr().err


@pytest.mark.parametrize("rank", ["0", "65", "x"])
def test_a_slot_rank_out_of_range_is_refused_naming_the_flag(rank, capsys):
    with pytest.raises(SystemExit):
        parse("up", "--max-lora-rank", rank)
    assert "--max-lora-rank" in capsys.readouterr().err


def test_unset_optional_flags_stay_off_the_worker_argv():
    assert "--kv-cache-memory" not in worker_argv(parse("up", "--kv-cache-memory", "0"))
    assert "--dtype" not in worker_argv(parse("controller"))


@pytest.mark.parametrize("command", ["up", "controller"])
def test_a_worker_started_with_the_argv_builds_the_same_engine(command):
    given = parse(
        command, "--dtype", "bfloat16", "--device", "cpu", "--kv-cache-memory", "4096",
        "--max-num-seqs", "3", "--max-num-batched-tokens", "77", "--attention-backend",
        "torch", "--no-prefix-caching", "--batching", "static",
    )  # fmt: skip
    worker = parse("worker", "--pool", "p", *worker_argv(given))
    assert engine_kwargs(worker) == engine_kwargs(given)
    assert engine_kwargs(worker)["enable_prefix_caching"] is False


def test_up_hands_its_settings_and_worker_argv_to_the_fleet(monkeypatch, tmp_path):
    from tide_fleet.infra.cli import serve
    from tide_fleet.infra.fleet import local_fleet
    from tide_fleet.worker.models import resolve

    seen = {}

    def run(self):  # type: ignore[no-untyped-def]
        seen.update(settings=self.settings, argv=self.worker_argv)
        return 0

    monkeypatch.setattr(local_fleet.LocalFleet, "run", run)
    monkeypatch.setattr(resolve, "resolve_model_path", lambda model: seen.setdefault("made", model))
    args = parse("up", "--model", "dummy:small", "--data-dir", str(tmp_path), "--max-num-seqs", "5")
    assert serve.cmd_up(args) == 0
    assert seen["made"] == "dummy:small" == seen["settings"].model
    assert seen["settings"].data_dir == tmp_path
    assert seen["argv"] == worker_argv(args) and "5" in seen["argv"]
