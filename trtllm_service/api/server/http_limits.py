"""What a client may make the HTTP server read, and for how long: the limits production servers
set (nginx's client_header_timeout, client_body_timeout and large_client_header_buffers, Apache's
mod_reqtimeout and LimitRequestFields), where uvicorn under BentoML 1.4 has none.

uvicorn's httptools protocol reads a request's headers and body for as long as the client likes:
a connection that sends nothing, headers at a byte a second (slowloris) or a body that stops after
10 of its declared bytes held a worker's connection indefinitely (65-70 s seen, no end), and an
8 MB header was read whole. BentoML exposes only the idle keep-alive between requests
(`bentoml serve --timeout-keep-alive`, 5 s by default); `install` gives uvicorn a protocol with:

- a header timeout: a request's head (request line and headers) must be complete this many
  seconds after the connection opens, or after its first byte on a kept-alive connection;
- a body timeout: while a request's body is read, at most this many seconds between two reads
  (a client the server itself holds back, its reading paused or its `Expect: 100-continue` not yet
  answered, is not counted against);
- at most so many header bytes and header lines.

A client past one of them gets a 408 or 431 in the service's error shape, and the connection is
closed. Nothing is timed once the request is read: a stream to a slow but live reader runs as long
as it runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any

from trtllm_service.errors import APIError

logger = logging.getLogger("trtllm_service")


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits on reading one request (see the module's docstring; settings.py has the values)."""

    header_timeout_s: float
    body_timeout_s: float
    max_header_bytes: int
    max_headers: int


class _Refused(Exception):
    """Stops httptools' parser at a request past a limit (it answers 400 for any callback's error:
    `send_400_response` sends the refusal instead)."""


def error_bytes(error: APIError) -> bytes:
    """A complete HTTP/1.1 answer of `error` in the service's error shape, closing the connection."""
    body = json.dumps(error.body()).encode()
    head = (
        f"HTTP/1.1 {error.status} {_REASONS[error.status]}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


_REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large"}


class ClientGoneLogFilter(logging.Filter):
    """BentoML logs a request whose client left before its body was read (a stalled body cut by
    the body timeout, a client that gave up) as "Exception on /generate [POST]" with a traceback:
    one line instead, at INFO (a client can cause it at will)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from starlette.requests import ClientDisconnect

        if record.exc_info and isinstance(record.exc_info[1], ClientDisconnect):
            record.msg = f"the client left before its request was read ({record.getMessage()})"
            record.args, record.exc_info, record.exc_text = (), None, None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def quiet_client_gone() -> None:
    """Installs `ClientGoneLogFilter` on BentoML's HTTP app logger (once)."""
    bentoml_log = logging.getLogger("bentoml._internal.server.http_app")
    if not any(isinstance(f, ClientGoneLogFilter) for f in bentoml_log.filters):
        bentoml_log.addFilter(ClientGoneLogFilter())


def install(limits: ConnectionLimits) -> bool:
    """Makes uvicorn serve HTTP/1.1 with `limits` (its "auto" protocol, BentoML's choice, and
    "httptools"); False, with a warning, where uvicorn has no httptools protocol to bound."""
    try:
        from uvicorn import config as uvicorn_config
        from uvicorn.protocols.http import auto
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        logger.warning("httptools is not installed: HTTP header and body limits are not applied")
        return False
    protocol = bounded_protocol(HttpToolsProtocol, limits)
    auto.AutoHTTPProtocol = protocol
    name = f"{__name__}:{protocol.__name__}"
    globals()[protocol.__name__] = protocol
    uvicorn_config.HTTP_PROTOCOLS["auto"] = uvicorn_config.HTTP_PROTOCOLS["httptools"] = name
    return True


def bounded_protocol(base: type, limits: ConnectionLimits) -> type:
    """A subclass of uvicorn's `HttpToolsProtocol` that enforces `limits`."""

    class BoundedHttpToolsProtocol(base):
        """uvicorn's httptools protocol, with the head and body of each request read within limits."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._expecting_head = True  # from the connection's start, or a request's end, to headers
            self._head_read = 0  # bytes fed while a head is incomplete
            self._head_size = 0  # the head's bytes as parsed: the URL and each header line
            self._header_count = 0
            self._heads = 0  # heads completed on this connection
            self._refusal: APIError | None = None
            self._timer: asyncio.TimerHandle | None = None

        # ---- timers ------------------------------------------------------------------------------

        def _arm(self, seconds: float, on_fire: Any) -> None:
            self._disarm()
            self._timer = self.loop.call_later(seconds, on_fire)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _head_overdue(self) -> None:
            self._timer = None
            if self._expecting_head:
                self._refuse(
                    APIError(
                        408,
                        f"The request's headers did not arrive within {limits.header_timeout_s:g} s.",
                        code="request_timeout",
                    )
                )

        def _body_overdue(self) -> None:
            self._timer = None
            cycle = self.cycle
            if cycle is None or not cycle.more_body or cycle.response_complete:
                return
            if self.flow.read_paused or cycle.waiting_for_100_continue:  # held back by the server
                self._arm(limits.body_timeout_s, self._body_overdue)
                return
            self._refuse(
                APIError(
                    408,
                    f"The request's body stalled: nothing arrived for {limits.body_timeout_s:g} s.",
                    code="request_timeout",
                )
            )

        def _refuse(self, error: APIError) -> None:
            """Answers `error` unless a response has started, and closes the connection."""
            self._disarm()
            if self.transport.is_closing():
                return
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True  # the app, if it runs, sees the client gone
                cycle.message_event.set()
            if cycle is None or not cycle.response_started or cycle.response_complete:
                self.transport.write(error_bytes(error))
            logger.debug("HTTP connection from %s refused: %s", self.client, error.message)
            self.transport.close()

        # ---- the protocol -------------------------------------------------------------------------

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm(limits.header_timeout_s, self._head_overdue)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            counting, heads = self._expecting_head, self._heads
            super().data_received(data)
            if counting and self._heads == heads and self._refusal is None:
                self._head_read += len(data)  # all of it head: no head was completed in it
                if self._head_read > limits.max_header_bytes:
                    self._refuse(self._too_large())

        def send_400_response(self, msg: str) -> None:
            if self._refusal is not None:  # our own stop of the parser (`_Refused`)
                self._refuse(self._refusal)
                return
            super().send_400_response(msg)

        def _too_large(self) -> APIError:
            return APIError(
                431,
                f"The request's headers are too large: at most {limits.max_headers} headers of "
                f"{limits.max_header_bytes} bytes in all.",
                code="request_header_fields_too_large",
            )

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._timer is None:  # a kept-alive connection's next request: its head is timed
                self._arm(limits.header_timeout_s, self._head_overdue)

        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            self._head_size += len(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            super().on_header(name, value)
            self._header_count += 1
            self._head_size += len(name) + len(value) + 4

        def on_headers_complete(self) -> None:
            self._expecting_head = False
            self._heads += 1
            self._disarm()
            too_large = self._header_count > limits.max_headers or self._head_size > limits.max_header_bytes
            self._head_read = self._head_size = self._header_count = 0
            if too_large:
                self._refusal = self._too_large()
                raise _Refused
            super().on_headers_complete()
            self._arm(limits.body_timeout_s, self._body_overdue)

        def on_body(self, body: bytes) -> None:
            super().on_body(body)
            self._arm(limits.body_timeout_s, self._body_overdue)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()
            self._expecting_head = True  # what comes next is the next request's head

    return BoundedHttpToolsProtocol
