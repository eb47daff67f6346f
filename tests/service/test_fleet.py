"""End to end on a real local fleet (Redis, uvicorn, worker processes, Celery, reaper)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from standardwebhooks import Webhook

from tests.conftest import ROOT, make_engine
from tests.service.conftest import SECRET, Receiver, wait_done, wait_for
from tide_fleet.worker.engine import SamplingParams

pytestmark = pytest.mark.slow

STORY = "Once upon a time, there was a little girl named Lily. She loved to play outside. "


def workload() -> list[dict]:
    """50 jobs whose prompt_tokens + max_tokens span short (<=64), medium and long buckets."""
    jobs = []
    for i in range(50):
        prompt = ["Once upon a time", "Lily wanted to", "The little dog", STORY * (1 + i % 4)][
            i % 4
        ]
        jobs.append(
            {"prompt": prompt, "max_tokens": [8, 40, 120, 200, 260][i % 5], "temperature": 0}
        )
    return jobs


def test_fifty_jobs_across_buckets_match_the_engine(api, fleet_model):
    jobs = workload()
    engine = make_engine(fleet_model)
    prompts = [engine.tokenizer.encode(j["prompt"]) for j in jobs]
    fits = [
        len(p) + j["max_tokens"] <= engine.max_model_len for p, j in zip(prompts, jobs, strict=True)
    ]
    jobs = [j for j, ok in zip(jobs, fits, strict=True) if ok]
    prompts = [p for p, ok in zip(prompts, fits, strict=True) if ok]
    expected = engine.generate(
        prompts, [SamplingParams(max_tokens=j["max_tokens"], temperature=0.0) for j in jobs]
    )
    accepted = [api.post("/v1/jobs", json=j) for j in jobs]
    assert all(r.status_code == 202 for r in accepted), [
        r.text for r in accepted if r.status_code != 202
    ]
    assert {r.json()["bucket"] for r in accepted} == {"short", "medium", "long"}
    for r, want in zip(accepted, expected, strict=True):
        job = wait_done(api, r.json()["id"])
        assert job["status"] == "completed", job
        assert job["result"]["text"] == want.text
        assert job["usage"]["completion_tokens"] == len(want.token_ids)
        assert job["result"]["finish_reason"] == want.finish_reason
        assert job["timings"]["queue_seconds"] >= 0 and job["timings"]["ttft_seconds"] > 0


def test_events_replay_and_openai_routes(api, fleet_model):
    job = api.post(
        "/v1/jobs", json={"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0}
    ).json()
    final = wait_done(api, job["id"])
    deltas, done = [], None
    with api.stream("GET", f"/v1/jobs/{job['id']}/events") as stream:
        event = None
        for line in stream.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                data = json.loads(line.split(":", 1)[1])
                if event == "delta":
                    deltas.append(data["text"])
                elif event == "done":
                    done = data
    assert "".join(deltas) == final["result"]["text"]
    assert done["status"] == "completed"
    body = {"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0}
    plain = api.post("/v1/completions", json=body).json()
    assert plain["choices"][0]["text"] == final["result"]["text"]
    assert plain["usage"]["completion_tokens"] == final["usage"]["completion_tokens"]
    chunks = []
    with api.stream("POST", "/v1/completions", json={**body, "stream": True}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:") and line.strip() != "data: [DONE]":
                chunks.append(json.loads(line[5:])["choices"][0]["text"])
    assert "".join(chunks) == final["result"]["text"]
    assert api.get("/v1/models").json()["data"][0]["id"] == str(fleet_model)


def test_webhook_signed_and_retried_after_a_500(api):
    receiver = Receiver([500])
    try:
        body = {
            "prompt": "Lily wanted to",
            "max_tokens": 12,
            "temperature": 0,
            "webhook": {"url": receiver.url},
        }
        job = api.post("/v1/jobs", json=body).json()
        wait_for(lambda: len(receiver.calls) >= 2, timeout=30)
        first, second = receiver.calls[:2]
        assert first[0]["webhook-id"] == second[0]["webhook-id"]
        payload = Webhook(SECRET).verify(second[1], second[0])
        assert payload["id"] == job["id"] and payload["status"] == "completed"
        with pytest.raises(Exception):  # noqa: B017 - any verification error
            Webhook(SECRET).verify(second[1] + b" ", second[0])
        state = wait_for(
            lambda: (
                (api.get(f"/v1/jobs/{job['id']}").json()["webhook"] or {}).get("status")
                == "delivered"
                and api.get(f"/v1/jobs/{job['id']}").json()
            )
        )
        assert state["webhook"]["attempts"] == 2
    finally:
        receiver.close()


def test_cancel_a_running_job(api, fleet_redis):
    body = {"prompt": "Once upon a time", "max_tokens": 480, "temperature": 0, "ignore_eos": True}
    jobs = [api.post("/v1/jobs", json=body).json()["id"] for _ in range(8)]
    running = wait_for(
        lambda: next((j for j in jobs if fleet_redis.hget(f"tide:job:{j}", "first_token_at")), None)
    )
    api.delete(f"/v1/jobs/{running}")
    job = wait_done(api, running, timeout=5)
    assert job["status"] == "cancelled" and job["result"]["finish_reason"] == "abort"
    assert job["usage"]["completion_tokens"] < 480
    for j in jobs:
        api.delete(f"/v1/jobs/{j}")
    for j in jobs:
        assert wait_done(api, j)["status"] in ("cancelled", "completed")


def _held_by(fleet_redis, pid: int) -> list[str]:
    """Jobs in progress under a lease of the worker with this pid, in one round trip: by
    this test the package's Redis holds every earlier test's jobs, and a key-by-key scan
    took long enough (the full suite, twice in a row) for the victim to finish what it held
    before the kill."""
    keys = fleet_redis.keys("tide:job:*")
    pipe = fleet_redis.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, "lease_owner", "status")
    held = []
    for key, (owner, status) in zip(keys, pipe.execute(), strict=True):
        if status == b"in_progress" and owner and owner.decode().endswith(f"-{pid}"):
            held.append(key.decode().split(":", 2)[2])
    return held


def _wait_worker(fleet_redis, pid: int) -> None:
    wait_for(
        lambda: any(
            w.decode().endswith(f"-{pid}") for w in fleet_redis.zrange("tide:workers", 0, -1)
        )
    )


def test_kill_9_mid_generation_loses_nothing_and_completes_once(api, fleet, fleet_redis):
    receiver = Receiver()
    victim = fleet.spawn_worker("victim")
    _wait_worker(fleet_redis, victim.pid)
    try:
        body = {"prompt": "The little dog", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
                "webhook": {"url": receiver.url}}  # fmt: skip
        ids = [api.post("/v1/jobs", json=body).json()["id"] for _ in range(16)]
        held = wait_for(lambda: _held_by(fleet_redis, victim.pid), timeout=60, interval=0.01)
        victim.send_signal(signal.SIGKILL)  # at once: mid-generation
        assert len(held) <= 4  # a worker never holds more jobs than its engine can run (4)
        victim.wait()
        results = [wait_done(api, j, timeout=120) for j in ids]
        assert all(r["status"] == "completed" for r in results)
        assert all(r["usage"]["completion_tokens"] == 400 for r in results)
        # A job the victim held either finished in the instant before the kill, or was
        # re-queued by the reaper and completed elsewhere: on a second attempt if the victim
        # had started computing it, else uncharged (counted as a loss before it started).
        rerun = 0
        for j in held:
            owner = fleet_redis.hget(f"tide:job:{j}", "lease_owner").decode()
            attempts = fleet_redis.hget(f"tide:job:{j}", "attempts")
            if owner.endswith(f"-{victim.pid}"):
                assert attempts == b"1"
            else:
                lost_unstarted = fleet_redis.hget(f"tide:job:{j}", "lost_unstarted")
                assert (attempts, lost_unstarted) in ((b"2", None), (b"1", b"1"))
                rerun += 1
        assert rerun >= 1, "the kill should have interrupted at least one job"
        try:
            wait_for(lambda: len(receiver.calls) >= len(ids), timeout=30)
        except AssertionError:  # say which deliveries are missing and what Redis knows
            got = {h["webhook-id"] for h, _ in receiver.calls}
            missing = {
                j: fleet_redis.hmget(f"tide:job:{j}", "webhook_status", "webhook_attempts")
                for j in ids
                if f"msg_{j}_completed" not in got
            }
            raise AssertionError(
                f"{len(got)}/{len(ids)} webhooks arrived; missing {missing}"
            ) from None
        webhook_ids = [h["webhook-id"] for h, _ in receiver.calls]
        assert sorted(set(webhook_ids)) == sorted(webhook_ids), "a job completed twice"
        assert len(webhook_ids) == len(ids)
        for j in ids:  # one "done" event per job: one visible result
            events = fleet_redis.xrange(f"tide:events:{j}")
            assert sum(1 for _, e in events if e[b"type"] == b"done") == 1
    finally:
        receiver.close()


def test_sigterm_drains_in_flight_jobs_and_exits_0(api, fleet, fleet_redis):
    worker = fleet.spawn_worker("drainer")
    _wait_worker(fleet_redis, worker.pid)
    body = {"prompt": "Lily wanted to", "max_tokens": 300, "temperature": 0, "ignore_eos": True}
    ids = [api.post("/v1/jobs", json=body).json()["id"] for _ in range(12)]
    held = wait_for(lambda: _held_by(fleet_redis, worker.pid), timeout=60, interval=0.01)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0
    for j in ids:
        job = wait_done(api, j, timeout=120)
        assert job["status"] == "completed" and job["usage"]["completion_tokens"] == 300
    assert all(api.get(f"/v1/jobs/{j}").json()["attempts"] == 1 for j in held)


def test_redis_restart_loses_no_accepted_job(api, fleet):
    body = {"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0}
    ids = [api.post("/v1/jobs", json=body).json()["id"] for _ in range(10)]
    fleet.redis.stop()  # SIGTERM: Redis writes its AOF and exits
    fleet.redis.start()
    results = [wait_done(api, j, timeout=120) for j in wait_for(lambda: _reachable(api, ids))]
    assert all(r["status"] == "completed" for r in results)
    after = api.post("/v1/jobs", json=body).json()
    assert wait_done(api, after["id"])["status"] == "completed"


def _reachable(api, ids):  # type: ignore[no-untyped-def]
    try:
        return ids if all(api.get(f"/v1/jobs/{j}").status_code == 200 for j in ids) else None
    except Exception:
        return None


def test_gateway_process_never_imports_torch(fleet):
    code = "import sys, tide_fleet.gateway.app; sys.exit('torch' in sys.modules)"
    assert (
        subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}
        ).returncode
        == 0
    )
    maps = Path(f"/proc/{fleet.procs['gateway'].pid}/maps").read_text()
    assert "libtorch" not in maps
    workers = Path(f"/proc/{fleet.procs['worker-0'].pid}/maps").read_text()
    assert "libtorch" in workers  # the check can see torch where it is loaded
