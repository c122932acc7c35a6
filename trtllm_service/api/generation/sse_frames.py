"""The SSE body of a streamed answer, for every generation endpoint: its frames come from the
endpoint (an OpenAI chunk encoder, the Responses API's or Anthropic's event writer), the plumbing is
here.

Each write carries all the text the relay received since the previous one (so a client that is
behind gets fewer, larger events), and the first text is sent as soon as it exists. A failure after
the stream started becomes one error frame and the stream ends. However the response ends
(finished, failed, client gone), every engine request behind it is closed, which cancels the
unfinished ones.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from starlette.responses import Response

from trtllm_service.api.generation.choices import Choice, Result, api_error, collect_all, finish_label
from trtllm_service.api.server.metrics import RequestMetrics
from trtllm_service.api.server.streaming import PushBody, StreamBody
from trtllm_service.errors import APIError
from trtllm_service.relay.logprobs import TokenLogprob

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
TextFrame = Callable[[str, int, list[TokenLogprob]], str]
"""A streamed choice's text chunk: (new text, choice index, the log probs of its tokens) -> frame."""


def sse_body(
    choices: list[Choice],
    opening: list[str],
    text_frame: TextFrame,
    finish_frame: Callable[[str, int], str],
    usage_frame: Callable[[int], str] | None,
    metrics: RequestMetrics,
    prompt_tokens: int,
    *,
    failure_frame: Callable[[APIError], str],
    done: str,
) -> Response:
    """The SSE response of a streamed answer: opening frames, text and finish chunks, usage, `done`;
    a failure after the start is `failure_frame` and the end of the stream.

    One choice (the common, hot case) is pushed: its text is framed and written as it arrives
    (`PushBody`). Several are merged as their text comes, by a generator. A text frame may be empty
    (text held back, say the start of a reasoning tag): nothing is written.
    """
    frames = Frames("".join(opening), text_frame, finish_frame, usage_frame, failure_frame, done)
    if len(choices) == 1:
        framing = SSEFraming(choices[0], frames, metrics, prompt_tokens)
        return PushBody(choices[0].stream, framing, "text/event-stream", SSE_HEADERS)  # type: ignore[arg-type]  # not a Beam: beams never stream (Flavor.check_engine_features)
    merged = _merged_frames(choices, frames, metrics, prompt_tokens)
    return StreamBody(merged, "text/event-stream", SSE_HEADERS)


@dataclass(frozen=True, slots=True)
class Frames:
    """How an endpoint writes a streamed answer's SSE frames."""

    head: str
    text: TextFrame
    finish: Callable[[str, int], str]
    usage: Callable[[int], str] | None
    failure: Callable[[APIError], str]
    done: str


class SSEFraming:
    """The SSE frames of one streamed choice, for `PushBody`."""

    __slots__ = ("choice", "frames", "metrics", "prompt_tokens", "stream")

    def __init__(self, choice: Choice, frames: Frames, metrics: RequestMetrics, prompt_tokens: int) -> None:
        self.choice = choice
        self.stream = choice.stream
        self.frames = frames
        self.metrics = metrics
        self.prompt_tokens = prompt_tokens

    @property
    def waiting(self) -> bool:
        return self.choice.waiting

    def first(self, text: str) -> None:
        self.choice.first, self.choice.waiting = text, False
        self.metrics.first_token()

    def opening(self) -> bytes:
        text, head = self.choice.first, self.frames.head
        if not text:
            return head.encode()
        return (head + self.frames.text(text, self.choice.index, self.stream.take_logprobs())).encode()

    def frame(self, text: str) -> bytes:
        return self.frames.text(text, self.choice.index, self.stream.take_logprobs()).encode()

    def closing(self) -> bytes:
        stream, index, frames = self.stream, self.choice.index, self.frames
        rest = stream.take_logprobs()  # tokens whose text never showed (a stop string's, say)
        tail = (frames.text("", index, rest) if rest else "") + frames.finish(
            stream.finish_reason or "stop", index
        )
        if frames.usage is not None:
            tail += frames.usage(stream.completion_tokens)
        return (tail + frames.done).encode()

    def failure(self, error: Exception) -> tuple[int, bytes | None]:
        reported = api_error(error)
        return reported.status, self.frames.failure(reported).encode()

    def done(self, status: int) -> None:
        stream = self.stream
        stream.close()
        reason = finish_label([Result("", 0, stream.finish_reason or "stop")]) if status == 200 else None
        self.metrics.done(status, reason, self.prompt_tokens, stream.completion_tokens)


async def _merged_frames(
    choices: list[Choice], frames: Frames, metrics: RequestMetrics, prompt_tokens: int
) -> AsyncGenerator[bytes, None]:
    """The SSE frames of several streamed choices, merged as their text comes (see `sse_body`)."""
    status, reason = 499, None  # the client went away, unless the stream ends or fails
    merged = _merged(choices)
    try:
        if frames.head:
            yield frames.head.encode()
        async for index, text, finish, logprobs in merged:
            frame = frames.text(text, index, logprobs) if text or logprobs else ""
            if finish is not None:
                frame += frames.finish(finish, index)
            if frame:
                yield frame.encode()
        tail = "" if frames.usage is None else frames.usage(sum(c.stream.completion_tokens for c in choices))
        yield (tail + frames.done).encode()
        status = 200
        reason = finish_label([Result("", 0, c.stream.finish_reason or "stop") for c in choices])
    except Exception as exc:  # the 200 status is sent already: report in the stream, then end it
        error = api_error(exc)
        status = error.status
        yield frames.failure(error).encode()
    finally:
        await merged.aclose()  # stops its pumps first, so that no stream is still being read
        for choice in choices:
            choice.stream.close()
        metrics.done(status, reason, prompt_tokens, sum(c.stream.completion_tokens for c in choices))


async def plainly_text(choices: list[Choice], mode: str | None) -> bool:
    """Whether a streamed answer with tools in play can be streamed as text at once: one choice,
    `auto`, and its first visible character starts no JSON (a call starts with `{` or `[`)."""
    if mode != "auto" or len(choices) != 1:
        return False
    choice = choices[0]
    stream = choice.stream
    try:
        while not choice.first.strip() and stream.finish_reason is None:
            choice.first += await stream.read()
    except Exception:
        return False  # the buffered path reports the failure
    return not choice.first.lstrip().startswith(("{", "["))


async def whole_frames(
    choices: list[Choice],
    render: Callable[[list[Result]], str],
    metrics: RequestMetrics,
    prompt_tokens: int,
    *,
    head: str = "",
    failure_frame: Callable[[APIError], str],
) -> AsyncGenerator[bytes, None]:
    """The SSE frames of an answer that may be tool calls (known only at its end): `head` at once,
    then every choice read to its end and sent by `render`; a failure is `failure_frame`."""
    status, reason, tokens = 499, None, 0
    try:
        if head:
            yield head.encode()
        results = await collect_all(choices, None)
        assert results is not None
        tokens = sum(r.completion_tokens for r in results)
        yield render(results).encode()
        status, reason = 200, finish_label(results)
    except Exception as exc:  # the 200 status is sent already: report in the stream, then end it
        error = api_error(exc)
        status = error.status
        yield failure_frame(error).encode()
    finally:
        for choice in choices:
            choice.stream.close()
        metrics.done(status, reason, prompt_tokens, tokens)


async def _merged(
    choices: list[Choice],
) -> AsyncGenerator[tuple[int, str, str | None, list[TokenLogprob]], None]:
    """(index, text, finish reason, log probs) of several choices as their text arrives, until all
    have finished."""
    queue: asyncio.Queue[tuple[int, str, str | None, list[TokenLogprob]] | BaseException] = asyncio.Queue()

    async def pump(choice: Choice) -> None:
        stream = choice.stream
        try:
            text = choice.first
            while True:
                queue.put_nowait((choice.index, text, stream.finish_reason, stream.take_logprobs()))
                if stream.finish_reason is not None:
                    return
                text = await stream.read()
        except Exception as exc:
            queue.put_nowait(exc)

    tasks = [asyncio.ensure_future(pump(choice)) for choice in choices]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item[2] is not None:
                remaining -= 1
            yield item
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
