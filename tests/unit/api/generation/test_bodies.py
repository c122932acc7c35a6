"""api/generation/bodies.py: `BodyRoutesApp` serves its body routes' POSTs without FastAPI's
per-request layers, and answers every request as FastAPI itself does. The oracle is a plain FastAPI
app with the same routes and handler, mounted the same way, asked the same requests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import APIRouter, FastAPI
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount
from starlette.testclient import TestClient

from trtllm_service.api.generation import bodies
from trtllm_service.api.generation.bodies import BodyRoutesApp, add_body_route, bind_serving


class Echo(BaseModel):
    text: str = ""
    fail: str | None = None


async def echo(serving: Any, body: Echo, request: Request) -> Response:
    if body.fail == "http":
        raise HTTPException(418, detail="a teapot", headers={"X-Why": "teapot"})
    if body.fail == "crash":
        raise RuntimeError("the endpoint broke")
    return JSONResponse({"echo": body.text, "served_by": serving, "path": request.url.path})


async def handled(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"handled": exc.status_code}, status_code=exc.status_code, headers=exc.headers)


def _router(*, param_post_first: bool) -> APIRouter:
    router = APIRouter()

    @router.get("/items/{item}")  # a path parameter, GET only: it cannot take a POST to /echo
    async def item(item: str) -> dict[str, str]:
        return {"item": item}

    if param_post_first:

        @router.post("/{name}")  # takes a POST to /echo before the body route can
        async def named(name: str) -> dict[str, str]:
            return {"named": name}

    add_body_route(
        router, "/echo", Echo, "echo", echo, name="echo", summary="", description="", example={}, responses={}
    )

    @router.api_route("/{path:path}", methods=["GET", "POST"])
    async def anything(path: str) -> dict[str, str]:
        return {"anything": path}

    return router


def _clients(
    *, param_post_first: bool = False, raises: bool = False
) -> tuple[TestClient, TestClient, BodyRoutesApp]:
    apps = []
    for cls in (BodyRoutesApp, FastAPI):
        app = cls()
        app.include_router(_router(param_post_first=param_post_first))
        app.add_exception_handler(HTTPException, handled)
        apps.append(app)
    clients = [
        TestClient(Starlette(routes=[Mount("/v1", app=app)]), raise_server_exceptions=raises) for app in apps
    ]
    direct = apps[0]
    assert isinstance(direct, BodyRoutesApp)
    return clients[0], clients[1], direct


@pytest.fixture
def own_binding() -> Iterator[None]:
    """The worker's serving object, as the service binds it once loaded (none before the test's
    own: other tests of the worker may have bound theirs); the worker's own after the test."""
    kept = list(bodies._bound)
    bodies._bound.clear()
    yield
    bodies._bound[:] = kept


def _answer(client: TestClient, method: str, path: str, **kwargs: Any) -> tuple[int, str, str, str | None]:
    response = client.request(method, path, **kwargs)
    return (
        response.status_code,
        response.headers["content-type"],
        response.text,
        response.headers.get("x-why"),
    )


REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/v1/echo", {"json": {"text": "hi"}}),  # served
    ("POST", "/v1/echo", {"json": {"fail": "http"}}),  # the app's handler of HTTP errors
    ("POST", "/v1/echo", {"json": {"fail": "crash"}}),  # no handler: a plain 500
    ("POST", "/v1/echo", {"content": b"{not json"}),  # refused by the body's model: a 400
    ("POST", "/v1/echo", {"json": {"text": 3}}),
    ("GET", "/v1/echo", {}),  # not a POST: the router's
    ("POST", "/v1/echo/", {"json": {}}),  # another path
    ("POST", "/v1/elsewhere", {"json": {}}),
    ("GET", "/v1/items/7", {}),
]


@pytest.mark.usefixtures("own_binding")
def test_every_request_is_answered_as_fastapi_answers_it() -> None:
    bind_serving("the bound serving")  # type: ignore[arg-type]  # what `serve` gets, shown in the answer
    direct, fastapi, _ = _clients()
    for method, path, kwargs in REQUESTS:
        assert _answer(direct, method, path, **kwargs) == _answer(fastapi, method, path, **kwargs), (
            method,
            path,
        )
    assert _answer(direct, "POST", "/v1/echo", json={"text": "hi"})[:3] == (
        200,
        "application/json",
        '{"echo":"hi","served_by":"the bound serving","path":"/v1/echo"}',
    )
    assert _answer(direct, "POST", "/v1/echo", json={"fail": "http"}) == (
        418,
        "application/json",
        '{"handled":418}',
        "teapot",
    )
    assert _answer(direct, "POST", "/v1/echo", json={"fail": "crash"})[:3] == (
        500,
        "text/plain; charset=utf-8",
        "Internal Server Error",
    )


@pytest.mark.usefixtures("own_binding")
def test_a_body_route_is_served_past_fastapis_layers_and_the_rest_through_them() -> None:
    direct, _, app = _clients()
    assert direct.post("/v1/echo", json={"text": "hi"}).status_code == 503  # nothing bound: starting
    assert app.middleware_stack is None  # FastAPI's stack was never built, so never used
    assert direct.get("/v1/items/7").json() == {"item": "7"}
    assert app.middleware_stack is not None


@pytest.mark.usefixtures("own_binding")
def test_an_endpoint_that_fails_raises_on_as_fastapi_does() -> None:
    bind_serving("the bound serving")  # type: ignore[arg-type]  # any: the endpoint fails first
    for client in _clients(raises=True)[:2]:
        with pytest.raises(RuntimeError, match="the endpoint broke"):
            client.post("/v1/echo", json={"fail": "crash"})


@pytest.mark.usefixtures("own_binding")
def test_a_route_fastapi_would_reach_first_keeps_the_path() -> None:
    bind_serving("the bound serving")  # type: ignore[arg-type]  # any: the body route is not reached
    direct, fastapi, app = _clients(param_post_first=True)
    assert direct.post("/v1/echo", json={"text": "hi"}).json() == {"named": "echo"}
    assert fastapi.post("/v1/echo", json={"text": "hi"}).json() == {"named": "echo"}
    assert app.middleware_stack is not None
