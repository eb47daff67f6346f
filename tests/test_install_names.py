"""Tide's import names shadow no other distribution's: Hugging Face's ``kernels`` (which
transformers uses) and PyPI's ``tide`` import beside ``tide_fleet.*``."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

PROBE = """
import json, sys
import kernels, transformers
import tide_fleet.gateway.app, tide_fleet.infra.cli.main, tide_fleet.kernels.attention
import tide_fleet.worker.engine
from transformers import AutoModelForCausalLM  # noqa: F401 - transformers' lazy imports resolve
print(json.dumps({"kernels": kernels.__file__, "tide_kernels": tide_fleet.kernels.__file__,
                  "transformers": transformers.__version__}))
"""


def test_huggingface_kernels_and_tide_import_side_by_side(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not Path(found["kernels"]).resolve().is_relative_to(ROOT / "kernels"), found
    assert Path(found["tide_kernels"]).resolve() == ROOT / "kernels" / "__init__.py"
    major, minor = (int(x) for x in found["transformers"].split(".")[:2])
    assert (major, minor) >= (5, 25), found


def test_in_the_test_process_kernels_is_huggingfaces() -> None:
    import kernels

    assert not Path(kernels.__file__).resolve().is_relative_to(ROOT / "kernels"), kernels.__file__


def test_the_distribution_is_tides_own() -> None:
    dist = importlib.metadata.distribution("tide-fleet")
    (tide,) = dist.entry_points.select(group="console_scripts", name="tide")
    assert tide.value.startswith("tide_fleet."), tide.value
