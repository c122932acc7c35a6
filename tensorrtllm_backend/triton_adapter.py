"""Triton Python-backend pieces shared by our `tensorrt_llm` models (both flavours).

What both models' TritonPythonModel do alike (EngineModel), response senders and collectors, the
responder that builds `InferenceResponse`s from arrays, the engine's counters and its engine-info
gauge, and the probe the service's supervisor sends. The llmapi model runs on it in NVIDIA's image,
so it imports no stand-in (the stand-ins' token sources are built by standin/sources.py). The engine
logic (llm_engine.py, and the stand-ins' engine.py, contract.py) imports no Triton; this is the one
module that adapts it to Triton.

Rules every thread here keeps, learnt from pytriton's stub (Triton 2.51, python_backend r24.10):
- A custom metric call (`Metric.increment` / `set`) waits for the server while holding the GIL, and
  it queues behind the stub's log messages: when the server blocks on a log write, the call stops
  every Python thread of the stub, the main one included. So requests only count in Python
  (`Counters`), and one thread (`MetricsPublisher`) makes every metric call, every FLUSH_S.
- `send` drops, without the GIL, the outputs a request did not ask for: freeing their arrays there
  crashes Python 3.12. So responses carry only requested outputs (the contracts see to it).
- Metric families must go before the stub tears itself down (a family freed at interpreter exit
  talks to a server that is gone: a segfault at every stop): `finalize` releases them. A killed
  server never calls finalize: its stubs see it gone once it is reaped, free the model (families
  included) and crash. So the stub ends itself (`os._exit`) the moment its server dies, before the
  server is reaped: a thread waits on the server's pidfd, which is readable from the server's exit
  on (`watch_server`); where there is no pidfd the metrics thread checks every FLUSH_S that the
  stub's parent is the same (a stub is re-parented at once; that check alone lost the race about
  once in a full test run).
- Messages that may hold a client's input (an engine's error echoing a 600 KB grammar) are cut to
  MESSAGE_LIMIT before they are logged or sent (`brief`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from engine_metrics import GAUGE, LlmApiStats

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
OUTCOMES = ("completed", "cancelled", "stopped", "error")
"""How a request ends, as the engines count it (Counters.finished)."""
MESSAGE_LIMIT = 500
"""The most characters of a message logged or sent in an error (the rest is counted, not kept)."""
FLUSH_S = 0.1
"""How often the counters reach Triton's metrics."""
PROBE_INPUT, PROBE_OUTPUT = "probe", "probe_status"
"""Ours: a request with `probe` true is answered at once, through the model's own threads, with
`probe_status` (JSON: requests in flight, seconds without progress, whether the engine is busy in
a step), and never reaches the engine: the service's supervisor tells a wedged model from a slow one
by it."""


def brief(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """`text`, cut to `limit` characters with a note of how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


class Sender:
    """The responses of a decoupled request go to its response sender."""

    __slots__ = ("sender",)

    def __init__(self, sender: Any) -> None:
        self.sender = sender

    def send(self, response: Any | None, final: bool) -> None:
        if response is None:
            self.sender.send(flags=FINAL)
        else:
            self.sender.send(response, flags=FINAL if final else 0)

    def is_cancelled(self) -> bool:
        return self.sender.is_cancelled()


class Collector:
    """A request of a non-decoupled model: execute() waits for its one final response."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.response: Any = None

    def send(self, response: Any | None, final: bool) -> None:
        if final:
            self.response = response or pb_utils.InferenceResponse(output_tensors=[])
            self.done.set()

    def is_cancelled(self) -> bool:
        return False


class EngineModel:
    """The part of TritonPythonModel that both `tensorrt_llm` models share.

    `_start` begins initialize() and `_register_metrics` names the engine that serves; execute()
    gives each request a sink (its response sender when decoupled, else a Collector that execute()
    waits for) and hands both to the model's `_serve`, or to `_probe` for the supervisor's probe;
    finalize() stops the metrics thread and the engine, and releases the metrics.
    """

    model_name = "tensorrt_llm"
    decoupled = False
    engine: Any = None
    rank = 0
    metrics: MetricsPublisher | None = None
    counters: Counters | None = None
    info: EngineInfo | None = None

    def _start(self, args: dict[str, str]) -> dict[str, Any]:
        """The first steps of initialize() (SIGTERM unblocked, this rank, the model's name and
        transaction policy); returns the parsed model config."""
        take_sigterm()
        config = json.loads(args["model_config"])
        self.model_name = args.get("model_name", "tensorrt_llm")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.engine = None
        self.rank = mpi_rank()
        return config

    def _register_metrics(self, kind: str) -> Counters:
        """The metrics of the engine `kind` that serves: its request and token counters
        (self.counters, returned for the engine) and its trtllm_engine_info gauge."""
        self.counters = counters = Counters(self.model_name, kind)
        self.info = EngineInfo(self.model_name, kind)
        return counters

    def _refused(self) -> None:
        """Counts a request that the model refused itself (the engine never had it)."""
        assert self.counters is not None  # registered in initialize(), before any request
        self.counters.finished("error")

    def _publish(self, kind: str, poll: Any = None, stats: Any = None) -> None:
        """Starts the one thread that makes metric calls: the counters every FLUSH_S and, with
        `poll`, the engine's iteration stats every second, as `stats` names them (see MetricsPublisher)."""
        assert self.counters is not None
        self.metrics = MetricsPublisher(self.model_name, kind, self.counters, poll, stats=stats)

    def _serve(self, request: Any, get: Callable[[str], np.ndarray | None], sink: Sender | Collector) -> None:
        """Answers `request` through `sink`: at once when refused, else by handing it to the engine."""
        raise NotImplementedError

    def _probe(self, sink: Sender | Collector) -> None:
        """Answers the supervisor's probe with the engine's `probe_status()` (see PROBE_INPUT)."""
        status = self.engine.probe_status() if self.engine is not None else {"in_flight": 0}
        sink.send(probe_response(status), True)  # from execute(): the engine's loop is not involved

    def execute(self, requests: list[Any]) -> list[Any] | None:
        collectors = []
        for request in requests:
            sink: Any = Sender(request.get_response_sender()) if self.decoupled else Collector()
            collectors.append(sink)
            get = input_getter(request)
            probe = get(PROBE_INPUT)
            if probe is not None and probe.size and bool(probe.reshape(-1)[0]):
                self._probe(sink)
            else:
                self._serve(request, get, sink)
        if self.decoupled:
            return None
        for sink in collectors:
            sink.done.wait()
        return [sink.response for sink in collectors]

    def finalize(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()
        if self.engine is not None:
            self.engine.shutdown()
        # Released while the stub can still talk to the server (see the module docstring).
        for metrics in (self.counters, self.info):
            if metrics is not None:
                metrics.release()


def input_getter(request: Any) -> Callable[[str], np.ndarray | None]:
    """The request's input arrays by name (None for an input it did not send)."""
    inputs = {tensor.name(): tensor for tensor in request.inputs()}

    def get(name: str) -> np.ndarray | None:
        tensor = inputs.get(name)
        return None if tensor is None else tensor.as_numpy()

    return get


def probe_response(status: dict[str, Any]) -> Any:
    """The answer to a probe: `probe_status`, the status as JSON."""
    payload = np.array([json.dumps(status).encode()], dtype=np.object_)
    return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(PROBE_OUTPUT, payload)])


class Responder:
    """Builds responses; messages are cut to MESSAGE_LIMIT (`brief`)."""

    def response(self, arrays: dict[str, np.ndarray]) -> Any:
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(name, array) for name, array in arrays.items()]
        )

    def error(self, message: str) -> Any:
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(brief(message)))

    def probe(self, status: dict[str, Any]) -> Any:
        return probe_response(status)

    def log(self, message: str) -> None:
        pb_utils.Logger.log_info(brief(message))


class Counters:
    """trtllm_reference_requests_total{outcome} and trtllm_reference_generated_tokens_total.

    `finished` and `tokens` only count, in Python, from any thread; `flush` (the metrics thread, and
    finalize) hands what was counted since to Triton. See the module docstring for why."""

    def __init__(self, model_name: str, engine: str) -> None:
        self._lock = threading.Lock()
        self._finished: dict[str, int] = {}
        self._tokens = 0
        labels = {"model": model_name, "engine": engine}
        # Families must outlive their metrics: keep both.
        self.requests_family: pb_utils.MetricFamily | None = pb_utils.MetricFamily(
            name="trtllm_reference_requests_total",
            description="Requests finished by the stand-in engine, by outcome",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.outcomes = {
            outcome: self.requests_family.Metric(labels={**labels, "outcome": outcome})
            for outcome in OUTCOMES
        }
        self.tokens_family: pb_utils.MetricFamily | None = pb_utils.MetricFamily(
            name="trtllm_reference_generated_tokens_total",
            description="Tokens generated by the stand-in engine",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.token_metric: pb_utils.Metric | None = self.tokens_family.Metric(labels=labels)

    def finished(self, outcome: str) -> None:
        with self._lock:
            self._finished[outcome] = self._finished.get(outcome, 0) + 1

    def tokens(self, count: int) -> None:
        with self._lock:
            self._tokens += count

    def flush(self) -> None:
        """Adds what was counted since the last flush to Triton's metrics: tokens first, so a
        request's tokens are there when its end is."""
        with self._lock:
            finished, tokens = self._finished, self._tokens
            self._finished, self._tokens = {}, 0
        if tokens and self.token_metric is not None:
            self.token_metric.increment(tokens)
        for outcome, count in finished.items():
            if outcome in self.outcomes:
                self.outcomes[outcome].increment(count)

    def release(self) -> None:
        """Drops the metric families now (finalize), whoever still holds this object: one freed at
        the stub's exit crashes it."""
        self.flush()
        self.outcomes, self.token_metric = {}, None
        self.requests_family = self.tokens_family = None


class EngineInfo:
    """trtllm_engine_info{model, engine} = 1: which engine answers, for dashboards and the service.

    Where the llmapi flavour falls back to the reference engine this is how the service learns it
    (and says so in /v1/models).
    """

    def __init__(self, model_name: str, engine: str) -> None:
        self.family: pb_utils.MetricFamily | None = pb_utils.MetricFamily(
            name="trtllm_engine_info",
            description="The engine serving the model (reference and synthetic are stand-ins)",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self.metric: pb_utils.Metric | None = self.family.Metric(
            labels={"model": model_name, "engine": engine}
        )
        self.metric.set(1)

    def release(self) -> None:
        """Drops the family now (finalize): see Counters.release."""
        self.metric = self.family = None


class MetricsPublisher:
    """The one thread that makes the model's metric calls: every FLUSH_S it flushes `counters`, and
    with `poll` it publishes the engine's iteration stats every `period_s` as Triton custom metrics,
    as `stats` names and labels them: by default trtllm-serve's names (engine_metrics.LlmApiStats, the
    llmapi model's); the ensemble's stand-in passes the C++ backend's `nv_trt_llm_*` families
    (standin/engine_stats.CppBackendStats). `poll()` returns the iteration-stats dicts since the last
    call (the LLM API's `get_stats`). A family is made the first time it has a value, so what the
    engine does not report (speculation, the synthetic engine's KV cache) never shows. It also ends
    the stub when the server dies (see the module docstring)."""

    def __init__(
        self,
        model_name: str,
        engine: str,
        counters: Counters,
        poll: Any = None,
        period_s: float = 1.0,
        stats: Any = None,
    ) -> None:
        self.model_name, self.engine = model_name, engine
        self.counters = counters
        self.poll, self.period_s = poll, period_s
        self.stats = stats if stats is not None else LlmApiStats()
        self.labels = self.stats.labels(model_name, engine)
        self.families: dict[str, Any] = {}  # families must outlive their metrics: keep both
        self.metrics: dict[tuple[str, str], Any] = {}
        self._warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-metrics", daemon=True)
        self._thread.start()
        watch_server()

    def _metric(self, name: str, kind: str, description: str, label: tuple[str, str] | None = None) -> Any:
        key = (name, label[1] if label else "")
        metric = self.metrics.get(key)
        if metric is None:
            family = self.families.get(name)
            if family is None:
                family = self.families[name] = pb_utils.MetricFamily(
                    name=name,
                    description=description,
                    kind=pb_utils.MetricFamily.GAUGE if kind == GAUGE else pb_utils.MetricFamily.COUNTER,
                )
            labels = dict(self.labels)
            if label is not None:
                labels[label[0]] = label[1]
            metric = self.metrics[key] = family.Metric(labels=labels)
        return metric

    def publish(self, iterations: list[dict[str, Any]]) -> None:
        if not iterations:
            return
        for name, kind, description, label, value in self.stats.metrics(iterations):
            metric = self._metric(name, kind, description, label)
            if kind == GAUGE:
                metric.set(value)
            elif value > 0:
                metric.increment(value)

    def _run(self) -> None:
        polled_at = time.monotonic()
        server = os.getppid()
        while not self._stop.wait(FLUSH_S):
            if os.getppid() != server:  # the server died: go before the stub frees the families
                os._exit(1)
            try:
                self.counters.flush()
            except Exception as exc:  # the thread must outlive a failed call; said once
                self._warn(f"{self.model_name}: counting into Triton's metrics failed: {exc}")
            if self.poll is None or time.monotonic() - polled_at < self.period_s:
                continue
            polled_at = time.monotonic()
            try:
                polled = self.poll()
                if isinstance(polled, (str, bytes)):
                    polled = json.loads(polled)
                iterations = [
                    json.loads(item) if isinstance(item, (str, bytes)) else item for item in polled or []
                ]
                self.publish([item for item in iterations if isinstance(item, dict)])
            except Exception as exc:  # a failed poll must not end the thread; said once
                self._warn(f"{self.model_name}: engine stats unavailable: {exc}")

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            pb_utils.Logger.log_warn(brief(message))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.families.clear()
        self.metrics.clear()


def watch_server() -> None:
    """Ends this stub (`os._exit`) the moment the server that started it exits, before the server is
    reaped (see the module docstring), from a thread that sleeps on the server's pidfd. Does nothing
    where pidfds are missing (Linux < 5.3): the metrics thread's parent check stands alone there."""
    server = os.getppid()
    try:
        pidfd = os.pidfd_open(server)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):
        return

    def wait() -> None:
        select.select([pidfd], [], [])  # readable once the server has exited
        os._exit(1)

    threading.Thread(target=wait, name="server-watch", daemon=True).start()


def take_sigterm() -> None:
    """Unblocks SIGTERM in this stub, and so in every thread and process the engine starts from here.

    The service starts Triton with SIGTERM blocked (BentoML's process manager must not stop it
    before the service's drain ends), and a stub inherits the mask; an engine's worker processes
    are stopped with SIGTERM as upstream expects, so the engine models undo it before they start one.
    """
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def mpi_rank() -> int:
    """This process's rank under mpirun (Open MPI, or PMI/PMIx), 0 when not launched by MPI."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0
