"""bentoml_patches: BentoML's TimeoutMiddleware as the service patches it (`cancel_request_timers`):
its timer is cancelled with the request, an app that returns without answering (a request whose
client left before its first token) does not leave the request waiting for the timer, and the app
runs in the request's own task (a cancel of that task reaches it). BentoML's log
filter as the service replaces it (`read_span_once_in_log_lines`): the same fields as BentoML's own.
BentoML's traffic metrics as the service wraps them (`_Relabelled`): each series looked up once.
BentoML's access lines as the service defers them (`defer_access_lines`): written after the response,
in its request's context, in order. An API method's caller, built once per service instance
(`build_api_callers_once`). BentoML's routes with the generation routes first (`routes_first`): every
request answered as in BentoML's order."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import bentoml
import pytest
from _bentoml_impl.server.mount import PassiveMount
from _bentoml_sdk.method import APIMethod
from bentoml._internal.log import TraceRecordFilter
from bentoml._internal.server.http.access import AccessLogMiddleware
from bentoml._internal.server.http.traffic import TimeoutMiddleware
from fastapi import APIRouter, FastAPI
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from trtllm_service.api.generation import bodies
from trtllm_service.api.generation.bodies import BodyRoutesApp, add_body_route
from trtllm_service.api.server.bentoml_patches import (
    ACCESS_LINE_DELAY_S,
    _Relabelled,
    build_api_callers_once,
    cancel_request_timers,
    defer_access_lines,
    read_span_once_in_log_lines,
    routes_first,
)
from trtllm_service.api.server.metrics import OTHER, EndpointLabels

cancel_request_timers()
build_api_callers_once()
read_span_once_in_log_lines()
defer_access_lines()
BENTOML_FILTER = TraceRecordFilter.filter.__wrapped__  # BentoML's own, unpatched


async def _receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


def serve(app: Any, timeout: float) -> tuple[list[Any], float]:
    """The messages `app` behind the middleware sent, and the seconds the request took."""
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def scenario() -> float:
        started = time.monotonic()
        await asyncio.wait_for(TimeoutMiddleware(app, timeout=timeout)({"type": "http"}, _receive, send), 10)
        return time.monotonic() - started

    return sent, asyncio.run(scenario())


def test_an_app_that_returns_without_answering_ends_the_request_at_once() -> None:
    async def silent(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(0.01)

    sent, took = serve(silent, timeout=30)
    assert took < 5, "returned with the app, not after the 30 s timer"
    assert sent == []


def test_an_app_that_answers_too_late_gets_the_504() -> None:
    async def slow(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(30)

    sent, _ = serve(slow, timeout=0.05)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 504


def test_the_app_runs_in_the_request_s_own_task() -> None:
    tasks: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        tasks.append(asyncio.current_task())
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def scenario() -> None:
        sent: list[Any] = []

        async def send(message: Any) -> None:
            sent.append(message)

        await TimeoutMiddleware(app, timeout=30)({"type": "http"}, _receive, send)
        tasks.append(asyncio.current_task())
        assert [m["status"] for m in sent] == [200]

    asyncio.run(scenario())
    assert tasks[0] is tasks[1]


def test_a_cancel_from_outside_reaches_the_app_and_is_not_a_504() -> None:
    """uvicorn cancels a request's task past a graceful shutdown's time: the app stops with it."""
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def scenario() -> None:
        sent: list[Any] = []

        async def send(message: Any) -> None:
            sent.append(message)

        request = asyncio.create_task(TimeoutMiddleware(app, timeout=30)({"type": "http"}, _receive, send))
        await asyncio.sleep(0.01)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        assert seen == ["cancelled"]  # by the time the request's task ended, not left running
        assert sent == []

    asyncio.run(scenario())


@pytest.mark.parametrize("answers", [True, False], ids=["answers-itself", "returns-silently"])
def test_an_app_that_catches_the_timeout_s_cancel(answers: bool) -> None:
    """Its own answer stands; without one the client gets the 504. The request's task is left not
    cancelled either way, so what runs after the app in it is not cancelled at its next wait."""
    cancelling: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            if answers:
                await send({"type": "http.response.start", "status": 503, "headers": []})

    async def scenario() -> list[Any]:
        sent: list[Any] = []

        async def send(message: Any) -> None:
            sent.append(message)

        await TimeoutMiddleware(app, timeout=0.05)({"type": "http"}, _receive, send)
        task = asyncio.current_task()
        assert task is not None
        cancelling.append(task.cancelling())
        await asyncio.sleep(0.01)  # not cancelled here
        return sent

    sent = asyncio.run(scenario())
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [503 if answers else 504]
    assert cancelling == [0]


def filtered(filter_fn: Any, name: str = "bentoml.access") -> tuple[Any, dict[str, Any]]:
    """What `filter_fn` returns for a fresh record, and the fields it set on it."""
    record = logging.LogRecord(name, logging.INFO, __file__, 1, "%s", ("line",), None)
    before = set(vars(record))
    kept = filter_fn(TraceRecordFilter(), record)
    return kept, {key: value for key, value in vars(record).items() if key not in before}


@pytest.mark.parametrize("sampled", [True, False, None], ids=["sampled", "not-sampled", "no-span"])
@pytest.mark.parametrize("name", ["bentoml.access", "trtllm_service", "bentoml_monitor_data"])
def test_log_lines_get_bentoml_s_own_fields(sampled: bool | None, name: str) -> None:
    span = (
        trace.INVALID_SPAN
        if sampled is None
        else NonRecordingSpan(
            SpanContext(
                trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
                span_id=0x00F067AA0BA902B7,
                is_remote=False,
                trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT),
            )
        )
    )
    with trace.use_span(span):
        ours, bentoml_s = filtered(TraceRecordFilter.filter, name), filtered(BENTOML_FILTER, name)
    assert ours == bentoml_s
    if name != "bentoml_monitor_data":
        assert ours[1]["levelname_bracketed"] == "[INFO]"
        trace_msg = ours[1]["trace_msg"]
        if sampled is None:
            assert trace_msg == ""
        else:
            assert "trace=4bf92f3577b34da6a3ce929d0e0e4736,span=00f067aa0ba902b7" in trace_msg
            assert f"sampled={int(sampled)}" in trace_msg


def test_traffic_metrics_are_labelled_by_route_and_looked_up_once() -> None:
    registry = CollectorRegistry()
    total = Counter("requests", "d", ["endpoint", "http_response_code", "service_name"], registry=registry)
    stamp = Gauge("last", "d", ["service_name"], registry=registry)
    labels = EndpointLabels()
    labels.learn(type("App", (), {"routes": []})())
    lookups: list[dict[str, Any]] = []

    class Counted:  # the counter, its lookups counted
        @staticmethod
        def labels(**values: Any) -> Any:
            lookups.append(values)
            return total.labels(**values)

    relabelled, plain = _Relabelled(Counted, labels), _Relabelled(stamp)

    first = relabelled.labels(endpoint="/no/such/path", http_response_code=200, service_name="svc")
    first.inc()
    again = relabelled.labels(endpoint="/another/path", http_response_code=200, service_name="svc")
    again.inc()
    assert first is again is total.labels(endpoint=OTHER, http_response_code=200, service_name="svc")
    assert relabelled.labels(endpoint="/x", http_response_code=500, service_name="svc") is not first
    assert (
        registry.get_sample_value(
            "requests_total", {"endpoint": OTHER, "http_response_code": "200", "service_name": "svc"}
        )
        == 2
    )
    assert plain.labels(service_name="svc") is plain.labels(service_name="svc") is stamp.labels("svc")
    assert lookups == [
        {"endpoint": OTHER, "http_response_code": 200, "service_name": "svc"},
        {"endpoint": OTHER, "http_response_code": 500, "service_name": "svc"},
    ]


def test_access_lines_are_written_after_the_response_in_its_request_s_context() -> None:
    which: contextvars.ContextVar[str] = contextvars.ContextVar("which", default="none")
    written: list[tuple[str, str, float]] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            written.append((record.getMessage(), which.get(), time.monotonic()))

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})

    async def sent(message: Any) -> None:
        return None

    middleware = AccessLogMiddleware(app)
    scope = {"type": "http", "scheme": "http", "method": "POST", "path": "/generate", "headers": []}

    async def one(name: str) -> float:
        which.set(name)
        await middleware({**scope, "client": ("127.0.0.1", len(written))}, _receive, sent)
        return time.monotonic()

    async def scenario() -> tuple[float, list[tuple[str, str, float]]]:
        first_end = await asyncio.create_task(one("first"))
        await asyncio.create_task(one("second"))
        at_the_end = list(written)
        await asyncio.sleep(ACCESS_LINE_DELAY_S * 10)
        return first_end, at_the_end

    async def cut_short() -> None:  # a loop that ends before its timer fires
        await asyncio.create_task(one("held"))

    async def later() -> None:
        await asyncio.create_task(one("later"))
        await asyncio.sleep(ACCESS_LINE_DELAY_S * 10)

    access = logging.getLogger("bentoml.access")
    handler, level = Capture(), access.level
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        first_end, at_the_end = asyncio.run(scenario())
        asyncio.run(cut_short())
        held = list(written)
        asyncio.run(later())
    finally:
        access.removeHandler(handler)
        access.setLevel(level)
    assert at_the_end == [], "nothing written at the responses' end"
    assert [
        (context, "status=201" in line and "path=/generate" in line) for line, context, _ in written[:2]
    ] == [
        ("first", True),
        ("second", True),
    ]
    assert written[0][2] - first_end >= ACCESS_LINE_DELAY_S * 0.9
    assert len(held) == 2, "the cut-short loop's line waits"
    assert [context for _, context, _ in written[2:]] == ["held", "later"], "then goes out with the next"


@bentoml.service
class Greeter:
    def __init__(self) -> None:
        self.greeting = "hello"

    @bentoml.api
    async def greet(self, name: str, times: int = 1, mark: str = bentoml.Field(default="!")) -> str:
        return " ".join([f"{self.greeting} {name}{mark}"] * times)


def test_an_api_caller_is_built_once_per_instance_and_calls_as_bentoml_s() -> None:
    first, second = Greeter.inner(), Greeter.inner()
    second.greeting = "hi"
    caller = first.greet
    assert first.greet is caller and caller.local is caller  # BentoML's built a new one per access
    assert second.greet is not caller and second.greet is second.greet
    assert [p.name for p in inspect.signature(caller).parameters.values()] == ["name", "times", "mark"]
    assert asyncio.run(caller("Ada")) == "hello Ada!"  # the Field's default filled in, as BentoML's
    assert asyncio.run(second.greet("Bo", times=2, mark="?")) == "hi Bo? hi Bo?"
    assert isinstance(Greeter.inner.__dict__["greet"], APIMethod) and isinstance(
        Greeter.inner.greet, APIMethod
    )
    proxied = Greeter.inner()

    async def remote(name: str) -> str:
        return f"remote {name}"

    # BentoML sets its client of itself on every served instance: the caller is its, with `local`
    proxied.__self_proxy__ = SimpleNamespace(greet=remote)
    built = proxied.greet
    assert built is remote and asyncio.run(proxied.greet("Cy")) == "remote Cy"
    assert asyncio.run(remote.local("Cy")) == "hello Cy!"  # `local`: set by BentoML
    local = remote.local
    assert proxied.greet is built and remote.local is local  # built once: BentoML's built one per access

    async def other(name: str) -> str:
        return f"other {name}"

    proxied.__self_proxy__ = SimpleNamespace(greet=other)  # another proxy: built again
    assert proxied.greet is other and asyncio.run(other.local("Di")) == "hello Di!"


MADE_TAGS = bentoml.Field(default_factory=lambda: ["made"])


@bentoml.service
class Filler:
    @bentoml.api
    async def fill(
        self,
        text: str,
        plain: int = 1,
        mark: str = bentoml.Field(default="!"),
        tags: list[str] = MADE_TAGS,
        bare: str = bentoml.Field(description="no default"),
    ) -> str:
        return f"{text}|{plain}|{mark}|{tags}|{bare}"


def test_the_lean_caller_fills_fields_defaults_as_bentoml_s_does() -> None:
    """The caller BentoML's endpoint calls (`.local`) fills the defaults of the parameters declared
    with Field that a call leaves out, by position or by name, as BentoML's own caller does, and
    looks like it (signature, `func`)."""
    from trtllm_service.api.server.bentoml_patches import build_api_callers_once

    build_api_callers_once()
    lean_builder = APIMethod._local_call
    assert getattr(lean_builder, "_trtllm_lean", False)
    method = Filler.inner.__dict__["fill"]
    lean, bentomls = lean_builder(method, Filler.inner()), lean_builder.bentomls(method, Filler.inner())
    assert inspect.signature(lean) == inspect.signature(bentomls) and lean.func is bentomls.func
    calls = [
        (("a",), {"bare": "b"}),
        (("a", 2, "?"), {"bare": "b"}),
        (("a",), {"mark": "#", "tags": ["x"], "bare": "b"}),
        (("a", 3, ".", ["y"], "z"), {}),
        ((), {"text": "a", "plain": 4, "mark": "*", "tags": [], "bare": "b"}),
    ]
    for args, kwargs in calls:
        assert asyncio.run(lean(*args, **kwargs)) == asyncio.run(bentomls(*args, **kwargs)), (args, kwargs)
    assert asyncio.run(lean("a", bare="b")) == "a|1|!|['made']|b"


class Said(BaseModel):
    text: str = ""


async def say(serving: Any, body: Said, request: Request) -> Response:
    return PlainTextResponse(f"v1 said {body.text!r} at {request.url.path} for {serving}")


def _text(text: str) -> Any:
    async def endpoint(request: Request) -> Response:
        return PlainTextResponse(f"{text} at {request.url.path}")

    return endpoint


def bentoml_like_routes(literal_under_v1: bool = False) -> list[Any]:
    """Routes in the order BentoML's factory adds them: probes and metrics, the API's (`/generate`),
    `/schema.json`, the passive mounts of /v1 (a BodyRoutesApp with a catch-all) and of the root app,
    then the docs."""
    router = APIRouter()

    @router.get("/models")
    async def models() -> Response:
        return PlainTextResponse("v1 models")

    add_body_route(
        router,
        "/chat/completions",
        Said,
        "chat",
        say,
        name="c",
        summary="",
        description="",
        example={},
        responses={},
    )

    @router.api_route("/{path:path}", methods=["GET", "PUT"])  # a POST to another path falls through
    async def unknown(path: str) -> Response:
        return PlainTextResponse(f"v1 unknown {path}", status_code=404)

    v1 = BodyRoutesApp()
    v1.include_router(router)
    root = FastAPI()

    @root.post("/tokenize")
    async def tokenize() -> Response:
        return PlainTextResponse("tokenized")

    @root.post("/v1/elsewhere")  # under /v1, but the root app's
    async def elsewhere() -> Response:
        return PlainTextResponse("the root app's")

    routes: list[Any] = [
        Route("/livez", _text("live"), methods=["GET"]),
        Route("/metrics", _text("metrics"), methods=["GET"]),
        Route("/generate", _text("generated"), methods=["POST"]),
        Route("/schema.json", _text("schema"), methods=["GET"]),
    ]
    if literal_under_v1:
        routes.append(Route("/v1/chat/completions", _text("BentoML's own"), methods=["GET"]))
    return [
        *routes,
        PassiveMount("/v1", v1),
        PassiveMount("", root),
        Route("/", _text("docs"), methods=["GET"]),
    ]


def _order(routes: list[Any]) -> list[str]:
    return [f"{type(route).__name__} {route.path}" for route in routes]


def test_generation_routes_go_first_where_no_route_ahead_takes_their_paths() -> None:
    assert _order(routes_first(bentoml_like_routes(), BodyRoutesApp)) == [
        "Route /generate",
        "BodyRoutesMount /v1",
        "Route /livez",
        "Route /metrics",
        "Route /schema.json",
        "PassiveMount ",
        "Route /",
    ]
    kept = routes_first(
        bentoml_like_routes(literal_under_v1=True), BodyRoutesApp
    )  # a route of its own under /v1
    assert _order(kept)[:2] == ["Route /generate", "Route /livez"]
    assert "PassiveMount /v1" in _order(kept)


@pytest.fixture
def served_body_routes() -> Iterator[None]:
    """A serving object bound for the body routes (the worker's own, if any, back afterwards)."""
    kept = list(bodies._bound)
    bodies.bind_serving("the serving object")  # type: ignore[arg-type]  # say() only names it
    yield
    bodies._bound[:] = kept


@pytest.mark.parametrize("literal_under_v1", [False, True], ids=["bentoml-s", "a-route-under-v1"])
@pytest.mark.parametrize("root_path", ["", "/svc"])
@pytest.mark.usefixtures("served_body_routes")
def test_every_request_is_answered_as_in_bentoml_s_order(literal_under_v1: bool, root_path: str) -> None:
    asks = [
        ("POST", "/v1/chat/completions", {"text": "hi"}),
        ("GET", "/v1/chat/completions", None),
        ("DELETE", "/v1/chat/completions", None),
        ("GET", "/v1/models", None),
        ("POST", "/v1/models", {}),
        ("POST", "/v1/nothing/here", {}),
        ("POST", "/v1/elsewhere", {}),
        ("POST", "/v1", {}),
        ("POST", "/v1/", {}),
        ("POST", "/generate", {}),
        ("GET", "/generate", None),
        ("GET", "/livez", None),
        ("POST", "/livez", {}),
        ("POST", "/tokenize", {}),
        ("GET", "/", None),
        ("GET", "/elsewhere", None),
    ]
    answers = []
    for routes in (
        bentoml_like_routes(literal_under_v1),
        routes_first(bentoml_like_routes(literal_under_v1), BodyRoutesApp),
    ):
        client = TestClient(Starlette(routes=routes), root_path=root_path, follow_redirects=False)
        replies = [client.request(method, root_path + path, json=body) for method, path, body in asks]
        answers.append([(reply.status_code, reply.text) for reply in replies])
    bentoml_s, ours = answers
    assert ours == bentoml_s
    assert bentoml_s[0] == (200, f"v1 said 'hi' at {root_path}/v1/chat/completions for the serving object")
    assert (200, "the root app's") in bentoml_s
