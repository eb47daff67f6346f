"""The ``tide`` command line: the parser and the dispatch.

Each module in SUBCOMMAND_MODULES registers its own subcommands (``add_parser(sub)``), in
the order ``tide --help`` lists them; each command's imports sit in its function, so that
``tide`` starts without loading the engine or the fleet.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import NoReturn

SUBCOMMAND_MODULES = (
    "tide_fleet.infra.cli.generate",
    "tide_fleet.infra.cli.serve",
    "tide_fleet.infra.cli.client",
    "tide_fleet.infra.cli.batch",
    "tide_fleet.infra.cli.bench",
    "tide_fleet.infra.cli.plan",
    "tide_fleet.infra.cli.doctor",
    "tide_fleet.infra.cli.infra",
    "tide_fleet.infra.cli.simulate",
)


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line on stderr (exit status 2), with no
    usage block: ``tide plan: error: argument --weight-dtype: unknown dtype ...``. The
    subcommands' parsers are of the same class (argparse builds them as their parent)."""

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="tide", description="Tide: a queue-driven LLM fleet.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMAND_MODULES:
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Before torch loads: its CPU allocator then backs tensors of 2 MiB and more with
    # transparent huge pages, which lifts streaming reads of weights and KV blocks by
    # about a quarter here (no TLB walk per 4 KiB page). THP_MEM_ALLOC_ENABLE=0 opts out.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
