"""When a generation request may start in the engine: at once while the engine has a free slot,
otherwise after waiting its turn in the service's queue (by tier, then priority, then arrival),
shared by the workers (waiting_queue.py). On by default (TRTLLM_ENGINE_SLOTS=auto: the engine's
batch slots); TRTLLM_ENGINE_SLOTS=off leaves every request to the engine's own queue.

Why the service queues at all: at TensorRT-LLM 1.2.1 neither flavour's engine takes a request
priority (docs/api.md: Priority), and whatever Triton lets in waits in the engine's own queue in
arrival order. Keeping the excess here instead orders it, bounds it (TRTLLM_MAX_WAITING,
TRTLLM_QUEUE_TIMEOUT: a 429 with Retry-After past either) and lets a client that leaves while
waiting take nothing from the engine.

A request takes as many slots as the engine requests it starts (`n` choices, several prompts: its
weight) and holds them until the engine is done with all of them (`release_when_done`: their last
responses arrived, or they were cancelled), not until its client has read the answer's last byte;
else until the HTTP request ends, however it ends (`AdmissionMiddleware`). The endpoint waits for
its turn once its body is read and its prompt prepared (`wait_turn`), since its priority is in the
body. Each worker polls the shared table while
requests of its own wait (every `poll_s` when it has changed, every second regardless, at once when
one of its own requests ends): the polling costs nothing while nobody waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from trtllm_service.api.server.auth import is_open
from trtllm_service.api.server.metrics import QUEUE_REASONS, QUEUE_REJECTIONS, QUEUE_TIME, soon
from trtllm_service.api.server.waiting_queue import ADMITTED, FULL, SharedQueue, weight_of
from trtllm_service.errors import APIError

CLIENT_GONE = 499
"""The status of a request whose client left while it waited (nginx's "client closed request")."""


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """The service queue's bounds.

    Attributes:
        slots: Requests running in the engine at once, across the workers.
        max_waiting: Requests that may wait; more are refused (429 queue_full).
        timeout_s: Seconds a request may wait; then it is refused (429 queue_timeout).
    """

    slots: int
    max_waiting: int
    timeout_s: float


def queue_full(limits: QueueLimits) -> APIError:
    return APIError(
        429,
        f"{limits.max_waiting} requests are waiting for the engine already; please retry shortly.",
        type="requests",
        code="queue_full",
        retry_after=1,
    )


def queue_timeout(limits: QueueLimits) -> APIError:
    return APIError(
        429,
        f"The request waited {limits.timeout_s:g} s for the engine without starting; please retry shortly.",
        type="requests",
        code="queue_timeout",
        retry_after=1,
    )


QUEUE_CODES = frozenset({"queue_full", "queue_timeout"})
"""The codes of the queue's refusals (Anthropic's routes answer them as 529 overloaded_error)."""


async def until_disconnect(receive: Receive) -> None:
    """Returns when the client disconnects; for a request whose body has been read, when nothing
    else can arrive."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        await asyncio.sleep(0.05)  # a server that answers "no more body" again and again


def client_gone() -> APIError:
    return APIError(
        CLIENT_GONE, "The client closed the request while it waited.", code="client_closed_request"
    )


class Admission:
    """One worker's side of the shared queue.

    Args:
        queue: The table the workers share.
        limits: Its bounds.
        model_name: For the queue's metrics.
        poll_s: How often a worker with waiting requests looks for a changed table.
    """

    FULL_CHECK_S = 1.0
    """However unchanged the table looks, a worker with waiting requests checks it this often (a
    worker that died changes nothing in it, yet its slots are free)."""

    def __init__(
        self, queue: SharedQueue, limits: QueueLimits, model_name: str = "", poll_s: float = 0.01
    ) -> None:
        self.queue = queue
        self.limits = limits
        self.poll_s = poll_s
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._poller: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self._queue_time = QUEUE_TIME.labels(model_name)
        self._rejected = {reason: QUEUE_REJECTIONS.labels(model_name, reason) for reason in QUEUE_REASONS}

    async def wait(
        self,
        tier: int,
        priority: int,
        gone: Callable[[], Awaitable[object]] | None = None,
        weight: int = 1,
    ) -> int:
        """Returns once the request may start, with the slots it then holds (`weight`, capped at
        the slots: `release` them); raises the 429 of a full queue or of a wait past the timeout, or
        the 499 of a client that left (`gone()` returns when it does)."""
        started = time.perf_counter()
        limits = self.limits
        weight = weight_of(weight, limits.slots)
        seq = self.queue.enter(tier, priority, limits.slots, limits.max_waiting, weight)
        if seq == ADMITTED:
            soon(self._queue_time.observe, 0.0)
            return weight
        if seq == FULL:
            self._rejected["queue_full"].inc()
            raise queue_full(limits)
        turn = self._waiters[seq] = asyncio.get_running_loop().create_future()
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        watch = asyncio.ensure_future(gone()) if gone is not None else None
        try:
            waited = {turn} if watch is None else {turn, watch}
            await asyncio.wait(waited, timeout=limits.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled: nobody will run the request
            self._forget(seq, turn, weight)
            raise
        finally:
            if watch is not None:
                watch.cancel()
        left = watch is not None and watch.done() and not watch.cancelled() and watch.exception() is None
        if left or not turn.done():
            self._forget(seq, turn, weight)
            if left:
                raise client_gone()
            self._rejected["queue_timeout"].inc()
            raise queue_timeout(limits)
        self._queue_time.observe(time.perf_counter() - started)
        return weight

    def _forget(self, seq: int, turn: asyncio.Future[None], weight: int) -> None:
        """A waiting request that will not run: out of the queue, or, had it just started, its slots
        freed (nothing else runs between the two checks)."""
        if turn.done() and not turn.cancelled():
            self.release(weight)
            return
        self._waiters.pop(seq, None)
        self.queue.leave(seq)
        turn.cancel()

    def release(self, weight: int = 1) -> None:
        """A request that started has ended: its slots are free (this worker's waiting requests
        look at once)."""
        self.queue.release(weight)
        self._kick.set()

    def counts(self) -> tuple[int, int]:
        """(running, waiting) in the whole service."""
        return self.queue.counts()

    async def _poll(self) -> None:
        """While this worker has waiting requests: start those whose turn has come."""
        seen, checked = -1, 0.0
        while self._waiters:
            version = self.queue.version()
            now = time.monotonic()
            if version != seen or self._kick.is_set() or now - checked >= self.FULL_CHECK_S:
                self._kick.clear()
                for seq in self.queue.admit(self.limits.slots, self._waiters):
                    self._waiters.pop(seq).set_result(None)
                seen, checked = self.queue.version(), now
            if not self._waiters:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.poll_s)


class Turn:
    """One HTTP request's place with the engine: waited for once (`wait`), released once (`release`),
    when the engine is done with its requests or when the HTTP request ends, whichever comes first."""

    __slots__ = ("admission", "held", "receive")

    def __init__(self, admission: Admission, receive: Receive) -> None:
        self.admission = admission
        self.receive = receive
        self.held = 0  # the slots it holds

    async def wait(self, tier: int, priority: int, weight: int) -> None:
        if not self.held:
            self.held = await self.admission.wait(tier, priority, self._gone, weight)

    async def _gone(self) -> None:
        await until_disconnect(self.receive)

    def release(self) -> None:
        if self.held:
            held, self.held = self.held, 0
            self.admission.release(held)


_TURN: ContextVar[Turn | None] = ContextVar("trtllm_turn", default=None)
_SERVICE: Admission | None = None
"""This worker's admission, once its app is built (None: no service queue)."""
QUEUE_OFF = "TRTLLM_ENGINE_SLOTS=off"
"""Why a worker has no service queue when the operator turned it off."""
_WITHOUT = QUEUE_OFF
"""Why this worker has no service queue, when it has none."""


def waiting_requests() -> int | None:
    """Requests waiting in the service's queue, all workers together (None: there is no queue)."""
    if _SERVICE is None:
        return None
    try:
        return _SERVICE.counts()[1]
    except OSError:
        return None


def queue_summary() -> str:
    """The service queue's bounds in a few words, for the start-up log."""
    if _SERVICE is None:
        return f"no service queue, requests wait in the engine's in arrival order: {_WITHOUT}"
    limits = _SERVICE.limits
    return (
        f"{limits.slots} engine slots, then up to {limits.max_waiting} requests wait in the service's queue "
        f"for at most {limits.timeout_s:g} s"
    )


async def wait_turn(tier: int, priority: int, engine_requests: int = 1) -> None:
    """Waits until the current request may start its `engine_requests` in the engine (see
    `Admission.wait` for what it raises); at once where the service has no queue."""
    turn = _TURN.get()
    if turn is not None:
        await turn.wait(tier, priority, engine_requests)


class Settling(Protocol):
    """An engine request that calls back once the engine is done with it (relay/client.EngineStream)."""

    def when_settled(self, callback: Callable[[], None]) -> None: ...


def release_when_done(streams: Sequence[Settling]) -> None:
    """Frees the current request's slots once the engine is done with every one of `streams` (the
    engine requests it started), before its client has read the whole answer; nothing where the
    service has no queue or the request holds no slot."""
    turn = _TURN.get()
    if turn is None or not turn.held or not streams:
        return
    left = len(streams)

    def settled() -> None:
        nonlocal left
        left -= 1
        if left == 0:
            turn.release()

    for stream in streams:
        stream.when_settled(settled)


class AdmissionMiddleware:
    """Gives every request on the generation routes its `Turn` (taken by the endpoint with
    `wait_turn`), and frees its slot when the request ends, however it ends.

    Args:
        admission: The worker's side of the queue; None: no service queue (the middleware passes).
        without: Why there is no queue, when there is none (the start-up log says it).
    """

    def __init__(self, app: ASGIApp, admission: Admission | None, without: str = QUEUE_OFF) -> None:
        global _SERVICE, _WITHOUT
        self.app = app
        self.admission = _SERVICE = admission
        _WITHOUT = without

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        admission = self.admission
        if (
            admission is None
            or scope["type"] != "http"
            or scope["method"] != "POST"
            or is_open(scope["path"])
        ):
            await self.app(scope, receive, send)
            return
        turn = Turn(admission, receive)
        token = _TURN.set(turn)
        try:
            await self.app(scope, receive, send)
        finally:
            with contextlib.suppress(ValueError):  # reset in another context than it was set in
                _TURN.reset(token)
            turn.release()
