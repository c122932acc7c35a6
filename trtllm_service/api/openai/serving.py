"""The OpenAI API's logic: a validated request -> engine requests -> a JSON or SSE response.

The engine requests behind a response are `api.choices`; its SSE body is `api.sse_frames`, written
with the pre-encoded chunk encoders of ``sse`` (per write one string format, no pydantic).

A reasoning model's answer (``Runtime.reasoning``, chosen at pack time) is split into its thinking and
its content as it streams (``chat.reasoning``); tool calls are read from the content.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from trtllm_service.api.choices import (
    Choice,
    Result,
    cached_tokens,
    check_engine_features,
    collect_all,
    finish_label,
    keep_best,
    start_choices,
)
from trtllm_service.api.metrics import RequestMetrics
from trtllm_service.api.openai.protocol import (
    ChatCompletionChoice,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    FunctionCall,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    SamplingFields,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    ToolCall,
    UsageInfo,
    new_id,
)
from trtllm_service.api.openai.responses import RESPONSES_ROUTE, ResponseBuilder, ResponsesRequest
from trtllm_service.api.openai.sse import SSE_DONE, ChatChunkEncoder, CompletionChunkEncoder, error_frame
from trtllm_service.api.sse_frames import SSE_HEADERS, plainly_text, sse_body, whole_frames
from trtllm_service.api.streaming import StreamBody
from trtllm_service.chat import reasoning, tool_calls
from trtllm_service.chat.reasoning import ReasoningSplitter, ReasoningStyle
from trtllm_service.errors import APIError
from trtllm_service.relay.logprobs import TokenLogprob, chat_logprobs, completion_logprobs
from trtllm_service.relay.request import GenerationRequest, SamplingParams

if TYPE_CHECKING:
    from trtllm_service.relay.runtime import Runtime

CHAT_ROUTE = "/v1/chat/completions"
COMPLETIONS_ROUTE = "/v1/completions"
INLINE_TOKENIZE_CHARS = 2048  # /tokenize: longer texts are tokenized in a worker thread


def error_response(error: APIError) -> JSONResponse:
    """The JSON answer of an error, with its status and headers."""
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


class OpenAIServing:
    """Serves ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses`` and
    vLLM's ``/tokenize`` / ``/detokenize`` from a ``Runtime``.

    Args:
        runtime: The service's runtime: tokenizer, chat template, limits and the engine relay.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.model_name = runtime.model_name
        self.reasoning: ReasoningStyle | None = getattr(runtime, "reasoning", None)  # the model's, if any
        self._created = int(time.time())

    # ---- models ----------------------------------------------------------------------------------------

    def model_card(self) -> ModelCard:
        return ModelCard(
            id=self.model_name,
            created=self._created,
            max_model_len=self.runtime.max_seq_len,
            engine=getattr(self.runtime, "engine", None),
            flavor=getattr(self.runtime, "flavor", None),
        )

    def list_models(self) -> ModelList:
        """The base model, then each packed LoRA adapter (its `parent` is the base)."""
        cards = [self.model_card()]
        for name in getattr(self.runtime, "adapters", {}):
            cards.append(
                ModelCard(
                    id=name,
                    created=self._created,
                    max_model_len=self.runtime.max_seq_len,
                    parent=self.model_name,
                    root=self.model_name,
                )
            )
        return ModelList(data=cards)

    def check_model(self, model: str | None) -> str | None:
        """The LoRA adapter ``model`` names (None: the served model, or omitted); 404 for another."""
        if model is None or model == self.model_name:
            return None
        if model in getattr(self.runtime, "adapters", {}):
            return model
        raise APIError.model_not_found(model)

    def _label(self, model: str | None) -> str:
        """The model id a request's metrics and response name: an adapter, else the served model."""
        return (
            model if model is not None and model in getattr(self.runtime, "adapters", {}) else self.model_name
        )

    # ---- chat ------------------------------------------------------------------------------------------

    async def chat(self, request: ChatCompletionRequest, http_request: Request | None = None) -> Response:
        """Answers a chat completion request (a JSON response, or an SSE stream when ``stream`` is set)."""
        started = await self._start_chat(request, CHAT_ROUTE, "reasoning_effort")
        if isinstance(started, Response):
            return started
        served, metrics, prepared, choices = started
        encoder = ChatChunkEncoder(new_id("chatcmpl"), served, include_usage=request.include_usage)
        prompt_tokens = prepared.prompt_tokens
        style = self.reasoning

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
        texts = self.runtime.token_texts if top is not None else None

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
                usage=_usage(prompt_tokens, results, cached),
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

        if (
            request.stream
            and request.tool_mode
            and (style or not await plainly_text(choices, request.tool_mode))
        ):
            # Whether an answer is calls is known at its end (after a reasoning model's thinking):
            # the stream sends each choice whole.
            frames = whole_frames(choices, whole, metrics, prompt_tokens, failure_frame=error_frame)
            return StreamBody(frames, "text/event-stream", SSE_HEADERS)  # type: ignore[return-value]

        def stream() -> Response:
            opening = [encoder.role(choice.index) for choice in choices]
            usage = self._usage_frame(request, encoder, choices, prompt_tokens)
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

        return await self._respond(request, choices, http_request, stream, build, metrics, prompt_tokens)

    # ---- completions -----------------------------------------------------------------------------------

    async def completions(self, request: CompletionRequest, http_request: Request | None = None) -> Response:
        """Answers a text completion request: no chat template; each prompt gets ``n`` choices."""
        served = self._label(request.model)
        metrics = RequestMetrics(served, COMPLETIONS_ROUTE)
        try:
            params = self._params(request, "logprobs")
            prompts = request.prompts()
            prepared = await self.runtime.prepare_prompts(prompts, params)
            choices = await start_choices(self.runtime, prepared, params, request.samples_per_prompt)
        except APIError as exc:
            metrics.done(exc.status)
            return error_response(exc)
        metrics.first_token()
        if request.echo:  # a token-id prompt echoes as its text (special tokens included)
            echoes = [p if isinstance(p, str) else self.runtime.formatter.decode(p) for p in prompts]
            for choice in choices:
                choice.echo = echoes[choice.index // request.samples_per_prompt]
        prompt_tokens = sum(p.prompt_tokens for p in prepared)
        encoder = CompletionChunkEncoder(new_id("cmpl"), served, include_usage=request.include_usage)

        top = request.logprob_count
        texts = self.runtime.token_texts if top is not None else None

        def prompt_entries(choice: Choice) -> list[TokenLogprob] | None:
            """echo with logprobs: the prompt's tokens come first (the engine's prompt log probs)."""
            return (
                choice.stream.prompt_logprobs if choice.echo or params.prompt_logprobs is not None else None
            )

        def build(results: list[Result], cached: int) -> CompletionResponse:
            return CompletionResponse(
                model=served,
                choices=[
                    CompletionChoice(
                        index=choice.index,
                        text=choice.echo + result.text,
                        finish_reason=result.finish_reason,  # type: ignore[arg-type]
                        logprobs=completion_logprobs(
                            result.logprobs, texts, top, len(choice.echo), prompt_entries(choice)
                        )[0]  # type: ignore[arg-type]
                        if texts is not None
                        else None,
                    )
                    for choice, result in zip(choices, results, strict=True)
                ],
                usage=_usage(prompt_tokens, results, cached),
            )

        offsets = {choice.index: len(choice.echo) for choice in choices}

        def delta(text: str, index: int, entries: list[TokenLogprob]) -> str:
            if texts is None:
                return encoder.text(text, index)
            body, offsets[index] = completion_logprobs(entries, texts, top, offsets[index])  # type: ignore[arg-type]
            return encoder.text_logprobs(text, index, body)

        def stream() -> Response:
            opening = [
                encoder.text_logprobs(c.echo, c.index, completion_logprobs([], texts, top, 0, prompt)[0])  # type: ignore[arg-type]
                if texts is not None and (prompt := prompt_entries(c))
                else encoder.text(c.echo, c.index)
                for c in choices
                if c.echo
            ]
            usage = self._usage_frame(request, encoder, choices, prompt_tokens)
            return sse_body(
                choices,
                opening,
                delta,
                encoder.finish,
                usage,
                metrics,
                prompt_tokens,
                failure_frame=error_frame,
                done=SSE_DONE,
            )

        return await self._respond(request, choices, http_request, stream, build, metrics, prompt_tokens)

    # ---- responses -------------------------------------------------------------------------------------

    async def responses(self, request: ResponsesRequest, http_request: Request | None = None) -> Response:
        """Answers a Responses API request: one chat choice, as output items (see `responses`)."""
        started = await self._start_chat(request, RESPONSES_ROUTE, "reasoning.effort")
        if isinstance(started, Response):
            return started
        served, metrics, prepared, choices = started
        builder = ResponseBuilder(request, served)
        prompt_tokens = prepared.prompt_tokens
        style = self.reasoning

        def output(result: Result, cached: int) -> tuple[list[dict[str, Any]], str, dict[str, Any]]:
            """A finished answer's items, status and usage."""
            thought, content = split_reasoning(style, result.text)
            calls = request.calls_in(content or "")
            status = builder.status_of(result.finish_reason, bool(calls))
            usage = builder.usage(prompt_tokens, result.completion_tokens, cached)
            return builder.items(thought, content, calls, status), status, usage

        def build(results: list[Result], cached: int) -> dict[str, Any]:
            items, status, usage = output(results[0], cached)
            return builder.response(status, items, usage)

        if (
            request.stream
            and request.tool_mode
            and (style or not await plainly_text(choices, request.tool_mode))
        ):
            frames = whole_frames(
                choices,
                lambda results: builder.whole(*output(results[0], cached_tokens(choices, 1))),
                metrics,
                prompt_tokens,
                head=builder.opening(),
                failure_frame=builder.failure,
            )
            return StreamBody(frames, "text/event-stream", SSE_HEADERS)  # type: ignore[return-value]

        splitter = ReasoningSplitter(style) if style is not None else None

        def delta(text: str, index: int, entries: list[TokenLogprob]) -> str:
            return builder.write(*splitter.push(text)) if splitter is not None else builder.write("", text)

        def finish(reason: str, index: int) -> str:
            frames = builder.write(*splitter.flush()) if splitter is not None else ""
            tokens = choices[0].stream.completion_tokens
            return frames + builder.finish(
                reason, builder.usage(prompt_tokens, tokens, cached_tokens(choices, 1))
            )

        def stream() -> Response:
            return sse_body(
                choices,
                [builder.opening()],
                delta,
                finish,
                None,
                metrics,
                prompt_tokens,
                failure_frame=builder.failure,
                done="",
            )

        return await self._respond(request, choices, http_request, stream, build, metrics, prompt_tokens)

    # ---- tokenize / detokenize (vLLM's, at the root) ---------------------------------------------------

    async def tokenize(self, request: TokenizeCompletionRequest | TokenizeChatRequest) -> dict[str, Any]:
        """The token ids of a prompt, or of chat messages rendered with the chat template: by
        default exactly the ids the engine gets for the same prompt (`add_special_tokens` false:
        none added)."""
        self.check_model(request.model)
        formatter = self.runtime.formatter
        if isinstance(request, TokenizeChatRequest):
            try:
                text = formatter.render(
                    request.chat_messages(),
                    add_generation_prompt=request.add_generation_prompt,
                    tools=request.functions() or None,
                )
            except ValueError as exc:
                raise APIError.bad_request(str(exc), param="messages") from None
        else:
            text = request.prompt
        encode = functools.partial(formatter.encode, add_special_tokens=request.add_special_tokens)
        ids = encode(text) if len(text) <= INLINE_TOKENIZE_CHARS else await asyncio.to_thread(encode, text)
        body: dict[str, Any] = {"count": len(ids), "max_model_len": self.runtime.max_seq_len, "tokens": ids}
        if request.return_token_strs:
            body["token_strs"] = formatter.token_strings(ids)
        return body

    def detokenize(self, request: DetokenizeRequest) -> dict[str, Any]:
        """The text of token ids (special tokens included), as a token-id prompt is echoed."""
        self.check_model(request.model)
        self.runtime.preparer.check_token_ids(request.tokens, "tokens")
        return {"prompt": self.runtime.formatter.decode(request.tokens)}

    # ---- shared ----------------------------------------------------------------------------------------

    async def _start_chat(
        self, request: ChatCompletionRequest | ResponsesRequest, route: str, effort_param: str
    ) -> tuple[str, RequestMetrics, GenerationRequest, list[Choice]] | Response:
        """A chat request's prompt, rendered and started as its engine requests (each has produced
        its first text): the model id it answers as, its metrics, its engine request and choices;
        or the error response. `effort_param`: the field that set `reasoning_effort`, for its 400."""
        served = self._label(request.model)
        metrics = RequestMetrics(served, route)
        try:
            params = self._params(request, "top_logprobs")
            effort = request.reasoning_effort
            if effort is not None and not self.runtime.formatter.takes_reasoning_effort:
                raise APIError.bad_request(
                    f"Unsupported parameter: '{effort_param}': this model's chat template takes no "
                    "reasoning_effort.",
                    param=effort_param,
                    code="unsupported_parameter",
                )
            tools = request.functions() or None  # shown to the model even with tool_choice "none"
            prepared = await self.runtime.prepare_chat(
                request.chat_messages(), params, tools=tools, reasoning_effort=effort
            )
            choices = await start_choices(self.runtime, [prepared], params, request.samples_per_prompt)
        except APIError as exc:
            metrics.done(exc.status)
            return error_response(exc)
        metrics.first_token()
        return served, metrics, prepared, choices

    def _params(self, request: SamplingFields, logprobs_param: str) -> SamplingParams:
        """A request's sampling parameters (with its LoRA adapter), once it is known that the engine
        can serve them: 400s naming the field otherwise."""
        params = replace(request.sampling_params(), lora=self.check_model(request.model))
        fill = getattr(self.runtime, "fill_beam_search", None)  # a beam-packed model: every request
        if fill is not None:
            params = fill(params)
        self.runtime.check_logprobs(params, logprobs_param)
        check_engine_features(self.runtime, params, request, logprobs_param)
        if params.guide is not None:
            self.runtime.check_guide(request.guide_param)
        return params

    @staticmethod
    def _usage_frame(
        request: ChatCompletionRequest | CompletionRequest,
        encoder: ChatChunkEncoder | CompletionChunkEncoder,
        choices: list[Choice],
        prompt_tokens: int,
    ) -> Callable[[int], str] | None:
        """The usage chunk of a stream that asked for one (None: it did not)."""
        if not request.include_usage:
            return None
        return lambda tokens: encoder.usage(prompt_tokens, tokens, cached_tokens(choices, request.n))

    async def _respond(
        self,
        request: SamplingFields,
        choices: list[Choice],
        http_request: Request | None,
        frames: Callable[[], Response],
        build: Callable[[list[Result], int], BaseModel | dict[str, Any]],
        metrics: RequestMetrics,
        prompt_tokens: int,
    ) -> Response:
        """The SSE stream of `frames()`, or one JSON body built from all results (and the prompt
        tokens found in the KV cache), for any endpoint."""
        if request.stream:
            return frames()
        try:
            results = await collect_all(choices, http_request)
        except APIError as exc:
            metrics.done(exc.status)
            return error_response(exc)
        if results is None:
            metrics.done(499)
            return Response(status_code=499)  # the client is gone: nobody reads the answer
        tokens = sum(r.completion_tokens for r in results)
        metrics.done(200, finish_label(results), prompt_tokens, tokens)
        if request.ranks_best_of:  # best_of candidates per prompt: the n best are the choices
            results = keep_best(choices, results, request.n, request.samples_per_prompt)
        body = build(results, cached_tokens(choices, request.n))
        return JSONResponse(body if isinstance(body, dict) else body.model_dump(mode="json"))


def _usage(prompt_tokens: int, results: Sequence[Result], cached_tokens: int) -> UsageInfo:
    completion_tokens = sum(r.completion_tokens for r in results)
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )


def split_reasoning(style: ReasoningStyle | None, text: str) -> tuple[str | None, str | None]:
    """A whole answer's (reasoning, content); without a reasoning parser all of it is content."""
    return (None, text) if style is None else reasoning.split(style, text)
