"""A killed tritonserver leaves no crashed stub: the model's own thread ends its orphaned stub.

A server that dies never finalizes its models. Triton's stub notices only once the dead server is
reaped (it polls `kill(parent, 0)`), then frees the model's Python objects, custom metric families
among them, whose destructors message a server that is gone: a segfault, seen in the kernel's log
as `triton_python_b[pid]: segfault ... Metric::SaveToSharedMemory`. Here the launcher, which reaps
the server and kills what is left, is stopped first: a stub that leaves does so on its own.
"""

from __future__ import annotations

import signal
from pathlib import Path

import psutil
import pytest

from tests.support import TritonServer, kernel_log, new_stub_crashes, wait_for

pytestmark = pytest.mark.integration


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_killed_servers_stubs_leave_at_once_without_a_crash(demo_model_dir: Path, tmp_path: Path) -> None:
    # The llmapi model is production code; the ensemble's engine model (a stand-in for NVIDIA's C++
    # backend) runs the same thread (triton_adapter.MetricsPublisher).
    with TritonServer(
        tmp_path, engine_dir=demo_model_dir, tokenizer_dir=demo_model_dir, flavor="llmapi"
    ) as server:
        assert server.process is not None
        launcher = psutil.Process(server.process.pid)
        [triton] = [p for p in launcher.children(recursive=True) if p.name() == "tritonserver"]
        # The engine model's stub, the one that holds metric families.
        stubs = [p.pid for p in triton.children() if "tensorrt_llm_0_0" in p.cmdline()]
        assert len(stubs) == 1, [p.cmdline() for p in triton.children()]
        before = kernel_log()
        launcher.suspend()  # nobody reaps the server or kills its stubs
        try:
            triton.send_signal(signal.SIGKILL)
            assert wait_for(lambda: all(gone(pid) for pid in stubs), timeout=10), "a stub outlived its server"
        finally:
            launcher.resume()
        crashed = new_stub_crashes(before, stubs)
        assert not crashed, crashed
