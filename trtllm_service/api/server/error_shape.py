"""Every error answer of the service in one shape: `{"error": {"message", "type", "param", "code"}}`.

The service's own routes and middlewares answer `APIError`s in that shape already. What BentoML and
Starlette answer themselves does not: `/generate`'s request validation (`{"error": "1 validation
error for Input", "detail": [...]}`), a path no route serves (plain-text `Not Found`), a wrong method,
the probes' 503s, an unexpected 500. `ErrorShapeMiddleware` rewrites those answers, and only those:
a response below 400 passes untouched (a stream's chunks are never looked at), and an error body
already in the shape is sent as it is.

Anthropic's Messages API (`/v1/messages...`) answers in Anthropic's shape instead (`api.anthropic.errors`:
`{"type": "error", "error": {"type", "message"}}`, a 503 as 529 overloaded_error): every error of
those paths, ours included (auth, limits, validation), is rewritten here, so that no layer needs to
know which API a request came through.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trtllm_service.api.anthropic import errors as anthropic_errors
from trtllm_service.api.anthropic.protocol import MESSAGES_ROUTE
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


def is_anthropic(path: str) -> bool:
    """Whether `path` is one of Anthropic's Messages API routes (answered in Anthropic's shape)."""
    return path == MESSAGES_ROUTE or path.startswith(MESSAGES_ROUTE + "/")


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


def _is_anthropic_shaped(body: bytes) -> bool:
    try:
        payload = json.loads(body) if body else None
    except ValueError:
        return False
    return (
        isinstance(payload, dict)
        and payload.get("type") == "error"
        and isinstance(payload.get("error"), dict)
    )


def _header(start: Message, name: bytes) -> str | None:
    for key, value in start.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class ErrorShapeMiddleware:
    """Answers every error response of the app it wraps in the service's one error shape
    (`reshape`); keeps the response's headers (Retry-After, CORS, the request id) but its body's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

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

    @staticmethod
    async def _send_error(start: Message, body: bytes, scope: Scope, send: Send) -> None:
        path = scope.get("path", "")
        error = reshape(start["status"], body, scope["method"], path)
        anthropic = is_anthropic(path) and not _is_anthropic_shaped(body)
        if anthropic:
            error = error or _shaped_error(start["status"], body)
            retry_after = _header(start, b"retry-after")
            if retry_after is not None and error.retry_after is None:
                error.retry_after = float(retry_after)
            start = {**start, "status": anthropic_errors.status_of(error)}
            body = json.dumps(anthropic_errors.error_body(error)).encode()
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
