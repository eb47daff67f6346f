"""Tools through the official client: rendered with the model's chat template, "required"
and a named function constrained to a call, "auto" read as calls when the output is one,
tool_calls in the message and in streams. A model whose template shows tools, a fake
worker answering with a call."""

from __future__ import annotations

import json

import openai
import pytest

from tests.gateway.live import Answer, live_fleet

pytestmark = pytest.mark.timeout(60)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}  # fmt: skip
TIME = {"type": "function", "function": {"name": "get_time"}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.fixture(scope="module")
def tools_fleet(redis_server, tools_model):  # type: ignore[no-untyped-def]
    with live_fleet(redis_server.url, str(tools_model)) as pair:
        yield pair


@pytest.fixture
def client(tools_fleet, redis_client):  # type: ignore[no-untyped-def]
    gateway, worker = tools_fleet
    worker.seen.clear()
    worker.script = lambda record, i: Answer(text=CALL)
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="key-a", max_retries=0)


def job(tools_fleet) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    record = tools_fleet[1].seen[0]
    return record, json.loads(record["sampling"])


def test_required_constrains_the_output_to_a_call_of_one_of_the_tools(client, tools_fleet,
                                                                      tools_model):  # fmt: skip
    out = client.chat.completions.create(model=str(tools_model), messages=ASK,
                                         tools=[WEATHER, TIME], tool_choice="required")  # fmt: skip
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"} and call.id.startswith("call_")
    record, sampling = job(tools_fleet)
    options = sampling["structured"]["json_schema"]["anyOf"]
    assert [o["properties"]["name"] for o in options] == [{"const": "get_weather"},
                                                          {"const": "get_time"}]  # fmt: skip
    assert options[0]["properties"]["arguments"] == WEATHER["function"]["parameters"]
    assert options[1]["properties"]["arguments"]["properties"] == {}  # no parameters: none
    # The template was given the tools: the prompt is longer than the messages alone.
    assert int(record["prompt_tokens"]) > 200


def test_a_named_function_is_the_only_call_allowed(client, tools_fleet, tools_model):
    named = {"type": "function", "function": {"name": "get_weather"}}
    client.chat.completions.create(model=str(tools_model), messages=ASK, tools=[WEATHER, TIME],
                                   tool_choice=named)  # fmt: skip
    schema = job(tools_fleet)[1]["structured"]["json_schema"]
    assert schema["properties"]["name"] == {"const": "get_weather"}
    assert schema["required"] == ["name", "arguments"]


def test_auto_reads_a_call_and_leaves_text_alone(client, tools_fleet, tools_model):
    out = client.chat.completions.create(model=str(tools_model), messages=ASK, tools=[WEATHER])
    assert out.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert "structured" not in job(tools_fleet)[1]  # auto: unconstrained
    tools_fleet[1].script = lambda record, i: Answer(text="It is sunny.")
    out = client.chat.completions.create(model=str(tools_model), messages=ASK, tools=[WEATHER])
    assert out.choices[0].message.content == "It is sunny."
    assert out.choices[0].message.tool_calls is None and out.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
         ["get_weather"]),
        ('{"name": "get_weather", "parameters": {"city": "Rome"}}', ["get_weather"]),
        ('[{"name": "get_weather", "arguments": {"city": "Rome"}}, '
         '{"name": "get_time", "arguments": {}}]', ["get_weather", "get_time"]),
    ],
)  # fmt: skip
def test_auto_reads_the_usual_call_spellings(client, tools_fleet, tools_model, text, names):
    tools_fleet[1].script = lambda record, i: Answer(text=text)
    out = client.chat.completions.create(model=str(tools_model), messages=ASK,
                                         tools=[WEATHER, TIME])  # fmt: skip
    assert [c.function.name for c in out.choices[0].message.tool_calls] == names


def test_parallel_tool_calls_false_keeps_a_list_as_text(client, tools_fleet, tools_model):
    text = '[{"name": "get_time", "arguments": {}}, {"name": "get_time", "arguments": {}}]'
    tools_fleet[1].script = lambda record, i: Answer(text=text)
    out = client.chat.completions.create(model=str(tools_model), messages=ASK, tools=[TIME],
                                         parallel_tool_calls=False)  # fmt: skip
    assert out.choices[0].message.content == text and out.choices[0].message.tool_calls is None


def test_none_renders_the_tools_but_reads_no_call(client, tools_fleet, tools_model):
    out = client.chat.completions.create(model=str(tools_model), messages=ASK, tools=[WEATHER],
                                         tool_choice="none")  # fmt: skip
    assert out.choices[0].message.content == CALL and out.choices[0].message.tool_calls is None
    assert "structured" not in job(tools_fleet)[1]


def test_a_stream_sends_the_call_as_tool_call_deltas(client, tools_model):
    chunks = list(client.chat.completions.create(
        model=str(tools_model), messages=ASK, tools=[WEATHER], stream=True))  # fmt: skip
    calls = [c.choices[0].delta.tool_calls for c in chunks if c.choices[0].delta.tool_calls]
    assert len(calls) == 1 and calls[0][0].index == 0
    assert calls[0][0].function.name == "get_weather"
    assert json.loads(calls[0][0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert all(not c.choices[0].delta.content for c in chunks)


def test_a_stream_of_text_with_auto_tools_streams_the_text(client, tools_fleet, tools_model):
    tools_fleet[1].script = lambda record, i: Answer(text="Sunny all week long.")
    chunks = list(client.chat.completions.create(
        model=str(tools_model), messages=ASK, tools=[WEATHER], stream=True))  # fmt: skip
    texts = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert "".join(texts) == "Sunny all week long." and len(texts) > 1  # not held to the end


def test_earlier_calls_and_tool_results_go_to_the_template(client, tools_fleet, tools_model):
    messages = [*ASK,
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]  # fmt: skip
    tools_fleet[1].script = lambda record, i: Answer(text="It is sunny in Paris.")
    out = client.chat.completions.create(model=str(tools_model), messages=messages,
                                         tools=[WEATHER])  # fmt: skip
    assert out.choices[0].message.content == "It is sunny in Paris."


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": "required",
          "response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"$ref": "#/missing"}}}}}],
          "tool_choice": "required"}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]},
         "tools.0.function.name"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0"),
    ],
)  # fmt: skip
def test_bad_tool_requests_are_400s(client, tools_fleet, redis_client, tools_model, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=str(tools_model), messages=body.pop("messages", ASK),
                                       extra_body=body)  # fmt: skip
    assert e.value.body["param"] == param, e.value.body
    assert not redis_client.keys("tide:job:*")
