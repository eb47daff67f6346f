"""The one error shape of the API, and the handlers that give every failure that shape.

`{"error": {"message", "type", "param", "code"}}` (OpenAI's error object). A refused request
names its field in `param` and in the message; an unexpected fault is a JSON 500 too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import redis
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tide_fleet.gateway.metrics import note_rejection

log = logging.getLogger(__name__)


class ApiError(HTTPException):
    """An HTTPException that also names the field (`param`) and a short `code`.

    It subclasses FastAPI's HTTPException so that one raised while the body is read (the
    body-size limit) reaches the handler as itself, not as "error parsing the body"."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status, detail=message, headers=headers)
        self.param, self.code = param, code


def error_kind(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    if status == 503:
        return "service_unavailable"
    return "server_error" if status >= 500 else "invalid_request_error"


SHOWN_ID_CHARS = 80


def shown(value: str) -> str:
    """An id quoted back in a message, cut to SHOWN_ID_CHARS (a 404 need not echo megabytes)."""
    if len(value) <= SHOWN_ID_CHARS:
        return repr(value)
    return repr(value[:SHOWN_ID_CHARS]) + f" (cut from {len(value)} characters)"


def printable(text: str) -> str:
    """Text that can be written as UTF-8: a lone surrogate becomes its \\udfff escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    error: dict[str, Any] = {
        "message": printable(message),
        "type": error_kind(status),
        "param": printable(param) if param is not None else None,
        "code": code,
    }
    return JSONResponse({"error": error}, status, headers=headers)


def _location(loc: tuple[Any, ...]) -> str:
    """The field's name as the client wrote it: no "body." or "query." in front."""
    if loc and loc[0] in ("body", "query"):
        loc = loc[1:]
    return ".".join(str(p) for p in loc) or "body"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        note_rejection(request.scope, exc)
        return error_response(
            exc.status_code, str(exc.detail), param=getattr(exc, "param", None),
            code=getattr(exc, "code", None), headers=exc.headers,
        )  # fmt: skip

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        parts = [f"{_location(err.get('loc', ()))}: {err.get('msg')}" for err in errors]
        first = errors[0] if errors else {}
        return error_response(
            400, "; ".join(parts), param=_location(first.get("loc", ())), code=first.get("type")
        )

    @app.exception_handler(redis.RedisError)
    async def redis_error(request: Request, exc: redis.RedisError) -> JSONResponse:
        # Redis down, or every connection busy past gateway_redis_wait_seconds. A job is
        # created in one Lua call or not at all, but if the connection broke after the call
        # was sent it may exist: retry with the same Idempotency-Key to be sure of one job.
        log.warning("Redis unavailable: %s", exc)
        return error_response(
            503, f"job store unavailable ({exc}); retry (with an Idempotency-Key to avoid a "
            "duplicate if this request reached the store)", headers={"Retry-After": "1"},
        )  # fmt: skip

    @app.exception_handler(Exception)
    async def unexpected_error(request: Request, exc: Exception) -> JSONResponse:
        # Starlette still re-raises it after this answer, so the server logs the traceback.
        return error_response(
            500, f"internal error ({type(exc).__name__}) on {request.method} "
            f"{request.url.path}; it is logged on the gateway", code="internal_error",
        )  # fmt: skip
