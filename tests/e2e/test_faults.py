"""Faults, on private `bentoml serve .` instances: Triton crashing mid-request, stopping the service
with SIGTERM or Ctrl-C, and models that cannot be served."""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.e2e.conftest import BentoService
from tests.faults_support import (
    FAST_RESTART,
    LONG_REQUEST,
    StreamReader,
    alive,
    assert_serving_again,
    describe,
    shm_regions,
    stop_gracefully,
    triton_processes,
    wait_gone,
)
from tests.support import http_ok, wait_for


@pytest.mark.flavors("llmapi")  # the supervisor and the relay's error path do not depend on the flavour
def test_triton_crash_mid_stream_then_recovery_then_sigterm(make_service: Any) -> None:
    """SIGKILL tritonserver during a long stream: readiness drops, the stream ends at once with an
    error that does not name Triton's address, Triton comes back with nothing of the old one left
    (its Python backend's shared memory included), and SIGTERM then stops everything."""
    server = make_service(FAST_RESTART)
    readyz = f"{server.url}/readyz"
    first_triton = triton_processes(server)
    [tritonserver] = server.tritonserver_pids()
    regions = shm_regions(tritonserver)
    assert regions(), "no shared-memory region of the Python backend found"

    reader = StreamReader(server.url, LONG_REQUEST)
    reader.start()
    chat = {"messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 1500, "stream": True}
    sse = StreamReader(server.url, {**chat, "ignore_eos": True}, path="/v1/chat/completions")
    sse.start()
    assert reader.streaming.wait(60), f"the stream did not start: {reader.status} {reader.error}"
    assert sse.streaming.wait(60), f"the SSE stream did not start: {sse.status} {sse.error}"
    killed_at = time.monotonic()
    os.kill(tritonserver, signal.SIGKILL)

    assert wait_for(lambda: not http_ok(readyz), timeout=5), "/readyz still 200 after Triton died"
    assert reader.done.wait(10), "the in-flight stream did not end after Triton died"
    assert reader.ended_at is not None and reader.ended_at - killed_at < 5, "the stream ended late"
    assert reader.status == 200
    assert sse.done.wait(10), "the SSE stream did not end after Triton died"
    error_event = b"".join(sse.chunks).decode().strip().splitlines()[-1]
    assert "service_unavailable" in error_event, error_event
    assert "127.0.0.1" not in error_event and str(server.triton_grpc_port) not in error_event, error_event

    assert_serving_again(server, tritonserver)
    left = wait_gone(first_triton, timeout=10)
    assert not left, f"processes of the killed Triton are still running:\n{describe(left)}"

    stop_gracefully(server, lambda process: process.send_signal(signal.SIGTERM))
    assert not regions(), f"shared memory left in /dev/shm by the service's Tritons: {regions()}"
    log = server.log()
    assert "a streamed answer was cut short (503): The inference server is unavailable" in log, log[-3000:]
    assert "Exception in ASGI application" not in log, "the cut stream was logged with a traceback"

    # Last, so that the checks above run either way: a stream cut short by a crash must not look
    # like a complete answer. Plain HTTP has one way to say so: no end of the chunked body.
    assert isinstance(reader.error, httpx.RemoteProtocolError), (
        f"the stream broken by the crash ended like a complete answer ({len(reader.chunks)} chunks, "
        f"error {reader.error!r}): a client cannot tell it was cut short"
    )


def engine_stub(server: BentoService) -> psutil.Process:
    """The Python-backend stub serving the engine's model instance (tensorrt_llm_0_0)."""
    [stub] = [
        process
        for process in triton_processes(server)
        if process.cmdline()[-2:-1] == ["tensorrt_llm_0_0"] and "python_backend_stub" in process.cmdline()[0]
    ]
    return stub


@pytest.mark.box
def test_a_dead_engine_stub_mid_stream_restarts_triton(make_service: Any) -> None:
    """SIGKILL the engine's Python-backend stub during a long stream. Triton itself stays up and
    "ready" and fails every request of that model from then on; the service notices the stub's death,
    ends the stream as cut short, restarts Triton and answers again."""
    server = make_service(FAST_RESTART)
    readyz = f"{server.url}/readyz"
    [tritonserver] = server.tritonserver_pids()
    stub = engine_stub(server)

    reader = StreamReader(server.url, LONG_REQUEST)
    reader.start()
    assert reader.streaming.wait(60), f"the stream did not start: {reader.status} {reader.error}"
    killed_at = time.monotonic()
    stub.kill()

    assert wait_for(lambda: not http_ok(readyz), timeout=5), "/readyz still 200 after the stub died"
    assert reader.done.wait(15), "the in-flight stream did not end after the stub died"
    assert reader.ended_at is not None and reader.ended_at - killed_at < 10, "the stream ended late"
    assert isinstance(reader.error, httpx.RemoteProtocolError), (
        f"the stream cut by the stub's death ended like a complete answer: {reader.error!r}"
    )
    assert_serving_again(server, tritonserver)
    # Two ways Triton 2.51 takes a stub's death, both seen here: it stays up and fails that model's
    # requests (the supervisor must notice the stub), or, when the stub died holding the shared
    # memory's lock mid-response, tritonserver aborts (boost::interprocess::lock_exception; 1 run in
    # 4 with the cores busy) and the supervisor restarts it for that.
    [cause] = [line for line in server.log().splitlines() if "restart 1/" in line]
    triton_log = (Path(server.env["TRTLLM_RUN_DIR"]) / "triton.log").read_text(errors="replace")
    assert "stub of model instance 'tensorrt_llm_0_0'" in cause or (
        "tritonserver exited (code -6)" in cause and "lock_exception" in triton_log
    ), f"{cause}\ntriton.log:\n{triton_log[-2000:]}"
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert re.search(r"^trtllm:triton_restarts_total(\{[^}]*\})? 1\.0$", metrics, re.MULTILINE), metrics[
        -2000:
    ]
    stop_gracefully(server, lambda process: process.send_signal(signal.SIGTERM))


@pytest.mark.flavors("llmapi")  # the supervisor counts restarts whatever the flavour
def test_restarts_used_up_fail_the_liveness_probe(make_service: Any) -> None:
    """TRITON_MAX_RESTARTS=0 and Triton dies: nothing will bring it back inside this service, so
    /livez answers 503 in every worker (the orchestrator replaces the service) instead of the
    service staying unready but alive for good."""
    server = make_service({"TRITON_MAX_RESTARTS": "0", "TRTLLM_WORKERS": "2"})
    livez = f"{server.url}/livez"
    assert http_ok(livez)
    [tritonserver] = server.tritonserver_pids()
    os.kill(tritonserver, signal.SIGKILL)
    # Both workers answer /livez; the follower learns from the owner's state file within a poll.
    statuses: set[int] = set()

    def every_worker_says_dead() -> bool:
        statuses.clear()
        statuses.update(httpx.get(livez, timeout=10).status_code for _ in range(20))
        return statuses == {503}

    assert wait_for(every_worker_says_dead, timeout=10), f"/livez still answers {statuses}"
    answer = httpx.post(f"{server.url}/generate", json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
    assert answer.status_code == 503, answer.text
    assert "giving up" in server.log()


def end_requests_early(server: BentoService) -> None:
    """One request ended by a stop string, one by the client going away mid-stream."""
    url = f"{server.url}/generate"
    text = httpx.post(url, json={**LONG_REQUEST, "max_tokens": 30}, timeout=60).text
    stop = next(text[i : i + 3] for i in range(8, len(text) - 3) if "\ufffd" not in text[i : i + 3])
    stopped = httpx.post(url, json={**LONG_REQUEST, "stop": [stop]}, timeout=60)
    assert stopped.status_code == 200 and stop not in stopped.text, stopped.text
    with httpx.Client(timeout=60) as client, client.stream("POST", url, json=LONG_REQUEST) as response:
        chunks = response.iter_raw()
        for _ in range(3):
            next(chunks)
    # Both engine requests end within a second or two; give the service time to settle them.
    assert wait_for(lambda: not busy(server), timeout=15), "the engine is still generating"


def busy(server: BentoService) -> bool:
    tokens = server.metric("trtllm_reference_generated_tokens_total")
    time.sleep(0.5)
    return server.metric("trtllm_reference_generated_tokens_total") != tokens


@pytest.mark.flavors("llmapi")  # stopping does not depend on the flavour
def test_ctrl_c_after_requests_that_ended_early(make_service: Any) -> None:
    """Ctrl-C in a terminal: SIGINT to the foreground process group (`bentoml serve` and its
    worker; Triton runs in a session of its own). Requests that ended early (stop string, client
    gone) are no longer in flight in Triton, and nothing is left behind."""
    server = make_service()
    end_requests_early(server)
    stop_gracefully(server, lambda process: os.killpg(process.pid, signal.SIGINT))

    triton_log = (Path(server.env["TRTLLM_RUN_DIR"]) / "triton.log").read_text(errors="replace")
    assert "Waiting for in-flight requests to complete" in triton_log, "Triton was not stopped gracefully"
    in_flight = [line for line in triton_log.splitlines() if "in-flight inferences" in line]
    assert in_flight and all("Found 0 model versions" in line for line in in_flight), (
        "requests that ended early were still in flight in Triton at shutdown:\n" + "\n".join(in_flight[:4])
    )


def test_unknown_model_tag_fails_clearly(make_service: Any) -> None:
    server = make_service({"TRTLLM_MODEL": "no-such-model:v1"}, wait_ready=False)
    assert server.process is not None
    try:
        code = server.process.wait(timeout=90)
    except Exception:
        code = None
    log = server.log()
    assert "TRTLLM_MODEL='no-such-model:v1' is not in the BentoML model store" in log, log[-3000:]
    assert code not in (None, 0), f"bentoml serve did not exit with an error (code {code})"
    assert not alive(triton_processes(server))


@pytest.mark.flavors("ensemble")  # a start-up failure is reported the same on both
def test_broken_engine_fails_clearly_and_leaves_nothing(
    make_service: Any, bentoml_home: Path, packed_model_dir: Path, tmp_path: Path
) -> None:
    """A model whose weights cannot be loaded: Triton exits during start-up, the log says why, the
    service never becomes ready, and stopping it leaves no Triton behind (BentoML may be retrying)."""
    home = tmp_path / "broken-home"
    shutil.copytree(bentoml_home / "models", home / "models", symlinks=True)
    weights = home / packed_model_dir.relative_to(bentoml_home) / "engine" / "model.safetensors"
    weights.write_bytes(b"not a safetensors file")

    server = make_service({"BENTOML_HOME": str(home)}, wait_ready=False)
    assert wait_for(lambda: "TritonStartupError" in server.log(), timeout=120, interval=0.5), (
        f"no start-up error in the log:\n{server.log()[-3000:]}"
    )
    log = server.log()
    assert "tritonserver exited with code" in log, log[-3000:]
    assert "SafetensorError" in log, f"the log does not say what failed:\n{log[-4000:]}"
    assert not http_ok(f"{server.url}/readyz")

    assert server.process is not None
    processes = server.descendants() + triton_processes(server)
    server.process.send_signal(signal.SIGTERM)
    try:
        server.process.wait(timeout=90)
    except Exception:
        pytest.fail(f"bentoml serve did not exit within 90 s of SIGTERM:\n{server.log()[-3000:]}")
    left = wait_gone(processes + triton_processes(server), timeout=10)
    assert not left, f"processes left behind:\n{describe(left)}"
