"""A concurrency limit for the generation routes, answered with OpenAI's 429 shape.

BentoML's own `max_concurrency` answers `{"error": "Too many requests"}` before any of our code
runs; this middleware counts requests in flight on `/generate` and `/v1/*` (a streamed response
counts until its last byte) and refuses the excess with a 429 that OpenAI clients understand.

The limit is the service's, whatever the number of HTTP worker processes: with `shared_dir`, the
workers count in one small file (`SharedSlots`), once when a request starts and once when it ends,
never per token.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
from pathlib import Path

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from trtllm_service.auth import is_open
from trtllm_service.errors import APIError
from trtllm_service.metrics import count_rejected

_SLOT = struct.Struct("<qq")  # pid, requests in flight


class SharedSlots:
    """Requests in flight across the processes that share `path`: one slot (pid, count) per process,
    read and updated under an exclusive flock. Slots of processes that are gone do not count, so a
    worker killed mid-request cannot leave the service short of capacity."""

    SLOTS = 256

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self._mine: int | None = None

    def _open(self) -> mmap.mmap:
        if self._map is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            size = self.SLOTS * _SLOT.size
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            self._fd, self._map = fd, mmap.mmap(fd, size)
        return self._map

    def _slots(self, table: mmap.mmap) -> list[tuple[int, int]]:
        return [_SLOT.unpack_from(table, i * _SLOT.size) for i in range(self.SLOTS)]

    def try_acquire(self, limit: int) -> bool:
        """Counts one more request of this process unless `limit` are in flight already."""
        table = self._open()
        me = os.getpid()
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # type: ignore[arg-type]
        try:
            slots = self._slots(table)
            total = 0
            for pid, count in slots:
                if count > 0 and (pid == me or _alive(pid)):
                    total += count
            if total >= limit:
                return False
            index = self._slot_of(me, slots)
            pid, count = slots[index]
            _SLOT.pack_into(table, index * _SLOT.size, me, (count if pid == me else 0) + 1)
            return True
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)  # type: ignore[arg-type]

    def release(self) -> None:
        table = self._open()
        me = os.getpid()
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # type: ignore[arg-type]
        try:
            index = self._slot_of(me, self._slots(table))
            pid, count = _SLOT.unpack_from(table, index * _SLOT.size)
            if pid == me and count > 0:
                _SLOT.pack_into(table, index * _SLOT.size, me, count - 1)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)  # type: ignore[arg-type]

    def _slot_of(self, me: int, slots: list[tuple[int, int]]) -> int:
        """This process's slot: the one it holds, else a free one (empty, or left by a dead process)."""
        if self._mine is not None and slots[self._mine][0] == me:
            return self._mine
        free = None
        for index, (pid, count) in enumerate(slots):
            if pid == me:
                self._mine = index
                return index
            if free is None and (pid == 0 or count == 0 or not _alive(pid)):
                free = index
        if free is None:
            raise RuntimeError(f"more than {self.SLOTS} processes share {self.path}")
        self._mine = free
        return free


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ConcurrencyLimitMiddleware:
    """Lets at most `limit` generation requests run at once; the rest get 429 with Retry-After.

    Args:
        limit: Requests in flight for the whole service.
        shared_dir: Where the worker processes of the service count together (the run dir);
            None counts this process's requests only.
        model_name: For the rejected-requests metric.
    """

    def __init__(
        self, app: ASGIApp, limit: int, shared_dir: Path | None = None, model_name: str = ""
    ) -> None:
        if limit < 1:
            raise ValueError("the concurrency limit must be at least 1")
        self.app = app
        self.limit = limit
        self.model_name = model_name
        self.in_flight = 0
        self.shared = SharedSlots(shared_dir / "in_flight.slots") if shared_dir is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        if not self._acquire():
            error = APIError.rate_limited(
                f"More than {self.limit} requests are in flight; please retry shortly.", retry_after=1
            )
            count_rejected(self.model_name, scope["path"], 429)
            await JSONResponse(error.body(), status_code=429, headers=error.headers())(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            if self.shared is not None:
                with contextlib.suppress(OSError):
                    self.shared.release()

    def _acquire(self) -> bool:
        if self.shared is not None:
            try:
                if not self.shared.try_acquire(self.limit):
                    return False
            except OSError:  # the shared count is out of reach: fall back to this worker's own
                self.shared = None
        elif self.in_flight >= self.limit:
            return False
        self.in_flight += 1  # one event loop per worker: no lock needed between awaits
        return True
