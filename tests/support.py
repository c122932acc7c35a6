"""Test helpers: free ports, a real tritonserver started through our launcher, gRPC streaming."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tensorrtllm_backend import LAUNCHER
from tensorrtllm_backend.repository import build_repository, repository_values

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The repository's root (tests/ sits in it)."""

DEFERRED_STOPS: list[Callable[[], None]] = []
"""The rest of each stop told to a service and not waited for (`defer_stop`: TritonServer's and e2e
conftest's `stop_soon`): run when more services are stopping, and all at the session's end
(tests/conftest.py)."""


def defer_stop(finish: Callable[[], None]) -> None:
    """Queues `finish`, the rest of a stop already signalled, in DEFERRED_STOPS; first finishes the
    oldest queued stops, so that no more than two are ever pending."""
    while len(DEFERRED_STOPS) >= 2:
        DEFERRED_STOPS.pop(0)()
    DEFERRED_STOPS.append(finish)


def finish_deferred_stops() -> None:
    """Finishes every stop in DEFERRED_STOPS (at the session's end, or before a test that reads
    what any stub did since it began)."""
    while DEFERRED_STOPS:
        DEFERRED_STOPS.pop(0)()


HARD_TEXT = (
    "Grüße aus München! naïve café, déjà vu, façade, jalapeño.\n"
    "  中文：你好，世界。我们今天去公园散步 🌍\n"
    "日本語のテキストです。한국어도 있어요.\n"
    "Family 👨‍👩‍👧‍👦, thumbs 👍🏽 👍🏿, wave 👋🏻, flag 🏳️‍🌈 🇫🇷, heart ❤️.\n\n"
    "   indented   words\tand tabs\n"
    " leading space, trailing space \n"
    "Ελληνικά, Русский язык: привет, мир! ✅ ✨"
)
"""Text whose streaming is hard: multi-byte characters, emoji sequences (ZWJ, skin tones, flags),
runs of spaces and tabs (tests/integration/test_streaming_text.py, tests/unit/backend/test_detokenizer.py)."""


def stable_text(tokenizer: Any, ids: list[int], look_back: int = 16) -> str:
    """What our postprocessing emits for `ids`: the decoded text up to the last token boundary that
    ends on a complete character (a trailing incomplete UTF-8 sequence is never emitted)."""
    for end in range(len(ids), max(0, len(ids) - look_back) - 1, -1):
        text = tokenizer.decode(ids[:end], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if not text.endswith("\ufffd"):
            return text
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def engine_config(
    tp: int = 2, pp: int = 1, pretrained: dict[str, Any] | None = None, **build: Any
) -> dict[str, Any]:
    """config.json as trtllm-build (TensorRT-LLM 0.19) writes it, trimmed to a realistic subset."""
    return {
        "version": "0.19.0",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "bfloat16",
            "vocab_size": 128256,
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "max_position_embeddings": 8192,
            "position_embedding_type": "rope_gpt_neox",
            "mapping": {
                "world_size": tp * pp,
                "gpus_per_node": 8,
                "cp_size": 1,
                "tp_size": tp,
                "pp_size": pp,
                "moe_tp_size": tp,
                "moe_ep_size": 1,
                "auto_parallel": False,
            },
            "quantization": {"quant_algo": None, "kv_cache_quant_algo": None, "group_size": 128},
            **(pretrained or {}),
        },
        "build_config": {
            "max_input_len": 1024,
            "max_seq_len": 2048,
            "opt_batch_size": 8,
            "max_batch_size": 16,
            "max_beam_width": 1,
            "max_num_tokens": 8192,
            "kv_cache_type": "PAGED",
            "plugin_config": {"use_paged_context_fmha": True, "paged_kv_cache": True},
            **build,
        },
    }


def engine_response(ids: Sequence[int] = (), *, final: bool = False, error: str = "") -> bytes:
    """A serialized ModelStreamInferResponse as Triton streams it from the `tensorrt_llm` model."""
    from array import array

    from tritonclient.grpc import service_pb2

    response = service_pb2.ModelStreamInferResponse(error_message=error)
    if not error:
        result = response.infer_response
        result.model_name = "tensorrt_llm"
        output = result.outputs.add()
        output.name, output.datatype = "output_ids", "INT32"
        output.shape.extend([1, 1, len(ids)])
        result.raw_output_contents.append(array("i", ids).tobytes())
        result.parameters["triton_final_response"].bool_param = final
    return response.SerializeToString()


def timed_reads(stream: Any, ids: Sequence[int], gap_s: float) -> list[tuple[float, str]]:
    """Feeds an engine stream (relay/client.EngineStream) one token id per `gap_s` as Triton's
    responses, then the final one, on a real event loop; returns (seconds since start, text) of
    each `read()` until the stream finished."""
    import asyncio

    async def scenario() -> list[tuple[float, str]]:
        loop = asyncio.get_running_loop()

        async def feed() -> None:
            for token in ids:
                stream.on_message(engine_response([token]))
                await asyncio.sleep(gap_s)
            stream.on_message(engine_response([], final=True))

        feeder = asyncio.ensure_future(feed())
        start, reads = loop.time(), []
        while stream.finish_reason is None:
            text = await stream.read()
            reads.append((loop.time() - start, text))
        await feeder
        return reads

    return asyncio.run(scenario())


def kernel_log() -> list[str]:
    """The kernel's log (dmesg), line by line: where a crashed process (a stub's segfault) shows."""
    read = subprocess.run(["dmesg"], capture_output=True, text=True, check=True)
    return read.stdout.splitlines()


def new_stub_crashes(before: Sequence[str], pids: Sequence[int] | None = None) -> list[str]:
    """Segfault lines of Python-backend stubs (of `pids`, else any) logged since `before` was read."""
    seen = set(before)
    return [
        line
        for line in kernel_log()
        if line not in seen
        and "segfault" in line
        and ("triton_python_b" in line or "stub" in line)
        and (pids is None or any(f"[{pid}]: " in line for pid in pids))
    ]


PORT_RESERVATIONS = Path(tempfile.gettempdir()) / "trtllm-test-ports"
"""One file per port handed out by `free_ports`, holding the pid of the test process it went to."""
PORT_RANGE = (20000, 32768)
"""Where test ports come from: below Linux's ephemeral range (32768-60999 by default), which the
kernel hands out to every outgoing connection and every bind to port 0."""


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports, each handed out once to a live process on this machine.

    A free port is let go before its server takes it, and another can take it first: this run's
    other xdist worker or another test run on the machine (bind to port 0 handed two launches one
    HTTP port in CI), or any outgoing connection. So the ports come from below the kernel's
    ephemeral range, and each is reserved in PORT_RESERVATIONS, under a lock, for as long as the
    process it went to lives."""
    PORT_RESERVATIONS.mkdir(exist_ok=True)
    chosen: list[int] = []
    with open(PORT_RESERVATIONS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        while len(chosen) < count:
            port = random.randrange(*PORT_RANGE)
            if port not in chosen and _bindable(port) and _reserve(PORT_RESERVATIONS / str(port)):
                chosen.append(port)
    return chosen


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _reserve(path: Path) -> bool:
    """Marks the port `path` names as this process's, unless a live process has it (the caller
    holds the lock)."""
    with contextlib.suppress(FileNotFoundError, ValueError):
        owner = int(path.read_text())
        if owner == os.getpid() or psutil.pid_exists(owner):
            return False
    path.write_text(str(os.getpid()))
    return True


def asgi_request(app: Any, path: str, method: str = "GET", **headers: str) -> Any:
    """One request to an ASGI app in this process (httpx's ASGI transport); its httpx.Response."""
    import asyncio

    import httpx

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path, headers=headers)

    return asyncio.run(go())


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


def guided_decoding_values(tokenizer_dir: Path, workdir: Path) -> dict[str, str]:
    """The template values (and the xgrammar tokenizer info file) that set up guided decoding in the
    ensemble's tensorrt_llm model, as pack_model.py writes them."""
    from transformers import AutoTokenizer

    from tensorrtllm_backend.repository import end_ids
    from trtllm_service.packing.guided_decoding import write_xgrammar_tokenizer_info, xgrammar_tokenizer_info

    path = workdir / "xgrammar_tokenizer_info.json"
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    write_xgrammar_tokenizer_info(path, xgrammar_tokenizer_info(tokenizer, end_ids(tokenizer_dir)))
    return {"guided_decoding_backend": "xgrammar", "xgrammar_tokenizer_info_path": str(path)}


class TritonServer:
    """tritonserver (via launch_triton_server.py) on free loopback ports, stopped on exit."""

    def __init__(
        self,
        workdir: Path,
        *,
        engine_dir: Path,
        tokenizer_dir: Path,
        overrides: Mapping[str, str] | None = None,
        startup_timeout: float = 180.0,
        flavor: str = "ensemble",
    ) -> None:
        self.workdir = Path(workdir)
        self.flavor = flavor
        if (
            flavor == "ensemble"
        ):  # NVIDIA's C++ backend guides only with its xgrammar config, as packing fills it
            overrides = {**guided_decoding_values(tokenizer_dir, self.workdir), **(overrides or {})}
        self.repo = build_repository(
            self.workdir / "repo",
            repository_values(engine_dir=engine_dir, tokenizer_dir=tokenizer_dir, overrides=overrides),
            flavor=flavor,
        )
        self.grpc_port, self.http_port, self.metrics_port = free_ports(3)
        self.log_path = self.workdir / "triton.log"
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> TritonServer:
        command = [
            sys.executable,
            str(LAUNCHER),
            "--model_repo",
            str(self.repo),
            "--grpc_port",
            str(self.grpc_port),
            "--http_port",
            str(self.http_port),
            "--metrics_port",
            str(self.metrics_port),
        ]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"tritonserver exited during start-up:\n{self.log()[-4000:]}")
            if http_ok(
                f"{self.http_url}/v2/models/{'ensemble' if self.flavor == 'ensemble' else 'tensorrt_llm'}/ready"
            ):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"tritonserver was not ready in {self.startup_timeout} s:\n{self.log()[-4000:]}")

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM to the launcher (it stops tritonserver), then SIGKILL to the group if needed."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        self._finish_stop()

    def stop_soon(self) -> None:
        """`stop`, but not waited for: SIGTERM now, the rest later (`defer_stop`). For fixtures whose
        stop no test looks at: Triton takes 3-4 s to unload the stand-in and exit (10 more when
        a model's unload runs into its exit timeout), and the next tests run meanwhile."""
        if self.process is None or self.process.poll() is not None:
            self.stop()
            return
        self.process.send_signal(signal.SIGTERM)
        defer_stop(self._finish_stop)

    def _finish_stop(self) -> None:
        from trtllm_service.triton.shm import PREFIX_OPTION, remove_regions

        assert self.process is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        # what a Triton stopped past its exit timeout leaves in /dev/shm: the launcher's prefix
        # carries its own pid (the service's owner tag is the service's, not set here)
        remove_regions([f"{PREFIX_OPTION}prefix0_{self.process.pid}_"])

    def metric(self, name: str, **labels: str) -> float:
        """Sum of a Prometheus metric from Triton's metrics endpoint, filtered by labels."""
        return prometheus_metric(f"http://127.0.0.1:{self.metrics_port}/metrics", name, **labels)


@contextlib.contextmanager
def stopped_soon(server: TritonServer) -> Iterator[TritonServer]:
    """`with server:` for a fixture whose server's stop no test looks at: started, and stopped with
    `stop_soon` when the block ends."""
    server.__enter__()
    try:
        yield server
    finally:
        server.stop_soon()


def prometheus_metric(url: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus metric at `url` (a /metrics endpoint), filtered by labels."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)$", line)
        if not match:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total


def tensor(name: str, value: Any, dtype: Any = None) -> grpcclient.InferInput:
    """An InferInput with a leading batch dimension, as Triton clients send scalars: [1, 1]."""
    array = np.asarray(value, dtype=dtype)
    if array.dtype.kind in "US":
        array = np.char.encode(array.astype(str), "utf-8").astype(np.object_)
    if array.ndim == 0:
        array = array.reshape(1, 1)
    elif array.ndim == 1:
        array = array.reshape(1, -1)
    infer_input = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    infer_input.set_data_from_numpy(array)
    return infer_input


def text_inputs(
    prompt: str, max_tokens: int, *, counts: bool = True, **extra: Any
) -> list[grpcclient.InferInput]:
    """Ensemble inputs with upstream's names and dtypes.

    With `counts`, the request asks for num_input_tokens / num_output_tokens (return_num_*_tokens):
    as from the C++ backend, the engine returns them only when asked.
    """
    dtypes = {
        "stream": np.bool_,
        "temperature": np.float32,
        "top_p": np.float32,
        "top_k": np.int32,
        "seed": np.uint64,
        "end_id": np.int32,
        "min_tokens": np.int32,
        "repetition_penalty": np.float32,
        "presence_penalty": np.float32,
        "frequency_penalty": np.float32,
        "return_log_probs": np.bool_,
        "exclude_input_in_output": np.bool_,
        "embedding_bias_weights": np.float32,
        "return_num_input_tokens": np.bool_,
        "return_num_output_tokens": np.bool_,
        "return_context_logits": np.bool_,
        "return_generation_logits": np.bool_,
    }
    if counts:
        extra = {"return_num_input_tokens": True, "return_num_output_tokens": True, **extra}
    inputs = [tensor("text_input", [prompt]), tensor("max_tokens", max_tokens, np.int32)]
    for name, value in extra.items():
        inputs.append(tensor(name, value, dtypes.get(name)))
    return inputs


@dataclass
class StreamResult:
    """Everything one streamed request returned."""

    chunks: list[bytes] = field(default_factory=list)
    outputs: list[dict[str, np.ndarray]] = field(default_factory=list)
    error: str | None = None

    @property
    def text(self) -> str:
        return b"".join(self.chunks).decode("utf-8")

    def last(self, name: str) -> np.ndarray:
        return [out[name] for out in self.outputs if name in out][-1]

    def total(self, name: str = "num_output_tokens") -> int:
        """The sum of a per-response count over the stream: NVIDIA's backend counts in
        num_output_tokens the tokens of the response it comes with."""
        return sum(int(out[name].reshape(-1)[0]) for out in self.outputs if name in out)


_OUTPUT_NAMES = {
    "ensemble": ["text_output", "num_input_tokens", "num_output_tokens", "cum_log_probs", "output_log_probs"],
    "tensorrt_llm_bls": ["text_output", "num_input_tokens", "num_output_tokens"],
    "tensorrt_llm": ["output_ids", "sequence_length", "cum_log_probs", "output_log_probs"],
}


class Streamer:
    """A gRPC bidirectional stream to Triton; one request at a time, read until final."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.responses.put((result, error)))

    def close(self) -> None:
        self.client.stop_stream(cancel_requests=True)
        self.client.close()

    def __enter__(self) -> Streamer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(
        self, inputs: list[grpcclient.InferInput], model: str = "ensemble", request_id: str = ""
    ) -> None:
        outputs = [grpcclient.InferRequestedOutput(n) for n in _OUTPUT_NAMES[model]]
        self.client.async_stream_infer(
            model, inputs, outputs=outputs, request_id=request_id, enable_empty_final_response=True
        )

    def collect(self, max_responses: int | None = None, timeout: float = 120.0) -> StreamResult:
        result = StreamResult()
        count = 0
        while max_responses is None or count < max_responses:
            response, error = self.responses.get(timeout=timeout)
            if error is not None:
                result.error = str(error)
                return result
            count += 1
            parsed = response.get_response()
            outputs = {out.name: response.as_numpy(out.name) for out in parsed.outputs}
            if "text_output" in outputs:
                result.chunks.extend(outputs["text_output"].reshape(-1).tolist())
            if outputs:
                result.outputs.append(outputs)
            if parsed.parameters["triton_final_response"].bool_param:
                return result
        return result


def run_stream(
    url: str, inputs: list[grpcclient.InferInput], model: str = "ensemble", request_id: str = ""
) -> StreamResult:
    with Streamer(url) as streamer:
        streamer.send(inputs, model=model, request_id=request_id)
        return streamer.collect()


def infer_unary(url: str, inputs: list[grpcclient.InferInput], model: str = "ensemble") -> StreamResult:
    """Non-streamed request over the same gRPC stream (decoupled models reject ModelInfer)."""
    return run_stream(url, inputs, model=model)


# ---- helpers for the model-level integration tests ------------------------------------------------


def engine_inputs(
    input_ids: Sequence[int], max_tokens: int, *, end_id: int = -1, streaming: bool = False, **extra: Any
) -> list[grpcclient.InferInput]:
    """Inputs of the `tensorrt_llm` model itself: input_ids [1, L], scalars [1, 1]."""
    dtypes = {
        "temperature": np.float32,
        "runtime_top_k": np.int32,
        "runtime_top_p": np.float32,
        "seed": np.uint64,
        "exclude_input_in_output": np.bool_,
        "stop": np.bool_,
    }
    inputs = [
        tensor("input_ids", [list(input_ids)], np.int32),
        tensor("input_lengths", len(input_ids), np.int32),
        tensor("request_output_len", max_tokens, np.int32),
        tensor("end_id", end_id, np.int32),
        tensor("streaming", streaming, np.bool_),
    ]
    for name, value in extra.items():
        inputs.append(tensor(name, value, dtypes.get(name)))
    return inputs


def output_ids(result: StreamResult) -> list[int]:
    """All token ids of a `tensorrt_llm` stream, concatenated over its responses."""
    return [int(t) for out in result.outputs if "output_ids" in out for t in out["output_ids"].reshape(-1)]


def postprocess(client: grpcclient.InferenceServerClient, token_ids: Sequence[int], request_id: str) -> bytes:
    """One unary call of the `postprocessing` model: TOKENS_BATCH [1, 1, n] -> its OUTPUT bytes."""
    tokens = np.asarray(list(token_ids), dtype=np.int32).reshape(1, 1, -1)
    batch = grpcclient.InferInput("TOKENS_BATCH", list(tokens.shape), "INT32")
    batch.set_data_from_numpy(tokens)
    length = grpcclient.InferInput("SEQUENCE_LENGTH", [1, 1], "INT32")
    length.set_data_from_numpy(np.array([[tokens.shape[-1]]], dtype=np.int32))
    result = client.infer(
        "postprocessing",
        [batch, length],
        outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
        request_id=request_id,
        client_timeout=60,
    )
    return result.as_numpy("OUTPUT").reshape(-1)[0]


@functools.lru_cache(maxsize=4)
def load_tokenizer(model_dir: str) -> Any:
    """The demo model's tokenizer (cached: several test modules need it)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Polls `predicate` until it is true or `timeout` seconds have passed; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


TOKENS_METRIC = "trtllm_reference_generated_tokens_total"
REQUESTS_METRIC = "trtllm_reference_requests_total"


def wait_engine_idle(server: TritonServer, quiet: float = 0.5, timeout: float = 60.0) -> bool:
    """Waits until the reference engine generated no token for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    last = server.metric(TOKENS_METRIC)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = server.metric(TOKENS_METRIC)
        if now == last:
            return True
        last = now
    return False


OUTCOMES = ("completed", "cancelled", "stopped", "error")


def send_stop(url: str, request_id: str) -> None:
    """TRT-LLM's early-stop protocol: a `stop` request to the engine with the same request id."""
    inputs = [
        tensor("input_ids", [[0]], np.int32),
        tensor("input_lengths", 1, np.int32),
        tensor("request_output_len", 1, np.int32),
        tensor("stop", True, np.bool_),
    ]
    with Streamer(url) as streamer:
        streamer.client.async_stream_infer(
            "tensorrt_llm", inputs, request_id=request_id, enable_empty_final_response=True
        )
        streamer.collect(timeout=30)


def check_cancellation(
    server: TritonServer, model: str, outcomes: tuple[str, ...], *, stop_request: bool = False
) -> None:
    """Closing a stream mid-generation ends the engine request at once, and the server serves on.

    The engine must count the request under one of `outcomes` within 3 s, stop generating, and a new
    request must complete quickly afterwards. With `stop_request`, the client also sends TRT-LLM's
    `stop` request for its request id after closing the stream.
    """
    assert wait_engine_idle(server), "the engine is still busy with an earlier request"

    def finished() -> float:
        return sum(server.metric(REQUESTS_METRIC, outcome=name) for name in outcomes)

    before = finished()
    streamer = Streamer(server.grpc_url)
    try:
        request_id = uuid.uuid4().hex
        streamer.send(
            text_inputs("Tell me a very long story.", 1500, stream=True, end_id=-1),
            model=model,
            request_id=request_id,
        )
        partial = streamer.collect(max_responses=3, timeout=60)
        assert partial.error is None, partial.error
        assert len(partial.outputs) == 3
        streamer.client.stop_stream(cancel_requests=True)
        if stop_request:
            send_stop(server.grpc_url, request_id)

        assert wait_for(lambda: finished() >= before + 1, timeout=3.0), (
            f"{model}: the engine did not count the request as {'/'.join(outcomes)} within 3 s; "
            f"metrics: { {name: server.metric(REQUESTS_METRIC, outcome=name) for name in OUTCOMES} } "
            f"before {before}"
        )
        tokens = server.metric(TOKENS_METRIC)
        time.sleep(1.0)
        assert server.metric(TOKENS_METRIC) == tokens, f"{model}: the engine is still generating"
        assert finished() == before + 1

        started = time.monotonic()
        after = run_stream(server.grpc_url, text_inputs("Hello", 5), model=model, request_id=uuid.uuid4().hex)
        assert after.error is None, after.error
        assert after.total("num_output_tokens") == 5
        assert time.monotonic() - started < 5.0
    finally:
        streamer.client.close()
        wait_engine_idle(server)  # a request that was not cancelled must not disturb later tests


def upstream_client_text(
    url: str, inputs: list[grpcclient.InferInput], model: str = "ensemble", request_id: str = ""
) -> tuple[str, list[Any]]:
    """Does what upstream's end_to_end_grpc_client.py does for a non-streamed request.

    It opens a stream, sends one request, waits for the server to close the stream, then reads
    every response and keeps the text of the last one (`output[0].decode()`). Returns that text
    and all the results.
    """
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: results.put(error if error else result))
        client.async_stream_infer(model, inputs, request_id=request_id)
        client.stop_stream()
    finally:
        client.close()
    received, text = [], ""
    while not results.empty():
        result = results.get()
        if isinstance(result, InferenceServerException):
            raise result
        received.append(result)
        text = result.as_numpy("text_output")[0].decode("utf-8")
    return text, received


__all__ = [
    "REQUESTS_METRIC",
    "TOKENS_METRIC",
    "InferenceServerException",
    "StreamResult",
    "Streamer",
    "TritonServer",
    "check_cancellation",
    "engine_inputs",
    "free_port",
    "free_ports",
    "infer_unary",
    "load_tokenizer",
    "output_ids",
    "postprocess",
    "prometheus_metric",
    "run_stream",
    "tensor",
    "text_inputs",
    "upstream_client_text",
    "wait_engine_idle",
    "wait_for",
]


@contextlib.contextmanager
def sent_request(url: str, path: str, body: Mapping[str, Any]) -> Iterator[socket.socket]:
    """A POST to `path` sent whole over a raw socket that the block may leave unread; the
    connection closes when the block ends, as a client that gives up does."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        yield sock


@contextlib.contextmanager
def held_request(url: str, path: str, headers: Mapping[str, str] | None = None) -> Iterator[None]:
    """A POST to `path` whose JSON body is only half sent while the block runs: it holds a
    concurrency slot for as long as the test likes, however fast the engine is."""
    host, port = url.removeprefix("http://").split(":")
    body = b'{"messages": [{"role": "user", "content": "Hi"}], "prompt": "Hi", "max_tokens": 2}'
    head = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"{head}Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:10]
        )
        yield


def alive(procs: list[Any]) -> list[Any]:
    """The psutil processes still running; a zombie has exited (its reaper may be a PID 1 that
    does not reap)."""
    import psutil

    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out
