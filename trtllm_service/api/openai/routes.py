"""OpenAI's routes: ``router``, thin routes over ``OpenAIServing`` (mounted under ``/v1`` by
``api.app``, beside Anthropic's), and ``tokenizer_router``, vLLM's ``/tokenize`` and ``/detokenize``
(at the root, as vLLM serves them).

Request bodies are read raw and validated by the protocol's models (``generation.bodies``), not by
FastAPI, so that every error (malformed JSON, a wrong type, an unsupported parameter) names its
``param``. Every route answers from the serving object the service binds once per worker
(``api.app.bind``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from trtllm_service import jsontext
from trtllm_service.api.generation.bodies import (
    add_body_route,
    body_doc,
    bound_serving,
    event_stream_ok,
)
from trtllm_service.api.generation.protocol import parse_request
from trtllm_service.api.generation.serving import error_docs
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
    LoadLoRAAdapterRequest,
    ModelCard,
    ModelList,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    UnloadLoRAAdapterRequest,
)
from trtllm_service.api.openai.responses.protocol import RESPONSES_ROUTE, ResponsesRequest
from trtllm_service.api.openai.serving import OpenAIServing
from trtllm_service.api.server.error_shape import ErrorBody, error_response
from trtllm_service.api.server.openapi30 import inline_schema
from trtllm_service.errors import APIError

if TYPE_CHECKING:
    from pydantic import BaseModel


_Body = TypeVar("_Body", bound="BaseModel")

router = APIRouter()
"""OpenAI's routes under /v1: models, chat and text completions, responses."""


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


@router.get("/models", response_model=ModelList, summary="List models")
async def list_models(request: Request) -> Response:
    """The served model, with its context length (`max_model_len`)."""
    try:
        return JSONResponse(bound_serving(request).list_models().model_dump(mode="json"))
    except APIError as exc:
        return error_response(exc)


@router.get(
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


_LORA_OK = {
    200: {
        "description": "vLLM's answer: `Success: LoRA adapter '<name>' ...`",
        "content": {"text/plain": {}},
    },
    **error_docs(
        ErrorBody,
        {
            400: "A bad adapter (the message names what is wrong), a name loaded already, a path outside "
            "TRTLLM_LORA_ROOT",
            401: "Missing or wrong API key",
            404: "No adapter of that name is loaded, or TRTLLM_ALLOW_RUNTIME_LORA_UPDATING is off",
        },
    ),
}


async def _lora_route(request: Request, body: type[_Body], operation: str) -> Response:
    """vLLM's LoRA routes: a 404 as for any unknown URL unless TRTLLM_ALLOW_RUNTIME_LORA_UPDATING."""
    try:
        serving = bound_serving(request)
        if not serving.runtime_lora_updating:
            where = f"{request.method} {request.url.path}"
            raise APIError(404, f"Invalid URL ({where})", code="unknown_url")
        parsed = parse_request(body, await request.body())
        return PlainTextResponse(await getattr(serving, operation)(parsed))
    except APIError as exc:
        return error_response(exc)


@router.post(
    "/load_lora_adapter",
    summary="Load a LoRA adapter",
    openapi_extra=body_doc(LoadLoRAAdapterRequest, {"lora_name": "tenant-a", "lora_path": "tenant-a"}),
    responses=_LORA_OK,
)
async def load_lora_adapter(request: Request) -> Response:
    """vLLM's: checks a PEFT adapter against the packed model and serves it under `lora_name` (as
    `model`) on every worker. Only with TRTLLM_ALLOW_RUNTIME_LORA_UPDATING."""
    return await _lora_route(request, LoadLoRAAdapterRequest, "load_lora_adapter")


@router.post(
    "/unload_lora_adapter",
    summary="Unload a LoRA adapter",
    openapi_extra=body_doc(UnloadLoRAAdapterRequest, {"lora_name": "tenant-a"}),
    responses=_LORA_OK,
)
async def unload_lora_adapter(request: Request) -> Response:
    """vLLM's: stops serving a loaded adapter; its requests in flight finish, new ones get a 404. Only
    with TRTLLM_ALLOW_RUNTIME_LORA_UPDATING."""
    return await _lora_route(request, UnloadLoRAAdapterRequest, "unload_lora_adapter")


add_body_route(
    router,
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
    router,
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
    router,
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


# ---- /tokenize and /detokenize: vLLM serves them at the root, not under /v1 ------------------------------


tokenizer_router = APIRouter()
"""vLLM's /tokenize and /detokenize, served at the root (`api.app.root`)."""

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
_TOKEN_ERRORS: dict[int | str, dict[str, Any]] = {
    code: ERROR_RESPONSES[code] for code in (400, 401, 404, 503)
}


@tokenizer_router.post(
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


@tokenizer_router.post(
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
