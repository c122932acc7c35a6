"""The service's engine room: the packed model, its tokenizer, the supervised Triton and the relay.

Both the plain `generate` API and the OpenAI routes go through `Runtime`, so context-length
checks, defaults and error mapping are the same everywhere.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_service.packing import layout_runtime_repository, read_pack_info
from trtllm_service.prompting import PromptFormatter
from trtllm_service.sampling import SamplingParams
from trtllm_service.settings import Settings
from trtllm_service.stream import Delta, GenerationError, TritonStream
from trtllm_service.triton_process import TritonPorts, TritonSupervisor

logger = logging.getLogger("trtllm_service")


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A prompt ready for the engine: its token count and the max_tokens to send."""

    prompt: str
    prompt_tokens: int
    max_tokens: int


class ContextLengthError(GenerationError):
    """Prompt plus requested completion do not fit the engine."""

    def __init__(self, max_len: int, prompt_tokens: int, completion_tokens: int) -> None:
        super().__init__(
            400,
            f"This model's maximum context length is {max_len} tokens. However, you requested "
            f"{prompt_tokens + completion_tokens} tokens ({prompt_tokens} in the prompt, "
            f"{completion_tokens} in the completion). Please reduce the length of the prompt or completion.",
            code="context_length_exceeded",
        )
        self.max_len = max_len
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens


class ModelNotFoundError(RuntimeError):
    """No packed model to serve; the message says how to make one."""


def default_model_tag(explicit: str | None) -> str:
    """The tag to serve: TRTLLM_MODEL when set, else the newest model pack_model.py packed."""
    import bentoml

    if explicit:
        try:
            return str(bentoml.models.get(explicit).tag)
        except bentoml.exceptions.NotFound:
            raise ModelNotFoundError(
                f"TRTLLM_MODEL={explicit!r} is not in the BentoML model store; see `bentoml models list`"
            ) from None
    packed = [model for model in bentoml.models.list() if model.info.labels.get("packed_by") == "pack_model"]
    if not packed:
        raise ModelNotFoundError(
            "no packed model in the BentoML model store: run `python pack_model.py --demo` "
            "(or pack an engine with --engine-dir / --hf-model) first"
        )
    return str(max(packed, key=lambda model: model.info.creation_time).tag)


def _load_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


class Runtime:
    """Owns Triton for one packed model and serves generation requests through it."""

    def __init__(self, model_path: Path, model_name: str, settings: Settings) -> None:
        self.model_path = Path(model_path)
        self.model_name = model_name
        self.settings = settings
        self.info = read_pack_info(self.model_path)
        self.tokenizer = _load_tokenizer(self.model_path / "tokenizer")
        self.formatter = PromptFormatter(self.tokenizer)
        self.max_seq_len = int(self.info.max_seq_len or self.info.max_input_len or 2048)
        self.max_input_len = int(self.info.max_input_len or self.max_seq_len)
        self._run_dir_owned = settings.run_dir is None
        self.run_dir = settings.run_dir or Path(tempfile.mkdtemp(prefix="trtllm-service-"))
        self.supervisor: TritonSupervisor | None = None
        self.relay: TritonStream | None = None
        self._was_ready = False

    @property
    def ready(self) -> bool:
        return self.supervisor is not None and self.supervisor.ready

    async def start(self) -> None:
        """Lays out the runtime repository, starts Triton and waits for it to be ready."""
        repository = layout_runtime_repository(self.model_path, self.run_dir / "repository")
        settings = self.settings
        ports = TritonPorts.choose(
            settings.triton_grpc_port,
            settings.triton_http_port,
            settings.triton_metrics_port,
            settings.triton_host,
        )
        self.supervisor = TritonSupervisor(
            repository,
            ports=ports,
            host=settings.triton_host,
            world_size=int(self.info.world_size),
            log_path=self.run_dir / "triton.log",
            startup_timeout_s=settings.triton_startup_timeout_s,
            max_restarts=settings.triton_max_restarts,
            restart_backoff_s=settings.triton_restart_backoff_s,
            verbose=settings.triton_log_verbose,
            on_state_change=self._on_state_change,
        )
        self.relay = TritonStream(self.supervisor.grpc_url, stream_timeout_s=settings.stream_timeout_s)
        try:
            await self.supervisor.start()
        except BaseException:
            await self.stop()  # a failed start leaves no process and no run directory behind
            raise
        logger.info("Triton is ready for %s (grpc %s)", self.model_name, self.supervisor.grpc_url)

    def _on_state_change(self, ready: bool) -> None:
        if ready and not self._was_ready and self.relay is not None:
            asyncio.get_running_loop().create_task(self.relay.reset())
        self._was_ready = ready

    async def stop(self) -> None:
        if self.supervisor is not None:
            await self.supervisor.stop()
        if self.relay is not None:
            await self.relay.reset()
        if self._run_dir_owned:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def kill_now(self) -> None:
        if self.supervisor is not None:
            self.supervisor.kill_now()

    # ---- requests --------------------------------------------------------------------------

    def prepare(
        self, prompt: str, max_tokens: int | None, *, default_max_tokens: int | None = None
    ) -> PreparedRequest:
        """Counts prompt tokens and settles max_tokens against the engine's context length.

        An explicit max_tokens that does not fit is an error; an unset one becomes what is left
        of the context (capped by `default_max_tokens`).
        """
        prompt_tokens = self.formatter.count_tokens(prompt)
        room = self.max_seq_len - prompt_tokens
        if prompt_tokens > self.max_input_len or room < 1:
            raise ContextLengthError(self.max_seq_len, prompt_tokens, max_tokens or 1)
        if max_tokens is None:
            max_tokens = room if default_max_tokens is None else min(room, default_max_tokens)
        elif max_tokens > room:
            raise ContextLengthError(self.max_seq_len, prompt_tokens, max_tokens)
        return PreparedRequest(prompt, prompt_tokens, max_tokens)

    def stream(self, request: PreparedRequest, params: SamplingParams) -> AsyncGenerator[Delta, None]:
        if self.relay is None or not self.ready:
            raise GenerationError(
                503, "the model is not ready yet (Triton is starting or restarting)", code="unavailable"
            )
        return self.relay.generate(request.prompt, params, request.max_tokens)


async def first_and_rest(stream: AsyncGenerator[Delta, None]) -> tuple[Delta, AsyncGenerator[Delta, None]]:
    """Waits for the first delta, so that errors surface before anything is sent to the client."""
    first = await anext(stream)
    return first, stream
