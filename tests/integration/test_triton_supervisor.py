"""TritonSupervisor against a real tritonserver: readiness, restart after a crash, clean stop."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from tensorrtllm_backend.repository import build_repository, repository_values
from trtllm_service.triton_process import TritonPorts, TritonStartupError, TritonSupervisor


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _gone(processes: list[psutil.Process], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.2)
    return False


def _supervisor(repo: Path, tmp_path: Path, **kwargs: object) -> TritonSupervisor:
    return TritonSupervisor(
        repo,
        ports=TritonPorts.choose(0, 0, 0, "127.0.0.1"),
        log_path=tmp_path / "triton.log",
        startup_timeout_s=120,
        **kwargs,  # type: ignore[arg-type]
    )


def test_restart_after_crash_and_clean_stop(demo_model_dir: Path, tmp_path: Path) -> None:
    repo = build_repository(
        tmp_path / "repo", repository_values(engine_dir=demo_model_dir, tokenizer_dir=demo_model_dir)
    )
    states: list[bool] = []

    async def scenario() -> None:
        supervisor = _supervisor(repo, tmp_path, restart_backoff_s=0.2, on_state_change=states.append)
        await supervisor.start()
        try:
            assert supervisor.ready
            first = supervisor.process
            assert first is not None
            triton = [p for p in _tree(first.pid) if p.name() == "tritonserver"]
            assert triton, "no tritonserver under the launcher"
            triton[0].send_signal(signal.SIGKILL)

            deadline = time.monotonic() + 10
            while supervisor.ready and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert not supervisor.ready, "readiness did not follow Triton's death"

            deadline = time.monotonic() + 120
            while not supervisor.ready and time.monotonic() < deadline:
                await asyncio.sleep(0.25)
            assert supervisor.ready, f"Triton did not come back:\n{supervisor.log_tail()}"
            assert supervisor.restarts == 1
            assert supervisor.process is not None and supervisor.process.pid != first.pid
            tree = _tree(supervisor.process.pid)
        finally:
            await supervisor.stop()
        assert _gone(tree), "processes left after stop"
        assert not supervisor.ready

    asyncio.run(scenario())
    assert states[:3] == [True, False, True]
    log = (tmp_path / "triton.log").read_text()
    assert "successfully loaded 'ensemble'" in log or "ensemble" in log


def test_startup_failure_reports_the_log_tail(demo_model_dir: Path, tmp_path: Path) -> None:
    repo = build_repository(
        tmp_path / "repo",
        repository_values(engine_dir=demo_model_dir, tokenizer_dir=tmp_path / "no-such-tokenizer"),
    )

    async def scenario() -> None:
        supervisor = _supervisor(repo, tmp_path)
        with pytest.raises(TritonStartupError) as excinfo:
            await supervisor.start()
        message = str(excinfo.value)
        assert "exited with code" in message
        assert "preprocessing" in message, message
        assert supervisor.process is not None
        pid = supervisor.process.pid
        await supervisor.stop()
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)

    asyncio.run(scenario())
