"""fleet.toml's gpus_per_worker: checked at load (naming the pool and the field), one source
for a worker's --tensor-parallel-size, and `tide up` / `tide controller` flags that agree."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from tide_fleet.infra import settings as settings_module
from tide_fleet.infra.cli.main import build_parser, main
from tide_fleet.infra.fleet.fleet_config import parse_fleet
from tide_fleet.infra.fleet.local_fleet import LocalFleet
from tide_fleet.infra.fleet.pool_gpus import (
    TP_FLAG,
    check_flag_agrees,
    flag_value,
    without_flag,
)
from tide_fleet.infra.settings import Settings

EVERY = ["short", "medium", "long"]


def pool(**fields: Any) -> dict[str, Any]:
    return {"pools": {"big": {"buckets": EVERY, **fields}}}


def test_the_default_is_one_gpu_and_a_larger_group_loads() -> None:
    assert parse_fleet(pool()).pools["big"].gpus_per_worker == 1
    fleet = parse_fleet(pool(gpus_per_worker=4, instance_types=["g6e.12xlarge", "p4de.24xlarge"]))
    assert fleet.pools["big"].gpus_per_worker == 4


BAD = [
    (
        {"gpus_per_worker": 0},
        "pools.big.gpus_per_worker: Input should be greater than or equal to 1",
    ),
    ({"gpus_per_worker": "2"}, "pools.big.gpus_per_worker: Input should be a valid integer"),
    ({"gpus_per_worker": 1.5}, "pools.big.gpus_per_worker: Input should be a valid integer"),
    (
        {"gpus_per_worker": 2, "worker_args": ["--max-num-seqs", "8", TP_FLAG, "4"]},
        "pools.big: Value error, worker_args: --tensor-parallel-size 4 differs from "
        "gpus_per_worker (2); set gpus_per_worker = 4 instead",
    ),
    (
        {"worker_args": [f"{TP_FLAG}=2"]},
        "worker_args: --tensor-parallel-size 2 differs from gpus_per_worker (1)",
    ),
    (
        {"gpus_per_worker": 2, "instance_types": ["g5.12xlarge", "g6.xlarge"]},
        "pools.big: Value error, instance_types: instance type g6.xlarge has 1 GPU (NVIDIA L4), "
        "fewer than gpus_per_worker (2): use one with at least 2, e.g. ",
    ),
    (
        {"gpus_per_worker": 16, "instance_types": ["p5.48xlarge"]},
        "instance type p5.48xlarge has 8 GPUs (NVIDIA H100), fewer than gpus_per_worker (16): "
        "no instance type in infra/fleet/instance_gpus.py has 16 GPUs",
    ),
    (
        {"gpus_per_worker": 2, "instance_types": ["x9.huge"]},
        "instance_types: unknown GPU count for instance type x9.huge; a worker needs 2 GPUs",
    ),
]


@pytest.mark.parametrize(("fields", "message"), BAD, ids=[m[:50] for _, m in BAD])
def test_bad_values_name_the_pool_the_field_and_the_limit(fields: dict, message: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_fleet(pool(**fields))
    assert message in str(e.value)


def test_the_same_size_in_worker_args_and_an_unknown_type_for_one_gpu_are_accepted() -> None:
    args = [TP_FLAG, "2", "--max-num-seqs", "8"]
    parse_fleet(pool(gpus_per_worker=2, worker_args=args, instance_types=["g6.12xlarge"]))
    parse_fleet(pool(instance_types=["x9.huge", "c7i.large"]))  # one GPU: nothing to check


def test_flags_in_an_argv() -> None:
    argv = ["--a", "1", TP_FLAG, "2", "--b", f"{TP_FLAG}=4", "--c"]
    assert flag_value(argv, TP_FLAG) == "4"  # the last, as argparse takes it
    assert flag_value(["--a", "1"], TP_FLAG) is None
    assert without_flag(argv, TP_FLAG) == ["--a", "1", "--b", "--c"]


def test_a_cli_size_must_agree_with_every_pool() -> None:
    check_flag_agrees({"a": 2, "b": 4}, 1)  # the flag's default says nothing
    check_flag_agrees({"a": 2, "b": 2}, 2)
    with pytest.raises(ValueError, match=r"--tensor-parallel-size 2: pool b has gpus_per_worker"):
        check_flag_agrees({"a": 2, "b": 4}, 2)


def up(tmp_path: Path, *argv: str) -> LocalFleet:
    args: argparse.Namespace = build_parser().parse_args(["up", *argv])
    return LocalFleet(args, Settings(model="dummy:tiny", data_dir=tmp_path), [])


def test_tide_up_tensor_parallel_size_sets_its_pools_gpus_per_worker(tmp_path: Path) -> None:
    fleet = up(tmp_path, "--tensor-parallel-size", "2", "--max-workers", "3").prepare()
    assert [p.gpus_per_worker for p in fleet.pools.values()] == [2]
    fleet = up(tmp_path, "--model", "a=dummy:tiny", "--model", "b=dummy:tiny",
               "--tensor-parallel-size", "4").prepare()  # fmt: skip
    assert [p.gpus_per_worker for p in fleet.pools.values()] == [4, 4]


def write_fleet(tmp_path: Path, gpus: int) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(f"[pools.big]\nbuckets = {EVERY}\ngpus_per_worker = {gpus}\n".replace("'", '"'))
    return path


def test_tide_up_with_a_fleet_file_takes_the_pools_sizes(tmp_path: Path) -> None:
    path = write_fleet(tmp_path, 2)
    assert up(tmp_path, "--fleet", str(path)).prepare().pools["big"].gpus_per_worker == 2
    up(tmp_path, "--fleet", str(path), "--tensor-parallel-size", "2").prepare()
    with pytest.raises(SystemExit, match="tide up: --tensor-parallel-size 4: pool big has "):
        up(tmp_path, "--fleet", str(path), "--tensor-parallel-size", "4").prepare()


def test_tide_controller_refuses_a_size_its_pools_do_not_have(tmp_path, monkeypatch, capsys):  # type: ignore[no-untyped-def]
    settings = Settings(redis_url="redis://127.0.0.1:1/0")  # never reached
    monkeypatch.setattr(settings_module, "get_settings", lambda: settings)
    path = write_fleet(tmp_path, 2)
    argv = ["controller", "--fleet", str(path), "--actuator", "local"]
    assert main([*argv, "--tensor-parallel-size", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --tensor-parallel-size 4: pool big has gpus_per_worker = 2")
