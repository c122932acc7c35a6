"""Triton's side under the image's Python, 3.12.3, in CI: both flavours' models served, probed,
wedged, killed and stopped, through `bentoml serve .` and real clients.

NVIDIA's image runs Triton's Python models under Ubuntu 24.04's Python 3.12.3; the rest of the suite
runs them under CI's 3.11.7. The llmapi model once passed every test here and then crashed the image's
Python on its first request (Triton 2.51's stub freeing outputs the request had not asked for without
the GIL), and crashed again at every stop (metric families freed at the stub's exit). This module runs
the service as usual (3.11) with its Triton's models under noble's own python3.12 (tests/py312). Torch
has no CPU build for 3.12 on the registries these machines reach, so the engine is the synthetic one:
the crashes lived in the model's threads and Triton's stub, not in the engine. The GPU box runs the
reference engine and SmolLM2 under 3.12 (bench/box_suite.sh).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator

import anthropic
import httpx
import openai
import psutil
import pytest

from tests.e2e.conftest import BentoService, pack_demo, serving
from tests.py312.build_env import PYTHON_VERSION, ROOT, environment
from tests.support import http_ok, kernel_log, new_stub_crashes, prometheus_metric, wait_for

pytestmark = pytest.mark.box  # all of it, in the GPU box suite too

STALL_S = 6
"""TRITON_STALL_TIMEOUT of the service: a wedged model is restarted after this."""
LONG = {"prompt": "Hello", "max_tokens": 1500}


NATIVE = sys.version_info[:2] == (3, 12)
"""Already the image's Python (the GPU box, bench/box/suite.sh): Triton's models run under it as is."""


@pytest.fixture(scope="session")
def py312() -> dict[str, str]:
    """TRITONSERVER and TRITON_PYTHON: Triton's Python models under noble's python3.12 (built once)."""
    return {} if NATIVE else environment()


@pytest.fixture(scope="module")
def served(
    flavor: str, py312: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BentoService]:
    # 5 ms a step: LONG (1,500 tokens) streams for about 8 s, long enough to drop or break it.
    home = pack_demo(
        tmp_path_factory.mktemp(f"home312_{flavor}"), flavor, "--engine", "synthetic", "--step-delay-ms", "5"
    )
    env = {**py312, "TRITON_STALL_TIMEOUT": str(STALL_S), "TRITON_RESTART_BACKOFF": "0.5"}
    with serving(home, tmp_path_factory.mktemp(f"serve312_{flavor}"), env) as server:
        yield server


def stubs(server: BentoService) -> list[psutil.Process]:
    """The Python-backend stubs (here started by noble's loader: `ld-linux... --argv0 <stub> ...`)."""
    return [
        p for p in server.descendants() if any("triton_python_backend_stub" in a for a in p.cmdline()[:6])
    ]


def engine_stub(server: BentoService) -> psutil.Process:
    [stub] = [p for p in stubs(server) if p.cmdline()[-2:-1] == ["tensorrt_llm_0_0"]]
    return stub


def libpython(process: psutil.Process) -> set[str]:
    return {m.path for m in process.memory_maps() if "libpython" in m.path}


def restarts(server: BentoService) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    found = re.search(r"^trtllm:triton_restarts_total(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_the_environment_is_built_once(py312: dict[str, str]) -> None:
    """A second process that asks for it (pytest-xdist's other worker) finds it built: it used to
    build it again from nothing, under the first one's running Triton."""
    if NATIVE:
        pytest.skip("the GPU box runs the image's Python itself: nothing is built")
    venv = ROOT / "venv"
    before = venv.stat().st_ino
    assert environment() == py312
    assert venv.stat().st_ino == before


def test_the_models_run_under_the_images_python(served: BentoService) -> None:
    found = stubs(served)
    assert found, "no Python-backend stub runs"
    ours = str(ROOT / "root" / "usr/lib/x86_64-linux-gnu/libpython3.12.so.1.0")
    for stub in found:
        [library] = libpython(stub)
        assert library.endswith("/libpython3.12.so.1.0") and (NATIVE or library == ours), stub.cmdline()
    python = sys.executable if NATIVE else environment()["TRITON_PYTHON"]
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version.split()[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == PYTHON_VERSION


def test_every_route_answers(served: BentoService) -> None:
    # The final response of each carries the perf outputs the relay did not ask for: under 3.12 that
    # crashed the stub (pytriton's send drops them without the GIL) before the model sent only those.
    chunks = []
    with httpx.stream(
        "POST", f"{served.url}/generate", json={"prompt": "Hello", "max_tokens": 12}, timeout=60
    ) as response:
        assert response.status_code == 200
        chunks = [chunk for chunk in response.iter_text() if chunk]
    assert "".join(chunks)
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Hi"}]
    whole = client.chat.completions.create(model=model, messages=messages, max_tokens=8)
    assert whole.choices[0].message.content and whole.choices[0].finish_reason == "length"
    streamed = client.chat.completions.create(model=model, messages=messages, max_tokens=8, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    scored = client.chat.completions.create(
        model=model, messages=messages, max_tokens=4, logprobs=True, top_logprobs=2
    )
    tokens = scored.choices[0].logprobs.content
    assert len(tokens) == 4 and all(t.top_logprobs for t in tokens)  # the synthetic engine ranks one
    answer = client.responses.create(model=model, input="Hi", max_output_tokens=8)
    assert answer.output_text and answer.status == "incomplete"
    claude = anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0, timeout=60)
    message = claude.messages.create(model=model, max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
    assert message.content[0].text and message.stop_reason == "max_tokens"
    assert all(stub.is_running() for stub in stubs(served))


def test_a_dropped_stream_is_cancelled_in_the_engine(served: BentoService) -> None:
    def cancelled() -> float:
        return prometheus_metric(served.metrics_url, "trtllm_reference_requests_total", outcome="cancelled")

    before = cancelled()
    with httpx.stream("POST", f"{served.url}/generate", json=LONG, timeout=60) as response:
        for i, _ in enumerate(response.iter_raw()):
            if i == 5:
                break
    assert wait_for(lambda: cancelled() == before + 1, timeout=10), "the engine did not cancel the request"


def test_the_probe_answers_through_the_models_threads(served: BentoService, flavor: str) -> None:
    port = served.triton_http_port
    inputs = (
        {"probe": True}
        if flavor == "llmapi"
        else {"probe": True, "input_lengths": 1, "request_output_len": 1}
    )
    reply = httpx.post(
        f"http://127.0.0.1:{port}/v2/models/tensorrt_llm/generate_stream", json=inputs, timeout=10
    )
    assert reply.status_code == 200, reply.text
    status = json.loads(json.loads(reply.text.split("data:", 1)[1])["probe_status"])
    assert status["in_flight"] == 0 and status["busy"] is False


def test_a_wedged_model_is_seen_and_restarted(served: BentoService) -> None:
    # SIGSTOP: the stub's threads stop as in the deadlock (nothing answered, nothing progressing),
    # while tritonserver itself stays healthy and "ready".
    before = restarts(served)
    stub = engine_stub(served)
    stub.suspend()
    stopped_at = time.monotonic()
    try:
        assert http_ok(f"http://127.0.0.1:{served.triton_http_port}/v2/health/ready")
        assert wait_for(lambda: not http_ok(f"{served.url}/readyz"), timeout=STALL_S), (
            "/readyz stayed 200 while the model answered nothing"
        )
        assert wait_for(lambda: not stub.is_running(), timeout=STALL_S + 10), (
            "the wedged stub was not replaced"
        )
    finally:
        if stub.is_running():
            stub.resume()
    assert time.monotonic() - stopped_at < STALL_S + 10
    assert wait_for(lambda: http_ok(f"{served.url}/readyz"), timeout=60, interval=0.5)
    assert restarts(served) == before + 1
    assert "did not answer its probe (a wedged model)" in served.log()
    answer = httpx.post(f"{served.url}/generate", json={"prompt": "Hi", "max_tokens": 4}, timeout=60)
    assert answer.status_code == 200 and answer.text


def test_a_killed_stub_mid_stream_is_restarted(served: BentoService) -> None:
    before = restarts(served)
    stub = engine_stub(served)
    with httpx.stream("POST", f"{served.url}/generate", json=LONG, timeout=60) as response:
        chunks = response.iter_raw()
        next(chunks)
        stub.kill()
        with pytest.raises(httpx.RemoteProtocolError):  # cut short: no end of the chunked body
            for _ in chunks:
                pass
    # /readyz stays 200 until the owner's next look at the stubs (a probe interval): the restart
    # has begun once it counts, and is done once /readyz answers 200 again
    assert wait_for(lambda: restarts(served) == before + 1, timeout=10, interval=0.2)
    assert wait_for(lambda: http_ok(f"{served.url}/readyz"), timeout=60, interval=0.5)
    assert restarts(served) == before + 1
    answer = httpx.post(f"{served.url}/generate", json={"prompt": "Hi", "max_tokens": 4}, timeout=60)
    assert answer.status_code == 200 and answer.text


def test_stopping_crashes_no_stub(served: BentoService) -> None:
    # Last in the module: it stops the service. A metric family freed at the stub's exit (after the
    # stub let go of its shared memory) crashed it at every stop; the kernel's log tells.
    # Only lines the kernel logs from now on count: on a machine that has run the whole suite, an
    # earlier process (another stub, killed with its Triton) may have had one of these pids.
    pids = [stub.pid for stub in stubs(served)]
    assert pids
    before = readable_kernel_log()
    served.stop()
    time.sleep(1)
    crashed = new_stub_crashes(before, pids)
    assert not crashed, crashed


def readable_kernel_log() -> list[str]:
    """The kernel's log; skips where this machine's kernel keeps it to itself (the GPU box)."""
    try:
        return kernel_log()
    except subprocess.CalledProcessError as exc:
        if NATIVE:  # the GPU box's sandboxed kernel keeps its log to itself
            pytest.skip(f"the kernel log cannot be read here: {exc.stderr.strip()}")
        raise
