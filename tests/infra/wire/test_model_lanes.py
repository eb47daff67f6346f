"""Many models on one wire: queue names per model, the catalog of served models, and the
backlog kept per (model, bucket) by the job scripts."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from tide_fleet.infra.jobs.schemas import JobCreate
from tide_fleet.infra.jobs.submission import ModelInfo, build_job
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.backlog import read_backlog, read_lanes
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.models import catalog, served
from tide_fleet.infra.wire.protocol import consume_order, parse_queue, queue_name


def test_the_default_model_keeps_its_queue_names_and_others_carry_theirs() -> None:
    assert queue_name("short", "interactive") == "tide.short.interactive"
    assert queue_name("long", "batch", "llama-3.1") == "tide.llama-3.1.long.batch"
    assert consume_order(["short"], "b") == ["tide.b.short.interactive", "tide.b.short.batch"]
    assert parse_queue("tide.short.batch") == ("", "short", "batch")
    assert parse_queue("tide.llama-3.1.long.batch") == ("llama-3.1", "long", "batch")
    assert parse_queue("tide.short.short.interactive") == ("short", "short", "interactive")
    assert parse_queue("tide.webhooks") is None and parse_queue("tide.batches") is None


def test_the_catalog_resolves_names_aliases_and_the_default() -> None:
    cat = served(
        [{"name": "a", "model": "dummy:tiny"},
         {"name": "b", "model": "/m/b", "aliases": ["bee"], "bucket_short_max": 16}],
        "dummy:tiny",
    )  # fmt: skip
    assert cat.resolve(None) is cat.default and cat.default.lane == ""
    assert cat.resolve("bee") is cat.resolve("b") and cat.resolve("b").lane == "b"  # type: ignore[union-attr]
    assert cat.resolve("c") is None
    # The model a worker's heartbeat names: an alias is its model, none is the default.
    assert [cat.runs(x) for x in ("b", "bee", "", "c")] == ["b", "b", "a", "c"]
    s = Settings()
    assert cat.resolve("b").bucket(17, s) == "medium"  # type: ignore[union-attr]
    assert cat.default.bucket(17, s) == "short"  # the settings' thresholds
    # A worker finds its model by served name, else by weights, else it is the default.
    assert cat.for_worker("bee", None).lane == "b"
    assert cat.for_worker(None, "/m/b").name == "b"
    assert cat.for_worker(None, "/other").lane == ""
    assert cat.for_worker("new", "/n").lane == "new"
    with pytest.raises(ValueError, match="used twice"):
        served([{"name": "a"}, {"name": "b", "aliases": ["a"]}], "x")
    one = catalog(Settings(model="dummy:tiny"))
    assert one.names() == ["dummy:tiny"] and one.default.default


def test_backlog_is_kept_per_model(redis_client: redis.Redis, tiny_path: Path) -> None:
    cat = served([{"name": "a", "model": str(tiny_path)}, {"name": "b", "model": str(tiny_path)}],
                 str(tiny_path))  # fmt: skip
    settings, info, store = (
        Settings(model=str(tiny_path)),
        ModelInfo.load(str(tiny_path)),
        JobStore(redis_client),
    )
    body = JobCreate(prompt="once upon a time", max_tokens=8)
    b_job = build_job(settings, info, "t", body, None, served=cat.resolve("b"))
    assert b_job.queue == "tide.b.short.interactive" and b_job.fields["model"] == "b"
    b_id = store.create(b_job)["id"]
    a_id = store.create(build_job(settings, info, "t", body, None, served=cat.default))["id"]
    lanes = read_lanes(redis_client, ["", "b"])
    assert lanes["b"]["short"].jobs == 1 and lanes[""]["short"].jobs == 1
    assert lanes["b"]["short"].arrived_jobs == 1
    assert queues.depth(redis_client, "tide.b.short.interactive") == 1
    assert store.get(a_id)["model"] == "a"  # type: ignore[index]
    assert store.cancel(b_id, "t")
    assert read_backlog(redis_client, lane="b")["short"].jobs == 0
    assert read_backlog(redis_client)["short"].jobs == 1  # the other model's is untouched
