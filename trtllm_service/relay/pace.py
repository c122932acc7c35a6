"""First tokens first: while requests of this worker wait for their first token, the streams that
already have theirs write their text in batches.

A worker is one event loop. When many requests arrive together (a burst, or steady load near the
engine's rate), the loop shares its time between preparing the new requests (middlewares, the chat
template, the tokenizer, the engine request) and relaying every running stream's tokens, one write
per token. Holding the running streams' text for a few milliseconds while any request is starting
leaves the loop to the new ones, and a write then carries several tokens. With no request starting
(one stream, or streams all under way) nothing is held: every token goes out as it arrives. A
stream's own first text is never held.

Measured on a 16-core box with an engine faster than the workers (bench/README.md, "The GPU box"):
writes per token 0.65 -> 0.1, the service's CPU per token 28.7-33.3 -> 26.7-28.5 us, inter-token
latency p99 under load 5.5 -> 13 ms; time to first token unchanged (the service's own steps were
about 2 ms a request either way; a first token waits for the engine).

A request is starting from the moment the server sees it (`ServerSendApp`, every POST) until its
first engine response arrives or it ends, whichever comes first (`Ticket`). TRTLLM_LOADED_STREAM_INTERVAL_MS
sets the hold (0: off).
"""

from __future__ import annotations

from contextvars import ContextVar

DEFAULT_INTERVAL_S = 0.010


class Pace:
    """How many requests of this worker are starting, and how long other streams' text may wait."""

    __slots__ = ("interval_s", "starting")

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.starting = 0

    def enter(self) -> Ticket:
        """A request starts; it stops starting when its ticket is `done()`."""
        self.starting += 1
        return Ticket(self)


class Ticket:
    """One starting request's place in `Pace.starting`; `done()` may be called any number of times."""

    __slots__ = ("_pace",)

    def __init__(self, pace: Pace) -> None:
        self._pace: Pace | None = pace

    def done(self) -> None:
        pace, self._pace = self._pace, None
        if pace is not None:
            pace.starting -= 1


PACE = Pace()
"""The worker's: its server counts requests in, its relay's streams read it (one event loop a process)."""

STARTING: ContextVar[Ticket | None] = ContextVar("trtllm_starting", default=None)
"""The current HTTP request's ticket (set by the server for the request's task and what it spawns)."""
