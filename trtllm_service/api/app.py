"""The service's HTTP side assembled from the endpoint packages (which never import each other) and
the server's plumbing (which knows no endpoint); service.py wires it to the BentoML service.

- ``v1``, mounted at ``/v1``: OpenAI's routes (``openai.routes``) and Anthropic's Messages API
  (``anthropic.routes``) side by side; ``root``: vLLM's ``/tokenize`` and ``/detokenize`` at the root.
  ``/generate`` is declared on the BentoML service itself (service.py), over ``generate.serving``.
  Unknown paths and methods under ``/v1`` are answered with OpenAI-shaped 404 / 405s (Anthropic's
  under ``/v1/messages``: ``DIALECTS``). The service binds its runtime once per worker (``bind``);
  every route answers from it.
- ``prepare``: what must hold before BentoML builds the service (BentoML's fixes, connection limits,
  the port's early answers); ``install``: the root app mounted and the middlewares, in their order.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from trtllm_service.api.anthropic import errors as anthropic_errors
from trtllm_service.api.anthropic import routes as anthropic_routes
from trtllm_service.api.generation.bodies import BodyRoutesApp, bind_serving
from trtllm_service.api.openai import routes as openai_routes
from trtllm_service.api.openai.serving import OpenAIServing
from trtllm_service.api.openapi import describe, openai_routes_of
from trtllm_service.api.server import early
from trtllm_service.api.server.auth import APIKeyMiddleware, APIKeys
from trtllm_service.api.server.bentoml_patches import (
    arrange_middlewares,
    bound_endpoint_labels,
    build_api_callers_once,
    cancel_request_timers,
    defer_access_lines,
    expose_server_send,
    generation_routes_first,
    own_prometheus_dir,
    read_span_once_in_log_lines,
)
from trtllm_service.api.server.deployment import OPENAI_ROUTE, ServiceAdmission, ServiceConcurrencyLimit
from trtllm_service.api.server.error_shape import ErrorShapeMiddleware, error_response
from trtllm_service.api.server.http_limits import ConnectionLimits
from trtllm_service.api.server.http_limits import install as install_connection_limits
from trtllm_service.api.server.limits import BodyLimitMiddleware, ConcurrencyLimitMiddleware
from trtllm_service.api.server.tracing import tune_request_tracing
from trtllm_service.errors import APIError
from trtllm_service.request_ids import RequestIdMiddleware
from trtllm_service.runtime import run_dir

if TYPE_CHECKING:
    from trtllm_service.api.server.shutdown import Drain
    from trtllm_service.runtime import Runtime
    from trtllm_service.settings import Settings

DIALECTS = (anthropic_errors.DIALECT,)
"""The APIs whose routes answer errors in a shape of their own (`server.error_shape.ErrorDialect`)."""

v1 = BodyRoutesApp(  # its generation routes' POSTs go straight to their endpoints
    title="OpenAI-compatible API",
    description="Chat and text completions in the OpenAI API's format, mounted at /v1.",
    version="1",
    docs_url=None,  # documented in the service's own /docs.json and Swagger UI
    redoc_url=None,
    openapi_url=None,
)
v1.include_router(openai_routes.router)
v1.include_router(anthropic_routes.router)  # Anthropic's Messages API, beside OpenAI's


def bind(runtime: Runtime) -> OpenAIServing:
    """Serves every route from `runtime` (called once per worker, when the runtime is loaded)."""
    serving = OpenAIServing(runtime)
    bind_serving(serving)
    return serving


_ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _not_routed(request: Request, status: int) -> Response:
    where = f"{request.method} {request.url.path}"
    if status == 405:
        return error_response(APIError(405, f"Method not allowed ({where})", code="method_not_allowed"))
    return error_response(APIError(404, f"Invalid URL ({where})", code="unknown_url"))


@v1.api_route("/{path:path}", methods=_ANY_METHOD, include_in_schema=False)
async def unknown_route(path: str, request: Request) -> Response:
    """Everything else under /v1: a 404 in OpenAI's shape, or a 405 for a known path.

    BentoML mounts this app only for paths that one of its routes matches, so without this catch-all
    unknown /v1 URLs would get BentoML's plain-text 404.
    """
    scope = request.scope
    known = any(
        route.matches(scope)[0] == Match.PARTIAL
        for route in v1.routes
        if getattr(route, "endpoint", None) is not unknown_route
    )
    return _not_routed(request, 405 if known else 404)


class V1NotFoundMiddleware:
    """A /v1 path with a newline in it (`/v1/models/a%0Ab`) gets the OpenAI-shaped 404 of any
    unknown URL: BentoML's mount of this app matches paths with `.*`, which stops at a newline,
    so such paths would otherwise get BentoML's plain-text 404."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if "\n" in path and path.startswith("/v1/"):
            where = f"{scope['method']} {path}"
            response = error_response(APIError(404, f"Invalid URL ({where})", code="unknown_url"))
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


@v1.exception_handler(StarletteHTTPException)
async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """Any other HTTP error raised by the framework, in OpenAI's error shape."""
    if exc.status_code in (404, 405):
        return _not_routed(request, exc.status_code)
    response = error_response(APIError(exc.status_code, str(exc.detail)))
    if exc.headers:
        response.headers.update(exc.headers)
    return response


root = FastAPI(
    title="Tokenizer",
    description="vLLM's /tokenize and /detokenize, at the root as vLLM serves them.",
    version="1",
    docs_url=None,  # documented in the service's own /docs.json and Swagger UI
    redoc_url=None,
    openapi_url=None,
)
"""The routes vLLM serves at the root, mounted at `/` after the service's own routes. BentoML mounts
it passively: any other path falls through to BentoML's own routes (the Swagger UI at `/`,
`/docs.json`) and 404. A FastAPI app (with no routes of its own) so that its routes reach the
service's OpenAPI document; they share the /v1 app's serving (`bind`)."""
root.include_router(openai_routes.tokenizer_router)
# a wrong method: 405 in the same shape
root.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]  # called with the class it handles


def description(model_name: str) -> str:
    """The service's description (the Swagger page's and the Bento's README), listing these routes."""
    return describe(model_name, openai_routes_of(v1, OPENAI_ROUTE) + openai_routes_of(root, ""))


def prepare(settings: Settings) -> None:
    """What must hold before BentoML builds the service's app (at service.py's import, in `bentoml
    serve`'s own process and in each worker)."""
    tune_request_tracing()  # no span per chunk, none built unread
    cancel_request_timers()  # BentoML's request timeout would hold every request's context for 600 s
    expose_server_send()  # streamed chunks skip the middlewares' send wrappers (server/streaming.py)
    bound_endpoint_labels()  # BentoML's request metrics by route: unknown paths cannot grow /metrics
    read_span_once_in_log_lines()  # BentoML's log filter: the same fields, a third of its cost
    build_api_callers_once()  # /generate's caller built once, not per request
    generation_routes_first(BodyRoutesApp)  # /generate and /v1's POSTs matched first, not after the probes
    defer_access_lines()  # BentoML's access line: written while the next request waits for the engine
    own_prometheus_dir()  # in `bentoml serve` itself: metrics of its own, whoever else shares BENTOML_HOME
    # Requests read within limits (header and body timeouts, header size): uvicorn has none of its own.
    install_connection_limits(
        ConnectionLimits(
            header_timeout_s=settings.header_timeout_s,
            body_timeout_s=settings.body_timeout_s,
            max_header_bytes=settings.max_header_bytes,
            max_headers=settings.max_headers,
        )
    )
    # `bentoml serve`'s process answers on the port from its bind until a worker serves (server/early.py).
    early.answer_from_bind(
        lambda: run_dir(settings, service_pid=os.getpid()) / early.STOP_FLAG, dialects=DIALECTS
    )


def install(
    service: Any, *, settings: Settings, model_name: str, drain: Drain, batch_known: bool = True
) -> None:
    """Mounts `root` on the BentoML `service` (after its own routes) and adds the middlewares.

    Outermost first (arrange_middlewares puts the request id before BentoML's own middlewares and
    BentoML's CORS right after it, so that every answer, refusals included, carries both).
    """
    # vLLM's /tokenize and /detokenize, at the root as vLLM serves them (after the service's own routes).
    service.mount_asgi_app(root, path="/")
    service.add_asgi_middleware(RequestIdMiddleware, anthropic_paths=anthropic_errors.is_anthropic)
    # BentoML's own errors in the service's one shape; Anthropic's on its routes
    service.add_asgi_middleware(ErrorShapeMiddleware, dialects=DIALECTS)
    service.add_asgi_middleware(
        ServiceConcurrencyLimit,  # traffic.max_concurrency, counted across the workers
        fallback=service.config["traffic"]["max_concurrency"],
        shared_dir=run_dir(settings),
        model_name=model_name,
        drain=drain,
    )
    service.add_asgi_middleware(
        ServiceAdmission,  # the waiting queue (TRTLLM_ENGINE_SLOTS), shared by the workers
        settings=settings,
        fallback=service.config["traffic"],
        shared_dir=run_dir(settings),
        model_name=model_name,
        batch_known=batch_known,  # `auto` queues only an engine whose batch size is known
    )
    service.add_asgi_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, model_name=model_name)
    service.add_asgi_middleware(V1NotFoundMiddleware)
    if settings.api_keys:  # covers /generate and /v1/*; probes, metrics and docs stay open
        service.add_asgi_middleware(
            APIKeyMiddleware, api_keys=APIKeys(settings.api_keys), model_name=model_name
        )
    arrange_middlewares(RequestIdMiddleware, ConcurrencyLimitMiddleware)
