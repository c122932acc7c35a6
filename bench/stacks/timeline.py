"""Benchmark-only: timestamps along one request's path to its first token, in a service worker.

Imported by this folder's sitecustomize when $BENCH_TIMELINE names a directory. The service's
modules (and the ASGI middlewares BentoML stacks around it) are wrapped as they are imported, so no
line of the service changes: each wrapped call appends (label, time) to the request's list, kept in a
context variable set where the request enters (ServerSendApp, the outermost ASGI app). The Triton
response that carries the first token arrives outside the request's context; it is matched to the
request through its stream. SIGRTMIN+7 appends, per label sequence, the median of each step to
$BENCH_TIMELINE/<pid>.txt as JSON lines, and starts over.

A request's end is timed too, from its response's last byte (the server's `send` of the body's end):
each middleware's return, the response's own steps, and the next request's entry, which at one
stream is what a client's next request waits for. SIGRTMIN+7 (or every $BENCH_TIMELINE_EVERY
requests, for bench/relay.py, which sends no signal) appends their medians, in ms after the last
byte, to $BENCH_TIMELINE/<pid>.end.

With $BENCH_TIMELINE_FINE set, the handler's steps to the engine are marked too: the sampling
parameters read, the chat template rendered, the request's turn in the service's queue, the engine
message built, and OpenTelemetry's span started.

With $BENCH_TIMELINE_CALLS set too, the loop's thread counts the Python and C functions each step
calls (sys.setprofile: the timings of such a run mean nothing), by file or C function (by
function with $BENCH_TIMELINE_CALLS=functions; the 25 most called per step, or
$BENCH_TIMELINE_TOP), and SIGRTMIN+7 appends them per request to $BENCH_TIMELINE/<pid>.calls. A step's way cold is roughly proportional
to its calls: on 2 cores, about 1 us each after an idle pause (bench/ttft_breakdown.py copies the
file to its output folder as calls-<label>.jsonl).
"""

from __future__ import annotations

import contextvars
import functools
import importlib.abc
import importlib.util
import json
import os
import signal
import statistics
import sys
import time
from typing import Any

_MARKS: contextvars.ContextVar[list[tuple[str, float]] | None] = contextvars.ContextVar("marks", default=None)
_STREAMS: dict[int, list[tuple[str, float]]] = {}  # id(engine stream) -> its request's marks
_DONE: list[list[tuple[str, float]]] = []
_ENDS: contextvars.ContextVar[list[tuple[str, float]] | None] = contextvars.ContextVar("ends", default=None)
_END_TIMES: dict[str, list[float]] = {}  # what happened after a request's last byte -> ms, per request
_LAST_BYTE = [0.0]  # the last response's last byte, in this worker

MIDDLEWARES = {  # module -> ASGI classes whose entry is marked (outermost first, as BentoML stacks them)
    "trtllm_service.request_ids": ["RequestIdMiddleware"],
    "bentoml._internal.server.http.instruments": [
        "HTTPTrafficMetricsMiddleware",
        "RunnerTrafficMetricsMiddleware",
    ],
    "opentelemetry.instrumentation.asgi": ["OpenTelemetryMiddleware"],
    "bentoml._internal.server.http.access": ["AccessLogMiddleware"],
    "starlette.middleware.cors": ["CORSMiddleware"],
    "bentoml._internal.server.http.traffic": ["TimeoutMiddleware"],
    "trtllm_service.api.server.error_shape": ["ErrorShapeMiddleware"],
    "trtllm_service.api.server.limits": ["ConcurrencyLimitMiddleware", "BodyLimitMiddleware"],
    "trtllm_service.api.server.admission": ["AdmissionMiddleware"],
    "trtllm_service.api.app": ["V1NotFoundMiddleware"],
    "_bentoml_impl.server.app": ["ContextMiddleware"],
    "starlette.routing": ["Router"],
    "fastapi.applications": ["FastAPI"],
}


# $BENCH_TIMELINE_CALLS: (step, file, function or C function) -> calls
_CALLS: dict[tuple[str, str], int] = {}
_STEP: list[str | None] = [None]  # the step the loop's thread is in: the last mark's label


def _where(path: str) -> str:
    for anchor in ("site-packages/", "trtllm_service/", "lib/python3"):
        at = path.find(anchor)
        if at >= 0:
            rest = path[at + len(anchor) :]
            return rest if anchor != "lib/python3" else "stdlib:" + rest.split("/", 1)[-1]
    return path


def _count(frame: Any, event: str, arg: Any) -> None:
    step = _STEP[0]
    if step is None:
        return
    if event == "call":
        key = _where(frame.f_code.co_filename)
        if os.environ.get("BENCH_TIMELINE_CALLS") == "functions":
            key = f"{key}:{frame.f_code.co_qualname}"
    elif event == "c_call":
        module = getattr(arg, "__module__", None)
        name = getattr(arg, "__qualname__", "?")
        key = f"C:{name}" if module in (None, "builtins") else f"C:{module}"
    else:
        return
    _CALLS[(step, key)] = _CALLS.get((step, key), 0) + 1


def mark(label: str) -> None:
    marks = _MARKS.get()
    if marks is not None:
        marks.append((label, time.perf_counter()))
        if _COUNTING:
            _STEP[0] = None if label == "written" else label


_COUNTING = bool(os.environ.get("BENCH_TIMELINE_CALLS"))


def end_mark(label: str) -> None:
    ends = _ENDS.get()
    if ends is not None:
        ends.append((label, time.perf_counter()))


def _on_entry(fn: Any, label: str) -> Any:
    @functools.wraps(fn)
    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        mark(label)
        try:
            return await fn(*args, **kwargs)
        finally:
            end_mark(f"{label} returned")

    return wrapped


def _on_exit(fn: Any, label: str) -> Any:
    if getattr(fn, "__code__", None) is not None and fn.__code__.co_flags & 0x80:  # a coroutine function

        @functools.wraps(fn)
        async def wrapped_async(*args: Any, **kwargs: Any) -> Any:
            result = await fn(*args, **kwargs)
            mark(label)
            return result

        return wrapped_async

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        mark(label)
        return result

    return wrapped


def _patch(module: Any) -> None:
    name = module.__name__
    for cls_name in MIDDLEWARES.get(name, []):
        cls = getattr(module, cls_name, None)
        if cls is not None:
            cls.__call__ = _on_entry(cls.__call__, cls_name)
    if name == "trtllm_service.api.server.streaming":
        _patch_streaming(module)
    elif name == "trtllm_service.api.generation.sse_frames":
        module.SSEFraming.done = _around(module.SSEFraming.done, "framing done")
    elif name == "trtllm_service.api.generation.bodies":
        module.serve_body = _on_entry(module.serve_body, "handler")
        module.parse_request = _on_exit(module.parse_request, "parsed")
    elif name == "trtllm_service.api.generate.serving":
        if hasattr(module, "first_text"):  # before the response read the first text itself
            module.first_text = _on_exit(module.first_text, "first text")
        module.serve_generate = _on_entry(module.serve_generate, "handler")
        if hasattr(module, "TextFraming"):
            module.TextFraming.done = _around(module.TextFraming.done, "framing done")
    elif name == "_bentoml_impl.server.app":
        factory = module.ServiceAppFactory
        factory.api_endpoint_wrapper = _on_entry(factory.api_endpoint_wrapper, "endpoint")
    elif name == "trtllm_service.api.openai.serving" and hasattr(module.OpenAIServing, "_start"):
        module.OpenAIServing._start = _on_exit(module.OpenAIServing._start, "first text")  # before issue 36
    elif name in ("trtllm_service.api.generation.serving", "trtllm_service.api.openai.completions.serving"):
        module.start_choices = _first_read(module.start_choices)  # where it is called
    elif name in ("trtllm_service.runtime", "trtllm_service.relay.runtime"):  # relay/ before issue 37
        for method in ("prepare_chat", "prepare_prompts"):
            setattr(module.Runtime, method, _on_exit(getattr(module.Runtime, method), "prepared"))
    elif name == "trtllm_service.relay.grpc_http2":
        module.GrpcConnection.start_call = _on_exit(module.GrpcConnection.start_call, "request sent")
    elif name == "trtllm_service.relay.client":
        _patch_client(module)
    if os.environ.get("BENCH_TIMELINE_FINE"):
        _patch_fine(module)


def _patch_fine(module: Any) -> None:
    """$BENCH_TIMELINE_FINE: the steps inside the handler's way to the engine, marked too."""
    name = module.__name__
    if name == "trtllm_service.api.generation.serving":
        for method, label in (("begin", "begun"), ("params", "params")):
            setattr(
                module.GenerationServing, method, _on_exit(getattr(module.GenerationServing, method), label)
            )
    elif name == "trtllm_service.chat.template":
        module.PromptFormatter.render = _on_exit(module.PromptFormatter.render, "rendered")
    elif name == "trtllm_service.api.generation.choices":
        module.wait_turn = _on_exit(module.wait_turn, "turn")
    elif name == "trtllm_service.relay.flavors":
        for cls in (module.EnsembleFlavor, module.LLMAPIFlavor):
            cls.message = _on_exit(cls.message, "message built")
    elif name == "trtllm_service.api.server.tracing":
        module._with_span_context = _on_entry(module._with_span_context, "OpenTelemetry")


def _around(fn: Any, label: str) -> Any:
    """A plain method, its start and return marked after the last byte."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        end_mark(f"{label} starts")
        try:
            return fn(*args, **kwargs)
        finally:
            end_mark(f"{label} returned")

    return wrapped


def _patch_streaming(module: Any) -> None:
    outermost = module.ServerSendApp.__call__

    async def entered(self: Any, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await outermost(self, scope, receive, send)
            return
        now = time.perf_counter()
        _MARKS.set([("asgi", now)])
        if _COUNTING:
            if sys.getprofile() is None:
                sys.setprofile(_count)
            _STEP[0] = "asgi"
            _CALLS[("requests", "")] = _CALLS.get(("requests", ""), 0) + 1
        if _LAST_BYTE[0]:
            _END_TIMES.setdefault("next request entered", []).append((now - _LAST_BYTE[0]) * 1e3)
        ends: list[tuple[str, float]] = []
        _ENDS.set(ends)

        async def server_send(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                ends.append(("last byte", time.perf_counter()))

        await outermost(self, scope, receive, server_send)
        end_mark("request returned")
        last = next((t for label, t in ends if label == "last byte"), None)
        if last is None:
            return
        _LAST_BYTE[0] = last
        for label, t in ends:
            if t >= last and label != "last byte":
                _END_TIMES.setdefault(label, []).append((t - last) * 1e3)
        every = int(os.environ.get("BENCH_TIMELINE_EVERY", "0") or 0)
        if every and len(_END_TIMES.get("request returned", ())) >= every:
            _dump_ends()

    module.ServerSendApp.__call__ = entered
    until_disconnect = module.until_disconnect

    async def watched(receive: Any) -> None:
        try:
            await until_disconnect(receive)
        finally:
            end_mark("disconnect watch ended")

    module.until_disconnect = watched
    response = _on_entry(module.PushBody.__call__, "response")

    async def push_body(self: Any, scope: Any, receive: Any, send: Any) -> None:
        async def sending(message: Any) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                end_mark("last byte's send returned to the response")

        await response(self, scope, receive, sending)

    module.PushBody.__call__ = push_body
    if hasattr(module.PushBody, "_first_text"):  # the response reads the first text itself
        module.PushBody._first_text = _on_exit(module.PushBody._first_text, "first text")
    start = module.PushBody._start

    def started(self: Any) -> None:
        mark("started")
        start(self)
        mark("written")
        marks = _STREAMS.pop(id(self.stream), None)
        if marks is not None:
            _DONE.append(marks)

    module.PushBody._start = started


def _first_read(start_choices: Any) -> Any:
    """start_choices, marking "first text" where it returns the first texts read (not a lone
    streamed choice left `waiting` for its response to read it)."""

    @functools.wraps(start_choices)
    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        choices = await start_choices(*args, **kwargs)
        if not any(getattr(choice, "waiting", False) for choice in choices):
            mark("first text")
        return choices

    return wrapped


def _first_response_due(marks: list[tuple[str, float]]) -> bool:
    """The request was sent and its first response not yet marked (the response may have been
    entered in between, where it reads the first text itself)."""
    labels = [label for label, _ in marks]
    return "request sent" in labels and "first response" not in labels


def _patch_client(module: Any) -> None:
    start = module.TritonRelay.start

    async def started(self: Any, *args: Any, **kwargs: Any) -> Any:
        stream = await start(self, *args, **kwargs)
        marks = _MARKS.get()
        if marks is not None:
            _STREAMS[id(stream)] = marks
        return stream

    module.TritonRelay.start = started
    # one stream class since issue 37; the LLM API flavour's had its own before
    for cls in {module.EngineStream, getattr(module, "TextEngineStream", module.EngineStream)}:
        on_message = cls.on_message

        def first(self: Any, data: bytes, _on_message: Any = on_message) -> None:
            marks = _STREAMS.get(id(self))
            if marks is not None and _first_response_due(marks):
                marks.append(("first response", time.perf_counter()))
                if _COUNTING:  # the first response's own work is on the way, not the engine's wait
                    _STEP[0] = "first response"
            _on_message(self, data)

        cls.on_message = first


_WANTED = frozenset(
    {
        *MIDDLEWARES,
        "trtllm_service.api.server.streaming",
        "trtllm_service.api.generation.bodies",
        "trtllm_service.api.generation.sse_frames",
        "trtllm_service.api.generate.serving",
        "trtllm_service.api.openai.serving",
        "trtllm_service.api.generation.serving",
        "trtllm_service.api.openai.completions.serving",
        "trtllm_service.runtime",
        "trtllm_service.relay.runtime",
        "trtllm_service.relay.grpc_http2",
        "trtllm_service.relay.client",
        *(
            (
                "trtllm_service.chat.template",
                "trtllm_service.api.generation.choices",
                "trtllm_service.relay.flavors",
                "trtllm_service.api.server.tracing",
            )
            if os.environ.get("BENCH_TIMELINE_FINE")
            else ()
        ),
    }
)


class _Finder(importlib.abc.MetaPathFinder):
    """Patches the modules above right after they are executed."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _WANTED:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            _patch(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # the loader's, patched for this module
        return spec


def _dump_ends() -> None:
    """The medians of what happened after the last byte, in ms, to $BENCH_TIMELINE/<pid>.end."""
    if not _END_TIMES:
        return
    medians = {label: round(statistics.median(times), 3) for label, times in _END_TIMES.items()}
    counted = len(_END_TIMES.get("request returned", ()))
    _END_TIMES.clear()
    ordered = dict(sorted(medians.items(), key=lambda item: item[1]))
    with open(os.path.join(os.environ["BENCH_TIMELINE"], f"{os.getpid()}.end"), "a") as out:
        out.write(json.dumps({"requests": counted, "ms after the last byte": ordered}) + "\n")


def _dump_calls() -> None:
    if not _CALLS:
        return
    requests = _CALLS.pop(("requests", ""), 1)
    steps: dict[str, dict[str, int]] = {}
    for (step, key), n in _CALLS.items():
        steps.setdefault(step, {})[key] = n
    _CALLS.clear()
    top = int(os.environ.get("BENCH_TIMELINE_TOP", "25"))  # the most counted functions listed per step
    report = {
        step: {
            "calls per request": round(sum(keys.values()) / requests, 1),
            "top": [
                [k, round(n / requests, 1)] for k, n in sorted(keys.items(), key=lambda kv: -kv[1])[:top]
            ],
        }
        for step, keys in steps.items()
    }
    with open(os.path.join(os.environ["BENCH_TIMELINE"], f"{os.getpid()}.calls"), "a") as out:
        out.write(json.dumps({"requests": requests, "steps": report}) + "\n")


def _dump(signum: int, frame: Any) -> None:
    _dump_ends()
    _dump_calls()
    done, _DONE[:] = _DONE[:], []
    groups: dict[tuple[str, ...], list[list[tuple[str, float]]]] = {}
    for marks in done:
        groups.setdefault(tuple(label for label, _ in marks), []).append(marks)
    with open(os.path.join(os.environ["BENCH_TIMELINE"], f"{os.getpid()}.txt"), "a") as out:
        for labels, rows in groups.items():
            steps = [
                [labels[i - 1], labels[i], statistics.median((r[i][1] - r[i - 1][1]) * 1e3 for r in rows)]
                for i in range(1, len(labels))
            ]
            out.write(json.dumps({"requests": len(rows), "steps": steps}) + "\n")


def install() -> None:
    sys.meta_path.insert(0, _Finder())
    signal.signal(signal.SIGRTMIN + 7, _dump)
