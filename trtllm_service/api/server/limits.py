"""What the generation routes let in: a concurrency limit (429), a body size cap (413) and JSON
bodies only (415), each answered in OpenAI's error shape before any request is read or parsed.

BentoML's own `max_concurrency` answers `{"error": "Too many requests"}` before any of our code
runs; this middleware counts requests in flight on `/generate` and `/v1/*` (a streamed response
counts until its last byte) and refuses the excess with a 429 that OpenAI clients understand.

The limit is the service's, whatever the number of HTTP worker processes: with `shared_dir`, the
workers count in one small file (`SharedSlots`), once when a request starts and once when it ends,
never per token.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
from collections.abc import Callable
from pathlib import Path

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tensorrtllm_backend.launcher import pid_alive
from trtllm_service.api.server.auth import is_open
from trtllm_service.api.server.mapped_table import MappedTable
from trtllm_service.api.server.metrics import count_rejected
from trtllm_service.api.server.shutdown import Drain
from trtllm_service.errors import APIError

_SLOT = struct.Struct("<qq")  # pid, requests in flight


_SLOTS = 256


class SharedSlots(MappedTable):
    """Requests in flight across the processes that share `path`: one slot (pid, count) per process,
    read and updated under an exclusive flock. Slots of processes that are gone do not count, so a
    worker killed mid-request cannot leave the service short of capacity."""

    SLOTS = _SLOTS

    def __init__(
        self, path: Path, *, pid: int | None = None, alive: Callable[[int], bool] = pid_alive
    ) -> None:
        size = self.SLOTS * _SLOT.size  # all of it as words too: pid, count, pid, count...
        super().__init__(path, size, size, pid=pid, alive=alive)
        self._mine: int | None = None

    def _slots(self, table: mmap.mmap) -> list[tuple[int, int]]:
        """The slots ever taken: (pid, count) each. A process takes the first free slot, so those never
        taken (pid 0) are all at the end, and the scan stops at the first (a request's fixed cost)."""
        slots = []
        for index in range(self.SLOTS):
            slot = _SLOT.unpack_from(table, index * _SLOT.size)
            if slot[0] == 0:
                break
            slots.append(slot)
        return slots

    def _in_flight(self, slots: list[tuple[int, int]], me: int) -> int:
        """The requests of the slots whose process is alive (this one, `me`, is)."""
        return sum(count for pid, count in slots if count > 0 and (pid == me or self.alive(pid)))

    def try_acquire(self, limit: int) -> bool:
        """Counts one more request of this process unless `limit` are in flight already."""
        words = self.lock()
        try:
            # the short way, the common case: this process's slot is known and the requests in
            # flight are under the limit even with dead processes' counted (none is looked up)
            mine, me = self._mine, self._me
            if mine is not None and words[2 * mine] == me:
                in_flight, at, end = 0, 0, 2 * self.SLOTS
                while at < end and words[at]:
                    if words[at + 1] > 0:
                        in_flight += words[at + 1]
                    at += 2
                if in_flight < limit:
                    words[2 * mine + 1] += 1
                    return True
            return self._try_acquire(self._open(), me, limit)
        finally:
            self.unlock()

    def _try_acquire(self, table: mmap.mmap, me: int, limit: int) -> bool:
        """`try_acquire`'s whole way, under the lock."""
        slots = self._slots(table)
        if self._in_flight(slots, me) >= limit:
            return False
        index = self._slot_of(me, slots)
        pid, count = _SLOT.unpack_from(table, index * _SLOT.size)
        _SLOT.pack_into(table, index * _SLOT.size, me, (count if pid == me else 0) + 1)
        return True

    def total(self) -> int:
        """Requests in flight in every live process."""
        with self.locked() as table:
            return self._in_flight(self._slots(table), self._me)

    def release(self) -> None:
        with self.locked() as table:
            me = self._me
            index = self._mine
            if index is None or _SLOT.unpack_from(table, index * _SLOT.size)[0] != me:
                index = self._slot_of(me, self._slots(table))
            pid, count = _SLOT.unpack_from(table, index * _SLOT.size)
            if pid == me and count > 0:
                _SLOT.pack_into(table, index * _SLOT.size, me, count - 1)

    def _slot_of(self, me: int, slots: list[tuple[int, int]]) -> int:
        """This process's slot: the one it holds, else a free one (empty, or left by a dead process)."""
        if self._mine is not None and self._mine < len(slots) and slots[self._mine][0] == me:
            return self._mine
        free = None
        for index, (pid, count) in enumerate(slots):
            if pid == me:
                self._mine = index
                return index
            if free is None and (count == 0 or not self.alive(pid)):
                free = index
        if free is None:  # the first slot never taken
            if len(slots) == self.SLOTS:
                raise RuntimeError(f"more than {self.SLOTS} processes share {self.path}")
            free = len(slots)
        self._mine = free
        return free


class ConcurrencyLimitMiddleware:
    """Lets at most `limit` generation requests run at once; the rest get 429 with Retry-After.

    Args:
        limit: Requests in flight for the whole service.
        shared_dir: Where the worker processes of the service count together (the run dir);
            None counts this process's requests only.
        model_name: For the rejected-requests metric.
        drain: The shutdown state: while it drains, new requests get 503 (and it counts the
            requests in flight here).
    """

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        shared_dir: Path | None = None,
        model_name: str = "",
        drain: Drain | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError("the concurrency limit must be at least 1")
        self.app = app
        self.limit = limit
        self.model_name = model_name
        self.in_flight = 0
        self.shared = SharedSlots(shared_dir / "in_flight.slots") if shared_dir is not None else None
        self.drain = drain
        if drain is not None:
            drain.counted_by(self.service_in_flight)

    def service_in_flight(self) -> int:
        """Requests in flight in every worker of the service (this one's alone without a shared count)."""
        if self.shared is not None:
            with contextlib.suppress(OSError):
                return self.shared.total()
        return self.in_flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        if self.drain is not None and self.drain.draining:
            error = APIError.unavailable("The service is shutting down; please retry.", retry_after=1)
            await refuse(error, self.model_name, scope, receive, send, close=True)
            return
        if not self._acquire():
            await refuse(too_many_requests(self.limit), self.model_name, scope, receive, send)
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


CURL_DEFAULT_TYPE = b"application/x-www-form-urlencoded"
"""What `curl -d` declares unless told otherwise: such a body is read as JSON, on every route."""


def _media_type(content_type: bytes) -> bytes:
    """A Content-Type's media type, without parameters, in lower case."""
    return content_type.split(b";", 1)[0].strip().lower()


def _acceptable(media: bytes | None) -> bool:
    """JSON (`application/json`, `+json`), no Content-Type, or curl's default (all read as JSON)."""
    return media is None or media in (b"", b"application/json", CURL_DEFAULT_TYPE) or media.endswith(b"+json")


def _as_json(scope: Scope) -> Scope:
    """`scope` with its Content-Type set to JSON: curl's default form type would make BentoML read
    `/generate`'s body as a form (and find no prompt in it)."""
    headers = [(name, value) for name, value in scope["headers"] if name != b"content-type"]
    return {**scope, "headers": [*headers, (b"content-type", b"application/json")]}


class BodyLimitMiddleware:
    """Refuses generation request bodies larger than `max_bytes` (413, before reading them) and
    bodies of other media types than JSON (415; forms included: every route takes JSON, and a body
    curl sends with its default form type is read as JSON).

    A body with a Content-Length over the cap is refused unread; a chunked one is read up to the cap
    and refused there, or handed on whole.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, model_name: str = "") -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.model_name = model_name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] not in ("POST", "PUT", "PATCH")
            or is_open(scope["path"])
        ):
            await self.app(scope, receive, send)
            return
        media = length = None
        for name, value in scope["headers"]:  # one pass; ASGI's header names are lower case
            if name == b"content-type":
                if media is None:
                    media = value if value == b"application/json" else _media_type(value)
            elif name == b"content-length" and length is None:
                length = value
        if not _acceptable(media):
            error = unsupported_media_type((media or b"").decode("latin-1"))
            await refuse(error, self.model_name, scope, receive, send, close=True)
            return
        if media == CURL_DEFAULT_TYPE:
            scope = _as_json(scope)
        if length is not None:
            if length.isdigit() and int(length) <= self.max_bytes:
                await self.app(scope, receive, send)
            else:
                await refuse(self._too_large(), self.model_name, scope, receive, send, close=True)
            return
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_bytes:
                await refuse(self._too_large(), self.model_name, scope, receive, send, close=True)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    def _too_large(self) -> APIError:
        return body_too_large(self.max_bytes)


def too_many_requests(limit: int) -> APIError:
    """429: `limit` requests are in flight already."""
    return APIError.rate_limited(
        f"More than {limit} requests are in flight; please retry shortly.", retry_after=1
    )


def unsupported_media_type(media: str) -> APIError:
    """415: a body of another media type than JSON."""
    return APIError(
        415,
        f"Unsupported Content-Type {media!r}: send the body as application/json.",
        code="unsupported_media_type",
    )


def body_too_large(max_bytes: int) -> APIError:
    """413: a body over `max_bytes`."""
    return APIError(
        413,
        f"The request body is larger than the limit of {max_bytes} bytes (TRTLLM_MAX_BODY_BYTES).",
        code="request_too_large",
    )


async def refuse(
    error: APIError, model_name: str, scope: Scope, receive: Receive, send: Send, *, close: bool = False
) -> None:
    """Answers `error` at the door, counted in the rejected-requests metric; with `close`, the
    connection closes after it (a body left unread, or a server going away)."""
    count_rejected(model_name, scope["path"], error.status)
    headers = {**error.headers(), **({"Connection": "close"} if close else {})}
    await JSONResponse(error.body(), status_code=error.status, headers=headers)(scope, receive, send)
