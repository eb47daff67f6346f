"""What the official `openai` client gets back: n choices, logprobs in both shapes, echo,
prompt lists, streams with usage, `parse` with a pydantic model. A live gateway on loopback,
a fake worker writing the worker's result shape (tests/gateway/live.py)."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from tests.gateway.live import Answer, split

pytestmark = pytest.mark.timeout(60)


def sampling(worker, k: int = 0) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(worker.seen[k]["sampling"])


def test_completions_n_choices_with_logprobs_and_text_offset(oai, fleet, tiny_path):
    out = oai.completions.create(model=str(tiny_path), prompt="Once", n=3, logprobs=2)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert [c.text for c in out.choices] == [f"choice {i} says hi" for i in range(3)]
    for choice in out.choices:
        lp = choice.logprobs
        assert "".join(lp.tokens) == choice.text
        assert lp.text_offset == [sum(len(t) for t in lp.tokens[:j]) for j in range(len(lp.tokens))]
        assert lp.token_logprobs[0] == -0.25 and all(x < 0 for x in lp.token_logprobs)
        assert all(top == {"alt0": -1.0, "alt1": -2.0} for top in lp.top_logprobs)
    assert out.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in out.choices)
    assert sampling(fleet[1]) | {"n": 3, "logprobs": 2} == sampling(fleet[1])


def test_a_list_of_prompts_is_one_job_each_and_one_response(oai, fleet, tiny_path):
    out = oai.completions.create(model=str(tiny_path), prompt=["ab", "cde"], n=2, max_tokens=5)
    worker = fleet[1]
    assert len(worker.seen) == 2  # one job per prompt, each with n=2
    assert [c.index for c in out.choices] == [0, 1, 2, 3]  # prompt_i * n + j
    assert [c.text for c in out.choices] == [f"choice {j} says hi" for j in (0, 1, 0, 1)]
    prompt_tokens = sorted(int(r["prompt_tokens"]) for r in worker.seen)
    assert prompt_tokens == [3, 4] and out.usage.prompt_tokens == 7  # <s> + bytes
    assert out.id == worker.seen[0]["id"] or out.id == worker.seen[1]["id"]


def test_token_id_prompts_go_to_the_job_as_they_are(oai, fleet, tiny_path):
    oai.completions.create(model=str(tiny_path), prompt=[[1, 80, 81], [1, 90]], max_tokens=3)
    ids = sorted(json.loads(r["token_ids"]) for r in fleet[1].seen)
    assert ids == [[1, 80, 81], [1, 90]]
    oai.completions.create(model=str(tiny_path), prompt=[1, 70], max_tokens=3)
    assert json.loads(fleet[1].seen[-1]["token_ids"]) == [1, 70]


def test_echo_puts_the_prompt_before_the_text(oai, tiny_path):
    out = oai.completions.create(model=str(tiny_path), prompt="Say: ", echo=True, max_tokens=4)
    assert out.choices[0].text == "Say: choice 0 says hi"
    chunks = list(oai.completions.create(model=str(tiny_path), prompt="Say: ", echo=True,
                                         max_tokens=4, stream=True))  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks) == "Say: choice 0 says hi"
    ids = oai.completions.create(model=str(tiny_path), prompt=[1, 76, 109], echo=True)
    assert ids.choices[0].text == "Hichoice 0 says hi"  # ids decoded: byte b is token 4 + b


def test_chat_logprobs_and_top_logprobs(oai, fleet, tiny_path):
    out = oai.chat.completions.create(
        model=str(tiny_path), messages=[{"role": "user", "content": "hi"}], logprobs=True,
        top_logprobs=3, max_completion_tokens=9,
    )  # fmt: skip
    content = out.choices[0].logprobs.content
    assert "".join(t.token for t in content) == out.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 and t.bytes == list(t.token.encode()) for t in content)
    assert sampling(fleet[1])["logprobs"] == 3 and sampling(fleet[1])["max_tokens"] == 9
    plain = oai.chat.completions.create(model=str(tiny_path), messages=[{"role": "user",
                                        "content": "hi"}])  # fmt: skip
    assert plain.choices[0].logprobs is None and "logprobs" not in sampling(fleet[1], 1)


def test_chat_stream_with_usage_logprobs_and_n(oai, tiny_path):
    chunks = list(oai.chat.completions.create(
        model=str(tiny_path), messages=[{"role": "user", "content": "hi"}], n=2, stream=True,
        stream_options={"include_usage": True}, logprobs=True, top_logprobs=1,
    ))  # fmt: skip
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])
    for i in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        text = "".join(ch.delta.content or "" for ch in mine)
        assert text == f"choice {i} says hi"
        assert mine[0].delta.role == "assistant" and mine[-1].finish_reason == "stop"
        tokens = [t.token for ch in mine if ch.logprobs for t in ch.logprobs.content]
        assert "".join(tokens) == text


def test_completions_stream_offsets_continue_across_chunks(oai, tiny_path):
    chunks = list(oai.completions.create(model=str(tiny_path), prompt="x", logprobs=0,
                                         stream=True))  # fmt: skip
    offsets = [
        o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset
    ]
    tokens = split(Answer(text="choice 0 says hi"))
    assert offsets == [sum(len(t) for t in tokens[:j]) for j in range(len(tokens))]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_stream_without_usage_has_no_usage_chunk(oai, tiny_path):
    chunks = list(oai.completions.create(model=str(tiny_path), prompt="x", stream=True))
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)


class Invoice(BaseModel):
    number: str
    total: int
    paid: bool


def test_parse_gives_the_pydantic_model_and_the_schema_reaches_the_job(oai, fleet, tiny_path):
    _gateway, worker = fleet
    worker.script = lambda record, i: Answer(text='{"number": "A-1", "total": 12, "paid": true}')
    out = oai.chat.completions.parse(
        model=str(tiny_path), messages=[{"role": "user", "content": "The invoice"}],
        response_format=Invoice,
    )  # fmt: skip
    assert out.choices[0].message.parsed == Invoice(number="A-1", total=12, paid=True)
    schema = sampling(worker)["structured"]["json_schema"]
    assert schema["properties"].keys() == {"number", "total", "paid"}
    assert schema["additionalProperties"] is False


def test_finish_reason_length_reaches_the_client(oai, fleet, tiny_path):
    fleet[1].script = lambda record, i: Answer(text="cut", finish_reason="length")
    out = oai.completions.create(model=str(tiny_path), prompt="x", max_tokens=1)
    assert out.choices[0].finish_reason == "length"
