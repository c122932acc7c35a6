"""Request bodies as every API route takes them: read raw and validated by the protocol's models
(not by FastAPI), so that every error has the service's shape and names its field; their JSON
schemas still reach the OpenAPI document through ``openapi_extra`` (`body_doc`, in OpenAPI 3.0's
words: `server.openapi30`). And the serving object the service binds once per worker
(`bind_serving`), which every route answers from.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI
from pydantic import BaseModel
from starlette._utils import get_route_path
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

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

    endpoint.body_route = True  # type: ignore[attr-defined]  # BodyRoutesApp serves it directly
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


Endpoint = Callable[[Request], Awaitable[Response]]


class BodyRoutesApp(FastAPI):
    """A FastAPI app whose body routes (`add_body_route`) are served straight from its `__call__`:
    a POST to one of their paths goes to its endpoint without FastAPI's per-request layers (its
    error middlewares, the router's match over every route, the dependency solving of an endpoint
    that takes only the request), which cost 0.05-0.08 ms on the 16-core box and 0.14 ms on 2 cores
    before a chat request's engine request is sent (bench/ttft_breakdown.py). Everything else, and
    the OpenAPI document, is FastAPI's.

    What those layers would do is kept: the app in the scope, the app's exception handlers for an
    exception the endpoint raises, and a plain 500 (reshaped outside, `server.error_shape`) for one
    no handler takes, raised on as FastAPI's `ServerErrorMiddleware` raises it.
    """

    _body_endpoints: dict[str, Endpoint] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.body_endpoint(get_route_path(scope))
            if endpoint is not None:
                await self._serve(endpoint, scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def body_endpoint(self, path: str) -> Endpoint | None:
        """The endpoint a POST to `path` (a path of this app's own) goes to directly, if any."""
        endpoints = self._body_endpoints
        if endpoints is None:
            endpoints = self._body_endpoints = self._find_body_endpoints()
        return endpoints.get(path)

    def _find_body_endpoints(self) -> dict[str, Endpoint]:
        """Each body route's path -> its endpoint, read once, on the first POST (every route is
        added by then). Only routes that FastAPI's router would reach first for that path: the scan
        stops at the first route that may take a POST to other paths (a path parameter, a mount)."""
        found: dict[str, Endpoint] = {}
        seen: set[str] = set()
        for route in self.router.routes:
            path, methods = getattr(route, "path", "{"), getattr(route, "methods", None)
            if methods is None or ("{" in path and "POST" in methods):
                break
            if "{" in path or path in seen or "POST" not in methods:
                continue
            seen.add(path)
            endpoint = getattr(route, "endpoint", None)
            if getattr(endpoint, "body_route", False):
                found[path] = endpoint  # type: ignore[assignment]  # a body route's: takes the request
        return found

    async def _serve(self, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = self
        request = Request(scope, receive, send)
        started = False

        async def sending(message: Any) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            response = await endpoint(request)
            await response(scope, receive, sending)
        except Exception as exc:
            if started:
                raise
            handler = self._handler_of(exc)
            if handler is None:
                await PlainTextResponse("Internal Server Error", status_code=500)(scope, receive, send)
                raise
            await (await handler(request, exc))(scope, receive, send)

    def _handler_of(self, exc: Exception) -> Any:
        """The app's handler of `exc`, looked up as Starlette's exception middleware looks it up (an
        HTTP error's status first, then the exception's classes)."""
        handlers = self.exception_handlers
        if isinstance(exc, StarletteHTTPException) and exc.status_code in handlers:
            return handlers[exc.status_code]
        return next((handlers[cls] for cls in type(exc).__mro__ if cls in handlers), None)
