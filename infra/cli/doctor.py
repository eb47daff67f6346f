"""`tide doctor`: read the fleet's metrics twice, a few seconds apart, and say what is wrong.

The command around infra/doctor: collect.py finds the controller and the workers in Redis
and scrapes them and the gateway (or loads a recording), rules.py diagnoses, and this prints
the findings. `--save DIR` keeps the raw scrapes; `--load DIR` diagnoses saved ones offline
(the tests' fixtures use it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tide_fleet.infra.doctor.adapters import adapter_views, render_adapters
from tide_fleet.infra.doctor.queues import scraped_by_model
from tide_fleet.infra.doctor.rules import Finding, diagnose
from tide_fleet.infra.doctor.snapshot import Snapshot


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="diagnose a running fleet from its metrics (gateway, controller, workers)",
        description="Scrape the gateway, the controller and every worker twice, --interval "
        "seconds apart, and print each finding with its evidence and the knob to turn. "
        "Exit status: 0 healthy, 1 findings, 2 nothing could be read. With --json, stdout "
        "is one JSON object in every case, what could not be read in its errors list.",
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway's base URL")
    p.add_argument("--redis-url", default=None, help="default: REDIS_URL (finds the others)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between the readings")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds per scrape")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--save", metavar="DIR", help="also write the raw scrapes to DIR")
    p.add_argument("--load", metavar="DIR", help="diagnose scrapes saved with --save instead")
    p.set_defaults(func=cmd_doctor)


# -- the command -----------------------------------------------------------------------------


def render(findings: list[Finding], before: Snapshot, after: Snapshot, interval: float,
           errors: list[str]) -> str:  # fmt: skip
    seen = ["gateway"] if after.gateway else []
    seen += ["controller"] if after.controller else []
    seen += [f"{len(after.workers)} worker(s)"]
    by_model = scraped_by_model(after)
    if len(by_model) > 1:  # say whose: rules about queues and workers are per model
        seen[-1] += " (" + ", ".join(f"{m or '?'}: {len(w)}" for m, w in by_model.items()) + ")"
    lines = [f"tide doctor: read {', '.join(seen)} twice, {interval:g} s apart"]
    lines += [f"  ! {e}" for e in errors]
    if not findings:
        lines.append("no findings: nothing in these metrics looks wrong")
    for f in findings:
        lines.append("")
        lines.append(f"[{f.rule}] {f.title} ({f.subject})")
        lines.append("  evidence: " + "; ".join(f"{k} = {_show(v)}" for k, v in f.evidence.items()))
        lines.append(f"  knob: {f.knob}")
    lines += render_adapters(after)  # which adapters the work is for, and where they are
    return "\n".join(lines)


def _show(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} {x}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.interval <= 0 or args.interval > 600:
        print(f"--interval must be in (0, 600] seconds, got {args.interval}", file=sys.stderr)
        return 2
    # collect.py brings httpx and redis: imported here, so other `tide` commands start light.
    from tide_fleet.infra.doctor.collect import collect, load

    if args.load:
        try:
            before, after, interval = load(Path(args.load))
        except (OSError, ValueError) as e:
            if not args.json:
                print(str(e), file=sys.stderr)
                return 2
            return _nothing_read(args, [" ".join(str(e).split())], None)
        errors: list[str] = []
    else:
        save_to = Path(args.save) if args.save else None
        try:
            before, after, errors = collect(
                args.url, args.redis_url, args.interval, args.timeout, save_to
            )
        except OSError as e:  # --save DIR not writable
            return _nothing_read(args, [f"--save {args.save}: {e}"], args.interval)
        interval = after.at - before.at or args.interval
    if after.gateway is None and after.controller is None and not after.workers:
        return _nothing_read(args, errors, interval)
    findings = diagnose(before, after, interval)
    if args.json:
        print(json.dumps(_json_body(after, interval, errors, findings), indent=2))
    else:
        print(render(findings, before, after, interval, errors))
    return 1 if findings else 0


def _json_body(
    after: Snapshot | None, interval: float | None, errors: list[str], findings: list[Finding]
) -> dict[str, Any]:
    return {
        "interval_s": round(interval, 3) if interval is not None else None,
        "gateway": after is not None and after.gateway is not None,
        "controller": after is not None and after.controller is not None,
        "workers": sorted(after.workers) if after is not None else [],
        "models": scraped_by_model(after) if after is not None else {},
        "adapters": [v.to_dict() for v in adapter_views(after)] if after is not None else [],
        "errors": errors,
        "findings": [f.to_dict() for f in findings],
    }


def _nothing_read(args: argparse.Namespace, errors: list[str], interval: float | None) -> int:
    """Exit status 2; with --json, the usual object (no findings, the errors) on stdout."""
    if args.json:
        print(json.dumps(_json_body(None, interval, errors, []), indent=2))
        return 2
    print("tide doctor: no metrics could be read", file=sys.stderr)
    for line in errors:
        print(f"  {line}", file=sys.stderr)
    return 2
