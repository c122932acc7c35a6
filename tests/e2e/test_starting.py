"""While `bentoml serve .` starts: the port answers from the moment it is bound, and a start that
fails says so (issue 35: for ~45 s the port accepted connections and answered nothing, /readyz
included, because BentoML ran the start-up hook, which waited for Triton, before serving; issue 44:
then 11 s, while the worker imported the service, answered by `bentoml serve`'s own process now)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import BentoService
from tests.support import http_ok, wait_for

FLAVORS = ("llmapi",)  # starting does not depend on the repository flavour


def wait_bound(server: BentoService, timeout: float = 120.0) -> float:
    """Waits until the service's port accepts connections; returns when (time.monotonic)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.process is not None and server.process.poll() is None, server.log()[-3000:]
        try:
            socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
            return time.monotonic()
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"the port was not bound within {timeout} s:\n{server.log()[-3000:]}")


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """`count` processes spinning `while True: pass`, as other work on the machine would."""
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def error_of(response: httpx.Response) -> dict[str, Any]:
    payload = response.json()
    assert set(payload) == {"error"} and set(payload["error"]) == {"message", "type", "param", "code"}, (
        payload
    )
    return payload["error"]  # type: ignore[no-any-return]  # parsed JSON


def test_answers_from_the_moment_the_port_is_bound(make_service: Any, model_name: str) -> None:
    """/livez 200 within 2 s of the bind with two busy loops on the machine (the worker imports the
    service meanwhile: 11 s seen before), /readyz 503, every generation route 503 with Retry-After in
    the one error shape (Anthropic's 529 on /v1/messages), each at once; then ready, and served."""
    with busy_loops(2):
        server = make_service(wait_ready=False)
        bound = wait_bound(server)
        livez = httpx.get(f"{server.url}/livez", timeout=30)
        first_answer = time.monotonic() - bound
    assert livez.status_code == 200, livez.text
    assert first_answer < 2, f"the first answer came {first_answer:.1f} s after the port was bound"
    url = server.url
    with httpx.Client(base_url=url, timeout=30) as client:
        readyz = client.get("/readyz")
        assert readyz.status_code == 503, "ready already: Triton started faster than the probes ran?"
        assert error_of(readyz)["code"] == "service_unavailable"
        generating = [
            ("/generate", {"prompt": "Hi", "max_tokens": 2}),
            ("/v1/chat/completions", {"model": model_name, "messages": [{"role": "user", "content": "Hi"}]}),
            ("/v1/completions", {"model": model_name, "prompt": "Hi", "max_tokens": 2}),
            ("/v1/responses", {"model": model_name, "input": "Hi", "max_output_tokens": 2}),
        ]
        for path, body in generating:
            started = time.monotonic()
            response = client.post(path, json=body)
            assert time.monotonic() - started < 5, f"{path} was held {time.monotonic() - started:.1f} s"
            assert response.status_code == 503, (path, response.text[:300])
            assert int(response.headers["retry-after"]) >= 1, path
            error = error_of(response)
            assert error["type"] == "server_error" and error["code"] == "service_unavailable", error
            assert "retry" in error["message"] or "starting" in error["message"], error
        anthropic = client.post(
            "/v1/messages",
            json={"model": model_name, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]},
        )
        assert anthropic.status_code == 529 and anthropic.headers["retry-after"], anthropic.text
        assert anthropic.json()["error"]["type"] == "overloaded_error"
        assert anthropic.headers["request-id"] == anthropic.headers["x-request-id"]
        assert client.get("/livez").status_code == 200

    assert wait_for(lambda: http_ok(f"{url}/readyz"), timeout=240, interval=0.5), server.log()[-3000:]
    answer = httpx.post(
        f"{url}/generate", json={"prompt": "Hi", "max_tokens": 3, "temperature": 0}, timeout=60
    )
    assert answer.status_code == 200 and answer.text, answer.text
    log = server.log()
    assert log.count("Triton starting (pid ") == 1, "one Triton for the service"
    assert "the service could not start" not in log
    polls = [line for line in log.splitlines() if "status=503" in line]
    assert not polls, f"the 503s answered while starting were access-logged: {polls[:2]}"


@pytest.mark.flavors("ensemble")  # the broken weights file is the ensemble flavour's engine
def test_a_start_that_fails_says_so(
    make_service: Any, bentoml_home: Path, packed_model_dir: Path, tmp_path: Path
) -> None:
    """A model whose weights cannot be loaded: the port still answers; Triton's failure is one
    ERROR line with its cause, /livez turns 503 (the orchestrator replaces the service), and the
    generation routes answer 503 without Retry-After (retrying cannot help)."""
    home = tmp_path / "broken-home"
    shutil.copytree(bentoml_home / "models", home / "models", symlinks=True)
    weights = home / packed_model_dir.relative_to(bentoml_home) / "engine" / "model.safetensors"
    weights.write_bytes(b"not a safetensors file")

    server = make_service({"BENTOML_HOME": str(home)}, wait_ready=False)
    wait_bound(server)
    url = server.url
    assert httpx.get(f"{url}/readyz", timeout=30).status_code == 503
    assert wait_for(
        lambda: httpx.get(f"{url}/livez", timeout=30).status_code == 503, timeout=120, interval=0.5
    ), f"/livez did not turn 503:\n{server.log()[-3000:]}"
    log = server.log()
    errors = [line for line in log.splitlines() if "the service could not start" in line]
    assert len(errors) == 1 and "TritonStartupError: tritonserver exited with code" in errors[0], log[-3000:]
    assert "SafetensorError" in log, log[-3000:]
    response = httpx.post(f"{url}/generate", json={"prompt": "Hi", "max_tokens": 2}, timeout=30)
    assert response.status_code == 503 and "retry-after" not in response.headers, response.text
    assert "could not start" in error_of(response)["message"]
    assert server.process is not None and server.process.poll() is None, "the service stays up to say why"
