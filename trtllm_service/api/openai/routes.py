"""The ``/v1`` FastAPI app: thin routes over ``OpenAIServing``, Anthropic's Messages API
(``anthropic.routes``) beside them; and ``root_app``, vLLM's ``/tokenize`` and ``/detokenize`` at the root.

Request bodies are read raw and validated by the protocol's models (``api.bodies``), not by FastAPI, so
that every error (malformed JSON, a wrong type, an unsupported parameter) names its ``param``.
Unknown paths and methods under ``/v1`` are answered with OpenAI-shaped 404 / 405s.

The service binds its runtime once per worker (``bind``); every route answers from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from trtllm_service import jsontext
from trtllm_service.api.anthropic import routes as anthropic_routes
from trtllm_service.api.generation.bodies import (
    add_body_route,
    bind_serving,
    body_doc,
    bound_serving,
    event_stream_ok,
)
from trtllm_service.api.generation.protocol import parse_request
from trtllm_service.api.generation.serving import error_docs, error_response
from trtllm_service.api.openai.chat.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from trtllm_service.api.openai.chat.serving import CHAT_ROUTE
from trtllm_service.api.openai.completions.protocol import (
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
)
from trtllm_service.api.openai.completions.serving import COMPLETIONS_ROUTE
from trtllm_service.api.openai.protocol import (
    DetokenizeRequest,
    ModelCard,
    ModelList,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)
from trtllm_service.api.openai.responses.protocol import RESPONSES_ROUTE, ResponsesRequest
from trtllm_service.api.openai.serving import OpenAIServing
from trtllm_service.api.server.error_shape import ErrorBody
from trtllm_service.api.server.openapi30 import inline_schema
from trtllm_service.errors import APIError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from trtllm_service.runtime import Runtime

_Body = TypeVar("_Body", bound="BaseModel")

app = FastAPI(
    title="OpenAI-compatible API",
    description="Chat and text completions in the OpenAI API's format, mounted at /v1.",
    version="1",
    docs_url=None,  # documented in the service's own /docs.json and Swagger UI
    redoc_url=None,
    openapi_url=None,
)


def bind(runtime: Runtime) -> OpenAIServing:
    """Serves this app from `runtime` (called once per worker, when the service is created)."""
    serving = OpenAIServing(runtime)
    bind_serving(serving)
    return serving


_CHAT_EXAMPLE = {
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Explain superconductors in plain English."},
    ],
    "max_tokens": 128,
    "temperature": 0.7,
    "stream": False,
}
_COMPLETION_EXAMPLE = {"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0.7, "stream": False}
_RESPONSES_EXAMPLE = {
    "instructions": "You are a helpful assistant.",
    "input": "Explain superconductors in plain English.",
    "max_output_tokens": 128,
    "stream": False,
}


def _responses(ok: type[BaseModel], chunk: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    streamed = f"an event stream of `data: <{chunk.__name__}>` events ending in `data: [DONE]`"
    return {200: event_stream_ok(f"The completion; with `stream: true` {streamed}", ok), **ERROR_RESPONSES}


ERROR_RESPONSES = error_docs(
    ErrorBody,
    {
        400: "Invalid request, unsupported parameter, or prompt too long for the context",
        401: "Missing or wrong API key",
        404: "Unknown model",
        429: "Too many concurrent requests",
        503: "The inference server is not ready",
    },
)


# ---- routes --------------------------------------------------------------------------------------------


@app.get("/models", response_model=ModelList, summary="List models")
async def list_models(request: Request) -> Response:
    """The served model, with its context length (`max_model_len`)."""
    try:
        return JSONResponse(bound_serving(request).list_models().model_dump(mode="json"))
    except APIError as exc:
        return error_response(exc)


@app.get(
    "/models/{model}",
    response_model=ModelCard,
    summary="Retrieve a model",
    responses={404: {"model": ErrorBody, "description": "Unknown model"}},
)
async def retrieve_model(model: str, request: Request) -> Response:
    """The card of the served model or one of its LoRA adapters, or a 404 for any other name."""
    try:
        serving = bound_serving(request)
        serving.runtime.adapter(model)
        card = next(card for card in serving.list_models().data if card.id == model)
        return JSONResponse(card.model_dump(mode="json"))
    except APIError as exc:
        return error_response(exc)


add_body_route(
    app,
    "/chat/completions",
    ChatCompletionRequest,
    CHAT_ROUTE,
    OpenAIServing.chat,
    name="chat_completions",
    summary="Create a chat completion",
    description="Formats the messages with the model's chat template and generates the assistant's reply.",
    example=_CHAT_EXAMPLE,
    responses=_responses(ChatCompletionResponse, ChatCompletionChunk),
)
add_body_route(
    app,
    "/completions",
    CompletionRequest,
    COMPLETIONS_ROUTE,
    OpenAIServing.completions,
    name="completions",
    summary="Create a text completion",
    description="Continues the prompt(s) as plain text (no chat template).",
    example=_COMPLETION_EXAMPLE,
    responses=_responses(CompletionResponse, CompletionChunk),
)
add_body_route(
    app,
    "/responses",
    ResponsesRequest,
    RESPONSES_ROUTE,
    OpenAIServing.responses,
    name="responses",
    summary="Create a response",
    description="OpenAI's Responses API: `instructions` and `input` through the chat template, the answer "
    "as output items (a message, function calls, a reasoning model's reasoning). Nothing is stored.",
    example=_RESPONSES_EXAMPLE,
    responses={
        200: event_stream_ok(
            "The response object; with `stream: true` an event stream of `event: <type>` / "
            "`data: <event>` pairs from `response.created` to `response.completed`"
        ),
        **ERROR_RESPONSES,
    },
)


app.include_router(anthropic_routes.router)  # Anthropic's Messages API, beside OpenAI's


# ---- /tokenize and /detokenize: vLLM serves them at the root, not under /v1 ------------------------------


root_app = FastAPI(
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
service's OpenAPI document; they share the /v1 app's serving (`app.state`)."""

_TOKENIZE_EXAMPLE = {"prompt": "Explain superconductors in plain English."}
_DETOKENIZE_EXAMPLE = {"tokens": [1, 2, 3]}
_TOKENIZE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "oneOf": [inline_schema(TokenizeCompletionRequest), inline_schema(TokenizeChatRequest)]
                },
                "example": _TOKENIZE_EXAMPLE,
            }
        },
    }
}
_TOKEN_ERRORS = {code: ERROR_RESPONSES[code] for code in (400, 401, 404, 503)}


@root_app.post(
    "/tokenize",
    summary="Tokenize a prompt or chat messages",
    openapi_extra=_TOKENIZE_BODY,
    responses={
        200: {
            "description": "`{count, max_model_len, tokens}`: the token ids the engine gets for it",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        **_TOKEN_ERRORS,
    },
)
async def tokenize(request: Request) -> Response:
    """vLLM's `/tokenize`: `{prompt}` or `{messages}` (rendered with the chat template) ->
    `{count, max_model_len, tokens}`."""
    try:
        serving = bound_serving(request)
        raw = await request.body()
        try:
            decoded = jsontext.loads(raw)
        except ValueError:
            decoded = raw  # parse_request reports it
        chat = isinstance(decoded, dict) and "messages" in decoded
        body = parse_request(TokenizeChatRequest if chat else TokenizeCompletionRequest, decoded)
        return JSONResponse(await serving.tokenize(body))
    except APIError as exc:
        return error_response(exc)


@root_app.post(
    "/detokenize",
    summary="Detokenize token ids",
    openapi_extra=body_doc(DetokenizeRequest, _DETOKENIZE_EXAMPLE),
    responses={
        200: {
            "description": "`{prompt}`: the text of the token ids, special tokens included",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        **_TOKEN_ERRORS,
    },
)
async def detokenize(request: Request) -> Response:
    """vLLM's `/detokenize`: `{tokens}` -> `{prompt}`."""
    try:
        serving = bound_serving(request)
        body = parse_request(DetokenizeRequest, await request.body())
        return JSONResponse(serving.detokenize(body))
    except APIError as exc:
        return error_response(exc)


_ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _not_routed(request: Request, status: int) -> Response:
    where = f"{request.method} {request.url.path}"
    if status == 405:
        return error_response(APIError(405, f"Method not allowed ({where})", code="method_not_allowed"))
    return error_response(APIError(404, f"Invalid URL ({where})", code="unknown_url"))


@app.api_route("/{path:path}", methods=_ANY_METHOD, include_in_schema=False)
async def unknown_route(path: str, request: Request) -> Response:
    """Everything else under /v1: a 404 in OpenAI's shape, or a 405 for a known path.

    BentoML mounts this app only for paths that one of its routes matches, so without this catch-all
    unknown /v1 URLs would get BentoML's plain-text 404.
    """
    scope = request.scope
    known = any(
        route.matches(scope)[0] == Match.PARTIAL
        for route in app.routes
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


@app.exception_handler(StarletteHTTPException)
async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """Any other HTTP error raised by the framework, in OpenAI's error shape."""
    if exc.status_code in (404, 405):
        return _not_routed(request, exc.status_code)
    response = error_response(APIError(exc.status_code, str(exc.detail)))
    if exc.headers:
        response.headers.update(exc.headers)
    return response


root_app.add_exception_handler(StarletteHTTPException, http_error)  # a wrong method: 405 in the same shape
