"""``tide up --lora NAME=PATH``: each adapter on the ``--model`` before it, into the served
models every process learns; a bad flag or an adapter that does not fit its base stops
``tide up`` with one line naming it, before anything starts."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.infra.cli.test_cli_errors import tide
from tests.lora_fixtures import make_adapter
from tide_fleet.infra.cli.main import build_parser
from tide_fleet.infra.fleet.local_fleet import LocalFleet, lora_tables
from tide_fleet.infra.settings import Settings


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


@pytest.fixture(scope="module")
def adapters(stories_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "sql": make_adapter(root / "sql", stories_path, 8, ["q_proj", "k_proj"], seed=1),
        "huge": make_adapter(root / "huge", stories_path, 72, ["q_proj"], seed=3),
    }


def test_each_lora_belongs_to_the_model_before_it() -> None:
    args = parse("up", "--lora", "first=/a/1", "--model", "a=/m/a", "--lora", "x=/a/x",
                 "--model", "b=/m/b", "--lora", "y=s3://bucket/y")  # fmt: skip
    assert args.lora == [(0, "first", "/a/1"), (0, "x", "/a/x"), (1, "y", "s3://bucket/y")]
    assert lora_tables(args.lora, 2) == [{"first": "/a/1", "x": "/a/x"}, {"y": "s3://bucket/y"}]
    assert parse("up").lora is None


def test_a_name_given_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="--lora x: the name is given twice"):
        lora_tables([(0, "x", "/a"), (1, "x", "/b")], 2)


@pytest.mark.parametrize(
    ("value", "shown"), [("nopath", "NAME=PATH, got 'nopath'"), ("bad name=/a", "adapter name")]
)
def test_a_bad_lora_flag_is_one_line_naming_it(value: str, shown: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit):
        parse("up", "--lora", value)
    err = capsys.readouterr().err
    assert "--lora" in err and shown in err


def _fleet(tmp_path: Path, model: Path, *argv: str) -> LocalFleet:
    args = parse("up", "--model", str(model), "--data-dir", str(tmp_path), *argv)
    return LocalFleet(args, Settings(model=str(model), data_dir=tmp_path), [])


def test_declared_adapters_reach_the_served_models(tmp_path, stories_path, adapters):  # type: ignore[no-untyped-def]
    fleet = _fleet(tmp_path, stories_path, "--lora", f"sql={adapters['sql']}")
    fleet.prepare()
    (spec,) = fleet.settings.served_models
    assert spec["name"] == str(stories_path) and spec["lora"] == {"sql": str(adapters["sql"])}
    assert fleet.adapter_ranks == {"sql": 8}
    plain = _fleet(tmp_path, stories_path)
    plain.prepare()
    assert plain.settings.served_models == []  # no adapters, one model: as before


def test_lora_with_a_fleet_file_is_refused(tmp_path, stories_path):  # type: ignore[no-untyped-def]
    fleet = _fleet(tmp_path, stories_path, "--fleet", "fleet.toml", "--lora", "x=/a/x")
    with pytest.raises(SystemExit, match="--lora: with --fleet, declare adapters in the fleet"):
        fleet.prepare()


def test_an_adapter_that_does_not_fit_stops_tide_up_in_one_line(tmp_path, stories_path, adapters):  # type: ignore[no-untyped-def]
    res = tide("up", "--model", str(stories_path), "--data-dir", str(tmp_path),
               "--lora", f"sql={adapters['sql']}", "--lora", f"big={adapters['huge']}")  # fmt: skip
    assert res.returncode == 1 and "Traceback" not in res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith(f"tide up: adapter 'big' on model '{stories_path}': adapter ")
    assert "rank 72 is over the limit of 64" in line
    assert not (tmp_path / "redis").exists()  # nothing started
