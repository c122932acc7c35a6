"""Streamed HTTP bodies: the engine's text goes out as it comes, in as few writes as the client allows.

`StreamBody` is a bare ASGI response over an async generator of byte chunks. Each chunk is one write;
the generators (text for `/generate`, SSE for `/v1`) take everything the relay received since their
last write, so a client that is behind gets several tokens per write, and the first token is never
held back. The client going away (uvicorn silently drops writes after a disconnect, so `receive` is
watched) cancels the writer; however the response ends, the generator is closed, which cancels the
engine requests behind it. A generator that fails after the first chunk aborts the connection, so a
client never mistakes a cut-off answer for a complete one.

Body chunks other than the last go to the server's own `send` (put in the scope by `ServerSendApp`,
outside every middleware) rather than through the middlewares' `send` wrappers, which only act on
the response's start and end: that chain cost more per streamed token than the write itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Mapping

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trtllm_service.api.metrics import RequestMetrics
from trtllm_service.errors import APIError
from trtllm_service.relay.client import EngineStream

SERVER_SEND = "trtllm.server_send"
"""Scope key of the server's own `send` (set by `ServerSendApp`)."""


class ServerSendApp:
    """The outermost ASGI app: records the server's `send` in an HTTP request's scope."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[SERVER_SEND] = send
        await self.app(scope, receive, send)


async def _until_disconnect(receive: Receive) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            return


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
        watcher = asyncio.ensure_future(_until_disconnect(receive))
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


async def text_chunks(
    stream: EngineStream, first: str, metrics: RequestMetrics, prompt_tokens: int
) -> AsyncGenerator[bytes, None]:
    """The body of `/generate`: the generated text, UTF-8, in chunks as the relay delivers it."""
    status = 499  # the client went away, unless the stream ends or fails
    try:
        if first:
            yield first.encode()
        while stream.finish_reason is None:
            text = await stream.read()
            if text:
                yield text.encode()
        status = 200
    except APIError as exc:
        status = exc.status
        raise
    finally:
        stream.close()
        metrics.done(status, stream.finish_reason, prompt_tokens, stream.completion_tokens)


async def first_text(stream: EngineStream, metrics: RequestMetrics) -> str:
    """Waits for the first text (or the end) of a stream, so that errors come before the response."""
    try:
        text = await stream.read()
    except BaseException:
        stream.close()
        raise
    metrics.first_token()
    return text
