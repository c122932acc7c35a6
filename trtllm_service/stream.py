"""One generation request against Triton's `ensemble`: build the tensors, relay the gRPC stream.

Each request gets its own ModelStreamInfer stream and a uuid4 request id (postprocessing keys its
incremental detokenizer by it). Closing the relay at any point cancels the Triton request. Stop
strings are matched on text here, because a stop string has no unique token sequence; a match
ends the stream and cancels the engine request. Triton errors become `GenerationError`s with an
HTTP status: invalid arguments 400, an unavailable server 503, anything else 500.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
from tritonclient.utils import InferenceServerException

from trtllm_service.prompting import StopStringMatcher
from trtllm_service.sampling import SamplingParams

ENSEMBLE = "ensemble"
ENGINE = "tensorrt_llm"
OUTPUTS = ("text_output", "num_input_tokens", "num_output_tokens")

logger = logging.getLogger("trtllm_service.stream")


class GenerationError(Exception):
    """A request failed; `status` is the HTTP status that describes it best."""

    def __init__(self, status: int, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of generated text, with the engine's token count so far."""

    text: str
    completion_tokens: int
    finish_reason: str | None = None  # set on the last delta: "stop" or "length"


def _input(name: str, array: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), _TRITON_DTYPES[array.dtype.type])
    tensor.set_data_from_numpy(array)
    return tensor


_TRITON_DTYPES: dict[Any, str] = {
    np.object_: "BYTES",
    np.int32: "INT32",
    np.float32: "FP32",
    np.uint64: "UINT64",
    np.bool_: "BOOL",
}


def build_inputs(prompt: str, params: SamplingParams, max_tokens: int) -> list[grpcclient.InferInput]:
    """Ensemble inputs for one request (upstream names, `[1, 1]` scalars).

    OpenAI semantics for sampling: temperature defaults to 1 and samples from the whole
    distribution; temperature 0 is greedy. TRT-LLM decodes greedily when neither top_k nor top_p
    is set, so top_p = 1 is sent explicitly when sampling without either.
    """
    inputs = [
        _input("text_input", np.array([[prompt.encode("utf-8")]], dtype=np.object_)),
        _input("max_tokens", np.array([[max_tokens]], dtype=np.int32)),
        _input("stream", np.array([[True]], dtype=np.bool_)),
        _input("return_num_input_tokens", np.array([[True]], dtype=np.bool_)),
        _input("return_num_output_tokens", np.array([[True]], dtype=np.bool_)),
    ]
    temperature = 1.0 if params.temperature is None else params.temperature
    if temperature == 0.0:
        inputs.append(_input("top_k", np.array([[1]], dtype=np.int32)))
    else:
        inputs.append(_input("temperature", np.array([[temperature]], dtype=np.float32)))
        top_p = params.top_p if params.top_p is not None else (1.0 if not params.top_k else None)
        if params.top_k:
            inputs.append(_input("top_k", np.array([[params.top_k]], dtype=np.int32)))
        if top_p is not None:
            inputs.append(_input("top_p", np.array([[top_p]], dtype=np.float32)))
    if params.seed is not None:
        inputs.append(_input("random_seed", np.array([[params.seed % 2**64]], dtype=np.uint64)))
    for name, value in (
        ("repetition_penalty", params.repetition_penalty),
        ("presence_penalty", params.presence_penalty),
        ("frequency_penalty", params.frequency_penalty),
    ):
        if value is not None:
            inputs.append(_input(name, np.array([[value]], dtype=np.float32)))
    if params.min_tokens:
        inputs.append(_input("min_length", np.array([[params.min_tokens]], dtype=np.int32)))
    if params.ignore_eos:
        inputs.append(_input("end_id", np.array([[-1]], dtype=np.int32)))
    return inputs


INVALID_REQUEST_MARKER = "invalid request: "


def _error_from(exc: BaseException) -> GenerationError:
    """Maps Triton failures to HTTP statuses.

    In-stream model errors carry no gRPC status, only a message; our models start the message of
    a refused request with INVALID_REQUEST_MARKER.
    """
    if isinstance(exc, GenerationError):
        return exc
    if isinstance(exc, grpc.aio.AioRpcError):
        code, message = exc.code(), exc.details() or str(exc)
    elif isinstance(exc, InferenceServerException):
        message = exc.message() or str(exc)
        code = next((c for c in grpc.StatusCode if str(c) == (exc.status() or "")), grpc.StatusCode.UNKNOWN)
    else:
        return GenerationError(500, f"generation failed: {exc}")
    if INVALID_REQUEST_MARKER in message:
        return GenerationError(
            400, message[message.index(INVALID_REQUEST_MARKER) + len(INVALID_REQUEST_MARKER) :]
        )
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return GenerationError(400, message)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return GenerationError(503, f"the inference server is unavailable: {message}", code="unavailable")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return GenerationError(504, "the inference server did not answer in time", code="timeout")
    return GenerationError(500, f"inference server error: {message}", code="server_error")


class TritonStream:
    """Relays generation requests to Triton over gRPC streams."""

    def __init__(self, url: str, *, stream_timeout_s: float = 600.0) -> None:
        self.url = url
        self.stream_timeout_s = stream_timeout_s
        self._client: grpcclient_aio.InferenceServerClient | None = None
        self._background: set[asyncio.Task[None]] = set()

    def _get_client(self) -> grpcclient_aio.InferenceServerClient:
        if self._client is None:
            self._client = grpcclient_aio.InferenceServerClient(self.url)
        return self._client

    async def reset(self) -> None:
        """Drops the channel (after Triton restarted) so the next request reconnects."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def generate(
        self, prompt: str, params: SamplingParams, max_tokens: int, *, request_id: str | None = None
    ) -> AsyncGenerator[Delta, None]:
        """Streams text deltas; the last delta carries the finish reason.

        Empty deltas are not yielded, except the last one. Closing the iterator early (client
        disconnect) ends the Triton request (see `_stop_later`).
        """
        inputs = build_inputs(prompt, params, max_tokens)
        request_id = request_id or uuid.uuid4().hex
        outputs = [grpcclient.InferRequestedOutput(name) for name in OUTPUTS]

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": ENSEMBLE, "inputs": inputs, "outputs": outputs, "request_id": request_id}

        matcher = StopStringMatcher(params.stop) if params.stop else None
        responses = self._get_client().stream_infer(requests(), stream_timeout=self.stream_timeout_s)
        completion_tokens = 0
        finished = False
        reading: asyncio.Future[Any] | None = None
        try:
            while True:
                # Shielded: cancelling a pending read (the client went away) would cancel the RPC,
                # which Triton's ensemble never recovers from (see `_stop_later`).
                reading = asyncio.ensure_future(responses.__anext__())
                try:
                    result, error = await asyncio.shield(reading)
                except StopAsyncIteration:
                    break
                reading = None
                if error is not None:
                    raise _error_from(error)
                text = result.as_numpy("text_output").reshape(-1)[0].decode("utf-8")
                counts = result.as_numpy("num_output_tokens")
                if counts is not None:
                    completion_tokens = int(counts.reshape(-1)[0])
                final = result.get_response().parameters["triton_final_response"].bool_param
                if matcher is not None:
                    text, stopped = matcher.push(text)
                    if stopped:
                        yield Delta(text, completion_tokens, "stop")
                        return  # the engine request is stopped below
                    if final:
                        text += matcher.flush()
                if final:
                    finished = True
                    reason = "length" if completion_tokens >= max_tokens else "stop"
                    yield Delta(text, completion_tokens, reason)
                    return
                if text:
                    yield Delta(text, completion_tokens)
            raise GenerationError(503, "the inference server closed the stream early", code="unavailable")
        except (grpc.aio.AioRpcError, InferenceServerException) as exc:
            raise _error_from(exc) from None
        finally:
            if finished:
                responses.cancel()
            else:
                self._stop_later(request_id, responses, reading)

    def _stop_later(self, request_id: str, responses: Any, reading: asyncio.Future[Any] | None) -> None:
        """Ends the request in the background (a cancelled generator cannot await).

        The engine gets TRT-LLM's own signal, a `stop` request with the same request id, and the
        request's stream is then read up to its final response before it is closed. Cancelling
        the stream instead is no good: Triton's ensemble does not pass the cancellation to a step
        that is already running, and it never releases a request whose stream was cancelled while
        it was in flight (each one stays "in flight" until the server exits).
        """
        task = asyncio.get_running_loop().create_task(self._stop_engine(request_id, responses, reading))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _stop_engine(
        self, request_id: str, responses: Any, reading: asyncio.Future[Any] | None
    ) -> None:
        try:
            await self._send_stop(request_id)
            await asyncio.wait_for(_drain(responses, reading), STOP_DRAIN_TIMEOUT_S)
        except Exception as exc:  # best effort: Triton may be gone already
            logger.debug("ending request %s: %s", request_id, exc)
        finally:
            responses.cancel()

    async def _send_stop(self, request_id: str) -> None:
        inputs = [
            _input("input_ids", np.zeros((1, 1), dtype=np.int32)),
            _input("input_lengths", np.ones((1, 1), dtype=np.int32)),
            _input("request_output_len", np.ones((1, 1), dtype=np.int32)),
            _input("stop", np.ones((1, 1), dtype=np.bool_)),
        ]

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": ENGINE, "inputs": inputs, "request_id": request_id}

        try:
            responses = self._get_client().stream_infer(requests(), stream_timeout=10)
            async for _result, _error in responses:
                break
        except Exception as exc:  # best effort: Triton may be gone already
            logger.debug("stop request for %s failed: %s", request_id, exc)


STOP_DRAIN_TIMEOUT_S = 30.0
"""How long a stopped request's stream is read for its final response before it is cancelled."""


async def _drain(responses: Any, reading: asyncio.Future[Any] | None) -> None:
    """Reads a request's responses up to its final one (or an error, or the end of the stream),
    starting with the read that was pending when the request was given up, if any."""

    def last(result: Any, error: Any) -> bool:
        return error is not None or result.get_response().parameters["triton_final_response"].bool_param

    if reading is not None and last(*await reading):
        return
    async for result, error in responses:
        if last(result, error):
            return
