"""Tensor parallelism through a live `tide up --tensor-parallel-size 2` fleet (bounded,
loopback only): stories260K in float32 on the CPU, its one worker two processes (rank 0 and
a spawned rank 1, gloo on loopback).

Greedy completions over HTTP equal a one-process engine's, computed here; the worker runs
its second rank as its child process, and no process outlives `tide up`. Then rank 1 is
killed with -9 while long jobs run: the worker ends (exit code 75, EXIT_RANKS_LOST), the
controller starts another, and every job completes once (one `done` event each), still
equal to the one-process engine's. Start-up and recovery figures are printed as one JSON
line (`pytest -s tests/service/test_tensor_parallel_live.py`)."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.conftest import make_engine, wait_for
from tests.service.live_up import LiveUp, done_statuses, tide_up, wait_ended
from tests.service.procs import descendants
from tests.service.test_tide_up_supervision import sigint_stops_the_tree
from tide_fleet.infra.wire.heartbeats import read_heartbeats
from tide_fleet.worker.engine import SamplingParams
from tide_fleet.worker.engine.ranks import EXIT_RANKS_LOST

pytestmark = pytest.mark.slow

PROMPTS = ["Once upon a time", "The little dog", "Lily wanted to", "One day, a boy", "Tom said"]
SPAWNED = "multiprocessing.spawn"  # a spawned rank's command line (multiprocessing's spawn)
KILL_JOBS = 12
LONG = 160  # tokens of each job the kill interrupts


def tp_flags(model: Path) -> list[str]:
    return ["--model", str(model), "--workers", "1", "--dtype", "float32", "--device", "cpu",
            "--max-num-seqs", "8", "--kv-cache-memory", "2MiB",
            "--tensor-parallel-size", "2"]  # fmt: skip


def one_process(model: Path, max_tokens: int, ignore_eos: bool = False) -> dict[str, tuple]:
    """prompt -> (text, token count) of a one-process engine's greedy run (float32)."""
    engine = make_engine(model)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=ignore_eos)
    outs = engine.generate([engine.tokenizer.encode(p) for p in PROMPTS], params)
    return {p: (o.text, len(o.token_ids)) for p, o in zip(PROMPTS, outs, strict=True)}


def ppid(pid: int) -> int:
    """Its parent's pid; 0 once it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[1])
    except OSError:
        return 0


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process, in clock ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def the_worker_and_rank(up: LiveUp) -> tuple[int, int] | None:
    """(worker pid, its spawned rank's pid) once there is one worker with one rank, its
    direct child (the spawn's resource tracker is the worker's other child)."""
    workers = up.workers()
    if len(workers) != 1:
        return None
    ranks = [p for p, cmd in descendants(workers[0]).items() if SPAWNED in cmd]
    return (workers[0], ranks[0]) if len(ranks) == 1 and ppid(ranks[0]) == workers[0] else None


def serving(up: LiveUp, r) -> tuple[int, int] | None:  # type: ignore[no-untyped-def]
    """The worker and its rank once the worker takes jobs (its heartbeat is in Redis)."""
    pair = the_worker_and_rank(up)
    beats = read_heartbeats(r).values()
    return pair if pair and any(b.pid == pair[0] for b in beats) else None


def test_two_ranks_serve_what_one_process_generates(tmp_path, stories_path):
    t0 = time.monotonic()
    with tide_up(tmp_path, *tp_flags(stories_path)) as up:
        want = one_process(stories_path, 48)  # while the worker starts
        r = up.redis()
        worker, rank = wait_for(lambda: serving(up, r), 60, what="a worker of two ranks")
        figures = {"ready_s": round(time.monotonic() - t0, 2)}
        (beat,) = read_heartbeats(r).values()
        assert beat.cold_start_s is not None
        figures["worker_start_s"] = round(beat.cold_start_s, 2)
        ticks = cpu_ticks(rank)
        client = OpenAI(base_url=f"{up.url}/v1", api_key="unused", max_retries=0, timeout=60)
        model = str(stories_path)  # one model: served under its path

        def complete(prompt: str) -> tuple[str, int]:
            reply = client.completions.create(model=model, prompt=prompt, max_tokens=48,
                                              temperature=0)  # fmt: skip
            assert reply.usage is not None
            return reply.choices[0].text, reply.usage.completion_tokens

        with ThreadPoolExecutor(len(PROMPTS)) as pool:  # one batch: the ranks step together
            got = dict(zip(PROMPTS, pool.map(complete, PROMPTS), strict=True))
        assert {p: g for p, g in got.items() if g != want[p]} == {}
        assert cpu_ticks(rank) > ticks, "rank 1 ran no steps"
        assert the_worker_and_rank(up) == (worker, rank)  # the same two processes throughout
        sigint_stops_the_tree(up.proc, timeout=60)  # the rank and its tracker too
    print(json.dumps(figures))


def test_a_rank_killed_mid_run_ends_its_worker_and_loses_no_job(tmp_path, stories_path):
    with tide_up(tmp_path, *tp_flags(stories_path)) as up:
        want = one_process(stories_path, LONG, ignore_eos=True)  # while the worker starts
        r = up.redis()
        worker, rank = wait_for(lambda: serving(up, r), 60, what="a worker of two ranks")
        old_tree = descendants(worker)
        api = httpx.Client(base_url=up.url, timeout=30)
        jobs: dict[str, str] = {}
        for i in range(KILL_JOBS):
            body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": LONG, "temperature": 0,
                    "ignore_eos": True}  # fmt: skip
            res = api.post("/v1/jobs", json=body)
            assert res.status_code == 202, res.text
            jobs[res.json()["id"]] = body["prompt"]  # type: ignore[assignment]

        def mid_run() -> bool:  # the worker holds jobs and one has begun
            held = any(b.pid == worker and b.held for b in read_heartbeats(r).values())
            return held and any(
                api.get(f"/v1/jobs/{j}").json()["status"] == "in_progress" for j in jobs
            )

        wait_for(mid_run, 30, interval=0.02, what="jobs running on the worker")
        os.kill(rank, signal.SIGKILL)
        killed = time.monotonic()
        new = wait_for(lambda: (p := serving(up, r)) and p[0] != worker and p, 60,
                       what="a new worker of two ranks")  # fmt: skip
        figures: dict[str, object] = {
            "kill_to_new_worker_serving_s": round(time.monotonic() - killed, 2)
        }
        assert new[1] != rank
        left = {p: c for p, c in old_tree.items() if Path(f"/proc/{p}/cmdline").exists()}
        assert not left, f"processes of the dead worker live on: {left}"

        done = wait_ended(api, jobs, 120)
        figures["kill_to_all_done_s"] = round(time.monotonic() - killed, 2)
        assert {j: g["status"] for j, g in done.items() if g["status"] != "completed"} == {}
        wrong = {j: (prompt, done[j]["result"]["text"]) for j, prompt in jobs.items()
                 if (done[j]["result"]["text"], done[j]["usage"]["completion_tokens"])
                 != want[prompt]}  # fmt: skip
        assert wrong == {}
        assert {j: s for j in jobs if (s := done_statuses(r, j)) != [b"completed"]} == {}
        attempts = [done[j]["attempts"] for j in jobs]
        assert max(attempts) >= 2, "the kill interrupted nothing: the test could not fail"
        # Rank 0 ends on its watchdog (rank 1 exited) or on its step's error (the collective
        # reset by the dead peer), whichever comes first.
        log = up.log_text()
        ends = log.split("tensor-parallel worker ends, every rank with it: ")
        assert len(ends) >= 2, "the worker did not say why it ended"
        assert f"exited unexpectedly with {EXIT_RANKS_LOST}" in log
        figures["ended_by"] = ends[1].split("\n")[0][:60]
        figures["resumed"] = sum(a >= 2 for a in attempts)
        sigint_stops_the_tree(up.proc, timeout=60)
    print(json.dumps(figures))
