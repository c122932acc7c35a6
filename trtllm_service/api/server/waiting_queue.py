"""The service's waiting queue, shared by its worker processes: one small file, read and changed under
an exclusive flock, once when a request arrives, when it starts or leaves, and when it ends.

Why a file and not a queue server in the process that owns Triton: every worker decides for its own
requests, so no process is the queue's single point of failure and nothing has to hand the queue
over when the owner dies or Triton moves (triton/shared.py); the service's concurrency limit already
counts this way (api/server/limits.py). A worker that dies leaves entries behind; they are skipped
(and cleared) as soon as its pid is gone, so a dead worker never holds a slot or a place.

The table holds the engine requests running per process (pid, count) and the waiting HTTP requests
(pid, tier, priority, arrival number, weight). A request's weight is the engine requests it starts
(`n` choices, several prompts), at most `slots`: it needs that many free slots. Ranked by (tier,
priority, arrival), the waiting requests may start while their weights fit in the free slots (free =
slots - running), up to the first that does not fit (no later one passes it, so a heavy request is
not starved); each process starts its own (`admit`), so no request is handed between processes and
none is started twice. A newcomer starts at once only if it is among them: a slot that frees while
the owner of the first waiting request has not looked yet stays that request's.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

from tensorrtllm_backend.launcher import pid_alive
from trtllm_service.api.server.mapped_table import MappedTable

_HEADER = struct.Struct("<QQQ")  # next arrival number, version (changes on every write), waiting entries
_RUNNING = struct.Struct("<qq")  # pid, requests running
_WAITING = struct.Struct("<qqqQq")  # pid, tier, priority, arrival number, weight
PROCESSES = 256
"""Processes that may share one queue (the service's workers)."""
CAPACITY = 8192
"""The most requests that may wait at once (TRTLLM_MAX_WAITING is capped here)."""
_RUNNING_AT = 64
_WAITING_AT = _RUNNING_AT + PROCESSES * _RUNNING.size
_SIZE = _WAITING_AT + CAPACITY * _WAITING.size
# `enter`'s short way reads the header and the running slots as 64-bit words (mapped_table.py)
_VERSION_WORD, _WAITING_WORD = 1, 2
_RUNNING_WORD, _RUNNING_END = _RUNNING_AT // 8, _WAITING_AT // 8


@dataclass(frozen=True, slots=True)
class Waiting:
    """One waiting request: its process, its rank (tier, priority), its arrival number and its
    weight (the engine slots it needs)."""

    pid: int
    tier: int
    priority: int
    seq: int
    weight: int = 1

    @property
    def rank(self) -> tuple[int, int, int]:
        """Lower first: tier, then priority, then arrival."""
        return (self.tier, self.priority, self.seq)


ADMITTED = -1
"""`enter`'s answer for a request that may start at once."""
FULL = -2
"""`enter`'s answer for a request refused: `max_waiting` requests wait already."""


class SharedQueue(MappedTable):
    """The waiting queue and the running count of the processes that share `path` (see the module
    docstring). Each method takes the lock once; none blocks for longer than a scan of the table."""

    def __init__(
        self, path: Path, *, pid: int | None = None, alive: Callable[[int], bool] = pid_alive
    ) -> None:
        # as words: the header and the running slots (`enter`'s short way)
        super().__init__(path, _SIZE, _WAITING_AT, pid=pid, alive=alive)
        self._mine: int | None = None  # this process's running slot

    @contextlib.contextmanager
    def _locked(self) -> Iterator[_Table]:
        with self.locked() as table:
            yield _Table(table, self)

    def version(self) -> int:
        """The table's version, read without the lock: a hint that something changed."""
        return _HEADER.unpack_from(self._open(), 0)[1]

    def enter(self, tier: int, priority: int, slots: int, max_waiting: int, weight: int = 1) -> int:
        """A request of `weight` engine requests arrives (see `weight_of`): ADMITTED (it may start
        now; it counts as running), FULL (refused), or its arrival number (it waits; `admit` starts
        it, `leave` takes it out)."""
        weight = weight_of(weight, slots)
        words = self.lock()
        try:
            # the short way, the common case: nobody waits, and this process's running slot is
            # known; it fits even with dead processes counted (no process is looked up)
            mine = self._mine
            if not words[_WAITING_WORD] and mine is not None and words[_RUNNING_WORD + 2 * mine] == self._me:
                running, at = 0, _RUNNING_WORD
                while at < _RUNNING_END and words[at]:
                    if words[at + 1] > 0:
                        running += words[at + 1]
                    at += 2
                if running + weight <= slots:
                    words[_RUNNING_WORD + 2 * mine + 1] += weight
                    words[_VERSION_WORD] += 1
                    return ADMITTED
            return self._enter(_Table(self._open(), self), tier, priority, slots, max_waiting, weight)
        finally:
            self.unlock()

    def _enter(
        self, table: _Table, tier: int, priority: int, slots: int, max_waiting: int, weight: int
    ) -> int:
        """`enter`'s whole way, under the lock."""
        if not table.waiting_count() and table.running(alive_only=False) + weight <= slots:
            table.add_running(weight)  # it fits even with dead processes counted
            return ADMITTED
        waiting = table.live_waiting()
        running = table.running()
        if not waiting and running + weight <= slots:
            table.add_running(weight)
            return ADMITTED
        if len(waiting) >= min(max_waiting, CAPACITY):
            return FULL
        seq = table.append(tier, priority, weight)
        waiting.append(Waiting(self.pid, tier, priority, seq, weight))
        if seq in table.startable(waiting, running, slots, {seq}):
            table.remove({seq})
            table.add_running(weight)
            return ADMITTED
        return seq

    def admit(self, slots: int, mine: Collection[int]) -> list[int]:
        """Starts those of this process's waiting requests (`mine`: their arrival numbers) that are
        among the first whose weights fit in `slots - running`; returns their arrival numbers (they
        count as running, each with its weight)."""
        with self._locked() as table:
            waiting = table.live_waiting()
            started = table.startable(waiting, table.running(), slots, mine)
            if started:
                weights = {entry.seq: entry.weight for entry in waiting if entry.pid == table.me}
                table.remove(set(started))
                table.add_running(sum(weights[seq] for seq in started))
            return started

    def leave(self, seq: int) -> bool:
        """Takes a waiting request out (timed out, or its client left); False if it was not waiting."""
        with self._locked() as table:
            return table.remove({seq}) > 0

    def release(self, weight: int = 1) -> None:
        """A running request of this process (of `weight` engine requests, as it entered) ended."""
        with self._locked() as table:
            table.add_running(-weight)

    def counts(self) -> tuple[int, int]:
        """(running, waiting) over the live processes."""
        with self._locked() as table:
            return table.running(), len(table.live_waiting())


class _Table:
    """The mapped table while the lock is held."""

    __slots__ = ("_alive", "_map", "_me", "_queue")

    def __init__(self, table: mmap.mmap, queue: SharedQueue) -> None:
        self._map = table
        self._queue = queue
        self._me = queue.pid
        self._alive: dict[int, bool] = {self._me: True}

    @property
    def me(self) -> int:
        return self._me

    def _is_alive(self, pid: int) -> bool:
        alive = self._alive.get(pid)
        if alive is None:
            alive = self._alive[pid] = self._queue.alive(pid)
        return alive

    def _header(self) -> tuple[int, int, int]:
        return _HEADER.unpack_from(self._map, 0)

    def _write_header(self, seq: int, count: int) -> None:
        _, version, _ = self._header()
        _HEADER.pack_into(self._map, 0, seq, version + 1, count)

    # ---- running ---------------------------------------------------------------------------------
    def _slots(self) -> list[tuple[int, int]]:
        """The running slots ever taken (a process takes the first free one: the rest are empty)."""
        found = []
        for index in range(PROCESSES):
            pid, count = _RUNNING.unpack_from(self._map, _RUNNING_AT + index * _RUNNING.size)
            if pid == 0:
                break
            found.append((pid, count))
        return found

    def running(self, alive_only: bool = True) -> int:
        """The engine requests running; `alive_only=False` counts those of dead processes too (no
        process is looked up: an upper bound)."""
        if not alive_only:
            return sum(count for _, count in self._slots() if count > 0)
        return sum(count for pid, count in self._slots() if count > 0 and self._is_alive(pid))

    def add_running(self, delta: int) -> None:
        me = self._me
        slots = self._slots()
        index = self._queue._mine
        if index is None or index >= len(slots) or slots[index][0] != me:
            index = self._slot_of(me, slots)
            self._queue._mine = index
        pid, count = slots[index] if index < len(slots) else (me, 0)
        count = max(0, (count if pid == me else 0) + delta)
        _RUNNING.pack_into(self._map, _RUNNING_AT + index * _RUNNING.size, me, count)
        seq, _, waiting = self._header()
        self._write_header(seq, waiting)

    def _slot_of(self, me: int, slots: list[tuple[int, int]]) -> int:
        free = None
        for index, (pid, count) in enumerate(slots):
            if pid == me:
                return index
            if free is None and (count == 0 or not self._is_alive(pid)):
                free = index
        if free is not None:
            return free
        if len(slots) == PROCESSES:
            raise RuntimeError(f"more than {PROCESSES} processes share {self._queue.path}")
        return len(slots)

    # ---- waiting ---------------------------------------------------------------------------------
    def waiting_count(self) -> int:
        """The waiting entries, those of dead processes among them."""
        return self._header()[2]

    def _entries(self) -> list[Waiting]:
        count = self._header()[2]
        raw = self._map[_WAITING_AT : _WAITING_AT + count * _WAITING.size]
        return [Waiting(*fields) for fields in _WAITING.iter_unpack(raw)]

    def _store(self, entries: list[Waiting]) -> None:
        for index, entry in enumerate(entries):
            self._put(index, entry)
        self._write_header(self._header()[0], len(entries))

    def _put(self, index: int, entry: Waiting) -> None:
        at = _WAITING_AT + index * _WAITING.size
        _WAITING.pack_into(self._map, at, entry.pid, entry.tier, entry.priority, entry.seq, entry.weight)

    def live_waiting(self) -> list[Waiting]:
        """The waiting requests of live processes (those of dead ones are cleared here)."""
        entries = self._entries()
        live = [entry for entry in entries if self._is_alive(entry.pid)]
        if len(live) != len(entries):
            self._store(live)
        return live

    def append(self, tier: int, priority: int, weight: int) -> int:
        """Adds a waiting request of this process; returns its arrival number."""
        seq, version, count = self._header()
        self._put(count, Waiting(self._me, tier, priority, seq, weight))
        _HEADER.pack_into(self._map, 0, seq + 1, version + 1, count + 1)
        return seq

    def remove(self, seqs: set[int]) -> int:
        """Removes this process's waiting requests `seqs`; returns how many were there."""
        me = self._me
        entries = self._entries()
        kept = [entry for entry in entries if not (entry.pid == me and entry.seq in seqs)]
        if len(kept) != len(entries):
            self._store(kept)
        return len(entries) - len(kept)

    def startable(self, waiting: list[Waiting], running: int, slots: int, mine: Collection[int]) -> list[int]:
        """The arrival numbers of this process's requests (`mine`) among the waiting requests that
        may start, in rank order: those whose weights fit in `slots - running`, up to the first that
        does not."""
        free = slots - running
        started = []
        for entry in sorted(waiting, key=lambda entry: entry.rank):
            if entry.weight > free:
                break
            free -= entry.weight
            if entry.pid == self._me and entry.seq in mine:
                started.append(entry.seq)
        return started


def weight_of(engine_requests: int, slots: int) -> int:
    """The slots a request of `engine_requests` engine requests takes: at least 1, at most all of
    them (a request larger than the engine runs alone)."""
    return max(1, min(engine_requests, slots))
