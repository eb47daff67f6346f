"""One gateway, two served models: the request's `model` picks the tokenizer and the
queues; an unknown model is a 404 with nothing queued; /v1/models lists both."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import redis

from tests.gateway.live import live_fleet
from tide_fleet.infra.wire import queues
from tide_fleet.infra.wire.protocol import parse_queue, queue_name

AUTH = {"Authorization": "Bearer key-a"}


@pytest.fixture(scope="module")
def two(redis_server, tiny_path, stories_path):  # type: ignore[no-untyped-def]
    models = [{"name": "tiny", "model": str(tiny_path), "aliases": ["t"]},
              {"name": "stories", "model": str(stories_path), "bucket_short_max": 32}]  # fmt: skip
    with live_fleet(redis_server.url, str(tiny_path), with_worker=False,
                    served_models=models) as (gateway, _):  # fmt: skip
        yield gateway


def _queued(r: redis.Redis) -> dict[str, int]:
    names = {k.decode().split(":")[0] for k in r.keys("tide.*")}
    return {n: d for n in names if parse_queue(n) and (d := queues.depth(r, n))}


def test_the_model_field_picks_queues_and_tokenizer(two, redis_client) -> None:  # type: ignore[no-untyped-def]
    ids = {}
    for model in (None, "t", "stories"):
        body = {"prompt": "Once upon a time", "max_tokens": 40} | (
            {"model": model} if model else {}
        )
        res = httpx.post(f"{two.url}/v1/jobs", json=body, headers=AUTH)
        assert res.status_code == 202, res.text
        ids[model] = res.json()["id"]
    rec = {m: redis_client.hgetall(f"tide:job:{i}") for m, i in ids.items()}
    assert rec[None][b"model"] == rec["t"][b"model"] == b"tiny"  # an alias is the model
    assert rec["stories"][b"model"] == b"stories"
    # stories' own bucket rule (short up to 32 tokens) and its own queue
    assert rec["stories"][b"bucket"] == b"medium" and rec[None][b"bucket"] == b"short"
    assert _queued(redis_client) == {
        queue_name("short", "interactive"): 2,
        queue_name("medium", "interactive", "stories"): 1,
    }
    # each model's own tokenizer counted the prompt
    assert json.loads(rec["stories"][b"token_ids"]) != json.loads(rec[None][b"token_ids"])


def test_an_unknown_model_is_a_404_and_nothing_is_queued(two, redis_client) -> None:  # type: ignore[no-untyped-def]
    client = openai.OpenAI(base_url=f"{two.url}/v1", api_key="key-a", max_retries=0)
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=4)
    err = e.value.body
    assert err["code"] == "model_not_found" and err["param"] == "model"  # type: ignore[index]
    assert "'tiny', 'stories'" in err["message"]  # type: ignore[index]
    res = httpx.post(f"{two.url}/v1/jobs", json={"prompt": "hi", "model": "nope"}, headers=AUTH)
    assert res.status_code == 404 and res.json()["error"]["code"] == "model_not_found"
    assert _queued(redis_client) == {}


def test_models_lists_and_retrieves_every_served_model(two) -> None:  # type: ignore[no-untyped-def]
    client = openai.OpenAI(base_url=f"{two.url}/v1", api_key="key-a", max_retries=0)
    cards = client.models.list().data
    assert [c.id for c in cards] == ["tiny", "stories"]
    tiny = client.models.retrieve("t")  # by alias
    assert tiny.id == "tiny" and tiny.owned_by == "tide"
    extra = tiny.model_extra or {}
    assert extra["default"] is True and extra["aliases"] == ["t"]
    assert extra["max_model_len"] > 0 and extra["warm_workers"] == 0 and extra["pools"] == []
    assert (client.models.retrieve("stories").model_extra or {})["default"] is False
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
