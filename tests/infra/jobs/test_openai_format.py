"""OpenAI bodies from job records: old records without `choices`, several prompts' jobs in
one response, echo, both logprobs shapes, tool calls read from chat text."""

from __future__ import annotations

import json

import pytest

from tide_fleet.infra.jobs.openai_format import chat_body, completion_body, completions_body
from tide_fleet.infra.jobs.openai_logprobs import completion_logprobs


def record(job_id: str = "job_1", **fields) -> dict[str, str]:  # type: ignore[no-untyped-def]
    base = {"id": job_id, "created_at": "100.5", "prompt_tokens": "4", "text": "hi",
            "finish_reason": "stop", "completion_tokens": "1"}  # fmt: skip
    return base | {k: v if isinstance(v, str) else json.dumps(v) for k, v in fields.items()}


def lp_entry(token: str, logprob: float, *alts: tuple[str, float]) -> dict:
    return {"token": token, "bytes": list(token.encode()), "logprob": logprob,
            "top_logprobs": [{"token": t, "bytes": list(t.encode()), "logprob": p}
                             for t, p in alts]}  # fmt: skip


def test_a_record_without_choices_is_one_choice():
    body = completion_body(record(), "m")
    assert body["choices"] == [{"index": 0, "text": "hi", "finish_reason": "stop",
                                "logprobs": None}]  # fmt: skip
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}
    assert body["created"] == 100 and body["object"] == "text_completion"


def test_completion_logprobs_shape_and_offsets():
    entries = [lp_entry("He", -0.1, ("He", -0.1), ("A", -2.0)), lp_entry("llo", -0.5)]
    assert completion_logprobs(entries) == {
        "tokens": ["He", "llo"], "token_logprobs": [-0.1, -0.5],
        "top_logprobs": [{"He": -0.1, "A": -2.0}, {}], "text_offset": [0, 2],
    }  # fmt: skip
    assert completion_logprobs(entries, offset=5)["text_offset"] == [5, 7]


def test_prompts_jobs_make_one_body_indexed_by_prompt_then_choice():
    choices = [{"index": i, "text": f"c{i}", "finish_reason": "length", "completion_tokens": 2,
                "logprobs": None} for i in (1, 0)]  # fmt: skip
    a = record("job_a", choices=choices, completion_tokens="4")
    b = record("job_b", choices=choices, completion_tokens="4", render={"echo": "P: "})
    body = completions_body([a, b], "m")
    assert [(c["index"], c["text"]) for c in body["choices"]] == [
        (0, "c0"), (1, "c1"), (2, "P: c0"), (3, "P: c1")]  # fmt: skip
    assert body["id"] == "job_a" and body["usage"]["total_tokens"] == 16


def test_chat_logprobs_and_tool_calls():
    entries = [lp_entry("{", -0.2, ("{", -0.2))]
    choices = [
        {
            "index": 0,
            "text": '{"name": "f", "arguments": {"x": 1}}',
            "finish_reason": "stop",
            "logprobs": entries,
        },
        {"index": 1, "text": "plain", "finish_reason": "length", "logprobs": entries},
    ]
    rec = record(choices=choices, render={"tools": {"mode": "auto", "names": ["f"]}})
    body = chat_body(rec, "m")
    first, second = body["choices"]
    assert first["finish_reason"] == "tool_calls" and first["message"]["content"] is None
    assert first["message"]["tool_calls"] == [{"id": "call_1_0_0", "type": "function",
        "function": {"name": "f", "arguments": '{"x": 1}'}}]  # fmt: skip
    assert second["message"] == {"role": "assistant", "content": "plain", "refusal": None}
    assert second["finish_reason"] == "length"
    assert second["logprobs"] == {"content": entries, "refusal": None}


def test_chat_without_tools_keeps_call_like_text_as_content():
    rec = record(text='{"name": "f", "arguments": {}}')
    assert chat_body(rec, "m")["choices"][0]["message"]["content"] == rec["text"]


@pytest.mark.parametrize("spacing", [(", ", ": "), (",", ":"), (" ,\n ", " : ")])
def test_a_long_choices_list_parses_one_choice_at_a_time_to_the_same_list(monkeypatch, spacing):
    from tide_fleet.infra.jobs import openai_format

    choices = [{"index": i, "text": "x" * 50, "logprobs": [{"token": "a", "logprob": -0.5}] * 3}
               for i in (2, 0, 1)]  # fmt: skip
    raw = "[ \n" + json.dumps(choices, separators=spacing)[1:-1] + "\n ]"
    monkeypatch.setattr(openai_format, "PIECEWISE_CHARS", 0)
    assert openai_format.record_choices({"choices": raw}) == sorted(
        choices, key=lambda c: c["index"]
    )
