"""`tide infra tfvars`: fleet.toml rendered into the Terraform example's variables."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT
from tests.infra.fleet.wheel_files import WHEEL_NAME, example_fleet, make_wheel
from tide_fleet.infra.cli.main import build_parser, main
from tide_fleet.infra.fleet.fleet_config import load_fleet, parse_fleet
from tide_fleet.infra.fleet.tfvars import POOL_KEYS, render_file, render_tfvars

EXAMPLE_DIR = ROOT / "terraform/examples/two_pools"

BASE: dict[str, Any] = {
    "aws": {
        "region": "eu-west-1",
        "name_prefix": "acme",
        "ami_id": "ami-0123456789abcdef0",
        "tide_wheel": f"dist/{WHEEL_NAME}",
    },
    "pools": {
        "small": {
            "buckets": ["short"],
            "instance_types": ["g6.xlarge", "g5.xlarge"],
            "spot": True,
            "max_workers": 8,
        },
        "big": {
            "buckets": ["medium", "long", "short"],
            "instance_types": ["p4de.24xlarge"],
            "max_workers": 2,
        },
    },
}


def to_toml(data: dict[str, Any]) -> str:
    """Tables of scalars and lists: all a fleet file needs (JSON literals are valid TOML)."""
    lines: list[str] = []
    for section, body in data.items():
        tables = body.items() if section == "pools" else [(None, body)]
        for name, table in tables:
            lines.append(f"[{section}.{name}]" if name else f"[{section}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
            lines.append("")
    return "\n".join(lines)


def fleet_data(**pool_changes: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for pool, changes in pool_changes.items():
        if pool == "aws":
            data["aws"].update(changes)
        else:
            data["pools"].setdefault(pool, {}).update(changes)
    return data


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding dist/<a tide-fleet wheel>, as BASE's tide_wheel names it."""
    folder = tmp_path_factory.mktemp("fleet")
    make_wheel(folder / "dist")
    return folder


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fleet.example.toml beside the wheel it names."""
    return example_fleet(tmp_path_factory.mktemp("example"))


def render(data: dict[str, Any], fleet_dir: Path) -> dict[str, Any]:
    return render_tfvars(parse_fleet(data), to_toml(data), fleet_dir)


def assert_pool_matches(rendered: dict[str, Any], pool: Any) -> None:
    assert rendered["buckets"] == pool.buckets
    assert rendered["device"] == pool.device
    assert rendered["instance_types"] == pool.instance_types
    assert rendered["min_size"] == pool.min_workers
    assert rendered["max_size"] == pool.max_workers
    assert rendered["spot"] is pool.spot
    assert rendered["on_demand_base"] == pool.on_demand_base
    assert rendered["warm_pool_size"] == pool.warm_pool_size
    assert rendered["drain_timeout_s"] >= pool.drain_timeout_s > rendered["drain_timeout_s"] - 1
    assert rendered["model"] == (pool.model or "")
    assert rendered["worker_args"] == pool.worker_args
    assert rendered["gpus_per_worker"] == pool.gpus_per_worker
    assert rendered["target_tracking"] is pool.target_tracking
    assert rendered["target_backlog_per_instance"] == pool.target_backlog_per_instance


def test_example_fleet_round_trips(example: Path) -> None:
    fleet = load_fleet(example)
    out = json.loads(render_file(example))
    assert list(out["pools"]) == list(fleet.pools)  # every pool, in file order
    for name, pool in fleet.pools.items():
        assert_pool_matches(out["pools"][name], pool)
    assert out["pools"]["small"]["spot"] is True and out["pools"]["small"]["min_size"] == 0
    assert out["pools"]["big"]["instance_types"] == ["p4de.24xlarge"]
    aws = fleet.aws
    assert (out["region"], out["name_prefix"], out["ami_id"]) == (
        aws.region,
        aws.name_prefix,
        aws.ami_id,
    )
    assert out["subnet_ids"] == aws.subnet_ids
    assert out["cloudwatch_namespace"] == aws.cloudwatch_namespace
    wheel = example.parent / "dist" / WHEEL_NAME
    assert out["tide_wheel"] == str(wheel.resolve())
    assert out["tide_wheel_sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    # The controller host gets the very file: parsing it back gives the same fleet.
    assert out["fleet_toml"] == example.read_text()
    assert parse_fleet(tomllib.loads(out["fleet_toml"])) == fleet


def test_every_field_round_trips_through_a_file(tmp_path: Path) -> None:
    data = fleet_data(
        big={
            "warm_pool_size": 2,
            "min_workers": 1,
            "target_tracking": True,
            "target_backlog_per_instance": 6.5,
            "drain_timeout_s": 120.5,
            "model": "s3://acme-models/llama-3-8b",
            "worker_args": ["--max-num-seqs", "128"],
            "device": "a100-80gb",
            "gpus_per_worker": 4,
        },
        small={"on_demand_base": 1, "model": "/opt/models/tiny"},
        aws={"subnet_ids": ["subnet-0abc1234", "subnet-0def5678"]},
    )
    make_wheel(tmp_path / "dist")
    path = tmp_path / "fleet.toml"
    path.write_text(to_toml(data))
    out = json.loads(render_file(path))
    fleet = load_fleet(path)
    for name, pool in fleet.pools.items():
        assert_pool_matches(out["pools"][name], pool)
    big = out["pools"]["big"]
    assert (big["warm_pool_size"], big["min_size"], big["drain_timeout_s"]) == (2, 1, 121)
    assert big["model"] == "s3://acme-models/llama-3-8b"
    assert (big["gpus_per_worker"], out["pools"]["small"]["gpus_per_worker"]) == (4, 1)
    assert out["pools"]["small"]["on_demand_base"] == 1
    assert out["subnet_ids"] == ["subnet-0abc1234", "subnet-0def5678"]
    assert out["tide_wheel"] == str(tmp_path.resolve() / "dist" / WHEEL_NAME)


@settings(max_examples=40, deadline=None)
@given(
    types=st.lists(
        st.sampled_from(["g5.xlarge", "g6.xlarge", "g6e.xlarge", "p5.48xlarge"]),
        min_size=1,
        max_size=4,
        unique=True,
    ),
    sizes=st.tuples(st.integers(0, 50), st.integers(0, 50)).map(sorted),
    spot=st.booleans(),
    warm=st.integers(0, 3),
    drain=st.floats(30, 7200),
)
def test_pool_settings_round_trip(
    fleet_dir: Path, types: list[str], sizes: list[int], spot: bool, warm: int, drain: float
) -> None:
    if warm and (spot or len(types) > 1):
        warm = 0  # the fleet config refuses it (tested below)
    data = fleet_data(
        big={
            "instance_types": types,
            "min_workers": sizes[0],
            "max_workers": sizes[1],
            "spot": spot,
            "warm_pool_size": warm,
            "drain_timeout_s": drain,
        }
    )
    out = render(data, fleet_dir)
    assert_pool_matches(out["pools"]["big"], parse_fleet(data).pools["big"])
    assert list(out["pools"]["big"]) == list(POOL_KEYS)


BAD = [
    ({"small": {"instance_types": []}}, "pools.small.instance_types: needs 1 to 20"),
    ({"small": {"instance_types": [f"g5.{i}xlarge" for i in range(21)]}}, "(has 21)"),
    ({"big": {"drain_timeout_s": 10}}, "pools.big.drain_timeout_s: 10 is outside 30-7200"),
    ({"big": {"drain_timeout_s": 9000}}, "pools.big.drain_timeout_s: 9000 is outside 30-7200"),
    ({"small": {"on_demand_base": 9}}, "pools.small.on_demand_base: 9 exceeds max_workers (8)"),
    ({"big": {"model": "s3://models/my model"}}, "pools.big.model: 's3://models/my model'"),
    ({"big": {"worker_args": ["--x", "a'b"]}}, "pools.big.worker_args[1]"),
    ({"aws": {"name_prefix": "Tide_Prod"}}, "aws.name_prefix: 'Tide_Prod' must be 1-20"),
    ({"aws": {"name_prefix": "a" * 21}}, "aws.name_prefix"),
    ({"aws": {"ami_id": "ami-xyz"}}, "aws.ami_id: 'ami-xyz' is not an AMI id"),
    ({"aws": {"region": "moon-1"}}, "aws.region: 'moon-1' is not an AWS region"),
    ({"aws": {"subnet_ids": ["subnet-0abc1234", "sub-1"]}}, "aws.subnet_ids[1]: 'sub-1'"),
    ({"p" * 33: {"buckets": ["short"], "instance_types": ["g5.xlarge"]}}, "at most 32"),
]


@pytest.mark.parametrize(("changes", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_fleet_names_the_field(fleet_dir: Path, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as e:
        render(fleet_data(**changes), fleet_dir)
    assert message in str(e.value)
    assert str(e.value).startswith("fleet config cannot be deployed with Terraform: ")


def test_every_problem_is_reported_at_once(fleet_dir: Path) -> None:
    data = fleet_data(
        aws={"ami_id": "bad", "tide_wheel": "nope.whl"},
        big={"drain_timeout_s": 5},
        small={"instance_types": []},
    )
    with pytest.raises(ValueError) as e:
        render(data, fleet_dir)
    for field in ("aws.ami_id", "aws.tide_wheel", "pools.big.drain_timeout_s",
                  "pools.small.instance_types"):  # fmt: skip
        assert field in str(e.value)


FLEET_ERRORS = [
    ({"big": {"warm_pool_size": 1, "spot": True}}, "warm_pool_size needs on-demand capacity"),
    ({"big": {"min_workers": 3, "max_workers": 2}}, "min_workers (3) exceeds max_workers (2)"),
    ({"big": {"buckets": ["huge"]}}, "pools.big.buckets: Value error, unknown bucket 'huge'"),
    (
        {"small": {"gpus_per_worker": 2}},
        "pools.small: Value error, instance_types: instance type g6.xlarge has 1 GPU",
    ),
]


@pytest.mark.parametrize(("changes", "message"), FLEET_ERRORS, ids=[m for _, m in FLEET_ERRORS])
def test_cli_reports_bad_fleet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict[str, Any], message: str
) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(to_toml(fleet_data(**changes)))
    out = tmp_path / "out.json"
    assert main(["infra", "tfvars", "--fleet", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert not out.exists()


def test_cli_missing_and_malformed_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["infra", "tfvars", "--fleet", str(tmp_path / "nope.toml")]) == 2
    assert "not found" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[pools.small\n")
    assert main(["infra", "tfvars", "--fleet", str(bad)]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_cli_writes_file_and_stdout(
    example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sub" / "terraform.tfvars.json"
    assert main(["infra", "tfvars", "--fleet", str(example), "-o", str(out)]) == 0
    assert out.read_text() == render_file(example)
    assert list(out.parent.iterdir()) == [out]  # no temporary file left behind
    capsys.readouterr()
    assert main(["infra", "tfvars", "--fleet", str(example)]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(out.read_text())


def test_infra_command_is_registered() -> None:
    args = build_parser().parse_args(["infra", "tfvars"])
    assert args.fleet == "fleet.toml" and args.output == "-"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["infra"])  # a subcommand is required


def test_shape_matches_the_example_variables(example: Path) -> None:
    """Every key written is a variable of the example, and each pool has exactly the
    attributes of its `pools` object type (terraform itself checks it in test_terraform)."""
    text = (EXAMPLE_DIR / "variables.tf").read_text()
    declared = set(re.findall(r'^variable "(\w+)"', text, re.M))
    pools_type = re.search(r"map\(object\(\{(.*?)\}\)\)", text, re.S)
    assert pools_type is not None
    attributes = re.findall(r"^\s*(\w+)\s*=", pools_type.group(1), re.M)
    out = json.loads(render_file(example))
    assert set(out) <= declared
    assert sorted(attributes) == sorted(POOL_KEYS)
    for pool in out["pools"].values():
        assert list(pool) == list(POOL_KEYS)
