"""Requests naming a LoRA adapter: the job runs on its parent (the parent's tokenizer counts
it, it waits in the parent's lane) and carries the adapter's name in ``lora``; answers name
the adapter as their ``model``; a name nothing goes by is a 404 with nothing queued."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import redis

from tests.gateway.live import FakeWorker, live_fleet
from tests.lora_fixtures import make_adapter
from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.adapters import ADAPTERS_KEY, AdapterRef
from tide_fleet.infra.wire.jobstore import JobStore
from tide_fleet.infra.wire.protocol import BUCKETS, Priority, parse_queue, queue_name

AUTH = {"Authorization": "Bearer key-a"}
OK = {"prompt": "Once upon a time", "max_tokens": 8}


@pytest.fixture(scope="module")
def sql_adapter(stories_path, tmp_path_factory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("adapters") / "sql"
    return make_adapter(folder, stories_path, 8, ["q_proj", "v_proj"], seed=1)


@pytest.fixture(scope="module")
def fleet(redis_server, tiny_path, stories_path, sql_adapter):  # type: ignore[no-untyped-def]
    """tiny (the default) and stories with its declared adapter `sql`, no worker."""
    models = [{"name": "tiny", "model": str(tiny_path), "aliases": ["t"]},
              {"name": "stories", "model": str(stories_path),
               "lora": {"sql": str(sql_adapter)}}]  # fmt: skip
    with live_fleet(redis_server.url, str(tiny_path), with_worker=False,
                    served_models=models) as (gateway, _):  # fmt: skip
        yield gateway


class LaneWorker(FakeWorker):
    """The fake worker, on one model's lane."""

    lane: str = "stories"

    def run(self) -> None:
        taker, store = queues.Taker(self.client), JobStore(self.client)
        names = [queue_name(b, p, self.lane) for p in Priority for b in BUCKETS]
        while not self.stop.is_set():
            for delivery in taker.take(names, 8):
                self.answer(store, delivery.job().job_id)
                taker.ack_now(delivery)
            time.sleep(0.01)


@pytest.fixture
def stories_worker(redis_server, redis_client) -> Iterator[LaneWorker]:  # type: ignore[no-untyped-def]
    worker = LaneWorker(redis.Redis.from_url(redis_server.url))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    yield worker
    worker.stop.set()
    thread.join(5)


def _queued(r: redis.Redis) -> dict[str, int]:
    names = {k.decode().split(":")[0] for k in r.keys("tide.*")}
    return {n: d for n in names if parse_queue(n) and (d := queues.depth(r, n))}


def _submit(fleet, model: str | None) -> httpx.Response:  # type: ignore[no-untyped-def]
    body = OK | ({"model": model} if model else {})
    return httpx.post(f"{fleet.url}/v1/jobs", json=body, headers=AUTH)


def test_a_declared_adapter_runs_in_its_parents_lane_named_in_lora(fleet, redis_client):
    res = _submit(fleet, "sql")
    assert res.status_code == 202, res.text
    assert res.json()["model"] == "sql"
    record = redis_client.hgetall(f"tide:job:{res.json()['id']}")
    assert record[b"lora"] == b"sql" and record[b"model"] == b"stories"
    assert _queued(redis_client) == {queue_name("short", "interactive", "stories"): 1}
    # the parent's tokenizer counted it: the same ids as the parent's own job
    base = redis_client.hgetall(f"tide:job:{_submit(fleet, 'stories').json()['id']}")
    assert b"lora" not in base
    assert json.loads(record[b"token_ids"]) == json.loads(base[b"token_ids"])
    tiny = redis_client.hgetall(f"tide:job:{_submit(fleet, None).json()['id']}")
    assert json.loads(tiny[b"token_ids"]) != json.loads(base[b"token_ids"])
    polled = httpx.get(f"{fleet.url}/v1/jobs/{res.json()['id']}", headers=AUTH).json()
    assert polled["model"] == "sql"


def test_an_adapter_loaded_at_run_time_is_served_by_name(fleet, redis_client, sql_adapter):
    ref = AdapterRef("sql-v2", "stories", str(sql_adapter))
    redis_client.hset(ADAPTERS_KEY, ref.name, ref.to_json())
    res = _submit(fleet, "sql-v2")
    assert res.status_code == 202, res.text
    record = redis_client.hgetall(f"tide:job:{res.json()['id']}")
    assert record[b"lora"] == b"sql-v2" and record[b"model"] == b"stories"
    assert _queued(redis_client) == {queue_name("short", "interactive", "stories"): 1}
    count = httpx.post(f"{fleet.url}/tokenize", json={"model": "sql-v2", "prompt": "Once"},
                       headers=AUTH).json()["count"]  # fmt: skip
    parent = httpx.post(f"{fleet.url}/tokenize", json={"model": "stories", "prompt": "Once"},
                        headers=AUTH).json()["count"]  # fmt: skip
    assert count == parent


def test_an_adapter_whose_parent_is_not_served_is_not_found(fleet, redis_client):
    ref = AdapterRef("orphan", "gone-model", "/nowhere")
    redis_client.hset(ADAPTERS_KEY, ref.name, ref.to_json())
    res = _submit(fleet, "orphan")
    assert res.status_code == 404 and res.json()["error"]["code"] == "model_not_found"
    assert _queued(redis_client) == {}


def test_an_unknown_name_is_a_404_and_nothing_is_queued(fleet, redis_client):
    res = _submit(fleet, "sql-v9")
    assert res.status_code == 404
    err = res.json()["error"]
    assert err["code"] == "model_not_found" and err["param"] == "model"
    client = openai.OpenAI(base_url=f"{fleet.url}/v1", api_key="key-a", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="sql-v9", max_tokens=4,
                                       messages=[{"role": "user", "content": "hi"}])  # fmt: skip
    assert _queued(redis_client) == {}


def test_openai_answers_name_the_adapter(fleet, stories_worker):
    client = openai.OpenAI(base_url=f"{fleet.url}/v1", api_key="key-a", max_retries=0,
                           timeout=20)  # fmt: skip
    done = client.completions.create(model="sql", prompt="Once upon a time", max_tokens=8)
    assert done.model == "sql" and done.choices[0].text == "choice 0 says hi"
    stream = client.completions.create(model="sql", prompt="Once", max_tokens=8, stream=True)
    assert {chunk.model for chunk in stream} == {"sql"}
    assert [r["lora"] for r in stories_worker.seen] == ["sql", "sql"]
    base = client.completions.create(model="stories", prompt="Once", max_tokens=8)
    assert base.model == "stories" and "lora" not in stories_worker.seen[-1]
