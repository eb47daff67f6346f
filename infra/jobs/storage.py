"""File storage for batch inputs and outputs: a local folder or S3, behind one interface.

Everything streams: writes take an iterable of byte chunks, reads return a file-like
object to iterate; no file is read whole into memory.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Protocol
from urllib.parse import urlsplit

from tide_fleet.infra.settings import Settings

CHUNK = 1 << 20


class Storage(Protocol):
    def write(self, key: str, chunks: Iterable[bytes]) -> int:
        """Store the chunks under key (replacing it); return the size in bytes."""

    def open(self, key: str) -> IO[bytes]:
        """A readable binary stream of the object."""

    def delete(self, key: str) -> None: ...


class LocalStorage:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise ValueError(f"storage key escapes the root: {key!r}")
        return path

    def write(self, key: str, chunks: Iterable[bytes]) -> int:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
                    size += len(chunk)
            os.replace(tmp, path)  # readers never see a half-written file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return size

    def open(self, key: str) -> IO[bytes]:
        return self._path(key).open("rb")

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


class _ChunkReader(io.RawIOBase):
    """A file-like view of an iterator of byte chunks (for boto3's streaming upload)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._it: Iterator[bytes] = iter(chunks)
        self._buf = b""
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[no-untyped-def]
        while not self._buf:
            try:
                self._buf = next(self._it)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n], self._buf = self._buf[:n], self._buf[n:]
        self.size += n
        return n


class S3Storage:
    def __init__(self, bucket: str, prefix: str, endpoint_url: str | None = None) -> None:
        import boto3

        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.client = boto3.client("s3", endpoint_url=endpoint_url)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def write(self, key: str, chunks: Iterable[bytes]) -> int:
        reader = _ChunkReader(chunks)
        self.client.upload_fileobj(io.BufferedReader(reader, CHUNK), self.bucket, self._key(key))
        return reader.size

    def open(self, key: str) -> IO[bytes]:
        body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        return body  # type: ignore[no-any-return]

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(key))


def make_storage(settings: Settings) -> Storage:
    if not settings.storage_url:
        return LocalStorage(Path(settings.data_dir) / "files")
    parts = urlsplit(settings.storage_url)
    if parts.scheme == "s3":
        return S3Storage(parts.netloc, parts.path, settings.s3_endpoint_url)
    if parts.scheme in ("", "file"):
        return LocalStorage(Path(parts.path))
    raise ValueError(
        f"storage_url must be empty, file:///path or s3://bucket/prefix: {settings.storage_url!r}"
    )
