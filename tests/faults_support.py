"""Faults in a running `bentoml serve .`: its Triton's processes found, watched and waited for, a
stream read in the background, a graceful stop checked (tests/e2e: test_faults, test_hang_and_drain,
test_llmapi_launch)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.e2e.conftest import BentoService, _name
from tests.support import http_ok, wait_for

# Greedy decoding of this prompt runs to max_tokens (about 8 s for 1500 on the demo engine).
LONG_REQUEST = {"prompt": "Tell me a very long story.", "max_tokens": 1500, "temperature": 0}


FAST_RESTART = {"TRITON_RESTART_BACKOFF": "0.5"}


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """The processes still running (a zombie is as good as gone)."""
    running = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
        except psutil.NoSuchProcess:
            pass
    return running


def describe(processes: list[psutil.Process]) -> str:
    lines = []
    for process in processes:
        try:
            lines.append(f"{process.pid} {' '.join(process.cmdline())[:160]}")
        except psutil.Error:
            lines.append(f"{process.pid} (gone)")
    return "\n".join(lines)


def triton_processes(server: BentoService) -> list[psutil.Process]:
    """Every process of this service's Triton, wherever it is in the process tree (an orphan
    re-parented to init included): the launcher, tritonserver and the backend stubs all name the
    model repository in the service's own run directory."""
    run_dir = server.env["TRTLLM_RUN_DIR"]
    found = []
    for process in psutil.process_iter():
        try:
            if any(run_dir in arg for arg in process.cmdline()):
                found.append(process)
        except psutil.Error:
            pass
    return found


def wait_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Waits up to `timeout` s for the processes to end; returns those still running."""
    wait_for(lambda: not alive(processes), timeout=timeout, interval=0.2)
    return alive(processes)


def stop_gracefully(server: BentoService, send: Any, timeout: float = 45.0) -> None:
    """Delivers a stop signal with `send(process)`, then checks that `bentoml serve` exits on its own
    and that every process it started (Triton included) is gone."""
    assert server.process is not None
    processes = server.descendants() + triton_processes(server)
    assert any(_name(p) == "tritonserver" for p in alive(processes)), describe(processes)
    started = time.monotonic()
    send(server.process)
    try:
        server.process.wait(timeout=timeout)
    except Exception:
        pytest.fail(f"bentoml serve did not exit within {timeout} s:\n{server.log()[-3000:]}")
    left = wait_gone(processes, timeout=10)
    assert not left, f"processes left behind after stopping:\n{describe(left)}"
    assert not alive(triton_processes(server)), describe(triton_processes(server))
    assert time.monotonic() - started < timeout


class StreamReader(threading.Thread):
    """Reads a /generate stream in the background, recording how and when it ended."""

    def __init__(self, url: str, body: dict[str, Any], path: str = "/generate") -> None:
        super().__init__(daemon=True)
        self.url, self.body, self.path = url, body, path
        self.chunks: list[bytes] = []
        self.status: int | None = None
        self.error: BaseException | None = None
        self.ended_at: float | None = None
        self.streaming = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        try:
            with httpx.stream("POST", f"{self.url}{self.path}", json=self.body, timeout=120) as response:
                self.status = response.status_code
                for chunk in response.iter_raw():
                    self.chunks.append(chunk)
                    if len(self.chunks) >= 3:
                        self.streaming.set()
        except httpx.HTTPError as exc:
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.done.set()


def assert_serving_again(server: BentoService, dead_tritonserver: int) -> None:
    """/readyz recovers, a request is answered, and by another tritonserver than the dead one."""
    assert wait_for(lambda: http_ok(f"{server.url}/readyz"), timeout=60, interval=0.5), (
        f"/readyz did not recover within 60 s:\n{server.log()[-3000:]}"
    )
    answer = httpx.post(
        f"{server.url}/generate", json={"prompt": "Hello!", "max_tokens": 5, "temperature": 0}, timeout=60
    )
    assert answer.status_code == 200 and answer.text, answer.text
    assert dead_tritonserver not in server.tritonserver_pids()


def shm_regions(tritonserver: int) -> Callable[[], list[str]]:
    """What lists the shared-memory regions of the Python backend of this Triton and of every
    later one its service starts (they share the prefix on tritonserver's command line)."""
    [config] = [a for a in psutil.Process(tritonserver).cmdline() if "shm-region-prefix-name=" in a]
    prefix = config.split("shm-region-prefix-name=", 1)[1].split(",")[0]
    return lambda: sorted(p.name for p in Path("/dev/shm").glob(f"{prefix}*"))
