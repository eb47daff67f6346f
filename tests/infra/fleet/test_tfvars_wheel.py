"""`tide infra tfvars` and `[aws] tide_wheel`: the hosts install the operator's own build, so
tfvars accepts only a tide-fleet wheel and records its absolute path and SHA-256."""

from __future__ import annotations

import hashlib
import json
import tomllib
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.infra.fleet.wheel_files import WHEEL_NAME, example_fleet, make_wheel
from tide_fleet.infra.cli.main import main
from tide_fleet.infra.fleet.fleet_config import AwsConfig, load_fleet
from tide_fleet.infra.fleet.tfvars import render_file


def test_wheel_is_found_beside_the_fleet_file_and_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = example_fleet(tmp_path / "deploy")
    monkeypatch.chdir(tmp_path)  # relative to the fleet file's folder, not the working one
    out = json.loads(render_file(Path("deploy/fleet.toml")))
    wheel = tmp_path / "deploy" / "dist" / WHEEL_NAME
    assert Path(out["tide_wheel"]).is_absolute()
    assert out["tide_wheel"] == str(wheel.resolve())
    assert out["tide_wheel_sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    make_wheel(wheel.parent, body="# another build\n")
    rebuilt = json.loads(render_file(fleet))
    assert rebuilt["tide_wheel_sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert rebuilt["tide_wheel_sha256"] != out["tide_wheel_sha256"]


def test_an_absolute_path_is_taken_as_is(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "builds")
    fleet = example_fleet(tmp_path / "deploy")
    fleet.write_text(fleet.read_text().replace(f'"dist/{WHEEL_NAME}"', json.dumps(str(wheel))))
    assert json.loads(render_file(fleet))["tide_wheel"] == str(wheel)


def _not_a_zip(folder: Path) -> str:
    (folder / WHEEL_NAME).write_text("not a zip")
    return WHEEL_NAME


def _zip_without_metadata(folder: Path) -> str:
    with zipfile.ZipFile(folder / WHEEL_NAME, "w") as zf:
        zf.writestr("tide_fleet/__init__.py", "")
    return WHEEL_NAME


REFUSED = [
    ("missing", lambda d: "tide_fleet-9.9.9-py3-none-any.whl", "not found"),
    ("sdist", lambda d: make_wheel(d, "tide_fleet-0.1.0.tar.gz").name, "is not a wheel file"),
    ("not a zip", _not_a_zip, "is not a wheel (no tide_fleet-0.1.0.dist-info/METADATA)"),
    ("no metadata", _zip_without_metadata, "is not a wheel (no tide_fleet-0.1.0.dist-info"),
    (
        "pypi tide",
        lambda d: make_wheel(d, "tide-1.0-py3-none-any.whl", dist_name="tide").name,
        "is a wheel of tide, not of Tide's distribution tide-fleet",
    ),
    (
        "renamed wheel",
        lambda d: make_wheel(d, WHEEL_NAME, dist_name="requests").name,
        "metadata names requests distribution, not tide-fleet",
    ),
]


@pytest.mark.parametrize(("case", "make", "message"), REFUSED, ids=[c for c, *_ in REFUSED])
def test_tfvars_refuses_what_is_not_a_tide_wheel(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
    make: Callable[[Path], str],
    message: str,
) -> None:
    fleet = example_fleet(tmp_path)
    dist = tmp_path / "other"
    dist.mkdir()
    name = make(dist)
    fleet.write_text(fleet.read_text().replace(f"dist/{WHEEL_NAME}", f"other/{name}"))
    out = tmp_path / "terraform.tfvars.json"
    assert main(["infra", "tfvars", "--fleet", str(fleet), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "aws.tide_wheel: " in err and message in err, err
    assert not out.exists()


def test_tfvars_needs_a_wheel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet = example_fleet(tmp_path)
    fleet.write_text(fleet.read_text().replace(f'tide_wheel = "dist/{WHEEL_NAME}"\n', ""))
    load_fleet(fleet)  # the controller and the simulator need no wheel
    assert main(["infra", "tfvars", "--fleet", str(fleet)]) == 2
    err = capsys.readouterr().err
    assert "aws.tide_wheel: not set" in err and "pip wheel --no-deps -w dist ." in err


def test_the_old_package_name_key_says_what_replaced_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = example_fleet(tmp_path)
    fleet.write_text(fleet.read_text().replace("[aws]\n", '[aws]\ntide_package = "tide"\n'))
    assert main(["infra", "tfvars", "--fleet", str(fleet)]) == 2
    err = capsys.readouterr().err
    assert "aws.tide_package: replaced by aws.tide_wheel" in err, err
    assert "pip wheel --no-deps -w dist ." in err


def test_the_example_names_the_wheel_pip_wheel_builds() -> None:
    """`pip wheel --no-deps -w dist .` writes dist/<name>-<version>-py3-none-any.whl."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name = project["name"].replace("-", "_")
    assert f"{name}-{project['version']}-py3-none-any.whl" == WHEEL_NAME
    example = tomllib.loads((ROOT / "fleet.example.toml").read_text())
    assert example["aws"]["tide_wheel"] == f"dist/{WHEEL_NAME}"
    assert AwsConfig().tide_wheel is None  # no default build, and no package name to look up
