"""Anthropic's Messages API over the request path every endpoint shares (`api.generation`): a
message is one chat choice, generated like a chat completion's and written as Anthropic writes it
(`events.MessageBuilder`). Errors are answered in the service's shape here and turned into
Anthropic's by `api.error_shape` for every ``/v1/messages`` path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from trtllm_service.api.anthropic.events import MessageBuilder, count_tokens_body
from trtllm_service.api.anthropic.protocol import (
    EFFORT_PARAM,
    MESSAGES_ROUTE,
    CountTokensRequest,
    MessagesRequest,
)
from trtllm_service.api.choices import Choice, Result, cached_tokens
from trtllm_service.api.generation import split_reasoning
from trtllm_service.api.sse_frames import SSE_HEADERS, plainly_text, sse_body, whole_frames
from trtllm_service.api.streaming import StreamBody
from trtllm_service.chat.reasoning import ReasoningSplitter, ReasoningStyle
from trtllm_service.relay.logprobs import TokenLogprob

if TYPE_CHECKING:
    from trtllm_service.api.generation import GenerationServing


async def serve_messages(
    serving: GenerationServing, request: MessagesRequest, http_request: Request | None = None
) -> Response:
    """Answers ``POST /v1/messages``: a ``message`` object, or its event stream with ``stream``."""
    started = await serving.start_chat(request, MESSAGES_ROUTE, EFFORT_PARAM)
    if isinstance(started, Response):
        return started
    served, metrics, prepared, choices = started
    answer = MessageAnswer(request, served, choices, prepared.prompt_tokens, serving.reasoning)
    builder = answer.builder
    if (
        request.stream
        and request.tool_mode
        and (answer.style or not await plainly_text(choices, request.tool_mode))
    ):
        # Whether the answer is calls is known at its end: the stream sends it whole.
        frames = whole_frames(
            choices,
            answer.whole,
            metrics,
            answer.prompt_tokens,
            head=builder.opening(),
            failure_frame=builder.failure,
        )
        return StreamBody(frames, "text/event-stream", SSE_HEADERS)  # type: ignore[return-value]

    def stream() -> Response:
        return sse_body(
            choices,
            [builder.opening()],
            answer.delta,
            answer.finish,
            None,
            metrics,
            answer.prompt_tokens,
            failure_frame=builder.failure,
            done="",
        )

    return await serving.respond(
        request, choices, http_request, stream, answer.build, metrics, answer.prompt_tokens
    )


async def count_message_tokens(serving: GenerationServing, request: CountTokensRequest) -> dict[str, Any]:
    """``POST /v1/messages/count_tokens``: the prompt tokens a create call with the same system,
    messages and tools reports as its input (the same chat template, the same tokenizer)."""
    serving.runtime.adapter(request.model)
    runtime = serving.runtime
    effort = request.reasoning_effort if runtime.formatter.takes_reasoning_effort else None
    count = await runtime.count_chat_tokens(
        request.chat_messages(), tools=request.functions() or None, reasoning_effort=effort
    )
    return count_tokens_body(count)


class MessageAnswer:
    """How one message is written: a JSON ``message`` (`build`), streamed events (`delta`,
    `finish`), or events sent whole once the answer is known to be calls (`whole`).

    Args:
        request: The validated request.
        served: The model id the answer names.
        choices: Its one started choice.
        prompt_tokens: The prompt's length in tokens.
        style: The model's reasoning parser, if any (its thinking becomes a thinking block).
    """

    __slots__ = ("builder", "choices", "prompt_tokens", "request", "splitter", "style")

    def __init__(
        self,
        request: MessagesRequest,
        served: str,
        choices: list[Choice],
        prompt_tokens: int,
        style: ReasoningStyle | None,
    ) -> None:
        self.request = request
        self.choices = choices
        self.prompt_tokens = prompt_tokens
        self.style = style
        self.builder = MessageBuilder(request, served, prompt_tokens)
        self.splitter = ReasoningSplitter(style) if style is not None else None

    def _parts(self, result: Result) -> tuple[str | None, str | None, list[tuple[str, str]] | None]:
        """A finished answer's thinking, text and calls."""
        thought, content = split_reasoning(self.style, result.text)
        return thought, content, self.request.calls_in(content or "")

    def build(self, results: list[Result], cached: int) -> dict[str, Any]:
        """The JSON ``message``."""
        result = results[0]
        return self.builder.message(
            *self._parts(result),
            result.finish_reason,
            result.completion_tokens,
            cached_tokens=cached,
            stop_sequence=result.stop_string,
        )

    def delta(self, text: str, index: int, entries: list[TokenLogprob]) -> str:
        """The events of streamed text (per token: the hot path)."""
        splitter = self.splitter
        if splitter is None:
            return self.builder.write("", text)
        return self.builder.write(*splitter.push(text))

    def finish(self, reason: str, index: int) -> str:
        """The last events: held-back text, the open block's end, message_delta, message_stop."""
        frames = self.builder.write(*self.splitter.flush()) if self.splitter is not None else ""
        stream = self.choices[0].stream
        return frames + self.builder.finish(
            reason,
            stream.completion_tokens,
            cached_tokens=cached_tokens(self.choices, 1),
            stop_sequence=getattr(stream, "stop_string", None),
        )

    def whole(self, results: list[Result]) -> str:
        """The events of a complete answer (after `opening`)."""
        return self.builder.whole(self.build(results, cached_tokens(self.choices, 1)))
