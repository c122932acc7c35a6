"""The service's HTTP apps, assembled from the endpoint packages (which never import each other):
``v1``, mounted at ``/v1``, with OpenAI's routes (``openai.routes``) and Anthropic's Messages API
(``anthropic.routes``) side by side; and ``root``, vLLM's ``/tokenize`` and ``/detokenize`` at the root.
``/generate`` is declared on the BentoML service itself (service.py), over ``generate.serving``.

Unknown paths and methods under ``/v1`` are answered with OpenAI-shaped 404 / 405s (Anthropic's under
``/v1/messages``: ``server.error_shape``). The service binds its runtime once per worker (``bind``);
every route answers from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from trtllm_service.api.anthropic import routes as anthropic_routes
from trtllm_service.api.generation.bodies import bind_serving
from trtllm_service.api.generation.serving import error_response
from trtllm_service.api.openai import routes as openai_routes
from trtllm_service.api.openai.serving import OpenAIServing
from trtllm_service.errors import APIError

if TYPE_CHECKING:
    from trtllm_service.runtime import Runtime

v1 = FastAPI(
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
root.add_exception_handler(StarletteHTTPException, http_error)  # a wrong method: 405 in the same shape
