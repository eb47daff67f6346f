"""The Files API's list takes OpenAI's paging fields (and refuses bad ones, as /v1/batches
does); upload and batch errors name their field; a 404 does not echo a huge id back."""

from __future__ import annotations

import json

import pytest

from tests.gateway.test_api import A, make_client

LINE = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/completions",
                   "body": {"prompt": "a"}})  # fmt: skip


@pytest.fixture
def client(redis_server, redis_client, tiny_path, tmp_path):
    with make_client(redis_server, str(tiny_path), data_dir=tmp_path, file_max_lines=10) as c:
        yield c


def upload(client, lines: int = 1, name: str = "in.jsonl"):  # type: ignore[no-untyped-def]
    content = "\n".join([LINE] * lines).encode()
    return client.post("/v1/files", files={"file": (name, content)}, data={"purpose": "batch"},
                       headers=A)  # fmt: skip


def error_of(r, status: int = 400) -> dict:  # type: ignore[no-untyped-def,type-arg]
    assert r.status_code == status, r.text
    return r.json()["error"]


@pytest.mark.parametrize(("query", "fragment"), [
    ("limit=100000", "less than or equal to 10000"), ("limit=-5", "greater than or equal to 1"),
    ("limit=0", "greater than or equal to 1"), ("order=sideways", "'asc' or 'desc'"),
])  # fmt: skip
def test_bad_list_fields_are_a_400_naming_them(client, query, fragment):
    error = error_of(client.get(f"/v1/files?{query}", headers=A))
    assert error["param"] == query.split("=")[0] and fragment in error["message"], error


def test_the_list_pages_in_either_order(client):
    ids = [upload(client, name=f"f{k}.jsonl").json()["id"] for k in range(5)]
    newest = client.get("/v1/files?limit=2", headers=A).json()
    assert [f["id"] for f in newest["data"]] == ids[:-3:-1] and newest["has_more"] is True
    after = newest["last_id"]
    rest = client.get(f"/v1/files?limit=10&after={after}", headers=A).json()
    assert [f["id"] for f in rest["data"]] == ids[2::-1] and rest["has_more"] is False
    # Created within one second of each other, files keep their upload order only when
    # their times differ; compare as sets there and check the order's direction by ends.
    oldest = client.get("/v1/files?order=asc", headers=A).json()
    assert sorted(f["id"] for f in oldest["data"]) == sorted(ids)
    assert [f["id"] for f in oldest["data"]] == [f["id"] for f in newest["data"] + rest["data"]][
        ::-1
    ]
    assert client.get("/v1/files?purpose=batch_output", headers=A).json()["data"] == []
    assert len(client.get("/v1/files?purpose=batch", headers=A).json()["data"]) == 5


def test_a_file_over_the_line_limit_names_the_field_and_the_limit(client, redis_client):
    error = error_of(upload(client, lines=12))
    assert error["param"] == "file" and "10 lines" in error["message"], error
    assert client.get("/v1/files", headers=A).json()["data"] == []


def test_batch_creation_errors_name_their_field(client):
    body = {"input_file_id": "file-nope", "endpoint": "/v1/completions"}
    assert error_of(client.post("/v1/batches", json=body, headers=A))["param"] == "input_file_id"
    file_id = upload(client).json()["id"]
    body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "soon"}
    assert error_of(client.post("/v1/batches", json=body, headers=A))["param"] == (
        "completion_window"
    )


@pytest.mark.parametrize("path", ["/v1/jobs/{}", "/v1/files/{}", "/v1/batches/{}"])
def test_a_404_does_not_echo_a_huge_id(client, path):
    huge = "x" * 5_000
    error = error_of(client.get(path.format(huge), headers=A), 404)
    assert len(error["message"]) < 200 and "5000 characters" in error["message"], error
