"""PushBody: one engine stream's text written from the stream's own wake-up, as Triton's responses
(tests.support.engine_response) reach the stream on a real event loop; the server's `send` is a
stand-in that records, or holds a write the way uvicorn does when the client's socket is full."""

from __future__ import annotations

import asyncio
from array import array
from typing import Any

import pytest

from tests.support import engine_response
from trtllm_service.api.generate.serving import TextFraming
from trtllm_service.api.server.metrics import RequestMetrics
from trtllm_service.api.server.streaming import SERVER_SEND, PushBody
from trtllm_service.errors import APIError
from trtllm_service.relay.client import EngineStream
from trtllm_service.relay.readers import TokenIdReader
from trtllm_service.relay.request import GenerationRequest


class Words:
    """Token i decodes to " w<i>"."""

    def push(self, ids: Any) -> str:
        return "".join(f" w{i}" for i in ids)


class Recorded:
    """What the response did: chunks written to the server, messages through the middleware chain,
    engine requests cancelled, and the status `done` recorded."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.chain_sent: list[dict[str, Any]] = []
        self.cancelled: list[int] = []
        self.status: int | None = None

    async def server_send(self, message: dict[str, Any]) -> None:
        self.written.append(message["body"])

    async def chain(self, message: dict[str, Any]) -> None:
        self.chain_sent.append(message)


class RecordingFraming(TextFraming):
    """/generate's framing; unless `waiting`, as if its first text ("") was read before the start."""

    def __init__(self, stream: EngineStream, recorded: Recorded, *, waiting: bool = False) -> None:
        super().__init__(stream, RequestMetrics("test", "/generate"), 1)
        self.waiting = waiting
        self.recorded = recorded

    def done(self, status: int) -> None:
        self.recorded.status = status
        super().done(status)


def _stream(recorded: Recorded, interval_s: float = 0.0, reading: Any = None) -> EngineStream:
    request = GenerationRequest(prompt_ids=array("i", [1]), max_tokens=100)
    reader = TokenIdReader(request, Words())  # type: ignore[arg-type]  # Words: a fake decoder
    stream = EngineStream(
        request, reader, "id", recorded.cancelled.append, reading=reading, interval_s=interval_s
    )
    stream.stream_id = 7
    return stream


def _serve(
    recorded: Recorded,
    stream: EngineStream,
    server_send: Any = None,
    *,
    receive: Any = None,
    waiting: bool = False,
) -> Any:
    """A PushBody of `stream` being served (a task), its writes to `server_send` (else recorded)."""
    body = PushBody(stream, RecordingFraming(stream, recorded, waiting=waiting), "text/plain")
    scope = {"type": "http", SERVER_SEND: server_send or recorded.server_send}
    return asyncio.ensure_future(body(scope, receive or _never, recorded.chain))


def test_each_response_is_written_before_the_event_loop_turns() -> None:
    """No task runs per token: a chunk is written inside the stream's on_message."""
    recorded = Recorded()

    async def scenario() -> None:
        stream = _stream(recorded)
        serving = _serve(recorded, stream)
        await asyncio.sleep(0.01)  # the response has started
        for token in range(3):
            stream.on_message(engine_response([token]))
            assert recorded.written[-1] == f" w{token}".encode(), "written without a turn of the loop"
        stream.on_message(engine_response([], final=True))
        await serving

    asyncio.run(scenario())
    assert recorded.written == [b" w0", b" w1", b" w2"]
    assert [m["type"] for m in recorded.chain_sent] == ["http.response.start", "http.response.body"]
    assert recorded.chain_sent[-1]["more_body"] is False
    assert recorded.status == 200
    assert recorded.cancelled == [], "a finished request is not cancelled"


def test_a_waiting_response_starts_with_its_first_text() -> None:
    """Returned as soon as the engine request is sent, the response reads the first text itself:
    nothing is sent before it, then the start and the first text at once."""
    recorded = Recorded()

    async def scenario() -> None:
        stream = _stream(recorded)
        serving = _serve(recorded, stream, waiting=True)
        await asyncio.sleep(0.01)
        assert recorded.chain_sent == [] and recorded.written == [], "nothing before the first text"
        stream.on_message(engine_response([0]))
        await asyncio.sleep(0.01)
        assert [m["type"] for m in recorded.chain_sent] == ["http.response.start"]
        assert recorded.written == [b" w0"]
        stream.on_message(engine_response([1]))
        assert recorded.written[-1] == b" w1", "after the first, written without a turn of the loop"
        stream.on_message(engine_response([], final=True))
        await serving

    asyncio.run(scenario())
    assert recorded.chain_sent[0]["status"] == 200
    assert recorded.written == [b" w0", b" w1"]
    assert recorded.status == 200


def test_an_error_before_the_first_text_is_a_json_answer_with_its_status() -> None:
    """The engine refuses the request before any text: no 200 stream, the error's JSON answer (as a
    handler that waited would have sent), counted with its status."""
    recorded = Recorded()

    async def scenario() -> None:
        stream = _stream(recorded)
        serving = _serve(recorded, stream, waiting=True)
        await asyncio.sleep(0.01)
        stream.end(APIError.bad_request("too long", param="prompt"))
        await serving

    asyncio.run(scenario())
    start, body = recorded.chain_sent
    assert start["type"] == "http.response.start" and start["status"] == 400
    assert b'"too long"' in body["body"] and b'"param":"prompt"' in body["body"].replace(b" ", b"")
    assert recorded.written == []
    assert recorded.status == 400


def test_a_client_that_leaves_before_the_first_text_cancels_the_engine_request() -> None:
    """A long prompt's prefill is not run to its end for nobody: the request is cancelled as soon as
    the client goes, and its end is a 499 with no body."""
    recorded = Recorded()
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def scenario() -> None:
        stream = _stream(recorded)
        serving = _serve(recorded, stream, receive=receive, waiting=True)
        await asyncio.sleep(0.01)
        gone.set()
        await asyncio.wait_for(serving, 1)

    asyncio.run(scenario())
    assert recorded.written == [] and recorded.cancelled == [7]
    # the request's end, for the middlewares (the server writes nothing to a client that left)
    assert [(m["type"], m.get("status")) for m in recorded.chain_sent] == [
        ("http.response.start", 499),
        ("http.response.body", None),
    ]
    assert recorded.status == 499


class Bracketed(RecordingFraming):
    """A body with an opening and a closing of its own (as SSE has: a role chunk; the finish
    chunk, usage and [DONE])."""

    def opening(self) -> bytes:
        return b"<open>"

    def closing(self) -> bytes:
        return b"<close>"


def test_the_opening_goes_with_the_first_text_and_the_closing_with_the_last() -> None:
    """Fewer writes per request: the opening and the text already there at the start are one write,
    the last text and the closing another; text is never held for the body's end."""
    recorded = Recorded()

    async def scenario() -> None:
        stream = _stream(recorded)
        stream.on_message(engine_response([0]))  # the first text came before the response started
        serving = _serve_bracketed(recorded, stream)
        await asyncio.sleep(0.01)
        assert recorded.written == [b"<open> w0"]
        stream.on_message(engine_response([1]))
        stream.on_message(engine_response([2], final=True))
        assert recorded.written[-1] == b" w2<close>", "written at once, not at the body's end"
        await serving

    asyncio.run(scenario())
    assert recorded.written == [b"<open> w0", b" w1", b" w2<close>"]
    assert recorded.chain_sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert recorded.status == 200


def test_a_closing_without_text_goes_with_the_body_end() -> None:
    recorded = Recorded()

    async def scenario() -> None:
        stream = _stream(recorded)
        stream.on_message(engine_response([0]))
        serving = _serve_bracketed(recorded, stream)
        await asyncio.sleep(0.01)
        stream.on_message(engine_response([], final=True))  # the last response carries no token
        await serving

    asyncio.run(scenario())
    assert recorded.written == [b"<open> w0"]
    assert recorded.chain_sent[-1] == {"type": "http.response.body", "body": b"<close>", "more_body": False}


def test_a_one_token_answer_is_one_write_before_the_end() -> None:
    recorded = Recorded()

    async def scenario() -> None:
        stream = _stream(recorded)
        stream.on_message(engine_response([0], final=True))
        await _serve_bracketed(recorded, stream)

    asyncio.run(scenario())
    assert recorded.written == [b"<open> w0<close>"]
    assert recorded.chain_sent[-1]["body"] == b""


def _serve_bracketed(recorded: Recorded, stream: EngineStream) -> Any:
    body = PushBody(stream, Bracketed(stream, recorded), "text/event-stream")
    return asyncio.ensure_future(
        body({"type": "http", SERVER_SEND: recorded.server_send}, _never, recorded.chain)
    )


def test_a_full_client_socket_holds_writes_and_what_came_meanwhile_goes_out_together() -> None:
    recorded = Recorded()
    drained: asyncio.Future[None] | None = None

    async def server_send(message: dict[str, Any]) -> None:
        nonlocal drained
        if message["body"] == b" w0":  # the socket is full after this one: the write waits
            drained = asyncio.get_running_loop().create_future()
            await drained
        recorded.written.append(message["body"])

    async def scenario() -> None:
        stream = _stream(recorded)
        serving = _serve(recorded, stream, server_send)
        await asyncio.sleep(0.01)
        stream.on_message(engine_response([0]))
        for token in (1, 2, 3):
            stream.on_message(engine_response([token]))
        assert recorded.written == [], "the first write waits for the client"
        assert drained is not None
        drained.set_result(None)
        await asyncio.sleep(0.01)
        stream.on_message(engine_response([4], final=True))
        await serving

    asyncio.run(scenario())
    assert recorded.written == [b" w0", b" w1 w2 w3", b" w4"]
    assert recorded.status == 200


def test_the_client_going_away_while_a_write_waits_cancels_the_engine_request() -> None:
    recorded = Recorded()

    async def server_send(message: dict[str, Any]) -> None:
        await asyncio.get_running_loop().create_future()  # never drains

    async def scenario() -> None:
        stream = _stream(recorded)
        gone = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await gone.wait()
            return {"type": "http.disconnect"}

        serving = _serve(recorded, stream, server_send, receive=receive)
        await asyncio.sleep(0.01)
        stream.on_message(engine_response([0]))
        stream.on_message(engine_response([1]))
        gone.set()
        await serving
        stream.on_message(engine_response([2]))  # late responses reach nobody

    asyncio.run(scenario())
    assert recorded.status == 499
    assert recorded.cancelled == [7]
    assert [m["type"] for m in recorded.chain_sent] == ["http.response.start"], "no end after the client left"


def test_a_failure_after_the_start_aborts_a_text_response() -> None:
    recorded = Recorded()

    async def scenario() -> None:
        stream = _stream(recorded)
        serving = _serve(recorded, stream)
        await asyncio.sleep(0.01)
        stream.on_message(engine_response([0]))
        stream.on_message(engine_response(error="engine exploded"))
        with pytest.raises(APIError, match="engine exploded"):
            await serving

    asyncio.run(scenario())
    assert recorded.written == [b" w0"]
    assert recorded.status == 500
    assert [m["type"] for m in recorded.chain_sent] == ["http.response.start"], "aborted: no clean end"


def test_held_text_goes_out_when_its_interval_has_passed() -> None:
    """TRTLLM_STREAM_INTERVAL_MS: text held by the interval is written by a timer, not a response."""
    recorded = Recorded()
    times: list[float] = []

    async def server_send(message: dict[str, Any]) -> None:
        times.append(asyncio.get_running_loop().time())
        recorded.written.append(message["body"])

    async def scenario() -> float:
        stream = _stream(recorded, interval_s=0.2)
        serving = _serve(recorded, stream, server_send)
        await asyncio.sleep(0.01)
        started = asyncio.get_running_loop().time()
        stream.on_message(engine_response([0]))  # the first text: at once
        stream.on_message(engine_response([1]))  # held
        stream.on_message(engine_response([2]))
        assert recorded.written == [b" w0"]
        await asyncio.sleep(0.3)  # no response arrives meanwhile
        stream.on_message(engine_response([], final=True))
        await serving
        return started

    started = asyncio.run(scenario())
    assert recorded.written == [b" w0", b" w1 w2"]
    assert 0.15 <= times[1] - started <= 0.29
    assert recorded.status == 200


def test_the_last_response_releases_held_text_at_once() -> None:
    recorded = Recorded()

    async def scenario() -> None:
        stream = _stream(recorded, interval_s=30.0)
        serving = _serve(recorded, stream)
        await asyncio.sleep(0.01)
        stream.on_message(engine_response([0]))
        stream.on_message(engine_response([1]))  # held for 30 s
        stream.on_message(engine_response([2], final=True))
        await asyncio.wait_for(serving, 2)

    asyncio.run(scenario())
    assert recorded.written == [b" w0", b" w1 w2"]
    assert recorded.status == 200


def test_responses_that_arrive_in_one_socket_read_go_out_as_one_chunk() -> None:
    """Behind a real connection: the stream is read once the whole socket read is handled."""
    from trtllm_service.relay.grpc_http2 import DATA, GrpcConnection, _frame

    recorded = Recorded()

    class Socket:
        def write(self, data: bytes) -> None:
            pass

        def get_extra_info(self, name: str) -> Any:
            return None

    def read_of(*responses: bytes) -> bytes:
        return b"".join(_frame(DATA, 0, 1, b"\x00" + len(r).to_bytes(4, "big") + r) for r in responses)

    async def scenario() -> None:
        connection = GrpcConnection("triton:8001")
        connection.connection_made(Socket())  # type: ignore[arg-type]  # a fake socket
        stream = _stream(recorded, reading=connection)
        stream.stream_id = connection.start_call(
            "/inference.GRPCInferenceService/ModelStreamInfer", b"", stream
        )
        serving = _serve(recorded, stream)
        await asyncio.sleep(0.01)
        connection.data_received(read_of(engine_response([0])))
        connection.data_received(read_of(engine_response([1]), engine_response([2]), engine_response([3])))
        assert recorded.written == [b" w0", b" w1 w2 w3"]
        connection.data_received(read_of(engine_response([4]), engine_response([], final=True)))
        await serving

    asyncio.run(scenario())
    assert recorded.written == [b" w0", b" w1 w2 w3", b" w4"]
    assert recorded.status == 200


async def _never() -> dict[str, Any]:
    await asyncio.sleep(3600)
    return {"type": "http.disconnect"}
