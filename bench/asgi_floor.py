"""The floor under any ASGI relay: what one streamed chunk costs uvicorn with the least code around it.

A bare ASGI app under uvicorn with httptools and uvloop (what BentoML's workers run) answers POST
/generate like the service's /generate (plain text, one chunked-encoding chunk per token): no
tokenizer, no middleware, no validation. Two sources:

- alone (`floor`): each request writes `max_tokens` chunks of one short word and yields to the event
  loop after each (chunks as fast as the loop turns: the client is never waited for);
- `--triton HOST:PORT` (`floor-relay`): each request streams token ids from Triton's `tensorrt_llm`
  model over our HTTP/2 gRPC client, parses each response, and writes a chunk per wake-up, paced by
  the engine exactly as the service is;
- with `--push` too (`floor-push`): the chunk is written from the gRPC callback itself, no wake-up of
  the request's task per token (what an event-loop hop per token costs).

`bench/relay.py --targets ...,floor,floor-relay` drives both with the same load generator and reads
their CPU time from /proc: the service's CPU per token minus floor-relay's is what BentoML, the
middlewares and our handlers add.

    python bench/asgi_floor.py --port 8000 [--triton 127.0.0.1:8001]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORD = b" token"
TRITON: tuple[str, int] | None = None
PUSH = False
_connection: Any = None


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] == "/readyz":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    tokens = int(json.loads(body)["max_tokens"])
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain; charset=utf-8")],
        }
    )
    if TRITON is not None:
        await relay(tokens, send)
        return
    for _ in range(tokens):
        await send({"type": "http.response.body", "body": WORD, "more_body": True})
        await asyncio.sleep(0)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


class _Sink:
    """Token ids from one engine stream, handed to the request's task (one wake-up per batch)."""

    def __init__(self) -> None:
        from tritonclient.grpc import service_pb2

        self.parse = service_pb2.ModelStreamInferResponse.FromString
        self.tokens = 0
        self.ended = False
        self.waiter: asyncio.Future[None] | None = None

    def on_message(self, data: bytes) -> None:
        response = self.parse(data)
        contents = response.infer_response.raw_output_contents
        if contents and contents[0]:
            self.tokens += len(contents[0]) // 4
            self._wake()

    def on_end(self, status: int, message: str) -> None:
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class _PushSink(_Sink):
    """Writes each token's chunk from inside the connection's data_received: uvicorn's `send` of a
    body chunk completes without suspending unless the client's socket is full (then it finishes
    when the socket drains)."""

    def __init__(self, send: Any) -> None:
        super().__init__()
        self.send = send
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_message(self, data: bytes) -> None:
        contents = self.parse(data).infer_response.raw_output_contents
        if contents and contents[0]:
            self._step(
                self.send(
                    {"type": "http.response.body", "body": WORD * (len(contents[0]) // 4), "more_body": True}
                )
            )

    def _step(self, coroutine: Any) -> None:
        try:
            waiting = coroutine.send(None)
        except StopIteration:
            return
        waiting.add_done_callback(lambda _: self._step(coroutine))

    def on_end(self, status: int, message: str) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def relay(tokens: int, send: Any) -> None:
    from trtllm_service.relay.grpc_http2 import GrpcConnection
    from trtllm_service.relay.request import GenerationRequest, engine_message

    global _connection
    if _connection is None or _connection.closed:
        assert TRITON is not None
        _connection = await GrpcConnection.open(*TRITON)
    request = GenerationRequest(prompt_ids=tuple(range(100, 132)), max_tokens=tokens, top_k=1, end_id=-1)
    sink = _PushSink(send) if PUSH else _Sink()
    _connection.start_call(
        "/inference.GRPCInferenceService/ModelStreamInfer", engine_message(request, uuid.uuid4().hex), sink
    )
    if isinstance(sink, _PushSink):
        await sink.done
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    loop = asyncio.get_running_loop()
    sent = 0
    while True:
        if sink.tokens > sent:
            await send({"type": "http.response.body", "body": WORD * (sink.tokens - sent), "more_body": True})
            sent = sink.tokens
        elif sink.ended:
            break
        else:
            sink.waiter = loop.create_future()
            await sink.waiter
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--triton", metavar="HOST:PORT", help="stream tokens from this Triton's tensorrt_llm")
    parser.add_argument("--push", action="store_true", help="with --triton: write from the gRPC callback")
    args = parser.parse_args()
    if args.triton:
        global TRITON, PUSH
        PUSH = args.push
        host, port = args.triton.rsplit(":", 1)
        TRITON = (host, int(port))
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
