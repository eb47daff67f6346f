"""File records (OpenAI Files API shape) in Redis; their bytes in ``infra.jobs.storage``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import redis

from tide_fleet.infra.jobs.storage import Storage
from tide_fleet.infra.wire.codec import decode_hash
from tide_fleet.infra.wire.protocol import Keys

LIST_READ = 500  # records read per round trip when listing


class FileTooLarge(ValueError):
    pass


def new_file_id() -> str:
    return "file-" + uuid.uuid4().hex


def limited(chunks: Iterable[bytes], max_bytes: int, max_lines: int) -> Iterator[bytes]:
    """Pass chunks through, raising FileTooLarge as soon as a limit is crossed."""
    size = lines = 0
    for chunk in chunks:
        size += len(chunk)
        lines += chunk.count(b"\n")
        if size > max_bytes:
            raise FileTooLarge(f"file: larger than the limit of {max_bytes} bytes")
        if lines > max_lines:
            raise FileTooLarge(f"file: more than the limit of {max_lines} lines")
        yield chunk


class FileStore:
    def __init__(self, client: redis.Redis, storage: Storage) -> None:
        self.r, self.storage = client, storage

    def create(
        self,
        tenant: str,
        filename: str,
        purpose: str,
        chunks: Iterable[bytes],
        file_id: str | None = None,
    ) -> dict[str, Any]:
        """Store the bytes first, then the record: a record always has its content."""
        file_id = file_id or new_file_id()
        key = f"{tenant}/{file_id}"
        size = self.storage.write(key, chunks)
        now = time.time()  # the list's order; the record keeps whole seconds, as OpenAI's
        record = {
            "id": file_id,
            "tenant": tenant,
            "filename": filename,
            "purpose": purpose,
            "bytes": size,
            "created_at": int(now),
            "storage_key": key,
        }
        pipe = self.r.pipeline()
        pipe.hset(Keys.file(file_id), mapping=record)
        pipe.zadd(Keys.tenant_files(tenant), {file_id: now})
        pipe.execute()
        return record

    def get(self, file_id: str, tenant: str | None = None) -> dict[str, str] | None:
        raw = self.r.hgetall(Keys.file(file_id))
        record = decode_hash(raw)
        if not record or (tenant is not None and record.get("tenant") != tenant):
            return None
        return record

    def list(
        self,
        tenant: str,
        *,
        after: str | None = None,
        limit: int = 100,
        order: str = "desc",
        purpose: str | None = None,
    ) -> tuple[list[dict[str, str]], bool]:
        """A page of the tenant's files by creation ("desc": newest first) and whether more
        follow; ``after`` is the last id of the previous page (unknown: from the start)."""
        key = Keys.tenant_files(tenant)
        ranked = self.r.zrevrange(key, 0, -1) if order == "desc" else self.r.zrange(key, 0, -1)
        ids = [i.decode() for i in ranked]
        if after in ids:
            ids = ids[ids.index(after) + 1 :]
        page: list[dict[str, str]] = []
        for start in range(0, len(ids), LIST_READ):
            pipe = self.r.pipeline(transaction=False)
            for file_id in ids[start : start + LIST_READ]:
                pipe.hgetall(Keys.file(file_id))
            for raw in pipe.execute():
                record = decode_hash(raw)
                if record.get("tenant") == tenant and purpose in (None, record.get("purpose")):
                    page.append(record)
            if len(page) > limit:
                break
        return page[:limit], len(page) > limit

    def delete(self, record: dict[str, str]) -> None:
        self.storage.delete(record["storage_key"])
        pipe = self.r.pipeline()
        pipe.delete(Keys.file(record["id"]))
        pipe.zrem(Keys.tenant_files(record["tenant"]), record["id"])
        pipe.execute()


def public_file(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": record["id"],
        "object": "file",
        "bytes": int(record["bytes"]),
        "created_at": int(record["created_at"]),
        "filename": record["filename"],
        "purpose": record["purpose"],
        "status": "processed",
    }
