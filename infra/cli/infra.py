"""``tide infra``: deployment helpers. Today ``tide infra tfvars``; more subcommands later."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from tide_fleet.infra.fleet.fleet_config import DEFAULT_FLEET_FILE


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    infra = sub.add_parser("infra", help="deployment helpers (Terraform variables)")
    isub = infra.add_subparsers(dest="infra_command", required=True)
    tf = isub.add_parser(
        "tfvars",
        help="render terraform.tfvars.json for terraform/examples/two_pools from fleet.toml",
        description="Write the Terraform variables of the fleet: [aws] settings, the absolute "
        "path and SHA-256 of the Tide wheel [aws] tide_wheel names (the hosts install that "
        "build, checked by its hash), one entry per [pools.NAME] (its Auto Scaling group is "
        "<name_prefix>-NAME) and the fleet file itself for the controller host. Fails, naming "
        "the field, on a fleet AWS would refuse or a file that is not a tide-fleet wheel.",
    )
    tf.add_argument(
        "--fleet", default=DEFAULT_FLEET_FILE, help=f"fleet file (default {DEFAULT_FLEET_FILE})"
    )
    tf.add_argument(
        "-o", "--output", default="-", help="file to write (default -: standard output)"
    )
    tf.set_defaults(func=cmd_tfvars)


def cmd_tfvars(args: argparse.Namespace) -> int:
    from tide_fleet.infra.fleet.tfvars import render_file

    try:
        text = render_file(args.fleet)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    _write_atomically(Path(args.output), text)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _write_atomically(path: Path, text: str) -> None:
    """Terraform never reads a half-written file, even if this process is killed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
