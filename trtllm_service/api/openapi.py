"""The service's own OpenAPI document (`/docs.json`) and Swagger UI page (`/`).

BentoML titles the document with the service's name, describes it with its default README (a
`name:dev` heading, badges from image hosts, a "None" version) and leaves mounted routes untagged.
`DocumentedService` (the service decorator's `service_class`) says instead what this service is and
how to call it, gives the service's version, tags `/generate` and the OpenAI-compatible routes, and
documents every error in OpenAI's shape, with examples made by the same `APIError` constructors
that make the real answers. The description is also the built Bento's README.
"""

from __future__ import annotations

import copy
from typing import Any

import attrs
import bentoml
from bentoml._internal.service.openapi import INFRA_TAG
from bentoml._internal.service.openapi.specification import Info, OpenAPISpecification, Tag

from trtllm_service.api.server.deployment import OPENAI_ROUTE
from trtllm_service.api.server.limits import body_too_large, too_many_requests, unsupported_media_type
from trtllm_service.errors import APIError
from trtllm_service.versions import service_version

TITLE = "TensorRT-LLM service"
GENERATE_TAG = Tag(name="Text generation", description="Plain text streamed as it is generated.")
OPENAI_TAG = Tag(
    name="OpenAI-compatible API",
    description="The OpenAI API's chat and text completions and models, mounted at `/v1`: any OpenAI "
    "client works with `base_url` set to this service's URL plus `/v1`.",
)
TOKENIZER_TAG = Tag(
    name="Tokenizer",
    description="vLLM's `/tokenize` and `/detokenize`, at the root as vLLM serves them: the token ids "
    "the engine gets for a prompt or chat messages, and the text of token ids.",
)
ANTHROPIC_TAG = Tag(
    name="Anthropic Messages API",
    description="Anthropic's Messages API at `/v1/messages`: the `anthropic` SDK works with `base_url` set "
    "to this service's URL. Errors on these routes are in Anthropic's shape.",
)
TOKENIZER_ROUTES = ("/tokenize", "/detokenize")
ERROR_SCHEMA = "ErrorBody"
ERROR_REF = f"#/components/schemas/{ERROR_SCHEMA}"
ANTHROPIC_ERROR_REF = "#/components/schemas/AnthropicError"
GENERATE_EXAMPLE = {
    "prompt": "Explain superconductors in plain English.",
    "max_tokens": 128,
    "temperature": 0.7,
}

ERRORS: dict[int, tuple[str, APIError]] = {
    400: (
        "Invalid request: a bad field (`param` names it), or a prompt too long for the context",
        APIError.bad_request("'temperature' must be at most 2", param="temperature"),
    ),
    401: ("Missing or wrong API key (when the service has keys)", APIError.invalid_api_key()),
    404: ("Unknown model, or no such route", APIError.model_not_found("gpt-4")),
    413: ("Request body larger than `TRTLLM_MAX_BODY_BYTES`", body_too_large(8 * 1024 * 1024)),
    415: ("Request body that is not JSON", unsupported_media_type("text/plain")),
    429: (
        "More requests in flight than `traffic.max_concurrency`, or past the waiting queue's bounds "
        "(code `queue_full` or `queue_timeout`); retry after `Retry-After` seconds",
        too_many_requests(256),
    ),
    503: (
        "The inference server is not ready (starting, restarting or shutting down)",
        APIError.unavailable(retry_after=1),
    ),
}
"""The errors a generation route answers before its first chunk: description and example."""


def describe(model_name: str, openai_routes: list[tuple[str, str, str]]) -> str:
    """The service's description (Markdown, no images): its title, what it is, how to call it, its
    routes. BentoML's Swagger page hides the document's title and shows its description, so the
    title is the description's heading too.

    Args:
        model_name: The packed model it serves.
        openai_routes: (method, path, summary) of each route under `/v1`.
    """
    routes = "\n".join(f"  - `{method} {path}`: {summary}" for method, path, summary in openai_routes)
    return f"""\
# {TITLE}

Streams text from a TensorRT-LLM engine (model `{model_name}`), served by an NVIDIA Triton
Inference Server that this service starts, watches and restarts.

### How to call it

- `POST /generate` with a JSON body such as `{{"prompt": "Hello!", "max_tokens": 64}}`: the answer
  streams back as plain text, formatted with the model's chat template.
- The OpenAI-compatible API at `/v1`: point any OpenAI client at `<this URL>/v1`; `"stream": true`
  answers in server-sent events ending in `data: [DONE]`.
- Anthropic's Messages API at `/v1/messages`: point the `anthropic` SDK (or Claude-Code-style
  agents) at `<this URL>`; errors there are Anthropic's (`{{"type": "error", "error": {{...}}}}`).
{routes}

```bash
curl -N <this URL>/v1/chat/completions -H 'content-type: application/json' \\
  -d '{{"model": "{model_name}", "messages": [{{"role": "user", "content": "Hello!"}}], "stream": true}}'
```

### Headers and errors

- `Authorization: Bearer <key>` or `x-api-key: <key>` when the service was started with API keys
  (`TRTLLM_API_KEYS`).
- `X-Request-Id`: sent back on every response (yours, or a new one), and the engine request's id.
- Bodies are JSON (`415` for another content type, `400` for malformed JSON or a bad field).
- Every error, on every route but `/v1/messages`, is JSON `{{"error": {{"message", "type", "param",
  "code"}}}}` with a 4xx/5xx status, as OpenAI's, before the first chunk; a `/v1` stream that fails
  later ends with one error event.

While the engine starts, `/livez` answers 200, and `/readyz` and the generation routes 503 with
`Retry-After`; `/readyz` answers 200 once the engine is ready; `/metrics` has Prometheus metrics.
"""


def openai_routes_of(app: Any, prefix: str) -> list[tuple[str, str, str]]:
    """(method, path, summary) of each documented route of the FastAPI app mounted at `prefix`."""
    found = []
    for route in app.routes:
        if not getattr(route, "include_in_schema", False) or not hasattr(route, "methods"):
            continue
        for method in sorted(route.methods - {"HEAD", "OPTIONS"}):
            found.append((method, prefix + route.path, route.summary or route.name))
    return found


def _error_responses(codes: list[int]) -> dict[str, Any]:
    return {
        str(code): {
            "description": ERRORS[code][0],
            "content": {
                "application/json": {"schema": {"$ref": ERROR_REF}, "example": ERRORS[code][1].body()}
            },
        }
        for code in codes
    }


def _with_error_examples(responses: dict[Any, Any]) -> dict[Any, Any]:
    """`responses` with an example on each error documented with the OpenAI error schema, or with
    Anthropic's (whose 529 is our 503)."""
    from trtllm_service.api.anthropic.errors import OVERLOADED, error_body

    found = {}
    for code, response in responses.items():
        status = 503 if int(code) == OVERLOADED else int(code)
        if isinstance(response, dict) and status in ERRORS:
            media = (response.get("content") or {}).get("application/json")
            ref = media.get("schema", {}).get("$ref") if isinstance(media, dict) else None
            if ref in (ERROR_REF, ANTHROPIC_ERROR_REF):
                error = ERRORS[status][1]
                example = error.body() if ref == ERROR_REF else error_body(error, request_id="req_0123")
                response = copy.deepcopy(response)
                response["content"]["application/json"].setdefault("example", example)
        found[code] = response
    return found


def _generate(operation: dict[str, Any]) -> dict[str, Any]:
    """/generate: tagged, an example body, and its errors in OpenAI's shape instead of BentoML's."""
    operation = dict(operation)
    operation["tags"] = [GENERATE_TAG.name]
    operation["summary"] = "Generate text (streamed)"
    ok = {code: response for code, response in operation["responses"].items() if int(code) < 400}
    operation["responses"] = {**ok, **_error_responses([400, 401, 413, 415, 429, 503])}
    body = operation.get("requestBody")
    if isinstance(body, dict) and "application/json" in body.get("content", {}):
        # JSON only, as every route; the example is only an example: `prompt` has no default.
        media = body["content"]["application/json"]
        body = {
            **body,
            "required": True,
            "content": {"application/json": attrs.evolve(media, example=GENERATE_EXAMPLE)},
        }
        operation["requestBody"] = body
    return operation


def _openai(operation: dict[str, Any], tag: Tag = OPENAI_TAG) -> dict[str, Any]:
    """A /v1 route (or vLLM's tokenizer routes): tagged, its errors with examples, and without
    FastAPI's 422 (never answered: bodies are parsed by the routes, and their errors are 400s in
    OpenAI's shape)."""
    operation = dict(operation)
    operation.setdefault("tags", [tag.name])
    if "responses" in operation:
        responses = {code: r for code, r in operation["responses"].items() if str(code) != "422"}
        operation["responses"] = _with_error_examples(responses)
    return operation


def document(
    spec: OpenAPISpecification, *, description: str, openai_prefix: str = OPENAI_ROUTE
) -> OpenAPISpecification:
    """BentoML's document of the service, titled, described, versioned, tagged and with errors in
    OpenAI's shape."""
    paths = {}
    for path, item in spec.paths.items():
        changes: dict[str, Any] = {}
        for method in ("get", "put", "post", "delete", "patch"):
            operation = getattr(item, method)
            if not isinstance(operation, dict):
                continue
            if path == "/generate":
                changes[method] = _generate(operation)
            elif path.startswith(openai_prefix + "/messages"):
                changes[method] = _openai(operation, ANTHROPIC_TAG)
            elif path.startswith(openai_prefix + "/"):
                changes[method] = _openai(operation)
            elif path in TOKENIZER_ROUTES:
                changes[method] = _openai(operation, TOKENIZER_TAG)
        paths[path] = attrs.evolve(item, **changes) if changes else item
    components = copy.copy(spec.components) if isinstance(spec.components, dict) else spec.components
    if isinstance(components, dict):
        schemas = dict(components.get("schemas") or {})
        if ERROR_SCHEMA not in schemas:  # the mounted app documents it; else from the model itself
            from trtllm_service.api.server.error_shape import ErrorBody

            schema = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[ERROR_SCHEMA] = schema
        components["schemas"] = schemas
    return attrs.evolve(
        spec,
        info=Info(title=TITLE, version=service_version(), description=description),
        tags=[GENERATE_TAG, OPENAI_TAG, ANTHROPIC_TAG, TOKENIZER_TAG, INFRA_TAG],
        paths=paths,
        components=components,
    )


class DocumentedService(bentoml.Service):
    """A BentoML service whose README is its `description` (also when served from source) and whose
    OpenAPI document is `document`'s."""

    @property
    def doc(self) -> str:
        return self.description or super().doc

    @property
    def openapi_spec(self) -> OpenAPISpecification:
        return document(super().openapi_spec, description=self.doc)
