"""The OpenAI API's logic: a validated request -> engine requests -> a JSON or SSE response.

One engine request per choice: chat runs its one prompt ``n`` times, completions run every prompt ``n``
times (choice index ``prompt_index * n + i``). All of a response's engine requests run concurrently, and
every one of them has received its first delta before the response starts, so errors found by the
engine (not ready, invalid arguments) are answered as JSON with their status, never inside a 200 stream.

Streaming writes SSE frames with the pre-encoded chunk encoders of ``sse``: per token one string
format, no pydantic. A failure after the stream started becomes one error frame and the stream ends.
Closing a response (client disconnect, or an error) closes every delta stream, which stops the engine
requests.

Seeds: with a ``seed``, choice ``i`` of a prompt samples with ``seed + i``, so the choices differ and the
response is reproducible. Without one, each sampled choice gets a fresh random seed, so choices and
repeated requests are independent whatever seed the engine falls back to when none is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from trtllm_service.openai.errors import APIError, from_generation_error
from trtllm_service.openai.protocol import (
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    UsageInfo,
    new_id,
)
from trtllm_service.openai.sse import SSE_DONE, ChatChunkEncoder, CompletionChunkEncoder, error_frame
from trtllm_service.runtime import ContextLengthError, PreparedRequest, first_and_rest
from trtllm_service.sampling import SamplingParams
from trtllm_service.stream import Delta, GenerationError

if TYPE_CHECKING:
    from trtllm_service.runtime import Runtime

logger = logging.getLogger("trtllm_service.openai")

_UINT64_MASK = (1 << 64) - 1
_INLINE_PROMPT_CHARS = 8192
"""Prompts up to this many characters (in all) are templated and counted on the event loop; longer
ones in a worker thread, so one large request cannot stall the streams of others."""

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}

DeltaStream = AsyncGenerator[Delta, None]


@dataclass(frozen=True, slots=True)
class _Choice:
    """One engine request of a response."""

    index: int
    request: PreparedRequest
    params: SamplingParams
    echo: str = ""  # completions with echo: the prompt, sent before the generated text


@dataclass(frozen=True, slots=True)
class _Started:
    """A choice whose engine request has produced its first delta."""

    choice: _Choice
    first: Delta
    rest: DeltaStream


@dataclass(slots=True)
class _Result:
    """A finished choice of a non-streamed response."""

    text: str
    completion_tokens: int
    finish_reason: str


def error_response(error: APIError) -> JSONResponse:
    """The JSON answer of an error, with its status and headers."""
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


class SSEResponse(StreamingResponse):
    """An event stream that always closes its source, so the engine requests behind it stop.

    Starlette already cancels the stream when the client disconnects; closing the generator here as
    well covers every other way out (a failed send, a server shutdown).
    """

    def __init__(self, frames: AsyncGenerator[str, None]) -> None:
        super().__init__(frames, media_type="text/event-stream", headers=SSE_HEADERS)
        self._frames = frames

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._frames.aclose()


class OpenAIServing:
    """Serves ``/v1/models``, ``/v1/chat/completions`` and ``/v1/completions`` from a ``Runtime``.

    Args:
        runtime: The service's runtime: tokenizer, chat template, context length and the engine relay.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.model_name = runtime.model_name
        self._created = int(time.time())

    # ---- models ----------------------------------------------------------------------------------------

    def model_card(self) -> ModelCard:
        return ModelCard(id=self.model_name, created=self._created, max_model_len=self.runtime.max_seq_len)

    def list_models(self) -> ModelList:
        return ModelList(data=[self.model_card()])

    def check_model(self, model: str | None) -> None:
        """Raises a 404 unless ``model`` is the served model (or omitted)."""
        if model is not None and model != self.model_name:
            raise APIError.model_not_found(model)

    # ---- chat ------------------------------------------------------------------------------------------

    async def chat(self, request: ChatCompletionRequest, http_request: Request | None = None) -> Response:
        """Answers a chat completion request (a JSON response, or an SSE stream when ``stream`` is set)."""
        try:
            self.check_model(request.model)
            messages = request.chat_messages()
            size = sum(len(m["content"]) for m in messages)
            prepared = await self._maybe_in_thread(size, self._prepare_chat, messages, request.max_new_tokens)
            choices = self._choices([prepared], request.sampling_params(), request.n)
            started = await self._start(choices)
        except APIError as exc:
            return error_response(exc)
        encoder = ChatChunkEncoder(new_id("chatcmpl"), self.model_name, include_usage=request.include_usage)

        def build(results: list[Any]) -> ChatCompletionResponse:
            return ChatCompletionResponse(
                model=self.model_name,
                choices=[
                    ChatCompletionChoice(
                        index=choice.index,
                        message=ChatCompletionMessage(content=result.text),
                        finish_reason=result.finish_reason,  # type: ignore[arg-type]
                    )
                    for choice, result in zip(choices, results, strict=True)
                ],
                usage=_usage(prepared.prompt_tokens, results),
            )

        opening = [encoder.role(choice.index) for choice in choices]
        return await self._respond(
            request, started, http_request, encoder, opening, encoder.content, prepared.prompt_tokens, build
        )

    def _prepare_chat(self, messages: list[dict[str, str]], max_tokens: int | None) -> PreparedRequest:
        try:
            prompt = self.runtime.formatter.render(messages)
        except ValueError as exc:
            raise APIError.bad_request(str(exc), param="messages") from None
        return self._prepare(prompt, max_tokens, "messages")

    # ---- completions -----------------------------------------------------------------------------------

    async def completions(self, request: CompletionRequest, http_request: Request | None = None) -> Response:
        """Answers a text completion request: no chat template; each prompt gets ``n`` choices."""
        try:
            self.check_model(request.model)
            prompts = request.prompts()
            size = sum(len(p) for p in prompts)
            prepared = await self._maybe_in_thread(
                size, self._prepare_prompts, prompts, request.max_new_tokens
            )
            choices = self._choices(prepared, request.sampling_params(), request.n)
            if request.echo:
                choices = [replace(c, echo=prompts[c.index // request.n]) for c in choices]
            started = await self._start(choices)
        except APIError as exc:
            return error_response(exc)
        usage_prompt = sum(p.prompt_tokens for p in prepared)
        encoder = CompletionChunkEncoder(new_id("cmpl"), self.model_name, include_usage=request.include_usage)

        def build(results: list[Any]) -> CompletionResponse:
            return CompletionResponse(
                model=self.model_name,
                choices=[
                    CompletionChoice(
                        index=choice.index,
                        text=choice.echo + result.text,
                        finish_reason=result.finish_reason,  # type: ignore[arg-type]
                    )
                    for choice, result in zip(choices, results, strict=True)
                ],
                usage=_usage(usage_prompt, results),
            )

        opening = [encoder.text(c.echo, c.index) for c in choices if c.echo]
        return await self._respond(
            request, started, http_request, encoder, opening, encoder.text, usage_prompt, build
        )

    async def _respond(
        self,
        request: ChatCompletionRequest | CompletionRequest,
        started: Any,
        http_request: Request | None,
        encoder: ChatChunkEncoder | CompletionChunkEncoder,
        opening: list[str],
        delta: Callable[[str, int], str],
        usage_prompt: int,
        build: Callable[[list[Any]], BaseModel],
    ) -> Response:
        """An SSE stream of chunks, or one JSON body built from all results, for either endpoint."""
        if request.stream:
            usage = (lambda tokens: encoder.usage(usage_prompt, tokens)) if request.include_usage else None
            return SSEResponse(_sse_frames(started, opening, delta, encoder.finish, usage))
        results = await self._collect_all(started, http_request)
        if isinstance(results, Response):
            return results
        return JSONResponse(build(results).model_dump(mode="json"))

    def _prepare_prompts(self, prompts: list[str], max_tokens: int | None) -> list[PreparedRequest]:
        bos = getattr(self.runtime.tokenizer, "bos_token", None)
        prepared = []
        for i, prompt in enumerate(prompts):
            if not prompt:
                # OpenAI completes an empty prompt from the start of a document; so do we, where the
                # tokenizer has a BOS token (the engine needs at least one token).
                if not bos:
                    where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
                    raise APIError.bad_request("The prompt must not be empty.", param=where)
                prompt = bos
            prepared.append(self._prepare(prompt, max_tokens, "prompt"))
        return prepared

    # ---- shared ----------------------------------------------------------------------------------------

    def _prepare(self, prompt: str, max_tokens: int | None, param: str) -> PreparedRequest:
        try:
            return self.runtime.prepare(prompt, max_tokens)
        except ContextLengthError as exc:
            raise APIError.context_length_exceeded(
                exc.max_len, exc.prompt_tokens, exc.completion_tokens, param=param
            ) from None

    @staticmethod
    async def _maybe_in_thread(size: int, fn: Callable[..., Any], *args: Any) -> Any:
        if size <= _INLINE_PROMPT_CHARS:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

    @staticmethod
    def _choices(prepared: Sequence[PreparedRequest], params: SamplingParams, n: int) -> list[_Choice]:
        """``n`` engine requests per prompt, each with its own seed (see the module docstring)."""
        greedy = params.temperature == 0
        choices = []
        for p, request in enumerate(prepared):
            for i in range(n):
                if greedy:
                    seeded = params
                elif params.seed is not None:
                    seeded = replace(params, seed=(params.seed + i) & _UINT64_MASK)
                else:
                    seeded = replace(params, seed=secrets.randbits(63))
                choices.append(_Choice(p * n + i, request, seeded))
        return choices

    async def _start(self, choices: list[_Choice]) -> list[_Started]:
        """Starts every engine request and waits for each first delta; on any failure stops them all."""
        streams: list[DeltaStream] = []
        try:
            for choice in choices:
                streams.append(self.runtime.stream(choice.request, choice.params))
        except GenerationError as exc:
            await _close_all(streams)
            raise from_generation_error(exc) from None
        outcomes = await asyncio.gather(*(first_and_rest(s) for s in streams), return_exceptions=True)
        failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failure is None:
            return [
                _Started(choice, first, rest)
                for choice, (first, rest) in zip(choices, outcomes, strict=True)  # type: ignore[misc]
            ]
        await _close_all(streams)
        raise _api_error(failure)

    async def _collect_all(
        self, started: list[_Started], http_request: Request | None
    ) -> list[_Result] | Response:
        """Reads every choice to its end; stops them all when one fails or the client goes away."""
        tasks = [asyncio.ensure_future(_collect(s)) for s in started]
        watcher = asyncio.ensure_future(_disconnected(http_request)) if http_request is not None else None
        pending: set[asyncio.Future[Any]] = set(tasks)
        if watcher is not None:
            pending.add(watcher)
        try:
            while True:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in tasks:
                    if task in done and task.exception() is not None:
                        return error_response(_api_error(task.exception()))  # type: ignore[arg-type]
                if all(task.done() for task in tasks):
                    return [task.result() for task in tasks]
                if watcher is not None and watcher in done and watcher.exception() is None:
                    return Response(status_code=499)  # the client is gone: nobody reads the answer
        finally:
            if watcher is not None:
                watcher.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _usage(prompt_tokens: int, results: Sequence[_Result]) -> UsageInfo:
    completion_tokens = sum(r.completion_tokens for r in results)
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )


def _api_error(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, GenerationError):
        return from_generation_error(exc)
    logger.error("OpenAI request failed", exc_info=exc)
    return APIError.internal()


def _ended_early() -> GenerationError:
    return GenerationError(503, "the inference server closed the stream early", code="unavailable")


async def _close_all(streams: Sequence[DeltaStream]) -> None:
    for stream in streams:
        with contextlib.suppress(Exception):
            await stream.aclose()


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone away (the request body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _collect(started: _Started) -> _Result:
    """Reads one choice to its end."""
    delta, rest = started.first, started.rest
    parts = [delta.text]
    try:
        while delta.finish_reason is None:
            try:
                delta = await anext(rest)
            except StopAsyncIteration:
                raise _ended_early() from None
            parts.append(delta.text)
    finally:
        await rest.aclose()
    return _Result("".join(parts), delta.completion_tokens, delta.finish_reason)


async def _sse_frames(
    started: list[_Started],
    opening: list[str],
    text_frame: Callable[[str, int], str],
    finish_frame: Callable[[str, int], str],
    usage_frame: Callable[[int], str] | None,
) -> AsyncGenerator[str, None]:
    """The SSE frames of a streamed response: opening frames, text and finish chunks, usage, [DONE].

    One choice is relayed directly (the common, hot case); several are merged as their deltas come.
    """
    merged: AsyncGenerator[tuple[int, Delta], None] | None = None
    try:
        for frame in opening:
            yield frame
        if len(started) == 1:
            only = started[0]
            index, delta, rest = only.choice.index, only.first, only.rest
            while True:
                if delta.text:
                    yield text_frame(delta.text, index)
                if delta.finish_reason is not None:
                    break
                try:
                    delta = await anext(rest)
                except StopAsyncIteration:
                    raise _ended_early() from None
            yield finish_frame(delta.finish_reason, index)
            completion_tokens = delta.completion_tokens
        else:
            completion_tokens = 0
            merged = _merged(started)
            async for index, delta in merged:
                if delta.text:
                    yield text_frame(delta.text, index)
                if delta.finish_reason is not None:
                    yield finish_frame(delta.finish_reason, index)
                    completion_tokens += delta.completion_tokens
        if usage_frame is not None:
            yield usage_frame(completion_tokens)
        yield SSE_DONE
    except Exception as exc:  # the 200 status is sent already: report in the stream, then end it
        yield error_frame(_api_error(exc))
    finally:
        if merged is not None:
            await merged.aclose()  # stops its pumps first, so that no stream is still being read
        await _close_all([s.rest for s in started])


async def _merged(started: list[_Started]) -> AsyncGenerator[tuple[int, Delta], None]:
    """Deltas of several choices as they arrive, each choice's in order, until all have finished."""
    queue: asyncio.Queue[tuple[int, Delta | BaseException]] = asyncio.Queue()

    async def pump(item: _Started) -> None:
        index, delta, rest = item.choice.index, item.first, item.rest
        try:
            while True:
                queue.put_nowait((index, delta))
                if delta.finish_reason is not None:
                    return
                try:
                    delta = await anext(rest)
                except StopAsyncIteration:
                    raise _ended_early() from None
        except Exception as exc:
            queue.put_nowait((index, exc))
        finally:
            await rest.aclose()

    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(pump(item)) for item in started]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item.finish_reason is not None:
                remaining -= 1
            yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
