"""BentoML entry point: `bentoml serve .` starts TRTLLM, whose workers share one supervised Triton.

Thin on purpose: the service's lifetime (start-up, readiness, shutdown, metrics) and the declaration of
`/generate`; the HTTP side is assembled in `trtllm_service.api.app` (routes, middlewares), the work
lives in `trtllm_service` (runtime, relay, chat templates, the APIs).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncGenerator
from typing import Any

import bentoml

from trtllm_service.api import app
from trtllm_service.api.generate.protocol import GenerateRequest
from trtllm_service.api.generate.serving import serve_generate
from trtllm_service.api.generation.protocol import (
    MaxTokens,
    Penalty,
    Priority,
    RepetitionPenalty,
    Seed,
    Temperature,
    TopK,
    TopP,
)
from trtllm_service.api.openapi import DocumentedService
from trtllm_service.api.server import deployment, early
from trtllm_service.api.server.admission import queue_summary, waiting_requests
from trtllm_service.api.server.bentoml_patches import quiet_logs, read_strictly, share_bentoml_log_handlers
from trtllm_service.api.server.heap import freeze_startup_heap
from trtllm_service.api.server.http_limits import quiet_client_gone
from trtllm_service.api.server.shutdown import Drain
from trtllm_service.api.server.startup import Startup
from trtllm_service.api.server.streaming import quiet_cut_streams
from trtllm_service.packed_model import read_pack_info
from trtllm_service.runtime import Runtime, default_model_tag, run_dir
from trtllm_service.settings import get_settings
from trtllm_service.triton.metrics import append_triton_metrics
from trtllm_service.triton.shared import serving_elsewhere

logger = logging.getLogger("trtllm_service")

SETTINGS = get_settings()
MODEL_TAG = default_model_tag(SETTINGS.model_tag, announce=True)  # one line: which model, and why
MODEL_NAME = MODEL_TAG.split(":")[0]
PACK_INFO = read_pack_info(bentoml.models.get(MODEL_TAG).path)
DRAIN = Drain(SETTINGS.shutdown_grace_s)  # SIGTERM: requests in flight finish, new ones get 503
app.prepare(SETTINGS)  # BentoML's fixes, connection limits, the port's early answers (before the app)


# Runtime settings and the base image (what goes into the image is bentofile.yaml's): traffic and GPUs
# from the packed engine, the GPU type from `bentoml build --arg gpu_type=...` if given
# (api/server/deployment.py explains each); the description is the Swagger page's and the Bento's README.
@bentoml.asgi_app(app.v1, path=deployment.OPENAI_ROUTE)
@bentoml.service(
    name=deployment.SERVICE_NAME,
    description=app.description(MODEL_NAME),
    labels=deployment.labels(),
    image=deployment.image(),  # NVIDIA's pinned image; what goes into it: bentofile.yaml
    service_class=DocumentedService,
    **deployment.service_config(PACK_INFO, SETTINGS, deployment.build_arguments()),
)
class TRTLLM:
    """Streams text from a TensorRT-LLM engine served by a supervised Triton."""

    model = bentoml.models.BentoModel(MODEL_TAG)

    def __init__(self) -> None:
        # Loaded and started in the background (api/server/startup.py): the worker answers meanwhile.
        self.startup: Startup[Runtime] = Startup(
            functools.partial(Runtime, self.model.path, str(self.model.tag.name), SETTINGS)
        )

    @bentoml.on_startup
    async def start_triton(self) -> None:
        """Returns at once: /livez 200, /readyz and the generation routes 503 (Retry-After) until
        the tokenizer is loaded and Triton is ready."""
        early.serving(run_dir(SETTINGS) / early.STOP_FLAG)  # this worker answers from here on
        share_bentoml_log_handlers(logger)
        quiet_logs(starting=lambda: self.startup.starting)  # no access lines of start-up polls
        quiet_cut_streams()
        quiet_client_gone()
        DRAIN.install()
        self.startup.begin(on_loaded=self._loaded, on_ready=self._ready)
        if serving_elsewhere(run_dir(SETTINGS)):
            # A worker replaced while its siblings serve: until it can serve too it takes no
            # connection (the shared socket hands them to the siblings), rather than answer 503.
            await self.startup.wait()

    def _loaded(self, runtime: Runtime) -> None:
        DRAIN.cut_by(runtime.relay.end_all)
        app.bind(runtime)

    def _ready(self, runtime: Runtime) -> None:
        freeze_startup_heap()  # the loaded worker out of the collector's full passes (api/server/heap.py)
        if runtime.triton.owner:  # one line per service, not per worker
            url = deployment.serving_url()
            logger.info(
                "serving %s on %s (OpenAI API at %s/v1, docs at %s/); %s",
                MODEL_NAME,
                url,
                url,
                url,
                queue_summary(),
            )

    @bentoml.on_shutdown
    async def stop_triton(self) -> None:
        await self.startup.stop()

    async def __is_ready__(self) -> bool:
        return self.startup.ready and not DRAIN.draining

    async def __is_alive__(self) -> bool:
        """False when the start failed, or once Triton's restarts in a row are used up: /livez 503,
        so the orchestrator replaces the service instead of leaving it unready for good."""
        runtime = self.startup.runtime
        return not self.startup.failed and not (runtime is not None and runtime.triton.gave_up)

    async def __metrics__(self, text: str) -> str:
        """BentoML's metrics (ours among them) followed by Triton's, so one scrape covers both."""
        runtime = self.startup.runtime
        if runtime is None:
            return text
        return await append_triton_metrics(
            text, runtime.triton.metrics_url, model_name=runtime.model_name, waiting=waiting_requests()
        )

    @bentoml.api
    async def generate(
        self,
        prompt: str,
        system_prompt: str | None = None,
        max_tokens: MaxTokens | None = None,
        temperature: Temperature | None = None,
        top_p: TopP | None = None,
        top_k: TopK | None = None,
        repetition_penalty: RepetitionPenalty | None = None,
        presence_penalty: Penalty | None = None,
        frequency_penalty: Penalty | None = None,
        seed: Seed | None = None,
        stop: list[str] | None = None,
        ignore_eos: bool = False,
        json_schema: dict[str, Any] | None = None,
        lora: str | None = None,
        priority: Priority | None = None,
    ) -> AsyncGenerator[str, None]:
        """Formats the prompt with the model's chat template and streams the answer as text;
        with `json_schema`, the answer is JSON that validates against it; with `lora`, the named
        LoRA adapter (packed with `pack_model.py --lora`) applies; with `priority` (lower first),
        its place in the service's queue.

        Errors before the first chunk are JSON responses with a 4xx/5xx status, never text in
        the stream: the first text is awaited before the response starts.
        """
        request = GenerateRequest.of(locals())  # the arguments above, as BentoML validated them
        return await serve_generate(request, self.startup, MODEL_NAME)  # type: ignore[return-value]  # a Response: see below


# `generate` returns its stream rather than being a generator (so errors before the first chunk
# can still be JSON responses with a status): tell BentoML and its clients that it streams.
TRTLLM.apis["generate"].is_stream = True  # type: ignore[attr-defined]  # a bentoml Service: mypy applies no class decorator
# Its body read by /v1's rules: a field it does not know is a 400 naming it, not ignored, and no
# value is coerced (`"10"` and `true` are not numbers); the fields' ranges are /v1's (generation/protocol.py).
read_strictly(TRTLLM.apis["generate"].input_spec)  # type: ignore[attr-defined]  # a bentoml Service: mypy applies no class decorator
# tokenizer routes, middlewares
app.install(
    TRTLLM,
    settings=SETTINGS,
    model_name=MODEL_NAME,
    drain=DRAIN,
    batch_known=PACK_INFO.batch_slots is not None,
)
