"""Small stand-in wheels for `tide infra tfvars` and the Terraform tests: a zip with the
``.dist-info`` a wheel carries, named as `pip wheel` names Tide's."""

from __future__ import annotations

import zipfile
from pathlib import Path

from tests.conftest import ROOT

WHEEL_NAME = "tide_fleet-0.1.0-py3-none-any.whl"  # what fleet.example.toml names, under dist/


def make_wheel(
    folder: Path, filename: str = WHEEL_NAME, dist_name: str = "tide-fleet", body: str = ""
) -> Path:
    """A wheel file in `folder` whose METADATA names `dist_name`; `body` varies its hash."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / filename
    stem, version = filename.split("-")[:2]
    info = f"{stem}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist_name}\n"
                                        f"Version: {version}\n")  # fmt: skip
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n")
        zf.writestr("tide_fleet/__init__.py", body)
    return path


def example_fleet(folder: Path, extra_big: str = "") -> Path:
    """fleet.example.toml copied into `folder` beside the wheel it names (plus `extra_big`
    lines in [pools.big])."""
    text = (ROOT / "fleet.example.toml").read_text()
    assert "[pools.big]\n" in text
    make_wheel(folder / "dist")
    fleet = folder / "fleet.toml"
    fleet.write_text(text.replace("[pools.big]\n", "[pools.big]\n" + extra_big))
    return fleet
