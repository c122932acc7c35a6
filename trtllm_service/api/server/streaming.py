"""Streamed HTTP bodies: the engine's text goes out as it comes, in as few writes as the client allows.

One engine stream (every `/generate`, and `/v1` answers with one choice) is a `PushBody`: the
stream calls it back when Triton's response arrives, and its text is framed (`Framing`: plain text,
or SSE) and written there and then, with no task woken per token. Several choices merged, or an
answer sent whole, are a `StreamBody` over an async generator of byte chunks. Either way each write
takes everything the relay received since the previous one, so a client that is behind gets several
tokens per write, and the first token is never held back. The client going away (uvicorn silently
drops writes after a disconnect, so `receive` is watched) ends the response; however it ends, the
engine requests behind it are closed (cancelled when unfinished). A failure after the first chunk
is reported in the stream (SSE) or aborts the connection, so a client never mistakes a cut-off
answer for a complete one.

Body chunks other than the last go to the server's own `send` (put in the scope by `ServerSendApp`,
outside every middleware) rather than through the middlewares' `send` wrappers, which only act on
the response's start and end: that chain cost more per streamed token than the write itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncGenerator, Mapping
from typing import Any, Protocol

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from trtllm_service.api.server.admission import until_disconnect
from trtllm_service.api.server.error_shape import error_response
from trtllm_service.errors import APIError
from trtllm_service.relay.client import EngineStream
from trtllm_service.relay.pace import PACE, STARTING, Pace

logger = logging.getLogger("trtllm_service.api")

SERVER_SEND = "trtllm.server_send"
"""Scope key of the server's own `send` (set by `ServerSendApp`)."""


class ServerSendApp:
    """The outermost ASGI app: records the server's `send` in an HTTP request's scope, and counts a
    POST among the worker's starting requests (relay/pace.py) from here, before any middleware, until
    its first engine response or its end."""

    def __init__(self, app: ASGIApp, pace: Pace = PACE) -> None:
        self.app = app
        self.pace = pace

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope[SERVER_SEND] = send
        if scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        ticket = self.pace.enter()
        STARTING.set(ticket)  # this task's context: the request's handler and what it starts
        try:
            await self.app(scope, receive, send)
        finally:
            ticket.done()


class CutStreamLogFilter(logging.Filter):
    """uvicorn logs an app's exception as "Exception in ASGI application" and its traceback (60
    lines). A plain-text body whose engine stream failed after the first chunk is ended that way on
    purpose (the only way to end it without its last chunk, so the client sees it cut short): it
    gets one warning line with the reason instead, for each of the streams a Triton crash cuts."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, APIError):
            record.msg, record.args = (
                "a streamed answer was cut short (%d): %s",
                (error.status, error.message),
            )
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_cut_streams() -> None:
    """Installs `CutStreamLogFilter` on uvicorn's error logger (once)."""
    uvicorn_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, CutStreamLogFilter) for f in uvicorn_log.filters):
        uvicorn_log.addFilter(CutStreamLogFilter())


class StreamBody(Response):
    """An ASGI response that streams `chunks` with status 200 (a Starlette Response, so that BentoML
    and FastAPI pass it through as it is)."""

    def __init__(
        self,
        chunks: AsyncGenerator[bytes, None],
        media_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.chunks = chunks
        self.status_code = 200
        self.background = None
        self.media_type = media_type
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = asyncio.ensure_future(self._write(send, scope.get(SERVER_SEND, send)))
        watcher = asyncio.ensure_future(until_disconnect(receive))
        try:
            await asyncio.wait((writer, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (writer, watcher):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            try:
                await writer
            except (asyncio.CancelledError, OSError):
                pass  # the client went away
            finally:
                await self.chunks.aclose()

    async def _write(self, send: Send, server_send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        async for chunk in self.chunks:
            await server_send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class Framing(Protocol):
    """What a pushed response writes, around one engine stream's texts."""

    @property
    def waiting(self) -> bool:
        """Whether the stream's first text is still to be read: the response reads it before it
        starts (an error meanwhile is answered as JSON with its status instead)."""

    def first(self, text: str) -> None:
        """The first text has come (`waiting`), before the response starts."""

    def opening(self) -> bytes:
        """The first chunk (the text read before the response started, its framing)."""

    def frame(self, text: str) -> bytes:
        """The chunk of newly generated text (b"": nothing to write)."""

    def closing(self) -> bytes:
        """The last chunk, once the stream has finished (b"": none)."""

    def failure(self, error: Exception) -> tuple[int, bytes | None]:
        """The status a failure after the start counts as, and the chunk that reports it in the
        stream (None: there is none, the connection is aborted)."""

    def done(self, status: int) -> None:
        """The response ended with `status` (499: the client went away): close, record metrics."""


class PushBody(Response):
    """An ASGI response that streams one engine stream's text, written from the stream's own wake-up.

    Nothing is scheduled per token: when a response arrives on the relay's connection, the stream
    calls back here (inside the connection's data_received), its text is read, framed and written to
    the server at once. uvicorn's `send` of a body chunk finishes without suspending unless the
    client's socket is full; then writing waits for it to drain, and what arrives meanwhile goes out
    together. The start and the end of the response still go through the middlewares, from the
    request's task, as does `Framing.done`; the callbacks run in the request's context (its request
    id, its span). An error after the start is the framing's failure chunk, or an aborted connection.

    A framing still `waiting` for its stream's first text has it read here, before the start: the
    handler returns as soon as the engine request is sent, and the way back through the framework
    and the middlewares runs while the engine computes, not between the first token and the
    client. An error before the first text is answered as JSON with its status, as a handler would;
    a client that leaves meanwhile ends the engine request at once.
    """

    def __init__(
        self,
        stream: EngineStream,
        framing: Framing,
        media_type: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.stream = stream
        self.framing = framing
        self.status_code = 200
        self.background = None
        self.media_type = media_type
        self.init_headers(headers)
        self._send: Send | None = None
        self._ended: asyncio.Future[tuple[int, BaseException | None]] | None = None
        self._outcome: tuple[int, BaseException | None] | None = None
        self._blocked: Any = None  # a body write waiting for the client's socket to drain
        self._timer: asyncio.TimerHandle | None = None
        self._context: contextvars.Context | None = None
        self._pumping = False
        self._last = b""  # the body's last chunk, sent with its end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        self._send = scope.get(SERVER_SEND, send)
        self._ended = ended = loop.create_future()
        self._context = contextvars.copy_context()
        status, error = 499, None  # the client went away, unless the stream ends or fails
        watcher = asyncio.ensure_future(until_disconnect(receive))
        try:
            if self.framing.waiting:
                refused = await self._first_text(watcher)
                if refused is not None:  # before the first text: the error's JSON answer instead
                    status = refused.status
                    await error_response(refused)(scope, receive, send)
                    return
                if watcher.done():  # the client left first: an answer nobody reads (the server drops
                    # it), so that every middleware sees the request end: 499, "client closed request"
                    await send({"type": "http.response.start", "status": 499, "headers": []})
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            self._context.run(self._start)
            if not ended.done():
                await asyncio.wait((ended, watcher), return_when=asyncio.FIRST_COMPLETED)
            if ended.done():
                status, error = ended.result()
                if error is None:  # the last chunk and the body's end: one write
                    await send({"type": "http.response.body", "body": self._last, "more_body": False})
        finally:
            self.stream.on_wake = None
            if self._timer is not None:
                self._timer.cancel()
            if self._blocked is not None:
                self._blocked.close()
                self._blocked = None
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            self.framing.done(status)
        if error is not None:
            raise error

    async def _first_text(self, watcher: asyncio.Future[None]) -> APIError | None:
        """Waits for the stream's first text, or for the client to leave (`watcher`), before the
        response starts: the handler returned this response as soon as the engine request was sent,
        so that everything up to here ran while the engine computed. Returns the error that ended the
        request first, if one did."""
        stream = self.stream
        interrupt = stream.interrupt
        watcher.add_done_callback(lambda _: interrupt())
        while not watcher.done():
            try:
                text = stream.poll()
            except APIError as exc:
                return exc
            except Exception:  # not the engine's answer: ours
                logger.exception("generation request failed")
                return APIError.internal()
            if text is not None:
                self.framing.first(text)
                return None
            if stream.hold:
                await asyncio.sleep(stream.hold)
            else:
                await stream.next_wake()
        return None

    def _start(self) -> None:
        self.stream.on_wake = self._wake
        self._pump(self.framing.opening())

    def _wake(self) -> None:
        if self._timer is not None and not self.stream.settled:
            return  # text is held (TRTLLM_STREAM_INTERVAL_MS): the timer writes what comes meanwhile
        if not self._pumping and self._context is not None:
            self._context.run(self._pump)

    def _pump(self, head: bytes = b"") -> None:
        """Writes what the stream has (after `head`) in one write; ends the response when the stream
        has finished or failed."""
        if self._blocked is not None or self._outcome is not None:
            return
        self._pumping = True
        stream = self.stream
        out = head  # what this turn writes, in one write
        try:
            while True:
                text = stream.poll()
                if text is None:
                    if stream.hold and self._timer is None:  # held (TRTLLM_STREAM_INTERVAL_MS)
                        self._timer = asyncio.get_running_loop().call_later(stream.hold, self._release)
                    break
                if text:
                    frame = self.framing.frame(text)
                    out = out + frame if out else frame
                if stream.finish_reason is not None:
                    self._finish(200, out, self.framing.closing())
                    return
            if out:
                self._write(out)
        except Exception as exc:
            status, chunk = self.framing.failure(exc)
            self._finish(status, out, chunk, None if chunk is not None else exc)
        finally:
            self._pumping = False

    def _release(self) -> None:
        self._timer = None
        self._wake()

    def _write(self, chunk: bytes) -> bool:
        """Writes a body chunk; False when the write waits for the client (it resumes by itself)."""
        if not chunk:
            return True
        assert self._send is not None
        writing = self._send({"type": "http.response.body", "body": chunk, "more_body": True})
        return self._step(writing)

    def _step(self, writing: Any) -> bool:
        try:
            waiting = writing.send(None)
        except StopIteration:
            return True
        except OSError:  # the client went away
            self._end((499, None))
            return False
        except Exception as exc:
            self._end((500, exc))
            return False
        self._blocked = writing
        if waiting is None:  # a bare yield: go on at the next turn of the loop
            asyncio.get_running_loop().call_soon(self._drained, None)
        else:
            waiting._asyncio_future_blocking = False
            waiting.add_done_callback(self._drained)
        return False

    def _drained(self, _: object) -> None:
        writing, self._blocked = self._blocked, None
        if writing is None:
            return  # the response ended meanwhile
        assert self._context is not None
        if not self._context.run(self._step, writing):
            return
        if self._outcome is not None:
            self._end(self._outcome)
        else:
            self._wake()

    def _finish(
        self, status: int, text: bytes, last: bytes | None, error: BaseException | None = None
    ) -> None:
        """The stream is over. Text goes out at once, `last` (the closing chunk, or the failure's)
        with it; without text, `last` goes with the body's end (one write fewer, nothing the client
        waits for is held). `last` None: the response ends with `error` after the text."""
        self._outcome = (status, error)
        if text and last:
            text, last = text + last, b""
        self._last = last or b""
        if not text or self._write(text):
            self._end(self._outcome)

    def _end(self, outcome: tuple[int, BaseException | None]) -> None:
        self._outcome = outcome
        self.stream.on_wake = None
        if self._ended is not None and not self._ended.done():
            self._ended.set_result(outcome)
