"""Reading a job of many megabytes does not stall the gateway: four clients read a job of
16 choices with 20 top logprobs per token (a record of about 12 MB) while /healthz stays
under 50 ms at p99. The gateway runs as its own process, as deployed."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.conftest import ROOT
from tests.gateway.live import KEYS, Answer, FakeWorker
from tide_fleet.infra.fleet.redis_server import free_port
from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import BUCKETS, Priority, queue_name

AUTH = {"Authorization": "Bearer key-a"}
TOKENS = 509


@pytest.fixture
def gateway(redis_server, redis_client, tiny_path, tmp_path):  # type: ignore[no-untyped-def]
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REDIS_URL": redis_server.url,
           "TIDE_MODEL": str(tiny_path), "TIDE_API_KEYS": json.dumps(KEYS)}  # fmt: skip
    with open(tmp_path / "gateway.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "tide_fleet.gateway.app:app", "--port", str(port),
             "--log-level", "warning"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "gateway did not start"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def big_job(url: str, redis_client) -> str:  # type: ignore[no-untyped-def]
    body = {"prompt": "hi", "n": 16, "logprobs": 20, "max_tokens": TOKENS}
    job_id = httpx.post(f"{url}/v1/jobs", json=body, headers=AUTH).json()["id"]
    worker = FakeWorker(
        redis_client, lambda record, i: Answer(text="ab" * TOKENS, tokens=["ab"] * TOKENS)
    )
    taker, store = queues.Taker(redis_client), JobStore(redis_client)
    (delivery,) = taker.take([queue_name(b, p) for p in Priority for b in BUCKETS], 1)
    worker.answer(store, delivery.job().job_id)
    taker.ack_now(delivery)
    return str(job_id)


def read_while_probing(gateway: str, job_id: str) -> tuple[list[float], list[int]]:
    """Four clients read the job 20 times each; /healthz is probed every 10 ms meanwhile.
    Returns the probes' latencies and the sizes read."""
    done = threading.Event()
    sizes: list[int] = []

    def reader() -> None:
        with httpx.Client(headers=AUTH, timeout=120) as c:
            for _ in range(20):
                sizes.append(len(c.get(f"{gateway}/v1/jobs/{job_id}").content))

    readers = [threading.Thread(target=reader) for _ in range(4)]
    for t in readers:
        t.start()
    watcher = threading.Thread(target=lambda: ([t.join() for t in readers], done.set()))
    watcher.start()
    latencies = []
    with httpx.Client(timeout=10) as c:
        while not done.is_set():
            t0 = time.perf_counter()
            assert c.get(f"{gateway}/healthz").status_code == 200
            latencies.append(time.perf_counter() - t0)
            time.sleep(0.01)
    watcher.join()
    return latencies, sizes


def test_healthz_stays_fast_while_clients_read_a_large_job(gateway, redis_client):
    job_id = big_job(gateway, redis_client)
    assert len(redis_client.hget(f"tide:job:{job_id}", "choices")) > 10_000_000
    answer = httpx.get(f"{gateway}/v1/jobs/{job_id}", headers=AUTH, timeout=60)
    # Sent in slices, but with its length declared: not chunked.
    assert answer.headers["content-length"] == str(len(answer.content))
    assert "transfer-encoding" not in answer.headers
    job = answer.json()
    assert job["status"] == "completed" and len(job["choices"]) == 16
    assert [c["index"] for c in job["choices"]] == list(range(16))
    assert len(job["choices"][3]["logprobs"]) == TOKENS
    assert len(job["choices"][3]["logprobs"][0]["top_logprobs"]) == 20

    # A p99 over about a hundred probes is nearly their maximum, so one stall of this shared
    # machine can break it: up to three rounds, one must hold. A gateway that parses the
    # record blocks its loop for over a second per read and fails every round.
    rounds = []
    for _ in range(3):
        latencies, sizes = read_while_probing(gateway, job_id)
        assert len(sizes) == 80 and min(sizes) > 10_000_000
        p99 = statistics.quantiles(latencies, n=100, method="inclusive")[98]
        rounds.append((round(p99, 4), round(max(latencies), 4), len(latencies)))
        print(
            f"/healthz p99 {p99 * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms "
            f"({len(latencies)} probes) while 4 clients read a {min(sizes) / 1e6:.1f} MB job"
        )
        if len(latencies) >= 20 and p99 < 0.05:
            return
    raise AssertionError(f"/healthz p99 over 50 ms in every round (p99, max, probes): {rounds}")
