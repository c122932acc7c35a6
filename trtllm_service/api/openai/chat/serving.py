"""``POST /v1/chat/completions``: a chat completion, as one JSON body or OpenAI's chunk stream."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from trtllm_service.api.generation.choices import Choice, Result, cached_tokens
from trtllm_service.api.generation.serving import split_reasoning
from trtllm_service.api.generation.sse_frames import SSE_HEADERS, sse_body, whole_frames
from trtllm_service.api.openai.chat.protocol import (
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from trtllm_service.api.openai.protocol import FunctionCall, ToolCall, new_id
from trtllm_service.api.openai.sse import SSE_DONE, ChatChunkEncoder, error_frame
from trtllm_service.api.openai.usage import usage_frame, usage_info
from trtllm_service.api.server.streaming import StreamBody
from trtllm_service.chat import tool_calls
from trtllm_service.chat.reasoning import ReasoningSplitter
from trtllm_service.relay.logprobs import TokenLogprob, chat_logprobs

if TYPE_CHECKING:
    from trtllm_service.api.generation.serving import GenerationServing
    from trtllm_service.api.server.metrics import RequestMetrics

CHAT_ROUTE = "/v1/chat/completions"


async def serve_chat(
    serving: GenerationServing, request: ChatCompletionRequest, http_request: Request | None = None
) -> Response:
    """Answers a chat completion request (a JSON response, or an SSE stream when ``stream`` is set)."""
    return await serving.serve_chat(request, http_request, CHAT_ROUTE, "reasoning_effort", ChatAnswer)


class ChatAnswer:
    """How one chat completion's choices are written: a JSON body (`build`), streamed chunks
    (`delta`, `finish`), or a stream sent whole once the answer is known to be calls (`whole`).

    Args:
        request: The validated request.
        served: The model id the answer names.
        choices: The started choices (`keep_best` may narrow the list in place before `build`).
        prompt_tokens: The prompt's length in tokens.
        serving: Its serving object: the model's reasoning parser, the token texts of log probs.
    """

    __slots__ = (
        "choices",
        "encoder",
        "prompt_tokens",
        "request",
        "served",
        "splitters",
        "style",
        "texts",
        "top",
    )

    def __init__(
        self,
        request: ChatCompletionRequest,
        served: str,
        choices: list[Choice],
        prompt_tokens: int,
        serving: GenerationServing,
    ) -> None:
        self.request = request
        self.served = served
        self.choices = choices
        self.prompt_tokens = prompt_tokens
        style = self.style = serving.reasoning
        self.encoder = ChatChunkEncoder(
            new_id("chatcmpl"),
            served,
            include_usage=request.include_usage,
            service_tier=request.answered_tier,
        )
        self.top = request.logprob_count
        self.texts = serving.runtime.token_texts if self.top is not None else None
        self.splitters = {c.index: ReasoningSplitter(style) for c in choices} if style is not None else None

    def answer(self, result: Result) -> tuple[ChatCompletionMessage, str]:
        """The message of a finished choice and its finish reason: its reasoning apart, then its
        calls when tools are in play and it made some."""
        thought, content = split_reasoning(self.style, result.text)
        calls = self.request.calls_in(content or "")
        if not calls:
            message = ChatCompletionMessage(content=content, reasoning_content=thought, reasoning=thought)
            return message, result.finish_reason
        made = [
            ToolCall(id=tool_calls.new_call_id(), function=FunctionCall(name=n, arguments=a))
            for n, a in calls
        ]
        message = ChatCompletionMessage(
            content=None, tool_calls=made, reasoning_content=thought, reasoning=thought
        )
        return message, "tool_calls"

    def build(self, results: list[Result], cached: int) -> ChatCompletionResponse:
        """The JSON body."""
        texts, top = self.texts, self.top
        answers = [self.answer(result) for result in results]
        return ChatCompletionResponse(
            model=self.served,
            choices=[
                ChatCompletionChoice(
                    index=choice.index,
                    message=message,
                    finish_reason=finish,  # type: ignore[arg-type]  # the engine ends with one of FinishReason
                    logprobs=chat_logprobs(result.logprobs, texts, top) if texts is not None else None,  # type: ignore[arg-type]  # top is set when texts is
                )
                for choice, result, (message, finish) in zip(self.choices, results, answers, strict=True)
            ],
            usage=usage_info(self.prompt_tokens, results, cached),
            service_tier=self.request.answered_tier,
        )

    def delta(self, text: str, index: int, entries: list[TokenLogprob]) -> str:
        """A streamed text chunk (per token: the hot path)."""
        texts = self.texts
        logprobs = chat_logprobs(entries, texts, self.top) if texts is not None else None  # type: ignore[arg-type]  # top is set when texts is
        if self.splitters is not None:
            thought, text = self.splitters[index].push(text)
            return self.encoder.parts(text, thought, index, logprobs)
        if logprobs is None:
            return self.encoder.content(text, index)
        return self.encoder.content_logprobs(text, index, logprobs)

    def finish(self, reason: str, index: int) -> str:
        """A choice's last chunks: a reasoning tag it ended in the middle of, its finish reason."""
        if self.splitters is None:
            return self.encoder.finish(reason, index)
        thought, text = self.splitters[index].flush()
        return self.encoder.parts(text, thought, index) + self.encoder.finish(reason, index)

    def stream(self, metrics: RequestMetrics) -> Response:
        """The chunk stream: each choice's role, its text as it arrives, its finish; the usage."""
        return sse_body(
            self.choices,
            [self.encoder.role(choice.index) for choice in self.choices],
            self.delta,
            self.finish,
            usage_frame(self.request, self.encoder, self.choices, self.prompt_tokens),
            metrics,
            self.prompt_tokens,
            failure_frame=error_frame,
            done=SSE_DONE,
        )

    def stream_whole(self, metrics: RequestMetrics) -> Response:
        """The stream of an answer that may be calls: each choice sent whole (`whole`) once complete."""
        frames = whole_frames(
            self.choices, self.whole, metrics, self.prompt_tokens, failure_frame=error_frame
        )
        return StreamBody(frames, "text/event-stream", SSE_HEADERS)

    def whole(self, results: list[Result]) -> str:
        """A streamed answer sent when complete: as OpenAI streams it (role, the reasoning, then
        its content or one piece per call, then the finish reason)."""
        encoder, frames = self.encoder, []
        for choice, result in zip(self.choices, results, strict=True):
            message, reason = self.answer(result)
            index = choice.index
            frames.append(encoder.role(index))
            if message.reasoning_content:
                frames.append(encoder.parts("", message.reasoning_content, index))
            for position, call in enumerate(message.tool_calls or ()):
                fn = call.function
                frames.append(encoder.tool_call(position, call.id, fn.name, fn.arguments, index))
            if message.content:
                frames.append(encoder.content(message.content, index))
            frames.append(encoder.finish(reason, index))
        if self.request.include_usage:
            tokens = sum(r.completion_tokens for r in results)
            frames.append(
                encoder.usage(self.prompt_tokens, tokens, cached_tokens(self.choices, len(self.choices)))
            )
        return "".join(frames) + SSE_DONE
