"""``POST /v1/completions``: text completions of one or more prompts (no chat template), as one JSON
body or OpenAI's chunk stream."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from trtllm_service.api.generation.choices import Choice, Result, start_choices
from trtllm_service.api.generation.sse_frames import sse_body
from trtllm_service.api.openai.completions.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
)
from trtllm_service.api.openai.protocol import new_id
from trtllm_service.api.openai.sse import SSE_DONE, CompletionChunkEncoder, error_frame
from trtllm_service.api.openai.usage import usage_frame, usage_info
from trtllm_service.api.server.error_shape import error_response
from trtllm_service.errors import APIError
from trtllm_service.relay.logprobs import TokenLogprob, completion_logprobs

if TYPE_CHECKING:
    from trtllm_service.api.generation.serving import GenerationServing

COMPLETIONS_ROUTE = "/v1/completions"


async def serve_completions(
    serving: GenerationServing, request: CompletionRequest, http_request: Request | None = None
) -> Response:
    """Answers a text completion request: no chat template; each prompt gets ``n`` choices."""
    try:
        adapter, served, metrics = serving.begin(request.model, COMPLETIONS_ROUTE)
    except APIError as exc:
        return error_response(exc)
    try:
        params = await serving.params(request, adapter, "logprobs")
        prompts = request.prompts()
        prepared = await serving.runtime.prepare_prompts(prompts, params)
        choices = await start_choices(
            serving.runtime, prepared, params, request.samples_per_prompt, http_request=http_request
        )
    except APIError as exc:
        metrics.done(exc.status)
        return error_response(exc)
    metrics.first_token()
    if request.echo:  # a token-id prompt echoes as its text (special tokens included)
        echoes = [p if isinstance(p, str) else serving.runtime.formatter.decode(p) for p in prompts]
        for choice in choices:
            choice.echo = echoes[choice.index // request.samples_per_prompt]
    prompt_tokens = sum(p.prompt_tokens for p in prepared)
    encoder = CompletionChunkEncoder(
        new_id("cmpl"), served, include_usage=request.include_usage, service_tier=request.answered_tier
    )

    top = request.logprob_count
    texts = serving.runtime.token_texts if top is not None else None

    def prompt_entries(choice: Choice) -> list[TokenLogprob] | None:
        """echo with logprobs: the prompt's tokens come first (the engine's prompt log probs)."""
        return choice.stream.prompt_logprobs if choice.echo or params.prompt_logprobs is not None else None

    def build(results: list[Result], cached: int) -> CompletionResponse:
        return CompletionResponse(
            model=served,
            choices=[
                CompletionChoice(
                    index=choice.index,
                    text=choice.echo + result.text,
                    finish_reason=result.finish_reason,  # type: ignore[arg-type]  # the engine ends with one of FinishReason
                    logprobs=completion_logprobs(
                        result.logprobs,
                        texts,
                        top,  # type: ignore[arg-type]  # top is set when texts is
                        len(choice.echo),
                        prompt_entries(choice),
                    )[0]
                    if texts is not None
                    else None,
                )
                for choice, result in zip(choices, results, strict=True)
            ],
            usage=usage_info(prompt_tokens, results, cached),
            service_tier=request.answered_tier,
        )

    offsets = {choice.index: len(choice.echo) for choice in choices}

    def delta(text: str, index: int, entries: list[TokenLogprob]) -> str:
        if texts is None:
            return encoder.text(text, index)
        body, offsets[index] = completion_logprobs(entries, texts, top, offsets[index])  # type: ignore[arg-type]  # top is set when texts is
        return encoder.text_logprobs(text, index, body)

    def stream() -> Response:
        opening = [
            encoder.text_logprobs(c.echo, c.index, completion_logprobs([], texts, top, 0, prompt)[0])  # type: ignore[arg-type]  # top is set when texts is
            if texts is not None and (prompt := prompt_entries(c))
            else encoder.text(c.echo, c.index)
            for c in choices
            if c.echo
        ]
        usage = usage_frame(request, encoder, choices, prompt_tokens)
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

    return await serving.respond(request, choices, http_request, stream, build, metrics, prompt_tokens)
