"""The one owner of the Triton process tree: command line, spawn, readiness, death and stall, restart, stop.

The command line comes from one builder, the launcher's (`launcher.build_command`:
tritonserver for one rank, mpirun for several). The service spawns it itself, in a new session
(its process group holds tritonserver and its Python-backend stubs, or mpirun; mpirun gives each
rank a group of its own) with PR_SET_PDEATHSIG, so the tree is told to stop even when the service
is SIGKILLed (each rank's supervisor dies with mpirun in turn).
Stopping sends SIGINT to the server (it unloads its models and stops its stubs, as on SIGTERM;
under mpirun, to each rank's supervisor, see the launcher), then SIGKILLs the tree after a grace
period. SIGTERM is blocked in the tree's first process: BentoML's process manager SIGTERMs every
worker's children the moment it stops the workers (circus `stop_children`), which would start
Triton's own shutdown (the engines give requests in flight 30 s, then cut them) while the worker
still drains its streams through Triton. So nothing but the owner stops Triton, and only after
the drain. The engine models unblock it again in their stubs (`triton_adapter.take_sigterm`), so
the processes an engine starts stop on SIGTERM as upstream expects.

`TritonSupervisor` watches the process: it is not ready while it starts, after it died (it is
restarted with backoff) and while it does not answer health probes; a server that stays
unresponsive past `stall_timeout_s` is killed and restarted, and so is one whose Python-backend
stub died (Triton itself stays "ready" then, failing every request of that model).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

import httpx

from tensorrtllm_backend import LAUNCHER, launcher
from trtllm_service.tokenizer_loading import environ_for_children
from trtllm_service.triton.loopback import loopback_client
from trtllm_service.triton.shm import owner_tag, remove_regions, sweep_orphaned_regions
from trtllm_service.versions import REQUIRE_TENSORRT_LLM, installed_tensorrt_llm

logger = logging.getLogger("trtllm_service.triton")

_PR_SET_PDEATHSIG = 1
_GLOG_ERROR = re.compile(r"^E\d{4} ")  # tritonserver's own ERROR log lines
_GLOG_WARNING = re.compile(r"^[EW]\d{4} ")  # its ERROR and WARNING lines


LOG_LINE_LIMIT = 16 * 1024
"""The most bytes of one line of Triton's output that the service keeps (triton.log and its log):
a model may log a client's whole input (a 600 KB grammar in an engine's error)."""
LOG_READ_BYTES = 64 * 1024


class LineCutter:
    """Splits a byte stream into lines of at most `limit` bytes, however long a line runs: the part
    past the limit is dropped, and its size said at the end of the kept part."""

    def __init__(self, limit: int = LOG_LINE_LIMIT) -> None:
        self.limit = limit
        self._kept = bytearray()
        self._dropped = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines `chunk` completes (each ending in a newline)."""
        lines = []
        start = 0
        while start < len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            room = self.limit - len(self._kept)
            self._kept += piece[:room]
            self._dropped += max(0, len(piece) - room)
            if end < 0:
                break
            lines.append(self._take())
            start = end + 1
        return lines

    def flush(self) -> list[bytes]:
        """The last line, when the stream ended without a newline."""
        return [self._take()] if self._kept or self._dropped else []

    def _take(self) -> bytes:
        line = bytes(self._kept)
        if self._dropped:
            line += f" ... ({self._dropped} more bytes cut by the service)".encode()
        self._kept.clear()
        self._dropped = 0
        return line + b"\n"


NO_GPU_LINES = (
    "CUDA driver version is insufficient for CUDA runtime version",  # W pinned_memory_manager.cc
    "CudaDriverHelper has not been initialized",  # E server.cc
    "DCGM unable to start",  # W metrics.cc
    "Failed to initialize NVML",
)
"""What Triton warns (one line an error) on every start on a machine without a GPU driver: expected
there, so the service log says it once in its own words (`NO_GPU_NOTE`) and triton.log keeps them."""
NO_GPU_NOTE = (
    "Triton found no GPU driver here: its CUDA and DCGM warnings (one an 'E' line) are expected on "
    "a CPU machine; they are in triton.log"
)
_no_gpu_said: list[bool] = []


def triton_log_level(line: str) -> int:
    """The service log's level for one line of Triton's output (all of it is in triton.log):
    Triton's errors and warnings as warnings, the launcher's own lines (ranks) as information, the
    rest (its start-up tables of options, backends and models) at debug level. Its warnings about a
    missing GPU driver are at debug level too, and the first of them makes the service say
    NO_GPU_NOTE, once per worker."""
    if _GLOG_WARNING.match(line):
        if any(known in line for known in NO_GPU_LINES):
            if not _no_gpu_said:
                _no_gpu_said.append(True)
                logger.info(NO_GPU_NOTE)
            return logging.DEBUG
        return logging.WARNING
    if line.startswith(launcher.PROG + ":"):
        return logging.INFO
    return logging.DEBUG


EXIT_TIMEOUT_S = 10
"""tritonserver's --exit-timeout-secs: how long it waits for requests in flight when stopping (the
service stops it after its own drain, so normally none are left)."""
STOP_SIGNAL = signal.SIGINT
"""How Triton is told to stop (its handler treats SIGINT and SIGTERM alike); SIGTERM is blocked."""
STABLE_RUN_S = 600.0
"""A Triton that stayed up this long (seconds) starts the count of restarts in a row again."""
UNREADY_AFTER_MISSES = 2
"""Health probes in a row that must go unanswered before Triton counts as not ready."""
PORT_RETRIES = 3
"""Starts again on other free ports, in one start, when another process took a free port first."""
SWEEP_TRIES, SWEEP_RETRY_S = 6, 5.0
"""Sweeps of killed owners' shared memory while some of it is still mapped: 6, 5 s apart."""
PORT_IN_USE_STOP_S = 2.0
"""How long a Triton that could not take its port gets to exit before it is killed."""
SERVER_EXIT_GRACE_S = 2.0
"""How long a dead stub waits for its server's own exit to show before the stub is blamed: a killed
tritonserver takes its stubs with it, and the launcher over trtllm-llmapi-launch notices the server
only at its next poll (0.5 s), then kills and reaps the script's tree."""


PYTHON_STUB = "triton_python_backend_stub"


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and start time (clock ticks after boot), or None when it is gone."""
    fields = launcher.proc_stat(pid)
    if fields is None or len(fields) < 20:
        return None
    return fields[0].decode(), int(fields[19])


def _is_stub(argv: list[bytes]) -> bool:
    """Whether a command line is a Python-backend stub's: the stub itself, or the stub run by a
    dynamic loader (`ld-linux-x86-64.so.2 ... --argv0 <stub> <binary> ...`: how tests/py312 runs the
    image's Python's stub on a machine with an older glibc)."""
    if not argv:
        return False
    program = os.path.basename(argv[0].decode(errors="replace"))
    if program.startswith("ld-linux") and b"--argv0" in argv[:-1]:
        program = os.path.basename(argv[argv.index(b"--argv0") + 1].decode(errors="replace"))
    return program == PYTHON_STUB


@dataclass(frozen=True)
class PythonStub:
    """One Python-backend stub process of a running Triton, found once its models are ready.

    Triton never restarts a stub that died. 2.51's Python backend does not even report it: the
    server and the model stay ready while every request of that model fails with "Stub process
    ... is not healthy"; newer ones (python_backend #423) report the model unready, which the
    health probes alone would only act on after the stall timeout. The stub's process says it at once.
    """

    pid: int
    started: int  # start time from /proc: a reused pid is another process
    instance: str  # the model instance it serves, e.g. tensorrt_llm_0_0

    @classmethod
    def find(cls, root: int) -> list[PythonStub]:
        """The stubs among `root`'s descendants (under mpirun, every rank's). A process a stub forked
        (same command line, gone again soon) is not one: a stub's parent is a tritonserver."""
        argvs: dict[int, list[bytes]] = {}
        for pid in launcher.descendants(root):
            try:
                argvs[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            except OSError:
                continue
        stubs = []
        for pid, argv in argvs.items():
            fields = launcher.proc_stat(pid)
            if fields is None or len(fields) < 20 or not _is_stub(argv):
                continue
            if _is_stub(argvs.get(int(fields[1]), [])):
                continue  # forked by a stub
            # argv ends with the instance name and its execution environment ("DEFAULT")
            instance = argv[-2].decode(errors="replace") if len(argv) >= 3 else "?"
            stubs.append(cls(pid, int(fields[19]), instance))
        return stubs

    def alive(self) -> bool:
        stat = _proc_stat(self.pid)
        return stat is not None and stat[1] == self.started and stat[0] not in "ZX"


class TritonStartupError(RuntimeError):
    """tritonserver exited or was not ready in time; the message carries its log tail."""


class TritonPortInUse(TritonStartupError):
    """tritonserver could not listen on one of its ports: another process has it."""

    def __init__(self, service: str, port: int, details: str) -> None:
        super().__init__(f"Triton's {service} port {port} is in use by another process. {details}")
        self.service = service
        self.port = port
        self.details = details


@dataclass(frozen=True)
class TritonPorts:
    grpc: int
    http: int
    metrics: int

    @classmethod
    def choose(cls, grpc: int, http: int, metrics: int, host: str) -> TritonPorts:
        """Configured ports, with 0 replaced by a free port, all distinct: the free ones are held
        open together while chosen (one at a time, the kernel can hand out the same port twice)."""
        configured = {grpc, http, metrics} - {0}
        held: list[socket.socket] = []
        try:
            chosen = []
            for port in (grpc, http, metrics):
                while not port:  # the sockets held open are distinct; a configured one is not free
                    sock = socket.socket()
                    sock.bind((host, 0))
                    held.append(sock)
                    port = sock.getsockname()[1]
                    if port in configured:
                        port = 0
                chosen.append(port)
            return cls(*chosen)
        finally:
            for sock in held:
                sock.close()


def triton_command(
    repository: Path,
    ports: TritonPorts,
    *,
    host: str,
    world_size: int,
    workdir: Path,
    verbose: bool = False,
    exit_timeout_s: float = EXIT_TIMEOUT_S,
    llmapi: bool = False,
    server_id: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start Triton on `repository` (the launcher's one builder).

    `server_id`: the name that Triton's GET /v2 answers with (tritonserver --id).

    The tritonserver binary is found as the launcher finds it ($TRITONSERVER, PATH, /opt/tritonserver,
    nvidia-pytriton); a pytriton build gets its Python backend staged under `workdir`.

    `llmapi`: the repository is the LLM API model, which NVIDIA starts as `trtllm-llmapi-launch
    tritonserver ...` (TensorRT-LLM's LLM API spawns its executor worker through it): so does this,
    wherever the script is (it comes with TensorRT-LLM), under the launcher's supervising mode. Where
    TensorRT-LLM is installed or required (TRTLLM_REQUIRE_TENSORRT_LLM) the script must be there;
    elsewhere the stand-in engines need no worker and Triton starts directly.

    Raises:
        TritonStartupError: No tritonserver, no mpirun for several ranks, or no trtllm-llmapi-launch
            where the LLM API needs it.
    """
    argv = [
        "--model_repo",
        str(repository),
        "--world_size",
        str(world_size),
        "--host",
        host,
        "--grpc_port",
        str(ports.grpc),
        "--http_port",
        str(ports.http),
        "--metrics_port",
        str(ports.metrics),
        "--exit_timeout_secs",
        str(max(1, round(exit_timeout_s))),
        *(["--log"] if verbose else []),
        *(["--server_id", server_id] if server_id else []),
    ]
    llmapi_launch = launch_script(llmapi)
    if llmapi_launch:
        argv.append("--trtllm_llmapi_launch")
    try:
        args = launcher.build_parser().parse_args(argv)
        install = launcher.stage_backends(launcher.find_tritonserver(None), workdir)
        mpirun = None
        if world_size > 1:
            mpirun = shutil.which("mpirun")
            if mpirun is None:
                raise launcher.LauncherError(f"world_size {world_size} needs mpirun, which is not on PATH")
        # its Python backend's shared memory named for this owner: pid namespace and pid (triton/shm.py)
        command = launcher.build_command(
            args, install, unique=owner_tag(), mpirun=mpirun, llmapi_launch=llmapi_launch
        )
    except launcher.LauncherError as exc:
        raise TritonStartupError(str(exc)) from None
    # Started through the launcher's exec that blocks SIGTERM (see the module's docstring): the
    # same process, tritonserver or mpirun, once exec'd. One trtllm-llmapi-launch tree gets the
    # launcher's supervising mode instead (SIGTERM blocked as well), which stays its parent.
    if llmapi_launch and world_size == 1:
        grace = f"{launcher.kill_grace(exit_timeout_s):g}"
        hold = [sys.executable, str(LAUNCHER), launcher.SUPERVISE_HOLDING_SIGTERM_MODE, grace, "--"]
    else:
        hold = [sys.executable, str(LAUNCHER), launcher.HOLD_SIGTERM_MODE, "--"]
    env = install.child_env(environ_for_children())  # not the tokenizer's import's os.environ
    return [*hold, *command], env


def launch_script(llmapi: bool, environ: dict[str, str] | None = None) -> str | None:
    """trtllm-llmapi-launch for an llmapi repository, or None where Triton starts directly.

    Raises:
        TritonStartupError: TensorRT-LLM is installed or required, but the script is nowhere.
    """
    if not llmapi:
        return None
    environ = dict(os.environ) if environ is None else environ
    found = launcher.find_llmapi_launch(environ)
    if found is not None:
        return found
    required = environ.get(REQUIRE_TENSORRT_LLM, "").lower() in ("1", "true", "yes")
    if required or installed_tensorrt_llm() is not None:
        raise TritonStartupError(
            f"{launcher.LLMAPI_LAUNCH} not found on PATH or beside {sys.executable}: TensorRT-LLM's LLM API "
            f"spawns its worker through it (NVIDIA starts Triton as `{launcher.LLMAPI_LAUNCH} tritonserver ...`)"
        )
    logger.info(
        "%s not found: Triton starts directly (the stand-in engine needs no worker)", launcher.LLMAPI_LAUNCH
    )
    return None


def _die_with_parent() -> None:
    """Runs in the child before exec: the stop signal when the service process dies."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, STOP_SIGNAL)


async def _exit_code(process: asyncio.subprocess.Process, poll_s: float = 0.1) -> int:
    """The exit code of `process`, as soon as it has exited.

    Not `process.wait()`: asyncio's wait() also waits for EOF on the child's pipes, and a process
    that inherited the server's stdout (an orphaned Python-backend stub after tritonserver was
    killed mid-request) can hold the pipe open for good, so wait() would never return.
    """
    while process.returncode is None:
        await asyncio.sleep(poll_s)
    return process.returncode


def kill_group(pgid: int | None, sig: signal.Signals = signal.SIGKILL) -> bool:
    """Signals a whole process group; False when it is gone already."""
    if not pgid:
        return False
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


async def _group_gone(pgid: int, timeout_s: float, poll_s: float = 0.02) -> bool:
    """Waits until no process of group `pgid` is left, killed ones reaped (True), or `timeout_s`.

    A stop returns once the whole tree is gone: the launcher is reaped at once, but its Python
    backend stubs, SIGKILLed with it, are reaped by whoever inherits them, a moment later on a
    loaded machine (a test saw the group still there right after a stop)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)  # signal 0: is any process of the group left
        except (ProcessLookupError, PermissionError):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll_s)


class TritonProcess:
    """One run of Triton: the process tree of one command line, its output, and its stop."""

    def __init__(
        self, command: Sequence[str], env: dict[str, str], log_path: Path, *, ranks: bool = False
    ) -> None:
        self.command = list(command)
        self.ranks = ranks  # the command is mpirun, one tritonserver per rank
        self.env = env
        self.log_path = log_path
        self.process: asyncio.subprocess.Process | None = None
        self.tail: deque[str] = deque(maxlen=80)
        self.errors: deque[str] = deque(maxlen=10)
        self._pump: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.process = await asyncio.create_subprocess_exec(
            *self.command,
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self._pump = asyncio.create_task(self._pump_log(self.process), name="triton-log")

    async def output_done(self, timeout_s: float = 5.0) -> None:
        """Waits (a little) until the process's output has been read to its end."""
        if self._pump is not None:
            await asyncio.wait([self._pump], timeout=timeout_s)

    async def exited(self) -> int:
        assert self.process is not None
        return await _exit_code(self.process)

    async def _pump_log(self, process: asyncio.subprocess.Process) -> None:
        """Copies Triton's output to the log file and the service log, keeping a tail for errors.

        Reads chunks, never lines: a line longer than asyncio's readline limit (64 KiB) ended the
        copy, and with nobody reading, Triton blocked on its next log write (in a Python-backend
        stub's log request, holding the stub's IPC channel: the whole model froze). Lines are cut to
        LOG_LINE_LIMIT, and nothing but the end of the stream stops the copy."""
        assert process.stdout is not None
        cutter = LineCutter()
        with open(self.log_path, "ab") as log_file:
            while True:
                chunk = await process.stdout.read(LOG_READ_BYTES)
                lines = cutter.feed(chunk) if chunk else cutter.flush()
                try:
                    self._take_lines(lines, log_file)
                except Exception:  # a full disk, say: keep draining, or Triton blocks
                    logger.exception("copying Triton's output failed; its output is dropped")
                if not chunk:
                    return

    def _take_lines(self, lines: list[bytes], log_file: Any) -> None:
        for raw in lines:
            log_file.write(raw)
            line = raw.decode("utf-8", "replace").rstrip()
            self.tail.append(line)
            if _GLOG_ERROR.match(line):
                self.errors.append(line)
            level = triton_log_level(line)
            if logger.isEnabledFor(level):
                logger.log(level, "[triton] %s", line)
        if lines:
            log_file.flush()

    async def stop(self, timeout_s: float = EXIT_TIMEOUT_S + 5.0) -> None:
        """The stop signal to the server, SIGKILL to its whole group after `timeout_s`; safe to call twice."""
        process = self.process
        if process is None:
            return
        if process.returncode is None:
            # The launcher's supervising mode (a trtllm-llmapi-launch tree) takes the signal itself.
            supervised = launcher.SUPERVISE_HOLDING_SIGTERM_MODE in self.command
            targets = [process.pid] if supervised else launcher.stop_targets(process.pid, self.ranks)
            for pid in targets:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, STOP_SIGNAL)
            try:
                await asyncio.wait_for(_exit_code(process), timeout_s)
            except asyncio.TimeoutError:
                logger.warning(
                    "Triton did not stop within %.0f s of being told to; killing its process group", timeout_s
                )
        self.kill_now()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_exit_code(process), 5)
        await _group_gone(process.pid, 5)
        remove_regions(self.command)  # what a killed Triton leaves in /dev/shm (triton/shm.py)
        if self._pump is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pump, 5)

    def kill_now(self) -> None:
        """SIGKILL to the whole tree: the group, and every descendant outside it (mpirun gives
        each rank a process group of its own), found before anything dies and is re-parented."""
        if self.process is None:
            return
        tree = launcher.descendants(self.process.pid)
        kill_group(self.process.pid)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


async def http_ok(host: str, port: int, path: str, timeout_s: float = 2.0) -> bool:
    """Whether GET `path` answers 200 (Triton's health and readiness endpoints)."""
    writer = None
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        status = await asyncio.wait_for(reader.readline(), timeout_s)
        return status.split(b" ", 2)[1:2] == [b"200"]
    except (OSError, asyncio.TimeoutError, IndexError):
        return False
    finally:
        if writer is not None:
            writer.close()


async def server_name(host: str, port: int, timeout_s: float = 2.0) -> str | None:
    """The name that the server on `port` gives in GET /v2 (Triton's --id), or None: no answer, or
    not Triton's."""
    try:
        async with loopback_client(timeout_s) as client:
            answer = await client.get(f"http://{host}:{port}/v2")
        name = answer.json().get("name") if answer.status_code == 200 else None
    except (httpx.HTTPError, OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) else None


_BUSY_PORT = re.compile(r"failed to start (\w+) service: .*Socket '(.*):(\d+)' already in use")


def busy_port(errors: Sequence[str]) -> tuple[str, int] | None:
    """Which of its services (GRPC, HTTP, Metrics) Triton could not start for a port in use, and
    the port, from its error lines ("failed to start HTTP service: Unavailable - Socket
    '127.0.0.1:8000' already in use"); or None."""
    for line in errors:
        if found := _BUSY_PORT.search(line):
            return found.group(1), int(found.group(3))
    return None


@dataclass(frozen=True)
class ModelProbe:
    """A request a model answers through its own threads without its engine: sent to `model` with
    `inputs` (Triton's generate_stream endpoint, JSON), answered with `output`, a JSON status:
    requests in flight, `idle_s` without progress while there are any, and whether the engine is
    `busy` in a step (None: it cannot say). Our `tensorrt_llm` models answer it
    (tensorrtllm_backend's triton_adapter: PROBE_INPUT, PROBE_OUTPUT)."""

    model: str
    inputs: dict[str, object]
    output: str = "probe_status"


async def probe_model(host: str, port: int, probe: ModelProbe, timeout_s: float) -> dict[str, Any] | None:
    """The model's answer to `probe`, or None when it gives none within `timeout_s` (or an error)."""
    url = f"http://{host}:{port}/v2/models/{probe.model}/generate_stream"

    async def ask(client: httpx.AsyncClient) -> dict[str, Any] | None:
        async with client.stream("POST", url, json=probe.inputs) as response:
            if response.status_code != 200:
                return None
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    value = json.loads(line[5:]).get(probe.output)
                    value = value[0] if isinstance(value, list) else value
                    status = json.loads(value) if isinstance(value, str) else None
                    return status if isinstance(status, dict) else None
        return None

    try:
        async with loopback_client(timeout_s) as client:
            return await asyncio.wait_for(ask(client), timeout_s)
    except (httpx.HTTPError, OSError, asyncio.TimeoutError, ValueError):
        return None


async def declares_probe(host: str, port: int, probe: ModelProbe, timeout_s: float = 10.0) -> bool:
    """Whether the model's config declares the probe's input (NVIDIA's C++ backend does not)."""
    try:
        async with loopback_client(timeout_s) as client:
            config = (await client.get(f"http://{host}:{port}/v2/models/{probe.model}/config")).json()
    except (httpx.HTTPError, OSError, ValueError):
        return False
    return any(tensor.get("name") == "probe" for tensor in config.get("input", []))


def stuck_engine(status: dict[str, Any], stall_timeout_s: float) -> str | None:
    """Why a model that answers its probe is stuck, or None: requests in flight, nothing produced
    for `stall_timeout_s`, and the engine not inside a step (a long prefill is busy, not stuck)."""
    in_flight, idle_s = int(status.get("in_flight") or 0), float(status.get("idle_s") or 0.0)
    if in_flight > 0 and idle_s >= stall_timeout_s and status.get("busy") is not True:
        return f"the engine made no progress for {idle_s:.0f} s with {in_flight} requests in flight"
    return None


class TritonSupervisor:
    """Starts Triton, waits for its models, watches it, restarts it when it dies or hangs.

    Args:
        repository: The model repository to serve.
        models: Models that must be ready before requests are sent.
        run_dir: Where the log and the staged backends go.
        ports: Configured ports (0 = a free port, chosen again at every start).
        on_state_change: Called with the new readiness whenever it changes.
        probe: A request the engine's model answers through its own threads (None: health probes
            only): unanswered, it counts as a hang; answered, it tells a stuck engine (see
            `stuck_engine`).
    """

    def __init__(
        self,
        repository: Path,
        *,
        models: Sequence[str],
        run_dir: Path,
        ports: TritonPorts,
        host: str = "127.0.0.1",
        world_size: int = 1,
        llmapi: bool = False,
        startup_timeout_s: float = 600.0,
        max_restarts: int = 5,
        restart_backoff_s: float = 1.0,
        probe_interval_s: float = 1.0,
        stall_timeout_s: float = 30.0,
        stable_run_s: float = STABLE_RUN_S,
        verbose: bool = False,
        exit_timeout_s: float = EXIT_TIMEOUT_S,
        on_state_change: Callable[[bool], None] | None = None,
        on_restart: Callable[[], None] | None = None,
        probe: ModelProbe | None = None,
    ) -> None:
        self.repository = repository
        self.probe = probe
        self._probing = False  # the model of this run of Triton declares the probe
        self.models = tuple(models)
        self.run_dir = run_dir
        self.configured_ports = ports
        self.host = host
        self.world_size = world_size
        self.llmapi = llmapi
        self.startup_timeout_s = startup_timeout_s
        self.max_restarts = max_restarts
        self.restart_backoff_s = restart_backoff_s
        self.probe_interval_s = probe_interval_s
        self.stall_timeout_s = stall_timeout_s
        self.stable_run_s = stable_run_s
        self.verbose = verbose
        self.exit_timeout_s = exit_timeout_s
        self.on_state_change = on_state_change
        self.on_restart = on_restart
        self.log_path = run_dir / "triton.log"
        self.ports = ports
        self.server_id = ""  # this run's tritonserver --id (each start draws a new one)
        self.triton: TritonProcess | None = None
        self.restarts = 0
        self.generation = 0
        self.stubs: list[PythonStub] = []
        self.gave_up = False
        self._failures = 0  # restarts in a row, without a stable run between them
        self._ready_since: float | None = None
        self._ready = False
        self._stopping = False
        self._watch: asyncio.Task[None] | None = None
        self._sweep: asyncio.Task[None] | None = None  # killed owners' regions (triton/shm.py)

    @property
    def ready(self) -> bool:
        return self._ready and self.triton is not None and self.triton.running

    async def _sweep_orphans(self) -> None:
        """The regions that Tritons of killed owners left (triton/shm.py), swept in a thread; again
        while some are still mapped (the stubs of a Triton killed with its owner notice it within
        seconds), every SWEEP_RETRY_S, up to SWEEP_TRIES times."""
        for _ in range(SWEEP_TRIES):
            if not (await asyncio.to_thread(sweep_orphaned_regions)).in_use:
                return
            await asyncio.sleep(SWEEP_RETRY_S)

    @property
    def pgid(self) -> int | None:
        return self.triton.pid if self.triton is not None else None

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(list(self.triton.tail)[-lines:]) if self.triton else ""

    def failure_details(self) -> str:
        """Triton's own error lines (the cause, which the tail often misses), then the log tail."""
        errors = "\n".join(self.triton.errors) if self.triton else ""
        details = f"Triton errors:\n{errors}\n" if errors else ""
        return f"{details}Last log lines ({self.log_path}):\n{self.log_tail()}"

    # ---- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Spawns Triton and waits until the server and its models are ready."""
        self._stopping = False
        await self._spawn_and_wait()
        self._watch = asyncio.create_task(self._supervise(), name="triton-supervisor")

    async def _spawn_and_wait(self) -> None:
        """Starts Triton on free ports (those not configured) and waits until it is ready.

        A free port is chosen, then let go for Triton to take: another process can take it first
        (another server starting on this host, a client's outgoing connection). Triton then exits
        with that port "already in use", and this starts it again on ports chosen anew, up to
        PORT_RETRIES times. Readiness counts only from the server this started: its GET /v2 answers
        with this run's `server_id`, not another Triton that answers on the port it could not take."""
        for attempt in range(PORT_RETRIES + 1):
            try:
                await self._spawn_once()
                return
            except TritonPortInUse as exc:
                if exc.port not in self._chosen_ports():
                    raise TritonStartupError(
                        f"Triton's {exc.service} port {exc.port} is configured, and another process has "
                        f"it: free it or configure another. {exc.details}"
                    ) from None
                if attempt == PORT_RETRIES:
                    raise
                logger.warning(
                    "Triton's %s port %d, chosen free, was taken before Triton listened on it; starting "
                    "Triton on other ports (%d/%d)",
                    exc.service,
                    exc.port,
                    attempt + 1,
                    PORT_RETRIES,
                )

    def _chosen_ports(self) -> set[int]:
        """The ports of this run that were chosen free, not configured."""
        pairs = zip(astuple(self.ports), astuple(self.configured_ports), strict=True)
        return {port for port, configured in pairs if not configured}

    async def _spawn_once(self) -> None:
        self.ports = TritonPorts.choose(
            self.configured_ports.grpc, self.configured_ports.http, self.configured_ports.metrics, self.host
        )
        self.server_id = f"trtllm-service-{os.getpid()}-{secrets.token_hex(4)}"
        command, env = triton_command(
            self.repository,
            self.ports,
            host=self.host,
            world_size=self.world_size,
            workdir=self.run_dir,
            verbose=self.verbose,
            exit_timeout_s=self.exit_timeout_s,
            llmapi=self.llmapi,
            server_id=self.server_id,
        )
        self.triton = TritonProcess(command, env, self.log_path, ranks=self.world_size > 1)
        self._ready_since = None
        await self.triton.start()
        if self._sweep is None:  # beside this owner's first start
            self._sweep = asyncio.create_task(self._sweep_orphans(), name="shm-sweep")
        self.generation += 1
        logger.info("Triton starting (pid %s, gRPC %s:%d)", self.triton.pid, self.host, self.ports.grpc)
        try:
            await self._wait_ready(self.triton)
        except TritonPortInUse:
            # It can hang after that error (2.51 here: heap corruption, SIGABRT, no exit), and it
            # has no request to finish: no exit timeout's wait.
            await self.triton.stop(timeout_s=PORT_IN_USE_STOP_S)
            raise
        except BaseException:
            await self.triton.stop()
            raise
        self.stubs = PythonStub.find(self.triton.pid) if self.triton.pid else []
        self._probing = self.probe is not None and await declares_probe(
            self.host, self.ports.http, self.probe
        )
        self._ready_since = time.monotonic()
        self._set_ready(True)

    async def _wait_ready(self, triton: TritonProcess) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            exited = not triton.running
            if exited:
                await triton.output_done()
            if (busy := busy_port(triton.errors)) is not None:
                raise TritonPortInUse(*busy, self.failure_details())
            if exited:
                raise TritonStartupError(
                    f"tritonserver exited with code {triton.process.returncode if triton.process else '?'} "
                    f"during start-up. {self.failure_details()}"
                )
            if await self._models_ready():
                return
            await asyncio.sleep(0.25)
        raise TritonStartupError(
            f"tritonserver was not ready within {self.startup_timeout_s:.0f} s. {self.failure_details()}"
        )

    async def _models_ready(self) -> bool:
        if await server_name(self.host, self.ports.http) != self.server_id:
            return False  # not up yet, or another server on the port this one could not take
        if not await http_ok(self.host, self.ports.http, "/v2/health/ready"):
            return False
        for model in self.models:
            if not await http_ok(self.host, self.ports.http, f"/v2/models/{model}/ready"):
                return False
        return True

    async def _supervise(self) -> None:
        """Restarts Triton when it dies or stops answering; readiness follows what the probes see.

        Up to `max_restarts` in a row, with doubling backoff; a run that stayed up for
        `stable_run_s` starts the count again (Kubernetes' crash-loop back-off resets the same way).
        Past that it gives up: `gave_up`, for the liveness probe, so the orchestrator replaces the
        whole service."""
        while not self._stopping:
            assert self.triton is not None
            cause = await self._watch_one(self.triton)
            if self._stopping:
                return
            self._set_ready(False)
            if self._ready_since is not None and time.monotonic() - self._ready_since >= self.stable_run_s:
                self._failures = 0  # a crash a week is not a crash loop
            if self._failures >= self.max_restarts:
                logger.error("%s; %d restarts in a row used, giving up", cause, self._failures)
                self.gave_up = True
                self._notify_state()
                return
            delay = self.restart_backoff_s * (2**self._failures)
            self._failures += 1
            self.restarts += 1
            if self.on_restart is not None:
                self.on_restart()
            logger.error("%s; restart %d/%d in %.1f s", cause, self._failures, self.max_restarts, delay)
            await self.triton.stop(timeout_s=2.0)
            await asyncio.sleep(delay)
            if self._stopping:
                return
            try:
                await self._spawn_and_wait()
            except TritonStartupError as exc:
                logger.error("%s", exc)

    async def _watch_one(self, triton: TritonProcess) -> str:
        """Waits until this run of Triton dies, hangs or loses a Python-backend stub; returns why.

        A hang is the server not answering its health probe, or the engine's model not answering
        its own probe (`self.probe`: a wedged stub leaves the server healthy), or an engine stuck
        with requests in flight. A probe may take twice the probe interval, and it takes two
        unanswered probes in a row to call Triton unready: a machine whose cores are all busy
        streaming can be slow to answer once, and an unready Triton turns every new request away.
        """
        exited = asyncio.ensure_future(triton.exited())
        unanswered_since: float | None = None
        misses = 0
        try:
            while True:
                # stop() cancels this task, but Python 3.11's asyncio.wait_for (in the probes) drops a
                # cancel that comes as its own await completes: the flag ends the watch all the same.
                if self._stopping:
                    return "stopping"
                done, _ = await asyncio.wait([exited], timeout=self.probe_interval_s)
                if done:
                    return f"tritonserver exited (code {exited.result()})"
                if (busy := busy_port(triton.errors)) is not None:
                    # it said so just after it looked ready: it can hang rather than exit then
                    return f"Triton could not keep its {busy[0]} port {busy[1]}: another process has it"
                dead = next((stub for stub in self.stubs if not stub.alive()), None)
                if dead is not None:
                    self._set_ready(False)  # that model fails every request from now on
                    done, _ = await asyncio.wait([exited], timeout=SERVER_EXIT_GRACE_S)
                    if done:
                        return f"tritonserver exited (code {exited.result()})"
                    return (
                        f"the Python-backend stub of model instance {dead.instance!r} (pid {dead.pid}) "
                        "died; Triton fails that model's requests until it restarts"
                    )
                timeout_s = 2 * self.probe_interval_s
                silent = None
                if not await http_ok(self.host, self.ports.http, "/v2/health/ready", timeout_s=timeout_s):
                    silent = "tritonserver did not answer"
                elif self.probe is not None and self._probing:
                    status = await probe_model(self.host, self.ports.http, self.probe, timeout_s)
                    if status is None:
                        silent = f"the model {self.probe.model!r} did not answer its probe (a wedged model)"
                    elif (stuck := stuck_engine(status, self.stall_timeout_s)) is not None:
                        return stuck
                if exited.done():
                    continue
                if silent is None:
                    if misses >= UNREADY_AFTER_MISSES:
                        logger.warning("Triton answers its probes again")
                    unanswered_since, misses = None, 0
                    self._set_ready(True)
                    continue
                now = time.monotonic()
                misses += 1
                if unanswered_since is None:
                    unanswered_since = now
                if misses < UNREADY_AFTER_MISSES:
                    continue
                if misses == UNREADY_AFTER_MISSES:
                    logger.warning("%s; not ready", silent)
                self._set_ready(False)
                if now - unanswered_since >= self.stall_timeout_s:
                    return f"{silent} for {self.stall_timeout_s:.0f} s"
        finally:
            exited.cancel()

    def _set_ready(self, ready: bool) -> None:
        if ready == self._ready:
            return
        self._ready = ready
        self._notify_state()

    def _notify_state(self) -> None:
        if self.on_state_change is not None:
            self.on_state_change(self._ready)

    async def stop(self) -> None:
        """Stops Triton and every process of its tree; safe to call twice."""
        self._stopping = True
        self._set_ready(False)
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch
        if self.triton is not None:
            await self.triton.stop(timeout_s=self.exit_timeout_s + 5)
        if self._sweep is not None and not self._sweep.done():
            self._sweep.cancel()  # a wait between sweeps ends; a sweep in its thread finishes first
            await asyncio.wait({self._sweep}, timeout=5)
