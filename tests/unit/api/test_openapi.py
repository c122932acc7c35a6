"""The service's OpenAPI document (api/openapi.py) on a service shaped like ours: its own title,
description and version, tagged routes, request examples, errors in OpenAI's shape."""

from __future__ import annotations

import re
from typing import Any

import bentoml
import pytest

from trtllm_service.api import app
from trtllm_service.api.anthropic.errors import error_type as anthropic_error_type
from trtllm_service.api.openapi import (
    ANTHROPIC_TAG,
    GENERATE_TAG,
    OPENAI_TAG,
    TITLE,
    TOKENIZER_TAG,
    DocumentedService,
    describe,
    openai_routes_of,
)
from trtllm_service.api.server.error_shape import ErrorBody
from trtllm_service.versions import PYPROJECT, service_version

ROUTES = openai_routes_of(app.v1, "/v1") + openai_routes_of(app.root, "")
DESCRIPTION = describe("demo-model", ROUTES)


@bentoml.asgi_app(app.v1, path="/v1")
@bentoml.service(name="docs-check", description=DESCRIPTION, service_class=DocumentedService)
class Documented:
    @bentoml.api
    async def generate(self, prompt: str) -> str:
        return prompt


Documented.mount_asgi_app(app.root, path="/")


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return Documented.openapi_spec.asdict()


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(path, method, op) for path, item in spec["paths"].items() for method, op in item.items()]


def test_the_service_version_is_the_packages() -> None:
    declared = re.search(r'^version\s*=\s*"([^"]+)"', PYPROJECT.read_text(), re.MULTILINE)
    assert declared is not None and service_version() == declared.group(1)


def test_title_version_and_description_are_the_services(spec: dict[str, Any]) -> None:
    info = spec["info"]
    assert info["title"] == TITLE
    assert info["version"] == service_version() != "None"
    assert info["description"] == DESCRIPTION == Documented.doc
    assert "contact" not in info
    text = info["description"]
    assert text.startswith(f"# {TITLE}\n"), "the page shows the description, not the title"
    assert "![" not in text and "<img" not in text, "no images to break"
    assert ":dev" not in text and "BentoML" not in text
    for needle in ("POST /generate", "/v1/chat/completions", "/v1/completions", "/v1/models", "X-Request-Id"):
        assert needle in text, needle


def test_every_openai_route_is_listed_in_the_description() -> None:
    paths = {path for _, path, _ in ROUTES}
    assert {"/v1/models", "/v1/chat/completions", "/v1/completions"} <= paths
    assert not any("{path" in path for path in paths), "the catch-all is not a route to list"
    for method, path, _ in ROUTES:
        assert f"`{method} {path}`" in DESCRIPTION


def test_routes_are_tagged(spec: dict[str, Any]) -> None:
    assert [tag["name"] for tag in spec["tags"]] == [
        GENERATE_TAG.name,
        OPENAI_TAG.name,
        ANTHROPIC_TAG.name,
        TOKENIZER_TAG.name,
        "Infrastructure",
    ]
    for path, _, op in operations(spec):
        if path.startswith("/v1/messages"):
            assert op["tags"] == [ANTHROPIC_TAG.name], path
        elif path.startswith("/v1/"):
            assert op["tags"] == [OPENAI_TAG.name], path
        elif path in ("/tokenize", "/detokenize"):
            assert op["tags"] == [TOKENIZER_TAG.name], path
        elif path == "/generate":
            assert op["tags"] == [GENERATE_TAG.name]
        else:
            assert op["tags"] == ["Infrastructure"], path
        assert op["tags"] != ["default"]


def test_anthropics_routes_are_documented(spec: dict[str, Any]) -> None:
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert "messages" in body["schema"]["properties"] and body["example"]["messages"], path
        assert f"`POST {path}`" in DESCRIPTION
    assert (
        "max_tokens"
        in spec["paths"]["/v1/messages"]["post"]["requestBody"]["content"]["application/json"]["schema"][
            "required"
        ]
    )
    assert "529" in {str(code) for code in spec["paths"]["/v1/messages"]["post"]["responses"]}


def test_every_route_is_documented(spec: dict[str, Any]) -> None:
    """vLLM's /tokenize and /detokenize (a FastAPI app mounted at the root) are on the page too,
    with their bodies' schemas, and listed in the description."""
    assert {"/generate", "/tokenize", "/detokenize", "/v1/models", "/v1/chat/completions"} <= set(
        spec["paths"]
    )
    tokenize = spec["paths"]["/tokenize"]["post"]["requestBody"]["content"]["application/json"]
    prompt, chat = tokenize["schema"]["oneOf"]
    assert "prompt" in prompt["properties"] and "messages" in chat["properties"]
    detokenize = spec["paths"]["/detokenize"]["post"]["requestBody"]["content"]["application/json"]
    assert "tokens" in detokenize["schema"]["properties"] and detokenize["example"]["tokens"]
    for needle in ("`POST /tokenize`", "`POST /detokenize`"):
        assert needle in DESCRIPTION


def test_generate_takes_json_with_a_required_prompt(spec: dict[str, Any]) -> None:
    """The Swagger example is only an example: `prompt` is required and has no default; the body is JSON."""
    body = spec["paths"]["/generate"]["post"]["requestBody"]
    assert body["required"] is True and list(body["content"]) == ["application/json"]
    schema = body["content"]["application/json"]["schema"]
    assert "prompt" in schema["required"] and "default" not in schema["properties"]["prompt"]


def test_request_bodies_have_examples(spec: dict[str, Any]) -> None:
    for path in ("/generate", "/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"):
        body = spec["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert isinstance(body.get("example"), dict) and body["example"], path
    assert spec["paths"]["/generate"]["post"]["requestBody"]["content"]["application/json"]["example"][
        "prompt"
    ]


def test_errors_are_documented_in_openais_shape(spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    assert "ErrorBody" in schemas
    generate = spec["paths"]["/generate"]["post"]["responses"]
    assert {"400", "401", "413", "415", "429", "503"} <= set(map(str, generate))
    assert not {"404", "500"} & set(map(str, generate)), "BentoML's own error shapes are gone"
    checked = 0
    for path, _, op in operations(spec):
        for code, response in op["responses"].items():
            assert str(code) != "422", f"{path}: FastAPI's validation error is never answered"
            if int(code) < 400:
                continue
            media = response["content"]["application/json"]
            if path.startswith("/v1/messages"):  # Anthropic's shape, as the anthropic SDK parses it
                assert media["schema"] == {"$ref": "#/components/schemas/AnthropicError"}, (path, code)
                example = media["example"]
                assert example["type"] == "error" and example["error"]["message"], (path, code)
                assert example["error"]["type"] == anthropic_error_type(int(code)), (path, code)
                continue
            assert media["schema"] == {"$ref": "#/components/schemas/ErrorBody"}, (path, code)
            example = ErrorBody.model_validate(media["example"])  # the shape OpenAI clients parse
            assert example.error.message
            checked += 1
    assert checked >= 15


def test_a_bento_carries_the_description_as_its_readme() -> None:
    """`bentoml build` writes the service's description as the Bento's README (bento.py), which is
    what a built Bento's Swagger page shows: the same text as when served from source."""
    assert Documented.description == DESCRIPTION
