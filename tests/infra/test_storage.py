"""Storage backends: a local folder, and S3 against a moto server on loopback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from infra.redis_server import free_port
from infra.storage import LocalStorage, S3Storage


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    exe = shutil.which("moto_server") or os.path.join(
        os.path.dirname(sys.executable), "moto_server"
    )
    if not os.path.exists(exe):
        pytest.skip("moto_server is not installed")
    port = free_port()
    proc = subprocess.Popen(
        [exe, "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1"
    )
    yield url
    proc.terminate()
    proc.wait()


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
