"""Changes to BentoML 1.4 that the service applies when it is imported: a leak fixed, a fast path,
the middlewares' order (`arrange_middlewares`), its metrics' labels bounded and directory its own,
bodies read strictly, our log lines where its own go (`share_bentoml_log_handlers`).

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
import atexit
import contextvars
import functools
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtllm_service.request_ids import RequestIdLogFilter

logger = logging.getLogger("trtllm_service")


def cancel_request_timers() -> None:
    """Replaces `TimeoutMiddleware.__call__` with one that cancels its timer once the response
    starts, and that runs the app in the request's own task. BentoML's runs the app in a task of its
    own and waits for a first message until its timer fires: a timer, a future and a task per
    request, and two turns of the event loop, one before the app starts and one after it ends (12-25
    us a request on 2 cores); an app that returns without sending anything is waited for until the
    timer fires (a request left behind for the whole timeout, which also holds up a graceful
    shutdown), and a cancel of the request's task (uvicorn's, past a graceful shutdown's time) left
    the app running. Same behaviour else: past the timeout without a first message, the app is
    cancelled and the client gets a 504, in the service's error shape."""
    from bentoml._internal.server.http import traffic
    from starlette.responses import JSONResponse

    from trtllm_service.errors import APIError

    middleware = traffic.TimeoutMiddleware
    if getattr(middleware, "_cancels_timers", False):
        return

    async def __call__(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        task = asyncio.current_task()
        assert task is not None  # an ASGI app runs in a task
        timed_out = False

        def time_out() -> None:
            nonlocal timed_out
            timed_out = True
            task.cancel()

        timer = asyncio.get_running_loop().call_later(self.timeout, time_out)
        started = False

        async def _send(message: Any) -> None:
            nonlocal started
            if not started:  # the response starts: nothing left to time
                started = True
                timer.cancel()
            await send(message)

        try:
            await self.app(scope, receive, _send)
        except asyncio.CancelledError:
            if not timed_out or _uncancel(task) > 0:  # (also) cancelled by someone else
                raise
        else:
            if not timed_out:
                return
            _uncancel(task)  # the app caught the timer's cancel and returned
            if started:  # with its own answer
                return
        finally:
            timer.cancel()
        error = APIError.timeout(f"Not able to process the request in {self.timeout} seconds")
        await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)

    middleware.__call__ = __call__  # type: ignore[method-assign]  # BentoML's, patched once (the mark below)
    middleware._cancels_timers = True  # type: ignore[attr-defined]  # our mark on BentoML's class


def _uncancel(task: asyncio.Task[Any]) -> int:
    """`Task.uncancel()` (Python 3.11+): takes back one cancel request, and says how many are left
    (another's cancel as well as ours). Python 3.10 counts none: 0, the cancel taken as ours."""
    uncancel = getattr(task, "uncancel", None)
    return int(uncancel()) if uncancel is not None else 0


_ENDPOINT_LABELLED = (
    "metrics_request_duration",
    "metrics_request_total",
    "metrics_request_in_progress",
    "metrics_websocket_connections",
    "metrics_websocket_data_received",
    "metrics_websocket_data_sent",
)
"""The metrics of BentoML's `RunnerTrafficMetricsMiddleware` labelled by `endpoint`."""


class _Relabelled:
    """One of BentoML's metrics whose labelled series are looked up once: by the route's bounded
    label in place of the path where the metric has an `endpoint` label (`labels` given), by the
    label values alone otherwise. prometheus_client's `labels()` checks and joins the label values
    under a lock on every call; BentoML calls it four times per request."""

    __slots__ = ("_children", "_labels", "_metric")

    def __init__(self, metric: Any, labels: Any = None) -> None:
        self._metric = metric
        self._labels = labels
        self._children: dict[tuple[Any, ...], Any] = {}

    def labels(self, *args: Any, **kwargs: Any) -> Any:
        if self._labels is not None:
            kwargs["endpoint"] = self._labels.of(kwargs["endpoint"])
        key = (*args, *kwargs.items())  # bounded: a route's label, a status, BentoML's fixed names
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._metric.labels(*args, **kwargs)
        return child


def bound_endpoint_labels() -> None:
    """Labels BentoML's traffic metrics (`bentoml_service_request_*`) by route, not by path, and
    looks each labelled series up once.

    `RunnerTrafficMetricsMiddleware` labels every request by its raw path: 2,000 requests for
    random paths made 2,032 `endpoint` labels, grew /metrics from 194 KB to 16 MB (a scrape took
    9 s) and the worker by 42 MB. Its metrics are wrapped once they exist (`_setup`) so that a
    path becomes the template of the route that serves it, or "other" (api/metrics.EndpointLabels);
    the routes are read from the app on the first request.
    """
    from bentoml._internal.server.http.instruments import RunnerTrafficMetricsMiddleware as middleware

    from trtllm_service.api.server.metrics import EndpointLabels

    if getattr(middleware, "_bounds_labels", False):
        return
    setup, call = middleware._setup, middleware.__call__

    def _setup(self: Any, *args: Any, **kwargs: Any) -> None:
        setup(self, *args, **kwargs)
        self._endpoint_labels = EndpointLabels()
        for name in _ENDPOINT_LABELLED:
            setattr(self, name, _Relabelled(getattr(self, name), self._endpoint_labels))
        self.metrics_last_request_timestamp = _Relabelled(self.metrics_last_request_timestamp)

    async def __call__(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if not self._is_setup:
            self._setup()
        labels = self._endpoint_labels
        if not labels.learnt and scope["type"] in ("http", "websocket"):
            labels.learn(scope.get("app"))
        await call(self, scope, receive, send)

    middleware._setup = _setup  # type: ignore[method-assign]  # BentoML's, patched once (the mark below)
    middleware.__call__ = __call__  # type: ignore[method-assign]  # BentoML's, patched once (the mark below)
    middleware._bounds_labels = True  # type: ignore[attr-defined]  # our mark on BentoML's class


def read_span_once_in_log_lines() -> None:
    """Replaces `TraceRecordFilter.filter` (on BentoML's log handler: every line a worker writes,
    the access line of each request among them) with one that writes the same fields and reads
    the current span once, and BentoML's trace and span id formats once per process.

    BentoML's reads the span three times (trace id, span id, sampled flag; each an OpenTelemetry
    context lookup and an ABC isinstance check) and its configuration container for the formats
    on every line: 15 us of the 52 us an access line costs hot, 157 of 290 us cold (2 cores,
    in-process). The access line is written after a response's last byte, ahead of whatever the
    worker does next: on a stream of requests, the next one's way to the engine.
    """
    from bentoml._internal import log
    from bentoml._internal.context import trace_context
    from opentelemetry import trace

    cls = log.TraceRecordFilter
    if getattr(cls.filter, "_reads_span_once", False):
        return
    original = cls.filter
    formats: list[tuple[str, str]] = []  # BentoML's (trace id, span id) formats, read at the first span

    def filter(self: Any, record: logging.LogRecord) -> bool | logging.LogRecord:
        if record.name in ("bentoml_monitor_data", "bentoml_monitor_schema"):
            return logging.Filter.filter(self, record)
        record.levelname_bracketed = f"[{record.levelname}]"
        record.component = f"[{log._component_name()}]"
        span = trace.get_current_span().get_span_context()
        trace_id = span.trace_id
        if trace_id in (0, None):
            record.trace_msg = ""
        else:
            if not formats:
                from bentoml._internal.configuration.containers import BentoMLContainer

                configured = BentoMLContainer.logging_formatting.get()
                formats.append((configured["trace_id"], configured["span_id"]))
            trace_format, span_format = formats[0]
            record.trace_msg = (
                f" (trace={format(trace_id, trace_format)},span={format(span.span_id, span_format)},"
                f"sampled={1 if span.trace_flags.sampled else 0},service.name={trace_context.service_name})"
            )
        record.request_id = trace_context.request_id
        record.service_name = trace_context.service_name
        return logging.Filter.filter(self, record)

    filter._reads_span_once = True  # type: ignore[attr-defined]  # our mark on the replacement
    filter.__wrapped__ = original  # type: ignore[attr-defined]  # BentoML's, which the tests compare with
    cls.filter = filter  # type: ignore[method-assign]  # BentoML's, patched once (the mark above)


ACCESS_LINE_DELAY_S = 0.005
"""How long after its response's end BentoML's access line for it is written: longer than a client
takes to send its next request on the connection (about 0.6 ms on 2 cores shared with the load
generator, less on the GPU box), shorter than an engine's first token (7 ms for the synthetic
engine on the box, tens of ms for a model)."""


class _DeferredLines:
    """BentoML's access logger, its `info` lines written `ACCESS_LINE_DELAY_S` later, in the
    request's context (its request id, its span), in the order they were logged; the lines of
    one turn of the loop go out together. Anything else goes to the logger as it is."""

    __slots__ = ("_logger", "_loop", "_pending", "_timer")

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._pending: list[tuple[contextvars.Context, str, tuple[Any, ...]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the timer's
        atexit.register(self.flush)  # a worker that stops writes what it holds

    def info(self, msg: str, *args: Any) -> None:
        if not self._logger.isEnabledFor(logging.INFO):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on the event loop: nothing to wait for
            self._logger.info(msg, *args)
            return
        self._pending.append((contextvars.copy_context(), msg, args))
        if self._timer is None or self._loop is not loop:  # (a loop that ended left its timer unfired)
            self._timer, self._loop = loop.call_later(ACCESS_LINE_DELAY_S, self.flush), loop

    def flush(self) -> None:
        """Writes every line held (the timer's callback; also at exit)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, []
        for context, msg, args in pending:
            context.run(self._logger.info, msg, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


def defer_access_lines() -> None:
    """Writes BentoML's access line of a request a few milliseconds after its response ended
    (`_DeferredLines`), not between the response's last byte and whatever the worker does next.

    BentoML's `AccessLogMiddleware` formats and writes the line right after the response's last
    chunk is sent, before the request's task lets the event loop go. A client that sends its next
    request on the connection as soon as it has the answer found the worker busy with the line:
    on the 16-core box the next request was read 0.42-0.46 ms after the last byte; on 2 cores the
    last byte's `send` came back to the response 0.30-0.35 ms after the byte with the line, 0.04-0.05
    ms with it deferred (bench/stacks' timeline). Deferred, the line is written while that request
    waits for the engine. Its fields do not change: the latency is measured when the last chunk is sent, and the
    line is written in the request's context. The logger's own filters (`StartupPolls`) see it when
    it is written: a 503 answered in the last 5 ms of start-up is logged.
    """
    from bentoml._internal.server.http.access import AccessLogMiddleware as middleware

    init = middleware.__init__
    if getattr(init, "_defers_lines", False):
        return
    lines: list[_DeferredLines] = []  # one per worker, shared by its middlewares

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if not lines:
            lines.append(_DeferredLines(self.logger))
        self.logger = lines[0]

    __init__._defers_lines = True  # type: ignore[attr-defined]  # our mark on the replacement
    middleware.__init__ = __init__  # type: ignore[method-assign]  # BentoML's, patched once (the mark above)


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
SERVE_DIR_PREFIX = "serve-"


def own_prometheus_dir() -> Path | None:
    """Gives this `bentoml serve` a Prometheus directory of its own, `<BentoML's>/serve-<its pid>`;
    the directory, or None in a worker (which finds it in PROMETHEUS_MULTIPROC_DIR).

    BentoML keeps every service's metrics in one directory under BENTOML_HOME and empties it when a
    service starts: a second service on the same home deleted the first one's files, and the first
    then served the second's series. `bentoml serve` imports the service before it prepares that
    directory, which is when this runs; directories of services no longer running are removed.
    """
    if MULTIPROC_ENV in os.environ:
        return None
    from bentoml._internal.configuration.containers import BentoMLContainer

    from tensorrtllm_backend.launcher import pid_alive

    shared = Path(BentoMLContainer.prometheus_multiproc_dir.get())
    for stale in shared.glob(f"{SERVE_DIR_PREFIX}*"):
        pid = stale.name.removeprefix(SERVE_DIR_PREFIX)
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    own = shared / f"{SERVE_DIR_PREFIX}{os.getpid()}"
    BentoMLContainer.prometheus_multiproc_dir.set(str(own))
    return own


def expose_server_send() -> None:
    """Wraps the ASGI app BentoML builds for a worker in `ServerSendApp`, outside every middleware.

    A streamed body chunk would otherwise pass through a dozen `send` wrappers (error handling,
    BentoML's metrics and access log, OpenTelemetry, the request timeout, ours, FastAPI's), none of
    which does anything with a chunk that is not the last; `StreamBody` sends those chunks to the
    server's own `send` and everything else, the response start and end among it, through the chain.
    """
    from _bentoml_sdk.service.factory import Service

    from trtllm_service.api.server.streaming import ServerSendApp

    if getattr(Service, "_exposes_server_send", False):
        return
    to_asgi = Service.to_asgi

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        return ServerSendApp(to_asgi(self, *args, **kwargs))

    Service.to_asgi = wrapped
    Service._exposes_server_send = True


_CALLERS = "_trtllm_api_callers"


def build_api_callers_once() -> None:
    """Replaces `APIMethod.__get__` (the descriptor `@bentoml.api` makes of a method) with one that
    builds a service instance's caller of the method once and keeps it on the instance.

    BentoML's reads the method's signature (`inspect.signature`) and wraps the method anew on each
    attribute access, and its HTTP endpoint reads `getattr(service, name).local` for every request:
    49 us of each /generate request on 2 cores, 300 of the 1,245 Python and C calls on its way to
    the engine (bench/ttft_breakdown.py's census), before the handler starts. What it builds depends
    only on the method, the instance and the instance's `__self_proxy__`, which BentoML sets on every
    served instance at start-up (its client of itself, whose method it returns, with `local`): it
    is built again when that proxy changes.
    """
    from _bentoml_sdk.method import APIMethod

    get = APIMethod.__get__
    if getattr(get, "_trtllm_once", False):
        return

    def __get__(self: Any, instance: Any, owner: type) -> Any:
        if instance is None or not hasattr(instance, "__dict__"):
            return get(self, instance, owner)
        proxy = getattr(instance, "__self_proxy__", None)
        callers = instance.__dict__.setdefault(_CALLERS, {})
        built = callers.get(self.name)
        if built is None or built[0] is not proxy:
            built = callers[self.name] = (proxy, get(self, instance, owner))
        return built[1]

    __get__._trtllm_once = True  # type: ignore[attr-defined]  # our mark on the replacement
    APIMethod.__get__ = __get__  # BentoML's, patched once (the mark above)
    _lean_local_calls(APIMethod)


def _lean_local_calls(api_method: Any) -> None:
    """Replaces `APIMethod._local_call` (the caller BentoML's HTTP endpoint calls, `.local`) with
    one that fills the same defaults with less work per call.

    BentoML's fills in the defaults of parameters declared with pydantic's `Field` that a call
    leaves out, and checks every parameter on every call to find them: two calls per parameter,
    30 of the 142 Python and C calls /generate's endpoint makes per request (15 parameters, none
    declared with `Field`; bench/ttft_breakdown.py's census). This one lists the parameters whose
    `Field` has a default once, when the caller is built, and checks only those. What it returns
    is BentoML's in all else: its signature, `func` and mark.
    """
    import inspect

    from pydantic.fields import FieldInfo
    from pydantic_core import PydanticUndefined

    built = api_method._local_call
    if getattr(built, "_trtllm_lean", False):
        return

    def _local_call(self: Any, instance: Any) -> Callable[..., Any]:
        bentomls = built(self, instance)
        func = self.func
        # (position, name, default, default factory) of the parameters whose Field has a default
        defaults: list[tuple[int, str, Any, Callable[[], Any]]] = []
        for position, param in enumerate(inspect.signature(bentomls).parameters.values()):
            field = param.default
            if isinstance(field, FieldInfo) and (
                field.default is not PydanticUndefined
                or field.default_factory not in (None, PydanticUndefined)
            ):
                defaults.append((position, param.name, field.default, field.default_factory))  # type: ignore[arg-type]  # a factory of no arguments where the default is unset (BentoML calls it so)

        @functools.wraps(func)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            for position, name, default, factory in defaults:
                if position < len(args) or name in kwargs:
                    continue  # given
                kwargs[name] = default if default is not PydanticUndefined else factory()
            return func(instance, *args, **kwargs)

        wrapped.__signature__ = bentomls.__signature__  # type: ignore[attr-defined]  # as BentoML's sets it
        wrapped.__is_bentoml_api_func__ = True  # type: ignore[attr-defined]  # BentoML's mark
        wrapped.func = func  # type: ignore[attr-defined]  # as BentoML's (inspect reads it like a partial's)
        return wrapped

    _local_call._trtllm_lean = True  # type: ignore[attr-defined]  # our mark on the replacement
    _local_call.bentomls = built  # type: ignore[attr-defined]  # BentoML's, which the tests compare it with
    api_method._local_call = _local_call


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
    ServiceAppFactory.middlewares = property(middlewares)


def read_strictly(input_model: Any) -> None:
    """Makes the pydantic model BentoML 1.4 builds from an API's signature (`apis[name].input_spec`)
    read a body as `/v1`'s models do: a field it does not declare is refused (BentoML ignores it),
    so a misspelt `max_new_tokens` is a 400 naming it instead of a request served with the default;
    and no value is coerced (BentoML's lax mode takes `"10"` and `true` as numbers). Its schema is
    written in the OpenAPI 3.0 dialect of the service's document, as /v1's bodies are."""
    from trtllm_service.api.server.openapi30 import openapi30_tree

    config = input_model.model_config
    if config.get("extra") == "forbid" and config.get("strict"):
        return
    config["extra"] = "forbid"
    config["strict"] = True
    config["json_schema_extra"] = openapi30_tree  # /v1's ranges (exclusive bounds) in OpenAPI 3.0's words
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


def share_bentoml_log_handlers(target: logging.Logger) -> None:
    """Our INFO lines go where BentoML's own log lines go, at BentoML's level when it is lower
    (`bentoml serve --debug`: Triton's own output too); every line written while a request is
    served, BentoML's access log line among them, starts with `[request_id=...]`.

    BentoML configures its loggers when the worker starts; ours would otherwise reach only the
    root logger, which shows warnings and errors alone.
    """
    source = logging.getLogger("bentoml")
    if target.handlers or not source.handlers:
        return
    target.setLevel(min(logging.INFO, source.getEffectiveLevel()))
    for handler in source.handlers:
        if not any(isinstance(f, RequestIdLogFilter) for f in handler.filters):
            handler.addFilter(RequestIdLogFilter())
        target.addHandler(handler)
    target.propagate = False


def generation_routes_first(direct: type) -> None:
    """BentoML's app tries its routes in the order it added them: its probes, `/metrics`, the API's
    own routes, `/schema.json`, then the mounted apps. A chat request was matched against six routes
    before `/v1`'s mount, whose passive match then tried `/v1`'s routes one by one until one took
    it: 104 Python and C calls on its way to the engine (bench/ttft_breakdown.py's census), about a
    tenth of them. `routes_first` reorders the routes the factory built; the answers stay the same.
    `direct`: the class of the mounted apps that serve their body routes directly (`BodyRoutesApp`,
    with its `body_endpoint`).
    """
    from _bentoml_impl.server.app import ServiceAppFactory

    build = ServiceAppFactory.__call__
    if getattr(build, "_routes_first", False):
        return

    @functools.wraps(build)
    def __call__(self: Any) -> Any:
        app = build(self)
        app.router.routes[:] = routes_first(app.router.routes, direct)
        return app

    __call__._routes_first = True  # type: ignore[attr-defined]  # our mark on the replacement
    ServiceAppFactory.__call__ = __call__  # BentoML's, patched once (the mark above)


def routes_first(routes: list[Any], direct: type) -> list[Any]:
    """`routes` with the generation routes ahead of the plain routes BentoML put before them, where
    that cannot change which route takes a request: the leading routes with literal paths (probes,
    `/metrics`) are each matched by one path only, which no moved route matches. Moved: the POST
    routes among them (the API's, `/generate`), then the first passive mount of a `direct` app
    (`/v1`'s `BodyRoutesApp`) right after them, as a `BodyRoutesMount` (`body_routes_mount`).
    Everything else keeps its place."""
    from _bentoml_impl.server.mount import PassiveMount
    from starlette.routing import Route

    lead = 0  # the leading routes with literal paths
    while lead < len(routes) and type(routes[lead]) is Route and not routes[lead].param_convertors:
        lead += 1
    literal = routes[:lead]
    paths = [route.path for route in literal]
    posts = [r for r in literal if "POST" in (r.methods or ()) and paths.count(r.path) == 1]
    others = [r for r in literal if r not in posts]
    rest = routes[lead:]
    mount: Any = rest[0] if rest else None
    if (
        type(mount) is PassiveMount
        and isinstance(mount.app, direct)
        and not any(path == mount.path or path.startswith(mount.path + "/") for path in paths)
    ):
        moved = body_routes_mount()(mount.path, app=mount.app, name=mount.name)
        return [*posts, moved, *others, *rest[1:]]
    return [*posts, *others, *rest]


@functools.cache
def body_routes_mount() -> type:
    """`BodyRoutesMount`, defined on first use (BentoML's server package takes a second to import)."""
    from _bentoml_impl.server.mount import PassiveMount
    from starlette._utils import get_route_path
    from starlette.routing import Match, Mount

    class BodyRoutesMount(PassiveMount):
        """BentoML's passive mount of an app with `body_endpoint` (`BodyRoutesApp`): a POST to one
        of the app's body routes is its at once (the passive match would try the app's routes in
        turn until that route took it); anything else is matched as before."""

        def matches(self, scope: Any) -> tuple[Match, Any]:
            if scope["type"] == "http" and scope.get("method") == "POST":
                match, child = Mount.matches(self, scope)
                if match is Match.FULL:
                    within = get_route_path(scope)[
                        len(child["root_path"]) - len(scope.get("root_path", "")) :
                    ]
                    if self.app.body_endpoint(within) is not None:
                        return match, child
            return super().matches(scope)

    return BodyRoutesMount
