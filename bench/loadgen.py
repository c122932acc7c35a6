"""Load generator for bench/relay.py: streamed requests to one target, timings as JSON on stdout.

Targets: `engine` (gRPC ModelStreamInfer to the `tensorrt_llm` model, token ids in and out, the very
request the service sends: the baseline), `direct` (to Triton's `ensemble`, text in, streamed text
out, as upstream's clients call it), `generate` (the service's /generate), `chat` (/v1/chat/completions), `completions` (/v1/completions).
The clients are lean asyncio protocols (HTTP/1.1 keep-alive, or our HTTP/2 gRPC client), so that the
load generator is never what limits a run. Per request it records the time to the first text, the
gaps between text-bearing chunks (inter-token latency as the client sees it), and the tokens; per
run, its own CPU time (so a report can show that the generator was not the limit).

    python bench/loadgen.py --target chat --address 127.0.0.1:3000 --concurrency 32 --requests 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ensemble_request import ensemble_message
from trtllm_service.relay.grpc_http2 import GrpcConnection
from trtllm_service.relay.request import GenerationRequest, engine_message, llmapi_message

PROMPT_WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
    "while",
    "a",
    "server",
    "streams",
    "every",
    "token",
    "back",
]


def prompt_text(words: int, seed: int) -> str:
    return " ".join(PROMPT_WORDS[(seed + i) % len(PROMPT_WORDS)] for i in range(words))


class Record:
    """Timings of one request."""

    __slots__ = ("chunks", "first", "gaps", "last", "start", "tokens")

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first: float | None = None
        self.last = 0.0
        self.gaps: list[float] = []
        self.chunks = 0
        self.tokens = 0

    def text(self) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        else:
            self.gaps.append(now - self.last)
        self.last = now
        self.chunks += 1

    def result(self) -> dict[str, Any]:
        return {
            "ttft": (self.first or self.last) - self.start,
            "duration": self.last - self.start,
            "gaps": self.gaps,
            "chunks": self.chunks,
            "tokens": self.tokens,
        }


# ---- HTTP/1.1 (the service) ------------------------------------------------------------------------------


class HTTPStream(asyncio.Protocol):
    """One keep-alive connection; parses chunked responses and hands each body chunk to `on_body`."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.in_body = False
        self.status = 0
        self.done: asyncio.Future[int] | None = None
        self.on_body: Any = None
        self.content_length: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP connection: a Transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError(f"connection lost: {exc}"))

    def request(self, path: str, body: bytes, on_body: Any) -> asyncio.Future[int]:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.on_body = on_body
        self.in_body = False
        self.transport.write(
            b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (path.encode(), len(body))
            + body
        )
        return self.done

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        if not self.in_body:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buffer[:end]).decode("latin-1").split("\r\n")
            del buffer[: end + 4]
            self.status = int(head[0].split()[1])
            self.content_length = None
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.lower() == "content-length":
                    self.content_length = int(value)
            self.in_body = True
        if self.content_length is not None:  # an error body
            if len(buffer) >= self.content_length:
                self.on_body(bytes(buffer[: self.content_length]))
                del buffer[: self.content_length]
                self._finish()
            return
        pos = 0
        while True:
            line_end = buffer.find(b"\r\n", pos)
            if line_end < 0:
                break
            size = int(buffer[pos:line_end], 16)
            if line_end + 4 + size > len(buffer):
                break
            if size == 0:
                pos = line_end + 4
                del buffer[:pos]
                self._finish()
                return
            self.on_body(bytes(buffer[line_end + 2 : line_end + 2 + size]))
            pos = line_end + 4 + size
        del buffer[:pos]

    def _finish(self) -> None:
        self.in_body = False
        if self.done is not None and not self.done.done():
            self.done.set_result(self.status)


class ServiceClient:
    """Streams requests to one service route over a pool of keep-alive connections."""

    def __init__(self, host: str, port: int, target: str) -> None:
        self.host, self.port, self.target = host, port, target
        self.pool: list[HTTPStream] = []

    async def run(self, prompt: str, max_tokens: int) -> Record:
        loop = asyncio.get_running_loop()
        connection = (
            self.pool.pop()
            if self.pool
            else (await loop.create_connection(HTTPStream, self.host, self.port))[1]
        )
        record = Record()
        body, path, parse = self._request(prompt, max_tokens, record)
        status = await connection.request(path, json.dumps(body).encode(), parse)
        if status != 200:
            raise RuntimeError(f"{self.target}: HTTP {status}")
        self.pool.append(connection)
        if self.target == "generate":
            record.tokens = max_tokens  # ignore_eos: exactly max_tokens
        return record

    def _request(self, prompt: str, max_tokens: int, record: Record) -> tuple[dict[str, Any], str, Any]:
        common = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        if self.target == "generate":

            def on_text(chunk: bytes) -> None:
                record.text()

            return {"prompt": prompt, **common}, "/generate", on_text
        pending = bytearray()
        key = b'"content":' if self.target == "chat" else b'"text":'

        def on_sse(chunk: bytes) -> None:
            pending.extend(chunk)
            *events, rest = bytes(pending).split(b"\n\n")
            pending[:] = rest
            for event in events:
                if event.startswith(b"data: [DONE]"):
                    continue
                position = event.find(key)
                if position >= 0 and event[position + len(key) : position + len(key) + 2] not in (
                    b'""',
                    b"nu",
                ):
                    record.text()
                if b'"usage":{' in event:
                    record.tokens = json.loads(event[6:])["usage"]["completion_tokens"]

        streamed = {"stream": True, "stream_options": {"include_usage": True}, **common}
        if self.target == "chat":
            return (
                {"messages": [{"role": "user", "content": prompt}], **streamed},
                "/v1/chat/completions",
                on_sse,
            )
        return {"prompt": prompt, **streamed}, "/v1/completions", on_sse


# ---- gRPC to the ensemble (direct) ---------------------------------------------------------------------

STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


class _DirectCall:
    def __init__(self, record: Record, done: asyncio.Future[None]) -> None:
        from tritonclient.grpc import service_pb2

        self.parse = service_pb2.ModelStreamInferResponse.FromString
        self.record, self.done = record, done

    def on_message(self, data: bytes) -> None:
        response = self.parse(data)
        if response.error_message:
            if not self.done.done():
                self.done.set_exception(RuntimeError(response.error_message))
            return
        if self.has_text(response.infer_response.raw_output_contents):
            self.record.text()

    @staticmethod
    def has_text(contents: Any) -> bool:
        """text_output (BYTES: a 4-byte length, then the text) carries text."""
        return bool(contents) and len(contents[0]) > 4 and struct.unpack_from("<I", contents[0])[0] > 0

    def on_end(self, status: int, message: str) -> None:
        if not self.done.done():
            if status:
                self.done.set_exception(RuntimeError(f"gRPC status {status}: {message}"))
            else:
                self.done.set_result(None)


class _EngineCall(_DirectCall):
    """Counts the responses of the `tensorrt_llm` model that carry tokens (output_ids comes first)."""

    @staticmethod
    def has_text(contents: Any) -> bool:
        return bool(contents) and len(contents[0]) > 0


class DirectClient:
    """Streams requests straight to Triton over one HTTP/2 connection: text to the `ensemble` (or the
    llmapi model), or with `engine`, token ids to the `tensorrt_llm` model exactly as the service
    sends them (no tokenizer, no detokenizer: the engine's own rate, the service's baseline)."""

    def __init__(self, host: str, port: int, flavor: str = "ensemble", engine: bool = False) -> None:
        self.host, self.port = host, port
        self.flavor = flavor
        self.engine = engine
        self.connection: GrpcConnection | None = None

    async def run(self, prompt: str, max_tokens: int) -> Record:
        if self.connection is None or self.connection.closed:
            self.connection = await GrpcConnection.open(self.host, self.port)
        record = Record()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        request_id = uuid.uuid4().hex
        if self.engine:
            # Token ids of the prompt's words (any ids in the vocabulary do for a token source).
            ids = tuple(100 + PROMPT_WORDS.index(word) for word in prompt.split())
            request = GenerationRequest(prompt_ids=ids, max_tokens=max_tokens, top_k=1, end_id=-1)
            call: _DirectCall = _EngineCall(record, done)
            if self.flavor == "llmapi":
                message = llmapi_message(request, request_id)
            else:
                message = engine_message(request, request_id)
        else:
            request = GenerationRequest(prompt_ids=(), max_tokens=max_tokens, top_k=1, end_id=-1)
            call = _DirectCall(record, done)
            message = (
                llmapi_message(request, request_id, prompt)
                if self.flavor == "llmapi"
                else ensemble_message(prompt, request, request_id)
            )
        self.connection.start_call(STREAM_INFER, message, call)
        await done
        record.tokens = max_tokens
        return record


async def drive(args: argparse.Namespace) -> dict[str, Any]:
    host, port = args.address.rsplit(":", 1)
    client: Any = (
        DirectClient(host, int(port), args.flavor, engine=args.target == "engine")
        if args.target in ("direct", "engine")
        else ServiceClient(host, int(port), args.target)
    )
    semaphore = asyncio.Semaphore(args.concurrency)
    records: list[Record] = []
    errors: list[str] = []

    async def one(i: int, stagger_s: float = 0.0) -> None:
        async with semaphore:
            if stagger_s and i < args.concurrency:  # holds its place while it waits: no burst behind it
                await asyncio.sleep(i * stagger_s / args.concurrency)
            try:
                records.append(
                    await client.run(prompt_text(args.prompt_words, args.seed + i), args.max_tokens)
                )
            except Exception as exc:
                errors.append(str(exc))

    await asyncio.gather(*(one(i) for i in range(min(args.concurrency, args.requests, 4))))  # warm-up
    records.clear()
    cpu = time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(one(i, args.stagger_s) for i in range(args.requests)))
    return {
        "wall": time.perf_counter() - started,
        "cpu": time.process_time() - cpu,
        "requests": [r.result() for r in records],
        "errors": errors[:5],
        "error_count": len(errors),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--target", choices=("engine", "direct", "generate", "chat", "completions"), required=True
    )
    parser.add_argument("--address", required=True, help="host:port of the service, or of Triton's gRPC")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--prompt-words", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--stagger-s",
        type=float,
        default=0.0,
        help="start the streams evenly over this many seconds instead of all at once (streams of one "
        "length that start together finish together, and the next requests arrive as one burst)",
    )
    parser.add_argument("--flavor", choices=("ensemble", "llmapi"), default="ensemble")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(drive(args))))


if __name__ == "__main__":
    main()
