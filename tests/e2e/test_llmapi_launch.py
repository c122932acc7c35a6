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
import pytest

from tests.e2e.conftest import BentoService, _name, pack_demo
from tests.faults_support import (
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


def test_two_ranks_under_the_script_serve_and_stop_with_nothing_left(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """mpirun runs the script on each rank (upstream's --trtllm_llmapi_launch): rank 0 the server,
    rank 1 TensorRT-LLM's worker node and no server; stopping the service ends both."""
    home = pack_demo(tmp_path_factory.mktemp("bentoml_home_tp2_launch"), "llmapi", "--tp-size", "2")
    server = BentoService(home, tmp_path, LAUNCH_ENV).start()
    try:
        answer = httpx.post(f"{server.url}/generate", json={"prompt": "Hi", "max_tokens": 4}, timeout=60)
        assert answer.status_code == 200 and answer.text
        procs = server.descendants()
        assert len([p for p in procs if _name(p) == "mpirun"]) == 1, describe(procs)
        assert len([p for p in procs if _name(p) == "tritonserver"]) == 1, describe(procs)
        launches, leaders = launch_tree(server)
        workers = [p for p in procs if "tensorrt_llm.llmapi.mgmn_worker_node" in " ".join(_cmdline(p))]
        assert len(leaders) == 1 and len(workers) == 1 and len(launches) >= 2, describe(procs)
        stop_gracefully(server, lambda process: process.send_signal(signal.SIGTERM))
        assert not alive(procs), describe(alive(procs))
    finally:
        server.stop()


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []
