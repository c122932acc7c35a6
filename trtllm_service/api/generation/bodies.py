"""Request bodies as every API route takes them: read raw and validated by the protocol's models
(not by FastAPI), so that every error has the service's shape and names its field; their JSON
schemas still reach the OpenAPI document through ``openapi_extra`` (`body_doc`). And the serving
object the service binds once per worker (`bind_serving`), which every route answers from.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from trtllm_service.api.generation.protocol import parse_request
from trtllm_service.api.generation.serving import GenerationServing, error_response
from trtllm_service.api.server.early import STARTING_RETRY_S
from trtllm_service.api.server.metrics import count_rejected
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


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema with every ``$ref`` replaced by its definition (no shared components),
    in the OpenAPI 3.0 dialect of the service's document (`openapi30`)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(copy.deepcopy(defs[ref.removeprefix("#/$defs/")]))
            return openapi30({key: resolve(value) for key, value in node.items()})
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    return resolve(schema)


def openapi30(node: dict[str, Any]) -> dict[str, Any]:
    """One schema node of pydantic's JSON Schema (2020-12) said the OpenAPI 3.0 way, which BentoML's
    document declares and Swagger UI and API fuzzers read: numeric exclusive bounds become booleans
    beside the bound, `const` an enum of one, and an `anyOf` with a null branch `nullable`."""
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        value = node.get(exclusive)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            node[bound], node[exclusive] = value, True
    if "const" in node:
        node["enum"] = [node.pop("const")]
    branches = node.get("anyOf")
    if isinstance(branches, list) and {"type": "null"} in branches:
        rest = [branch for branch in branches if branch != {"type": "null"}]
        node.pop("anyOf")
        if len(rest) == 1 and isinstance(rest[0], dict):
            node.update({**rest[0], **{k: v for k, v in node.items() if k not in rest[0]}})
        else:
            node["anyOf"] = rest
        node["nullable"] = True
    return node


def openapi30_tree(node: Any) -> Any:
    """Every schema node under `node` said the OpenAPI 3.0 way (`openapi30`), in place."""
    if isinstance(node, dict):
        for value in node.values():
            openapi30_tree(value)
        openapi30(node)
    elif isinstance(node, list):
        for item in node:
            openapi30_tree(item)
    return node


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
