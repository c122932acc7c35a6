"""OpenTelemetry's ASGI middleware, as BentoML builds it: request spans without per-chunk ones, and
when nothing records spans, the same current span context as the full middleware gives, built alone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.metrics import _internal as metrics_state
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio
from opentelemetry.util.http import ExcludeList

from trtllm_service.api.server.tracing import tune_request_tracing

tune_request_tracing()
FULL_CALL = OpenTelemetryMiddleware.__call__.__wrapped__  # the middleware's own, unpatched
CALLER_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CALLER_SPAN = 0x00F067AA0BA902B7


async def streaming_app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for _ in range(5):
        await send({"type": "http.response.body", "body": b"token", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def serve_one(
    provider: TracerProvider,
    *,
    full: bool = False,
    path: str = "/generate",
    traceparent: str | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
    app: Any = None,
    **options: Any,
) -> list[tuple[trace.Span, bool]]:
    """One streamed request through the middleware (as BentoML builds it): the current span the app
    saw, and whether it was recording, once per message the app sent (`app`: another app, which
    notes what it likes)."""
    seen: list[tuple[trace.Span, bool]] = []

    async def streaming(scope: Any, receive: Any, send: Any) -> None:
        async def noting(message: Any) -> None:
            span = trace.get_current_span()
            seen.append((span, span.is_recording()))
            await send(message)

        await streaming_app(scope, receive, noting)

    middleware = OpenTelemetryMiddleware(app or streaming, tracer_provider=provider, **options)
    if headers is None:
        headers = [] if traceparent is None else [(b"traceparent", traceparent.encode())]
    scope = {"type": "http", "method": "POST", "path": path, "headers": headers, "query_string": b""}
    scope |= {"scheme": "http", "server": ("127.0.0.1", 3000), "client": ("127.0.0.1", 5000)}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        pass

    call = FULL_CALL if full else OpenTelemetryMiddleware.__call__
    asyncio.run(call(middleware, scope, receive, send))
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing left attached
    return seen


def exported(**options: Any) -> list[str]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    serve_one(provider, **options)
    return [span.name for span in exporter.get_finished_spans()]


def test_without_the_default_every_chunk_is_a_span() -> None:
    assert sum(name.endswith("send") for name in exported(exclude_spans=[])) == 7


def test_the_request_span_stays_and_chunk_spans_go() -> None:
    tune_request_tracing()  # idempotent
    names = exported()
    assert len(names) == 1 and "POST" in names[0], names


@pytest.mark.parametrize("rate", [0.0, 1.0], ids=["sampled-out", "sampled-in"])
@pytest.mark.parametrize("caller", [None, "01", "00"], ids=["no-caller", "caller-sampled", "caller-not"])
def test_unrecorded_the_span_context_is_the_full_middlewares(rate: float, caller: str | None) -> None:
    """BentoML's default: a sampler, no span processor. Log lines read the current span's trace id
    and sampled flag: the same as the full middleware's (span ids are fresh in both)."""
    provider = TracerProvider(sampler=ParentBasedTraceIdRatio(rate))
    traceparent = None if caller is None else f"00-{CALLER_TRACE:032x}-{CALLER_SPAN:016x}-{caller}"
    light = serve_one(provider, traceparent=traceparent)
    full = serve_one(provider, full=True, traceparent=traceparent)
    assert len(light) == len(full) == 7
    assert len({id(span) for span, _ in light}) == 1  # one span for the whole request
    (ours_span, ours_recording), (theirs_span, theirs_recording) = light[0], full[0]
    ours, theirs = ours_span.get_span_context(), theirs_span.get_span_context()
    sampled = caller == "01" or (caller is None and rate == 1.0)
    assert ours.is_valid and not ours.is_remote and not theirs.is_remote
    assert ours.trace_flags == theirs.trace_flags and ours.trace_flags.sampled == sampled
    assert ours_recording == theirs_recording == sampled
    if caller is None:
        assert ours.trace_id != theirs.trace_id  # each a fresh trace
    else:
        assert ours.trace_id == theirs.trace_id == CALLER_TRACE
    assert ours.span_id not in (CALLER_SPAN, theirs.span_id)
    if sampled:  # what is built only to be dropped: the request's attributes
        assert "http.method" in theirs_span.attributes and not ours_span.attributes


def test_a_span_processor_or_a_meter_provider_brings_the_full_middleware_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    provider = TracerProvider(sampler=ParentBasedTraceIdRatio(1.0))

    def attributes() -> Any:
        return serve_one(provider)[0][0].attributes

    assert not attributes()
    monkeypatch.setattr(metrics_state, "_METER_PROVIDER", NoOpMeterProvider())  # as set_meter_provider
    assert "http.method" in attributes()
    monkeypatch.undo()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # after the app was built: still seen
    assert "http.method" in attributes()
    assert len(exporter.get_finished_spans()) == 1


def test_excluded_urls_get_no_span_either_way() -> None:
    provider = TracerProvider(sampler=ParentBasedTraceIdRatio(1.0))
    for full in (False, True):
        seen = serve_one(provider, full=full, path="/readyz", excluded_urls=ExcludeList(["readyz"]))
        assert seen[0][0] is trace.INVALID_SPAN


def test_the_server_request_hook_gets_the_request_span_either_way() -> None:
    """BentoML's hook sets its request id (its X-BentoML-Request-ID header) from the request span:
    the light middleware calls it with that span, as the full one does."""
    provider = TracerProvider(sampler=ParentBasedTraceIdRatio(1.0))
    for full in (False, True):
        hooked: list[tuple[Any, str]] = []

        def hook(span: Any, scope: Any, hooked: list[tuple[Any, str]] = hooked) -> None:
            hooked.append((span, scope["path"]))

        seen = serve_one(provider, full=full, server_request_hook=hook)
        assert [(span.get_span_context().span_id, path) for span, path in hooked] == [
            (seen[0][0].get_span_context().span_id, "/generate")
        ], full
        assert hooked[0][0].name == "POST /generate"  # the light middleware's name is kept per path


def test_excluded_urls_are_decided_as_the_full_middleware_does_by_path_and_host() -> None:
    """The light middleware remembers each (scheme, server, path, Host) decision: the same paths
    with another Host, asked again in another order, are still decided as the full middleware
    decides them (the exclusions are searched in the whole URL, host included)."""
    provider = TracerProvider(sampler=ParentBasedTraceIdRatio(1.0))
    excluded = ExcludeList(["readyz", "internal[.]example"])
    cases = [
        ("/generate", b"api.example"),
        ("/generate", b"internal.example"),
        ("/readyz", b"api.example"),
        ("/generate", None),
        ("/v1/chat/completions", b"internal.example"),
    ]
    decisions = {}
    for full in (True, False, False):
        for path, host in cases if full else [*cases, *reversed(cases)]:
            headers = [(b"accept", b"*/*")] + ([(b"host", host)] if host else [])
            seen = serve_one(provider, full=full, path=path, headers=headers, excluded_urls=excluded)
            traced = seen[0][0] is not trace.INVALID_SPAN
            assert decisions.setdefault((path, host), traced) == traced, (path, host, full)
    assert [decisions[case] for case in cases] == [True, False, False, True, False]


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [(b"baggage", b"tenant=acme,tier=gold")],
        [(b"traceparent", f"00-{CALLER_TRACE:032x}-{CALLER_SPAN:016x}-01".encode()), (b"tracestate", b"k=v")],
    ],
    ids=["none", "baggage", "traceparent"],
)
def test_what_a_caller_propagates_is_in_the_request_context_as_with_the_full_middleware(
    headers: list[tuple[bytes, bytes]],
) -> None:
    from opentelemetry import baggage

    provider = TracerProvider(sampler=ParentBasedTraceIdRatio(0.0))
    seen: dict[str, Any] = {}

    def noting(key: str) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            context = trace.get_current_span().get_span_context()
            seen[key] = (dict(baggage.get_all()), context.trace_id, context.trace_state, context.trace_flags)

        return app

    serve_one(provider, headers=headers, app=noting("light"))
    serve_one(provider, headers=headers, app=noting("full"), full=True)
    light, full = seen["light"], seen["full"]
    assert light[0] == full[0]  # the baggage
    assert light[2:] == full[2:]  # trace state and flags
    if any(name == b"traceparent" for name, _ in headers):
        assert light[1] == full[1] == CALLER_TRACE
    if any(name == b"baggage" for name, _ in headers):
        assert light[0] == {"tenant": "acme", "tier": "gold"}
