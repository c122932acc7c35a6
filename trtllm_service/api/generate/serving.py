"""`/generate` over the shared generation path, as every other route: the LoRA adapter its `lora`
names, its sampling parameters checked against what the engine can serve (`GenerationServing.params`:
beam search, guides, the engine's features), its prompt through the chat template, and its answer
streamed as plain text (UTF-8, as it comes). Errors before the first text are JSON answers with
their status, never text in the stream: the response reads the first text before it starts.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from trtllm_service.api.generate.protocol import GENERATE_ROUTE, GenerateRequest
from trtllm_service.api.generation.bodies import bound_serving
from trtllm_service.api.generation.serving import GenerationServing
from trtllm_service.api.server.admission import release_when_done, wait_turn
from trtllm_service.api.server.error_shape import error_response
from trtllm_service.api.server.metrics import RequestMetrics, count_rejected
from trtllm_service.api.server.startup import Startup
from trtllm_service.api.server.streaming import PushBody
from trtllm_service.errors import APIError
from trtllm_service.relay.client import EngineStream

MEDIA_TYPE = "text/plain; charset=utf-8"


async def serve_generate(request: GenerateRequest, startup: Startup[Any], model_name: str) -> Response:
    """Answers `/generate`: the streamed text, or the error's JSON answer. `startup`: the service's
    start-up (a 503 until the runtime exists, or after a failed start; counted under `model_name`)."""
    try:
        startup.serving()
        serving: GenerationServing = bound_serving()
    except APIError as exc:
        count_rejected(model_name, GENERATE_ROUTE, exc.status)
        return error_response(exc)
    try:
        adapter, _, metrics = serving.begin(request.lora, GENERATE_ROUTE, param="lora")
    except APIError as exc:
        return error_response(exc)
    runtime = serving.runtime
    try:
        params = await serving.params(request, adapter, "logprobs", guide_param=request.guide_param)
        prepared = await runtime.prepare_chat(
            request.chat_messages(),
            params,
            default_max_tokens=runtime.settings.default_max_tokens,
            param="prompt",
            budget_param="max_tokens",
        )
        await wait_turn(*params.queue_rank)  # the service's queue, where it has one
        stream = await runtime.generate(prepared)  # one engine request, seeded only when asked
        release_when_done([stream])  # its slot, once the engine is done with it
    except APIError as exc:
        metrics.done(exc.status)
        return error_response(exc)
    # returned at once: the response reads the first text before it starts (an error until then is
    # its JSON answer), while the way back to the server runs during the engine's work
    return PushBody(stream, TextFraming(stream, metrics, prepared.prompt_tokens), MEDIA_TYPE)


class TextFraming:
    """The body of `/generate`: the generated text, UTF-8, as it comes; a failure after the start
    aborts the connection (plain text has no way to report it)."""

    __slots__ = ("metrics", "prompt_tokens", "stream", "text", "waiting")

    def __init__(self, stream: EngineStream, metrics: RequestMetrics, prompt_tokens: int) -> None:
        self.stream = stream
        self.metrics = metrics
        self.prompt_tokens = prompt_tokens
        self.text = ""
        self.waiting = True

    def first(self, text: str) -> None:
        self.text, self.waiting = text, False
        self.metrics.first_token()

    def opening(self) -> bytes:
        return self.text.encode()

    def frame(self, text: str) -> bytes:
        return text.encode()

    def closing(self) -> bytes:
        return b""

    def failure(self, error: Exception) -> tuple[int, bytes | None]:
        return (error.status if isinstance(error, APIError) else 500), None

    def done(self, status: int) -> None:
        stream = self.stream
        stream.close()
        self.metrics.done(status, stream.finish_reason, self.prompt_tokens, stream.completion_tokens)
