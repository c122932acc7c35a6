"""The id of the HTTP request being served: the client's `X-Request-Id`, or one made for it.

`RequestIdMiddleware` sets it for the duration of each request (a context variable, so every task
and log line of the request sees it) and echoes it on every response: the outermost of the
service's middlewares, so refusals at the door (401, 413, 429) carry it too. The relay sends it to
Triton as the request's id (`engine_request_id`), and `RequestIdLogFilter` puts it at the start of
each log line written while the request is served. A client's id is used as it is when it is 1 to
128 characters of `A-Z a-z 0-9 . _ : / + = @ -` (a UUID, a ULID, base64, `req_abc`, ...); any other
value (empty, too long, spaces, quotes, control characters that could forge log lines) is replaced
by a fresh id, which the response then carries.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-request-id"
ANTHROPIC_HEADER = "request-id"
"""Where Anthropic's clients read the same id (the SDK's `_request_id`), on Anthropic's routes."""
MAX_LENGTH = 128
_VALID = re.compile(rf"[A-Za-z0-9._:/+=@-]{{1,{MAX_LENGTH}}}")

REQUEST_ID: ContextVar[str | None] = ContextVar("trtllm_request_id", default=None)
"""The id of the HTTP request this code runs for (None: outside a request)."""
MARK = "trtllm_request_id"
"""The attribute `RequestIdLogFilter` sets on the log records it marks."""


def new_request_id() -> str:
    """A fresh id: 32 hex digits (a UUID4)."""
    return uuid.uuid4().hex


def valid_request_id(value: str | bytes | None) -> str | None:
    """`value` as a request id when it is a usable one (see the module docstring), else None."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if value is None or not _VALID.fullmatch(value):
        return None
    return value


def engine_request_id(index: int = 0, count: int = 1) -> str | None:
    """Triton's id for engine request `index` of `count` that serve the current HTTP request: the
    request's id, or `<id>-<index>` when it needs several (n choices, several prompts); None outside
    a request (the relay then makes one)."""
    request_id = REQUEST_ID.get()
    if request_id is None or count == 1:
        return request_id
    return f"{request_id}-{index}"


class RequestIdLogFilter(logging.Filter):
    """Starts each log line written while a request is served with `[request_id=<id>]`.

    Attached to handlers, so it sees the lines of every logger that writes through them (a record
    passing two such handlers is marked once). Its mark is an attribute of its own: BentoML's log
    filter sets `record.request_id` to a tracing span's id.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = REQUEST_ID.get()
        if request_id is not None and getattr(record, MARK, None) is None:
            setattr(record, MARK, request_id)
            record.msg = f"[request_id={request_id}] {record.msg}"
        return True


_HEADER = HEADER.encode("ascii")
_ANTHROPIC_HEADER = ANTHROPIC_HEADER.encode("ascii")


def _none(path: str) -> bool:
    return False


class RequestIdMiddleware:
    """Sets the request's id for its duration and echoes it in the `X-Request-Id` response header,
    and also in `request-id` on the paths `anthropic_paths` picks (api.anthropic.errors.is_anthropic)."""

    def __init__(self, app: ASGIApp, anthropic_paths: Callable[[str], bool] = _none) -> None:
        self.app = app
        self.anthropic_paths = anthropic_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = None
        for name, value in scope["headers"]:  # ASGI's header names are lower case
            if name == _HEADER:
                given = value
                break
        request_id = (given is not None and valid_request_id(given)) or new_request_id()
        encoded = request_id.encode("ascii")
        # Anthropic's clients read the id from `request-id` (the SDK's `_request_id`)
        ids = (
            [(_HEADER, encoded), (_ANTHROPIC_HEADER, encoded)]
            if self.anthropic_paths(scope["path"])
            else [(_HEADER, encoded)]
        )
        names = {name for name, _ in ids}

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in names]
                message = {**message, "headers": [*headers, *ids]}
            await send(message)

        token = REQUEST_ID.set(request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)
