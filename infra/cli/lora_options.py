"""``--lora NAME=PATH``: LoRA adapters declared on the command line, each on a ``--model``.

``tide up --model BASE --lora sql=/adapters/sql --lora chat=s3://bucket/chat`` serves BASE
and two adapters on it; with several ``--model`` flags, a ``--lora`` belongs to the
``--model`` given before it (before any: the first, the default model). The parsed value
is a list of (model index, name, path); infra/fleet/local_fleet.py turns it into each
model's ``lora`` table.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from tide_fleet.infra.contract.adapters import MAX_RANK, AdapterError, check_name

LORA_HELP = (
    "serve a LoRA adapter (a PEFT folder or s3:// prefix) as NAME on the --model before it "
    "(before any: the first model); repeatable"
)


def lora_spec(text: str) -> tuple[str, str]:
    """NAME=PATH, the name checked (argparse prints the error naming --lora)."""
    name, sep, path = text.partition("=")
    if not sep or not path.strip():
        raise argparse.ArgumentTypeError(f"NAME=PATH, got {text!r}")
    try:
        check_name(name)
    except AdapterError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name, path


def lora_rank(text: str) -> int:
    """--max-lora-rank: 1 to MAX_RANK."""
    try:
        rank = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number, got {text!r}") from None
    if not 1 <= rank <= MAX_RANK:
        raise argparse.ArgumentTypeError(f"1 to {MAX_RANK}, got {rank}")
    return rank


class LoraAction(argparse.Action):
    """Appends (index of the --model given so far, name, path)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
        values: str | Sequence[Any] | None, option_string: str | None = None,
    ) -> None:  # fmt: skip
        name, path = values  # type: ignore[misc]  # lora_spec's pair
        index = max(len(getattr(namespace, "model", None) or []) - 1, 0)
        declared = [*(getattr(namespace, self.dest, None) or []), (index, name, path)]
        setattr(namespace, self.dest, declared)


def add_lora_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lora", action=LoraAction, type=lora_spec, default=None, metavar="NAME=PATH",
        help=LORA_HELP,
    )  # fmt: skip
