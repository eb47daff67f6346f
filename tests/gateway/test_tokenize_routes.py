"""vLLM's /tokenize and /detokenize: the model's own tokenizer, the same auth as /v1."""

from __future__ import annotations

import pytest

from tests.gateway.test_api import A, make_client


@pytest.fixture
def client(redis_server, redis_client, tiny_path):  # type: ignore[no-untyped-def]
    with make_client(redis_server, str(tiny_path)) as c:
        yield c


def test_tokenize_a_prompt_and_back(client, tiny_path):
    r = client.post("/tokenize", json={"prompt": "Hi", "model": str(tiny_path)}, headers=A)
    assert r.status_code == 200, r.text
    assert r.json() == {"count": 3, "max_model_len": 1024, "tokens": [1, 76, 109]}  # <s> H i
    bare = client.post("/tokenize", json={"prompt": "Hi", "add_special_tokens": False}, headers=A)
    assert bare.json()["tokens"] == [76, 109]
    back = client.post("/detokenize", json={"tokens": [76, 109]}, headers=A)
    assert back.status_code == 200 and back.json() == {"prompt": "Hi"}


def test_tokenize_messages_with_the_chat_template(client):
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    tokens = client.post("/tokenize", json=body, headers=A).json()["tokens"]
    job = client.post("/v1/jobs", json=body, headers=A).json()
    got = client.get(f"/v1/jobs/{job['id']}", headers=A).json()
    assert len(tokens) == got["usage"]["prompt_tokens"]  # what a chat job counts
    assert tokens[0] == 1  # the template writes <s>; no second one is added


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400,
         "body"),
        ("/tokenize", {"prompt": "a", "model": "other"}, 404, "model"),
        ("/tokenize", {"prompt": "a", "add_special_tokens": 1}, 400, "add_special_tokens"),
        ("/detokenize", {"tokens": [1, 999]}, 400, "tokens"),
        ("/detokenize", {"tokens": ["1"]}, 400, "tokens.0"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens.0"),
    ],
)  # fmt: skip
def test_bad_tokenize_requests(client, path, body, status, param):
    r = client.post(path, json=body, headers=A)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_tokenize_needs_the_api_key(client):
    assert client.post("/tokenize", json={"prompt": "a"}).status_code == 401
    assert client.post("/detokenize", json={"tokens": [5]}).status_code == 401
