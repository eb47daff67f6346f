"""The argparse types the commands share: dtypes, byte sizes, input paths, a prompt template.

Each raises ``argparse.ArgumentTypeError``, which the ``tide`` parser prints as one line
naming the option (main.py). Torch-free: every command's parser imports it.
"""

from __future__ import annotations

import argparse
import string
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from pathlib import Path

# Spellings people type, by the canonical name the engine and the planner use.
DTYPE_SPELLINGS: dict[str, tuple[str, ...]] = {
    "float32": ("fp32", "float", "f32"),
    "bfloat16": ("bf16",),
    "float16": ("fp16", "half", "f16"),
    "fp8": ("float8",),
    "int8": (),
}

# Decimal units are powers of 1000, binary ones powers of 1024 (IEC): 1MB = 10^6 bytes,
# 1MiB = 2^20 bytes. Matched without regard to case.
SIZE_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
SIZE_HELP = (
    "bytes, or a number with a unit: KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB of 1024"
)


def dtype_option(*canonical: str) -> Callable[[str], str]:
    """A dtype argument: any spelling of the `canonical` names, read as that name."""
    accepted = {name: name for name in canonical}
    accepted |= {alias: name for name in canonical for alias in DTYPE_SPELLINGS[name]}

    def parse(text: str) -> str:
        name = accepted.get(text.strip().lower().removeprefix("torch."))
        if name is None:
            raise argparse.ArgumentTypeError(
                f"unknown dtype {text!r}; accepted: {dtype_help(*canonical)}"
            )
        return name

    return parse


def dtype_help(*canonical: str) -> str:
    """'float32 (or fp32, float, f32), ...': the names and the spellings each accepts."""
    return ", ".join(
        f"{name} (or {', '.join(DTYPE_SPELLINGS[name])})" if DTYPE_SPELLINGS[name] else name
        for name in canonical
    )


def byte_size(text: str, plain_unit: str = "b") -> int:
    """A size in bytes from '64MB', '1.5GiB' or '4096'; a number without a unit is in
    `plain_unit`. Raises ArgumentTypeError naming the units it takes."""
    body = text.strip().replace("_", "").replace(",", "")
    digits = body.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ").strip()
    unit = body[len(digits) :].strip().lower() or plain_unit.lower()
    try:
        number = Decimal(digits)
    except InvalidOperation:
        number = Decimal("NaN")
    if unit not in SIZE_UNITS or not number.is_finite():
        plain = "bytes" if plain_unit.lower() == "b" else plain_unit
        raise argparse.ArgumentTypeError(
            f"expected a number of {plain} or a size with a unit such as 64MB or 2GiB, got "
            f"{text!r} (units: B, KB, MB, GB, TB = powers of 1000; KiB, MiB, GiB, TiB = "
            "powers of 1024)"
        )
    if number < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text!r}")
    if unit == "b" and number != number.to_integral_value():
        raise argparse.ArgumentTypeError(f"expected whole bytes, got {text!r}")
    return int(number * SIZE_UNITS[unit])


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        reason = "is a folder, not a file" if path.is_dir() else "no such file"
        raise argparse.ArgumentTypeError(f"{reason}: {text}")
    return path


def existing_folder(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        reason = "is a file, not a folder" if path.exists() else "no such folder"
        raise argparse.ArgumentTypeError(f"{reason}: {text}")
    return path


LITERAL_BRACES = "write {{ and }} for literal braces"


def text_template(text: str) -> str:
    """A str.format template whose one field is {text} (at least once)."""
    fields: list[str] = []
    pending = [text]
    try:
        while pending:
            for _, field, spec, _ in string.Formatter().parse(pending.pop()):
                if field is not None:
                    fields.append(field)
                if spec:
                    pending.append(spec)  # a nested field such as {text:{width}}
    except ValueError as e:  # a lone { or }
        raise argparse.ArgumentTypeError(f"{e}; {LITERAL_BRACES}") from None
    unknown = next((f for f in fields if f != "text"), None)
    if unknown is not None:
        raise argparse.ArgumentTypeError(
            f"unknown field {{{unknown}}}: only {{text}} is filled in; {LITERAL_BRACES}"
        )
    if not fields:
        raise argparse.ArgumentTypeError("must contain {text}, where each document goes")
    return text
