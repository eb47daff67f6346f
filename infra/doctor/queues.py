"""What is queued and who takes it, per served model and bucket, as `tide doctor` sees it.

Queue readings are the gateway's backlog series (`tide:backlog_jobs{model,bucket}`), else
the controller's (`tide:controller_queue_jobs{model,bucket}`); who serves what comes from
the workers' heartbeats, their `model` and `buckets`. A worker of one model never serves
another model's bucket. An older gateway, worker or recording names no model (no `model`
label, none in the heartbeat): where the snapshot names exactly one model, that nameless
'' is that model, so a one-model fleet matches whatever its parts' versions; otherwise ''
stays a model of its own. Pure and torch-free.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from tide_fleet.infra.doctor.scrape import Scrape
from tide_fleet.infra.doctor.snapshot import Snapshot

Lane = tuple[str, str]  # (model, bucket)

QUEUED = (("gateway", "tide:backlog_jobs"), ("controller", "tide:controller_queue_jobs"))
OLDEST = (
    ("gateway", "tide:backlog_oldest_job_age_seconds"),
    ("controller", "tide:controller_oldest_job_age_seconds"),
)


def _reading(snap: Snapshot, series: tuple[tuple[str, str], ...]) -> dict[Lane, float]:
    """(model, bucket) -> value from the first target that has the series, as labelled."""
    for target, name in series:
        scrape: Scrape | None = getattr(snap, target)
        if scrape is not None and name in scrape.samples:
            return {(m, b): v for (m, b), v in scrape.by_labels(name, "model", "bucket").items()}
    return {}


def default_model(snap: Snapshot) -> str:
    """The model a nameless series or heartbeat belongs to: the one model this snapshot
    names, else '' (none, or several: then a nameless one cannot be placed)."""
    named = {m for m, _ in _reading(snap, QUEUED)}
    named |= {beat.model for beat in snap.worker_info.values()}
    named.discard("")
    return next(iter(named)) if len(named) == 1 else ""


def _named(
    snap: Snapshot, raw: dict[Lane, float], combine: Callable[[float, float], float]
) -> dict[Lane, float]:
    default = default_model(snap)
    out: dict[Lane, float] = {}
    for (model, bucket), v in raw.items():
        key = (model or default, bucket)
        out[key] = combine(out[key], v) if key in out else v
    return out


def queue_jobs(snap: Snapshot) -> dict[Lane, float]:
    """Queued jobs per (model, bucket): the gateway's reading, else the controller's."""
    return _named(snap, _reading(snap, QUEUED), lambda x, y: x + y)


def oldest_age(snap: Snapshot) -> dict[Lane, float]:
    """The oldest queued job's age per (model, bucket), read as queue_jobs is."""
    return _named(snap, _reading(snap, OLDEST), max)


def worker_models(snap: Snapshot) -> dict[str, str]:
    """Worker id -> the model it serves, for every live worker (heartbeat) and every
    scraped one (a scraped worker without a heartbeat: the default model)."""
    default = default_model(snap)
    out = {w: beat.model or default for w, beat in snap.worker_info.items()}
    return out | {w: default for w in snap.workers if w not in out}


def scraped_by_model(snap: Snapshot) -> dict[str, list[str]]:
    """Model -> the ids of its workers whose metrics were read, sorted."""
    models = worker_models(snap)
    out: dict[str, list[str]] = defaultdict(list)
    for w in sorted(snap.workers):
        out[models[w]].append(w)
    return dict(out)


def served_buckets(snap: Snapshot) -> set[Lane]:
    """The (model, bucket)s some live worker takes jobs from, by their heartbeats."""
    models = worker_models(snap)
    return {(models[w], b) for w, beat in snap.worker_info.items() for b in beat.buckets}


def lane_name(model: str, bucket: str) -> str:
    """A finding's subject: `<model>:<bucket>`, or the bucket alone when no model is named."""
    return f"{model}:{bucket}" if model else bucket


def model_evidence(model: str) -> dict[str, str]:
    """{"model": model} for a named model; nothing when none is (a one-model recording)."""
    return {"model": model} if model else {}
