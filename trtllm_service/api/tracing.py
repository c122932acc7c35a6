"""No OpenTelemetry span per streamed chunk: request spans stay, per-message spans go.

BentoML wraps every request in OpenTelemetry's ASGI middleware, which by default also opens a span
for every ASGI message the app sends: one per streamed chunk, so one per token for a client that
keeps up. Measured on a worker streaming at c=32, those spans took a quarter of its CPU, whether
tracing is exported or not. The middleware's own `exclude_spans` option drops exactly those
(the request's server span, its attributes and trace propagation stay); BentoML does not pass it,
so its default is set here, before BentoML builds the app.
"""

from __future__ import annotations

import functools
from typing import Any

_MARK = "_trtllm_excludes_message_spans"


def exclude_message_spans() -> None:
    """Makes OpenTelemetry's ASGI middleware skip send/receive spans unless told otherwise."""
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    original = OpenTelemetryMiddleware.__init__
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, exclude_spans: list[str] | None = None, **kwargs: Any) -> None:
        original(
            self,
            *args,
            exclude_spans=["receive", "send"] if exclude_spans is None else exclude_spans,
            **kwargs,
        )

    setattr(__init__, _MARK, True)
    OpenTelemetryMiddleware.__init__ = __init__  # type: ignore[method-assign]
