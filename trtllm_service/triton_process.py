"""Own the tritonserver child: spawn, readiness, supervision with restarts, and shutdown.

The launcher (tensorrtllm_backend/scripts/launch_triton_server.py) stays the parent of
tritonserver (or of mpirun) and forwards signals. We start it in its own process group with
PDEATHSIG set, so a SIGTERM to the group stops the whole tree and our own death takes it along.
Its output goes to a log file and to the service log.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import re
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tritonclient.grpc.aio as grpcclient_aio

from tensorrtllm_backend import LAUNCHER

logger = logging.getLogger("trtllm_service.triton")

_PR_SET_PDEATHSIG = 1
_GLOG_ERROR = re.compile(r"^E\d{4} ")  # tritonserver's own ERROR log lines


class TritonStartupError(RuntimeError):
    """tritonserver exited or was not ready in time; the message carries its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the service process dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


async def _exit_code(process: asyncio.subprocess.Process, poll_s: float = 0.1) -> int:
    """The exit code of `process`, as soon as it has exited.

    Not `process.wait()`: asyncio's wait() also waits for EOF on the child's pipes, and a process
    that inherited the launcher's stdout (an orphaned Python-backend stub after tritonserver was
    killed mid-request) can hold the pipe open for good, so wait() would never return.
    """
    while process.returncode is None:
        await asyncio.sleep(poll_s)
    return process.returncode


@dataclass(frozen=True)
class TritonPorts:
    grpc: int
    http: int
    metrics: int

    @classmethod
    def choose(cls, grpc: int, http: int, metrics: int, host: str) -> TritonPorts:
        """Configured ports, with 0 replaced by a free port."""
        return cls(grpc or free_port(host), http or free_port(host), metrics or free_port(host))


class TritonSupervisor:
    """Starts tritonserver through the launcher, watches it and restarts it when it dies."""

    def __init__(
        self,
        model_repository: Path,
        *,
        ports: TritonPorts,
        host: str = "127.0.0.1",
        world_size: int = 1,
        log_path: Path,
        startup_timeout_s: float = 600.0,
        max_restarts: int = 5,
        restart_backoff_s: float = 1.0,
        verbose: bool = False,
        on_state_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.model_repository = model_repository
        self.ports = ports
        self.host = host
        self.world_size = world_size
        self.log_path = log_path
        self.startup_timeout_s = startup_timeout_s
        self.max_restarts = max_restarts
        self.restart_backoff_s = restart_backoff_s
        self.verbose = verbose
        self.on_state_change = on_state_change
        self.process: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self._ready = False
        self._stopping = False
        self._tail: deque[str] = deque(maxlen=80)
        self._errors: deque[str] = deque(maxlen=10)
        self._pump: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.ports.metrics}/metrics"

    @property
    def ready(self) -> bool:
        return self._ready and self.process is not None and self.process.returncode is None

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(list(self._tail)[-lines:])

    def failure_details(self) -> str:
        """Triton's own error lines (the cause, which the tail of its shutdown output often misses),
        then the log tail."""
        errors = "\n".join(self._errors)
        details = f"Triton errors:\n{errors}\n" if errors else ""
        return f"{details}Last log lines ({self.log_path}):\n{self.log_tail()}"

    def command(self) -> list[str]:
        command = [
            sys.executable,
            str(LAUNCHER),
            "--model_repo",
            str(self.model_repository),
            "--world_size",
            str(self.world_size),
            "--host",
            self.host,
            "--grpc_port",
            str(self.ports.grpc),
            "--http_port",
            str(self.ports.http),
            "--metrics_port",
            str(self.ports.metrics),
        ]
        return [*command, "--log"] if self.verbose else command

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Spawns Triton and waits until the server and the ensemble are ready."""
        self._stopping = False
        await self._spawn_and_wait()
        self._watch = asyncio.create_task(self._supervise(), name="triton-supervisor")

    async def _spawn_and_wait(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._errors.clear()
        self.process = await asyncio.create_subprocess_exec(
            *self.command(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        logger.info("started Triton launcher (pid %d): grpc %s", self.process.pid, self.grpc_url)
        self._pump = asyncio.create_task(self._pump_log(self.process), name="triton-log")
        try:
            await self._wait_ready(self.process)
        except BaseException:
            await self._terminate()
            raise
        self._set_ready(True)

    async def _wait_ready(self, process: asyncio.subprocess.Process) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        client = grpcclient_aio.InferenceServerClient(self.grpc_url)
        try:
            while time.monotonic() < deadline:
                if process.returncode is not None:
                    if self._pump is not None:
                        await asyncio.wait([self._pump], timeout=5)
                    raise TritonStartupError(
                        f"tritonserver exited with code {process.returncode} during start-up. "
                        f"{self.failure_details()}"
                    )
                with contextlib.suppress(Exception):
                    if await client.is_server_ready() and await client.is_model_ready("ensemble"):
                        return
                await asyncio.sleep(0.25)
        finally:
            await client.close()
        raise TritonStartupError(
            f"tritonserver was not ready within {self.startup_timeout_s:.0f} s. {self.failure_details()}"
        )

    async def _pump_log(self, process: asyncio.subprocess.Process) -> None:
        """Copies Triton's output to the log file and the service log, keeping a tail for errors."""
        assert process.stdout is not None
        with open(self.log_path, "ab") as log_file:
            async for raw in process.stdout:
                log_file.write(raw)
                log_file.flush()
                line = raw.decode("utf-8", "replace").rstrip()
                self._tail.append(line)
                if _GLOG_ERROR.match(line):
                    self._errors.append(line)
                logger.info("[triton] %s", line)

    async def _supervise(self) -> None:
        """Restarts Triton with backoff when it dies; readiness is false meanwhile."""
        while not self._stopping:
            assert self.process is not None
            code = await _exit_code(self.process)
            if self._stopping:
                return
            self._set_ready(False)
            if self.restarts >= self.max_restarts:
                logger.error(
                    "tritonserver exited (code %s); %d restarts used, giving up", code, self.restarts
                )
                return
            delay = self.restart_backoff_s * (2**self.restarts)
            self.restarts += 1
            logger.error(
                "tritonserver exited (code %s); restart %d/%d in %.1f s",
                code,
                self.restarts,
                self.max_restarts,
                delay,
            )
            await self._kill_group(signal.SIGKILL)
            await asyncio.sleep(delay)
            if self._stopping:
                return
            try:
                await self._spawn_and_wait()
            except TritonStartupError as exc:
                logger.error("%s", exc)

    def _set_ready(self, ready: bool) -> None:
        self._ready = ready
        if self.on_state_change is not None:
            self.on_state_change(ready)

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stops Triton and every process under the launcher; safe to call twice."""
        self._stopping = True
        self._set_ready(False)
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch
        await self._terminate(timeout_s)

    async def _terminate(self, timeout_s: float = 30.0) -> None:
        process = self.process
        if process is None:
            return
        if process.returncode is None:
            await self._kill_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(_exit_code(process), timeout_s)
            except asyncio.TimeoutError:
                logger.warning("Triton launcher did not stop in %.0f s; killing its process group", timeout_s)
        await self._kill_group(signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_exit_code(process), 5)
        if self._pump is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pump, 5)

    async def _kill_group(self, sig: signal.Signals) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def kill_now(self) -> None:
        """Synchronous last resort (interpreter exit): SIGKILL the whole group."""
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
