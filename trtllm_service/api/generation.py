"""What every generation endpoint does the same way (OpenAI's chat, completions and responses,
Anthropic's messages): name the model a request asks for (the served model or a LoRA adapter),
reduce its sampling fields once to `SamplingParams` the engine can serve, render a chat prompt and
start its engine requests (`api.choices`), and answer with an SSE stream or one JSON body.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from trtllm_service.api.choices import (
    Choice,
    Result,
    cached_tokens,
    collect_all,
    finish_label,
    keep_best,
    start_choices,
)
from trtllm_service.api.metrics import RequestMetrics
from trtllm_service.api.openai.protocol import SamplingFields
from trtllm_service.chat import reasoning
from trtllm_service.chat.reasoning import ReasoningStyle
from trtllm_service.errors import APIError
from trtllm_service.relay.request import GenerationRequest, SamplingParams

if TYPE_CHECKING:
    from trtllm_service.runtime import Runtime


class ChatRequest(Protocol):
    """A request whose prompt is chat messages (chat completions, responses, messages): its
    `SamplingFields`, and what `start_chat` reads besides."""

    model: str | None
    reasoning_effort: Any
    samples_per_prompt: int

    def chat_messages(self) -> list[dict[str, Any]]: ...

    def functions(self) -> list[dict[str, Any]]: ...


def error_response(error: APIError) -> JSONResponse:
    """The JSON answer of an error, with its status and headers."""
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


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

    def begin(self, model: str | None, route: str) -> tuple[str | None, str, RequestMetrics]:
        """The LoRA adapter a request's ``model`` names (None: the served model), the model id its
        answer and metrics name, and its metrics. An unknown name raises the 404, counted under the
        served model."""
        try:
            adapter = self.runtime.adapter(model)
        except APIError as exc:
            RequestMetrics(self.model_name, route).done(exc.status)
            raise
        served = adapter or self.model_name
        return adapter, served, RequestMetrics(served, route)

    async def start_chat(
        self, request: ChatRequest, route: str, effort_param: str
    ) -> tuple[str, RequestMetrics, GenerationRequest, list[Choice]] | Response:
        """A chat request's prompt, rendered and started as its engine requests (each has produced
        its first text): the model id it answers as, its metrics, its engine request and choices;
        or the error response. `effort_param`: the field that set `reasoning_effort`, for its 400."""
        try:
            adapter, served, metrics = self.begin(request.model, route)
        except APIError as exc:
            return error_response(exc)
        try:
            params = self.params(request, adapter, "top_logprobs")  # type: ignore[arg-type]
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

    def params(self, request: SamplingFields, adapter: str | None, logprobs_param: str) -> SamplingParams:
        """A request's sampling parameters (with its LoRA adapter), once it is known that the engine
        can serve them: 400s naming the field otherwise."""
        flavor = self.runtime.flavor
        # a beam-packed model: every request searches beams
        params = flavor.fill_beam_search(replace(request.sampling_params(), lora=adapter))
        flavor.check_logprobs(params, logprobs_param)
        flavor.check_engine_features(
            params, stream=request.stream, n=request.samples_per_prompt, logprobs_param=logprobs_param
        )
        if params.guide is not None:
            flavor.check_guide(request.guide_param)
        return params

    async def respond(
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


def split_reasoning(style: ReasoningStyle | None, text: str) -> tuple[str | None, str | None]:
    """A whole answer's (reasoning, content); without a reasoning parser all of it is content."""
    return (None, text) if style is None else reasoning.split(style, text)
