"""The service's own Prometheus metrics (Triton's are appended to the same scrape: triton/metrics.py).

Names, units and buckets follow vLLM's (`vllm:time_to_first_token_seconds` -> here
`trtllm:time_to_first_token_seconds`), labelled by `model_name`. BentoML runs prometheus_client in
multiprocess mode (its own PROMETHEUS_MULTIPROC_DIR), so every worker writes its own samples and the
scrape sums them: counts are right however many workers serve. Recording costs a handful of
observations per request, none per token: inter-token latency is each request's mean time between
tokens after the first.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

logger = logging.getLogger("trtllm_service.metrics")

_LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_ITL_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
_E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)

TTFT = Histogram(
    "trtllm:time_to_first_token_seconds",
    "Time from the request's arrival to its first generated text.",
    ["model_name"],
    buckets=_LATENCY_BUCKETS,
)
ITL = Histogram(
    "trtllm:inter_token_latency_seconds",
    "Mean time between tokens after the first, per request.",
    ["model_name"],
    buckets=_ITL_BUCKETS,
)
E2E = Histogram(
    "trtllm:e2e_request_latency_seconds",
    "Time from the request's arrival to its last token.",
    ["model_name"],
    buckets=_E2E_BUCKETS,
)
PROMPT_TOKENS = Histogram(
    "trtllm:request_prompt_tokens",
    "Prompt tokens per request.",
    ["model_name"],
    buckets=_TOKEN_BUCKETS,
)
COMPLETION_TOKENS = Histogram(
    "trtllm:request_generation_tokens",
    "Generated tokens per request.",
    ["model_name"],
    buckets=_TOKEN_BUCKETS,
)
REQUESTS = Counter(
    "trtllm:requests",
    "Generation requests answered, by route, HTTP status and finish reason.",
    ["model_name", "route", "status", "finished_reason"],
)
RUNNING = Gauge(
    "trtllm:num_requests_running",
    "Generation requests in flight.",
    ["model_name"],
    multiprocess_mode="livesum",
)

QUEUE_TIME = Histogram(
    "trtllm:request_queue_time_seconds",
    "Time a request waited in the service's queue before it started (0: it started at once).",
    ["model_name"],
    buckets=_LATENCY_BUCKETS,
)
QUEUE_REJECTIONS = Counter(
    "trtllm:queue_rejections",
    "Requests the service's queue refused, by reason: queue_full (TRTLLM_MAX_WAITING) or "
    "queue_timeout (TRTLLM_QUEUE_TIMEOUT).",
    ["model_name", "reason"],
)
QUEUE_REASONS = ("queue_full", "queue_timeout")
"""The reasons of QUEUE_REJECTIONS: a bounded label set."""

LORA_OPERATIONS = Counter(
    "trtllm:lora_adapter_operations",
    "LoRA adapters loaded and unloaded while serving (/v1/load_lora_adapter, /v1/unload_lora_adapter), "
    "by operation (load, unload) and result (ok, failed); requests per adapter are trtllm:requests' "
    "model_name.",
    ["model_name", "operation", "result"],
)
LORA_LOADED = Gauge(
    "trtllm:lora_adapters_loaded",
    "LoRA adapters loaded while serving, as the last load or unload left them.",
    ["model_name"],
    multiprocess_mode="mostrecent",
)


def count_lora(model: str, operation: str, ok: bool, loaded: int | None = None) -> None:
    """Counts one load or unload (`operation`) and, when it changed the set, how many are loaded."""
    LORA_OPERATIONS.labels(model, operation, "ok" if ok else "failed").inc()
    if loaded is not None:
        LORA_LOADED.labels(model).set(loaded)


class _ModelMetrics:
    """One model's labelled series, looked up once (prometheus_client's `labels()` builds and checks
    the label tuple under a lock on every call)."""

    __slots__ = ("completion_tokens", "e2e", "itl", "model", "prompt_tokens", "requests", "running", "ttft")

    def __init__(self, model: str) -> None:
        self.model = model
        self.running = RUNNING.labels(model)
        self.ttft = TTFT.labels(model)
        self.itl = ITL.labels(model)
        self.e2e = E2E.labels(model)
        self.prompt_tokens = PROMPT_TOKENS.labels(model)
        self.completion_tokens = COMPLETION_TOKENS.labels(model)
        self.requests: dict[tuple[str, str, str], Any] = {}  # (route, status, finish reason) -> series

    def request(self, route: str, status: int, finish_reason: str) -> Any:
        key = (route, str(status), finish_reason)
        series = self.requests.get(key)
        if series is None:
            series = self.requests[key] = REQUESTS.labels(self.model, *key)
        return series


_MODELS: dict[str, _ModelMetrics] = {}


def _of(model: str) -> _ModelMetrics:
    metrics = _MODELS.get(model)
    if metrics is None:
        metrics = _MODELS[model] = _ModelMetrics(model)
    return metrics


def soon(record: Callable[[float], object], value: float) -> None:
    """Records `value` as soon as the current callback is done (the event loop's next turn), so off
    a first token's way: one sample costs prometheus_client's multiprocess mode 10-20 Python and C
    calls (a lock, a pid check, an mmap write per series). At once where no loop runs."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        record(value)
    else:
        loop.call_soon(record, value)


class RequestMetrics:
    """Times and counts one generation request; `done` records it (once)."""

    __slots__ = ("_first", "_recorded", "_route", "_series", "_start")

    def __init__(self, model: str, route: str) -> None:
        self._route = route
        self._start = time.perf_counter()
        self._first: float | None = None
        self._recorded = False
        self._series = _of(model)
        soon(self._series.running.inc, 1)

    def first_token(self) -> None:
        if self._first is None:
            self._first = time.perf_counter()
            soon(self._series.ttft.observe, self._first - self._start)

    def done(
        self,
        status: int,
        finish_reason: str | None = None,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
    ) -> None:
        if self._recorded:
            return
        self._recorded = True
        series = self._series
        series.running.dec()
        series.request(self._route, status, finish_reason or "").inc()
        if status != 200:
            return
        end = time.perf_counter()
        series.e2e.observe(end - self._start)
        series.prompt_tokens.observe(prompt_tokens)
        series.completion_tokens.observe(completion_tokens)
        if self._first is not None and completion_tokens > 1:
            series.itl.observe((end - self._first) / (completion_tokens - 1))


GENERATION_ROUTES = frozenset({"/generate", "/v1/chat/completions", "/v1/completions"})
OTHER = "other"
"""The label of every path the service does not route (so that clients cannot grow a label set)."""


def count_rejected(model: str, path: str, status: int) -> None:
    """A request refused before its handler ran (401, 429). Unknown paths count as `OTHER`."""
    REQUESTS.labels(model, path if path in GENERATION_ROUTES else OTHER, str(status), "").inc()


class EndpointLabels:
    """A request path as a label from a bounded set: the template of the route it matches (a
    parameter stays `{model}`), `OTHER` for any path no route serves (a catch-all route, such as
    /v1's OpenAI-shaped 404, serves none).

    The routes are read from the ASGI app the first time one is given (`learn`): BentoML's own,
    the API's, and those of every mounted app.
    """

    CACHE_SIZE = 1024
    """Paths whose label is remembered (the service's own routes fill a handful of entries)."""

    def __init__(self) -> None:
        self._routes: list[tuple[re.Pattern[str], str]] | None = None
        self._cache: dict[str, str] = {}

    @property
    def learnt(self) -> bool:
        return self._routes is not None

    def learn(self, app: Any) -> None:
        """Reads the routes of `app` (a Starlette app or router), once."""
        if self._routes is None and app is not None:
            self._routes = list(_route_templates(getattr(app, "routes", ()), ""))

    def of(self, path: str) -> str:
        """The label of a request for `path`."""
        label = self._cache.get(path)
        if label is not None:
            return label
        label = next((template for regex, template in self._routes or () if regex.match(path)), OTHER)
        if label != OTHER and len(self._cache) < self.CACHE_SIZE:
            self._cache[path] = label
        return label


def _route_templates(routes: Any, prefix: str) -> Iterator[tuple[re.Pattern[str], str]]:
    """(regex, template) of every route under `prefix`, mounted apps' included, in routing order."""
    from starlette.routing import Mount, compile_path

    for route in routes:
        path = getattr(route, "path", None)
        if not isinstance(path, str) or ":path}" in path:  # a catch-all names no endpoint
            continue
        if isinstance(route, Mount):
            children = getattr(route.app, "routes", None)
            if children:
                yield from _route_templates(children, prefix + path)
            else:  # static files and the like: one label for the mount
                template = f"{prefix}{path}/{{path}}"
                yield re.compile(f"^{re.escape(prefix + path)}/"), template
            continue
        template = prefix + path
        yield compile_path(template)[0], template
