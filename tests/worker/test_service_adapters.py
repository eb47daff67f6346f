"""A worker serving LoRA adapters: jobs run on their adapter (declared, or loaded at run time),
an adapter that is unknown, broken or unloaded fails only its jobs with the reason named, a
resumed job keeps its adapter, and the heartbeat and metrics show the adapters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from tests.conftest import make_engine
from tests.lora_fixtures import make_adapter
from tests.worker.service_driver import run
from tests.worker.test_service_resume import interrupt, tokens
from tide_fleet.infra.contract.sampling_params import SamplingParams
from tide_fleet.infra.jobs.schemas import JobCreate
from tide_fleet.infra.jobs.submission import ModelInfo, build_job
from tide_fleet.infra.settings import Settings
from tide_fleet.infra.wire.adapters import ADAPTERS_KEY, AdapterRef
from tide_fleet.infra.wire.heartbeats import read_heartbeats
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.models import catalog
from tide_fleet.worker import adapters as worker_adapters
from tide_fleet.worker.service import WorkerService

PROMPT = "Once upon a time, there was a"
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def folders(stories_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("worker-adapters")
    return {
        "A": make_adapter(root / "A", stories_path, 8, ("q_proj", "v_proj", "down_proj"), 1),
        "B": make_adapter(root / "B", stories_path, 4, ("o_proj", "gate_proj", "up_proj"), 2),
    }


def _settings(url: str, stories: Path, folders: dict[str, Path]) -> Settings:
    served = [{"name": "stories", "model": str(stories), "lora": {"A": str(folders["A"])}}]
    return Settings(redis_url=url, model=str(stories), served_models=served, worker_metrics_port=-1)


def _worker(url: str, stories: Path, folders: dict[str, Path]) -> WorkerService:
    """One device slot; adapters beyond it wait in host memory."""
    engine = make_engine(stories, max_loras=1, max_cpu_loras=4, max_lora_rank=16,
                         kv_cache_memory=32 << 20)  # fmt: skip
    worker = WorkerService(engine, _settings(url, stories, folders), "p", ["short"])
    worker._come_back()
    return worker


def _load(client: redis.Redis, name: str, path: Path | str) -> None:
    """An adapter loaded at run time (what POST /v1/adapters writes)."""
    client.hset(ADAPTERS_KEY, name, AdapterRef(name, "stories", str(path)).to_json())


def _submit(client: redis.Redis, url: str, stories: Path, folders: dict, lora: str = "") -> str:
    settings = _settings(url, stories, folders)
    body = JobCreate(prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    served = catalog(settings).default
    job = build_job(settings, ModelInfo.load(str(stories)), "t", body, None, served=served,
                    lora=lora)  # fmt: skip
    return JobStore(client).create(job)["id"]


def _reference(stories: Path, folders: dict[str, Path], lora: str | None) -> str:
    engine = make_engine(stories, max_loras=1, max_lora_rank=16, kv_cache_memory=32 << 20)
    if lora is not None:
        engine.register_adapter(lora, str(folders[lora]))
    prompt = engine.tokenizer.encode(PROMPT)
    engine.add_request("ref", prompt, SamplingParams(max_tokens=MAX_TOKENS, temperature=0),
                       lora=lora)  # fmt: skip
    while True:
        for out in engine.step():
            if out.finished:
                return out.text


def test_jobs_run_on_their_adapters_and_bad_adapters_fail_only_their_jobs(
    redis_server, redis_client, stories_path, folders
):
    url, c = redis_server.url, redis_client
    _load(c, "B", folders["B"])
    _load(c, "broken", "/nonexistent/adapter")
    worker = _worker(url, stories_path, folders)
    ids = {lora: _submit(c, url, stories_path, folders, lora)
           for lora in ("", "A", "B", "nope", "broken")}  # fmt: skip
    records = {lora: run(worker, c, job_id) for lora, job_id in ids.items()}
    texts = {lora: records[lora].get("text") for lora in ("", "A", "B")}
    assert texts == {
        "": _reference(stories_path, folders, None),
        "A": _reference(stories_path, folders, "A"),  # declared in the catalog
        "B": _reference(stories_path, folders, "B"),  # loaded at run time
    }
    assert len(set(texts.values())) == 3, "the adapters change nothing: the test could not fail"
    assert records["nope"]["status"] == "failed"
    assert "adapter 'nope' is not served" in records["nope"]["error"]
    assert records["broken"]["status"] == "failed"
    assert (
        "adapter 'broken' failed to load from '/nonexistent/adapter'"
        in (records["broken"]["error"])
    )
    after = run(worker, c, _submit(c, url, stories_path, folders, "A"))  # the worker goes on
    assert after["status"] == "completed" and after["text"] == texts["A"]

    # Its takes prefer the adapters it holds: A's job before an earlier one it does not hold.
    later = [_submit(c, url, stories_path, folders, lora) for lora in ("nope", "A")]
    held = worker.adapters.held()
    taken = [job.job_id for _ in later for _d, job in worker.intake.poll(1, held)]
    assert taken == later[::-1]

    worker._heartbeat()
    beat = read_heartbeats(c)[worker.worker_id]
    assert set(beat.adapters) == {"A", "B"} and len(beat.adapters_on_device) == 1
    samples = {
        (s.name, s.labels.get("adapter"), s.labels.get("finished_reason")): s.value
        for metric in worker.metrics.registry.collect()
        for s in metric.samples
        if s.name.startswith("tide:lora_")
    }
    success = "tide:lora_request_success_total"
    assert samples[(success, "A", "length")] + samples.get((success, "A", "stop"), 0) == 2
    assert samples[(success, "base", records[""]["finish_reason"])] == 1
    generated = samples[("tide:lora_generation_tokens_total", "B", None)]
    assert generated == int(records["B"]["completion_tokens"])
    assert ("tide:lora_request_success_total", "nope", "error") not in samples  # never ran


def test_an_adapter_unloaded_while_its_jobs_wait_fails_them_and_leaves_the_engine(
    redis_server, redis_client, stories_path, folders, monkeypatch
):
    url, c = redis_server.url, redis_client
    monkeypatch.setattr(worker_adapters, "RECHECK_SECONDS", 0.0)
    _load(c, "B", folders["B"])
    worker = _worker(url, stories_path, folders)
    first = _submit(c, url, stories_path, folders, "B")
    assert run(worker, c, first)["status"] == "completed"
    second = _submit(c, url, stories_path, folders, "B")  # queued: the worker holds B
    c.hdel(ADAPTERS_KEY, "B")  # DELETE /v1/adapters/B
    record = run(worker, c, second)
    assert record["status"] == "failed" and "adapter 'B' is not served" in record["error"]
    assert "B" not in worker.adapters.held()  # unregistered from the engine


def test_a_resumed_job_keeps_its_adapter(redis_server, redis_client, stories_path, folders):
    url, c = redis_server.url, redis_client
    whole = _submit(c, url, stories_path, folders, "A")
    expected = run(_worker(url, stories_path, folders), c, whole)
    job = _submit(c, url, stories_path, folders, "A")
    interrupt(_worker(url, stories_path, folders), c, job, 5)
    assert 0 < len(tokens(c, job)) < int(expected["completion_tokens"])
    record = run(_worker(url, stories_path, folders), c, job)
    assert int(record["attempts"]) == 2 and record["lora"] == "A"
    assert record["text"] == expected["text"]
    assert tokens(c, job) == tokens(c, whole)
    assert json.loads(record["choices"])[0]["text"] == expected["text"]
