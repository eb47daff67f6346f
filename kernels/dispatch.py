"""Which implementation serves each op on each hardware class: the one table, and the switch.

``TABLE`` (``kernels/kernel_table.py``) maps (op, hardware class) to an implementation and
why; this module resolves it per device and applies forces. The code that runs an op
asks ``impl(op, device)``; an implementation whose own conditions a call does not meet
(dtype, shape) hands it on down a fixed chain: a native GEMM or oneDNN's matmul to ``torch``
(``F.linear``), the native GEMV to the op's ``gemm`` implementation, native attention and
elementwise kernels (native or Triton) to ``torch``. Those conditions stay beside the kernels
(``linear.py``, ``attention.py``, ``elementwise.py``); which implementation is asked first is
only decided here.

A device's class is ``cuda``, or on CPU what the native build runs on (the classes are
listed in kernel_table.py). Other devices (``meta`` in tests) take the torch reference
throughout.

Forcing: ``TIDE_KERNELS="gemm=torch,decode_attention=torch"`` (checked against ``accepted``:
a ValueError names the variable, the op and what this machine accepts). The engine's
``--attention-backend`` forces the three attention ops the same way, through ``force``.
``python -m tide_fleet.kernels`` prints the table as it resolves here.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from tide_fleet.kernels import cpu as cpu_kernels
from tide_fleet.kernels.kernel_table import (
    ALSO,
    CLASSES,
    FORCE_VAR,
    NATIVE,
    OPS,
    PAIRS,
    TABLE,
    Choice,
    accepted,
    is_native,
    markdown,
    runs_on,
)

__all__ = [
    "ALSO", "CLASSES", "FORCE_VAR", "NATIVE", "OPS", "PAIRS", "TABLE", "Choice", "Resolved",
    "accepted", "cpu_class", "describe", "env_forces", "force", "hardware_class", "impl",
    "is_default", "is_native", "machine_classes", "markdown", "refresh", "runs_on",
]  # fmt: skip


@dataclass(frozen=True)
class Resolved:
    op: str
    cls: str
    impl: str
    source: str  # default | forced
    reason: str


_forced: dict[str, tuple[str, str]] = {}  # op -> (impl, who forced it): force()


def force(op: str, impl: str | None, origin: str) -> None:
    """Force op to impl in this process, over TIDE_KERNELS (``--attention-backend`` does);
    None lifts a force that ``origin`` set."""
    if impl is not None:
        _check(op, impl, origin)
        _forced[op] = (impl, origin)
    elif op in _forced and _forced[op][1] == origin:
        del _forced[op]
    refresh()


def refresh() -> None:
    """Read TIDE_KERNELS and the forces again (after a test changes them)."""
    _resolved.cache_clear()
    env_forces.cache_clear()


@functools.cache
def env_forces() -> dict[str, str]:
    """TIDE_KERNELS parsed: {op: impl}; a ValueError for an unknown op, or an impl this
    machine's classes cannot run. Read here, not through infra.settings: the kernels also
    serve an engine-only install, which has no settings (as TIDE_CHECK_DEVICES, launch.py)."""
    forces = {}
    for item in filter(None, (part.strip() for part in os.environ.get(FORCE_VAR, "").split(","))):
        op, eq, impl = (s.strip() for s in item.partition("="))
        if not eq:
            raise ValueError(f"{FORCE_VAR}: {item!r} is not op=impl (e.g. gemm=torch)")
        _check(op, impl, FORCE_VAR)
        forces[op] = impl
    return forces


def _check(op: str, impl: str, origin: str) -> None:
    if op not in TABLE:
        raise ValueError(f"{origin}: unknown op {op!r}; the ops are {', '.join(OPS)}")
    if torch.cuda.is_available() and impl in accepted(op, "cuda"):
        return  # without asking the CPU (a GPU worker builds no native CPU kernels)
    local = machine_classes()
    ok = sorted({i for cls in local for i in accepted(op, cls)})
    if impl not in ok:
        raise ValueError(
            f"{origin}: {op}={impl!r} does not run on this machine ({', '.join(local)}); "
            f"{op} accepts {', '.join(ok)}"
        )


def machine_classes() -> tuple[str, ...]:
    """This machine's hardware classes: its CPU's, and cuda where torch sees a GPU."""
    return (cpu_class(), "cuda") if torch.cuda.is_available() else (cpu_class(),)


@functools.cache
def cpu_class() -> str:
    isa = cpu_kernels.isa()
    return f"cpu-{isa}" if isa else "cpu-no-native"


def hardware_class(device: torch.device | str) -> str | None:
    """The class of a device: cuda, this CPU's, or None (another device: torch throughout)."""
    kind = device if isinstance(device, str) else device.type
    return "cuda" if kind == "cuda" else cpu_class() if kind == "cpu" else None


@functools.cache
def _resolved(kind: str) -> dict[str, Resolved]:
    cls = hardware_class(kind)
    if cls is None:
        return {op: Resolved(op, kind, "gemm" if op == "gemv" else "torch", "default",
                             "not a Tide device: the torch reference") for op in OPS}  # fmt: skip
    env = env_forces()
    table = {}
    for op in OPS:
        choice = TABLE[op][cls]
        impl, origin = _forced.get(op) or (env.get(op), FORCE_VAR)
        if impl is None or impl == choice.impl:
            table[op] = Resolved(op, cls, choice.impl, "default" if impl is None else "forced",
                                 choice.reason)  # fmt: skip
            continue
        if impl not in accepted(op, cls):
            raise ValueError(f"{origin}: {op}={impl!r} does not run on {cls}; {op} accepts "
                             f"{', '.join(accepted(op, cls))}")  # fmt: skip
        table[op] = Resolved(op, cls, impl, "forced", f"forced by {origin}")
    if cls == "cpu-amx":  # the AVX-512 BF16 attention paths where tiles would run
        ops = cpu_kernels.ops()
        ops.decode_attention_prefer_vector(table["decode_attention"].impl == "cpp-avx512bf16")
        ops.attention_pass_prefer_vector(table["prefill_attention"].impl == "cpp-avx512bf16")
    return table


def impl(op: str, device: torch.device | str) -> str:
    """The implementation that serves op on device (a forced one where forced)."""
    return _resolved(device if isinstance(device, str) else device.type)[op].impl


def is_default(ops: tuple[str, ...], device: torch.device) -> bool:
    """Every op takes its class's default here: what the whole-step native calls embed."""
    table = _resolved(device.type)
    if hardware_class(device) is None:
        return False
    return all(table[op].impl == TABLE[op][table[op].cls].impl for op in ops)


def describe(device: torch.device | str | None = None) -> dict[str, Resolved]:
    """The table as it resolves for device (default: cuda where there is one, else cpu)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return dict(_resolved(device if isinstance(device, str) else device.type))


def main() -> int:
    """Print the table as it resolves here (``python -m tide_fleet.kernels``)."""
    for kind in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
        for row in describe(kind).values():
            print(f"{row.cls:15} {row.op:18} {row.impl:15} {row.source:8} {row.reason}")
    return 0
