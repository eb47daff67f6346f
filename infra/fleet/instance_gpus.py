"""EC2 GPU instance types: how many GPUs each has, and of what model.

A pool whose workers take N GPUs each (``gpus_per_worker``, infra/fleet/pool_gpus.py) runs
one worker per instance, so each of its instance types needs at least N GPUs. The counts
are AWS's, from the accelerated-computing instance types page
(https://aws.amazon.com/ec2/instance-types/#Accelerated_Computing and
https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html). Terraform's worker_pool
module keeps the same table (terraform/modules/worker_pool/gpus.tf;
tests/infra/fleet/test_instance_gpus.py holds the two equal). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceGpus:
    count: int
    model: str  # the GPU, as AWS names it


ONE = {"xlarge": 1, "2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "16xlarge": 1}
# (family, its GPU, GPUs by size), as AWS lists them.
_FAMILIES: tuple[tuple[str, str, dict[str, int]], ...] = (
    ("g4dn", "NVIDIA T4", {**ONE, "12xlarge": 4, "metal": 8}),
    ("g5", "NVIDIA A10G", {**ONE, "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}),
    ("g6", "NVIDIA L4", {**ONE, "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}),
    ("gr6", "NVIDIA L4", {"4xlarge": 1, "8xlarge": 1}),
    ("g6e", "NVIDIA L40S", {**ONE, "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}),
    ("p3", "NVIDIA V100 16 GB", {"2xlarge": 1, "8xlarge": 4, "16xlarge": 8}),
    ("p3dn", "NVIDIA V100 32 GB", {"24xlarge": 8}),
    ("p4d", "NVIDIA A100 40 GB", {"24xlarge": 8}),
    ("p4de", "NVIDIA A100 80 GB", {"24xlarge": 8}),
    ("p5", "NVIDIA H100", {"48xlarge": 8}),
    ("p5e", "NVIDIA H200", {"48xlarge": 8}),
    ("p5en", "NVIDIA H200", {"48xlarge": 8}),
    ("p6-b200", "NVIDIA B200", {"48xlarge": 8}),
)
INSTANCE_GPUS: dict[str, InstanceGpus] = {
    f"{family}.{size}": InstanceGpus(count, gpu)
    for family, gpu, sizes in _FAMILIES
    for size, count in sizes.items()
}


def instance_gpus(instance_type: str) -> InstanceGpus | None:
    """The GPUs of an instance type; None for one not in the table."""
    return INSTANCE_GPUS.get(instance_type)


def check_instance_types(instance_types: list[str], gpus_per_worker: int) -> None:
    """Each instance type holds a worker of `gpus_per_worker` GPUs; ValueError naming the
    first that does not: one with fewer GPUs or, for a worker of more than one GPU, one not in
    the table (its GPU count unknown)."""
    n = gpus_per_worker
    for itype in instance_types:
        gpus = instance_gpus(itype)
        if gpus is None and n > 1:
            raise ValueError(
                f"unknown GPU count for instance type {itype}; a worker needs {n} GPUs on one "
                f"instance (gpus_per_worker): {_choices(n)}"
            )
        if gpus is not None and gpus.count < n:
            plural = "s" if gpus.count > 1 else ""
            raise ValueError(
                f"instance type {itype} has {gpus.count} GPU{plural} ({gpus.model}), fewer "
                f"than gpus_per_worker ({n}): {_choices(n)}"
            )


def _choices(min_gpus: int, most: int = 4) -> str:
    types = [t for t, g in INSTANCE_GPUS.items() if g.count >= min_gpus]
    if not types:
        return f"no instance type in infra/fleet/instance_gpus.py has {min_gpus} GPUs"
    more = ", ..." if len(types) > most else ""
    return f"use one with at least {min_gpus}, e.g. {', '.join(types[:most])}{more}"
