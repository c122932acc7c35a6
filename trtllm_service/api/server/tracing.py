"""OpenTelemetry around each request: what BentoML's ASGI middleware costs, cut to what is read.

BentoML wraps every request in OpenTelemetry's ASGI middleware. Two things are tuned here, before
BentoML builds the app:

* No span per ASGI message. By default the middleware also opens a span for every message the app
  sends: one per streamed chunk, so one per token for a client that keeps up (a quarter of a
  worker's CPU at c=32, exported or not). Its own `exclude_spans` option drops exactly those;
  BentoML does not pass it, so its default is set here.
* Only the span's identity when nothing records spans. Unless `tracing.exporter_type` is set (or
  code adds a span processor, or sets a meter provider), a request's span, its attributes, its
  duration histograms and its status are built and thrown away: 0.15-0.25 ms per request on 2 cores,
  before the request reaches the handler (bench/ttft_breakdown.py). What is still read is the
  current span's context: BentoML's log lines show its trace id, span id and sampled flag, and
  code may propagate it. So then the middleware only starts the span, as the full one does (the
  configured propagators read an incoming `traceparent`; the tracer's sampler and id generator do
  the rest; a sampler that reads the request's attributes sees none, BentoML's does not): no
  attributes, no metrics, no wrapped `send` (the server request hook runs, as in the full one:
  BentoML's sets the request id it answers in `X-BentoML-Request-ID`). As soon as a span processor
  or a meter provider is there, each request goes the full way again. A request that carries none of the
  configured propagators' headers (`traceparent`, `tracestate`, `baggage` by default) is not
  handed to them: they would each look for their headers among all of its own (about 50 of the 177
  Python and C calls this step made per request, bench/ttft_breakdown.py's census) to give what
  a request without them gets, an empty context.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_MARK = "_trtllm_tuned"


def tune_request_tracing() -> None:
    """Patches OpenTelemetry's ASGI middleware as the module docstring says (idempotent)."""
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    original_init = OpenTelemetryMiddleware.__init__
    if getattr(original_init, _MARK, False):
        return
    original_call = OpenTelemetryMiddleware.__call__

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("exclude_spans") is None:
            kwargs["exclude_spans"] = ["receive", "send"]
        original_init(self, *args, **kwargs)

    @functools.wraps(original_call)
    async def __call__(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not _recorded(self.tracer) and _outermost():
            await _with_span_context(self, scope, receive, send)
        else:
            await original_call(self, scope, receive, send)

    setattr(__init__, _MARK, True)
    OpenTelemetryMiddleware.__init__ = __init__  # type: ignore[method-assign]  # OpenTelemetry's, patched once
    OpenTelemetryMiddleware.__call__ = __call__  # type: ignore[method-assign]  # OpenTelemetry's, patched once


def _recorded(tracer: Any) -> bool:
    """Whether anything may read what the full middleware records: a span processor on the
    tracer's provider, or a meter provider set for its metrics (True when unsure)."""
    processors = getattr(getattr(tracer, "span_processor", None), "_span_processors", None)
    if processors is None or processors:
        return True
    return getattr(_otel().metrics_state, "_METER_PROVIDER", True) is not None


def _outermost() -> bool:
    """No span is current (the full middleware would start a server span, not an internal one)."""
    otel = _otel()
    return otel.get_current_span() is otel.INVALID_SPAN


async def _with_span_context(middleware: Any, scope: Any, receive: Any, send: Any) -> None:
    """Runs the app in the span the full middleware would start (the tracer's own start_span: the
    same ids, flags and sampling), without its attributes, metrics, status or message wrappers."""
    otel = _otel()
    app = middleware.app
    if not otel.is_http_instrumentation_enabled():
        return await app(scope, receive, send)
    fields = _propagated_headers(otel.get_global_textmap())
    propagated, host, wanted = fields is None, None, fields or _NO_FIELDS
    for name, value in scope["headers"]:  # one pass, no calls: ASGI's header names are lower case
        if name == b"host":
            host = host or value
        elif name in wanted:
            propagated = True
    excluded = middleware.excluded_urls
    if excluded and _excluded(excluded, scope, host, otel):
        return await app(scope, receive, send)
    # the configured propagators (traceparent), or what they give a request without their headers
    parent = otel.extract(scope, getter=otel.asgi_getter) if propagated else otel.Context()
    span = middleware.tracer.start_span(_span_name(middleware, scope), context=parent, kind=otel.SERVER)
    token = otel.attach(otel.set_span_in_context(span, parent))
    try:
        hook = middleware.server_request_hook  # BentoML's sets its request id (X-BentoML-Request-ID)
        if hook is not None:
            hook(span, scope)
        await app(scope, receive, send)
    finally:
        otel.detach(token)
        span.end()  # nothing records it: the exception and status use_span would set go nowhere


@functools.cache
def _otel() -> Any:
    """What `_with_span_context` calls, imported once (not per request)."""
    from types import SimpleNamespace

    from opentelemetry import context, trace
    from opentelemetry.instrumentation.asgi import (
        asgi_getter,
        get_default_span_details,
        get_host_port_url_tuple,
    )
    from opentelemetry.instrumentation.utils import is_http_instrumentation_enabled
    from opentelemetry.metrics import _internal as metrics_state
    from opentelemetry.propagate import extract, get_global_textmap

    return SimpleNamespace(
        Context=context.Context,
        INVALID_SPAN=trace.INVALID_SPAN,
        SERVER=trace.SpanKind.SERVER,
        asgi_getter=asgi_getter,
        attach=context.attach,
        detach=context.detach,
        extract=extract,
        get_current_span=trace.get_current_span,
        get_default_span_details=get_default_span_details,
        get_global_textmap=get_global_textmap,
        get_host_port_url_tuple=get_host_port_url_tuple,
        is_http_instrumentation_enabled=is_http_instrumentation_enabled,
        metrics_state=metrics_state,
        set_span_in_context=trace.set_span_in_context,
    )


def _span_name(middleware: Any, scope: Any) -> str:
    """The span's name, from the middleware's `default_span_details`; OpenTelemetry's own (method
    and path, the method checked against the environment's list: 10 calls) is taken once per method
    and path."""
    details = middleware.default_span_details
    if details is not _otel().get_default_span_details:
        return details(scope)[0]
    return _kept(_NAMES, (scope["method"], scope["path"]), lambda: details(scope)[0])


def _excluded(excluded: Any, scope: Any, host: bytes | None, otel: Any) -> bool:
    """Whether OpenTelemetry's excluded URLs (BentoML's `tracing.excluded_urls`) take the request's
    URL, decided once per scheme, server, path and Host header: the URL is built from the request's
    headers, each decoded, before one regex search (25 calls per request)."""
    server = scope.get("server")
    key = (scope.get("scheme"), tuple(server) if server.__class__ is list else server, scope["path"], host)
    return _kept(_EXCLUDED, key, lambda: bool(excluded.url_disabled(otel.get_host_port_url_tuple(scope)[2])))


_NAMES: dict[tuple[Any, ...], Any] = {}
_EXCLUDED: dict[tuple[Any, ...], Any] = {}
_KEPT = 4096
_NO_FIELDS: frozenset[bytes] = frozenset()


def _kept(cache: dict[tuple[Any, ...], Any], key: tuple[Any, ...], compute: Callable[[], Any]) -> Any:
    """`cache[key]`, computed the first time; any path may come, so a full cache starts again."""
    value = cache.get(key)
    if value is None:
        value = compute()
        if len(cache) >= _KEPT:
            cache.clear()
        cache[key] = value
    return value


_FIELDS: list[tuple[Any, frozenset[bytes] | None]] = []  # (the global propagator, its header names)


def _propagated_headers(propagator: Any) -> frozenset[bytes] | None:
    """The request headers `propagator` reads, as ASGI names them (None: it does not say which)."""
    if not _FIELDS or _FIELDS[0][0] is not propagator:
        names = frozenset(str(name).lower().encode("latin-1") for name in propagator.fields or ())
        _FIELDS[:] = [(propagator, names or None)]
    return _FIELDS[0][1]
