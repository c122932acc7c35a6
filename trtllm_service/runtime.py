"""The service's runtime, assembled once per worker: the packed model, its tokenizer, its flavour
(relay/flavors.py: inputs, readers, LoRA policy, capabilities), the one Triton, and the relay to it.

Both the plain `generate` API and the OpenAI routes go through `Runtime`: prompts are templated,
tokenized and settled into a `GenerationRequest` here (in a worker thread when they are long, so one
large prompt cannot stall the streams of others), and streamed through the relay.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tensorrtllm_backend import pinned
from tensorrtllm_backend.detokenizer import IncrementalDetokenizer
from trtllm_service.chat.reasoning import style_of
from trtllm_service.chat.template import PromptFormatter
from trtllm_service.errors import APIError
from trtllm_service.lora_adapters import (
    LoadRefused,
    LoraError,
    LoraLimits,
    NotLoaded,
    SharedAdapters,
    already_loaded,
    check_name,
    resolve_source,
)
from trtllm_service.packed_model import end_ids, layout_runtime_repository, read_pack_info, vocab_size
from trtllm_service.relay.client import EngineStream, TritonRelay
from trtllm_service.relay.flavors import Flavor, flavor_of, flavor_type
from trtllm_service.relay.guided import Guide, GuideChecker, GuideRequestError
from trtllm_service.relay.logprobs import TokenTexts
from trtllm_service.relay.prompting import ChatPrompt, RequestPreparer
from trtllm_service.relay.request import EngineLimits, GenerationRequest, SamplingParams
from trtllm_service.served_model import ModelNotFoundError as ModelNotFoundError  # re-exported
from trtllm_service.served_model import default_model_tag as default_model_tag  # service.py, dev.sh
from trtllm_service.settings import Settings
from trtllm_service.tokenizer_loading import load_tokenizer
from trtllm_service.triton.metrics import TRITON_RESTARTS, served_engine
from trtllm_service.triton.process import ModelProbe, TritonPorts, TritonStartupError, TritonSupervisor
from trtllm_service.triton.shared import SharedTriton
from trtllm_service.versions import installed_tensorrt_llm, triton_version

logger = logging.getLogger("trtllm_service")

STILL_STARTING_S = 20.0
"""While Triton starts (minutes for a large engine), its owner says so this often: no silent minute."""

INLINE_PROMPT_CHARS = 2048
"""Prompts up to this many characters are templated and tokenized on the event loop (well under a
millisecond); longer ones in a worker thread."""


def run_dir(settings: Settings, service_pid: int | None = None) -> Path:
    """TRTLLM_RUN_DIR, else a directory shared by every worker of one `bentoml serve` (they are
    children of the same process, `service_pid`: the parent's by default): where Triton's
    repository, log, ownership and counters live."""
    pid = os.getppid() if service_pid is None else service_pid
    return settings.run_dir or Path(tempfile.gettempdir()) / f"trtllm-service-{pid}"


def check_tensorrt_llm(version: str | None) -> None:
    """Refuses, in one line, a TensorRT-LLM older than the service supports (None: not installed)."""
    if version is not None and not pinned.supported(version):
        raise TritonStartupError(
            f"TensorRT-LLM {version} is older than {pinned.MIN_TENSORRT_LLM}, the oldest this service starts "
            f"with; use the pinned image {pinned.IMAGE} (TensorRT-LLM {pinned.TENSORRT_LLM_VERSION})"
        )


class Runtime:
    """Serves generation requests for one packed model through the one Triton of the service."""

    def __init__(self, model_path: Path, model_name: str, settings: Settings) -> None:
        """The pack's facts and the service's one Triton, not started yet (milliseconds); `load`
        reads the tokenizer and builds the rest, in a thread while Triton starts (Startup)."""
        self.model_path = Path(model_path)
        self.model_name = model_name
        self.settings = settings
        self.info = read_pack_info(self.model_path)
        self.flavor_type = flavor_type(self.info)  # what Triton needs before the tokenizer is read
        self._token_texts: TokenTexts | None = None
        self._run_dir_owned = settings.run_dir is None
        self.run_dir = run_dir(settings)
        # LoRA name -> id, files, rank, ...: the packed adapters and those loaded while serving
        self.adapters = SharedAdapters(self.info.loras, self.model_path, self.run_dir)
        self.lora_limits = LoraLimits.of_pack(self.model_path, self.info)
        self.triton = SharedTriton(self.run_dir, self._make_supervisor, on_change=self._on_change)
        self.engine: str | None = None  # learned from Triton once it is ready
        self._tasks: set[asyncio.Task[None]] = set()
        self.loaded = False  # `load` ended and `loaded_now` ran: requests may come
        self._ready_before_loaded = False  # Triton was ready before that: `loaded_now` catches up

    def load(self) -> None:
        """Reads the tokenizer and builds what requests need from it (blocking: seconds)."""
        settings = self.settings
        # transformers' import is most of it: a second, more on a loaded machine
        logger.info("%s: loading its tokenizer (transformers)", self.model_name)
        started = time.monotonic()
        self.tokenizer = load_tokenizer(self.model_path / "tokenizer")
        logger.info("%s: tokenizer loaded in %.1f s", self.model_name, time.monotonic() - started)
        self.formatter = PromptFormatter(
            self.tokenizer, content_special_tokens=settings.content_special_tokens
        )
        IncrementalDetokenizer(self.tokenizer)  # builds the byte table now, not in a first request
        self.reasoning = style_of(self.info.reasoning_parser)  # pack_model.py --reasoning-parser
        max_seq_len = int(self.info.max_seq_len or self.info.max_input_len or 2048)
        self.limits = EngineLimits(
            max_seq_len=max_seq_len,
            max_input_len=int(self.info.max_input_len or max_seq_len),
            end_ids=end_ids(self.info) or self._tokenizer_end_ids(),
            vocab_size=vocab_size(self.model_path) or len(self.tokenizer),
        )
        self.preparer = RequestPreparer(self.formatter, self.limits)
        self.guides = GuideChecker(self.tokenizer, self.limits.vocab_size)
        self.flavor: Flavor = flavor_of(
            self.model_path, self.info, vocab_size=self.limits.vocab_size, tokenizer=self.tokenizer
        )
        self.flavor.adapters = self.adapters
        self.relay = TritonRelay(
            self.triton.grpc_address,
            self.flavor,
            stream_timeout_s=settings.stream_timeout_s,
            idle_timeout_s=settings.stream_idle_timeout_s,
            stream_interval_s=settings.stream_interval_ms / 1000.0,
        )
        self.relay.pace.interval_s = settings.loaded_stream_interval_ms / 1000.0

    def loaded_now(self) -> None:
        """On the event loop, once `load` has ended: requests may come; a Triton that became ready
        meanwhile is taken in now (reconnect, learn its engine), as a later ready one will be."""
        self.loaded = True
        if self._ready_before_loaded:
            self._on_change(True)

    @property
    def token_texts(self) -> TokenTexts:
        """Each token's text and bytes (for log probs), made on first use."""
        if self._token_texts is None:
            self._token_texts = TokenTexts(self.tokenizer)
        return self._token_texts

    @property
    def max_seq_len(self) -> int:
        return self.limits.max_seq_len

    def _tokenizer_end_ids(self) -> tuple[int, ...]:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return (int(eos),) if eos is not None else ()

    @property
    def ready(self) -> bool:
        return self.loaded and self.triton.ready

    def _make_supervisor(self) -> TritonSupervisor:
        settings = self.settings
        repository = layout_runtime_repository(self.model_path, self.run_dir / "repository")
        return TritonSupervisor(
            repository,
            models=self.flavor_type.models,
            run_dir=self.run_dir,
            ports=TritonPorts(
                settings.triton_grpc_port, settings.triton_http_port, settings.triton_metrics_port
            ),
            host=settings.triton_host,
            world_size=int(self.info.world_size),
            llmapi=self.flavor_type.llmapi_launch,
            startup_timeout_s=settings.triton_startup_timeout_s,
            max_restarts=settings.triton_max_restarts,
            restart_backoff_s=settings.triton_restart_backoff_s,
            stall_timeout_s=settings.triton_stall_timeout_s,
            verbose=settings.triton_log_verbose,
            on_restart=TRITON_RESTARTS.labels(self.model_name).inc,
            probe=ModelProbe(probe[0], dict(probe[1])) if (probe := self.flavor_type.probe) else None,
        )

    async def start(self) -> None:
        """Owns and starts Triton (waiting until it is ready), or follows the worker that owns it.
        Every worker first refuses a TensorRT-LLM older than pinned.MIN_TENSORRT_LLM."""
        tensorrt_llm = installed_tensorrt_llm()
        check_tensorrt_llm(tensorrt_llm)
        started = time.monotonic()
        note = asyncio.get_running_loop().create_task(self._say_still_starting(started))
        try:
            await self.triton.start()
        except BaseException:
            await self.stop()  # a failed start leaves no process and no run directory behind
            raise
        finally:
            note.cancel()
        if self.triton.owner:
            triton = await asyncio.to_thread(triton_version, self.triton.http_url)
            logger.info(
                "Triton is ready for %s in %.1f s: Triton %s, TensorRT-LLM %s",
                self.model_name,
                time.monotonic() - started,
                triton or "(version unknown)",
                tensorrt_llm or "not installed (stand-in engines serve)",
            )
            options = self.info.llm_options_line()  # pack_model.py --config / --set
            if options:
                logger.info("%s: %s", self.model_name, options)

    async def _say_still_starting(self, started: float) -> None:
        """Every STILL_STARTING_S, from Triton's owner: how long so far, and where Triton says more."""
        while True:
            await asyncio.sleep(STILL_STARTING_S)
            if self.triton.owner:
                logger.info(
                    "Triton is still loading %s (%.0f s so far; its own log: %s)",
                    self.model_name,
                    time.monotonic() - started,
                    self.run_dir / "triton.log",
                )

    def _on_change(self, ready: bool) -> None:
        if not ready:
            return
        if not self.loaded:
            self._ready_before_loaded = True
            return
        self.flavor.triton_restarted()  # a new Triton holds no adapter
        with contextlib.suppress(RuntimeError):  # no running loop: nothing to reset
            loop = asyncio.get_running_loop()
            for work in (self.relay.reset(), self.learn_engine()):  # a new Triton: reconnect, ask
                task = loop.create_task(work)
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def learn_engine(self) -> None:
        """Which engine answers: the C++ backend, or what the Python model reports in its metric."""
        if self.info.backend == "tensorrtllm":
            engine: str | None = "tensorrt_llm (C++ backend)"
        else:
            engine = await served_engine(self.triton.metrics_url)
        if engine is None or engine == self.engine:
            return
        self.engine = engine
        if self.flavor.reference_means_missing and engine == "reference":
            logger.warning(
                "%s is served by the reference engine (PyTorch): tensorrt_llm cannot be imported where "
                "Triton runs. Set TRTLLM_REQUIRE_TENSORRT_LLM=1 to make that a start-up error.",
                self.model_name,
            )
        else:
            logger.info(
                "%s is served by the %s engine (%s flavour)", self.model_name, engine, self.flavor.name
            )

    def kill_now(self) -> None:
        """SIGKILL to the Triton this worker owns, and its whole tree (a stop that got stuck)."""
        self.triton.kill_now()

    async def stop(self) -> None:
        owner = self.triton.owner
        await self.triton.stop()
        if self.loaded:
            await self.relay.close()
            self.guides.close()
        if owner and self._run_dir_owned:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    # ---- requests --------------------------------------------------------------------------------------

    async def prepare_chat(
        self,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        *,
        default_max_tokens: int | None = None,
        param: str = "messages",
        budget_param: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        reasoning_effort: str | None = None,
    ) -> GenerationRequest:
        """Renders the chat template, tokenizes and settles (400 for what cannot be served)."""
        prompt = ChatPrompt(messages, tools, reasoning_effort, param)
        prepare = functools.partial(
            self.preparer.chat, default_max_tokens=default_max_tokens, budget_param=budget_param
        )
        return await self._maybe_in_thread(prompt.size, prepare, prompt, params)

    async def count_chat_tokens(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        reasoning_effort: str | None = None,
    ) -> int:
        """The prompt tokens `prepare_chat` would send for these messages (the same rendering)."""
        prompt = ChatPrompt(messages, tools, reasoning_effort)
        return len(await self._maybe_in_thread(prompt.size, self.preparer.chat_ids, prompt))

    async def check_guide(self, guide: Guide | None, param: str) -> None:
        """A 400 naming `param` for a guide the engine would refuse (relay/guided.GuideChecker;
        off the event loop)."""
        if guide is None:
            return
        try:
            await self.guides.check(guide, param)
        except GuideRequestError as exc:
            raise APIError.bad_request(str(exc), param=exc.param, code="invalid_value") from None

    async def prepare_prompts(
        self, prompts: Sequence[str | Sequence[int]], params: SamplingParams
    ) -> list[GenerationRequest]:
        """Raw prompts (no chat template), texts or token ids, each settled (a text tokenized)."""
        return await self._maybe_in_thread(sum(map(len, prompts)), self.preparer.prompts, prompts, params)

    @staticmethod
    async def _maybe_in_thread(size: int, fn: Any, *args: Any) -> Any:
        if size <= INLINE_PROMPT_CHARS:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

    def adapter(self, name: str | None, param: str = "model") -> str | None:
        """The LoRA adapter a request names (None: the served model, or no name): the one lookup of
        /generate's `lora`, every /v1 route's and /v1/messages' `model`. Another name is OpenAI's 404
        model_not_found for a `model`, a 400 naming /generate's `lora` field."""
        if name is None or (name == self.model_name and param == "model"):
            return None
        if name in self.adapters:
            return name
        if param == "model":
            raise APIError.model_not_found(name)
        known = ", ".join(self.adapters) or "none packed"
        raise APIError.bad_request(f"unknown LoRA adapter {name!r} ({known})", param=param)

    async def load_adapter(self, name: str, lora_path: str, *, replace: bool = False) -> dict[str, Any]:
        """Checks the PEFT adapter `lora_path` names against the packed model and lists it under
        `name` for every worker (vLLM's /v1/load_lora_adapter; `replace`: its load_inplace); a 400
        naming what is wrong, with nothing changed, otherwise."""
        try:
            check_name(name)
        except LoraError as exc:
            raise APIError.bad_request(str(exc), param="lora_name") from None
        if name == self.model_name or self.adapters.is_packed(name):
            what = "the served base model" if name == self.model_name else "an adapter packed with the model"
            raise APIError.bad_request(
                f"The lora adapter name '{name}' conflicts with {what}.", param="lora_name"
            )
        if not replace and name in self.adapters.loaded():
            raise APIError.bad_request(already_loaded(name), param="lora_name")

        def load() -> dict[str, Any]:
            source = resolve_source(lora_path, self.settings.lora_root)
            adapter = self.lora_limits.check(source)
            keep_s = self.settings.stream_timeout_s
            dtype = self.lora_limits.dtype
            return self.adapters.load(
                name, source, adapter, dtype, given=lora_path, replace=replace, keep_s=keep_s
            )

        try:
            return await asyncio.to_thread(load)
        except LoadRefused as exc:
            raise APIError.bad_request(str(exc), param="lora_name") from None
        except LoraError as exc:
            raise APIError.bad_request(f"LoRA adapter {name!r}: {exc}", param="lora_path") from None

    async def unload_adapter(self, name: str) -> dict[str, Any]:
        """Drops the loaded adapter `name` for every worker: requests in flight finish, new ones get
        a 404 (vLLM's /v1/unload_lora_adapter)."""
        if self.adapters.is_packed(name):
            raise APIError.bad_request(
                f"The lora adapter '{name}' is packed with the model and cannot be unloaded.",
                param="lora_name",
            )
        try:
            return await asyncio.to_thread(self.adapters.unload, name, keep_s=self.settings.stream_timeout_s)
        except NotLoaded as exc:
            raise APIError(404, str(exc), param="lora_name", code="model_not_found") from None

    async def generate(self, request: GenerationRequest) -> EngineStream:
        """Starts `request`; read the stream, and close it when done (that cancels an unfinished one).
        The flavour decides how its LoRA adapter travels (by name, or as a task id with its weights
        the first time and whenever the engine no longer holds it)."""
        request, with_weights = self.flavor.with_adapter(request)
        return await self.relay.start(request, with_weights)
