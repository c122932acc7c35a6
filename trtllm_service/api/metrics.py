"""The service's own Prometheus metrics (Triton's are appended to the same scrape: triton/metrics.py).

Names, units and buckets follow vLLM's (`vllm:time_to_first_token_seconds` -> here
`trtllm:time_to_first_token_seconds`), labelled by `model_name`. BentoML runs prometheus_client in
multiprocess mode (its own PROMETHEUS_MULTIPROC_DIR), so every worker writes its own samples and the
scrape sums them: counts are right however many workers serve. Recording costs a handful of
observations per request, none per token: inter-token latency is each request's mean time between
tokens after the first.
"""

from __future__ import annotations

import logging
import time
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


class RequestMetrics:
    """Times and counts one generation request; `done` records it (once)."""

    __slots__ = ("_first", "_recorded", "_route", "_series", "_start")

    def __init__(self, model: str, route: str) -> None:
        self._route = route
        self._start = time.perf_counter()
        self._first: float | None = None
        self._recorded = False
        self._series = _of(model)
        self._series.running.inc()

    def first_token(self) -> None:
        if self._first is None:
            self._first = time.perf_counter()
            self._series.ttft.observe(self._first - self._start)

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


def count_rejected(model: str, path: str, status: int) -> None:
    """A request refused before its handler ran (401, 429). Unknown paths count as "other", so that
    clients cannot grow the metric's label set."""
    REQUESTS.labels(model, path if path in GENERATION_ROUTES else "other", str(status), "").inc()
