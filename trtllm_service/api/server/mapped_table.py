"""A small table in a file that the service's worker processes share: mapped once per process, read
and changed under an exclusive flock. The concurrency limit's slots (limits.py) and the waiting
queue (waiting_queue.py) are such tables.

Their short ways (the common case, on every request's way to its first token) read and write the
table's leading bytes as 64-bit words through `lock()`, which takes the lock without a context
manager: memoryview.cast reads the machine's order, which is the tables' little-endian on every
platform Triton runs on.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from tensorrtllm_backend.launcher import pid_alive

assert sys.byteorder == "little"


class MappedTable:
    """The file at `path`, `size` bytes, its first `word_bytes` also seen as 64-bit words.

    Args:
        pid: The process the table is used for; None: this one (tests stand in for other
            processes with theirs).
        alive: Whether a process still runs (a dead one's entries do not count).
    """

    def __init__(
        self,
        path: Path,
        size: int,
        word_bytes: int,
        *,
        pid: int | None = None,
        alive: Callable[[int], bool] = pid_alive,
    ) -> None:
        self.path = path
        self.alive = alive
        self._size, self._word_bytes = size, word_bytes
        self._pid = pid
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self._words: memoryview | None = None
        self._me = 0  # the process's pid, from the time the table was opened

    @property
    def pid(self) -> int:
        return self._pid or os.getpid()

    def _open(self) -> mmap.mmap:
        if self._map is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            if os.fstat(fd).st_size < self._size:
                os.ftruncate(fd, self._size)
            self._fd, self._map = fd, mmap.mmap(fd, self._size)
            self._words = memoryview(self._map)[: self._word_bytes].cast("q")
            self._me = self.pid
        return self._map

    def lock(self) -> memoryview:
        """The table's words, under the exclusive lock; `unlock()` releases it."""
        words, fd = self._words, self._fd
        if words is None or fd is None:
            self._open()
            words, fd = self._words, self._fd
            assert words is not None and fd is not None  # _open() set them
        fcntl.flock(fd, fcntl.LOCK_EX)
        return words

    def unlock(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)  # type: ignore[arg-type]  # lock() opened it

    @contextlib.contextmanager
    def locked(self) -> Iterator[mmap.mmap]:
        """The mapped table, under the exclusive lock for as long as the block runs."""
        self.lock()
        try:
            yield self._open()
        finally:
            self.unlock()

    def close(self) -> None:
        if self._map is not None and self._fd is not None:
            if self._words is not None:
                self._words.release()
                self._words = None
            self._map.close()
            os.close(self._fd)
            self._fd, self._map = None, None
