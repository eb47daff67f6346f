"""`tide doctor` on a fleet serving LoRA adapters: each adapter's queued jobs and the workers
that hold it, live from Redis and from a recording."""

from __future__ import annotations

import json

from tide_fleet.infra.cli.main import main
from tide_fleet.infra.doctor.adapters import adapter_views
from tide_fleet.infra.doctor.collect import discover, save
from tide_fleet.infra.doctor.snapshot import Snapshot
from tide_fleet.infra.wire.heartbeats import Heartbeat
from tide_fleet.infra.wire.protocol import Keys

BEATS = {
    "w-1": Heartbeat(worker_id="w-1", pool="p", buckets=("short",), adapters=("sql", "chat"),
                     adapters_on_device=("sql",)),
    "w-2": Heartbeat(worker_id="w-2", pool="p", buckets=("short",), adapters=("sql",)),
}  # fmt: skip


def test_each_adapter_shows_its_queue_and_who_holds_it():
    snap = Snapshot(worker_info=BEATS, adapter_queue={"sql": 3, "new": 2, "gone": 0})
    views = {v.name: v for v in adapter_views(snap)}
    assert sorted(views) == ["chat", "new", "sql"]
    assert (views["sql"].queued, views["sql"].held_by, views["sql"].on_device_in) == (
        3, ["w-1", "w-2"], ["w-1"]
    )  # fmt: skip
    assert views["new"].line() == "new: 2 queued; held by no worker"
    assert views["sql"].line() == "sql: 3 queued; held by w-1 (on device), w-2"
    assert adapter_views(Snapshot(worker_info={"w": Heartbeat(worker_id="w")})) == []


def test_discover_reads_the_queued_jobs_per_adapter(redis_server, redis_client):
    redis_client.hset(Keys.adapter_backlog, mapping={"sql": 4, "old": 0})
    _, _, adapters = discover(redis_server.url)
    assert adapters == {"sql": 4}


def test_a_recording_keeps_them_and_the_report_shows_them(tmp_path, capsys):
    text = {"gateway": 'tide:backlog_jobs{bucket="short"} 0\n',
            "worker:w-1": "tide:num_requests_running 0\n"}  # fmt: skip
    meta = {"interval_s": 5.0, "at": [0.0, 5.0], "adapter_queue": {"sql": 3},
            "workers": {w: b.to_hash() for w, b in BEATS.items()}}  # fmt: skip
    save(tmp_path, [text, text], meta)
    main(["doctor", "--load", str(tmp_path), "--json"])
    body = json.loads(capsys.readouterr().out)
    assert body["adapters"][1] == {"name": "sql", "queued": 3, "held_by": ["w-1", "w-2"],
                                   "on_device_in": ["w-1"]}  # fmt: skip
    main(["doctor", "--load", str(tmp_path)])
    out = capsys.readouterr().out
    assert "adapters:\n  chat: 0 queued; held by w-1\n  sql: 3 queued;" in out
