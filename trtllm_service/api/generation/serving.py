"""What every generation endpoint does the same way (OpenAI's chat, completions and responses,
Anthropic's messages): name the model a request asks for (the served model or a LoRA adapter),
reduce its sampling fields once to `SamplingParams` the engine can serve, render a chat prompt and
start its engine requests (`generation.choices`), and answer with an SSE stream or one JSON body.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from trtllm_service.api.generation.choices import (
    Choice,
    Result,
    cached_tokens,
    collect_all,
    finish_label,
    keep_best,
    start_choices,
)
from trtllm_service.api.generation.sse_frames import SSE_HEADERS, plainly_text, sse_body, whole_frames
from trtllm_service.api.server.error_shape import error_response
from trtllm_service.api.server.metrics import RequestMetrics
from trtllm_service.api.server.streaming import StreamBody
from trtllm_service.chat import reasoning
from trtllm_service.chat.reasoning import ReasoningSplitter, ReasoningStyle
from trtllm_service.errors import APIError
from trtllm_service.relay.logprobs import TokenLogprob
from trtllm_service.relay.request import SamplingParams

if TYPE_CHECKING:
    from trtllm_service.runtime import Runtime


class Sampled(Protocol):
    """What `GenerationServing.params` reads of a request: its sampling fields' one reduction, and
    what the engine's checks name (`SamplingFields` on /v1, `GenerateRequest` on /generate)."""

    @property
    def stream(self) -> bool: ...

    @property
    def samples_per_prompt(self) -> int: ...

    @property
    def guide_param(self) -> str: ...

    @property
    def guide_path(self) -> str: ...

    def sampling_params(self) -> SamplingParams: ...


class Collected(Protocol):
    """What `GenerationServing.respond` reads of a request (`SamplingFields` on /v1)."""

    @property
    def stream(self) -> bool: ...

    @property
    def samples_per_prompt(self) -> int: ...

    @property
    def n(self) -> int: ...

    @property
    def ranks_best_of(self) -> bool: ...


class ChatRequest(Sampled, Collected, Protocol):
    """A request whose prompt is chat messages (chat completions, responses, messages): its
    `SamplingFields`, and what `serve_chat` reads besides."""

    model: str | None

    @property
    def reasoning_effort(self) -> Any: ...

    @property
    def tool_mode(self) -> str | None: ...

    def chat_messages(self) -> list[dict[str, Any]]: ...

    def functions(self) -> list[dict[str, Any]]: ...


class Answer(Protocol):
    """How a chat endpoint writes one answer (`GenerationServing.serve_chat`), over its started
    choices."""

    prompt_tokens: int

    def build(self, results: list[Result], cached: int) -> BaseModel | dict[str, Any]:
        """The JSON body, from all results and the prompt tokens found in the KV cache."""
        ...

    def stream(self, metrics: RequestMetrics) -> Response:
        """The SSE stream, written as the text arrives."""
        ...

    def stream_whole(self, metrics: RequestMetrics) -> Response:
        """The SSE stream of an answer that may be tool calls, sent once it is complete."""
        ...


def error_docs(body: type[BaseModel], reasons: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """The documented error responses of an API's routes: each status with its reason, all in the
    API's error `body`."""
    return {code: {"model": body, "description": why} for code, why in reasons.items()}


class GenerationServing:
    """The request path every generation endpoint shares, over a ``Runtime``.

    Args:
        runtime: The service's runtime: tokenizer, chat template, limits and the engine relay.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.model_name = runtime.model_name
        self.reasoning: ReasoningStyle | None = getattr(runtime, "reasoning", None)  # the model's, if any
        self._created = int(time.time())

    def begin(
        self, model: str | None, route: str, param: str = "model"
    ) -> tuple[str | None, str, RequestMetrics]:
        """The LoRA adapter a request's ``model`` names (None: the served model), the model id its
        answer and metrics name, and its metrics. An unknown name raises the 404 (a 400 naming
        `param` for another field than ``model``: /generate's ``lora``), counted under the served
        model."""
        try:
            adapter = self.runtime.adapter(model, param=param)
        except APIError as exc:
            RequestMetrics(self.model_name, route).done(exc.status)
            raise
        served = adapter or self.model_name
        return adapter, served, RequestMetrics(served, route)

    async def serve_chat(
        self,
        request: ChatRequest,
        http_request: Request | None,
        route: str,
        effort_param: str,
        answer: Callable[[Any, str, list[Choice], int, GenerationServing], Answer],
    ) -> Response:
        """Answers a chat request: its prompt rendered and started as its engine requests (each has
        produced its first text), then written as one JSON body or an SSE stream by the endpoint's
        `answer(request, model id it answers as, choices, prompt tokens, self)`; or the error
        response. `effort_param`: the field that set `reasoning_effort`, for its 400."""
        try:
            adapter, served, metrics = self.begin(request.model, route)
        except APIError as exc:
            return error_response(exc)
        try:
            params = await self.params(request, adapter, "top_logprobs")
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
            choices = await start_choices(
                self.runtime,
                [prepared],
                params,
                request.samples_per_prompt,
                # a streamed text answer's response reads its first text (SSEFraming)
                read_first=not request.stream or bool(request.tool_mode),
                http_request=http_request,
            )
        except APIError as exc:
            metrics.done(exc.status)
            return error_response(exc)
        if not choices[0].waiting:
            metrics.first_token()
        written = answer(request, served, choices, prepared.prompt_tokens, self)
        if (
            request.stream
            and request.tool_mode
            and (self.reasoning or not await plainly_text(choices, request.tool_mode))
        ):
            # Whether an answer is calls is known at its end (after a reasoning model's thinking):
            # the stream sends it whole.
            return written.stream_whole(metrics)
        return await self.respond(
            request,
            choices,
            http_request,
            lambda: written.stream(metrics),
            written.build,
            metrics,
            written.prompt_tokens,
        )

    async def params(
        self,
        request: Sampled,
        adapter: str | None,
        logprobs_param: str,
        guide_param: str = "response_format",
    ) -> SamplingParams:
        """A request's sampling parameters (with its LoRA adapter), once it is known that the engine
        can serve them, its guide included (checked off the event loop): 400s naming the field
        otherwise (`guide_param`: the one a guide refused with beam search names)."""
        flavor = self.runtime.flavor
        # a beam-packed model: every request searches beams
        params = request.sampling_params()
        if adapter is not None:
            params = replace(params, lora=adapter)
        params = flavor.fill_beam_search(params)
        flavor.check_logprobs(params, logprobs_param)
        flavor.check_engine_features(
            params,
            stream=request.stream,
            n=request.samples_per_prompt,
            logprobs_param=logprobs_param,
            guide_param=guide_param,
        )
        if params.guide is not None:
            flavor.check_guide(request.guide_param)
            await self.runtime.check_guide(params.guide, request.guide_path)
        return params

    async def respond(
        self,
        request: Collected,
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


class EventAnswer:
    """An answer of one choice that a builder writes as named events (Anthropic's message, OpenAI's
    response): `opening`, then the events of the text as it arrives (`write`), or of the whole
    answer once it is complete; a failure is the builder's `failure`. Each endpoint adds `build`,
    `finish` and `whole`.

    Args:
        request: The validated request.
        served: The model id the answer names.
        choices: Its one started choice.
        prompt_tokens: The prompt's length in tokens.
        serving: Its serving object (for the model's reasoning parser).
    """

    __slots__ = ("builder", "choices", "prompt_tokens", "request", "splitter", "style")

    def __init__(
        self, request: Any, served: str, choices: list[Choice], prompt_tokens: int, serving: GenerationServing
    ) -> None:
        self.request = request
        self.choices = choices
        self.prompt_tokens = prompt_tokens
        self.builder = self.new_builder(served)
        style = self.style = serving.reasoning
        self.splitter = ReasoningSplitter(style) if style is not None else None

    def new_builder(self, served: str) -> Any:
        """The endpoint's builder of the answer's events, naming `served` as the model."""
        raise NotImplementedError

    def finish(self, reason: str, index: int) -> str:
        """The stream's last events (the endpoint's)."""
        raise NotImplementedError

    def whole(self, results: list[Result]) -> str:
        """The events of a complete answer, after `opening` (the endpoint's)."""
        raise NotImplementedError

    def delta(self, text: str, index: int, entries: list[TokenLogprob]) -> str:
        """The events of streamed text (per token: the hot path)."""
        splitter = self.splitter
        if splitter is None:
            return self.builder.write("", text)
        return self.builder.write(*splitter.push(text))

    def held_back(self) -> str:
        """At the end of the stream: the events of the text the reasoning splitter still holds."""
        return self.builder.write(*self.splitter.flush()) if self.splitter is not None else ""

    def stream(self, metrics: RequestMetrics) -> Response:
        """The event stream, written as the text arrives."""
        builder = self.builder
        return sse_body(
            self.choices,
            [builder.opening()],
            self.delta,
            self.finish,
            None,
            metrics,
            self.prompt_tokens,
            failure_frame=builder.failure,
            done="",
        )

    def stream_whole(self, metrics: RequestMetrics) -> Response:
        """The event stream of an answer that may be calls: `opening` at once, the rest (`whole`)
        once it is complete."""
        builder = self.builder
        frames = whole_frames(
            self.choices,
            self.whole,
            metrics,
            self.prompt_tokens,
            head=builder.opening(),
            failure_frame=builder.failure,
        )
        return StreamBody(frames, "text/event-stream", SSE_HEADERS)


def split_reasoning(style: ReasoningStyle | None, text: str) -> tuple[str | None, str | None]:
    """A whole answer's (reasoning, content); without a reasoning parser all of it is content."""
    return (None, text) if style is None else reasoning.split(style, text)
