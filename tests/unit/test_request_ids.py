"""`X-Request-Id`: which ids are used, the middleware that echoes them, the engine request ids made
from them, the log filter that marks a request's lines, and the middlewares' order in BentoML."""

from __future__ import annotations

import logging
from typing import Any

import bentoml
import pytest
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from tests.support import asgi_request
from trtllm_service.api.anthropic.errors import is_anthropic
from trtllm_service.api.server.bentoml_patches import arrange_middlewares
from trtllm_service.api.server.deployment import ServiceConcurrencyLimit, http
from trtllm_service.api.server.limits import BodyLimitMiddleware, ConcurrencyLimitMiddleware
from trtllm_service.request_ids import (
    MARK,
    REQUEST_ID,
    RequestIdLogFilter,
    RequestIdMiddleware,
    engine_request_id,
    new_request_id,
    valid_request_id,
)
from trtllm_service.settings import Settings


@pytest.mark.parametrize(
    "value",
    ["abc", "req_01HZX3", "0f8fad5b-d9cb-469f-a165-70867728950e", "a.b:c/d+e=f@g-h", "x" * 128, b"bytes-ok"],
)
def test_usable_ids_are_kept(value: str | bytes) -> None:
    assert valid_request_id(value) == (value.decode() if isinstance(value, bytes) else value)


@pytest.mark.parametrize(
    "value", [None, "", "x" * 129, "has space", 'quo"te', "new\nline", "tab\t", "é", b"\xff\xfe", "a,b"]
)
def test_unusable_ids_are_refused(value: str | bytes | None) -> None:
    assert valid_request_id(value) is None


def test_new_ids_are_unique_and_usable() -> None:
    ids = {new_request_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(i) == 32 and valid_request_id(i) == i for i in ids)


def test_engine_request_ids_follow_the_http_request() -> None:
    assert engine_request_id() is None  # outside a request: the relay makes one
    token = REQUEST_ID.set("req-1")
    try:
        assert engine_request_id() == "req-1"
        assert [engine_request_id(i, 3) for i in range(3)] == ["req-1-0", "req-1-1", "req-1-2"]
    finally:
        REQUEST_ID.reset(token)
    assert engine_request_id() is None


# ---- the middleware ------------------------------------------------------------------------------------


def app_seeing_ids(seen: list[str | None]) -> RequestIdMiddleware:
    async def ok(request: Any) -> PlainTextResponse:
        seen.append(REQUEST_ID.get())
        return PlainTextResponse("ok")

    async def refused(request: Any) -> JSONResponse:
        return JSONResponse({"error": {"message": "no"}}, status_code=429)

    inner = Starlette(routes=[Route("/ok", ok, methods=["GET", "POST"]), Route("/refused", refused)])
    return RequestIdMiddleware(inner)


def test_the_clients_id_is_echoed_and_set_while_serving() -> None:
    seen: list[str | None] = []
    response = asgi_request(app_seeing_ids(seen), "/ok", **{"X-Request-Id": "client-7"})
    assert response.headers["x-request-id"] == "client-7"
    assert response.headers.get_list("x-request-id") == ["client-7"]
    assert seen == ["client-7"]
    assert REQUEST_ID.get() is None, "the id does not outlive its request"


def test_a_missing_or_unusable_id_is_replaced_by_a_fresh_one() -> None:
    seen: list[str | None] = []
    app = app_seeing_ids(seen)
    first = asgi_request(app, "/ok").headers["x-request-id"]
    second = asgi_request(app, "/ok", **{"X-Request-Id": "bad id\u0001"}).headers["x-request-id"]
    assert first != second and valid_request_id(first) == first and valid_request_id(second) == second
    assert seen == [first, second]


def test_refusals_and_unknown_routes_carry_the_id_too() -> None:
    app = app_seeing_ids([])
    assert asgi_request(app, "/refused", **{"X-Request-Id": "r-429"}).headers["x-request-id"] == "r-429"
    assert asgi_request(app, "/nowhere", **{"X-Request-Id": "r-404"}).headers["x-request-id"] == "r-404"
    limited = RequestIdMiddleware(BodyLimitMiddleware(app_seeing_ids([]), max_bytes=1024))
    response = asgi_request(limited, "/ok", "POST", **{"content-type": "text/plain", "X-Request-Id": "r-415"})
    assert response.status_code == 415 and response.headers["x-request-id"] == "r-415"


def test_anthropic_routes_carry_the_id_as_request_id_too() -> None:
    """Anthropic's clients read the id from `request-id`: on its routes, refusals included."""
    app = RequestIdMiddleware(app_seeing_ids([]), anthropic_paths=is_anthropic)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        response = asgi_request(app, path, "POST", **{"X-Request-Id": "a-1"})
        assert (response.headers["x-request-id"], response.headers["request-id"]) == ("a-1", "a-1")
        assert response.headers.get_list("request-id") == ["a-1"]
    assert "request-id" not in asgi_request(app, "/ok", **{"X-Request-Id": "o-1"}).headers
    assert "request-id" not in asgi_request(app_seeing_ids([]), "/v1/messages", "POST").headers


# ---- the log filter --------------------------------------------------------------------------------------


def test_log_lines_of_a_request_start_with_its_id_once() -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("test_request_ids")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handlers = [Keep(), Keep()]  # a record passing two marking handlers is marked once
    for handler in handlers:
        handler.addFilter(RequestIdLogFilter())
        logger.addHandler(handler)
    try:
        logger.info("outside %s", "a request")
        token = REQUEST_ID.set("log-9")
        try:
            record = logging.LogRecord("bentoml.access", logging.INFO, __file__, 1, "GET %s", ("/x",), None)
            record.request_id = 1234  # BentoML's own log filter sets this to a span id
            for handler in handlers:
                handler.handle(record)
            logger.info("inside %s", "a request")
        finally:
            REQUEST_ID.reset(token)
    finally:
        for handler in handlers:
            logger.removeHandler(handler)
    messages = [r.getMessage() for r in records]
    assert messages[:2] == ["outside a request"] * 2
    assert messages[2:4] == ["[request_id=log-9] GET /x"] * 2
    assert messages[4:] == ["[request_id=log-9] inside a request"] * 2
    assert getattr(records[-1], MARK) == "log-9"


# ---- the order of the middlewares in BentoML ---------------------------------------------------------------


def test_request_id_and_cors_go_first_and_bentomls_limiter_goes() -> None:
    """What `arrange_middlewares` makes of a service like ours (traffic.max_concurrency set, CORS
    on): the request id outermost, BentoML's CORS right inside it (so that the refusals of our
    middlewares carry both), and BentoML's per-worker limiter left to ours."""
    from _bentoml_impl.server.app import ServiceAppFactory
    from bentoml._internal.server.http.traffic import MaxConcurrencyMiddleware

    @bentoml.service(
        name="order-check",
        traffic={"timeout": 60, "concurrency": 4, "max_concurrency": 16},
        http=http(Settings.from_env({"TRTLLM_CORS_ALLOW_ORIGINS": "http://localhost:5173"})),
    )
    class OrderCheck:
        @bentoml.api
        async def echo(self, text: str = "") -> str:
            return text

    OrderCheck.add_asgi_middleware(RequestIdMiddleware)
    OrderCheck.add_asgi_middleware(ServiceConcurrencyLimit, fallback=16)
    OrderCheck.add_asgi_middleware(BodyLimitMiddleware, max_bytes=1024)

    OrderCheck.inject_config()
    before = [m.cls for m in ServiceAppFactory(OrderCheck, is_main=True).middlewares]
    assert MaxConcurrencyMiddleware in before and before.index(CORSMiddleware) > before.index(
        BodyLimitMiddleware
    )

    arrange_middlewares(RequestIdMiddleware, ConcurrencyLimitMiddleware)
    arrange_middlewares(RequestIdMiddleware, ConcurrencyLimitMiddleware)  # twice changes nothing more
    after = [m.cls for m in ServiceAppFactory(OrderCheck, is_main=True).middlewares]
    assert after[:2] == [RequestIdMiddleware, CORSMiddleware]
    assert MaxConcurrencyMiddleware not in after
    assert sorted(map(str, after)) == sorted(
        map(str, (c for c in before if c is not MaxConcurrencyMiddleware))
    )
    from trtllm_service.api.server.deployment import configured_traffic

    assert configured_traffic("order-check")["max_concurrency"] == 16
