"""A worker's cold start (worker/boot.py): its process start read from /proc, and the job
that waited for the worker to start carries that start in its timings."""

from __future__ import annotations

import subprocess
import sys
import time

from prometheus_client import generate_latest

from tests.conftest import ROOT, make_engine
from tests.worker.service_driver import run, service, settings, submit
from tide_fleet.infra.doctor.scrape import Scrape
from tide_fleet.infra.jobs.public import job_public
from tide_fleet.infra.wire.heartbeats import read_heartbeats
from tide_fleet.worker.boot import Boot
from tide_fleet.worker.service import WorkerService


def test_the_process_start_counts_the_time_before_the_module_was_imported():
    code = "import time; time.sleep(0.6); from tide_fleet.worker.boot import process_started_at, _IMPORTED_AT; print(process_started_at(), _IMPORTED_AT)"  # noqa: E501
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, check=True)
    started, imported = map(float, out.stdout.split())
    assert before - 0.05 <= started <= imported - 0.55  # the 0.6 s sleep came first


def test_only_a_job_queued_before_the_worker_started_waited_for_it():
    boot = Boot()
    assert boot.seconds is None
    cold = boot.ready()
    assert cold == boot.seconds and cold >= 0
    assert boot.waited_for(boot.started_at - 5) == cold
    assert boot.waited_for(boot.started_at + 1) is None  # queued once it was running
    assert boot.waited_for(0.0) is None  # no creation time known


def test_a_job_queued_before_the_worker_started_reports_the_cold_start(
    redis_server, redis_client, tiny_path
):
    early = submit(redis_client, tiny_path, max_tokens=4)
    worker = service(redis_server.url, tiny_path)
    time.sleep(0.01)
    worker.boot.started_at = time.time()  # as if launched after `early` was queued
    time.sleep(0.05)
    cold = worker.boot.ready()
    assert cold >= 0.05
    late = submit(redis_client, tiny_path, max_tokens=4)
    first, second = run(worker, redis_client, early), run(worker, redis_client, late)
    assert float(first["cold_start_seconds"]) == cold
    assert job_public(first).timings.cold_start_seconds == cold
    assert "cold_start_seconds" not in second
    assert job_public(second).timings.cold_start_seconds is None
    worker._heartbeat()
    (beat,) = read_heartbeats(redis_client).values()
    assert beat.cold_start_s == cold


def test_the_worker_metrics_name_the_served_model_and_its_cold_start(redis_server, tiny_path):
    worker = WorkerService(
        make_engine(tiny_path), settings(redis_server.url, tiny_path), "p", ["short"], model="b"
    )
    cold = worker.boot.ready()
    worker.metrics.cold_start.set(cold)
    s = Scrape.parse(generate_latest(worker.metrics.registry).decode())
    assert s.total("tide:worker_cold_start_seconds", model="b", pool="p") == cold
