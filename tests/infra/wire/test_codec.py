"""The Redis hash codec: what each kind of value is stored as, and reading a hash back."""

from __future__ import annotations

import pytest

from tide_fleet.infra.wire.codec import decode_hash, encode_value


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ("text", "text"),
        ("", ""),
        (None, ""),
        (True, "1"),
        (False, "0"),
        (7, "7"),
        (0.1, "0.1"),
        (1712345678.123456, "1712345678.123456"),
        ({"a": 1}, '{"a": 1}'),
        ([{"code": "x"}], '[{"code": "x"}]'),
    ],
)
def test_encode_value(value, stored):
    assert encode_value(value) == stored


def test_a_float_round_trips():
    t = 1712345678.1234567
    assert float(encode_value(t)) == t


def test_decode_hash():
    assert decode_hash({b"id": b"job_1", b"text": "é".encode()}) == {"id": "job_1", "text": "é"}
    assert decode_hash({}) == {}


def test_a_hash_written_and_read_back(redis_client):
    fields = {"id": "b1", "total": 3, "errors": [{"line": 1}], "webhook_url": None}
    redis_client.hset("h", mapping={k: encode_value(v) for k, v in fields.items()})
    assert decode_hash(redis_client.hgetall("h")) == {
        "id": "b1", "total": "3", "errors": '[{"line": 1}]', "webhook_url": "",
    }  # fmt: skip
