"""gRPC calls over one HTTP/2 connection, read on the event loop: the relay's transport to Triton.

Why not grpcio: its asyncio API hands every received message from a poller thread to the event
loop (a futex wake-up, an eventfd write and a context switch per message), which costs about
100 us of CPU per streamed token, more than everything else the service does per token together.
This client is an asyncio Protocol: every frame of a socket read is parsed in one loop on the event
loop's thread, all calls of the process share one connection, and under load one read carries
many tokens of many requests.

It speaks what a gRPC client needs and no more: server-streaming calls (one request message, then
half-close; ModelStreamInfer takes that shape), response messages handed to a `CallSink` as they
complete, trailers (grpc-status, grpc-message), cancellation with RST_STREAM, flow control both
ways, SETTINGS, PING and GOAWAY. Header blocks are decoded with `hpack` (once at the start and once
at the end of a call; `HeaderBlocks` remembers the blocks that only index the table, which is what
Triton sends once its table holds its headers); request headers are literal fields, never indexed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import time
from collections.abc import Callable
from typing import Protocol, cast
from urllib.parse import unquote

from hpack import Decoder
from hpack.exceptions import HPACKError

logger = logging.getLogger("trtllm_service.relay")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_INITIAL_WINDOW_SIZE = 0x2, 0x3, 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
CANCEL = 0x8
MAX_WINDOW = (1 << 31) - 1
DEFAULT_WINDOW = 65535
REPLENISH_AT = 1 << 30  # consumed bytes after which a window is topped up again

# gRPC status codes this module produces itself.
OK, CANCELLED, UNKNOWN, INTERNAL, UNAVAILABLE = 0, 1, 2, 13, 14

_frame_head = struct.Struct(">HBBBI")  # 24-bit length as 16 + 8 bits, type, flags, stream id
_u32 = struct.Struct(">I")


class CallSink(Protocol):
    """Receives what one call returns. Called on the event loop, from inside data_received."""

    def on_message(self, data: bytes) -> None:
        """One complete response message (the serialized protobuf)."""

    def on_end(self, status: int, message: str) -> None:
        """The call ended: its gRPC status (OK = 0) and message. Called exactly once."""


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    length = len(payload)
    return _frame_head.pack(length >> 8, length & 0xFF, kind, flags, stream_id) + payload


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer with an N-bit prefix; `first` holds the bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes | int, value: bytes) -> bytes:
    """A literal header field never indexed: a static-table name index, or a literal name."""
    head = (
        _hpack_int(name, 4, 0x10) if isinstance(name, int) else b"\x10" + _hpack_int(len(name), 7, 0) + name
    )
    return head + _hpack_int(len(value), 7, 0) + value


def request_headers(authority: str, path: str) -> bytes:
    """The header block of a gRPC call (static-table entries 3 `:method: POST`, 6 `:scheme: http`)."""
    return (
        b"\x83\x86"
        + _literal(4, path.encode())  # :path
        + _literal(1, authority.encode())  # :authority
        + _literal(b"content-type", b"application/grpc")
        + _literal(b"te", b"trailers")
    )


class _Call:
    """One call's state on the connection."""

    __slots__ = (
        "buffer",
        "consumed",
        "ended",
        "headers_seen",
        "pending",
        "send_window",
        "sink",
        "stream_id",
    )

    def __init__(self, stream_id: int, sink: CallSink, send_window: int) -> None:
        self.stream_id = stream_id
        self.sink = sink
        self.buffer = bytearray()  # a response message split across DATA frames
        self.consumed = 0
        self.headers_seen = False
        self.ended = False
        self.send_window = send_window
        self.pending = b""  # request bytes waiting for flow-control window (DATA payload)


class HeaderBlocks:
    """HPACK decoding (the connection's decoder state) that remembers blocks made only of indexed
    fields: from its second call on, Triton answers every call with the same two such blocks, which
    `hpack` would decode again each time (pure Python, tens of microseconds per call before its first
    token). An indexed field changes nothing, so such a block means the same headers for as long as
    the dynamic table stays as it is; any other block may change the table, and empties the memory."""

    __slots__ = ("_decoder", "_known")

    MAX_KNOWN = 64

    def __init__(self) -> None:
        self._decoder = Decoder()
        self._known: dict[bytes, list[tuple[bytes, bytes]]] = {}

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The block's (name, value) pairs, raw bytes. Raises HPACKError."""
        known = self._known.get(block)
        if known is not None:
            return known
        # hpack says Iterable[HeaderTuple]; it returns a list (HeaderTuple: tuple[bytes, bytes])
        headers = cast("list[tuple[bytes, bytes]]", self._decoder.decode(block, raw=True))
        if not _only_indexed(block):
            self._known.clear()
        elif len(self._known) < self.MAX_KNOWN:
            self._known[block] = headers
        return headers


def _only_indexed(block: bytes) -> bool:
    """Whether every field of the block is an indexed header field (RFC 7541 6.1: a set high bit,
    its index an integer with a 7-bit prefix)."""
    i, end = 0, len(block)
    while i < end:
        if not block[i] & 0x80:
            return False
        if block[i] & 0x7F == 0x7F:  # the index goes on in continuation bytes
            i += 1
            while i < end and block[i] & 0x80:
                i += 1
        i += 1
    return True


class GrpcConnection(asyncio.Protocol):
    """An HTTP/2 connection that multiplexes gRPC calls. Open it with `GrpcConnection.open`."""

    def __init__(self, authority: str) -> None:
        self.authority = authority
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._calls: dict[int, _Call] = {}
        self._queued: list[tuple[str, bytes, _Call]] = []  # waiting for MAX_CONCURRENT_STREAMS
        self._next_stream = 1
        self._headers = HeaderBlocks()
        self._header_block: tuple[int, int, bytearray] | None = None  # stream, flags, fragments
        self._max_streams = 1 << 31
        self._peer_window = DEFAULT_WINDOW  # the peer's initial stream window for our sends
        self._max_frame = 16384
        self._send_window = DEFAULT_WINDOW  # the connection's window for our sends
        self._received = 0
        self._headers_cache: dict[str, bytes] = {}
        self.closed = False
        self.close_reason = ""
        self.last_received = time.monotonic()  # when the peer last sent anything (the relay's watchdog)
        self._lost: asyncio.Future[None] | None = None
        self.reading = False  # inside data_received: sinks may defer work to the read's end
        self._after_read: list[Callable[[], None]] = []

    @classmethod
    async def open(cls, host: str, port: int, *, timeout_s: float = 5.0) -> GrpcConnection:
        loop = asyncio.get_running_loop()
        _, connection = await asyncio.wait_for(
            loop.create_connection(lambda: cls(f"{host}:{port}"), host, port), timeout_s
        )
        return connection

    # ---- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # create_connection's: a stream's transport (asyncio.Protocol's signature says BaseTransport)
        self._transport = cast(asyncio.Transport, transport)
        self._lost = asyncio.get_running_loop().create_future()
        with contextlib.suppress(OSError, AttributeError):
            import socket

            transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        settings = struct.pack(
            ">HIHI",
            SETTINGS_ENABLE_PUSH,
            0,
            SETTINGS_INITIAL_WINDOW_SIZE,
            MAX_WINDOW,
        )
        self._transport.write(
            PREFACE
            + _frame(SETTINGS, 0, 0, settings)
            + _frame(WINDOW_UPDATE, 0, 0, _u32.pack(MAX_WINDOW - DEFAULT_WINDOW))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"connection to {self.authority} lost" + (f": {exc}" if exc else "")
        if self._calls and not self.closed:  # where it is and why, for the log (not the clients)
            logger.warning("%s with %d requests open", reason, len(self._calls))
        self._fail_all(reason)
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.reading = True
        try:
            self._read(data)
        finally:
            self.reading = False
            if self._after_read:
                callbacks, self._after_read = self._after_read, []
                for callback in callbacks:
                    try:
                        callback()
                    except Exception:  # one sink's failure must not keep the others waiting
                        logger.exception("a callback after a read failed")

    def after_read(self, callback: Callable[[], None]) -> None:
        """Calls `callback` once every frame of the current socket read has been handled (a stream
        that got several responses in one read then writes them as one chunk)."""
        self._after_read.append(callback)

    def _read(self, data: bytes) -> None:
        self.last_received = time.monotonic()
        buffer = self._buffer
        if buffer:
            buffer += data
            view: bytes | bytearray = buffer
        else:
            view = data
        size = len(view)
        pos = 0
        unpack = _frame_head.unpack_from
        while size - pos >= 9:
            high, low, kind, flags, stream_id = unpack(view, pos)
            length = (high << 8) | low
            end = pos + 9 + length
            if end > size:
                break
            stream_id &= 0x7FFFFFFF
            if kind == DATA:
                self._on_data(stream_id, flags, view[pos + 9 : end], length)
            else:
                self._on_control(kind, flags, stream_id, bytes(view[pos + 9 : end]))
            pos = end
            if self.closed:
                return
        if view is buffer:
            del buffer[:pos]
        elif pos < size:
            buffer += view[pos:]

    # ---- calls -----------------------------------------------------------------------------------

    def start_call(self, path: str, message: bytes, sink: CallSink) -> int:
        """Starts a server-streaming call: sends `message` and half-closes. Returns its stream id."""
        if self.closed:
            sink.on_end(UNAVAILABLE, self.close_reason or "connection closed")
            return 0
        stream_id = self._next_stream
        self._next_stream += 2
        call = _Call(stream_id, sink, self._peer_window)
        payload = b"\x00" + _u32.pack(len(message)) + message
        opened = len(self._calls) - len(self._queued)
        self._calls[stream_id] = call
        if opened >= self._max_streams:
            self._queued.append((path, payload, call))
        else:
            self._open_stream(path, payload, call)
        return stream_id

    def _open_stream(self, path: str, payload: bytes, call: _Call) -> None:
        headers = self._headers_cache.get(path)
        if headers is None:
            headers = self._headers_cache[path] = request_headers(self.authority, path)
        call.pending = payload
        self._send_pending(call, _frame(HEADERS, END_HEADERS, call.stream_id, headers))

    def _send_pending(self, call: _Call, headers: bytes = b"") -> None:
        """Sends as much of the call's request as the windows allow (after `headers`, in one write);
        the last frame ends the stream."""
        out = [headers] if headers else []
        while call.pending:
            room = min(self._send_window, call.send_window, self._max_frame)
            if room <= 0:
                break
            chunk, call.pending = call.pending[:room], call.pending[room:]
            self._send_window -= len(chunk)
            call.send_window -= len(chunk)
            out.append(_frame(DATA, 0 if call.pending else END_STREAM, call.stream_id, chunk))
        if out and self._transport is not None:
            self._transport.write(b"".join(out))

    def cancel(self, stream_id: int) -> None:
        """Ends a call from our side (RST_STREAM CANCEL); its sink hears nothing more."""
        call = self._calls.pop(stream_id, None)
        if call is None:
            return
        call.ended = True
        queued = [item for item in self._queued if item[2] is call]
        if queued:
            self._queued.remove(queued[0])
        elif self._transport is not None and not self.closed:
            self._transport.write(_frame(RST_STREAM, 0, stream_id, _u32.pack(CANCEL)))
        self._start_queued()

    def cancel_all(self) -> list[CallSink]:
        """Cancels every call (RST_STREAM CANCEL each, queued ones dropped); returns their sinks,
        which hear nothing more from here."""
        calls, self._calls = self._calls, {}
        queued = {item[2].stream_id for item in self._queued}
        self._queued.clear()
        for call in calls.values():
            call.ended = True
            if call.stream_id not in queued and self._transport is not None and not self.closed:
                self._transport.write(_frame(RST_STREAM, 0, call.stream_id, _u32.pack(CANCEL)))
        return [call.sink for call in calls.values()]

    @property
    def active_calls(self) -> int:
        return len(self._calls)

    async def close(self) -> None:
        """Closes the connection; calls still running end with UNAVAILABLE."""
        if self._transport is not None and not self._transport.is_closing():
            with contextlib.suppress(Exception):
                self._transport.write(_frame(GOAWAY, 0, 0, _u32.pack(0) + _u32.pack(0)))
            self._transport.close()
        self._fail_all("connection closed")
        if self._lost is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._lost), 2)

    def abort(self, reason: str) -> None:
        """Drops the connection at once (the peer stopped answering); calls end with UNAVAILABLE."""
        self.closed = True
        self.close_reason = reason
        if self._transport is not None:
            self._transport.abort()
        self._fail_all(reason)

    # ---- frames ----------------------------------------------------------------------------------

    def _on_data(self, stream_id: int, flags: int, payload: bytes | bytearray, length: int) -> None:
        self._received += length
        if self._received >= REPLENISH_AT:
            self._window_update(0, self._received)
            self._received = 0
        call = self._calls.get(stream_id)
        if call is None:
            return
        if flags & PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        call.consumed += length
        if call.consumed >= REPLENISH_AT:
            self._window_update(stream_id, call.consumed)
            call.consumed = 0
        buffer = call.buffer
        if buffer:
            buffer += payload
            data: bytes | bytearray = buffer
        else:
            data = payload
        size = len(data)
        pos = 0
        sink = call.sink
        while size - pos >= 5:
            message_length = _u32.unpack_from(data, pos + 1)[0]
            end = pos + 5 + message_length
            if end > size:
                break
            if data[pos]:
                self._abort(call, "compressed gRPC messages are not supported")
                return
            try:
                sink.on_message(bytes(data[pos + 5 : end]))
            except Exception as exc:  # one bad message ends its call, not the connection
                self._abort(call, f"unreadable response message: {exc}")
                return
            pos = end
            if call.ended:
                return
        if data is buffer:
            del buffer[:pos]
        elif pos < size:
            buffer += data[pos:]
        if flags & END_STREAM:
            self._end(call, UNKNOWN, "the server ended the call without trailers")

    def _on_control(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == HEADERS:
            if flags & PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            if flags & END_HEADERS:
                self._on_headers(stream_id, flags, payload)
            else:
                self._header_block = (stream_id, flags, bytearray(payload))
        elif kind == CONTINUATION:
            if self._header_block is None or self._header_block[0] != stream_id:
                self._connection_error("CONTINUATION without HEADERS")
                return
            self._header_block[2].extend(payload)
            if flags & END_HEADERS:
                stream, first_flags, block = self._header_block
                self._header_block = None
                self._on_headers(stream, first_flags, bytes(block))
        elif kind == SETTINGS:
            if not flags & ACK:
                self._apply_settings(payload)
                assert self._transport is not None
                self._transport.write(_frame(SETTINGS, ACK, 0))
        elif kind == WINDOW_UPDATE:
            increment = _u32.unpack(payload[:4])[0] & 0x7FFFFFFF
            if stream_id == 0:
                self._send_window += increment
                for waiting in list(self._calls.values()):
                    if waiting.pending:
                        self._send_pending(waiting)
            elif (call := self._calls.get(stream_id)) is not None:
                call.send_window += increment
                self._send_pending(call)
        elif kind == PING:
            if not flags & ACK and self._transport is not None:
                self._transport.write(_frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            call = self._calls.get(stream_id)
            if call is not None:
                code = _u32.unpack(payload[:4])[0]
                self._end(
                    call, CANCELLED if code == CANCEL else UNAVAILABLE, f"stream reset by the server ({code})"
                )
        elif kind == GOAWAY:
            last_stream = _u32.unpack(payload[:4])[0] & 0x7FFFFFFF
            code = _u32.unpack(payload[4:8])[0]
            self.closed = True  # no new calls; those the server took may still finish
            self.close_reason = f"the server is going away (GOAWAY {code})"
            for call in [c for c in self._calls.values() if c.stream_id > last_stream]:
                self._end(call, UNAVAILABLE, self.close_reason)
            if not self._calls and self._transport is not None:
                self._transport.close()
        # PRIORITY and PUSH_PROMISE (push is disabled) need nothing.

    def _on_headers(self, stream_id: int, flags: int, block: bytes) -> None:
        try:
            headers = self._headers.decode(block)  # every block: the decoder keeps state
        except HPACKError as exc:
            self._connection_error(f"undecodable headers: {exc}")
            return
        call = self._calls.get(stream_id)
        if call is None:
            return
        fields = {name: value for name, value in headers}
        if not call.headers_seen and b":status" in fields:
            call.headers_seen = True
            status = fields[b":status"]
            if status != b"200":
                self._end(
                    call,
                    UNAVAILABLE if status in (b"502", b"503", b"504") else UNKNOWN,
                    f"HTTP status {status.decode()}",
                )
                return
        if flags & END_STREAM:
            code = fields.get(b"grpc-status")
            message = unquote(fields.get(b"grpc-message", b"").decode("utf-8", "replace"))
            if code is None:
                self._end(call, UNKNOWN, message or "the server ended the call without a status")
            else:
                self._end(call, int(code), message)

    def _apply_settings(self, payload: bytes) -> None:
        for offset in range(0, len(payload) - 5, 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == SETTINGS_MAX_CONCURRENT_STREAMS:
                self._max_streams = value
            elif key == SETTINGS_INITIAL_WINDOW_SIZE:
                delta = value - self._peer_window
                self._peer_window = value
                for call in self._calls.values():
                    call.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                self._max_frame = value
        self._start_queued()

    def _window_update(self, stream_id: int, increment: int) -> None:
        if self._transport is not None:
            self._transport.write(_frame(WINDOW_UPDATE, 0, stream_id, _u32.pack(increment)))

    def _end(self, call: _Call, status: int, message: str) -> None:
        if call.ended:
            return
        call.ended = True
        self._calls.pop(call.stream_id, None)
        call.sink.on_end(status, message)
        self._start_queued()

    def _abort(self, call: _Call, message: str) -> None:
        """Ends a call on our side (RST_STREAM to the server) with an INTERNAL error its sink hears."""
        if self._transport is not None and not self.closed:
            self._transport.write(_frame(RST_STREAM, 0, call.stream_id, _u32.pack(CANCEL)))
        self._end(call, INTERNAL, message)

    def _start_queued(self) -> None:
        while self._queued and len(self._calls) - len(self._queued) < self._max_streams and not self.closed:
            path, payload, call = self._queued.pop(0)
            self._open_stream(path, payload, call)

    def _connection_error(self, reason: str) -> None:
        self.closed = True
        self.close_reason = f"HTTP/2 protocol error: {reason}"
        if self._transport is not None:
            self._transport.close()
        self._fail_all(self.close_reason)

    def _fail_all(self, reason: str) -> None:
        self.closed = True
        self.close_reason = self.close_reason or reason
        for call in list(self._calls.values()):
            self._end(call, UNAVAILABLE, reason)
        self._queued.clear()
