"""OpenAI-compatible Files API (purpose "batch"), streamed to local or S3 storage."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, File, Form, HTTPException, UploadFile
from fastapi.responses import StreamingResponse

from gateway.deps import StateDep, TenantDep
from gateway.routes.jobs import ERRORS
from infra.jobs.files import FileTooLarge, limited, public_file
from infra.jobs.storage import CHUNK

router = APIRouter(prefix="/v1/files", tags=["files"])
PURPOSES = ("batch", "batch_output")


def _chunks(upload: UploadFile) -> Iterator[bytes]:
    while chunk := upload.file.read(CHUNK):
        yield chunk


@router.post("", responses=ERRORS)
async def create_file(
    state: StateDep,
    tenant: TenantDep,
    file: Annotated[UploadFile, File()],
    purpose: Annotated[str, Form()],
) -> dict[str, Any]:
    if purpose != "batch":
        raise HTTPException(400, detail=f"purpose: only 'batch' is accepted, got {purpose!r}")
    s = state.settings
    chunks = limited(_chunks(file), s.file_max_bytes, s.file_max_lines)
    try:
        record = await asyncio.to_thread(
            state.files.create, tenant, file.filename or "upload.jsonl", purpose, chunks
        )
    except FileTooLarge as e:
        raise HTTPException(400, detail=str(e)) from None
    return public_file(record)


@router.get("", responses=ERRORS)
async def list_files(state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    records = await asyncio.to_thread(state.files.list, tenant)
    return {"object": "list", "data": [public_file(r) for r in records], "has_more": False}


def _owned(state: StateDep, tenant: str, file_id: str) -> dict[str, str]:
    record = state.files.get(file_id, tenant)
    if record is None:
        raise HTTPException(404, detail=f"file {file_id!r} not found")
    return record


@router.get("/{file_id}", responses=ERRORS)
async def get_file(file_id: str, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    return public_file(await asyncio.to_thread(_owned, state, tenant, file_id))


@router.get("/{file_id}/content", responses=ERRORS, response_class=StreamingResponse)
async def file_content(file_id: str, state: StateDep, tenant: TenantDep) -> StreamingResponse:
    record = await asyncio.to_thread(_owned, state, tenant, file_id)

    def stream() -> Iterator[bytes]:
        with state.files.storage.open(record["storage_key"]) as f:
            while chunk := f.read(CHUNK):
                yield chunk

    return StreamingResponse(stream(), media_type="application/jsonl")


@router.delete("/{file_id}", responses=ERRORS)
async def delete_file(file_id: str, state: StateDep, tenant: TenantDep) -> dict[str, Any]:
    record = await asyncio.to_thread(_owned, state, tenant, file_id)
    await asyncio.to_thread(state.files.delete, record)
    return {"id": file_id, "object": "file", "deleted": True}
