"""BentoML entry point: `bentoml serve .` starts TRTLLM, which supervises a Triton running the model.

Thin on purpose: the work lives in `trtllm_service` (runtime, stream relay, prompting, OpenAI API).
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import AsyncGenerator
from typing import Annotated

import bentoml
from annotated_types import Ge, Le
from starlette.responses import JSONResponse, StreamingResponse

from trtllm_service.auth import APIKeyMiddleware, APIKeys
from trtllm_service.limits import ConcurrencyLimitMiddleware
from trtllm_service.metrics import append_triton_metrics
from trtllm_service.openai import routes as openai_routes
from trtllm_service.openai.errors import APIError, from_generation_error
from trtllm_service.runtime import Runtime, default_model_tag, first_and_rest
from trtllm_service.sampling import SamplingParams
from trtllm_service.settings import get_settings
from trtllm_service.stream import Delta, GenerationError

logger = logging.getLogger("trtllm_service")

SETTINGS = get_settings()
MODEL_TAG = default_model_tag(SETTINGS.model_tag)


@bentoml.asgi_app(openai_routes.app, path="/v1")
@bentoml.service(
    name="trtllm",
    traffic={"timeout": 600},  # concurrency is limited by ConcurrencyLimitMiddleware (OpenAI's 429 shape)
    resources={"gpu": 1, "gpu_type": "nvidia-l4"},
    workers=1,
)
class TRTLLM:
    """Streams text from a TensorRT-LLM engine served by a supervised Triton."""

    model = bentoml.models.BentoModel(MODEL_TAG)

    def __init__(self) -> None:
        self.runtime = Runtime(self.model.path, str(self.model.tag.name), SETTINGS)
        atexit.register(self.runtime.kill_now)
        openai_routes.bind(self.runtime)

    @bentoml.on_startup
    async def start_triton(self) -> None:
        share_bentoml_log_handlers(logger)
        await self.runtime.start()

    @bentoml.on_shutdown
    async def stop_triton(self) -> None:
        await self.runtime.stop()

    async def __is_ready__(self) -> bool:
        return self.runtime.ready

    async def __metrics__(self, text: str) -> str:
        """BentoML's metrics followed by Triton's, so one scrape covers both."""
        supervisor = self.runtime.supervisor
        return await append_triton_metrics(text, supervisor.metrics_url if supervisor else None)

    @bentoml.api
    async def generate(
        self,
        prompt: str = "Explain superconductors in plain English.",
        system_prompt: str | None = None,
        max_tokens: Annotated[int, Ge(1)] | None = None,
        temperature: Annotated[float, Ge(0), Le(2)] | None = None,
        top_p: Annotated[float, Ge(0), Le(1)] | None = None,
        top_k: Annotated[int, Ge(0)] | None = None,
        repetition_penalty: Annotated[float, Ge(0.01)] | None = None,
        presence_penalty: Annotated[float, Ge(-2), Le(2)] | None = None,
        frequency_penalty: Annotated[float, Ge(-2), Le(2)] | None = None,
        seed: Annotated[int, Ge(0)] | None = None,
        stop: list[str] | None = None,
    ) -> AsyncGenerator[str, None]:
        """Formats the prompt with the model's chat template and streams the answer as text.

        Errors before the first chunk are JSON responses with a 4xx/5xx status, never text in
        the stream: the first delta is awaited before the response starts.
        """
        try:
            if stop is not None and any(not s for s in stop):
                raise APIError.bad_request("stop strings must not be empty", param="stop")
            params = SamplingParams(
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                repetition_penalty=repetition_penalty,
                presence_penalty=presence_penalty,
                frequency_penalty=frequency_penalty,
                seed=seed,
                stop=tuple(stop or ()),
            )
            try:
                text = self.runtime.formatter.from_prompt(prompt, system_prompt)
            except ValueError as exc:
                raise APIError.bad_request(str(exc), param="prompt") from None
            request = self.runtime.prepare(text, max_tokens, default_max_tokens=SETTINGS.default_max_tokens)
            first, rest = await first_and_rest(self.runtime.stream(request, params))
        except GenerationError as exc:
            return error_response(from_generation_error(exc))  # type: ignore[return-value]
        except APIError as exc:
            return error_response(exc)  # type: ignore[return-value]
        # A StreamingResponse of our own: an error after the first chunk then aborts the
        # connection instead of ending the body as if the answer were complete.
        return StreamingResponse(relay_text(first, rest), media_type="text/plain; charset=utf-8")  # type: ignore[return-value]


# `generate` returns its stream rather than being a generator (so errors before the first chunk
# can still be JSON responses with a status): tell BentoML and its clients that it streams.
TRTLLM.apis["generate"].is_stream = True


TRTLLM.add_asgi_middleware(ConcurrencyLimitMiddleware, limit=SETTINGS.max_concurrency)
if SETTINGS.api_keys:  # covers /generate and /v1/*; probes, metrics and docs stay open
    TRTLLM.add_asgi_middleware(APIKeyMiddleware, api_keys=APIKeys(SETTINGS.api_keys))


def share_bentoml_log_handlers(target: logging.Logger) -> None:
    """Our INFO lines (Triton's output among them) go where BentoML's own log lines go.

    BentoML configures its loggers when the worker starts; ours would otherwise reach only the
    root logger, which shows warnings and errors alone.
    """
    source = logging.getLogger("bentoml")
    if target.handlers or not source.handlers:
        return
    target.setLevel(logging.INFO)
    for handler in source.handlers:
        target.addHandler(handler)
    target.propagate = False


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


async def relay_text(first: Delta, rest: AsyncGenerator[Delta, None]) -> AsyncGenerator[str, None]:
    """Yields the text deltas; closing it (client disconnect) cancels the Triton request."""
    try:
        if first.text:
            yield first.text
        if first.finish_reason is None:
            async for delta in rest:
                if delta.text:
                    yield delta.text
    finally:
        await rest.aclose()
