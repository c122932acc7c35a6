"""TritonSupervisor against a real tritonserver: readiness, restart after a crash or a hang, clean stop."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import uvloop

from tensorrtllm_backend.repository import build_repository, repository_values
from trtllm_service.triton import process
from trtllm_service.triton.process import PythonStub, TritonPorts, TritonStartupError, TritonSupervisor


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _gone(processes: list[psutil.Process], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for p in processes:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        time.sleep(0.2)
    return False


def _supervisor(repo: Path, tmp_path: Path, **kwargs: object) -> TritonSupervisor:
    """A supervisor of `repo`: the legacy ensemble (`repo`) or the llmapi flavour's one model
    (`llmapi_repo`, which starts and stops faster: what does not depend on the models uses it)."""
    return TritonSupervisor(
        repo,
        models=("ensemble", "tensorrt_llm") if (repo / "ensemble").is_dir() else ("tensorrt_llm",),
        run_dir=tmp_path / "run",
        ports=TritonPorts(0, 0, 0),
        startup_timeout_s=120,
        **kwargs,  # type: ignore[arg-type]  # each test passes the fields it sets
    )


async def _started(supervisor: TritonSupervisor) -> tuple[int, list[psutil.Process]]:
    """Starts `supervisor`: its tritonserver's pid and process tree."""
    await supervisor.start()
    server = supervisor.triton.pid if supervisor.triton else None
    assert server is not None
    return server, _tree(server)


def _blocks_sigterm(pid: int) -> bool:
    """Whether the process's (main thread's) signal mask blocks SIGTERM, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    raise AssertionError(f"no SigBlk for {pid}")


async def _until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return predicate()


async def _unready_then_restarted(
    supervisor: TritonSupervisor, server: int | None, within: float, what: str
) -> None:
    """Not ready within `within` s of the fault, restarted once, then ready on a new tritonserver."""
    started = time.monotonic()
    assert await _until(lambda: not supervisor.ready, 5), f"{what} went unnoticed"
    assert time.monotonic() - started < within
    assert await _until(lambda: supervisor.restarts == 1, 30), f"Triton was not restarted after {what}"
    assert await _until(lambda: supervisor.ready, 120), supervisor.log_tail()
    assert supervisor.triton is not None and supervisor.triton.pid != server


@pytest.fixture(scope="module")
def repo(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(
        tmp_path_factory.mktemp("supervised") / "repo",
        repository_values(engine_dir=demo_model_dir, tokenizer_dir=demo_model_dir),
    )


@pytest.fixture(scope="module")
def llmapi_repo(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(
        tmp_path_factory.mktemp("supervised_llmapi") / "repo",
        repository_values(engine_dir=demo_model_dir, tokenizer_dir=demo_model_dir),
        flavor="llmapi",
    )


def test_restart_after_crash_and_clean_stop(repo: Path, tmp_path: Path) -> None:
    states: list[bool] = []
    restarts: list[int] = []

    async def scenario() -> None:
        supervisor = _supervisor(
            repo,
            tmp_path,
            restart_backoff_s=0.2,
            on_state_change=states.append,
            on_restart=lambda: restarts.append(1),
        )
        await supervisor.start()
        try:
            assert supervisor.ready
            first = supervisor.triton.pid if supervisor.triton else None
            assert first is not None and psutil.Process(first).name() == "tritonserver"
            assert os.getpgid(first) == first, "the server leads its own process group"
            first_port = supervisor.ports.grpc
            os.kill(first, signal.SIGKILL)

            assert await _until(lambda: not supervisor.ready, 10), "readiness did not follow Triton's death"
            assert await _until(lambda: supervisor.ready, 120), (
                f"Triton did not come back:\n{supervisor.log_tail()}"
            )
            assert supervisor.restarts == 1 and restarts == [1]
            second = supervisor.triton.pid if supervisor.triton else None
            assert second is not None and second != first
            assert supervisor.ports.grpc != first_port, "free ports are chosen again at every start"
            tree = _tree(second)
            assert len(tree) >= 4, "tritonserver and its Python-backend stubs"
        finally:
            await supervisor.stop()
        assert _gone(tree), "processes left after stop"
        assert not supervisor.ready

    asyncio.run(scenario())
    assert states[:3] == [True, False, True]
    assert "successfully loaded 'ensemble'" in (tmp_path / "run" / "triton.log").read_text()


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_sigterm_from_outside_does_not_stop_triton_only_the_supervisor_does(
    llmapi_repo: Path, tmp_path: Path, loop: str
) -> None:
    """BentoML's process manager SIGTERMs a worker's children (Triton) the moment it stops the worker,
    while the worker still drains its streams: Triton must serve on until the supervisor stops it.
    On uvloop (what BentoML's workers run) and asyncio's own loop: they spawn differently."""

    async def scenario() -> None:
        supervisor = _supervisor(llmapi_repo, tmp_path, probe_interval_s=0.25)
        server, tree = await _started(supervisor)
        engines = [stub.pid for stub in supervisor.stubs if stub.instance.rsplit("_", 2)[0] == "tensorrt_llm"]
        assert _blocks_sigterm(server) and engines, supervisor.stubs
        # The engine's stub takes SIGTERM again: the processes an engine starts stop as upstream expects.
        assert not any(_blocks_sigterm(pid) for pid in engines)
        try:
            os.kill(server, signal.SIGTERM)  # what circus's stop_children sends
            await asyncio.sleep(3)
            assert supervisor.ready and supervisor.restarts == 0, supervisor.log_tail()
            assert psutil.Process(server).status() != psutil.STATUS_ZOMBIE
            assert "Signal (15)" not in supervisor.log_tail(), "Triton began its shutdown on SIGTERM"
        finally:
            started = time.monotonic()
            await supervisor.stop()
        assert time.monotonic() - started < 10, "the supervisor's stop was not a graceful one"
        assert _gone(tree), "processes left after stop"
        log = supervisor.log_tail(200)
        assert "Signal (2) received" in log and "successfully unloaded" in log, log

    with asyncio.Runner(loop_factory=uvloop.new_event_loop if loop == "uvloop" else None) as runner:
        runner.run(scenario())


def test_a_hung_server_is_unready_then_restarted(llmapi_repo: Path, tmp_path: Path) -> None:
    """SIGSTOP: no health answers -> not ready within seconds -> killed and restarted after the stall timeout."""

    async def scenario() -> None:
        supervisor = _supervisor(
            llmapi_repo, tmp_path, restart_backoff_s=0.2, probe_interval_s=0.5, stall_timeout_s=4
        )
        await supervisor.start()
        try:
            hung = supervisor.triton.pid if supervisor.triton else None
            assert hung is not None
            os.kill(hung, signal.SIGSTOP)
            await _unready_then_restarted(supervisor, hung, within=5, what="a hung server")
            assert not psutil.pid_exists(hung) or psutil.Process(hung).status() == psutil.STATUS_ZOMBIE
        finally:
            await supervisor.stop()

    asyncio.run(scenario())


def test_a_stop_whose_cancel_a_probe_drops_still_stops(
    llmapi_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python 3.11's asyncio.wait_for returns its result and drops a cancel that comes as its own
    await completes. The watch's probes use it, so stop()'s cancel of the watch could be lost: stop()
    then waited on a watch that went on probing, and the owner killed Triton's tree 35 s later (seen
    once under load). The race is rare; a fake probe that always drops the cancel makes it certain
    (the one fake here: a real probe loses it only by chance)."""
    real_http_ok = process.http_ok
    probing = asyncio.Event()

    async def drops_the_cancel(*args: Any, **kwargs: Any) -> bool:
        probing.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(1.0)
        return await real_http_ok(*args, **kwargs)

    async def scenario() -> None:
        supervisor = _supervisor(llmapi_repo, tmp_path, probe_interval_s=0.05)
        server, tree = await _started(supervisor)
        monkeypatch.setattr(process, "http_ok", drops_the_cancel)
        await asyncio.wait_for(probing.wait(), 10)
        stopping = asyncio.ensure_future(supervisor.stop())
        stopped, _ = await asyncio.wait([stopping], timeout=20)
        if not stopped:  # killing Triton ends the watch, and with it the stop
            for leftover in _tree(server):
                with contextlib.suppress(psutil.Error):
                    leftover.kill()
            await stopping
        assert stopped, "stop() waited on a watch that went on probing"
        assert _gone(tree, timeout=5)

    asyncio.run(scenario())


def test_a_dead_python_stub_is_noticed_and_triton_restarted(
    repo: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Triton 2.51 stays ready when a Python-backend stub dies (it fails that model's requests from
    then on): the supervisor watches the stubs' processes and restarts Triton."""

    async def scenario() -> None:
        supervisor = _supervisor(repo, tmp_path, restart_backoff_s=0.2, probe_interval_s=0.5)
        await supervisor.start()
        try:
            assert sorted(stub.instance for stub in supervisor.stubs) == [
                "postprocessing_0_0",
                "preprocessing_0_0",
                "tensorrt_llm_0_0",
                "tensorrt_llm_bls_0_0",
            ]
            [engine] = [stub for stub in supervisor.stubs if stub.instance == "tensorrt_llm_0_0"]
            assert psutil.Process(engine.pid).name().startswith("triton_python")
            server = supervisor.triton.pid if supervisor.triton else None
            os.kill(engine.pid, signal.SIGKILL)
            await _unready_then_restarted(supervisor, server, within=3, what="a dead stub")
            assert len(supervisor.stubs) == 4 and engine.pid not in {stub.pid for stub in supervisor.stubs}
            assert all(stub.alive() for stub in supervisor.stubs)
        finally:
            await supervisor.stop()
        assert not any(stub.alive() for stub in supervisor.stubs), "stubs left after stop"

    with caplog.at_level("ERROR", logger="trtllm_service.triton"):
        asyncio.run(scenario())
    assert "stub of model instance 'tensorrt_llm_0_0'" in caplog.text, caplog.text


def test_a_server_killed_under_trtllm_llmapi_launch_is_blamed_not_its_stubs(
    llmapi_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A killed tritonserver takes its stubs with it, and the launcher above trtllm-llmapi-launch
    sees the server gone only at its next poll. The launcher is held (SIGSTOP) until the supervisor,
    probing every 0.1 s, has seen the dead stub: the restart's cause is still the server's exit."""
    double = Path(__file__).resolve().parents[1] / "image_double"
    monkeypatch.setenv("PATH", f"{double / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(double / "dists" / "tensorrt_llm"))

    async def scenario() -> None:
        supervisor = _supervisor(
            llmapi_repo, tmp_path, llmapi=True, restart_backoff_s=0.2, probe_interval_s=0.1
        )
        await supervisor.start()
        try:
            assert supervisor.triton is not None and supervisor.triton.process is not None
            launcher = supervisor.triton.process.pid
            [server] = [p for p in _tree(launcher) if p.name() == "tritonserver"]
            [engine] = [stub for stub in supervisor.stubs if stub.instance == "tensorrt_llm_0_0"]
            os.kill(launcher, signal.SIGSTOP)
            try:
                server.kill()
                assert await _until(lambda: not engine.alive(), 10), "the stub outlived its server"
                await asyncio.sleep(0.5)  # five probes of the supervisor's
            finally:
                os.kill(launcher, signal.SIGCONT)
            assert await _until(lambda: supervisor.restarts == 1, 30), supervisor.log_tail()
            assert await _until(lambda: supervisor.ready, 120), supervisor.log_tail()
        finally:
            await supervisor.stop()

    with caplog.at_level("ERROR", logger="trtllm_service.triton"):
        asyncio.run(scenario())
    [cause] = [record.getMessage() for record in caplog.records if "restart 1/" in record.getMessage()]
    assert cause.startswith("tritonserver exited (code 1)"), cause


def test_restarts_in_a_row_are_limited_and_a_stable_run_resets_the_count(
    llmapi_repo: Path, tmp_path: Path
) -> None:
    """max_restarts=1: a crash, a run that stays up past stable_run_s, a crash (restarted: the count
    began again), a crash right after (no restart: gave_up, for the liveness probe)."""

    async def kill_and_wait(supervisor: TritonSupervisor) -> None:
        pid = supervisor.triton.pid if supervisor.triton else None
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert await _until(lambda: not supervisor.ready, 10)

    async def scenario() -> None:
        supervisor = _supervisor(llmapi_repo, tmp_path, restart_backoff_s=0.2, max_restarts=1, stable_run_s=3)
        await supervisor.start()
        try:
            await kill_and_wait(supervisor)
            assert await _until(lambda: supervisor.ready, 120), supervisor.log_tail()
            assert supervisor.restarts == 1 and not supervisor.gave_up
            await asyncio.sleep(3.5)
            await kill_and_wait(supervisor)
            assert await _until(lambda: supervisor.ready, 120), "the count did not start again"
            assert supervisor.restarts == 2 and not supervisor.gave_up
            await kill_and_wait(supervisor)
            assert await _until(lambda: supervisor.gave_up, 10), "a crash loop was restarted forever"
            await asyncio.sleep(1)
            assert supervisor.restarts == 2 and not supervisor.ready
        finally:
            await supervisor.stop()

    asyncio.run(scenario())


def test_a_server_that_answers_again_is_ready_again_without_restart(
    llmapi_repo: Path, tmp_path: Path
) -> None:
    async def scenario() -> None:
        supervisor = _supervisor(llmapi_repo, tmp_path, probe_interval_s=0.5, stall_timeout_s=60)
        await supervisor.start()
        try:
            pid = supervisor.triton.pid if supervisor.triton else None
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            assert await _until(lambda: not supervisor.ready, 5)
            os.kill(pid, signal.SIGCONT)
            assert await _until(lambda: supervisor.ready, 10)
            assert supervisor.restarts == 0 and supervisor.triton is not None and supervisor.triton.pid == pid
        finally:
            await supervisor.stop()

    asyncio.run(scenario())


def test_a_free_port_another_triton_took_first_is_given_up_for_another(
    llmapi_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A free port is chosen, then let go for Triton to take; another server can take it first.
    In CI two starts were handed one HTTP port: the later Triton exited ("already in use") and
    its owner took the other Triton's answers for its own readiness. Here the race is made
    certain, the one fake: the first choice of ports holds another real Triton's HTTP port. The
    supervisor must not count the other server's readiness, and must start again on other ports;
    a configured port in use is an error that names it."""

    async def scenario() -> None:
        other = _supervisor(llmapi_repo, tmp_path / "other")
        await other.start()
        try:
            taken = other.ports.http
            choose = TritonPorts.choose
            choices: list[TritonPorts] = []

            def first_one_taken(grpc: int, http: int, metrics: int, host: str) -> TritonPorts:
                chosen = choose(grpc, http, metrics, host)
                choices.append(dataclasses.replace(chosen, http=taken) if not choices else chosen)
                return choices[-1]

            monkeypatch.setattr(TritonPorts, "choose", staticmethod(first_one_taken))
            supervisor = _supervisor(llmapi_repo, tmp_path / "this")
            try:
                await supervisor.start()
                assert [c.http for c in choices][:1] == [taken] and len(choices) == 2, choices
                assert supervisor.ports.http != taken and supervisor.restarts == 0
                assert await process.server_name("127.0.0.1", supervisor.ports.http) == supervisor.server_id
                assert (
                    await process.server_name("127.0.0.1", taken) == other.server_id != supervisor.server_id
                )
            finally:
                await supervisor.stop()

            monkeypatch.setattr(TritonPorts, "choose", choose)
            configured = TritonSupervisor(
                llmapi_repo,
                models=("tensorrt_llm",),
                run_dir=tmp_path / "configured",
                ports=TritonPorts(0, taken, 0),
                startup_timeout_s=120,
            )
            with pytest.raises(
                TritonStartupError,
                match=f"HTTP port {taken} is configured, and another process has it",
            ):
                await configured.start()
            await configured.stop()
            assert other.ready, "the other Triton serves on"
        finally:
            await other.stop()

    asyncio.run(scenario())


def test_startup_failure_reports_the_log_tail(demo_model_dir: Path, tmp_path: Path) -> None:
    broken = build_repository(
        tmp_path / "repo",
        repository_values(engine_dir=demo_model_dir, tokenizer_dir=tmp_path / "no-such-tokenizer"),
    )

    async def scenario() -> None:
        supervisor = _supervisor(broken, tmp_path)
        with pytest.raises(TritonStartupError) as excinfo:
            await supervisor.start()
        message = str(excinfo.value)
        assert "exited with code" in message
        assert "preprocessing" in message, message
        assert supervisor.triton is not None and supervisor.triton.pid is not None
        pid = supervisor.triton.pid
        await supervisor.stop()
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)

    asyncio.run(scenario())


def test_a_process_a_stub_forked_is_not_taken_for_a_stub() -> None:
    """A stub's fork keeps the stub's command line and goes away again (the `segfault at 60` lines
    of dmesg on these machines are such forks exiting): taken for a stub, its exit restarted Triton.
    Here a stand-in tree: a parent (as tritonserver), a process named as a stub, and its fork."""
    script = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\n    os._exit(0)\ntime.sleep(60)\n"
    stub = f'exec -a /opt/backends/python/triton_python_backend_stub {sys.executable} -c "$0" tensorrt_llm_0_0 DEFAULT'
    root = subprocess.Popen(["bash", "-c", f"bash -c '{stub}' \"$0\" & wait", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while len(_tree(root.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = _tree(root.pid)
        assert len(tree) == 3, [p.cmdline() for p in tree]
        stubs = PythonStub.find(root.pid)
        assert [(s.instance, psutil.Process(s.pid).ppid()) for s in stubs] == [("tensorrt_llm_0_0", root.pid)]
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()
