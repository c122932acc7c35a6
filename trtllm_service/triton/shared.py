"""One Triton for every worker process: who owns it (a lock) and where it is (a state file).

BentoML runs each HTTP worker as its own process. Exactly one of them owns Triton: the one that holds
an exclusive `flock` on `<run_dir>/triton.lock`. The kernel releases the lock when its holder dies,
however it dies, so ownership can never be held by a dead process. The owner runs the
`TritonSupervisor` and publishes `<run_dir>/triton.json` (ports, readiness, the process group) on
every change; the other workers read it and only relay.

When the owner dies, Triton dies with it (PR_SET_PDEATHSIG) and another worker takes the lock within
a second: it kills what may be left of the old group, starts a new Triton and publishes it. A worker
that is being replaced by BentoML comes back as a follower. When the owner stops on purpose (the
service is shutting down) it marks the state `stopping`, and running followers do not take over.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from tensorrtllm_backend.launcher import pid_alive
from trtllm_service.triton.process import TritonPorts, TritonSupervisor, kill_group

logger = logging.getLogger("trtllm_service.triton")

LOCK_FILE = "triton.lock"
STATE_FILE = "triton.json"
POLL_S = 0.25
TAKEOVER_POLL_S = 1.0


@dataclass(frozen=True)
class TritonState:
    """What the owner publishes."""

    owner_pid: int
    host: str = "127.0.0.1"
    grpc_port: int = 0
    http_port: int = 0
    metrics_port: int = 0
    pgid: int | None = None
    ready: bool = False
    generation: int = 0
    restarts: int = 0
    stopping: bool = False
    gave_up: bool = False


def serving_elsewhere(run_dir: Path) -> bool:
    """Whether another worker already owns a ready Triton: this worker is then a replacement, and
    its siblings serve while it starts."""
    try:
        state = TritonState(**json.loads((run_dir / STATE_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return False
    return (
        state.ready and not state.stopping and state.owner_pid != os.getpid() and pid_alive(state.owner_pid)
    )


class SharedTriton:
    """This worker's handle on the one Triton: its owner, or a follower of the owner.

    Args:
        run_dir: The directory every worker of one service shares.
        make_supervisor: Builds the supervisor when this worker becomes the owner; its
            `on_state_change` is set here.
        on_change: Called (with readiness) whenever this worker's view changes.
    """

    def __init__(
        self,
        run_dir: Path,
        make_supervisor: Callable[[], TritonSupervisor],
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.make_supervisor = make_supervisor
        self.on_change = on_change
        self.supervisor: TritonSupervisor | None = None
        self.state: TritonState | None = None
        self._lock_fd: int | None = None
        self._state_stamp: tuple[int, int] | None = None
        self._follow: asyncio.Task[None] | None = None
        self._stopping = False
        self._was_ready = False

    @property
    def owner(self) -> bool:
        return self.supervisor is not None

    @property
    def ready(self) -> bool:
        if self.supervisor is not None:
            return self.supervisor.ready
        state = self.state
        return state is not None and state.ready and not state.stopping and pid_alive(state.owner_pid)

    @property
    def gave_up(self) -> bool:
        """The owner used up its restarts in a row: only replacing the service brings Triton back."""
        if self.supervisor is not None:
            return self.supervisor.gave_up
        return self.state is not None and self.state.gave_up

    def _where(self) -> tuple[str, TritonPorts] | None:
        """Triton's host and ports: this worker's supervisor's, else what the owner published."""
        if self.supervisor is not None:
            return self.supervisor.host, self.supervisor.ports
        state = self.state
        if state is None:
            return None
        return state.host, TritonPorts(grpc=state.grpc_port, http=state.http_port, metrics=state.metrics_port)

    def grpc_address(self) -> tuple[str, int] | None:
        """Where to send requests now; None while Triton is not ready. A follower that last saw it
        not ready reads the owner's state again first: the owner may have published since the last
        poll (every POLL_S, later on a busy loop), and a request in that gap got a needless 503
        while another worker already answered /readyz with 200."""
        ready = self.ready
        if not ready and self.supervisor is None:
            self._read_state()
            ready = self.ready
        where = self._where() if ready else None
        return None if where is None else (where[0], where[1].grpc)

    @property
    def metrics_url(self) -> str | None:
        where = self._where()
        return f"http://{where[0]}:{where[1].metrics}/metrics" if where and where[1].metrics else None

    @property
    def http_url(self) -> str | None:
        """Triton's HTTP endpoint (server metadata at /v2, health at /v2/health/ready)."""
        where = self._where()
        return f"http://{where[0]}:{where[1].http}" if where and where[1].http else None

    # ---- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Becomes the owner (and waits for Triton to be ready), or starts following the owner."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if self._try_lock():
            await self._own()
        else:
            logger.info("Triton is owned by another worker; this worker relays to it")
            self._read_state()
        self._follow = asyncio.create_task(self._watch(), name="triton-share")

    async def stop(self) -> None:
        """Stops following; the owner stops Triton (marking the state `stopping` first)."""
        self._stopping = True
        if self._follow is not None:
            self._follow.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._follow
        if self.supervisor is not None:
            self._publish(stopping=True)
            await self.supervisor.stop()
            self._publish(stopping=True)
        self._unlock()

    def kill_now(self) -> None:
        """SIGKILL to the Triton this worker owns and its whole tree; a follower owns none."""
        if self.supervisor is not None and self.supervisor.triton is not None:
            self.supervisor.triton.kill_now()

    # ---- ownership ----------------------------------------------------------------------------------

    def _try_lock(self) -> bool:
        fd = os.open(self.run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                os.close(self._lock_fd)
            self._lock_fd = None

    async def _own(self) -> None:
        """Takes over: ends what is left of an earlier owner's Triton, then starts ours."""
        previous = self._load_state()
        if previous is not None and previous.pgid and kill_group(previous.pgid, signal.SIGKILL):
            logger.warning(
                "killed the Triton process group %d left by worker %d", previous.pgid, previous.owner_pid
            )
            await self._wait_group_gone(previous.pgid)
        supervisor = self.make_supervisor()
        supervisor.on_state_change = self._owner_state_changed
        self.supervisor = supervisor
        self._publish()
        try:
            await supervisor.start()
        except BaseException:
            self._publish(stopping=True)
            raise
        self._publish()

    @staticmethod
    async def _wait_group_gone(pgid: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and kill_group(pgid, signal.SIGKILL):
            await asyncio.sleep(0.1)

    def _owner_state_changed(self, ready: bool) -> None:
        self._publish()
        self._notify()

    def _publish(self, *, stopping: bool = False) -> None:
        supervisor = self.supervisor
        assert supervisor is not None
        state = TritonState(
            owner_pid=os.getpid(),
            host=supervisor.host,
            grpc_port=supervisor.ports.grpc,
            http_port=supervisor.ports.http,
            metrics_port=supervisor.ports.metrics,
            pgid=supervisor.pgid,
            ready=supervisor.ready and not stopping,
            generation=supervisor.generation,
            restarts=supervisor.restarts,
            stopping=stopping,
            gave_up=supervisor.gave_up,
        )
        self.state = state
        path = self.run_dir / STATE_FILE
        temporary = path.with_name(f".{STATE_FILE}.{os.getpid()}")
        with contextlib.suppress(OSError):
            temporary.write_text(json.dumps(asdict(state)))
            os.replace(temporary, path)

    # ---- following -----------------------------------------------------------------------------------

    def _load_state(self) -> TritonState | None:
        try:
            data = json.loads((self.run_dir / STATE_FILE).read_text())
            return TritonState(**data)
        except (OSError, ValueError, TypeError):
            return None

    def _read_state(self) -> None:
        """Re-reads the state file when it changed."""
        try:
            stat = os.stat(self.run_dir / STATE_FILE)
        except OSError:
            self.state = None
            self._notify()
            return
        stamp = (stat.st_mtime_ns, stat.st_ino)
        if stamp != self._state_stamp:
            self._state_stamp = stamp
            self.state = self._load_state()
        self._notify()

    async def _watch(self) -> None:
        last_try = 0.0
        while not self._stopping:
            await asyncio.sleep(POLL_S)
            if self.supervisor is not None:
                continue
            self._read_state()
            now = time.monotonic()
            if now - last_try < TAKEOVER_POLL_S:
                continue
            last_try = now
            if (self.state is None or not self.state.stopping) and self._try_lock():
                logger.warning("the worker that owned Triton is gone; this worker takes over")
                try:
                    await self._own()
                except Exception as exc:
                    logger.error("taking over Triton failed: %s", exc)

    def _notify(self) -> None:
        ready = self.ready
        if ready != self._was_ready:
            self._was_ready = ready
            if self.on_change is not None:
                self.on_change(ready)
