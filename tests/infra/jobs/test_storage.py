"""Storage backends: a local folder, and S3 against a moto server on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tide_fleet.infra.jobs.storage import LocalStorage, S3Storage


def chunks(total_mb: int) -> Iterator[bytes]:
    line = b'{"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {}}\n'
    block = line * (1024 * 1024 // len(line))
    for _ in range(total_mb):
        yield block


def roundtrip(storage) -> None:  # type: ignore[no-untyped-def]
    size = storage.write("tenant/file-1", chunks(12))  # > 8 MB: a multipart upload on S3
    assert size == sum(len(c) for c in chunks(12))
    with storage.open("tenant/file-1") as f:
        read = 0
        while block := f.read(1 << 20):
            read += len(block)
    assert read == size
    storage.delete("tenant/file-1")
    with pytest.raises(Exception):  # noqa: B017 - FileNotFoundError or botocore's NoSuchKey
        storage.open("tenant/file-1").read()


def test_local_storage_streams_and_replaces_atomically(tmp_path):
    storage = LocalStorage(tmp_path)
    roundtrip(storage)

    def failing() -> Iterator[bytes]:
        yield b"partial"
        raise RuntimeError("upload broke")

    with pytest.raises(RuntimeError):
        storage.write("tenant/file-2", failing())
    assert not (tmp_path / "tenant/file-2").exists()
    assert not list((tmp_path / "tenant").glob(".upload-*")), "no half-written file is left"
    with pytest.raises(ValueError, match="escapes the root"):
        storage.write("../outside", [b"x"])


def test_s3_storage_against_moto(moto_url):
    import boto3

    boto3.client("s3", endpoint_url=moto_url).create_bucket(Bucket="tide-files")
    roundtrip(S3Storage("tide-files", "prefix/batches", endpoint_url=moto_url))
