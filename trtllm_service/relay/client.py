"""The relay: generation requests to Triton's `tensorrt_llm` model, token ids back, text out.

The service talks to the engine directly (NVIDIA's C++ backend contract, or our stand-in behind it):
it tokenized the prompt already, and detokenizing here (tensorrtllm_backend.detokenizer, the same
code as postprocessing's) costs a few microseconds per chunk, while the ensemble's postprocessing
step would cost a Python-backend round trip per token inside Triton. Every call of a worker shares one HTTP/2 connection (`grpc_http2`), read on the
event loop.

Per request, an `EngineStream` collects what arrives through its reader (relay/readers.py: token
ids or text, the flavour's; from inside the connection's data_received, no task per token) and
calls back its reader once the socket read is handled
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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tritonclient.grpc import service_pb2

from tensorrtllm_backend import nvidia_llmapi as nvllm
from tensorrtllm_backend.grammars import brief
from tensorrtllm_backend.lora import CACHE_MISS
from trtllm_service.errors import APIError
from trtllm_service.relay.grpc_http2 import CANCELLED, OK, UNAVAILABLE, GrpcConnection
from trtllm_service.relay.logprobs import TokenLogprob
from trtllm_service.relay.pace import PACE, STARTING, Pace, Ticket
from trtllm_service.relay.readers import Reader
from trtllm_service.relay.request import ENGINE_CACHE_OUTPUT, GenerationRequest
from trtllm_service.relay.response_shape import SHAPES_PER_STREAM, ResponseShape
from trtllm_service.request_ids import engine_request_id

if TYPE_CHECKING:
    from trtllm_service.relay.flavors import Flavor

logger = logging.getLogger("trtllm_service.relay")

STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
UNAVAILABLE_MESSAGE = "The inference server is unavailable (its connection ended); please retry."
"""A stream whose connection to Triton ended (Triton died, restarted or hung)."""
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


class EngineStream:
    """One request in flight, built complete by `TritonRelay.start`. Read it with `read()` until
    `finish_reason` is set (a beam search: `beams()`); `close()` always.

    Args:
        request: The engine request (its max_tokens, for the finish reason).
        reader: What its responses carry, read (relay/readers.py; the flavour's choice).
        request_id: Triton's id of the request.
        cancel: Cancels a call of the connection by its stream id.
        reading: The connection whose reads deliver this stream (a pushed response then writes after
            the whole read, not per response).
        block: Tokens per KV cache block of the engine (cached_tokens is counted in blocks).
        interval_s: After the first text, the least time between two texts (0: each as it arrives).
        pace: The worker's starting requests: while there are any, texts after the first are at
            least `pace.interval_s` apart (relay/pace.py). None: only `interval_s` holds text.
        ticket: The request's place among the starting ones, done at its first response.
        retry: Sends the request again with its LoRA adapter's weights, when the engine no longer
            holds it; returns the new call's stream id.
    """

    __slots__ = (
        "_add_raws",
        "_block",
        "_cancel",
        "_error",
        "_final",
        "_interval",
        "_last",
        "_learns",
        "_logprobs",
        "_on_settled",
        "_pace",
        "_queued",
        "_reader",
        "_reading",
        "_retry",
        "_shape",
        "_ticket",
        "_timer",
        "_waiter",
        "cached_tokens",
        "finish_reason",
        "hold",
        "max_tokens",
        "on_wake",
        "request_id",
        "stream_id",
    )

    def __init__(
        self,
        request: GenerationRequest,
        reader: Reader,
        request_id: str,
        cancel: Callable[[int], None],
        *,
        reading: GrpcConnection | None = None,
        block: int = 32,
        interval_s: float = 0.0,
        pace: Pace | None = None,
        ticket: Ticket | None = None,
        retry: Callable[[EngineStream], int] | None = None,
    ) -> None:
        self.request_id = request_id
        self.max_tokens = 0 if request.prompt_only else request.max_tokens
        self.cached_tokens = 0  # prompt tokens the engine found in its KV cache (the final response's)
        self.finish_reason: str | None = None
        self.stream_id = 0
        self._reader = reader
        self._add_raws = reader.add_raws  # bound once: the per-token path
        self._logprobs = reader.logprobs
        self._block = block
        self._final = False
        self._error: APIError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._cancel = cancel
        self._timer: asyncio.TimerHandle | None = None
        self._retry = retry
        self._interval = interval_s
        self._pace = pace
        self._ticket = ticket
        self._last = -1e9  # time.monotonic() of the last text read (after the first, text may be held)
        self.hold = 0.0  # after poll() found text held: the seconds it stays held
        self.on_wake: Callable[[], None] | None = None  # instead of waking read(): something arrived
        self._reading = reading
        self._queued = False  # on_wake is due at the end of the connection's current read
        self._shape: ResponseShape | None = None  # the last response's: the next ones read without protobuf
        # the shapes it may learn (5 us each), from its second full parse on (the first: the first
        # response, which goes to the client as fast as it can)
        self._learns = SHAPES_PER_STREAM + 1 if reader.shape_outputs else 0
        self._on_settled: Callable[[], None] | None = None

    def started(self, stream_id: int, timeout_s: float) -> None:
        """The call is on the connection (0: it could not start); it ends with a 504 after `timeout_s`."""
        self.stream_id = stream_id
        if stream_id:
            self._timer = asyncio.get_running_loop().call_later(timeout_s, self.timed_out)

    @property
    def completion_tokens(self) -> int:
        return self._reader.completion_tokens

    @property
    def prompt_logprobs(self) -> list[TokenLogprob] | None:
        """With prompt_logprobs: the prompt's tokens' (None until they arrived, or not asked for)."""
        logprobs = self._logprobs
        return logprobs.prompt if logprobs is not None else None

    # ---- CallSink: called by the connection, on the event loop -----------------------------------

    def on_message(self, data: bytes) -> None:
        if self._ticket is not None:  # the first response: the request is no longer starting
            self._ticket.done()
            self._ticket = None
        shape = self._shape
        if shape is not None:
            raws = shape.contents(data)
            if raws is not None:  # the last response's shape, other contents (relay/response_shape.py)
                self._add_raws(raws, shape.at)
                self._wake()
                return
        response = _parse_response(data)
        if response.error_message:
            self._refused(response.error_message)
            return
        result = response.infer_response
        self._reader.add(result)
        if result.parameters["triton_final_response"].bool_param:
            self._final = True
            self.cached_tokens = _cached_blocks(result) * self._block
            self._settle()
        elif self._learns:  # a full parse of a response that is not the last: its shape
            self._learns -= 1
            if self._learns < SHAPES_PER_STREAM:  # not the first's: its way is the first token's
                self._shape = ResponseShape.learn(data, result, *self._reader.shape_outputs) or self._shape
        self._wake()

    def on_end(self, status: int, message: str) -> None:
        if status == OK and self._final:
            return
        if status in (UNAVAILABLE, CANCELLED):
            # `message` names Triton's loopback address ("connection to 127.0.0.1:56403 lost"):
            # the log has it (GrpcConnection), the client does not need it.
            error = APIError.unavailable(UNAVAILABLE_MESSAGE, retry_after=1)
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
        if self._ticket is not None:
            self._ticket.done()
            self._ticket = None
        if self._error is None and self.finish_reason is None:
            self._error = error
        self._settle()
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

    def when_settled(self, callback: Callable[[], None]) -> None:
        """Calls `callback` once, when the engine is done with this request: its last response came,
        it failed, or it was closed (cancelled in the engine); at once if that has happened."""
        if self._final or self._error is not None or self.finish_reason is not None:
            callback()
        else:
            self._on_settled = callback

    def _settle(self) -> None:
        callback = self._on_settled
        if callback is not None:
            self._on_settled = None
            callback()

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
        reader = self._reader
        pace = self._pace
        if reader.pending and not self._final:
            interval = self._interval
            if not interval and pace is not None and pace.starting:
                interval = pace.interval_s
            if interval:
                delay = self._last + interval - time.monotonic()
                if delay > 0:  # more tokens may come meanwhile: they go out together
                    self.hold = delay
                    return None
        if reader.pending:
            text = reader.take()
            if reader.stopped:  # a stop string matched: the answer ends, the engine request is cancelled
                self.finish_reason = "stop"
                self.close()
        else:
            text = ""
        if text or self.finish_reason is not None:
            if self._interval or (pace is not None and pace.starting):  # a hold may follow
                self._last = time.monotonic()
            return text
        if self._final:
            self.finish_reason = "length" if reader.completion_tokens >= self.max_tokens else "stop"
            self._done()
            return reader.flush()
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
            await self.next_wake()

    def next_wake(self) -> asyncio.Future[None]:
        """A future done at the stream's next wake-up (a response, the end, a failure, `interrupt`):
        for a reader that also waits on something else (a pushed response's first text, and the
        client leaving). Then `poll`."""
        self._waiter = waiter = asyncio.get_running_loop().create_future()
        return waiter

    def interrupt(self) -> None:
        """Wakes a reader waiting on `next_wake` with nothing new."""
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def beams(self) -> list[tuple[str, int, str]]:
        """A beam search (its reader a `BeamReader`): (text, tokens, finish reason) of each returned
        beam, best first, once the one final response arrived; raises APIError."""
        while self._error is None and not self._final:
            await self.next_wake()
        if self._error is not None:
            raise self._error
        out = self._reader.finished(self.max_tokens)  # type: ignore[attr-defined]  # a beam search's reader: a BeamReader
        self.finish_reason = out[0][2] if out else "stop"
        self._done()
        return out

    def _done(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the answer (Anthropic's `stop_sequence`); None if none did."""
        return self._reader.stop_string

    def take_logprobs(self) -> list[TokenLogprob]:
        """The log probs of the tokens read since the last call (none: not asked for)."""
        logprobs = self._logprobs
        return [] if logprobs is None else logprobs.take(self.finish_reason is not None)

    def close(self) -> None:
        """Ends the request: cancels it in the engine unless it has finished. Safe to call twice."""
        if self._ticket is not None:
            self._ticket.done()
            self._ticket = None
        self._done()
        if self.stream_id and not self._final:
            self._cancel(self.stream_id)
        self.stream_id = 0
        if self.finish_reason is None and self._error is None:
            self._error = APIError.unavailable("The request was cancelled.")
        self._settle()


def _marker(template: str) -> str:
    """The fixed text of an NVIDIA message template before its first field."""
    return template.split("{", 1)[0]


GUIDED_DECODING_MARKER = "guided decoding"
"""In the message of a request the engine failed because its guide broke one of llguidance's limits
while it generated (the service checks a guide's first steps only: relay/guided.py)."""

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
    (
        GUIDED_DECODING_MARKER,
        "invalid_value",
        "The engine could not follow the request's guide (response_format, guided_*, a forced tool "
        "call) past one of its limits.",
        None,
    ),
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
    """The client's error for an error response of Triton, its message brief (a few hundred
    characters): a 400 for a request our models refused or
    NVIDIA's LLM API refused for what the request asked (ENGINE_REQUEST_ERRORS), a 503 with
    Retry-After while a dead Python-backend stub is being replaced, for the executor's capacity
    failures and for any other error the LLM API's model sends ("Error generating request: ...":
    the executor failed the request, not the client), else a 500 with Triton's message."""
    message = brief(message)  # an engine's message may quote a whole grammar, or its parser's state
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
        flavor: The model's flavour: its messages, its readers, its KV cache block.
        stream_timeout_s: Longest a request may stream before it ends with a 504.
        stream_interval_s: After a stream's first text, the least time between two of its texts
            (0: each as it arrives).
        pace: The worker's starting requests, which hold other streams' text while there are any
            (relay/pace.py; the worker's own by default).
        idle_timeout_s: Longest Triton may send nothing while requests are open before they end
            with a 503 (it hangs).
    """

    def __init__(
        self,
        address: Callable[[], tuple[str, int] | None],
        flavor: Flavor,
        *,
        stream_timeout_s: float = 600.0,
        idle_timeout_s: float = 120.0,
        stream_interval_s: float = 0.0,
        pace: Pace = PACE,
    ) -> None:
        self.address = address
        self.pace = pace
        self.flavor = flavor
        self.stream_interval_s = stream_interval_s
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
            logger.warning("Triton's gRPC port %s:%d is unreachable: %s", *where, exc)
            error = APIError.unavailable("The inference server is unreachable; please retry.", retry_after=1)
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
        self, request: GenerationRequest, with_weights: GenerationRequest | None = None
    ) -> EngineStream:
        """Sends `request` to the engine; read the returned stream, and close it when done.

        `with_weights`: the same request with its LoRA adapter's weights, sent instead when the engine
        answers that it does not hold the adapter (the flavour's LoRA policy decides).
        """
        connection = await self._connect()
        # Triton's id: the HTTP request's X-Request-Id (per choice when it has several), else a fresh one
        request_id = request.request_id or engine_request_id() or uuid.uuid4().hex
        flavor = self.flavor
        retry = None
        if with_weights is not None:  # the engine may not hold the adapter: then send its weights

            def retry(sink: EngineStream, full: GenerationRequest = with_weights) -> int:
                return connection.start_call(STREAM_INFER, flavor.message(full, request_id), sink)

        stream = EngineStream(
            request,
            flavor.reader(request),
            request_id,
            connection.cancel,
            reading=connection,
            block=flavor.tokens_per_block,
            interval_s=self.stream_interval_s,
            pace=self.pace,
            ticket=STARTING.get(),
            retry=retry,
        )
        stream.started(
            connection.start_call(STREAM_INFER, flavor.message(request, request_id), stream),
            self.stream_timeout_s,
        )
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
