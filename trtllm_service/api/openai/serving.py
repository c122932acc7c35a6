"""The OpenAI API's logic: a validated request -> engine requests -> a JSON or SSE response.

One engine request per choice: chat runs its one prompt ``n`` times, completions run every prompt ``n``
times (choice index ``prompt_index * n + i``), a response of ``/v1/responses`` is one chat choice. All of
a response's engine requests run concurrently, and every one of them has produced its first text
before the response starts, so errors found by the engine (not ready, invalid arguments) are answered
as JSON with their status, never inside a 200 stream.

Streaming writes SSE frames with the pre-encoded chunk encoders of ``sse``: per write one string
format, no pydantic. Each write carries all the text the relay received since the previous one (so a
client that is behind gets fewer, larger events), and the first text is sent as soon as it exists. A
failure after the stream started becomes one error frame and the stream ends. However the response
ends (finished, failed, client gone), every engine request behind it is closed, which cancels the
unfinished ones.

A reasoning model's answer (``Runtime.reasoning``, chosen at pack time) is split into its thinking and
its content as it streams (``chat.reasoning``); tool calls are read from the content.

Seeds: with a ``seed``, choice ``i`` of a prompt samples with ``seed + i``, so the choices differ and the
response is reproducible. Without one, each sampled choice gets a fresh random seed, so choices and
repeated requests are independent whatever seed the engine falls back to when none is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

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
from trtllm_service.api.streaming import PushBody, StreamBody
from trtllm_service.chat import reasoning, tool_calls
from trtllm_service.chat.reasoning import ReasoningSplitter, ReasoningStyle
from trtllm_service.errors import APIError
from trtllm_service.relay.client import EngineStream
from trtllm_service.relay.logprobs import TokenLogprob, chat_logprobs, completion_logprobs
from trtllm_service.relay.request import GenerationRequest, SamplingParams
from trtllm_service.request_ids import engine_request_id

if TYPE_CHECKING:
    from trtllm_service.relay.runtime import Runtime

logger = logging.getLogger("trtllm_service.api.openai")

_UINT64_MASK = (1 << 64) - 1
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
CHAT_ROUTE = "/v1/chat/completions"
COMPLETIONS_ROUTE = "/v1/completions"
INLINE_TOKENIZE_CHARS = 2048  # /tokenize: longer texts are tokenized in a worker thread


@dataclass(slots=True)
class _Choice:
    """One engine request of a response, once it has produced its first text."""

    index: int
    stream: EngineStream
    first: str
    echo: str = ""  # completions with echo: the prompt, sent before the generated text


@dataclass(slots=True)
class _Result:
    """A finished choice of a non-streamed response."""

    text: str
    completion_tokens: int
    finish_reason: str
    logprobs: list[TokenLogprob] = field(default_factory=list)


TextFrame = Callable[[str, int, list[TokenLogprob]], str]
"""A streamed choice's text chunk: (new text, choice index, the log probs of its tokens) -> frame."""


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

        def answer(result: _Result) -> tuple[ChatCompletionMessage, str]:
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

        def build(results: list[_Result], cached: int) -> ChatCompletionResponse:
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

        def whole(results: list[_Result]) -> str:
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
                frames.append(encoder.usage(prompt_tokens, tokens, _cached_tokens(choices, len(choices))))
            return "".join(frames) + SSE_DONE

        if (
            request.stream
            and request.tool_mode
            and (style or not await _plainly_text(choices, request.tool_mode))
        ):
            # Whether an answer is calls is known at its end (after a reasoning model's thinking):
            # the stream sends each choice whole.
            frames = _whole_frames(choices, whole, metrics, prompt_tokens)
            return StreamBody(frames, "text/event-stream", SSE_HEADERS)  # type: ignore[return-value]

        def stream() -> Response:
            opening = [encoder.role(choice.index) for choice in choices]
            usage = self._usage_frame(request, encoder, choices, prompt_tokens)
            return _sse_body(choices, opening, delta, finish, usage, metrics, prompt_tokens)

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
            choices = await self._start(prepared, params, request.samples_per_prompt)
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

        def prompt_entries(choice: _Choice) -> list[TokenLogprob] | None:
            """echo with logprobs: the prompt's tokens come first (the engine's prompt log probs)."""
            return (
                choice.stream.prompt_logprobs if choice.echo or params.prompt_logprobs is not None else None
            )

        def build(results: list[_Result], cached: int) -> CompletionResponse:
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
            return _sse_body(choices, opening, delta, encoder.finish, usage, metrics, prompt_tokens)

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

        def output(result: _Result, cached: int) -> tuple[list[dict[str, Any]], str, dict[str, Any]]:
            """A finished answer's items, status and usage."""
            thought, content = split_reasoning(style, result.text)
            calls = request.calls_in(content or "")
            status = builder.status_of(result.finish_reason, bool(calls))
            usage = builder.usage(prompt_tokens, result.completion_tokens, cached)
            return builder.items(thought, content, calls, status), status, usage

        def build(results: list[_Result], cached: int) -> dict[str, Any]:
            items, status, usage = output(results[0], cached)
            return builder.response(status, items, usage)

        if (
            request.stream
            and request.tool_mode
            and (style or not await _plainly_text(choices, request.tool_mode))
        ):
            frames = _whole_frames(
                choices,
                lambda results: builder.whole(*output(results[0], _cached_tokens(choices, 1))),
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
                reason, builder.usage(prompt_tokens, tokens, _cached_tokens(choices, 1))
            )

        def stream() -> Response:
            return _sse_body(
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
    ) -> tuple[str, RequestMetrics, GenerationRequest, list[_Choice]] | Response:
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
            choices = await self._start([prepared], params, request.samples_per_prompt)
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
        _check_engine_features(self.runtime, params, request, logprobs_param)
        if params.guide is not None:
            self.runtime.check_guide(request.guide_param)
        return params

    @staticmethod
    def _usage_frame(
        request: ChatCompletionRequest | CompletionRequest,
        encoder: ChatChunkEncoder | CompletionChunkEncoder,
        choices: list[_Choice],
        prompt_tokens: int,
    ) -> Callable[[int], str] | None:
        """The usage chunk of a stream that asked for one (None: it did not)."""
        if not request.include_usage:
            return None
        return lambda tokens: encoder.usage(prompt_tokens, tokens, _cached_tokens(choices, request.n))

    async def _respond(
        self,
        request: SamplingFields,
        choices: list[_Choice],
        http_request: Request | None,
        frames: Callable[[], Response],
        build: Callable[[list[_Result], int], BaseModel | dict[str, Any]],
        metrics: RequestMetrics,
        prompt_tokens: int,
    ) -> Response:
        """The SSE stream of `frames()`, or one JSON body built from all results (and the prompt
        tokens found in the KV cache), for any endpoint."""
        if request.stream:
            return frames()
        try:
            results = await _collect_all(choices, http_request)
        except APIError as exc:
            metrics.done(exc.status)
            return error_response(exc)
        if results is None:
            metrics.done(499)
            return Response(status_code=499)  # the client is gone: nobody reads the answer
        tokens = sum(r.completion_tokens for r in results)
        metrics.done(200, _finish_reason(results), prompt_tokens, tokens)
        if request.ranks_best_of:  # best_of candidates per prompt: the n best are the choices
            results = _keep_best(choices, results, request.n, request.samples_per_prompt)
        body = build(results, _cached_tokens(choices, request.n))
        return JSONResponse(body if isinstance(body, dict) else body.model_dump(mode="json"))

    @staticmethod
    def _seeded(prepared: GenerationRequest, params: SamplingParams, i: int) -> GenerationRequest:
        """Choice ``i``'s engine request (see the module docstring on seeds)."""
        if params.temperature == 0:
            return prepared
        if params.seed is not None:
            return replace(prepared, seed=(params.seed + i) & _UINT64_MASK)
        return replace(prepared, seed=secrets.randbits(63))

    async def _start(
        self, prepared: Sequence[GenerationRequest], params: SamplingParams, n: int
    ) -> list[_Choice]:
        """Starts every engine request and waits for each first text; on any failure closes them all."""
        if any(request.beam_width for request in prepared) and not (
            n == 1 and getattr(self.runtime, "beam_packed", None)
        ):  # one beam of a beam-packed model reads as an ordinary (one-chunk) stream
            return await self._start_beams(prepared, n)
        streams: list[tuple[int, EngineStream]] = []
        count = len(prepared) * n  # Triton's ids: the request's X-Request-Id, "<id>-<index>" for several
        try:
            for p, request in enumerate(prepared):
                for i in range(n):
                    engine = replace(
                        self._seeded(request, params, i), request_id=engine_request_id(p * n + i, count)
                    )
                    streams.append((p * n + i, await self.runtime.generate(engine)))
            firsts = await asyncio.gather(*(stream.read() for _, stream in streams))
        except BaseException as exc:
            for _, stream in streams:
                stream.close()
            if isinstance(exc, APIError | asyncio.CancelledError):
                raise
            raise _api_error(exc) from None
        return [_Choice(index, stream, first) for (index, stream), first in zip(streams, firsts, strict=True)]

    async def _start_beams(self, prepared: Sequence[GenerationRequest], n: int) -> list[_Choice]:
        """Beam search: one engine request per prompt returns its `n` best beams, which become that
        prompt's choices (best first). Never streamed: the engine sends every beam at once."""
        streams: list[EngineStream] = []
        try:
            for p, request in enumerate(prepared):
                engine = replace(request, num_return=n, request_id=engine_request_id(p, len(prepared)))
                streams.append(await self.runtime.generate(engine))
            found = await asyncio.gather(*(stream.beams() for stream in streams))  # type: ignore[attr-defined]
        except BaseException as exc:
            for stream in streams:
                stream.close()
            if isinstance(exc, APIError | asyncio.CancelledError):
                raise
            raise _api_error(exc) from None
        choices = []
        for p, (stream, beams) in enumerate(zip(streams, found, strict=True)):
            for i, (text, tokens, reason) in enumerate(beams[:n]):
                choices.append(_Choice(p * n + i, _Beam(stream if i == 0 else None, tokens, reason), text))
        return choices


class _Beam:
    """One finished beam, read like an EngineStream (its text is the choice's first and only text);
    the first beam of a request holds the engine stream, for its cached_tokens and close()."""

    __slots__ = ("cached_tokens", "completion_tokens", "finish_reason", "prompt_logprobs", "stream")

    def __init__(self, stream: EngineStream | None, tokens: int, reason: str) -> None:
        self.stream = stream
        self.completion_tokens = tokens
        self.finish_reason = reason
        self.cached_tokens = stream.cached_tokens if stream is not None else 0
        self.prompt_logprobs = None

    async def read(self) -> str:
        return ""

    def take_logprobs(self) -> list[TokenLogprob]:
        return []

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()


def _check_engine_features(
    runtime: Any, params: SamplingParams, request: Any, logprobs_param: str = "logprobs"
) -> None:
    """The runtime's 400s for what its engine cannot serve (prompt log probs, beam search)."""
    check = getattr(runtime, "check_engine_features", None)
    if check is not None:
        check(params, stream=request.stream, n=request.samples_per_prompt, logprobs_param=logprobs_param)


def _cached_tokens(choices: Sequence[_Choice], n: int) -> int:
    """usage.prompt_tokens_details.cached_tokens: per prompt, the most prompt tokens any of its
    choices' engine requests found in the KV cache (each prompt counts once, as in prompt_tokens)."""
    best: dict[int, int] = {}
    for choice in choices:
        prompt = choice.index // max(n, 1)
        best[prompt] = max(best.get(prompt, 0), int(getattr(choice.stream, "cached_tokens", 0) or 0))
    return sum(best.values())


def _keep_best(choices: list[_Choice], results: list[_Result], n: int, sampled: int) -> list[_Result]:
    """best_of without beam search: of each prompt's `sampled` candidates, the `n` with the highest
    cumulative log prob (the sum of their tokens' log probs; ties: the first sampled) become its
    choices, in that order and numbered `prompt * n + i`. `choices` is narrowed to them in place (the
    response builders read it); returns their results."""
    kept: list[tuple[_Choice, _Result]] = []
    for start in range(0, len(choices), sampled):
        group = list(zip(choices[start : start + sampled], results[start : start + sampled], strict=True))
        group.sort(key=lambda pair: -sum(e.logprob or 0.0 for e in pair[1].logprobs))
        for i, (choice, result) in enumerate(group[:n]):
            choice.index = start // sampled * n + i
            kept.append((choice, result))
    choices[:] = [choice for choice, _ in kept]
    return [result for _, result in kept]


def _usage(prompt_tokens: int, results: Sequence[_Result], cached_tokens: int) -> UsageInfo:
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


def _finish_reason(results: Sequence[_Result]) -> str:
    """The metric label of a response: "length" if any choice ran out of tokens, else "stop"."""
    return "length" if any(r.finish_reason == "length" for r in results) else "stop"


def _api_error(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    logger.error("OpenAI request failed", exc_info=exc)
    return APIError.internal()


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone away (the request body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _collect(choice: _Choice) -> _Result:
    """Reads one choice to its end."""
    stream = choice.stream
    parts = [choice.first]
    logprobs = stream.take_logprobs()
    while stream.finish_reason is None:
        parts.append(await stream.read())
        logprobs += stream.take_logprobs()
    return _Result("".join(parts), stream.completion_tokens, stream.finish_reason, logprobs)


async def _collect_all(choices: list[_Choice], http_request: Request | None) -> list[_Result] | None:
    """Reads every choice to its end (None: the client went away). Closes every stream however it ends."""
    tasks = [asyncio.ensure_future(_collect(c)) for c in choices]
    watcher = asyncio.ensure_future(_disconnected(http_request)) if http_request is not None else None
    pending: set[asyncio.Future[Any]] = set(tasks)
    if watcher is not None:
        pending.add(watcher)
    try:
        while True:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                if task in done and task.exception() is not None:
                    raise _api_error(task.exception())  # type: ignore[arg-type]
            if all(task.done() for task in tasks):
                return [task.result() for task in tasks]
            if watcher is not None and watcher in done and watcher.exception() is None:
                return None
    finally:
        if watcher is not None:
            watcher.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for choice in choices:
            choice.stream.close()


def _sse_body(
    choices: list[_Choice],
    opening: list[str],
    text_frame: TextFrame,
    finish_frame: Callable[[str, int], str],
    usage_frame: Callable[[int], str] | None,
    metrics: RequestMetrics,
    prompt_tokens: int,
    *,
    failure_frame: Callable[[APIError], str] = error_frame,
    done: str = SSE_DONE,
) -> Response:
    """The SSE response of a streamed answer: opening frames, text and finish chunks, usage, `done`;
    a failure after the start is `failure_frame` and the end of the stream.

    One choice (the common, hot case) is pushed: its text is framed and written as it arrives
    (`PushBody`). Several are merged as their text comes, by a generator. A text frame may be empty
    (text held back, say the start of a reasoning tag): nothing is written.
    """
    frames = _Frames("".join(opening), text_frame, finish_frame, usage_frame, failure_frame, done)
    if len(choices) == 1:
        framing = _SSEFraming(choices[0], frames, metrics, prompt_tokens)
        return PushBody(choices[0].stream, framing, "text/event-stream", SSE_HEADERS)
    merged = _merged_frames(choices, frames, metrics, prompt_tokens)
    return StreamBody(merged, "text/event-stream", SSE_HEADERS)


@dataclass(frozen=True, slots=True)
class _Frames:
    """How an endpoint writes a streamed answer's SSE frames."""

    head: str
    text: TextFrame
    finish: Callable[[str, int], str]
    usage: Callable[[int], str] | None
    failure: Callable[[APIError], str]
    done: str


class _SSEFraming:
    """The SSE frames of one streamed choice, for `PushBody`."""

    __slots__ = ("choice", "frames", "metrics", "prompt_tokens", "stream")

    def __init__(self, choice: _Choice, frames: _Frames, metrics: RequestMetrics, prompt_tokens: int) -> None:
        self.choice = choice
        self.stream = choice.stream
        self.frames = frames
        self.metrics = metrics
        self.prompt_tokens = prompt_tokens

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
        reported = _api_error(error)
        return reported.status, self.frames.failure(reported).encode()

    def done(self, status: int) -> None:
        stream = self.stream
        stream.close()
        reason = _finish_reason([_Result("", 0, stream.finish_reason or "stop")]) if status == 200 else None
        self.metrics.done(status, reason, self.prompt_tokens, stream.completion_tokens)


async def _merged_frames(
    choices: list[_Choice], frames: _Frames, metrics: RequestMetrics, prompt_tokens: int
) -> AsyncGenerator[bytes, None]:
    """The SSE frames of several streamed choices, merged as their text comes (see `_sse_body`)."""
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
        reason = _finish_reason([_Result("", 0, c.stream.finish_reason or "stop") for c in choices])
    except Exception as exc:  # the 200 status is sent already: report in the stream, then end it
        error = _api_error(exc)
        status = error.status
        yield frames.failure(error).encode()
    finally:
        await merged.aclose()  # stops its pumps first, so that no stream is still being read
        for choice in choices:
            choice.stream.close()
        metrics.done(status, reason, prompt_tokens, sum(c.stream.completion_tokens for c in choices))


async def _plainly_text(choices: list[_Choice], mode: str | None) -> bool:
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


async def _whole_frames(
    choices: list[_Choice],
    render: Callable[[list[_Result]], str],
    metrics: RequestMetrics,
    prompt_tokens: int,
    *,
    head: str = "",
    failure_frame: Callable[[APIError], str] = error_frame,
) -> AsyncGenerator[bytes, None]:
    """The SSE frames of an answer that may be tool calls (known only at its end): `head` at once,
    then every choice read to its end and sent by `render`; a failure is `failure_frame`."""
    status, reason, tokens = 499, None, 0
    try:
        if head:
            yield head.encode()
        results = await _collect_all(choices, None)
        assert results is not None
        tokens = sum(r.completion_tokens for r in results)
        yield render(results).encode()
        status, reason = 200, _finish_reason(results)
    except Exception as exc:  # the 200 status is sent already: report in the stream, then end it
        error = _api_error(exc)
        status = error.status
        yield failure_frame(error).encode()
    finally:
        for choice in choices:
            choice.stream.close()
        metrics.done(status, reason, prompt_tokens, tokens)


async def _merged(
    choices: list[_Choice],
) -> AsyncGenerator[tuple[int, str, str | None, list[TokenLogprob]], None]:
    """(index, text, finish reason, log probs) of several choices as their text arrives, until all
    have finished."""
    queue: asyncio.Queue[tuple[int, str, str | None, list[TokenLogprob]] | BaseException] = asyncio.Queue()

    async def pump(choice: _Choice) -> None:
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
