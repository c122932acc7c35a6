"""The relay: generation requests to Triton's `tensorrt_llm` model, token ids back, text out.

The service talks to the engine directly (NVIDIA's C++ backend contract, or our stand-in behind it):
it tokenized the prompt already, and detokenizing here (tensorrtllm_backend.detokenizer, the same
code as postprocessing's) costs a few microseconds per chunk, while the ensemble's postprocessing
step would cost a Python-backend round trip per token inside Triton. Every call of a worker shares one HTTP/2 connection (`grpc_http2`), read on the
event loop.

Per request, an `EngineStream` collects token ids as they arrive (from inside the connection's
data_received, no task per token) and calls back its reader once the socket read is handled
(`on_wake`: a pushed response, which reads and writes there and then) or wakes it (`read()`). The
reader takes everything that arrived since it last asked (`poll()`), so a client that is behind gets
the tokens already received in one chunk; the first token, or any token when the reader is waiting,
goes out at once. Stop strings are matched on the decoded text; a match ends the stream and cancels
the engine request (RST_STREAM: Triton then cancels the request in the engine). Errors become
`APIError`s: a request the engine refused 400, Triton unreachable or restarting 503, a stream longer
than the timeout 504, anything else 500.

A Triton that hangs (alive, answering nothing) is noticed by a watchdog, one per worker, that looks
once a second: when requests are open and nothing at all arrived on the connection for the idle
timeout, the connection is dropped and each open request ends with a 503. New requests get the 503
as soon as the supervisor's probes find Triton unready.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2

from tensorrtllm_backend import nvidia_llmapi as nvllm
from tensorrtllm_backend.detokenizer import IncrementalDetokenizer
from tensorrtllm_backend.lora import CACHE_MISS
from tensorrtllm_backend.stop_strings import StopStringMatcher
from trtllm_service.errors import APIError
from trtllm_service.relay.grpc_http2 import CANCELLED, OK, UNAVAILABLE, GrpcConnection
from trtllm_service.relay.logprobs import TokenLogprob, prompt_from_logits, top_from_logits
from trtllm_service.relay.request import (
    ENGINE_CACHE_OUTPUT,
    ENGINE_OUTPUT,
    LLMAPI_COUNT_OUTPUT,
    LLMAPI_TEXT_OUTPUT,
    GenerationRequest,
    engine_message,
    llmapi_message,
)
from trtllm_service.relay.response_shape import SHAPES_PER_STREAM, ResponseShape
from trtllm_service.request_ids import engine_request_id

logger = logging.getLogger("trtllm_service.relay")

STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
INVALID_REQUEST_MARKER = "invalid request: "
"""Our Triton models start the message of a refused request with this (in-stream errors carry no
gRPC status code)."""
DEAD_STUB_MARKER = "is not healthy"
"""Triton's Python backend answers every request of a model whose stub process died with "Stub
process '<instance>' is not healthy."; the owner restarts Triton within a probe interval."""
DEAD_STUB_RETRY_S = 10
"""About how long a restarted Triton takes to be ready again (the demo on 2 cores: 11-12 s)."""

_parse_response = service_pb2.ModelStreamInferResponse.FromString
LLMAPI_CACHE_OUTPUT = "kv_cache_reused_block"
"""The LLM API flavour's reused KV cache blocks (upstream's name), on the final response."""
_CACHE_OUTPUTS = (ENGINE_CACHE_OUTPUT, LLMAPI_CACHE_OUTPUT)


def _cached_blocks(result: Any) -> int:
    """The reused KV cache blocks a final response reports (0 when it reports none)."""
    for output, raw in zip(result.outputs, result.raw_output_contents, strict=False):
        if output.name in _CACHE_OUTPUTS and len(raw) >= 4:
            return max(0, int.from_bytes(raw[:4], "little", signed=True))
    return 0


def _strings(raw: bytes) -> list[bytes]:
    """The elements of a serialized BYTES tensor: each a 4-byte little-endian length, then its bytes."""
    out, at = [], 0
    while at + 4 <= len(raw):
        size = int.from_bytes(raw[at : at + 4], "little")
        out.append(raw[at + 4 : at + 4 + size])
        at += 4 + size
    return out


class EngineStream:
    """One request in flight. Read it with `read()` until `finish_reason` is set; `close()` always."""

    __slots__ = (
        "_block",
        "_cancel",
        "_cut",
        "_decoder",
        "_due",
        "_error",
        "_final",
        "_interval",
        "_learns",
        "_matcher",
        "_pending",
        "_queued",
        "_reading",
        "_retry",
        "_shape",
        "_timer",
        "_waiter",
        "cached_tokens",
        "completion_tokens",
        "finish_reason",
        "hold",
        "max_tokens",
        "on_wake",
        "prompt_logprobs",
        "request_id",
        "stream_id",
    )
    _shape_outputs: tuple[str, ...] = (ENGINE_OUTPUT,)  # what a response's shape locates

    def __init__(
        self,
        request: GenerationRequest,
        decoder: IncrementalDetokenizer,
        request_id: str,
        cancel: Callable[[int], None],
    ) -> None:
        self.request_id = request_id
        self.max_tokens = 0 if request.prompt_only else request.max_tokens
        self.completion_tokens = 0
        self.cached_tokens = 0  # prompt tokens the engine found in its KV cache (the final response's)
        self._block = 32  # tokens per KV cache block (TritonRelay sets the engine's)
        self.prompt_logprobs: list[TokenLogprob] | None = None  # with prompt_logprobs: the prompt's
        self.finish_reason: str | None = None
        self.stream_id = 0
        # The caller's stop tokens end the answer without being part of it (the LLM API cuts them
        # itself); a prompt-only request (max_tokens 0) shows none of the one token generated.
        self._cut: frozenset[int] | None = (
            frozenset(request.cut_token_ids) if request.cut_token_ids or request.prompt_only else None
        )
        self._decoder = decoder
        self._matcher = StopStringMatcher(request.stop) if request.stop else None
        self._pending: Any = array("i")  # arrived, not read yet (ids here; text in a subclass)
        self._final = False
        self._error: APIError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._cancel = cancel
        self._timer: asyncio.TimerHandle | None = None
        self._retry: Callable[[EngineStream], int] | None = None  # resends with the LoRA weights
        self._interval = 0.0  # seconds between two writes after the first (TRTLLM_STREAM_INTERVAL_MS)
        self._due = 0.0  # the event loop's time before which text is held
        self.hold = 0.0  # after poll() found text held: the seconds it stays held
        self.on_wake: Callable[[], None] | None = None  # instead of waking read(): something arrived
        self._reading: GrpcConnection | None = None  # the connection whose reads deliver this stream
        self._queued = False  # on_wake is due at the end of the connection's current read
        self._shape: ResponseShape | None = None  # the last response's: the next ones read without protobuf
        self._learns = SHAPES_PER_STREAM  # shapes this stream may still learn (5 us each)

    # ---- CallSink: called by the connection, on the event loop -----------------------------------

    def on_message(self, data: bytes) -> None:
        shape = self._shape
        if shape is not None:
            raws = shape.contents(data)
            if raws is not None:  # the last response's shape, other ids (relay/response_shape.py)
                self._pending.frombytes(raws[shape.at[0]])
                self._wake()
                return
        response = _parse_response(data)
        if response.error_message:
            self._refused(response.error_message)
            return
        result = response.infer_response
        outputs = result.outputs
        if outputs and outputs[0].name == ENGINE_OUTPUT:  # where engines put it: no loop
            self._pending.frombytes(result.raw_output_contents[0])
        else:
            for output, raw in zip(outputs, result.raw_output_contents, strict=False):
                if output.name == ENGINE_OUTPUT:  # beside it: sequence_length, which NVIDIA requires
                    self._pending.frombytes(raw)
                    break
        if result.parameters["triton_final_response"].bool_param:
            self._final = True
            self.cached_tokens = _cached_blocks(result) * self._block
        else:
            self._learn_shape(data, result)
        self._wake()

    def _learn_shape(self, data: bytes, result: Any) -> None:
        """After a full parse of a response that is not the last: its shape, for the next ones."""
        if self._learns:
            self._learns -= 1
            self._shape = ResponseShape.learn(data, result, *self._shape_outputs) or self._shape

    def on_end(self, status: int, message: str) -> None:
        if status == OK and self._final:
            return
        if status in (UNAVAILABLE, CANCELLED):
            error = APIError.unavailable(f"The inference server is unavailable: {message}", retry_after=1)
        elif status == OK:
            error = APIError.unavailable("The inference server closed the stream early.", retry_after=1)
        else:
            error = APIError.server_error(f"Inference server error: {message}")
        self._fail(error)

    def _refused(self, message: str) -> None:
        """An error from the engine: the request fails, unless the engine no longer holds the
        request's LoRA adapter (Triton restarted, or evicted it), when it is sent again with the
        adapter's weights."""
        retry = self._retry
        if retry is not None and CACHE_MISS in message and not self.completion_tokens:
            self._retry = None
            self._cancel(self.stream_id)  # the refused call: nothing more of it is read
            self.stream_id = retry(self)
            return
        self._fail(engine_refusal(message))

    def _fail(self, error: APIError) -> None:
        if self._error is None and self.finish_reason is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        if self.on_wake is not None:  # a pushed response reads the stream itself: after this read
            reading = self._reading
            if reading is None or not reading.reading:
                self.on_wake()
            elif not self._queued:
                self._queued = True
                reading.after_read(self._woken)
            return
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _woken(self) -> None:
        self._queued = False
        if self.on_wake is not None:
            self.on_wake()

    def timed_out(self) -> None:
        self._fail(APIError.timeout())

    def end(self, error: APIError) -> None:
        """Ends the request with `error` (its engine request is cancelled by the caller)."""
        self._fail(error)

    # ---- the reader --------------------------------------------------------------------------------

    @property
    def settled(self) -> bool:
        """Whether the engine has sent its last response, or the request failed."""
        return self._final or self._error is not None

    def poll(self) -> str | None:
        """The text generated since the last read, without waiting: None when there is none yet
        (or it is held until `hold` seconds have passed), "" only with `finish_reason` set.

        Raises APIError when the request failed.
        """
        if self._error is not None:
            raise self._error
        if self.finish_reason is not None:
            return ""
        if self._interval and self._pending and not self._final:
            delay = self._due - asyncio.get_running_loop().time()
            if delay > 0:  # more tokens may come meanwhile: they go out together
                self.hold = delay
                return None
        text = self._take() if self._pending else ""
        if text or self.finish_reason is not None:
            if self._interval:
                self._due = asyncio.get_running_loop().time() + self._interval
            return text
        if self._final:
            self.finish_reason = "length" if self.completion_tokens >= self.max_tokens else "stop"
            self._done()
            return self._matcher.flush() if self._matcher is not None else ""
        self.hold = 0.0
        return None

    async def read(self) -> str:
        """The text generated since the last read; waits for some unless the stream has finished.

        Returns "" only with `finish_reason` set. Raises APIError when the request failed.
        """
        while True:
            text = self.poll()
            if text is not None:
                return text
            if self.hold:
                await asyncio.sleep(self.hold)
                continue
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter

    def _take(self) -> str:
        if self._cut is not None:
            self._take_cut()
        ids, self._pending = self._pending, array("i")
        matcher = self._matcher
        if matcher is None or len(ids) == 1:
            self.completion_tokens += len(ids)
            text = self._decoder.push(ids)
            if matcher is not None and text:
                text, stopped = matcher.push(text)
                if stopped:
                    self._stopped()
            return text
        # Several tokens at once (the reader was behind) and stop strings: token by token, so that
        # the count ends with the token that completed a stop string, not with the last received.
        pieces = []
        for i in range(len(ids)):
            self.completion_tokens += 1
            text = self._decoder.push(ids[i : i + 1])
            if text:
                text, stopped = matcher.push(text)
                pieces.append(text)
                if stopped:
                    self._stopped()
                    break
        return "".join(pieces)

    def _take_cut(self) -> None:
        """Drops from the pending ids the caller's stop token and what follows it (a prompt-only
        request: all of them); the answer then ends there."""
        ids = self._pending
        if self.max_tokens == 0:  # prompt only: the one generated token is not shown nor counted
            self._pending = array("i")
            return
        for i, token in enumerate(ids):
            if token in self._cut:  # type: ignore[operator]
                self._pending = ids[:i]  # the engine ends the request with that token
                return

    def _stopped(self) -> None:
        """A stop string matched: the answer ends, and the engine request is cancelled."""
        self.finish_reason = "stop"
        self.close()

    def _done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the answer (Anthropic's `stop_sequence`); None if none did."""
        matcher = self._matcher
        return matcher.matched if matcher is not None else None

    def take_logprobs(self) -> list[TokenLogprob]:
        """The log probs of the tokens read since the last call (none: not asked for)."""
        return []

    def close(self) -> None:
        """Ends the request: cancels it in the engine unless it has finished. Safe to call twice."""
        self._done()
        if self.stream_id and not self._final:
            self._cancel(self.stream_id)
        self.stream_id = 0
        if self.finish_reason is None and self._error is None:
            self._error = APIError.unavailable("The request was cancelled.")


class TextEngineStream(EngineStream):
    """A request to the LLM API flavour's model: text deltas (detokenized in Triton) and a token count.

    Each response carries `text_output` (one BYTES element: a 4-byte length, then UTF-8 that ends on
    a whole character) and `num_output_tokens`, the tokens generated so far. `_pending` holds the
    text pieces not read yet, each with the token count it came with (a stop string ends the count
    at the piece that completed it).
    """

    __slots__ = ()
    _shape_outputs = (LLMAPI_TEXT_OUTPUT, LLMAPI_COUNT_OUTPUT)

    def __init__(
        self,
        request: GenerationRequest,
        decoder: IncrementalDetokenizer | None,
        request_id: str,
        cancel: Callable[[int], None],
    ) -> None:
        super().__init__(request, decoder, request_id, cancel)  # type: ignore[arg-type]
        self._pending = []  # (text bytes, tokens generated up to and including them)
        # The LLM API cuts the caller's stop tokens itself; here _cut only marks a prompt-only request.
        self._cut = frozenset() if request.prompt_only else None

    def on_message(self, data: bytes) -> None:
        shape = self._shape
        if shape is not None:
            raws = shape.contents(data)
            if raws is not None:  # the last response's shape, other contents (relay/response_shape.py)
                self._add_text(raws[shape.at[0]], raws[shape.at[1]])
                self._wake()
                return
        response = _parse_response(data)
        if response.error_message:
            self._refused(response.error_message)
            return
        result = response.infer_response
        text, count = b"", b""
        for output, raw in zip(result.outputs, result.raw_output_contents, strict=False):
            if output.name == LLMAPI_TEXT_OUTPUT:
                text = raw
            elif output.name == LLMAPI_COUNT_OUTPUT:
                count = raw
        self._add_text(text, count)
        if result.parameters["triton_final_response"].bool_param:
            self._final = True
            self.cached_tokens = _cached_blocks(result) * self._block
        else:
            self._learn_shape(data, result)
        self._wake()

    def _add_text(self, text: bytes, count: bytes) -> None:
        """One response's `text_output` and `num_output_tokens` contents (b"": not in it)."""
        if len(count) >= 4:
            self.completion_tokens = int.from_bytes(count[:4], "little", signed=True)
        if self._cut is not None:  # prompt only (max_tokens 0): the generated token is not shown
            self.completion_tokens = 0
        elif len(text) > 4:
            self._pending.append((text[4:], self.completion_tokens))

    def _take(self) -> str:
        pieces, self._pending = self._pending, []
        matcher = self._matcher
        if matcher is None:
            return b"".join(piece for piece, _ in pieces).decode("utf-8", errors="replace")
        texts = []
        for piece, tokens in pieces:  # each piece ends on a whole character
            text, stopped = matcher.push(piece.decode("utf-8", errors="replace"))
            texts.append(text)
            if stopped:
                self.completion_tokens = tokens  # the count ends where the stop string did
                self._stopped()
                break
        return "".join(texts)


def _named(result: Any) -> dict[str, tuple[Any, bytes]]:
    return {o.name: (o, raw) for o, raw in zip(result.outputs, result.raw_output_contents, strict=False)}


class _LogprobReader:
    """What both log-prob streams add to theirs: the tokens' log probs, handed to the reader with
    their text. `on_message` fills `_arrived`; a read moves them on; `take_logprobs()` returns those
    of the tokens whose text was read since it was last called (at the end: all that are left)."""

    __slots__ = ()
    _arrived: list[TokenLogprob]
    _read: list[TokenLogprob]
    _top: int
    _prompt: Any
    _prompt_top: int | None
    _cut: frozenset[int] | None
    finish_reason: str | None
    max_tokens: int
    prompt_logprobs: list[TokenLogprob] | None

    def __init__(
        self,
        request: GenerationRequest,
        decoder: IncrementalDetokenizer | None,
        request_id: str,
        cancel: Callable[[int], None],
    ) -> None:
        super().__init__(request, decoder, request_id, cancel)  # type: ignore[call-arg]
        self._top = request.logprobs or 0
        self._prompt = request.prompt_ids
        self._prompt_top = request.prompt_logprobs
        self._arrived = []
        self._read = []

    def _take(self) -> str:
        if self._cut is not None:  # a prompt-only request, or a caller's stop token: not shown
            self._arrived = self._uncut(self._arrived)
        self._read.extend(self._arrived)
        self._arrived = []
        return super()._take()  # type: ignore[misc]

    def _uncut(self, entries: list[TokenLogprob]) -> list[TokenLogprob]:
        if self.max_tokens == 0:
            return []
        for i, entry in enumerate(entries):
            if entry.token in self._cut:  # type: ignore[operator]
                return entries[:i]
        return entries

    def take_logprobs(self) -> list[TokenLogprob]:
        if self._cut is not None:
            self._arrived = self._uncut(self._arrived)
        if self.finish_reason is not None:  # the end: tokens that brought no text come too
            self._read.extend(self._arrived)
            self._arrived = []
        taken, self._read = self._read, []
        return taken


class LogprobEngineStream(_LogprobReader, EngineStream):
    """An `EngineStream` with each token's log prob (`output_log_probs`) and, with `top` > 0, the
    `top` most likely tokens of its step, reduced from the generation logits."""

    __slots__ = ("_arrived", "_prompt", "_prompt_top", "_read", "_top")

    def on_message(self, data: bytes) -> None:
        response = _parse_response(data)
        if response.error_message:
            self._refused(response.error_message)
            return
        result = response.infer_response
        named = _named(result)
        if self._prompt_top is not None and self.prompt_logprobs is None and "context_logits" in named:
            output, raw = named["context_logits"]
            vocab = int(output.shape[-1]) if output.shape else 0
            if vocab:
                dtype = np.float16 if output.datatype == "FP16" else np.float32
                rows = np.frombuffer(raw, dtype=dtype).reshape(-1, vocab)
                self.prompt_logprobs = prompt_from_logits(rows, self._prompt, self._prompt_top)
        if "output_ids" in named:
            raw_ids = named["output_ids"][1]
            ids = np.frombuffer(raw_ids, dtype=np.int32).tolist()
            if ids:
                self._pending.frombytes(raw_ids)
                self._collect(ids, named)
        if result.parameters["triton_final_response"].bool_param:
            self._final = True
            self.cached_tokens = _cached_blocks(result) * self._block
        self._wake()

    def _collect(self, ids: list[int], named: dict[str, tuple[Any, bytes]]) -> None:
        count = len(ids)
        values = _floats(named, "output_log_probs")
        log_probs = values[-count:] if len(values) >= count else [float("nan")] * count
        tops: list[tuple[list[int], list[float]]] = [([], [])] * count
        if self._top and "generation_logits" in named:
            output, raw = named["generation_logits"]
            vocab = int(output.shape[-1]) if output.shape else 0
            if vocab:
                dtype = np.float16 if output.datatype == "FP16" else np.float32  # the engine's logits_dtype
                rows = np.frombuffer(raw, dtype=dtype).reshape(-1, vocab).astype(np.float32)
                if len(rows) >= count:
                    tops = top_from_logits(rows[:count], self._top)
        self._arrived.extend(TokenLogprob(t, v, *top) for t, v, top in zip(ids, log_probs, tops, strict=True))


class TextLogprobEngineStream(_LogprobReader, TextEngineStream):
    """A `TextEngineStream` with the tokens (ids, log probs, top log probs) the LLM API flavour's
    model returns with `sampling_param_logprobs`."""

    __slots__ = ("_arrived", "_prompt", "_prompt_top", "_read", "_top")

    def on_message(self, data: bytes) -> None:
        response = _parse_response(data)
        if not response.error_message:
            named = _named(response.infer_response)
            if "prompt_log_probs" in named and self.prompt_logprobs is None:
                self.prompt_logprobs = _prompt_entries(self._prompt, named)
            if "output_ids" in named:
                ids = np.frombuffer(named["output_ids"][1], dtype=np.int32).tolist()
                values = _floats(named, "output_log_probs")
                tops: list[tuple[list[int], list[float]]] = [([], [])] * len(ids)
                if "top_log_probs" in named and ids:
                    top_ids = np.frombuffer(named["top_log_prob_ids"][1], dtype=np.int32).reshape(
                        len(ids), -1
                    )
                    top_values = np.frombuffer(named["top_log_probs"][1], dtype=np.float32).reshape(
                        len(ids), -1
                    )
                    tops = list(zip(top_ids.tolist(), top_values.tolist(), strict=True))
                self._arrived.extend(
                    TokenLogprob(t, v, *top) for t, v, top in zip(ids, values, tops, strict=True)
                )
        super().on_message(data)


def _prompt_entries(prompt: Any, named: dict[str, tuple[Any, bytes]]) -> list[TokenLogprob]:
    """The LLM API flavour's prompt log probs: `prompt_log_probs` [prompt] (NaN first) and, for
    positions 1.., `prompt_top_log_prob_ids` / `prompt_top_log_probs` [prompt - 1, N]."""
    values = _floats(named, "prompt_log_probs")
    tops: list[tuple[list[int], list[float]]] = [([], [])] * len(values)
    if "prompt_top_log_probs" in named and len(values) > 1:
        ids = np.frombuffer(named["prompt_top_log_prob_ids"][1], dtype=np.int32).reshape(len(values) - 1, -1)
        top = np.frombuffer(named["prompt_top_log_probs"][1], dtype=np.float32).reshape(len(values) - 1, -1)
        tops = [([], []), *zip(ids.tolist(), top.tolist(), strict=True)]
    return [
        TokenLogprob(int(t), None if i == 0 else v, *tops[i])
        for i, (t, v) in enumerate(zip(prompt, values, strict=False))
    ]


class _BeamStream:
    """What both beam-search streams add: the one (final) response's beams, read with `beams()`.
    Beam search is never streamed: the engine sends every beam at once, when the search is over."""

    __slots__ = ()
    _beams: list[tuple[str, int]] | None
    _stops: tuple[str, ...]
    _error: APIError | None
    _final: bool
    _waiter: asyncio.Future[None] | None
    _matcher: Any
    max_tokens: int
    finish_reason: str | None
    completion_tokens: int
    cached_tokens: int
    _block: int

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)  # type: ignore[call-arg]
        self._beams = None
        self._stops = args[0].stop

    def on_message(self, data: bytes) -> None:
        response = _parse_response(data)
        if response.error_message:
            self._refused(response.error_message)  # type: ignore[attr-defined]
            return
        result = response.infer_response
        beams = self._read_beams(_named(result))
        if beams is not None:
            self._beams = beams
        if result.parameters["triton_final_response"].bool_param:
            self._final = True
            self.cached_tokens = _cached_blocks(result) * self._block
        self._wake()  # type: ignore[attr-defined]

    def _read_beams(self, named: dict[str, tuple[Any, bytes]]) -> list[tuple[str, int]] | None:
        """(text, tokens) of each beam in a response, best first; None when it carries none."""
        raise NotImplementedError

    async def beams(self) -> list[tuple[str, int, str]]:
        """(text, tokens, finish reason) of each returned beam, best first; raises APIError."""
        while self._error is None and not self._final:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        if self._error is not None:
            raise self._error
        out = []
        for text, tokens in self._beams or ():
            reason = "length" if tokens >= self.max_tokens else "stop"
            if self._stops:  # stop strings: each beam ends before its first one
                matcher = StopStringMatcher(self._stops)
                shown, stopped = matcher.push(text)
                text, reason = (shown, "stop") if stopped else (shown + matcher.flush(), reason)
            out.append((text, tokens, reason))
        self.finish_reason = out[0][2] if out else "stop"
        self.completion_tokens = sum(tokens for _, tokens, _ in out)
        self._done()  # type: ignore[attr-defined]
        return out


class BeamEngineStream(_BeamStream, EngineStream):
    """A beam search on the C++ contract: output_ids [1, beams, longest] and sequence_length [1,
    beams], decoded here."""

    __slots__ = ("_beams", "_stops")

    def _read_beams(self, named: dict[str, tuple[Any, bytes]]) -> list[tuple[str, int]] | None:
        if "output_ids" not in named or "sequence_length" not in named:
            return None
        lengths = np.frombuffer(named["sequence_length"][1], dtype=np.int32).tolist()
        raw = named["output_ids"][1]
        rows = np.frombuffer(raw, dtype=np.int32).reshape(len(lengths), -1) if lengths else []
        return [
            (self._decoder.decode(row[:length].tolist()), int(length))
            for row, length in zip(rows, lengths, strict=True)
        ]


class TextBeamEngineStream(_BeamStream, TextEngineStream):
    """A beam search on the LLM API flavour: one row of text_output and num_output_tokens per beam."""

    __slots__ = ("_beams", "_stops")

    def _read_beams(self, named: dict[str, tuple[Any, bytes]]) -> list[tuple[str, int]] | None:
        if LLMAPI_TEXT_OUTPUT not in named:
            return None
        texts = [t.decode("utf-8", errors="replace") for t in _strings(named[LLMAPI_TEXT_OUTPUT][1])]
        counts = (
            np.frombuffer(named[LLMAPI_COUNT_OUTPUT][1], dtype=np.int32).tolist()
            if LLMAPI_COUNT_OUTPUT in named
            else [0] * len(texts)
        )
        return list(zip(texts, counts, strict=False))


def _floats(named: dict[str, tuple[Any, bytes]], name: str) -> list[float]:
    return np.frombuffer(named[name][1], dtype=np.float32).tolist() if name in named else []


def _marker(template: str) -> str:
    """The fixed text of an NVIDIA message template before its first field."""
    return template.split("{", 1)[0]


ENGINE_REQUEST_ERRORS: tuple[tuple[str, str | None, str, str | None], ...] = (
    (
        "should not exceed max_num_tokens",
        "context_length_exceeded",
        "The prompt is longer than the engine takes in one step (its max_num_tokens; the model was "
        "packed without chunked prefill): shorten it, or repack with a larger --max-num-tokens or "
        "with --enable-chunked-context.",
        None,
    ),
    (
        _marker(nvllm.BEAM_WIDTH_NOT_MAX),
        None,
        "This model runs every request as a beam search over its packed max_beam_width.",
        "use_beam_search",
    ),
    (nvllm.BEAM_MULTIPLE_LOGPROBS, None, "Beam search returns no top log probs.", "logprobs"),
    (nvllm.TOPK_OUT_OF_RANGE, None, "More top log probs than the vocabulary has.", "logprobs"),
    *(
        (_marker(template), None, "The engine refused a sampling parameter.", None)
        for template in (
            nvllm.BAD_TOP_P,
            nvllm.BAD_TOP_K,
            nvllm.BAD_TEMPERATURE,
            nvllm.BEST_OF_BELOW_N,
            nvllm.GREEDY_BEST_OF,
        )
    ),
)
"""What the LLM API / PyTorch executor at 1.2.1 refuses because of the request itself (marker in its
message, code, our explanation, the field): 400s. The service refuses these before Triton where it can
(Runtime's checks); this is the net under them."""
ENGINE_CAPACITY_ERRORS = (
    nvllm.NOTHING_SCHEDULABLE,
    "No free blocks left",  # the C++ KV cache manager's "Can't allocate new blocks. No free blocks left."
)
"""Failures of the executor for want of resources: 503 with Retry-After."""
ENGINE_RETRY_S = 5
"""Retry-After of an executor failure (capacity, or an error of the engine that is not the request's)."""


def engine_refusal(message: str) -> APIError:
    """The client's error for an error response of Triton: a 400 for a request our models refused or
    NVIDIA's LLM API refused for what the request asked (ENGINE_REQUEST_ERRORS), a 503 with
    Retry-After while a dead Python-backend stub is being replaced, for the executor's capacity
    failures and for any other error the LLM API's model sends ("Error generating request: ...":
    the executor failed the request, not the client), else a 500 with Triton's message."""
    if INVALID_REQUEST_MARKER in message:
        return APIError.bad_request(
            message[message.index(INVALID_REQUEST_MARKER) + len(INVALID_REQUEST_MARKER) :]
        )
    if DEAD_STUB_MARKER in message and "Stub process '" in message:
        return APIError.unavailable(
            f"The inference server is restarting after a model process died: {message}",
            retry_after=DEAD_STUB_RETRY_S,
        )
    said = message.split(nvllm.GENERATE_ERROR, 1)[-1]
    for marker, code, why, param in ENGINE_REQUEST_ERRORS:
        if marker in message:
            return APIError.bad_request(f"{why} The engine said: {said}", param=param, code=code)
    if any(marker in message for marker in ENGINE_CAPACITY_ERRORS):
        return APIError.unavailable(
            f"The engine is out of capacity (KV cache): {said}; please retry shortly.",
            retry_after=ENGINE_RETRY_S,
        )
    if nvllm.GENERATE_ERROR in message:
        return APIError.unavailable(
            f"The engine failed the request: {said}; please retry shortly.", retry_after=ENGINE_RETRY_S
        )
    return APIError.server_error(f"Inference server error: {message}")


class TritonRelay:
    """Starts engine requests on one shared HTTP/2 connection to Triton's gRPC port.

    Args:
        address: Where Triton's gRPC endpoint is now, as (host, port); None while it is not ready.
        stream_timeout_s: Longest a request may stream before it ends with a 504.
        stream_interval_s: After a stream's first text, the least time between two of its texts
            (0: each as it arrives).
        idle_timeout_s: Longest Triton may send nothing while requests are open before they end
            with a 503 (it hangs).
    """

    def __init__(
        self,
        address: Callable[[], tuple[str, int] | None],
        *,
        stream_timeout_s: float = 600.0,
        idle_timeout_s: float = 120.0,
        flavor: str = "ensemble",
        tokens_per_block: int = 32,
        stream_interval_s: float = 0.0,
    ) -> None:
        self.address = address
        self.stream_interval_s = stream_interval_s
        self.flavor = flavor
        self.tokens_per_block = tokens_per_block  # the engine's KV cache block: cached_tokens per block
        self.stream_timeout_s = stream_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._connection: GrpcConnection | None = None
        self._opening: asyncio.Future[GrpcConnection] | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._ended: APIError | None = None  # set by end_all: every later request fails with it

    async def _connect(self) -> GrpcConnection:
        if self._ended is not None:
            raise self._ended
        where = self.address()
        if where is None:
            raise APIError.unavailable(
                "The model is not ready (Triton is starting, restarting or not answering).", retry_after=1
            )
        connection = self._connection
        if connection is not None and not connection.closed:
            return connection
        if self._opening is not None:
            return await asyncio.shield(self._opening)
        self._opening = asyncio.get_running_loop().create_future()
        try:
            connection = await GrpcConnection.open(*where)
        except (OSError, asyncio.TimeoutError) as exc:
            error = APIError.unavailable(f"The inference server is unreachable: {exc}", retry_after=1)
            self._opening.set_exception(error)
            self._opening.exception()  # retrieved: waiters re-raise it
            raise error from None
        finally:
            opening, self._opening = self._opening, None
        self._connection = connection
        opening.set_result(connection)
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.create_task(self._watch_idle(), name="triton-idle-watchdog")
        return connection

    async def _watch_idle(self) -> None:
        """Drops the connection when requests are open and Triton sent nothing for the idle timeout."""
        interval = min(1.0, self.idle_timeout_s / 4)
        while True:
            await asyncio.sleep(interval)
            connection = self._connection
            if connection is None or connection.closed or not connection.active_calls:
                continue
            silent = time.monotonic() - connection.last_received
            if silent >= self.idle_timeout_s:
                reason = (
                    f"Triton sent nothing for {silent:.0f} s with {connection.active_calls} requests open"
                )
                logger.error("%s; dropping the connection", reason)
                self._connection = None
                connection.abort(reason)

    async def start(
        self,
        request: GenerationRequest,
        decoder: IncrementalDetokenizer,
        with_weights: GenerationRequest | None = None,
    ) -> EngineStream:
        """Sends `request` to the engine; read the returned stream, and close it when done.

        The ensemble flavour's engine answers token ids (detokenized here by `decoder`); the LLM API
        flavour's answers text.
        """
        connection = await self._connect()
        # Triton's id: the HTTP request's X-Request-Id (per choice when it has several), else a fresh one
        request_id = request.request_id or engine_request_id() or uuid.uuid4().hex
        logprobs = request.logprobs is not None or request.prompt_logprobs is not None
        if self.flavor == "llmapi":
            kind: type[EngineStream] = TextLogprobEngineStream if logprobs else TextEngineStream
            if request.beam_width and request.num_return is not None:  # else one beam: one text response
                kind = TextBeamEngineStream
            stream = kind(request, None, request_id, connection.cancel)  # type: ignore[arg-type]
            message = llmapi_message(request, request_id)
        else:
            kind = LogprobEngineStream if logprobs else EngineStream
            if request.beam_width:
                kind = BeamEngineStream
            stream = kind(request, decoder, request_id, connection.cancel)
            message = engine_message(request, request_id)
        stream._block = self.tokens_per_block
        stream._interval = self.stream_interval_s
        stream._reading = connection
        stream.stream_id = connection.start_call(STREAM_INFER, message, stream)
        if with_weights is not None:  # the engine may not hold the adapter: then send its weights

            def retry(sink: EngineStream, full: GenerationRequest = with_weights) -> int:
                return connection.start_call(STREAM_INFER, engine_message(full, request_id), sink)

            stream._retry = retry
        if stream.stream_id:
            stream._timer = asyncio.get_running_loop().call_later(self.stream_timeout_s, stream.timed_out)
        return stream

    def end_all(self, error: APIError) -> int:
        """Ends every request in flight with `error`, each cancelled in the engine, and fails every
        later one the same way (the shutdown grace ran out). Returns how many it ended."""
        self._ended = error
        connection = self._connection
        if connection is None:
            return 0
        sinks = connection.cancel_all()
        for sink in sinks:
            if isinstance(sink, EngineStream):
                sink.end(error)
        return len(sinks)

    async def reset(self) -> None:
        """Drops the connection (Triton restarted); the next request connects again."""
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

    async def close(self) -> None:
        """Drops the connection and stops the watchdog (the service stops)."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        await self.reset()
