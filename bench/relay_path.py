"""The per-token Python cost of the relay path, in one process, without sockets or Triton.

What one streamed token costs our code between the bytes Triton sends and the bytes handed to the
HTTP server: the HTTP/2 frame parsing (`grpc_http2`), the protobuf response, the engine stream
(wake-up, read, detokenizer), the SSE or text framing and `StreamBody`'s write. `streams` requests
run side by side, each in its own `StreamBody` task as under uvicorn; each round, one socket read
carries one token of every stream (as an in-flight-batching engine's step delivers them). The HTTP
server's `send` is a stand-in that keeps the bytes (uvicorn's own send and the socket writes are
measured by `bench/relay.py`, end to end).

Deterministic enough to compare two versions of the code on this machine (CPU time by
`time.process_time`, best of `--repeat`):

    python bench/relay_path.py [--streams 32] [--tokens 256] [--route chat|generate]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import statistics
import sys
import time
from array import array
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tritonclient.grpc import service_pb2

from tensorrtllm_backend.detokenizer import IncrementalDetokenizer
from trtllm_service.relay.client import STREAM_INFER, EngineStream
from trtllm_service.relay.grpc_http2 import DATA, END_HEADERS, HEADERS, GrpcConnection, _frame
from trtllm_service.relay.request import GenerationRequest, engine_message


def response(ids: list[int], request_id: str, final: bool) -> bytes:
    """A ModelStreamInferResponse as Triton streams it from the `tensorrt_llm` model."""
    message = service_pb2.ModelStreamInferResponse()
    result = message.infer_response
    result.model_name, result.model_version, result.id = "tensorrt_llm", "1", request_id
    for name, shape in (("output_ids", [1, 1, len(ids)]), ("sequence_length", [1, 1])):
        output = result.outputs.add()
        output.name, output.datatype = name, "INT32"
        output.shape.extend(shape)
    result.raw_output_contents.append(array("i", ids).tobytes())
    result.raw_output_contents.append(array("i", [len(ids)]).tobytes())
    result.parameters["triton_final_response"].bool_param = final
    return message.SerializeToString()


class Transport:
    """The connection's socket: what the relay writes to Triton is dropped."""

    def write(self, data: bytes) -> None:
        pass

    def get_extra_info(self, name: str) -> Any:
        return None

    def is_closing(self) -> bool:
        return False


async def run(tokenizer: Any, streams: int, tokens: int, route: str) -> tuple[float, int]:
    """CPU seconds of one run and the bytes the streams wrote."""
    from trtllm_service.api.openai import serving

    try:  # since issue 45: api/ by role
        from trtllm_service.api.server import streaming
        from trtllm_service.api.server.metrics import RequestMetrics
    except ImportError:
        from trtllm_service.api import streaming  # type: ignore[no-redef]  # the older layout
        from trtllm_service.api.metrics import RequestMetrics  # type: ignore[no-redef]  # the older layout

    connection = GrpcConnection("triton:8001")
    connection.connection_made(Transport())  # type: ignore[arg-type]  # a fake transport
    request = GenerationRequest(prompt_ids=array("i", range(100, 132)), max_tokens=tokens + 1)
    vocabulary = [i for i in range(1000, 3000) if tokenizer.decode([i]).isalpha()][:97]
    written = [0]

    async def send(message: dict[str, Any]) -> None:
        written[0] += len(message.get("body", b""))

    never: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def receive() -> dict[str, Any]:
        return await never

    bodies, ids = [], []
    for i in range(streams):
        stream = _stream(request, IncrementalDetokenizer(tokenizer), f"r{i}", connection)
        stream.stream_id = connection.start_call(STREAM_INFER, engine_message(request, f"r{i}"), stream)
        ids.append(stream.stream_id)
        metrics = RequestMetrics("bench", "/v1/chat/completions")
        body = _body(serving, streaming, route, stream, metrics, i)
        bodies.append(asyncio.ensure_future(body({"type": "http"}, receive, send)))
    status = _frame(HEADERS, END_HEADERS, 0, b"\x88")  # :status 200 (static table entry 8)
    connection.data_received(b"".join(status[:5] + s.to_bytes(4, "big") + status[9:] for s in ids))

    def read_of(step: int, final: bool = False) -> bytes:
        frames = []
        for stream_id in ids:
            token = [] if final else [vocabulary[(step * 7 + stream_id) % len(vocabulary)]]
            message = response(token, f"r{stream_id}", final)
            frames.append(_frame(DATA, 0, stream_id, b"\x00" + len(message).to_bytes(4, "big") + message))
        return b"".join(frames)

    reads = [read_of(step) for step in range(tokens)] + [read_of(tokens, final=True)]
    await asyncio.sleep(0)
    gc.collect()
    started = time.process_time()
    for data in reads:
        connection.data_received(data)
        await asyncio.sleep(0)  # the woken readers run
        await asyncio.sleep(0)
    trailers = _frame(HEADERS, END_HEADERS | 0x1, 0, b"\x40\x0bgrpc-status\x010")
    connection.data_received(b"".join(trailers[:5] + s.to_bytes(4, "big") + trailers[9:] for s in ids))
    await asyncio.gather(*bodies)
    return time.process_time() - started, written[0]


def _stream(
    request: GenerationRequest, decoder: Any, request_id: str, connection: GrpcConnection
) -> EngineStream:
    """An engine stream as `TritonRelay.start` builds it for the C++ contract (an older checkout's
    too: one whose stream took the detokenizer itself, before readers)."""
    try:  # since issue 37: one stream class over the flavour's reader
        from trtllm_service.relay.readers import TokenIdReader
    except ImportError:
        stream = EngineStream(request, decoder, request_id, connection.cancel)
        with contextlib.suppress(AttributeError):  # as TritonRelay.start set it (older still: none)
            stream._reading = connection
        return stream
    try:  # since issue 46: the worker's pace (no request starting here: nothing is held)
        from trtllm_service.relay.pace import PACE

        paced: dict[str, Any] = {"pace": PACE}
    except ImportError:
        paced = {}
    return EngineStream(
        request, TokenIdReader(request, decoder), request_id, connection.cancel, reading=connection, **paced
    )


def _body(serving: Any, streaming: Any, route: str, stream: EngineStream, metrics: Any, i: int) -> Any:
    """The response the service makes for one stream (an older checkout's too, for a before/after:
    one with the generators and StreamBody, before responses were pushed)."""
    from trtllm_service.api.openai.sse import ChatChunkEncoder

    if route == "chat":
        encoder = ChatChunkEncoder(f"chatcmpl-{i}", "bench")
        try:  # since issue 36: the SSE plumbing shared by every endpoint (in generation/ since issue 45)
            try:
                from trtllm_service.api.generation import choices, sse_frames
            except ImportError:
                from trtllm_service.api import choices, sse_frames  # type: ignore[no-redef]  # the older layout
            from trtllm_service.api.openai.sse import SSE_DONE, error_frame

            return sse_frames.sse_body(
                [choices.Choice(0, stream, "")],
                [encoder.role(0)],
                lambda t, n, _e: encoder.content(t, n),
                encoder.finish,
                None,
                metrics,
                32,
                failure_frame=error_frame,
                done=SSE_DONE,
            )
        except ImportError:
            pass
        args = ([serving._Choice(0, stream, "")], [encoder.role(0)], lambda t, n, _e: encoder.content(t, n))
        if hasattr(serving, "_sse_body"):
            return serving._sse_body(*args, encoder.finish, None, metrics, 32)
        chunks = serving._sse_frames(*args, encoder.finish, None, metrics, 32)
        return streaming.StreamBody(chunks, "text/event-stream")
    if hasattr(streaming, "PushBody"):
        try:  # since issue 45: /generate's framing in api/generate/
            from trtllm_service.api.generate.serving import TextFraming
        except ImportError:
            TextFraming = streaming.TextFraming
        return streaming.PushBody(stream, TextFraming(stream, "", metrics, 32), "text/plain")
    return streaming.StreamBody(streaming.text_chunks(stream, "", metrics, 32), "text/plain")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--route", choices=("chat", "generate"), default="chat")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--tokenizer", default=None, help="a tokenizer directory (default: the demo model's)")
    args = parser.parse_args()
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if args.tokenizer is None:  # the demo model's (a byte-level BPE, as Llama-3's)
        from trtllm_service.packing.demo_model import _build_tokenizer

        tokenizer = PreTrainedTokenizerFast(tokenizer_object=_build_tokenizer())
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    import uvloop

    times = []
    for _ in range(args.repeat):
        seconds, written = uvloop.run(run(tokenizer, args.streams, args.tokens, args.route))
        times.append(seconds / (args.streams * args.tokens) * 1e6)
    print(
        f"{args.route}: {args.streams} streams x {args.tokens} tokens: best {min(times):.2f} us/token,"
        f" median {statistics.median(times):.2f} ({written} bytes per run)"
    )


if __name__ == "__main__":
    main()
