"""Chaos through `tide up` (bounded, loopback only): a few hundred jobs while workers are
killed with -9, Redis is killed and restarted, and the gateway and Celery are killed.

Every accepted job ends completed exactly once and equal to its greedy output run alone,
every webhook arrives under one webhook-id, a job taken again resumes from the tokens its
lost worker wrote (tokens generated / delivered is reported), no worker exits on a Redis
outage, and after the run the pool drains to zero and stays there. The figures are printed
as one JSON line (`pytest -s tests/service/test_chaos.py`) for the docs."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict

import httpx
import pytest
import redis

from tests.conftest import ROOT, make_engine, wait_for
from tests.service.conftest import Receiver
from tests.service.procs import descendants, find
from tide_fleet.infra.fleet.local_fleet import wait_ready
from tide_fleet.infra.fleet.redis_server import free_port
from tide_fleet.worker.engine import SamplingParams

pytestmark = pytest.mark.slow

NUM_JOBS = 240
PROMPTS = ["Once upon a time", "The little dog", "Lily wanted to", "One day, a boy",
           "The sun was", "Tom and his mom"]  # fmt: skip
MAX_TOKENS = [8, 24, 48]
FLEET_TOML = """
[controller]
poll_interval_s = 0.3
scale_in_cooldown_s = 2

[pools.default]
buckets = ["short", "medium", "long"]
max_workers = 2
idle_s = 3
target_wait_s = 2
cold_start_s = 2
tokens_per_s = 400
"""


def references(model) -> dict[tuple[str, int], str]:
    """Each (prompt, max_tokens) generated alone, greedy, in this process."""
    engine = make_engine(model)
    out = {}
    for prompt, n in itertools.product(PROMPTS, MAX_TOKENS):
        ids = engine.tokenizer.encode(prompt)
        out[(prompt, n)] = engine.generate([ids], SamplingParams(max_tokens=n, temperature=0.0))[
            0
        ].text
    return out


class Submitter(threading.Thread):
    """Submits NUM_JOBS jobs, each retried under its Idempotency-Key until accepted (the
    gateway may be down, or die after accepting and before answering)."""

    def __init__(self, url: str, hook: str) -> None:
        super().__init__(daemon=True)
        self.url, self.hook = url, hook
        self.accepted: dict[str, tuple[str, int]] = {}
        self.retries = 0

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            for i in range(NUM_JOBS):
                prompt, n = PROMPTS[i % len(PROMPTS)], MAX_TOKENS[i % len(MAX_TOKENS)]
                body = {"prompt": prompt, "max_tokens": n, "temperature": 0,
                        "webhook": {"url": self.hook}}  # fmt: skip
                key = uuid.uuid4().hex
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    try:
                        r = client.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
                        if r.status_code in (200, 201, 202):
                            self.accepted[r.json()["id"]] = (prompt, n)
                            break
                    except httpx.HTTPError:
                        pass
                    self.retries += 1
                    time.sleep(0.2)
                time.sleep(0.05)


def test_chaos_loses_nothing_duplicates_nothing_and_settles_at_zero(tmp_path, fleet_model):
    refs = references(fleet_model)
    receiver = Receiver()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (tmp_path / "fleet.toml").write_text(FLEET_TOML)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TIDE_DATA_DIR": str(tmp_path / "data"),
           "TIDE_WEBHOOK_ALLOW_HOSTS": json.dumps(["127.0.0.1"]),
           "TIDE_WEBHOOK_RETRY_SCHEDULE": json.dumps([0.5, 1, 2, 4, 8, 8, 8]),
           "TIDE_LEASE_SECONDS": "2", "TIDE_REAPER_INTERVAL": "0.3",
           "TIDE_WORKER_HEARTBEAT_SECONDS": "0.5", "OMP_NUM_THREADS": "1"}  # fmt: skip
    env.pop("REDIS_URL", None)
    argv = [sys.executable, "-m", "tide_fleet.infra.cli", "-v", "up",
            "--fleet", str(tmp_path / "fleet.toml"),
            "--port", str(port), "--model", str(fleet_model), "--dtype", "float32",
            "--max-num-seqs", "8"]  # fmt: skip
    log = open(tmp_path / "up.log", "wb")  # noqa: SIM115 - lives with the process
    up = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    kills: dict[str, int] = defaultdict(int)
    try:
        wait_ready(url, timeout=120)
        r = redis.Redis.from_url((tmp_path / "data" / "redis.url").read_text())
        submitter = Submitter(url, receiver.url)
        submitter.start()
        started = time.monotonic()

        def kill(needle: str) -> int | None:
            pid = find(up.pid, needle)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                kills[needle] += 1
            return pid

        def serving() -> bool:
            try:  # a worker heartbeat: connected and taking jobs
                return bool(r.keys("tide:worker:*")) and bool(
                    find(up.pid, "tide_fleet.infra.cli worker")
                )
            except redis.RedisError:
                return False

        def workers() -> set[int]:
            return {p for p, c in descendants(up.pid).items() if "tide_fleet.infra.cli worker" in c}

        rode_out = 0

        def wait_worker() -> None:
            wait_for(serving, 60, what="a serving worker")
            time.sleep(0.5)

        for _ in range(2):
            wait_worker()
            kill("tide_fleet.infra.cli worker")  # mid-generation
            wait_worker()
            before = workers()
            kill("redis-server")
            time.sleep(2.0)  # an outage longer than a lease
            wait_for(lambda: find(up.pid, "redis-server"), 60, what="Redis restarted")
            time.sleep(2.0)
            rode_out += len(before & workers())  # the rest were drained, or died (below)
            kill("uvicorn")
            time.sleep(1.0)
            kill("celery")
            time.sleep(1.0)
        submitter.join(timeout=300)
        assert not submitter.is_alive(), "submissions did not finish"
        accepted = submitter.accepted
        assert len(accepted) == NUM_JOBS, f"only {len(accepted)} of {NUM_JOBS} accepted"

        def statuses() -> dict[str, str]:
            pipe = r.pipeline(transaction=False)
            for j in accepted:
                pipe.hget(f"tide:job:{j}", "status")
            return {j: (s or b"").decode() for j, s in zip(accepted, pipe.execute(), strict=True)}

        def all_terminal() -> bool:
            try:
                return all(s not in ("queued", "in_progress") for s in statuses().values())
            except redis.RedisError:
                return False

        wait_for(all_terminal, 300, interval=0.5, what="every job to finish")
        done_at = time.monotonic()
        final = statuses()
        bad = {j: s for j, s in final.items() if s != "completed"}
        assert not bad, f"jobs not completed: {bad}"
        wrong = []
        for j, key in accepted.items():
            text = r.hget(f"tide:job:{j}", "text").decode()  # type: ignore[union-attr]
            if text != refs[key]:
                wrong.append((j, key, text, refs[key]))
        assert not wrong, f"{len(wrong)} jobs differ from their greedy output: {wrong[:3]}"
        # Completed exactly once: one terminal event per job (a second winner would add one).
        pipe = r.pipeline(transaction=False)
        for j in accepted:
            pipe.xrange(f"tide:events:{j}")
        done_events = [sum(f[b"type"] == b"done" for _, f in events) for events in pipe.execute()]
        twice = sum(n != 1 for n in done_events)
        assert not twice, f"{twice} jobs ended other than exactly once: {done_events}"

        # Back to zero (measured from the last job's end), then it stays there.
        wait_for(lambda: not find(up.pid, "tide_fleet.infra.cli worker"), 120, what="zero workers")
        zero_at = time.monotonic()

        def delivered() -> set[str]:
            return {h["webhook-id"] for h, _ in receiver.calls}

        expected = {f"msg_{j}_completed" for j in accepted}
        wait_for(lambda: expected <= delivered(), 120, interval=0.5, what="every webhook")
        ids_by_job: dict[str, set[str]] = defaultdict(set)
        for h, body in receiver.calls:
            ids_by_job[json.loads(body)["id"]].add(h["webhook-id"])
        assert all(len(v) == 1 for v in ids_by_job.values()), "a job sent two webhook-ids"
        assert set(ids_by_job) == set(accepted), "a webhook for a job nobody submitted"
        duplicates = len(receiver.calls) - len(expected)  # same id again: receivers dedupe

        for _ in range(20):
            assert not find(up.pid, "tide_fleet.infra.cli worker"), (
                "a worker started on an idle queue"
            )
            time.sleep(0.5)
        # Work: tokens the engines generated and wrote, every attempt included, against the
        # tokens delivered (a job taken again resumes from what its lost worker wrote).
        pipe = r.pipeline(transaction=False)
        for j in accepted:
            pipe.hget(f"tide:job:{j}", "completion_tokens")
        delivered_tokens = sum(int(v or 0) for v in pipe.execute())
        generated = int(r.get("tide:generated_tokens") or 0)
        resumed = int(r.get("tide:resumed_tokens") or 0)  # restarting would compute these again
        out = (tmp_path / "up.log").read_text()
        launches = len(re.findall(r"started worker", out))
        # Only the workers killed here died: the others exited when the controller drained
        # them, never on a Redis outage.
        unexpected = len(re.findall(r"exited unexpectedly", out))
        assert unexpected == kills["tide_fleet.infra.cli worker"], f"{unexpected} workers died"
        assert rode_out >= 1, "no worker was alive through a Redis outage"
        figures = {
            "jobs": NUM_JOBS, "completed": NUM_JOBS - len(bad), "wrong": len(wrong),
            "kills": dict(kills), "redis_outages": kills["redis-server"],
            "workers_that_rode_out_an_outage": rode_out, "worker_deaths": unexpected,
            "lost": len(bad), "completed_twice": twice, "webhook_redeliveries_same_id": duplicates,
            "submit_retries": submitter.retries, "worker_launches": launches,
            "tokens_generated": generated, "tokens_delivered": delivered_tokens,
            "generated_per_delivered": round(generated / max(1, delivered_tokens), 3),
            "tokens_resumed": resumed,
            "restart_from_prompt_per_delivered": round(
                (generated + resumed) / max(1, delivered_tokens), 3
            ),
            "run_s": round(done_at - started, 1), "back_to_zero_s": round(zero_at - done_at, 1),
        }  # fmt: skip
        print("CHAOS " + json.dumps(figures))
        # A job taken again resumes from what its lost worker wrote: nothing is made twice.
        assert generated <= 1.05 * delivered_tokens, figures
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=120)
        except subprocess.TimeoutExpired:
            up.kill()
        receiver.close()
        print((tmp_path / "up.log").read_text()[-3000:])
