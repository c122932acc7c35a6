"""Errors in Anthropic's shape: ``{"type": "error", "error": {"type", "message"}, "request_id"}``.

Every layer raises `APIError` (our one error type); the Messages API answers it in Anthropic's shape
with the type Anthropic gives its status: 400 ``invalid_request_error`` (and any other 4xx Anthropic
lists none for), 401 ``authentication_error``, 402 ``billing_error``, 403 ``permission_error``, 404
``not_found_error``, 413 ``request_too_large``, 429 ``rate_limit_error``, 500 ``api_error`` (and any
other 5xx), 504 ``timeout_error``, 529 ``overloaded_error``.

Anthropic documents no 503: its "the API is overloaded, retry" is 529 ``overloaded_error``, which
Anthropic clients know. So our 503 (Triton starting, restarting or stalled) is answered as 529
``overloaded_error``, with its ``Retry-After``, and so are the waiting queue's refusals (full, or
waited too long: the service is overloaded); our 429 of the concurrency limit stays 429
``rate_limit_error``. The anthropic SDK retries both (429 and every status >= 500), honouring
``retry-after``.

Anthropic's errors carry no ``param``: where an error names one that its message does not mention,
the message starts with it (``messages[0].content[1].type: ...``), as Anthropic's own messages do.
Every answer carries our request id as Anthropic's ``request-id`` header (the SDK's
``_request_id``), and an error body also as its ``request_id``.

`DIALECT` says all this to the server's plumbing (its error-shape middleware, its early answers),
which knows no endpoint.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from trtllm_service.api.anthropic.protocol import MESSAGES_ROUTE
from trtllm_service.api.server.admission import QUEUE_CODES
from trtllm_service.api.server.error_shape import ErrorDialect
from trtllm_service.errors import APIError
from trtllm_service.request_ids import ANTHROPIC_HEADER, REQUEST_ID

OVERLOADED = 529
"""Anthropic's status for "overloaded, retry": what our 503 becomes."""

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
"""Anthropic's error type of each status it documents."""

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def status_of(error: APIError) -> int:
    """The HTTP status of `error` on the Messages API (503 and the waiting queue's refusals are
    529, see the module docstring)."""
    return OVERLOADED if error.status == 503 or error.code in QUEUE_CODES else error.status


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    known = ERROR_TYPES.get(status)
    if known is not None:
        return known
    return "api_error" if status >= 500 else "invalid_request_error"


def error_message(error: APIError) -> str:
    """The message, led by the param it names when it does not say it already."""
    param = error.param
    if param and param not in error.message:
        return f"{param}: {error.message}"
    return error.message


def error_body(error: APIError, request_id: str | None = None) -> dict[str, Any]:
    """The JSON body of `error` (`request_id`: the current request's when not given)."""
    return {
        "type": "error",
        "error": {"type": error_type(status_of(error)), "message": error_message(error)},
        "request_id": request_id if request_id is not None else REQUEST_ID.get(),
    }


def request_id_headers(request_id: str | None = None) -> dict[str, str]:
    """``request-id``: our id of the request (the current one when not given), as Anthropic sends
    it on every answer; empty outside a request."""
    request_id = request_id if request_id is not None else REQUEST_ID.get()
    return {ANTHROPIC_HEADER: request_id} if request_id else {}


def error_headers(error: APIError, request_id: str | None = None) -> dict[str, str]:
    """The headers of an error answer: ``Retry-After`` when known, and ``request-id``."""
    return {**error.headers(), **request_id_headers(request_id)}


def error_response(error: APIError) -> JSONResponse:
    """The JSON answer of an error on the Messages API, with its status and headers."""
    return JSONResponse(error_body(error), status_code=status_of(error), headers=error_headers(error))


def error_event(error: APIError) -> str:
    """An SSE ``error`` event, for a failure after a stream has started (its 200 is sent)."""
    return f"event: error\ndata: {_encode(error_body(error))}\n\n"


def is_anthropic(path: str) -> bool:
    """Whether `path` is one of the Messages API's routes (answered in Anthropic's shape)."""
    return path == MESSAGES_ROUTE or path.startswith(MESSAGES_ROUTE + "/")


def is_error_body(payload: Any) -> bool:
    """Whether a decoded body is an error in Anthropic's shape already."""
    return (
        isinstance(payload, dict)
        and payload.get("type") == "error"
        and isinstance(payload.get("error"), dict)
    )


DIALECT = ErrorDialect(
    paths=is_anthropic,
    status_of=status_of,
    error_body=error_body,
    request_id_headers=request_id_headers,
    is_shaped=is_error_body,
)
"""The Messages API's errors, for the server's plumbing (`server.error_shape.ErrorDialect`)."""
