"""Every error answer of the service in one shape: `{"error": {"message", "type", "param", "code"}}`
(`ErrorBody`, as the OpenAPI document shows it).

The service's own routes and middlewares answer `APIError`s in that shape already. What BentoML and
Starlette answer themselves does not: `/generate`'s request validation (`{"error": "1 validation
error for Input", "detail": [...]}`), a path no route serves (plain-text `Not Found`), a wrong method,
the probes' 503s, an unexpected 500. `ErrorShapeMiddleware` rewrites those answers, and only those:
a response below 400 passes untouched (a stream's chunks are never looked at), and an error body
already in the shape is sent as it is.

An API whose routes answer errors in a shape of their own (an `ErrorDialect`: Anthropic's Messages
API, `api.anthropic.errors.DIALECT`: `{"type": "error", "error": {"type", "message"}}`, a 503 as 529
overloaded_error) is given to the middleware: every error of its paths, ours included (auth, limits,
validation), is rewritten here in its shape, so that no layer needs to know which API a request came
through. This module knows no endpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trtllm_service.api.server.request_errors import from_validation_error
from trtllm_service.errors import APIError

MAX_ERROR_BODY = 64 * 1024
"""An error body larger than this passes as it is (none of BentoML's or Starlette's comes close)."""

_CODES = {
    404: "unknown_url",
    405: "method_not_allowed",
    413: "request_too_large",
    415: "unsupported_media_type",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
    504: "timeout",
}


def error_response(error: APIError) -> JSONResponse:
    """The JSON answer of an error, with its status and headers (an API's dialect, if it has one,
    is applied by `ErrorShapeMiddleware` on its way out)."""
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


class ErrorDetail(BaseModel):
    """The inside of an error body."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """``{"error": {...}}``: the body of every non-2xx answer (and of an in-stream error event)."""

    error: ErrorDetail

    @classmethod
    def of(cls, err: APIError) -> ErrorBody:
        """The body of an ``APIError``."""
        return cls.model_validate(err.body())


@dataclass(frozen=True, slots=True)
class ErrorDialect:
    """The routes of an API that answers errors in a shape of its own, and how it says an
    `APIError` (the service's early answers and `ErrorShapeMiddleware` speak it on those paths)."""

    paths: Callable[[str], bool]
    """Whether a request path is one of its routes."""
    status_of: Callable[[APIError], int]
    """The HTTP status it answers an error with."""
    error_body: Callable[[APIError, str | None], dict[str, Any]]
    """The JSON body of an error (the request id: the current request's when None)."""
    request_id_headers: Callable[[str | None], dict[str, str]]
    """The headers that carry the request id on every answer (the current request's when None)."""
    is_shaped: Callable[[Any], bool]
    """Whether a decoded body is in its shape already."""


def is_shaped(payload: Any) -> bool:
    """Whether a decoded body is in the service's error shape."""
    error = payload.get("error") if isinstance(payload, dict) else None
    return isinstance(error, dict) and isinstance(error.get("message"), str)


def reshape(status: int, body: bytes, method: str, path: str) -> APIError | None:
    """The `APIError` an error answer of `status` with `body` says, or None when the body is in
    the shape already.

    BentoML's request validation (400 with pydantic's `detail`) becomes the 400 `/v1` gives for
    the same fault, naming the field; any other body gives its message (a JSON `error` or `detail`
    string, or the text), and a 404 or 405 says which URL, as under `/v1`.
    """
    try:
        payload: Any = json.loads(body) if body else None
    except ValueError:
        payload = None
    if is_shaped(payload):
        return None
    if status == 400 and isinstance(payload, dict) and isinstance(payload.get("detail"), list):
        return from_validation_error(payload["detail"])
    if status == 404:
        return APIError(404, f"Invalid URL ({method} {path})", code=_CODES[404])
    if status == 405:
        return APIError(405, f"Method not allowed ({method} {path})", code=_CODES[405])
    message = _message(payload, body) or _reason(status)
    if status == 429:
        return APIError.rate_limited(message)
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return APIError(status, message, type=kind, code=_CODES.get(status))


def _shaped_error(status: int, body: bytes) -> APIError:
    """The `APIError` of a body in the service's shape."""
    error = json.loads(body)["error"]
    return APIError(
        status,
        error["message"],
        type=error.get("type") or "",
        param=error.get("param"),
        code=error.get("code"),
    )


def _message(payload: Any, body: bytes) -> str:
    if isinstance(payload, list) and payload:  # BentoML answers some of its errors as `[{"error": ...}]`
        payload = payload[0]
    if isinstance(payload, dict):
        for key in ("error", "detail", "message"):
            if isinstance(payload.get(key), str):
                return str(payload[key])
        return ""
    if payload is not None:
        return ""
    return body.decode("utf-8", "replace").strip()


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"HTTP {status}"


def _decoded(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


def _header(start: Message, name: bytes) -> str | None:
    for key, value in start.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class ErrorShapeMiddleware:
    """Answers every error response of the app it wraps in the service's one error shape
    (`reshape`), or on the paths of one of `dialects` in its shape; keeps the response's headers
    (Retry-After, CORS, the request id) but its body's."""

    def __init__(self, app: ASGIApp, dialects: Sequence[ErrorDialect] = ()) -> None:
        self.app = app
        self.dialects = tuple(dialects)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "HEAD":
            await self.app(scope, receive, send)
            return
        held: Message | None = None  # the start of an error response, until its body is complete
        passing = False
        body = bytearray()

        async def shaped_send(message: Message) -> None:
            nonlocal held, passing
            if passing:
                await send(message)
                return
            if message["type"] == "http.response.start":
                if message["status"] < 400:
                    passing = True
                    await send(message)
                else:
                    held = message
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            body.extend(message.get("body", b""))
            if message.get("more_body", False):
                if len(body) > MAX_ERROR_BODY:  # not one of the small error bodies: as it is
                    passing = True
                    await send(held)
                    await send({"type": "http.response.body", "body": bytes(body), "more_body": True})
                return
            await self._send_error(held, bytes(body), scope, send)

        await self.app(scope, receive, shaped_send)

    async def _send_error(self, start: Message, body: bytes, scope: Scope, send: Send) -> None:
        path = scope.get("path", "")
        error = reshape(start["status"], body, scope["method"], path)
        dialect = next((d for d in self.dialects if d.paths(path)), None)
        if dialect is not None and not dialect.is_shaped(_decoded(body)):
            error = error or _shaped_error(start["status"], body)
            retry_after = _header(start, b"retry-after")
            if retry_after is not None and error.retry_after is None:
                error.retry_after = float(retry_after)
            start = {**start, "status": dialect.status_of(error)}
            body = json.dumps(dialect.error_body(error, None)).encode()
        elif error is not None:
            body = json.dumps(error.body()).encode()
        if error is not None:
            kept = [
                (name, value)
                for name, value in start.get("headers", [])
                if name.lower() not in (b"content-type", b"content-length")
            ]
            extra = [(name.lower().encode(), value.encode()) for name, value in error.headers().items()]
            start = {
                **start,
                "headers": [
                    *kept,
                    *(h for h in extra if h[0] not in {name.lower() for name, _ in kept}),
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        await send(start)
        await send({"type": "http.response.body", "body": body, "more_body": False})
