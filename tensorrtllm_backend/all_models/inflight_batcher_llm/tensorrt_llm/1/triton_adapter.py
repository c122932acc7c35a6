"""Triton Python-backend pieces shared by our `tensorrt_llm` models (both flavours).

What both models' TritonPythonModel do alike (EngineModel), response senders and collectors, the
responder that builds `InferenceResponse`s from arrays, and the stand-in engine's counters and its
engine-info gauge. The engine logic (engine.py, contract.py) imports no Triton; this is the one
module that adapts it to Triton.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from engine import OUTCOMES

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
ENGINES = ("reference", "synthetic")
"""Stand-in engines: what serves the `tensorrt_llm` slot where TensorRT-LLM is not used."""


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
    waits for) and hands both to the model's `_serve`; finalize() stops the stats thread and the
    engine.
    """

    model_name = "tensorrt_llm"
    decoupled = False
    engine: Any = None
    rank = 0
    stats: StatsPublisher | None = None
    counters: Counters
    info: EngineInfo

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

    def _register_metrics(self, kind: str) -> None:
        """The metrics of the engine `kind` that serves: its request and token counters
        (self.counters) and its trtllm_engine_info gauge."""
        self.counters = Counters(self.model_name, kind)
        self.info = EngineInfo(self.model_name, kind)

    def _serve(self, request: Any, sink: Sender | Collector) -> None:
        """Answers `request` through `sink`: at once when refused, else by handing it to the engine."""
        raise NotImplementedError

    def execute(self, requests: list[Any]) -> list[Any] | None:
        collectors = []
        for request in requests:
            sink: Any = Sender(request.get_response_sender()) if self.decoupled else Collector()
            collectors.append(sink)
            self._serve(request, sink)
        if self.decoupled:
            return None
        for sink in collectors:
            sink.done.wait()
        return [sink.response for sink in collectors]

    def finalize(self) -> None:
        if self.stats is not None:
            self.stats.stop()
        if self.engine is not None:
            self.engine.shutdown()


def input_getter(request: Any) -> Callable[[str], np.ndarray | None]:
    """The request's input arrays by name (None for an input it did not send)."""
    inputs = {tensor.name(): tensor for tensor in request.inputs()}

    def get(name: str) -> np.ndarray | None:
        tensor = inputs.get(name)
        return None if tensor is None else tensor.as_numpy()

    return get


class Responder:
    def response(self, arrays: dict[str, np.ndarray]) -> Any:
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(name, array) for name, array in arrays.items()]
        )

    def error(self, message: str) -> Any:
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))

    def log(self, message: str) -> None:
        pb_utils.Logger.log_info(message)


class Counters:
    """trtllm_reference_requests_total{outcome} and trtllm_reference_generated_tokens_total."""

    def __init__(self, model_name: str, engine: str) -> None:
        labels = {"model": model_name, "engine": engine}
        # Families must outlive their metrics: keep both.
        self.requests_family = pb_utils.MetricFamily(
            name="trtllm_reference_requests_total",
            description="Requests finished by the stand-in engine, by outcome",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.outcomes = {
            outcome: self.requests_family.Metric(labels={**labels, "outcome": outcome})
            for outcome in OUTCOMES
        }
        self.tokens_family = pb_utils.MetricFamily(
            name="trtllm_reference_generated_tokens_total",
            description="Tokens generated by the stand-in engine",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.token_metric = self.tokens_family.Metric(labels=labels)

    def finished(self, outcome: str) -> None:
        self.outcomes[outcome].increment(1)

    def tokens(self, count: int) -> None:
        self.token_metric.increment(count)


def vocab_size(model_dir: str, fallback: int) -> int:
    """The checkpoint's vocab_size (config.json), else `fallback`."""
    config = Path(model_dir) / "config.json"
    if config.is_file():
        size = json.loads(config.read_text()).get("vocab_size")
        if isinstance(size, int) and size > 0:
            return size
    return fallback


class EngineInfo:
    """trtllm_engine_info{model, engine} = 1: which engine answers, for dashboards and the service.

    Where the llmapi flavour falls back to the reference engine this is how the service learns it
    (and says so in /v1/models).
    """

    def __init__(self, model_name: str, engine: str) -> None:
        self.family = pb_utils.MetricFamily(
            name="trtllm_engine_info",
            description="The engine serving the model (reference and synthetic are stand-ins)",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self.metric = self.family.Metric(labels={"model": model_name, "engine": engine})
        self.metric.set(1)


class StatsPublisher:
    """Polls the engine's iteration stats on a thread of its own and publishes them as Triton custom
    metrics (engine_stats.py says which): `flavor` "llmapi" under trtllm-serve's names, "ensemble"
    under the C++ backend's `nv_trt_llm_*` families. `poll()` returns the iteration-stats dicts since
    the last call (the LLM API's `get_stats`). A family is made the first time it has a value, so
    what the engine does not report (speculation, the synthetic engine's KV cache) never shows."""

    def __init__(self, model_name: str, engine: str, flavor: str, poll: Any, period_s: float = 1.0) -> None:
        from engine_stats import LlmApiStats

        self.model_name, self.engine, self.flavor = model_name, engine, flavor
        self.poll, self.period_s = poll, period_s
        self.llmapi = LlmApiStats()
        self.families: dict[str, Any] = {}  # families must outlive their metrics: keep both
        self.metrics: dict[tuple[str, str], Any] = {}
        self._warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-stats", daemon=True)
        self._thread.start()

    def _metric(self, name: str, kind: str, description: str, label: tuple[str, str] | None = None) -> Any:
        key = (name, label[1] if label else "")
        metric = self.metrics.get(key)
        if metric is None:
            family = self.families.get(name)
            if family is None:
                family = self.families[name] = pb_utils.MetricFamily(
                    name=name,
                    description=description,
                    kind=pb_utils.MetricFamily.COUNTER if kind == "counter" else pb_utils.MetricFamily.GAUGE,
                )
            if self.flavor == "ensemble":  # the C++ backend's labels
                labels = {"model": self.model_name, "version": "1"}
            else:
                labels = {"model": self.model_name, "engine": self.engine}
            if label is not None:
                labels[label[0]] = label[1]
            metric = self.metrics[key] = family.Metric(labels=labels)
        return metric

    def publish(self, iterations: list[dict[str, Any]]) -> None:
        from engine_stats import CPP_FAMILIES, LLMAPI_FAMILIES, cpp_backend_metrics

        if not iterations:
            return
        if self.flavor == "ensemble":
            for (name, value_label), value in cpp_backend_metrics(iterations[-1]).items():
                description, label, _ = CPP_FAMILIES[name]
                self._metric(name, "gauge", description, (label, value_label)).set(value)
            return
        gauges, counters = self.llmapi.values(iterations)
        for name, value in gauges.items():
            self._metric(name, "gauge", LLMAPI_FAMILIES[name][1]).set(value)
        for name, value in counters.items():
            metric = self._metric(name, "counter", LLMAPI_FAMILIES[name][1])
            if value > 0:
                metric.increment(value)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                polled = self.poll()
                if isinstance(polled, (str, bytes)):
                    polled = json.loads(polled)
                iterations = [
                    json.loads(item) if isinstance(item, (str, bytes)) else item for item in polled or []
                ]
                self.publish([item for item in iterations if isinstance(item, dict)])
            except Exception as exc:  # a failed poll must not end the thread; said once
                if not self._warned:
                    self._warned = True
                    pb_utils.Logger.log_warn(f"{self.model_name}: engine stats unavailable: {exc}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def make_source(
    kind: str,
    model_dir: str,
    tokenizer_dir: str,
    *,
    device: str = "auto",
    dtype: str = "auto",
    slots: int = 0,
    max_seq_len: int = 0,
    block_reuse: bool = False,
    tokens_per_block: int = 0,
) -> tuple[Any, int, int]:
    """The stand-in token source `kind`, its vocabulary size and its sequence-length limit.

    `slots` (the reference engine's batch, 0 for its default) and `max_seq_len` (0: the model's
    own) size the reference engine's KV cache; `block_reuse` lets prompts reuse the KV blocks of
    earlier prompts' prefixes, in blocks of `tokens_per_block` (0: TensorRT-LLM's default)."""
    if kind not in ENGINES:
        raise pb_utils.TritonModelException(
            f"tensorrt_llm: the stand-in engine must be one of {', '.join(ENGINES)}, got {kind!r}"
        )
    if kind == "reference":
        from prefix_cache import DEFAULT_TOKENS_PER_BLOCK
        from reference import DEFAULT_SLOTS, ReferenceSource

        source = ReferenceSource(
            model_dir,
            device,
            dtype,
            slots=slots or DEFAULT_SLOTS,
            max_len=max_seq_len,
            tokenizer_dir=tokenizer_dir,
            block_reuse=block_reuse,
            tokens_per_block=tokens_per_block or DEFAULT_TOKENS_PER_BLOCK,
        )
        return source, source.vocab_size, source.max_len
    from synthetic import SyntheticSource, printable_tokens

    words = printable_tokens(tokenizer_dir or model_dir)
    return SyntheticSource(words), vocab_size(model_dir, max(words) + 1), 1 << 20


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
