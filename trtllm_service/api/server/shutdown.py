"""Graceful shutdown: SIGTERM lets the requests in flight finish before the worker stops.

A container stop, `kill`, or BentoML stopping its workers sends SIGTERM. Uvicorn alone would stop
accepting at once and leave clients that connect meanwhile waiting on a socket nobody serves. Here
the worker drains first: `/readyz` and every new generation request answer 503 (load balancers move
on, clients retry elsewhere), the requests in flight across the service's workers finish, up to
`grace_s`, and then uvicorn's own handler runs (its shutdown, ours: Triton stops last). Requests
still running when the grace is up end with a 503 error (a stream: its error event) and are
cancelled in the engine: uvicorn alone would wait for them however long they take. A second
SIGTERM stops at once.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from trtllm_service.errors import APIError

logger = logging.getLogger("trtllm_service")

POLL_S = 0.1
GRACE_OVER = "The service stopped before this answer was finished (its shutdown grace ran out); please retry."


class Drain:
    """The shutdown state that the door (`limits.ConcurrencyLimitMiddleware`) and SIGTERM share."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.draining = False
        self._in_flight: Callable[[], int] = lambda: 0
        self._cut: Callable[[APIError], int] = lambda error: 0
        self._task: asyncio.Task[None] | None = None

    def counted_by(self, in_flight: Callable[[], int]) -> None:
        """Where the requests in flight (all the service's workers) are counted."""
        self._in_flight = in_flight

    def cut_by(self, cut: Callable[[APIError], int]) -> None:
        """What ends this worker's requests still in flight with the error it is given when the
        grace has run out (each cancelled in the engine); it returns how many it ended."""
        self._cut = cut

    def install(self) -> None:
        """Puts the drain in front of the SIGTERM handler the server installed (on its event loop,
        in the main thread: the server's startup)."""
        previous = signal.getsignal(signal.SIGTERM)
        if not callable(previous):
            return  # no server handler to hand over to: leave SIGTERM alone
        loop = asyncio.get_running_loop()

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            if self.draining:  # asked twice: stop now
                previous(signum, frame)
                return
            self.draining = True
            loop.call_soon_threadsafe(self._start, previous, signum)

        signal.signal(signal.SIGTERM, on_sigterm)

    def _start(self, previous: Callable[[int, Any], Any], signum: int) -> None:
        self._task = asyncio.get_running_loop().create_task(self._drain(previous, signum))

    async def _drain(self, previous: Callable[[int, Any], Any], signum: int) -> None:
        deadline = time.monotonic() + self.grace_s
        waiting = self._in_flight()
        logger.info(
            "SIGTERM: %d requests in flight finish first (up to %.0f s); new requests get 503",
            waiting,
            self.grace_s,
        )
        while waiting > 0 and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            waiting = self._in_flight()
        if waiting:
            # uvicorn would wait for their responses to end, however long: they end here, with an
            # error the client can retry on, and the server's shutdown runs at once.
            cut = self._cut(APIError.unavailable(GRACE_OVER, retry_after=1))
            logger.warning(
                "stopping with %d requests still in flight after %.0f s; this worker ended %d of them",
                waiting,
                self.grace_s,
                cut,
            )
        else:
            logger.info("no requests in flight; stopping")
        previous(signum, None)
