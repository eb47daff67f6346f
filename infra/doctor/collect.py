"""Gathering `tide doctor`'s snapshots: from a live fleet, or from a saved recording.

It finds the controller and the workers in Redis (hash `tide:controller`, and each worker's
heartbeat, infra/wire/heartbeats.py, with its `metrics_url`), scrapes them and the gateway
twice, and can save the raw scrapes (`--save DIR`) for `--load DIR` to diagnose offline (the
tests' fixtures are such recordings).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, cast

import httpx
import redis

from tide_fleet.infra.doctor.scrape import Scrape
from tide_fleet.infra.doctor.snapshot import Snapshot
from tide_fleet.infra.settings import REDIS_URL_FILE, get_settings
from tide_fleet.infra.wire.backlog import adapter_backlog
from tide_fleet.infra.wire.heartbeats import Heartbeat, read_heartbeats
from tide_fleet.infra.wire.protocol import Keys

PHASES = ("before", "after")


# -- a live fleet ------------------------------------------------------------------------------


def local_fleet_redis_url() -> str | None:
    """The embedded Redis of a `tide up` started from this folder (it writes its URL)."""
    path = get_settings().data_dir / REDIS_URL_FILE
    return path.read_text().strip() if path.is_file() else None


def discover(redis_url: str) -> tuple[str, dict[str, Heartbeat], dict[str, int]]:
    """The controller's metrics URL ('' if none), each live worker's heartbeat, and the
    queued jobs per LoRA adapter."""
    client = redis.Redis.from_url(redis_url)
    try:
        controller = cast(bytes | None, client.hget(Keys.controller, "metrics_url")) or b""
        beats = read_heartbeats(client)
        adapters = adapter_backlog(client)
    finally:
        client.close()
    return controller.decode(), beats, adapters


def scrape_all(targets: dict[str, str], timeout: float) -> tuple[dict[str, str], list[str]]:
    """GET every URL; the texts by target name, and one line per target that failed."""
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


def snapshot(
    texts: dict[str, str], beats: dict[str, Heartbeat], at: float,
    adapters: dict[str, int] | None = None,
) -> Snapshot:  # fmt: skip
    """Targets are named `gateway`, `controller` and `worker:<id>`; `adapters`: queued jobs
    per LoRA adapter."""
    snap = Snapshot(at=at, worker_info=beats, adapter_queue=dict(adapters or {}))
    for name, text in texts.items():
        scrape = Scrape.parse(text)
        if name == "gateway":
            snap.gateway = scrape
        elif name == "controller":
            snap.controller = scrape
        else:
            snap.workers[name.removeprefix("worker:")] = scrape
    return snap


def targets_for(url: str, controller: str, beats: dict[str, Heartbeat]) -> dict[str, str]:
    targets = {"gateway": url.rstrip("/") + "/metrics"}
    if controller:
        targets["controller"] = controller
    for worker_id, beat in beats.items():
        if beat.metrics_url:
            targets[f"worker:{worker_id}"] = beat.metrics_url
    return targets


def collect(
    url: str,
    redis_url: str | None,
    interval: float,
    timeout: float,
    save_to: Path | None = None,
) -> tuple[Snapshot, Snapshot, list[str]]:
    """Two snapshots `interval` seconds apart, and what could not be read. Without a
    `redis_url`, REDIS_URL, else the local `tide up`'s Redis, finds the fleet."""
    errors: list[str] = []
    redis_url = redis_url or get_settings().redis_url or local_fleet_redis_url()
    controller = ""
    beats: dict[str, Heartbeat] = {}
    adapters: dict[str, int] = {}
    if redis_url:
        try:
            controller, beats, adapters = discover(redis_url)
        except Exception as e:  # any Redis trouble: diagnose what the gateway shows
            errors.append(f"redis: cannot read {redis_url}: {type(e).__name__}: {e}")
    else:
        errors.append(
            "redis: no --redis-url, REDIS_URL or local `tide up`: workers and controller not found"
        )
    targets = targets_for(url, controller, beats)
    texts: list[dict[str, str]] = []
    ats = []
    for i in range(2):
        if i:
            time.sleep(interval)
        ats.append(time.time())
        phase_texts, phase_errors = scrape_all(targets, timeout)
        texts.append(phase_texts)
        errors.extend(e for e in phase_errors if e not in errors)
    if save_to is not None:
        workers = {w: beat.to_hash() for w, beat in beats.items()}
        meta = {"interval_s": interval, "at": ats, "workers": workers, "errors": errors,
                "adapter_queue": adapters}  # fmt: skip
        save(save_to, texts, meta)
    before, after = (snapshot(t, beats, at, adapters) for t, at in zip(texts, ats, strict=True))
    return before, after, errors


# -- recordings --------------------------------------------------------------------------------


def _file(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", name).replace(":", "@") + ".prom"


def save(folder: Path, texts: list[dict[str, str]], meta: dict[str, Any]) -> None:
    """A recording: meta.json (interval_s, at, the workers' heartbeat hashes, queued jobs
    per adapter) and one exposition file per target under before/ and after/."""
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
    beats = {w: Heartbeat.from_hash(h, w) for w, h in meta.get("workers", {}).items()}
    adapters = {str(k): int(v) for k, v in meta.get("adapter_queue", {}).items()}
    snaps = []
    for i, phase in enumerate(PHASES):
        texts = {}
        for path in sorted((folder / phase).glob("*.prom")):
            texts[path.stem.replace("@", ":")] = path.read_text()
        at = float(meta.get("at", [0.0, interval])[i])
        snaps.append(snapshot(texts, beats, at, adapters))
    return snaps[0], snaps[1], interval
