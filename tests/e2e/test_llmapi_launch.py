"""Triton under trtllm-llmapi-launch, owned by the service: the script (the image double's, which
does what NVIDIA's does: the server in a subshell, TensorRT-LLM's leader node in the foreground) sits
between the launcher and tritonserver, and the service still stops, restarts and cleans up the whole
tree. Off the image, the engine is the stand-in (Triton's Python stub does not see the double's
tensorrt_llm); tests/e2e/test_image.py runs the real arrangement in the image double."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.e2e.conftest import BentoService, _name
from tests.e2e.test_faults import (
    FAST_RESTART,
    alive,
    assert_serving_again,
    describe,
    stop_gracefully,
    wait_gone,
)
from tests.support import http_ok, wait_for

FLAVORS = ("llmapi",)
DOUBLE = Path(__file__).resolve().parents[1] / "image_double"
LAUNCH_ENV = {
    # trtllm-llmapi-launch on PATH, and the double's tensorrt_llm for the leader node it runs
    "PATH": f"{DOUBLE / 'bin'}{os.pathsep}{os.environ['PATH']}",
    "PYTHONPATH": str(DOUBLE / "dists" / "tensorrt_llm"),
}


def launch_tree(server: BentoService) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """(the trtllm-llmapi-launch processes, the leader nodes) among the service's descendants."""
    procs = server.descendants()

    def cmdline(p: psutil.Process) -> str:
        try:
            return " ".join(p.cmdline())
        except psutil.Error:
            return ""

    launches = [p for p in procs if "trtllm-llmapi-launch" in cmdline(p)]
    leaders = [p for p in procs if "tensorrt_llm.llmapi.mgmn_leader_node" in cmdline(p)]
    return launches, leaders


def test_triton_runs_under_the_script_and_stops_with_it(make_service: Any) -> None:
    server = make_service(LAUNCH_ENV)
    answer = httpx.post(f"{server.url}/generate", json={"prompt": "Hi", "max_tokens": 4}, timeout=60)
    assert answer.status_code == 200 and answer.text
    launches, leaders = launch_tree(server)
    assert launches and len(leaders) == 1, describe(server.descendants())
    [tritonserver] = [p for p in server.descendants() if _name(p) == "tritonserver"]
    assert launches[0] in tritonserver.parents(), "tritonserver does not run under the script"
    stop_gracefully(server, lambda process: process.send_signal(signal.SIGTERM))
    assert not alive(launches + leaders), describe(launches + leaders)
    log = server.log()
    assert "left behind by trtllm-llmapi-launch" not in log, "the script did not end by itself"
    assert "exited under trtllm-llmapi-launch" not in log, log[-3000:]


def test_a_dead_tritonserver_under_the_script_is_restarted(make_service: Any) -> None:
    """The script's leader node outlives a crashed server (NVIDIA's stops it only after a clean
    exit): the launcher kills the rest of the tree, and the service starts Triton again."""
    server = make_service({**LAUNCH_ENV, **FAST_RESTART})
    launches, leaders = launch_tree(server)
    [tritonserver] = server.tritonserver_pids()
    os.kill(tritonserver, signal.SIGKILL)
    assert wait_for(lambda: not http_ok(f"{server.url}/readyz"), timeout=10), "/readyz still 200"
    assert_serving_again(server, tritonserver)
    left = wait_gone(launches + leaders, timeout=10)
    assert not left, describe(left)
    assert "tritonserver exited under trtllm-llmapi-launch" in server.log()
    new_launches, new_leaders = launch_tree(server)
    assert new_launches and len(new_leaders) == 1, describe(server.descendants())
