"""Accelerator peaks: memory, bandwidth and dense matmul throughput per device kind.

Torch-free. Used by the planner (`tide plan`), by the workers' MFU/MBU estimates, by the
fleet config (each pool names its device) and by the simulator. Figures are the vendors'
dense (no sparsity) tensor-core peaks for 16-bit inputs with fp32 accumulation and the
nominal memory bandwidth; real kernels reach 60-90% of them. The CPU entry is a
placeholder: workers on CPU measure their own peaks at start-up (worker/device_peaks.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

GiB = 1 << 30


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    memory_bytes: int
    mem_bandwidth: float  # bytes/s
    peak_flops_16bit: float  # dense bf16/fp16 FLOP/s
    peak_flops_fp32: float  # FLOP/s without tensor cores
    description: str = ""
    interconnect_bandwidth: float = 0.0  # bytes/s each GPU sends to its peers, one direction
    interconnect: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _dev(
    name: str,
    mem_gib: float,
    bw_gbs: float,
    tf16: float,
    tf32: float,
    desc: str,
    link: tuple[str, float],
) -> DeviceSpec:
    link_name, link_gbs = link
    return DeviceSpec(
        name, int(mem_gib * GiB), bw_gbs * 1e9, tf16 * 1e12, tf32 * 1e12, desc,
        link_gbs * 1e9, link_name,
    )  # fmt: skip


# GPU-to-GPU links, GB/s per direction per GPU (what a ring all-reduce is bound by).
# PCIe x16: Gen3 15.75, Gen4 31.5, Gen5 63 GB/s per direction (PCI-SIG base specifications).
PCIE3, PCIE4 = ("PCIe Gen3 x16", 16.0), ("PCIe Gen4 x16", 32.0)
NVLINK3 = ("NVLink 3", 300.0)  # A100 SXM datasheet: 600 GB/s total, both directions
NVLINK4 = ("NVLink 4", 450.0)  # H100/H200 SXM datasheets: 900 GB/s total, both directions


DEVICES: dict[str, DeviceSpec] = {
    d.name: d
    for d in (
        _dev("t4", 16, 320, 65, 8.1, "NVIDIA T4 16 GB (g4dn)", PCIE3),  # T4: PCIe Gen3
        _dev("a10g", 24, 600, 70, 31.2, "NVIDIA A10G 24 GB (g5)", PCIE4),  # A10: PCIe Gen4
        _dev("l4", 24, 300, 121, 30.3, "NVIDIA L4 24 GB (g6)", PCIE4),  # L4: PCIe Gen4
        _dev("l40s", 48, 864, 362, 91.6, "NVIDIA L40S 48 GB (g6e)", PCIE4),  # L40S: PCIe Gen4
        _dev("a100-40gb", 40, 1555, 312, 19.5, "NVIDIA A100 SXM 40 GB (p4d)", NVLINK3),
        _dev("a100-80gb", 80, 2039, 312, 19.5, "NVIDIA A100 SXM 80 GB (p4de)", NVLINK3),
        _dev("h100", 80, 3350, 989, 67, "NVIDIA H100 SXM 80 GB (p5)", NVLINK4),
        _dev("h200", 141, 4800, 989, 67, "NVIDIA H200 141 GB (p5e)", NVLINK4),
        # GeForce cards: PCIe Gen4 (the 3090's optional NVLink bridge is not assumed).
        _dev("rtx3090", 24, 936, 71, 35.6, "NVIDIA GeForce RTX 3090 24 GB", PCIE4),
        _dev("rtx4090", 24, 1008, 165, 82.6, "NVIDIA GeForce RTX 4090 24 GB", PCIE4),
        # Nominal only; a CPU worker replaces this with a start-up measurement. Its "link" is
        # shared memory, taken at the memory bandwidth.
        _dev(
            "cpu",
            16,
            25,
            0.5,
            0.2,
            "generic CPU (measure instead: see worker metrics)",
            ("shared memory", 25.0),
        ),
    )
}

ALIASES = {
    "a100": "a100-80gb",
    "a100-80": "a100-80gb",
    "a100-40": "a100-40gb",
    "h100-sxm": "h100",
    "3090": "rtx3090",
    "4090": "rtx4090",
}


def get_device(name: str) -> DeviceSpec:
    """The spec of a device by name (case-insensitive); ValueError lists the known names."""
    key = name.strip().lower().replace("_", "-").replace(" ", "")
    key = ALIASES.get(key, key)
    if key not in DEVICES:
        raise ValueError(f"unknown device {name!r}; known: {', '.join(sorted(DEVICES))}")
    return DEVICES[key]


def guess_device(cuda_name: str) -> DeviceSpec | None:
    """Map torch.cuda.get_device_name() (e.g. 'NVIDIA H200') to a table entry, if any."""
    n = cuda_name.lower().replace(" ", "").replace("-", "")
    order = [
        ("h200", "h200"), ("h100", "h100"), ("a10080", "a100-80gb"), ("a100", "a100-40gb"),
        ("l40s", "l40s"), ("a10g", "a10g"), ("l4", "l4"), ("t4", "t4"),
        ("3090", "rtx3090"), ("4090", "rtx4090"),
    ]  # fmt: skip
    for needle, key in order:
        if needle in n:
            spec = DEVICES[key]
            if key == "a100-40gb" and "80g" in n:
                return DEVICES["a100-80gb"]
            return spec
    return None
