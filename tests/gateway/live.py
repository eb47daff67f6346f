"""A real gateway on loopback (uvicorn in a thread) and a fake worker that answers its jobs
in the wire contract's shape: `choices` with logprobs entries, deltas with `i`
and `lp`. The fake's answers come from a script: (record, choice index) -> Answer."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis
import uvicorn

from tide_fleet.gateway.app import create_app
from tide_fleet.infra.fleet.redis_server import free_port
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import BUCKETS, JobStatus, Keys, Priority, queue_name

KEYS = {"key-a": "tenant-a"}


@dataclass
class Answer:
    text: str = "Hello there"
    finish_reason: str = "stop"
    status: JobStatus = JobStatus.COMPLETED
    error: str = ""
    tokens: list[str] | None = None  # how the text splits into tokens (default: 3 chars)


def default_script(record: dict[str, str], i: int) -> Answer:
    return Answer(text=f"choice {i} says hi")


def split(answer: Answer) -> list[str]:
    if answer.tokens is not None:
        return answer.tokens
    return [answer.text[j : j + 3] for j in range(0, len(answer.text), 3)]


def entry(token: str, j: int, top: int) -> dict[str, Any]:
    """A logprobs entry as the worker writes it: `top` alternatives, best first."""
    alts = [
        {"token": f"alt{m}", "bytes": list(f"alt{m}".encode()), "logprob": -1.0 - m}
        for m in range(top)
    ]
    return {"token": token, "bytes": list(token.encode()), "logprob": -0.25 - j / 100,
            "top_logprobs": alts}  # fmt: skip


@dataclass
class FakeWorker:
    """Takes every queued job, writes deltas, then the result, as the real worker does."""

    client: redis.Redis
    script: Callable[[dict[str, str], int], Answer] = default_script
    seen: list[dict[str, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        taker, store = queues.Taker(self.client), JobStore(self.client)
        names = [queue_name(b, p) for p in Priority for b in BUCKETS]
        while not self.stop.is_set():
            for delivery in taker.take(names, 8):
                self.answer(store, delivery.job().job_id)
                taker.ack_now(delivery)
            time.sleep(0.01)

    def answer(self, store: JobStore, job_id: str) -> None:
        state, token, record = store.acquire(job_id, "fake", lease_seconds=30)
        if state != "acquired":
            return
        self.seen.append(record)
        store.mark_started(job_id, token)
        sampling = json.loads(record["sampling"])
        top = sampling.get("logprobs")
        answers = [self.script(record, i) for i in range(int(sampling.get("n") or 1))]
        choices = []
        for i, answer in enumerate(answers):
            pieces = split(answer)
            lps = [entry(t, j, top) for j, t in enumerate(pieces)] if top is not None else None
            for j, piece in enumerate(pieces):
                delta = {"type": "delta", "text": piece, "n": 1, "i": str(i)}
                if lps is not None:
                    delta["lp"] = json.dumps([lps[j]])
                if record.get("priority") != Priority.BATCH:
                    self.client.xadd(Keys.events(job_id), delta)  # type: ignore[arg-type]
            choices.append({"index": i, "text": answer.text, "completion_tokens": len(pieces),
                            "finish_reason": answer.finish_reason, "logprobs": lps})  # fmt: skip
        first = answers[0]
        fields: dict[str, Any] = {
            "text": first.text, "finish_reason": first.finish_reason, "choices": choices,
            "completion_tokens": sum(c["completion_tokens"] for c in choices),
        }  # fmt: skip
        if first.status is not JobStatus.COMPLETED:
            fields = {"error": first.error}
        store.finish(job_id, token, record["tenant"], first.status, events_ttl=60, **fields)


class LiveGateway:
    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=self.port,
                                log_level="warning", lifespan="on")  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveGateway:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the gateway did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@contextmanager
def live_fleet(
    redis_url: str, model: str, script: Callable[[dict[str, str], int], Answer] | None = None,
    with_worker: bool = True, **overrides: Any,
) -> Iterator[tuple[LiveGateway, FakeWorker]]:  # fmt: skip
    """A gateway and (unless with_worker is false: one already serves this Redis) a fake
    worker."""
    settings = Settings(redis_url=redis_url, model=model, api_keys=KEYS, **overrides)
    worker = FakeWorker(redis.Redis.from_url(redis_url), script or default_script)
    thread = threading.Thread(target=worker.run, daemon=True)
    with LiveGateway(settings) as gateway:
        if with_worker:
            thread.start()
        try:
            yield gateway, worker
        finally:
            worker.stop.set()
            if with_worker:
                thread.join(5)


@contextmanager
def real_worker(redis_url: str, model: str, engine: Any, timeout: float = 60) -> Iterator[Any]:
    """A live gateway serving `model` and a real worker (WorkerService on `engine`, in a
    thread) behind it; yields the official openai client against the gateway."""
    import openai

    from tide_fleet.worker.service import WorkerService

    settings = Settings(redis_url=redis_url, model=model, worker_metrics_port=-1)
    worker = WorkerService(engine, settings, "p", ["short", "medium", "long"])
    thread = threading.Thread(target=worker.run, daemon=True)
    with live_fleet(redis_url, model, with_worker=False) as (gateway, _):
        thread.start()
        try:
            yield openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="key-a", max_retries=0,
                                timeout=timeout)  # fmt: skip
        finally:
            worker.drain()
            thread.join(30)
