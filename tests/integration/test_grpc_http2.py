"""Our HTTP/2 gRPC client against grpcio's server (gRPC's C core: a real, independent HTTP/2 peer).

The server implements ModelStreamInfer with scripted behaviour, so that what Triton rarely does can be
provoked: messages larger than a frame and than the flow-control windows (both ways), error statuses
with messages, a client that cancels, a server that shuts down under load.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent import futures
from typing import Any

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from trtllm_service.relay.grpc_http2 import CANCELLED, OK, UNAVAILABLE, GrpcConnection

PATH = "/inference.GRPCInferenceService/ModelStreamInfer"


class ScriptedTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The request's model_name says what to do; parameters carry the numbers."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()
        self.received: list[int] = []

    def ModelStreamInfer(self, request_iterator: Any, context: grpc.ServicerContext) -> Any:
        request = next(iter(request_iterator))
        self.received.append(len(request.raw_input_contents[0]) if request.raw_input_contents else 0)
        count = request.parameters["count"].int64_param
        size = request.parameters["size"].int64_param
        if request.model_name == "slow":  # ends (here: is cancelled) long before its 1000 messages
            context.add_callback(self.cancelled.set)
        if request.model_name == "fail":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad request: ünïcode, spaces & 100%")
        for i in range(count):
            if request.model_name == "slow":
                time.sleep(0.01)
            response = service_pb2.ModelStreamInferResponse()
            response.infer_response.id = request.id
            response.infer_response.raw_output_contents.append(i.to_bytes(4, "little") * (size // 4 or 1))
            yield response


@pytest.fixture
def scripted_triton() -> Any:
    """grpcio's server with `ScriptedTriton` on a free port: (the server, the servicer, the port)."""
    servicer = ScriptedTriton()
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    yield grpc_server, servicer, port
    grpc_server.stop(0)


class Collect:
    def __init__(self) -> None:
        self.messages: list[service_pb2.ModelStreamInferResponse] = []
        self.done: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()

    def on_message(self, data: bytes) -> None:
        self.messages.append(service_pb2.ModelStreamInferResponse.FromString(data))

    def on_end(self, status: int, message: str) -> None:
        assert not self.done.done(), "on_end called twice"
        self.done.set_result((status, message))


def request(model: str, request_id: str, count: int, size: int = 4, payload: bytes = b"") -> bytes:
    message = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    message.parameters["count"].int64_param = count
    message.parameters["size"].int64_param = size
    if payload:
        message.raw_input_contents.append(payload)
    return message.SerializeToString()


def test_many_concurrent_calls_each_get_their_own_messages_in_order(scripted_triton: Any) -> None:
    _, _, port = scripted_triton

    async def scenario() -> None:
        connection = await GrpcConnection.open("127.0.0.1", port)
        calls = []
        for n in range(100):
            sink = Collect()
            connection.start_call(PATH, request("echo", f"r{n}", count=50 + n), sink)
            calls.append((n, sink))
        for n, sink in calls:
            assert await asyncio.wait_for(sink.done, 30) == (OK, "")
            assert [m.infer_response.id for m in sink.messages] == [f"r{n}"] * (50 + n)
            assert [
                int.from_bytes(m.infer_response.raw_output_contents[0][:4], "little") for m in sink.messages
            ] == list(range(50 + n))
        assert connection.active_calls == 0
        await connection.close()

    asyncio.run(scenario())


def test_messages_larger_than_frames_and_windows_both_ways(scripted_triton: Any) -> None:
    _, servicer, port = scripted_triton

    async def scenario() -> None:
        connection = await GrpcConnection.open("127.0.0.1", port)
        sink = Collect()
        payload = bytes(range(256)) * 4000  # 1 MB request: many frames, beyond the 64 KiB initial windows
        connection.start_call(PATH, request("echo", "big", count=3, size=3_000_000, payload=payload), sink)
        assert await asyncio.wait_for(sink.done, 30) == (OK, "")
        assert servicer.received == [len(payload)]
        assert [len(m.infer_response.raw_output_contents[0]) for m in sink.messages] == [3_000_000] * 3
        await connection.close()

    asyncio.run(scenario())


def test_an_error_status_and_its_message_arrive(scripted_triton: Any) -> None:
    _, _, port = scripted_triton

    async def scenario() -> None:
        connection = await GrpcConnection.open("127.0.0.1", port)
        sink = Collect()
        connection.start_call(PATH, request("fail", "f", count=1), sink)
        status, message = await asyncio.wait_for(sink.done, 30)
        assert status == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert message == "bad request: ünïcode, spaces & 100%"
        ok = Collect()  # the connection serves on
        connection.start_call(PATH, request("echo", "after", count=2), ok)
        assert await asyncio.wait_for(ok.done, 30) == (OK, "") and len(ok.messages) == 2
        await connection.close()

    asyncio.run(scenario())


def test_cancel_ends_the_call_on_the_server_and_nothing_more_arrives(scripted_triton: Any) -> None:
    _, servicer, port = scripted_triton

    async def scenario() -> None:
        connection = await GrpcConnection.open("127.0.0.1", port)
        sink = Collect()
        stream_id = connection.start_call(PATH, request("slow", "s", count=1000), sink)
        while len(sink.messages) < 3:
            await asyncio.sleep(0.01)
        connection.cancel(stream_id)
        received = len(sink.messages)
        await asyncio.sleep(0.5)
        assert len(sink.messages) == received and not sink.done.done()
        assert servicer.cancelled.wait(5), "the server did not see the cancellation"
        assert connection.active_calls == 0
        await connection.close()

    asyncio.run(scenario())


def test_a_server_that_goes_away_ends_every_call_with_unavailable(scripted_triton: Any) -> None:
    grpc_server, _, port = scripted_triton

    async def scenario() -> None:
        connection = await GrpcConnection.open("127.0.0.1", port)
        sinks = [Collect() for _ in range(5)]
        for n, sink in enumerate(sinks):
            connection.start_call(PATH, request("slow", f"g{n}", count=10_000), sink)
        while any(not sink.messages for sink in sinks):
            await asyncio.sleep(0.01)
        await asyncio.get_running_loop().run_in_executor(None, lambda: grpc_server.stop(0).wait())
        for sink in sinks:
            status, _ = await asyncio.wait_for(sink.done, 10)
            assert status in (UNAVAILABLE, CANCELLED)
        late = Collect()
        connection.start_call(PATH, request("echo", "late", count=1), late)
        assert (await asyncio.wait_for(late.done, 5))[0] == UNAVAILABLE
        assert connection.closed
        with pytest.raises(OSError):
            await GrpcConnection.open("127.0.0.1", port)

    asyncio.run(scenario())


def test_a_message_its_reader_cannot_take_ends_that_call_only(scripted_triton: Any) -> None:
    _, _, port = scripted_triton

    class Choking(Collect):
        def on_message(self, data: bytes) -> None:
            if len(self.messages) == 2:
                raise ValueError("not what I expected")
            super().on_message(data)

    async def scenario() -> None:
        connection = await GrpcConnection.open("127.0.0.1", port)
        choking, fine = Choking(), Collect()
        connection.start_call(PATH, request("echo", "c", count=100), choking)
        connection.start_call(PATH, request("echo", "f", count=100), fine)
        status, message = await asyncio.wait_for(choking.done, 30)
        assert status == 13 and "not what I expected" in message and len(choking.messages) == 2
        assert await asyncio.wait_for(fine.done, 30) == (OK, "") and len(fine.messages) == 100
        assert not connection.closed
        await connection.close()

    asyncio.run(scenario())
