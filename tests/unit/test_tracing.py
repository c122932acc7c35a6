"""OpenTelemetry's ASGI middleware, as BentoML builds it, keeps request spans and drops per-chunk ones."""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trtllm_service.api.tracing import exclude_message_spans


async def streaming_app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for _ in range(5):
        await send({"type": "http.response.body", "body": b"token", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def spans_of_one_request(**options: Any) -> list[str]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    middleware = OpenTelemetryMiddleware(
        streaming_app, tracer_provider=provider, **options
    )  # as BentoML does
    scope = {"type": "http", "method": "POST", "path": "/generate", "headers": [], "query_string": b""}
    scope |= {"scheme": "http", "server": ("127.0.0.1", 3000), "client": ("127.0.0.1", 5000)}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        pass

    asyncio.run(middleware(scope, receive, send))
    return [span.name for span in exporter.get_finished_spans()]


def test_without_the_default_every_chunk_is_a_span() -> None:
    names = spans_of_one_request(exclude_spans=[])
    assert sum(name.endswith("send") for name in names) == 7


def test_the_request_span_stays_and_chunk_spans_go() -> None:
    exclude_message_spans()
    exclude_message_spans()  # idempotent
    names = spans_of_one_request()
    assert len(names) == 1 and "POST" in names[0], names
