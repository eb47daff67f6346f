"""The request body-size limit: 413 before a large body is read into memory.

A pure ASGI middleware. A declared Content-Length over the limit is refused at once; a body
without one (chunked) is counted as it arrives and refused when it passes the limit. File
uploads (POST /v1/files) have their own limit, enforced while the upload streams.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tide_fleet.gateway.errors import ApiError, error_response

UPLOAD_ROUTES = {("POST", "/v1/files")}  # limited by file_max_bytes instead


def too_large(limit: int) -> ApiError:
    return ApiError(
        413, f"request body: larger than the limit of {limit} bytes (TIDE_MAX_BODY_BYTES)",
        param="body", code="request_too_large",
    )  # fmt: skip


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"]) in UPLOAD_ROUTES:
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            error = too_large(self.max_bytes)
            response = error_response(
                413, str(error.detail), param=error.param, code=error.code,
                headers={"Connection": "close"},  # the unread body is not drained
            )  # fmt: skip
            await response(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise too_large(self.max_bytes)  # answered by the HTTP error handler
            return message

        await self.app(scope, counting_receive, send)
