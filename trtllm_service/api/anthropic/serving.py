"""Anthropic's Messages API over the request path every endpoint shares (`api.generation`): a
message is one chat choice, generated like a chat completion's and written as Anthropic writes it
(`events.MessageBuilder`). Errors are answered in the service's shape here and turned into
Anthropic's by `server.error_shape` for every ``/v1/messages`` path.
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
from trtllm_service.api.generation.choices import Result, cached_tokens
from trtllm_service.api.generation.serving import EventAnswer, split_reasoning

if TYPE_CHECKING:
    from trtllm_service.api.generation.serving import GenerationServing


async def serve_messages(
    serving: GenerationServing, request: MessagesRequest, http_request: Request | None = None
) -> Response:
    """Answers ``POST /v1/messages``: a ``message`` object, or its event stream with ``stream``."""
    return await serving.serve_chat(request, http_request, MESSAGES_ROUTE, EFFORT_PARAM, MessageAnswer)


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


class MessageAnswer(EventAnswer):
    """How one message is written (`builder`: a `MessageBuilder`): a JSON ``message`` (`build`),
    streamed events, or events sent whole once the answer is known to be calls (`whole`)."""

    __slots__ = ()

    def new_builder(self, served: str) -> MessageBuilder:
        return MessageBuilder(self.request, served, self.prompt_tokens)

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

    def finish(self, reason: str, index: int) -> str:
        """The last events: held-back text, the open block's end, message_delta, message_stop."""
        stream = self.choices[0].stream
        return self.held_back() + self.builder.finish(
            reason,
            stream.completion_tokens,
            cached_tokens=cached_tokens(self.choices, 1),
            stop_sequence=getattr(stream, "stop_string", None),
        )

    def whole(self, results: list[Result]) -> str:
        """The events of a complete answer (after `opening`)."""
        return self.builder.whole(self.build(results, cached_tokens(self.choices, 1)))
