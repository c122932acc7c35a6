"""Changes to BentoML 1.4 that the service applies when it is imported: a leak fixed, a fast path,
the middlewares' order (`arrange_middlewares`).

BentoML's `TimeoutMiddleware` (the service's `traffic.timeout`) schedules a timer per request and
never cancels it: each request's context (its tracing span, scope and futures, about 5 KB) stays
alive until the timer fires, `traffic.timeout` seconds later. At 100 requests/s and our 600 s that
is 60,000 requests held, some 300 MB. Measured with bentoml 1.4.39: RSS +5 MB per 1,000 requests,
even on /livez, on a service with nothing of ours in it. The fix cancels the timer as soon as the
response starts (the only thing it guards) or the request ends.

Each patch names what it replaces; all were read against bentoml 1.4.40's source (its changes since
1.4.39 are in the Dockerfile templates, archive import and file utilities, none of it patched here).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("trtllm_service")


def cancel_request_timers() -> None:
    """Replaces `TimeoutMiddleware.__call__` with one that cancels its timer; same behaviour else,
    but its 504 in the service's error shape."""
    from bentoml._internal.server.http import traffic
    from starlette.responses import JSONResponse

    from trtllm_service.errors import APIError

    middleware = traffic.TimeoutMiddleware
    if getattr(middleware, "_cancels_timers", False):
        return

    async def __call__(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        timer = loop.call_later(self.timeout, self._set_timer_out, waiter)

        async def _send(message: Any) -> None:
            if not waiter.done():
                waiter.set_result(None)
                timer.cancel()
            await send(message)

        task = asyncio.ensure_future(self.app(scope, receive, _send), loop=loop)
        try:
            try:
                await waiter
            except asyncio.TimeoutError:
                if task.cancel():
                    error = APIError.timeout(f"Not able to process the request in {self.timeout} seconds")
                    await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)
            else:
                await task
        finally:
            timer.cancel()

    middleware.__call__ = __call__  # type: ignore[method-assign]
    middleware._cancels_timers = True  # type: ignore[attr-defined]


def expose_server_send() -> None:
    """Wraps the ASGI app BentoML builds for a worker in `ServerSendApp`, outside every middleware.

    A streamed body chunk would otherwise pass through a dozen `send` wrappers (error handling,
    BentoML's metrics and access log, OpenTelemetry, the request timeout, ours, FastAPI's), none of
    which does anything with a chunk that is not the last; `StreamBody` sends those chunks to the
    server's own `send` and everything else, the response start and end among it, through the chain.
    """
    from _bentoml_sdk.service.factory import Service

    from trtllm_service.api.streaming import ServerSendApp

    if getattr(Service, "_exposes_server_send", False):
        return
    to_asgi = Service.to_asgi

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        return ServerSendApp(to_asgi(self, *args, **kwargs))

    Service.to_asgi = wrapped  # type: ignore[method-assign]
    Service._exposes_server_send = True  # type: ignore[attr-defined]


_ARRANGED = "_trtllm_arranged"


def arrange_middlewares(outermost: type, limiter: type) -> None:
    """Orders the ASGI middlewares BentoML 1.4 builds for a worker: `outermost` first, then
    BentoML's CORS, then the rest as BentoML has them; and leaves BentoML's `max_concurrency`
    middleware out where the service has its own `limiter`.

    BentoML puts the service's middlewares after its own and its CORS after the service's. Then a
    response made by BentoML's middlewares would lack the request id `outermost` adds, and the
    refusals of the service's middlewares (401, 413, 415, 429) would lack the CORS headers a browser
    needs to read them. BentoML's limiter counts the requests of one worker against
    `max_concurrency / workers` and answers `{"error": "Too many requests"}` ahead of the service's,
    which counts them across workers against the whole `max_concurrency`, in OpenAI's shape.
    """
    from _bentoml_impl.server.app import ServiceAppFactory
    from bentoml._internal.server.http.traffic import MaxConcurrencyMiddleware
    from starlette.middleware.cors import CORSMiddleware

    built = ServiceAppFactory.middlewares
    if getattr(built.fget, _ARRANGED, False):
        return

    def is_a(middleware: Any, cls: type) -> bool:
        return isinstance(middleware.cls, type) and issubclass(middleware.cls, cls)

    def middlewares(self: Any) -> list[Any]:
        found = list(built.fget(self))
        if any(is_a(m, limiter) for m in found):
            found = [m for m in found if not is_a(m, MaxConcurrencyMiddleware)]
        first = [m for m in found if is_a(m, outermost)] + [m for m in found if is_a(m, CORSMiddleware)]
        moved = {id(m) for m in first}
        return first + [m for m in found if id(m) not in moved]

    setattr(middlewares, _ARRANGED, True)
    ServiceAppFactory.middlewares = property(middlewares)  # type: ignore[method-assign,assignment]


def forbid_unknown_fields(input_model: Any) -> None:
    """Makes the pydantic model BentoML 1.4 builds from an API's signature (`apis[name].input_spec`)
    refuse fields it does not declare (it ignores them): a misspelt `max_new_tokens` is then a 400
    naming it, as on `/v1`, instead of a request served with the default."""
    if input_model.model_config.get("extra") == "forbid":
        return
    input_model.model_config["extra"] = "forbid"
    input_model.model_rebuild(force=True)


class ClientFaultLines(logging.Filter):
    """BentoML logs a client's bad input on `/generate` (a body that does not validate) as an ERROR
    with the whole pydantic traceback (`log_exception`); the client gets its 400 naming the field,
    so the log gets one WARNING line naming it too. Real errors pass as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        fault = client_fault(record.exc_info[1] if record.exc_info else None)
        if fault is not None:
            where = record.args if isinstance(record.args, tuple) and len(record.args) == 2 else ("?", "?")
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
            record.msg, record.args = "%s [%s]: the client's request was refused (%d): %s", (*where, *fault)
            record.exc_info, record.exc_text = None, None
        return True


def client_fault(exc: BaseException | None) -> tuple[int, str] | None:
    """(status, what was wrong in one line) when `exc` is a client's fault (a body that does not
    validate, or BentoML's own 4xx); None for anything else."""
    from bentoml.exceptions import BentoMLException
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return 400, "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'body'}: {error['msg']}"
            for error in exc.errors(include_url=False)[:5]
        )
    if isinstance(exc, BentoMLException) and 400 <= exc.error_code.value < 500:
        return exc.error_code.value, " ".join(str(exc).split())
    return None


class StartupPolls(logging.Filter):
    """Leaves out BentoML's access line of a request answered 503 while the service starts: clients
    poll until it is ready (`/livez`, `/readyz`, `/healthz` and `/metrics` are left out by BentoML's
    own `api_server.logging.access.skip_paths`). Once the service has served, every 503 is logged."""

    def __init__(self, starting: Callable[[], bool]) -> None:
        super().__init__()
        self.starting = starting

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and "status=503" in str(args[2]):
            return not self.starting()
        return True


def quiet_logs(starting: Callable[[], bool]) -> None:
    """Installs `ClientFaultLines` and `StartupPolls` on BentoML's loggers (once per worker)."""
    for name, kind, make in (
        ("bentoml._internal.server.http_app", ClientFaultLines, ClientFaultLines),
        ("bentoml.access", StartupPolls, lambda: StartupPolls(starting)),
    ):
        target = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in target.filters):
            target.addFilter(make())
