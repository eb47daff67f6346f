"""Every field of OpenAI's completions and chat requests is honoured (it reaches the job's
record) or refused with a 400 naming it in `param`, through the official `openai` client
against a live gateway; nothing is queued for a refused request."""

from __future__ import annotations

import json

import openai
import pytest

pytestmark = pytest.mark.timeout(60)

MSG = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def create(oai, endpoint: str, model: str, body: dict):  # type: ignore[no-untyped-def]
    """Send `body` as JSON through the client (extra_body: the wire is what is tested)."""
    if endpoint == "completions":
        return oai.completions.create(model=model, prompt=body.pop("prompt", "hi"),
                                      extra_body=body)  # fmt: skip
    return oai.chat.completions.create(model=model, messages=body.pop("messages", MSG),
                                       extra_body=body)  # fmt: skip


HONOURED = [
    ("completions", {"presence_penalty": 0.5}, {"presence_penalty": 0.5}),
    ("completions", {"frequency_penalty": -0.5}, {"frequency_penalty": -0.5}),
    ("completions", {"repetition_penalty": 1.2}, {"repetition_penalty": 1.2}),
    ("completions", {"logit_bias": {"5": 10}}, {"logit_bias": {"5": 10.0}}),
    ("completions", {"min_tokens": 2}, {"min_tokens": 2}),
    ("completions", {"seed": 7}, {"seed": 7}),
    ("completions", {"stop": ["x", "y"]}, {"stop": ["x", "y"]}),
    ("completions", {"stop": "x"}, {"stop": ["x"]}),
    ("completions", {"temperature": 0, "top_p": 0.5}, {"temperature": 0.0, "top_p": 0.5}),
    ("completions", {"top_k": 5, "ignore_eos": True}, {"top_k": 5, "ignore_eos": True}),
    ("completions", {"n": 2, "best_of": 2}, {"n": 2}),
    ("completions", {"max_tokens": 7}, {"max_tokens": 7}),
    ("completions", {"logprobs": 0}, {"logprobs": 0}),
    ("completions", {"response_format": {"type": "json_object"}},
     {"structured": {"json_object": True}}),
    ("completions", {"response_format": {"type": "regex", "regex": "[0-9]+"}},
     {"structured": {"regex": "[0-9]+"}}),
    ("completions", {"response_format": {"type": "choice", "choice": ["yes", "no"]}},
     {"structured": {"choice": ["yes", "no"]}}),
    ("completions", {"response_format": {"type": "text"}, "suffix": None, "echo": False}, {}),
    ("chat", {"max_completion_tokens": 5}, {"max_tokens": 5}),
    ("chat", {"max_tokens": 6, "max_completion_tokens": 6}, {"max_tokens": 6}),
    ("chat", {"response_format": {"type": "json_schema",
                                  "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     {"structured": {"json_schema": SCHEMA}}),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     {"structured": {"json_object": True}}),
    ("chat", {"logprobs": True}, {"logprobs": 0}),
    ("chat", {"service_tier": "auto", "store": False, "modalities": ["text"],
              "prompt_cache_retention": "in_memory", "parallel_tool_calls": True}, {}),
    ("chat", {"temperature": None, "n": None, "audio": None, "functions": None}, {}),
    ("chat", {"messages": [{"role": "developer", "content": "Be brief."},
                           {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, {}),
]  # fmt: skip


@pytest.mark.parametrize(("endpoint", "body", "expected"), HONOURED)
def test_honoured_fields_reach_the_jobs_sampling(oai, fleet, tiny_path, endpoint, body, expected):
    create(oai, endpoint, str(tiny_path), dict(body))
    sampling = json.loads(fleet[1].seen[0]["sampling"])
    assert sampling | expected == sampling, sampling


def test_recorded_fields_are_on_the_job_record(oai, fleet, tiny_path):
    create(
        oai,
        "chat",
        str(tiny_path),
        {
            "user": "u-1",
            "safety_identifier": "s-1",
            "prompt_cache_key": "c-1",
            "metadata": {"k": "v"},
        },
    )
    record = fleet[1].seen[0]
    assert (record["user"], record["safety_identifier"], record["prompt_cache_key"]) == (
        "u-1", "s-1", "c-1")  # fmt: skip
    assert json.loads(record["metadata"]) == {"k": "v"}
    create(oai, "completions", str(tiny_path), {"user": "u-2"})
    assert fleet[1].seen[1]["user"] == "u-2"


def test_the_model_may_be_left_out(fleet, redis_client):
    import httpx

    r = httpx.post(f"{fleet[0].url}/v1/completions", json={"prompt": "hi"},
                   headers={"Authorization": "Bearer key-a"}, timeout=20)  # fmt: skip
    assert r.status_code == 200, r.text


REFUSED = [
    ("completions", {"suffix": "tail"}, "suffix", "unsupported_parameter"),
    ("completions", {"best_of": 3}, "best_of", "unsupported_value"),
    ("completions", {"echo": True, "logprobs": 1}, "echo", "unsupported_value"),
    ("completions", {"stream_options": {"include_usage": True}}, "stream_options", None),
    ("completions", {"logprobs": 6}, "logprobs", None),
    ("completions", {"logit_bias": {"260": 1}}, "logit_bias", "invalid_token_id"),
    ("completions", {"logit_bias": {"5": 101}}, "logit_bias", "invalid_logit_bias"),
    ("completions", {"logit_bias": {"-1": 1}}, "logit_bias", "invalid_logit_bias"),
    ("completions", {"prompt": [1, 260]}, "prompt", "invalid_token_id"),
    ("completions", {"prompt": [[1, 5], []]}, "prompt", "empty_prompt"),
    ("completions", {"prompt": ["a"] * 65}, "prompt", "too_many_prompts"),
    ("completions", {"prompt": ["a"] * 9, "n": 16}, "n", "too_many_choices"),
    ("completions", {"n": 17}, "n", None),
    ("completions", {"n": 0}, "n", None),
    ("completions", {"min_tokens": 20, "max_tokens": 4}, "min_tokens", None),
    ("completions", {"presence_penalty": 2.5}, "presence_penalty", None),
    ("completions", {"repetition_penalty": 0}, "repetition_penalty", None),
    ("completions", {"min_p": 0.1}, "min_p", "extra_forbidden"),
    ("completions", {"response_format": {"type": "regex", "regex": "(["}}, "response_format",
     "invalid_schema"),
    ("completions", {"response_format": {"type": "regex"}}, "response_format", "missing_field"),
    ("completions", {"response_format": {"type": "choice", "choice": ["x"] * 10_001}},
     "response_format", "invalid_response_format"),
    ("chat", {"stream": True, "stream_options": {"include_obfuscation": True}},
     "stream_options.include_obfuscation", "unsupported_value"),
    ("chat", {"audio": {"voice": "alloy", "format": "wav"}}, "audio", "unsupported_parameter"),
    ("chat", {"modalities": ["text", "audio"]}, "modalities", "unsupported_value"),
    ("chat", {"prediction": {"type": "content", "content": "x"}}, "prediction", None),
    ("chat", {"web_search_options": {}}, "web_search_options", None),
    ("chat", {"functions": [{"name": "f"}]}, "functions", None),
    ("chat", {"function_call": "auto"}, "function_call", None),
    ("chat", {"reasoning_effort": "low"}, "reasoning_effort", None),
    ("chat", {"verbosity": "low"}, "verbosity", None),
    ("chat", {"service_tier": "flex"}, "service_tier", "unsupported_value"),
    ("chat", {"moderation": {"model": "m"}}, "moderation", None),
    ("chat", {"prompt_cache_retention": "24h"}, "prompt_cache_retention", None),
    ("chat", {"prompt_cache_options": {"mode": "explicit"}}, "prompt_cache_options", None),
    ("chat", {"store": True}, "store", "unsupported_value"),
    ("chat", {"max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens", None),
    ("chat", {"top_logprobs": 2}, "top_logprobs", None),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", None),
    ("chat", {"logprobs": 1}, "logprobs", "bool_type"),
    ("chat", {"tool_choice": "required"}, "tool_choice", None),
    ("chat", {"tool_choice": {"type": "allowed_tools", "allowed_tools": {}}}, "tool_choice",
     "unsupported_value"),
    ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools",
     "tools_unsupported"),
    ("chat", {"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools.0.type", None),
    ("chat", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     "messages.0.content", "unsupported_content"),
    ("chat", {"messages": [{"role": "function", "content": "x", "name": "f"}]},
     "messages.0.role", None),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "bad", "schema": {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}}}},
     "response_format", "invalid_schema"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}},
     "response_format.json_schema.name", None),
]  # fmt: skip


@pytest.mark.parametrize(("endpoint", "body", "param", "code"), REFUSED)
def test_refused_fields_are_a_400_naming_them(
    oai, fleet, redis_client, tiny_path, endpoint, body, param, code
):
    with pytest.raises(openai.BadRequestError) as e:
        create(oai, endpoint, str(tiny_path), dict(body))
    error = e.value.body
    assert error["param"] == param, error
    assert error["message"].startswith(param), error
    if code is not None:
        assert error["code"] == code, error
    assert not redis_client.keys("tide:job:*") and not fleet[1].seen


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_another_model_is_a_404_model_not_found(oai, redis_client, endpoint):
    with pytest.raises(openai.NotFoundError) as e:
        create(oai, endpoint, "gpt-4o", {})
    assert e.value.body["param"] == "model" and e.value.body["code"] == "model_not_found"
    assert "gpt-4o" in e.value.body["message"] and not redis_client.keys("tide:job:*")
