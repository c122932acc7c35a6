"""Anthropic's ``/v1/messages`` and ``/v1/messages/count_tokens``: a router that the ``/v1`` app
(`api.app`) includes beside OpenAI's routes, served by the same bound serving object.

Bodies are read raw and validated by the protocol's models, as OpenAI's are; every error on these
paths reaches the client in Anthropic's shape (`server.error_shape`). ``anthropic-version`` and
``anthropic-beta`` headers are accepted and not required: one version of the API is served.
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import JSONResponse, Response

from trtllm_service.api.anthropic.protocol import MESSAGES_ROUTE, CountTokensRequest, MessagesRequest
from trtllm_service.api.anthropic.serving import count_message_tokens, serve_messages
from trtllm_service.api.generation.bodies import add_body_route, body_doc, bound_serving, event_stream_ok
from trtllm_service.api.generation.protocol import parse_request
from trtllm_service.api.generation.serving import error_docs
from trtllm_service.api.server.error_shape import error_response
from trtllm_service.errors import APIError

MESSAGES_EXAMPLE = {
    "max_tokens": 128,
    "system": "You are a helpful assistant.",
    "messages": [{"role": "user", "content": "Explain superconductors in plain English."}],
    "stream": False,
}
"""The Swagger page's example (`model` left out there: the served model is filled in by the page)."""


class _ErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicError(BaseModel):
    """Anthropic's error body (for the documentation)."""

    type: Literal["error"] = "error"
    error: _ErrorDetail
    request_id: str | None = None


_ERRORS = error_docs(
    AnthropicError,
    {
        400: "invalid_request_error: invalid request, unsupported block or parameter, prompt too long",
        401: "authentication_error: missing or wrong API key (x-api-key or Authorization: Bearer)",
        404: "not_found_error: unknown model",
        429: "rate_limit_error: too many concurrent requests",
        529: "overloaded_error: the inference server is not ready, or the waiting queue is full or was "
        "waited in too long (retry after Retry-After)",
    },
)


router = APIRouter()


add_body_route(
    router,
    "/messages",
    MessagesRequest,
    MESSAGES_ROUTE,
    serve_messages,
    name="create_message",
    summary="Create a message (Anthropic's Messages API)",
    description="`system` and `messages` through the model's chat template; the answer as content blocks "
    "(a reasoning model's thinking, text, tool_use). `tools` and `tool_choice` as Anthropic's.",
    example=MESSAGES_EXAMPLE,
    responses={
        200: event_stream_ok(
            "The message; with `stream: true` Anthropic's event stream, from `message_start` to `message_stop`"
        ),
        **_ERRORS,
    },
)


@router.post(
    "/messages/count_tokens",
    summary="Count a message's input tokens (Anthropic's Messages API)",
    openapi_extra=body_doc(CountTokensRequest, {k: MESSAGES_EXAMPLE[k] for k in ("system", "messages")}),
    responses={200: {"description": '`{"input_tokens": N}`'}, **_ERRORS},
)
async def count_tokens(request: Request) -> Response:
    """The input tokens a create call with the same system, messages and tools reports."""
    try:
        serving = bound_serving(request)
        body = parse_request(CountTokensRequest, await request.body())
        return JSONResponse(await count_message_tokens(serving, body))
    except APIError as exc:
        return error_response(exc)
