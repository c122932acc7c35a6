"""The API-key middleware over a trivial app."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.support import asgi_request
from trtllm_service.api.server.auth import APIKeyMiddleware, APIKeys, bearer_token, is_open


def app_with_keys(*keys: str) -> APIKeyMiddleware:
    async def ok(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    paths = ["/", "/readyz", "/metrics", "/docs.json", "/generate", "/v1/models", "/static_content/x.js"]
    inner = Starlette(routes=[Route(p, ok, methods=["GET", "POST", "OPTIONS"]) for p in paths])
    return APIKeyMiddleware(inner, api_keys=keys)


def get(app: APIKeyMiddleware, path: str, method: str = "GET", **headers: str) -> httpx.Response:
    return asgi_request(app, path, method, **headers)


def test_protected_paths_need_a_key() -> None:
    app = app_with_keys("k1", "k2")
    for path in ("/generate", "/v1/models", "/v1/anything", "/unknown"):
        response = get(app, path)
        assert response.status_code == 401, path
        assert response.headers["www-authenticate"] == "Bearer"
        error = response.json()["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error",
            "invalid_api_key",
            None,
        )
        assert "didn't provide an API key" in error["message"]

    wrong = get(app, "/v1/models", authorization="Bearer k3")
    assert wrong.status_code == 401
    assert wrong.json()["error"]["message"] == "Incorrect API key provided."
    assert "k3" not in wrong.text
    for header in ("Basic azE6azE=", "Bearer", "k1", "Bearer k1k2", "Bearer  "):
        assert get(app, "/generate", authorization=header).status_code == 401, header


def test_either_key_opens_every_path() -> None:
    app = app_with_keys("k1", "k2")
    for header in ("Bearer k1", "Bearer k2", "bearer k2", "BEARER  k1 "):
        assert get(app, "/generate", authorization=header).text == "ok", header
        assert get(app, "/v1/models", authorization=header).status_code == 200


def test_probes_metrics_docs_and_preflights_are_open() -> None:
    app = app_with_keys("k1")
    for path in ("/", "/readyz", "/metrics", "/docs.json", "/static_content/x.js"):
        assert get(app, path).status_code == 200, path
    assert get(app, "/generate", method="OPTIONS").status_code == 200
    assert is_open("/livez") and is_open("/healthz") and is_open("/assets/app.js")
    assert not is_open("/metrics/../generate") and not is_open("//generate") and not is_open("/v1/models")


def test_keys_are_required_and_never_shown() -> None:
    with pytest.raises(ValueError):
        APIKeyMiddleware(app_with_keys("k1"), api_keys=["", ""])
    middleware = app_with_keys("secret-key")
    assert "secret-key" not in repr(middleware)
    keys = APIKeys(["secret-key", "other"])
    assert repr(keys) == "APIKeys(<2 keys>)"
    assert keys.matches(b"other") and not keys.matches(b"secret") and not keys.matches(None)


def test_bearer_token_parsing() -> None:
    assert bearer_token([(b"authorization", b"Bearer abc")]) == b"abc"
    assert bearer_token([(b"Authorization", b"bearer  abc ")]) == b"abc"
    assert bearer_token([(b"authorization", b"Token abc")]) is None
    assert bearer_token([(b"x-api-key", b"abc")]) is None


def test_x_api_key_as_anthropic_clients_send_it() -> None:
    app = app_with_keys("k1", "k2")
    assert asgi_request(app, "/v1/models", "GET", **{"x-api-key": "k2"}).status_code == 200
    wrong = asgi_request(app, "/v1/models", "GET", **{"x-api-key": "k3"})
    assert wrong.status_code == 401 and wrong.json()["error"]["message"] == "Incorrect API key provided."
    assert "k3" not in wrong.text
    # either header may carry the key: a stale bearer token beside the right x-api-key passes
    both = asgi_request(app, "/generate", "GET", authorization="Bearer old", **{"x-api-key": "k1"})
    assert both.text == "ok"
    assert asgi_request(app, "/generate", "GET", **{"x-api-key": " "}).status_code == 401
