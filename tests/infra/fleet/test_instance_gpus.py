"""The EC2 GPU table: Tide's and the Terraform worker_pool module's are the same, and a pool's
instance types are checked against it. Text only: no terraform binary needed."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT
from tide_fleet.infra.fleet.instance_gpus import (
    INSTANCE_GPUS,
    check_instance_types,
    instance_gpus,
)

GPUS_TF = ROOT / "terraform/modules/worker_pool/gpus.tf"


def terraform_table() -> dict[str, int]:
    body = re.search(r"instance_gpus = \{(.*?)\n  \}", GPUS_TF.read_text(), re.S)
    assert body is not None, f"no instance_gpus map in {GPUS_TF}"
    return {t: int(n) for t, n in re.findall(r'^\s*"([\w.-]+)"\s*=\s*(\d+)', body.group(1), re.M)}


def test_terraform_holds_the_same_gpu_counts() -> None:
    assert terraform_table() == {t: g.count for t, g in INSTANCE_GPUS.items()}


def test_the_table_knows_the_common_gpu_types() -> None:
    expected = {"g4dn.xlarge": 1, "g4dn.12xlarge": 4, "g5.xlarge": 1, "g5.48xlarge": 8,
                "g6.12xlarge": 4, "g6e.xlarge": 1, "g6e.24xlarge": 4, "p3.8xlarge": 4,
                "p4d.24xlarge": 8, "p4de.24xlarge": 8, "p5.48xlarge": 8, "p5e.48xlarge": 8,
                "p5en.48xlarge": 8}  # fmt: skip
    assert {t: INSTANCE_GPUS[t].count for t in expected} == expected
    gpus = instance_gpus("p4de.24xlarge")
    assert gpus is not None and gpus.model == "NVIDIA A100 80 GB"
    assert instance_gpus("c7i.large") is None


def test_instance_types_are_checked_against_the_workers_gpus() -> None:
    check_instance_types(["g6.xlarge", "c7i.large"], 1)  # one GPU: unknown types pass
    check_instance_types(["g6.12xlarge", "p5.48xlarge"], 4)
    with pytest.raises(ValueError, match=r"^instance type g6.12xlarge has 4 GPUs \(NVIDIA L4\)"):
        check_instance_types(["p5.48xlarge", "g6.12xlarge"], 8)
    with pytest.raises(ValueError, match=r"^unknown GPU count for instance type c7i.large; "):
        check_instance_types(["c7i.large"], 2)
