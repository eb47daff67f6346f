"""The OpenAI surface through the official `openai` client against a live local fleet:
real gateway, real worker processes, real Redis. What the gateway-level tests check with
a fake worker, checked here with the engine behind it."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from openai import BadRequestError, OpenAI
from pydantic import BaseModel

from tests.service.test_batches import line, wait_batch
from tests.worker.test_structured_properties import random_schema

pytestmark = pytest.mark.slow


@pytest.fixture
def client(fleet):
    return OpenAI(base_url=f"{fleet.url}/v1", api_key="key-a", max_retries=0, timeout=120)


def test_n_choices_logprobs_and_seed(client, fleet_model):
    kwargs = {"model": str(fleet_model), "prompt": "Once upon a time", "max_tokens": 12}
    first = client.completions.create(**kwargs, n=3, temperature=1.0, seed=7, logprobs=2)
    again = client.completions.create(**kwargs, n=3, temperature=1.0, seed=7, logprobs=2)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]  # seeded
    assert len({c.text for c in first.choices}) > 1  # choice i samples with seed + i
    for choice in first.choices:
        lp = choice.logprobs
        assert lp is not None and "".join(lp.tokens) == choice.text
        assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.text_offset)
        assert all(1 <= len(top) <= 2 for top in lp.top_logprobs)  # dicts by token text
        assert all(x <= 0 for x in lp.token_logprobs)
    assert first.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in first.choices)


def test_greedy_n_choices_agree_and_stop_text_is_excluded(client, fleet_model):
    out = client.completions.create(
        model=str(fleet_model), prompt="Once upon a time", max_tokens=30, temperature=0, n=2
    )
    assert out.choices[0].text == out.choices[1].text
    text = out.choices[0].text
    word = text.split()[2] if len(text.split()) > 3 else text[:3]
    cut = client.completions.create(
        model=str(fleet_model), prompt="Once upon a time", max_tokens=30, temperature=0,
        stop=[word],
    )  # fmt: skip
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(word)]


def test_chat_stream_with_usage_and_logprobs(client, fleet_model):
    chunks = list(
        client.chat.completions.create(
            model=str(fleet_model), messages=[{"role": "user", "content": "Tell a story"}],
            max_completion_tokens=10, temperature=0, stream=True,
            stream_options={"include_usage": True}, logprobs=True, top_logprobs=3,
        )
    )  # fmt: skip
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == 1 and chunks[-1].usage is not None and chunks[-1].choices == []
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    tokens = [
        t for c in chunks if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content
    ]  # fmt: skip
    assert "".join(t.token for t in tokens) == text
    assert all(len(t.top_logprobs) == 3 for t in tokens)
    assert usage[0].completion_tokens == len(tokens)


def test_random_json_schemas_validate_through_the_fleet(client, fleet_model):
    rng = random.Random(14)
    schemas = [random_schema(rng) for _ in range(12)]
    completed = 0
    for i, schema in enumerate(schemas):
        out = client.chat.completions.create(
            model=str(fleet_model), messages=[{"role": "user", "content": f"Item {i}"}],
            max_tokens=300, temperature=1.0, seed=i,
            response_format={"type": "json_schema",
                             "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}},
        )  # fmt: skip
        choice = out.choices[0]
        if choice.finish_reason == "stop":
            completed += 1
            jsonschema.Draft202012Validator(schema).validate(json.loads(choice.message.content))
    assert completed >= 10


class Invoice(BaseModel):
    number: str
    total: int
    paid: bool


def test_chat_completions_parse_gives_the_pydantic_model(client, fleet_model):
    out = client.chat.completions.parse(
        model=str(fleet_model), messages=[{"role": "user", "content": "The invoice"}],
        response_format=Invoice, max_tokens=200, temperature=0.8, seed=3,
    )  # fmt: skip
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(out.choices[0].message.parsed, Invoice)


def test_a_bad_schema_is_refused_before_anything_is_queued(client, fleet_model, fleet_redis):
    before = fleet_redis.dbsize()
    with pytest.raises(BadRequestError) as e:
        client.chat.completions.create(
            model=str(fleet_model), messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_schema", "json_schema": {
                "name": "bad", "schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}
            }},
        )  # fmt: skip
    assert e.value.body["param"].startswith("response_format")
    assert fleet_redis.dbsize() == before


def test_structured_batch_lines_validate(client, fleet_model):
    rng = random.Random(41)
    schemas = [random_schema(rng) for _ in range(10)]
    lines = [
        line(f"doc-{i}", {
            "model": str(fleet_model), "messages": [{"role": "user", "content": f"Doc {i}"}],
            "max_tokens": 300, "temperature": 1.0, "seed": i,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": s}},
        }, url="/v1/chat/completions")
        for i, s in enumerate(schemas)
    ]  # fmt: skip
    upload = client.files.create(file=("s.jsonl", "\n".join(lines).encode()), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = wait_batch(client, batch.id, timeout=240)
    assert done.status == "completed" and done.request_counts.completed == 10, done
    outputs = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    stopped = 0
    for out, schema in zip(outputs, schemas, strict=True):
        choice = out["response"]["body"]["choices"][0]
        if choice["finish_reason"] == "stop":
            stopped += 1
            jsonschema.Draft202012Validator(schema).validate(
                json.loads(choice["message"]["content"])
            )
    assert stopped >= 8
