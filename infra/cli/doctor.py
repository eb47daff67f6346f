"""`tide doctor`: read the fleet's metrics twice, a few seconds apart, and say what is wrong.

The thin collector around infra/doctor/doctor.py: it finds the controller and the workers in
Redis (hash `tide:controller`, zset `tide:workers` and each `tide:worker:{id}` heartbeat's
`metrics_url`), scrapes them and the gateway, and prints the findings. `--save DIR` keeps
the raw scrapes; `--load DIR` diagnoses saved ones offline (the tests' fixtures use it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from infra.doctor.doctor import Finding, Scrape, Snapshot, diagnose

PHASES = ("before", "after")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="diagnose a running fleet from its metrics (gateway, controller, workers)",
        description="Scrape the gateway, the controller and every worker twice, --interval "
        "seconds apart, and print each finding with its evidence and the knob to turn. "
        "Exit status: 0 healthy, 1 findings, 2 nothing could be read.",
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway's base URL")
    p.add_argument("--redis-url", default=None, help="default: REDIS_URL (finds the others)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between the readings")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds per scrape")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--save", metavar="DIR", help="also write the raw scrapes to DIR")
    p.add_argument("--load", metavar="DIR", help="diagnose scrapes saved with --save instead")
    p.set_defaults(func=cmd_doctor)


# -- collecting --------------------------------------------------------------------------------


def local_fleet_redis_url() -> str | None:
    """The embedded Redis of a `tide up` started from this folder (it writes its URL)."""
    from infra.settings import REDIS_URL_FILE, get_settings

    path = get_settings().data_dir / REDIS_URL_FILE
    return path.read_text().strip() if path.is_file() else None


def discover(redis_url: str) -> tuple[str, dict[str, dict[str, str]]]:
    """The controller's metrics URL ('' if none) and each live worker's heartbeat."""
    import redis

    from infra.wire.protocol import Keys

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        controller = client.hget(Keys.controller, "metrics_url") or ""
        ids = client.zrange(Keys.workers, 0, -1)
        pipe = client.pipeline(transaction=False)
        for worker_id in ids:
            pipe.hgetall(Keys.worker(worker_id))
        infos = pipe.execute()
    finally:
        client.close()
    return controller, {w: info for w, info in zip(ids, infos, strict=True) if info}


def scrape_all(targets: dict[str, str], timeout: float) -> tuple[dict[str, str], list[str]]:
    """GET every URL; the texts by target name, and one line per target that failed."""
    import httpx

    texts, errors = {}, []
    with httpx.Client(timeout=timeout) as client:
        for name, url in targets.items():
            try:
                response = client.get(url)
                response.raise_for_status()
                texts[name] = response.text
            except httpx.HTTPError as e:
                errors.append(f"{name}: cannot read {url}: {type(e).__name__}: {e}")
    return texts, errors


def snapshot(texts: dict[str, str], infos: dict[str, dict[str, str]], at: float) -> Snapshot:
    """Targets are named `gateway`, `controller` and `worker:<id>`."""
    snap = Snapshot(at=at, worker_info=infos)
    for name, text in texts.items():
        scrape = Scrape.parse(text)
        if name == "gateway":
            snap.gateway = scrape
        elif name == "controller":
            snap.controller = scrape
        else:
            snap.workers[name.removeprefix("worker:")] = scrape
    return snap


def targets_for(url: str, controller: str, infos: dict[str, dict[str, str]]) -> dict[str, str]:
    targets = {"gateway": url.rstrip("/") + "/metrics"}
    if controller:
        targets["controller"] = controller
    for worker_id, info in infos.items():
        if info.get("metrics_url"):
            targets[f"worker:{worker_id}"] = info["metrics_url"]
    return targets


# -- saving and loading ----------------------------------------------------------------------


def _file(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", name).replace(":", "@") + ".prom"


def save(folder: Path, texts: list[dict[str, str]], meta: dict[str, Any]) -> None:
    for phase, phase_texts in zip(PHASES, texts, strict=True):
        (folder / phase).mkdir(parents=True, exist_ok=True)
        for name, text in phase_texts.items():
            (folder / phase / _file(name)).write_text(text)
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def load(folder: Path) -> tuple[Snapshot, Snapshot, float]:
    """Snapshots saved by --save (or written by hand: see tests/infra/doctor/snapshots)."""
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        raise ValueError(f"--load: {meta_path} is missing (expected meta.json, before/, after/)")
    meta = json.loads(meta_path.read_text())
    interval = float(meta.get("interval_s", 0))
    if interval <= 0:
        raise ValueError(f"--load: {meta_path}: interval_s must be positive, got {interval}")
    snaps = []
    for i, phase in enumerate(PHASES):
        texts = {}
        for path in sorted((folder / phase).glob("*.prom")):
            texts[path.stem.replace("@", ":")] = path.read_text()
        at = float(meta.get("at", [0.0, interval])[i])
        snaps.append(snapshot(texts, meta.get("workers", {}), at))
    return snaps[0], snaps[1], interval


# -- the command -----------------------------------------------------------------------------


def collect(args: argparse.Namespace) -> tuple[Snapshot, Snapshot, list[str]]:
    from infra.settings import get_settings

    errors: list[str] = []
    redis_url = args.redis_url or get_settings().redis_url or local_fleet_redis_url()
    controller, infos = "", {}
    if redis_url:
        try:
            controller, infos = discover(redis_url)
        except Exception as e:  # any Redis trouble: diagnose what the gateway shows
            errors.append(f"redis: cannot read {redis_url}: {type(e).__name__}: {e}")
    else:
        errors.append(
            "redis: no --redis-url, REDIS_URL or local `tide up`: workers and controller not found"
        )
    targets = targets_for(args.url, controller, infos)
    texts: list[dict[str, str]] = []
    ats = []
    for i in range(2):
        if i:
            time.sleep(args.interval)
        ats.append(time.time())
        phase_texts, phase_errors = scrape_all(targets, args.timeout)
        texts.append(phase_texts)
        errors.extend(e for e in phase_errors if e not in errors)
    if args.save:
        meta = {"interval_s": args.interval, "at": ats, "workers": infos, "errors": errors}
        save(Path(args.save), texts, meta)
    before, after = (snapshot(t, infos, at) for t, at in zip(texts, ats, strict=True))
    return before, after, errors


def render(findings: list[Finding], before: Snapshot, after: Snapshot, interval: float,
           errors: list[str]) -> str:  # fmt: skip
    seen = ["gateway"] if after.gateway else []
    seen += ["controller"] if after.controller else []
    seen += [f"{len(after.workers)} worker(s)"]
    lines = [f"tide doctor: read {', '.join(seen)} twice, {interval:g} s apart"]
    lines += [f"  ! {e}" for e in errors]
    if not findings:
        lines.append("no findings: nothing in these metrics looks wrong")
    for f in findings:
        lines.append("")
        lines.append(f"[{f.rule}] {f.title} ({f.subject})")
        lines.append("  evidence: " + "; ".join(f"{k} = {_show(v)}" for k, v in f.evidence.items()))
        lines.append(f"  knob: {f.knob}")
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
    if args.load:
        try:
            before, after, interval = load(Path(args.load))
        except (OSError, ValueError) as e:
            print(str(e), file=sys.stderr)
            return 2
        errors: list[str] = []
    else:
        before, after, errors = collect(args)
        interval = after.at - before.at or args.interval
    if after.gateway is None and after.controller is None and not after.workers:
        print("tide doctor: no metrics could be read", file=sys.stderr)
        for e in errors:
            print(f"  {e}", file=sys.stderr)
        return 2
    findings = diagnose(before, after, interval)
    if args.json:
        workers = sorted(after.workers)
        body = {"interval_s": round(interval, 3), "gateway": after.gateway is not None,
                "controller": after.controller is not None, "workers": workers,
                "errors": errors, "findings": [f.to_dict() for f in findings]}  # fmt: skip
        print(json.dumps(body, indent=2))
    else:
        print(render(findings, before, after, interval, errors))
    return 1 if findings else 0
