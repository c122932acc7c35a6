"""``POST /v1/chat/completions``: a chat completion, as one JSON body or OpenAI's chunk stream."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from trtllm_service.api.choices import Result, cached_tokens
from trtllm_service.api.generation import split_reasoning
from trtllm_service.api.openai.chat.protocol import (
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from trtllm_service.api.openai.protocol import FunctionCall, ToolCall, new_id
from trtllm_service.api.openai.sse import SSE_DONE, ChatChunkEncoder, error_frame
from trtllm_service.api.openai.usage import usage_frame, usage_info
from trtllm_service.api.sse_frames import SSE_HEADERS, plainly_text, sse_body, whole_frames
from trtllm_service.api.streaming import StreamBody
from trtllm_service.chat import tool_calls
from trtllm_service.chat.reasoning import ReasoningSplitter
from trtllm_service.relay.logprobs import TokenLogprob, chat_logprobs

if TYPE_CHECKING:
    from trtllm_service.api.generation import GenerationServing

CHAT_ROUTE = "/v1/chat/completions"


async def serve_chat(
    serving: GenerationServing, request: ChatCompletionRequest, http_request: Request | None = None
) -> Response:
    """Answers a chat completion request (a JSON response, or an SSE stream when ``stream`` is set)."""
    started = await serving.start_chat(request, CHAT_ROUTE, "reasoning_effort")
    if isinstance(started, Response):
        return started
    served, metrics, prepared, choices = started
    encoder = ChatChunkEncoder(new_id("chatcmpl"), served, include_usage=request.include_usage)
    prompt_tokens = prepared.prompt_tokens
    style = serving.reasoning

    def answer(result: Result) -> tuple[ChatCompletionMessage, str]:
        """The message of a finished choice: its reasoning apart, then its calls when tools are
        in play and it made some."""
        thought, content = split_reasoning(style, result.text)
        calls = request.calls_in(content or "")
        if not calls:
            return ChatCompletionMessage(
                content=content, reasoning_content=thought, reasoning=thought
            ), result.finish_reason
        made = [
            ToolCall(id=tool_calls.new_call_id(), function=FunctionCall(name=n, arguments=a))
            for n, a in calls
        ]
        message = ChatCompletionMessage(
            content=None, tool_calls=made, reasoning_content=thought, reasoning=thought
        )
        return message, "tool_calls"

    top = request.logprob_count
    texts = serving.runtime.token_texts if top is not None else None

    def build(results: list[Result], cached: int) -> ChatCompletionResponse:
        answers = [answer(result) for result in results]
        return ChatCompletionResponse(
            model=served,
            choices=[
                ChatCompletionChoice(
                    index=choice.index,
                    message=message,
                    finish_reason=finish,  # type: ignore[arg-type]
                    logprobs=chat_logprobs(result.logprobs, texts, top) if texts is not None else None,  # type: ignore[arg-type]
                )
                for choice, result, (message, finish) in zip(choices, results, answers, strict=True)
            ],
            usage=usage_info(prompt_tokens, results, cached),
        )

    splitters = {c.index: ReasoningSplitter(style) for c in choices} if style is not None else None

    def delta(text: str, index: int, entries: list[TokenLogprob]) -> str:
        logprobs = chat_logprobs(entries, texts, top) if texts is not None else None  # type: ignore[arg-type]
        if splitters is not None:
            thought, text = splitters[index].push(text)
            return encoder.parts(text, thought, index, logprobs)
        if logprobs is None:
            return encoder.content(text, index)
        return encoder.content_logprobs(text, index, logprobs)

    def finish(reason: str, index: int) -> str:
        if splitters is None:
            return encoder.finish(reason, index)
        thought, text = splitters[index].flush()  # a tag the answer ended in the middle of
        return encoder.parts(text, thought, index) + encoder.finish(reason, index)

    def whole(results: list[Result]) -> str:
        """A streamed answer sent when complete: as OpenAI streams it (role, the reasoning,
        then its content or one piece per call, then the finish reason)."""
        frames = []
        for choice, result in zip(choices, results, strict=True):
            message, reason = answer(result)
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
        if request.include_usage:
            tokens = sum(r.completion_tokens for r in results)
            frames.append(encoder.usage(prompt_tokens, tokens, cached_tokens(choices, len(choices))))
        return "".join(frames) + SSE_DONE

    if request.stream and request.tool_mode and (style or not await plainly_text(choices, request.tool_mode)):
        # Whether an answer is calls is known at its end (after a reasoning model's thinking):
        # the stream sends each choice whole.
        frames = whole_frames(choices, whole, metrics, prompt_tokens, failure_frame=error_frame)
        return StreamBody(frames, "text/event-stream", SSE_HEADERS)  # type: ignore[return-value]

    def stream() -> Response:
        opening = [encoder.role(choice.index) for choice in choices]
        usage = usage_frame(request, encoder, choices, prompt_tokens)
        return sse_body(
            choices,
            opening,
            delta,
            finish,
            usage,
            metrics,
            prompt_tokens,
            failure_frame=error_frame,
            done=SSE_DONE,
        )

    return await serving.respond(request, choices, http_request, stream, build, metrics, prompt_tokens)
