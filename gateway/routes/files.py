"""OpenAI-compatible Files API (purpose "batch"), streamed to local or S3 storage."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, HTTPException, Query, UploadFile
from fastapi.responses import StreamingResponse

from tide_fleet.gateway.deps import StateDep, TenantDep
from tide_fleet.gateway.errors import ApiError, shown
from tide_fleet.gateway.routes.jobs import ERRORS
from tide_fleet.infra.jobs.files import FileTooLarge, limited, public_file
from tide_fleet.infra.jobs.public import list_page
from tide_fleet.infra.jobs.storage import CHUNK

router = APIRouter(prefix="/v1/files", tags=["files"])
PURPOSES = ("batch", "batch_output")
MAX_LIST = 10_000  # OpenAI's largest page of files


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
        raise ApiError(400, f"purpose: only 'batch' is accepted, got {shown(purpose)}",
                       param="purpose", code="invalid_value")  # fmt: skip
    s = state.settings
    chunks = limited(_chunks(file), s.file_max_bytes, s.file_max_lines)
    try:
        record = await asyncio.to_thread(
            state.files.create, tenant, file.filename or "upload.jsonl", purpose, chunks
        )
    except FileTooLarge as e:
        raise ApiError(400, str(e), param="file", code="file_too_large") from None
    return public_file(record)


@router.get("", responses=ERRORS)
async def list_files(
    state: StateDep,
    tenant: TenantDep,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = MAX_LIST,
    order: Literal["asc", "desc"] = "desc",
    purpose: str | None = None,
) -> dict[str, Any]:
    """OpenAI's list: newest first (``order=asc``: oldest first), ``after`` the last id of
    the previous page, only files of ``purpose`` when it is given."""
    records, has_more = await asyncio.to_thread(
        state.files.list, tenant, after=after, limit=limit, order=order, purpose=purpose
    )
    return list_page([public_file(r) for r in records], has_more)


def _owned(state: StateDep, tenant: str, file_id: str) -> dict[str, str]:
    record = state.files.get(file_id, tenant)
    if record is None:
        raise HTTPException(404, detail=f"file {shown(file_id)} not found")
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
