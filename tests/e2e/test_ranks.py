"""Two ranks under a real mpirun, on CPU, through `bentoml serve .`: the demo packed with
`--tp-size 2` (both flavours). Rank 0 serves, rank 1 idles beside it (a stand-in engine has no
shard to host); what is proven is the launch and its supervision: the service is ready only while
rank 0 serves, a killed rank brings the whole tree down and back up, and stopping the service
leaves no rank behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.e2e.conftest import REPO_ROOT, BentoService
from tests.support import alive, http_ok

FLAVORS = ("llmapi", "ensemble")


@pytest.fixture(scope="module")
def two_rank_home(flavor: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp(f"bentoml_home_tp2_{flavor}")
    env = {**os.environ, "BENTOML_HOME": str(home), "BENTOML_DO_NOT_TRACK": "true"}
    subprocess.run(
        [sys.executable, "pack_model.py", "--demo", "tiny", "--flavor", flavor, "--tp-size", "2", "--quiet"],
        cwd=REPO_ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return home


def tree(service: BentoService) -> list[psutil.Process]:
    """Every process under `bentoml serve` now (ranks included: they are mpirun's children)."""
    return service.descendants()


def triton_tree(service: BentoService) -> list[psutil.Process]:
    """mpirun and everything under it: rank supervisors, tritonservers, Python-backend stubs."""
    mpirun = [p for p in tree(service) if p.name() == "mpirun"]
    assert len(mpirun) == 1, [p.name() for p in tree(service)]
    return [mpirun[0], *mpirun[0].children(recursive=True)]


def ranks(service: BentoService) -> list[psutil.Process]:
    """The tritonserver of each rank, rank 0 (the one with endpoints) first."""
    servers = [p for p in tree(service) if _cmdline(p)[:1] and p.name() == "tritonserver"]
    return sorted(servers, key=lambda p: "--allow-http=false" in _cmdline(p))


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def chat(service: BentoService) -> str:
    body = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0}
    response = httpx.post(f"{service.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_two_ranks_serve_restart_together_and_leave_nothing(two_rank_home: Path, tmp_path: Path) -> None:
    service = BentoService(two_rank_home, tmp_path).start()
    everything: list[psutil.Process] = []
    try:
        first = ranks(service)
        assert len(first) == 2, [p.name() for p in tree(service)]
        assert "--allow-http=false" in _cmdline(first[1]) and "--allow-http=false" not in _cmdline(first[0])
        # Triton's own lines go to triton.log (the service log has them at debug level only).
        assert (
            "rank 1 idles; rank 0 serves" in (Path(service.env["TRTLLM_RUN_DIR"]) / "triton.log").read_text()
        )
        answer = chat(service)
        assert answer
        old_tree = triton_tree(service)
        assert len(old_tree) >= 5, old_tree  # mpirun, 2 rank supervisors, 2 tritonservers (+ stubs)
        everything += old_tree

        # Rank 1 killed: mpirun ends the job and the service turns not ready (as soon as it sees
        # mpirun exit or a health probe fail), every process of the old tree goes, and the
        # service turns ready again only once the new rank 0 serves.
        first[1].send_signal(signal.SIGKILL)
        readyz = f"{service.url}/readyz"
        deadline = time.monotonic() + 15
        while http_ok(readyz):
            assert time.monotonic() < deadline, "still ready 15 s after a rank was killed"
            time.sleep(0.05)
        triton_ready = f"http://127.0.0.1:{service.triton_http_port}/v2/health/ready"
        deadline = time.monotonic() + 120
        while not http_ok(readyz):
            assert time.monotonic() < deadline, f"not back in 120 s:\n{service.log()[-4000:]}"
            time.sleep(0.05)
        assert http_ok(triton_ready), "the service turned ready while rank 0 does not serve"
        assert alive(old_tree) == [], [(p.pid, p.name()) for p in alive(old_tree)]

        second = ranks(service)
        assert {p.pid for p in second}.isdisjoint(p.pid for p in first)
        assert chat(service) == answer  # greedy, so the restarted tree answers the same
        everything += tree(service)

        # BentoML's process manager SIGTERMs the worker's children (mpirun) when it stops the
        # worker, before the drain: mpirun would take the ranks down a second later. It holds on.
        mpirun = triton_tree(service)[0]
        mpirun.send_signal(signal.SIGTERM)
        time.sleep(2)
        assert mpirun.is_running() and http_ok(readyz) and chat(service) == answer
    finally:
        everything += tree(service)
        service.stop()
    assert alive(everything) == [], [(p.pid, p.name()) for p in alive(everything)]
