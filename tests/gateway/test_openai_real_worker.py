"""The OpenAI routes with the real worker behind them (in a thread, dummy:tiny's weights):
n choices with logprobs, a streamed chat with usage, `parse` with a pydantic model and a
required tool call, both decoded under the grammar the gateway checked."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field

from tests.conftest import make_engine
from tests.gateway.live import real_worker

pytestmark = pytest.mark.timeout(120)

WEATHER = {"type": "function", "function": {  # bounded, so that a random model's call ends
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}  # fmt: skip


@pytest.fixture(scope="module")
def real(redis_server, tools_model):  # type: ignore[no-untyped-def]
    with real_worker(redis_server.url, str(tools_model), make_engine(tools_model)) as client:
        yield client


def test_n_choices_with_logprobs(real, tools_model):
    out = real.completions.create(
        model=str(tools_model), prompt="Once upon a time", n=2, max_tokens=6, seed=7,
        logprobs=2, extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert [c.index for c in out.choices] == [0, 1]
    for choice in out.choices:
        lp = choice.logprobs
        assert len(lp.tokens) == 6 and all(len(top) <= 2 for top in lp.top_logprobs)
        assert lp.text_offset[0] == 0 and all(x <= 0 for x in lp.token_logprobs)
    assert out.usage.completion_tokens == 12


def test_a_streamed_chat_with_usage_and_logprobs(real, tools_model):
    chunks = list(real.chat.completions.create(
        model=str(tools_model), messages=[{"role": "user", "content": "Tell a story"}],
        max_completion_tokens=8, temperature=0, stream=True, logprobs=True, top_logprobs=1,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    ))  # fmt: skip
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs
              for t in c.choices[0].logprobs.content]  # fmt: skip
    assert len(tokens) == 8 and all(len(t.top_logprobs) == 1 for t in tokens)


class Invoice(BaseModel):  # bounded, so that a random model's output ends
    number: str = Field(max_length=8)
    total: int = Field(ge=0, le=9999)
    paid: bool


def test_parse_decodes_the_pydantic_model(real, tools_model):
    out = real.chat.completions.parse(
        model=str(tools_model), messages=[{"role": "user", "content": "The invoice"}],
        response_format=Invoice, max_tokens=200, temperature=0.8, seed=3,
    )  # fmt: skip
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(out.choices[0].message.parsed, Invoice)


def test_a_required_tool_call_is_a_valid_call(real, tools_model):
    out = real.chat.completions.create(
        model=str(tools_model), messages=[{"role": "user", "content": "Weather?"}],
        tools=[WEATHER], tool_choice="required", max_tokens=200, temperature=0.8, seed=1,
    )  # fmt: skip
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
