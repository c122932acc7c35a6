"""Request bodies as every API route takes them: read raw and validated by the protocol's models
(not by FastAPI), so that every error has the service's shape and names its field; their JSON
schemas still reach the OpenAPI document through ``openapi_extra`` (`body_doc`, in OpenAPI 3.0's
words: `server.openapi30`). And the serving object the service binds once per worker
(`bind_serving`), which every route answers from.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from trtllm_service.api.generation.protocol import parse_request
from trtllm_service.api.generation.serving import GenerationServing
from trtllm_service.api.server.early import STARTING_RETRY_S
from trtllm_service.api.server.error_shape import error_response
from trtllm_service.api.server.metrics import count_rejected
from trtllm_service.api.server.openapi30 import inline_schema
from trtllm_service.errors import STARTING, APIError

_Body = TypeVar("_Body", bound=BaseModel)
_S = TypeVar("_S", bound=GenerationServing)

_bound: list[GenerationServing] = []  # the worker's serving object, once bound


def bind_serving(serving: GenerationServing) -> None:
    """Serves every route from `serving` (once per worker, when the runtime is loaded)."""
    _bound[:] = [serving]


def bound_serving(request: Request | None = None) -> Any:
    """The bound serving object; a 503 while the service starts."""
    if not _bound:
        raise APIError.unavailable(STARTING, retry_after=STARTING_RETRY_S)
    return _bound[0]


def body_doc(model: type[BaseModel], example: dict[str, Any]) -> dict[str, Any]:
    media = {"schema": inline_schema(model), "example": example}
    return {"requestBody": {"required": True, "content": {"application/json": media}}}


async def serve_body(
    request: Request,
    model: type[_Body],
    route: str,
    serve: Callable[[_S, _Body, Request], Awaitable[Response]],
) -> Response:
    """Parses the body as `model` and serves it; a body refused before that is answered and counted."""
    try:
        serving = bound_serving(request)
        body = parse_request(model, await request.body())
    except APIError as exc:
        return _refused(request, exc, route)
    return await serve(serving, body, request)


def _refused(request: Request, error: APIError, route: str) -> Response:
    """A body refused before it reached the serving logic: answered, and counted."""
    serving = _bound[0] if _bound else None
    count_rejected(serving.model_name if serving is not None else "", route, error.status)
    return error_response(error)


def event_stream_ok(description: str, model: type[BaseModel] | None = None) -> dict[str, Any]:
    """The documented 200 of a route that answers JSON, or an event stream with `stream: true`."""
    ok: dict[str, Any] = {
        "description": description,
        "content": {"application/json": {}, "text/event-stream": {"schema": {"type": "string"}}},
    }
    if model is not None:
        ok["model"] = model
    return ok


def add_body_route(
    router: Any,
    path: str,
    model: type[_Body],
    route: str,
    serve: Callable[[Any, _Body, Request], Awaitable[Response]],
    *,
    name: str,
    summary: str,
    description: str,
    example: dict[str, Any],
    responses: dict[int | str, dict[str, Any]],
) -> None:
    """A POST route whose body is `model`, served by `serve` (`serve_body`), documented with the
    model's schema and `example`: each generation route of every API is one call of this."""

    async def endpoint(request: Request) -> Response:
        return await serve_body(request, model, route, serve)

    router.add_api_route(
        path,
        endpoint,
        name=name,
        methods=["POST"],
        summary=summary,
        description=description,
        openapi_extra=body_doc(model, example),
        responses=responses,
    )
