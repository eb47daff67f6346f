"""Every Triton launch goes through ``launch``: it checks devices and can record what each
launch would compile.

Devices: a compiled kernel refuses a CPU pointer, but Triton's CPU interpreter (what CI
runs) takes any pointer, so a CPU tensor handed to a GPU kernel passes every test and
fails on the first GPU start. Under the interpreter (or with ``TIDE_CHECK_DEVICES=1``)
``launch`` refuses a tensor that is not on the device of the launch's first tensor (the
query, or the key of a KV write). Compiled launches skip the check (a few microseconds a
launch, ~100 launches a decode step): there Triton refuses such a pointer itself.

Compiles: Triton compiles one variant per distinct specialisation key: the constexpr
values, each tensor's dtype and 16-byte alignment, and for every int argument not listed
in ``do_not_specialize`` whether it is 1 and whether it divides by 16. ``record_launches``
collects that key per launch (interpreted or compiled), so a test can prove that serving
longer contexts compiles nothing new.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch


class DeviceMismatch(RuntimeError):
    """A tensor argument is not on the launch's device."""


CHECK_DEVICES = "1" in (os.environ.get("TRITON_INTERPRET"), os.environ.get("TIDE_CHECK_DEVICES"))
_records: list[set[tuple[Any, ...]]] = []


def check_devices(op: str, tensors: Mapping[str, torch.Tensor | None]) -> torch.device:
    """The device of the first tensor; DeviceMismatch naming any tensor elsewhere."""
    device: torch.device | None = None
    first = ""
    for name, t in tensors.items():
        if t is None:
            continue
        if device is None:
            device, first = t.device, name
        elif t.device != device:
            raise DeviceMismatch(
                f"{op}: {name} is on {t.device} but {first} is on {device}; every tensor of a "
                "kernel launch must be on one device (a compiled GPU kernel refuses CPU pointers)"
            )
    if device is None:
        raise ValueError(f"{op}: no tensor arguments")
    return device


def _spec(value: Any, specialised: bool) -> Any:
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), value.data_ptr() % 16 == 0)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value == 1, value % 16 == 0) if specialised else ("int",)
    return (type(value).__name__,)


def specialisation_key(
    name: str,
    args: Mapping[str, Any],
    constexprs: Mapping[str, Any],
    unspecialised: tuple[str, ...] = (),
) -> tuple[Any, ...]:
    """What Triton keys its compile cache on for this launch (device aside)."""
    runtime = tuple((k, _spec(v, k not in unspecialised)) for k, v in args.items())
    return (name, runtime, tuple(sorted(constexprs.items())))


def launch(
    kernel: Any,
    grid: tuple[int, ...],
    name: str,
    args: Mapping[str, Any],
    constexprs: Mapping[str, Any],
    unspecialised: tuple[str, ...] = (),
) -> None:
    """Check devices (see above), record the specialisation key where asked, launch."""
    if CHECK_DEVICES:
        check_devices(name, {k: v for k, v in args.items() if isinstance(v, torch.Tensor)})
    if _records:
        key = specialisation_key(name, args, constexprs, unspecialised)
        for record in _records:
            record.add(key)
    kernel[grid](**args, **constexprs)


@contextlib.contextmanager
def record_launches() -> Iterator[set[tuple[Any, ...]]]:
    """Collect the distinct specialisation keys of the launches made inside the block."""
    record: set[tuple[Any, ...]] = set()
    _records.append(record)
    try:
        yield record
    finally:
        _records.remove(record)
