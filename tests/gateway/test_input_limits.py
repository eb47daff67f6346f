"""Bad input is refused at the gateway with a 400 that names the field; nothing is enqueued.

Covers strings that cannot be encoded (lone surrogates), strict types, metadata and stop
limits, the request body-size limit and the prompt-length pre-check.
"""

from __future__ import annotations

import json
from fnmatch import fnmatchcase

import pytest

from tests.gateway.test_api import A, make_client, queued_messages
from tide_fleet.infra.wire.protocol import Keys

pytestmark = pytest.mark.timeout(60)  # a request that waits for a worker fails, not hangs

BAD = "\udfff"  # a lone surrogate: valid in JSON ("\udfff"), not encodable as UTF-8


def post_raw(client, path: str, body: dict, headers: dict | None = None):  # type: ignore[no-untyped-def]
    """json.dumps escapes the surrogate as \\udfff, which httpx's own encoder would refuse."""
    content = json.dumps(body)
    return client.post(
        path, content=content, headers={**A, "content-type": "application/json", **(headers or {})}
    )


def assert_refused(r, redis_client, status: int, param: str, *fragments: str) -> None:  # type: ignore[no-untyped-def]
    assert r.status_code == status, r.text
    error = r.json()["error"]  # always JSON in the error shape
    assert set(error) >= {"message", "type", "param", "code"}
    assert fnmatchcase(error["param"], param), error  # a key's own text may be replaced
    for fragment in fragments:
        assert fragment in error["message"], error
    assert queued_messages(redis_client) == 0
    assert not redis_client.keys("tide:job:*")


@pytest.fixture
def client(redis_server, redis_client, tiny_path):
    with make_client(redis_server, str(tiny_path)) as c:
        yield c


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/jobs", {"prompt": f"a{BAD}"}, "prompt"),
        ("/v1/jobs", {"messages": [{"role": "user", "content": BAD}]}, "messages.0.content"),
        ("/v1/jobs", {"prompt": "a", "metadata": {"k": BAD}}, "metadata.k"),
        ("/v1/jobs", {"prompt": "a", "metadata": {BAD: "v"}}, "metadata.*.[[]key]"),
        ("/v1/jobs", {"prompt": "a", "stop": BAD}, "stop"),
        ("/v1/jobs", {"prompt": "a", "stop": ["ok", BAD]}, "stop"),
        ("/v1/jobs", {"prompt": "a", "webhook": {"url": f"http://127.0.0.1/{BAD}"}}, "webhook.url"),
        ("/v1/jobs", {"prompt": "a", BAD: 1}, "?*"),
        ("/v1/completions", {"prompt": BAD}, "prompt"),
        ("/v1/completions", {"prompt": "a", "model": BAD}, "model"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": BAD}]},
         "messages.0.content"),
    ],
)  # fmt: skip
def test_unencodable_strings_are_a_400_naming_the_field(client, redis_client, path, body, param):
    r = post_raw(client, path, body)
    assert_refused(r, redis_client, 400, param)


def test_a_lone_surrogate_names_its_position(client, redis_client):
    r = post_raw(client, "/v1/jobs", {"prompt": f"ab{BAD}"})
    assert_refused(r, redis_client, 400, "prompt", "U+DFFF", "UTF-8", "character 2")


def test_an_unexpected_error_is_a_json_500(redis_server, redis_client, tiny_path):
    with make_client(redis_server, str(tiny_path), raise_server_exceptions=False) as c:
        job = c.post("/v1/jobs", json={"prompt": "a", "max_tokens": 2}, headers=A).json()
        # A record written before surrogates were refused: it cannot be rendered as UTF-8.
        redis_client.hset(Keys.job(job["id"]), "metadata", json.dumps({"k": BAD}))
        r = c.get(f"/v1/jobs/{job['id']}", headers=A)
    assert r.status_code == 500
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert error["type"] == "server_error" and "internal error" in error["message"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/jobs", {"prompt": "a", "max_tokens": "8"}, "max_tokens"),
        ("/v1/jobs", {"prompt": "a", "max_tokens": 8.0}, "max_tokens"),
        ("/v1/jobs", {"prompt": "a", "max_tokens": True}, "max_tokens"),
        ("/v1/jobs", {"prompt": "a", "ignore_eos": "yes"}, "ignore_eos"),
        ("/v1/jobs", {"prompt": "a", "ignore_eos": 1}, "ignore_eos"),
        ("/v1/jobs", {"prompt": "a", "temperature": "0.5"}, "temperature"),
        ("/v1/jobs", {"prompt": "a", "temperature": False}, "temperature"),
        ("/v1/jobs", {"prompt": "a", "top_p": "1"}, "top_p"),
        ("/v1/jobs", {"prompt": "a", "seed": "7"}, "seed"),
        ("/v1/jobs", {"prompt": "a", "top_k": "5"}, "top_k"),
        ("/v1/completions", {"prompt": "a", "stream": 0}, "stream"),
        ("/v1/completions", {"prompt": "a", "max_tokens": "8"}, "max_tokens"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}],
                                  "stream": "true"}, "stream"),
    ],
)  # fmt: skip
def test_no_type_coercion(client, redis_client, path, body, param):
    assert_refused(client.post(path, json=body, headers=A), redis_client, 400, param)


def test_floats_take_integers(client):
    r = client.post("/v1/jobs", json={"prompt": "a", "temperature": 1, "top_p": 1}, headers=A)
    assert r.status_code == 202, r.text


@pytest.mark.parametrize("top_k", [0, -2])
def test_top_k_is_minus_one_or_at_least_one(client, redis_client, top_k):
    r = client.post("/v1/jobs", json={"prompt": "a", "top_k": top_k}, headers=A)
    assert_refused(r, redis_client, 400, "top_k", "-1 (off) or at least 1")


def test_top_k_accepts_its_documented_values(client):
    for top_k in (-1, 1, 50):
        r = client.post("/v1/jobs", json={"prompt": "a", "top_k": top_k}, headers=A)
        assert r.status_code == 202, r.text


@pytest.mark.parametrize(
    ("metadata", "param", "limit"),
    [
        ({f"k{i}": "v" for i in range(17)}, "metadata", "16"),
        ({"k" * 65: "v"}, f"metadata.{'k' * 65}.[[]key]", "64"),
        ({"k": "v" * 513}, "metadata.k", "512"),
        ({"k": "v" * 640_000}, "metadata.k", "512"),
    ],
)
def test_metadata_limits(client, redis_client, metadata, param, limit):
    r = client.post("/v1/jobs", json={"prompt": "a", "metadata": metadata}, headers=A)
    assert_refused(r, redis_client, 400, param, limit)


def test_metadata_at_its_limits_is_accepted(client):
    metadata = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    r = client.post("/v1/jobs", json={"prompt": "a", "metadata": metadata}, headers=A)
    assert r.status_code == 202, r.text
    got = client.get(f"/v1/jobs/{r.json()['id']}", headers=A).json()
    assert got["metadata"] == metadata


@pytest.mark.parametrize(
    ("stop", "limit"),
    [
        ([f"s{i}" for i in range(9)], "at most 8 stop strings"),
        ("x" * 257, "at most 256 characters"),
        (["ok", "x" * 100_000], "at most 256 characters"),
        (["ok", ""], "non-empty"),
    ],
)
def test_stop_limits(client, redis_client, stop, limit):
    r = client.post("/v1/jobs", json={"prompt": "a", "stop": stop}, headers=A)
    assert_refused(r, redis_client, 400, "stop", limit)


def test_body_size_limit_by_content_length(redis_server, redis_client, tiny_path):
    with make_client(redis_server, str(tiny_path), max_body_bytes=10_000) as c:
        assert c.post("/v1/jobs", json={"prompt": "a" * 9_000}, headers=A).status_code != 413
        r = c.post("/v1/jobs", json={"prompt": "a" * 10_001}, headers=A)
        assert_refused(r, redis_client, 413, "body", "10000 bytes", "TIDE_MAX_BODY_BYTES")
        assert c.get("/healthz").status_code == 200


def test_body_size_limit_without_content_length(redis_server, redis_client, tiny_path):
    def chunks():  # sent chunked: the gateway counts what arrives
        yield b'{"prompt": "'
        for _ in range(20):
            yield b"a" * 1_000
        yield b'"}'

    with make_client(redis_server, str(tiny_path), max_body_bytes=10_000) as c:
        headers = {**A, "content-type": "application/json"}
        r = c.post("/v1/jobs", content=chunks(), headers=headers)
        assert_refused(r, redis_client, 413, "body", "10000 bytes")


def test_file_uploads_keep_their_own_limit(redis_server, redis_client, tiny_path, tmp_path):
    line = json.dumps(
        {"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {"prompt": "a"}}
    )
    content = "\n".join([line] * 400).encode()  # ~40 KB, above max_body_bytes
    with make_client(redis_server, str(tiny_path), max_body_bytes=10_000, data_dir=tmp_path) as c:
        r = c.post(
            "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}, headers=A
        )
        assert r.status_code == 200, r.text
        assert r.json()["bytes"] == len(content)


def test_a_prompt_far_longer_than_the_context_is_refused_before_tokenising(client, redis_client):
    # dummy:tiny: context 1024, longest vocabulary entry 5 characters ("<pad>").
    r = client.post("/v1/jobs", json={"prompt": "a" * 5_121}, headers=A)
    assert_refused(r, redis_client, 400, "prompt", "5121 characters", "1024 tokens")
    r = client.post("/v1/jobs", json={"prompt": "a" * 5_120}, headers=A)
    assert_refused(r, redis_client, 400, "prompt", "5121 tokens, but the model's context")
