"""Runtime options: the knobs filled into the Triton model configs, checked against the source, and
the command-line groups that set them (each field is the argument of its name: RuntimeOptions.from_args).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, ClassVar

from tensorrtllm_backend.lora import HF_TO_TRTLLM
from tensorrtllm_backend.repository import DEFAULTS, ENSEMBLE, FLAVORS, LLMAPI, RepositoryFlavor
from trtllm_service.chat.reasoning import REASONING_PARSERS
from trtllm_service.packed_model import PackError
from trtllm_service.packing.adapters import LORA_DTYPES
from trtllm_service.packing.sources import LOGITS_DTYPES, ModelSource

SCHEDULER_POLICIES = ("max_utilization", "guaranteed_no_evict")
STAND_IN_ENGINES = ("reference", "synthetic")
LLMAPI_ENGINES = ("tensorrt_llm", *STAND_IN_ENGINES)
DTYPES = ("auto", "float16", "bfloat16", "float32")
ENSEMBLE_LORA_RANK = (
    "--max-lora-rank is the llmapi flavour's: an ensemble engine's LoRA rank and modules are fixed when it "
    "is built (trtllm-build --lora_plugin auto --max_lora_rank R --lora_target_modules ...)"
)


@dataclass(frozen=True)
class RuntimeOptions:
    """Runtime knobs filled into the Triton model configs (see ``pack_model.py --help``)."""

    max_batch_size: int | None = None
    kv_cache_free_gpu_mem_fraction: float = 0.9
    max_tokens_in_paged_kv_cache: int | None = None
    batch_scheduler_policy: str = DEFAULTS["batch_scheduler_policy"]
    enable_kv_cache_reuse: bool = False
    enable_chunked_context: bool = False
    max_queue_delay_microseconds: int = 0
    max_queue_size: int = 0
    preprocessing_instances: int = 1
    exclude_input_in_output: bool = True
    engine: str | None = None  # None: tensorrt_llm for llmapi, reference for the ensemble
    step_delay_ms: float = 0.0
    engine_instances: int = 1  # synthetic only: token sources (stub processes) side by side
    flavor: str | None = None  # None: llmapi, except for a prebuilt TensorRT engine (ensemble, legacy)
    tp_size: int | None = None
    pp_size: int | None = None
    max_num_tokens: int | None = None
    max_seq_len: int | None = None
    dtype: str = "auto"
    trust_remote_code: bool = False
    lora_cache_adapters: int = 8
    max_lora_rank: int | None = None  # llmapi: LoRA without packed adapters (vLLM's --max-lora-rank)
    lora_target_modules: tuple[str, ...] | None = None  # with it: Hugging Face names (None: all)
    guided_decoding: bool | None = None  # None: on (ensemble: write the xgrammar tokenizer info)
    # --build-engine only (trtllm-build's limits; None: see engine_build.trtllm_build_command)
    max_input_len: int | None = None
    max_beam_width: int | None = None
    gather_generation_logits: bool | None = None  # None: on
    gather_context_logits: bool | None = None  # None: off
    reasoning_parser: str | None = None  # the service splits the answer's thinking (chat.reasoning)

    BUILD_OPTIONS: ClassVar[dict[str, tuple[str, str]]] = {
        "max_input_len": ("--max-input-len", "max_input_len"),
        "max_beam_width": ("--max-beam-width", "max_beam_width"),
        "gather_generation_logits": ("--gather-generation-logits", "gather_generation_logits"),
        "gather_context_logits": ("--gather-context-logits", "gather_context_logits"),
    }
    """Options that only trtllm-build applies: field -> (pack flag, the engine property it sets)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RuntimeOptions:
        """The options pack_model's command line gave: each field is the argument of its name (the
        groups below), so that a new option is a field and its argument, nothing else."""
        return cls(**{field.name: getattr(args, field.name) for field in dataclasses.fields(cls)})

    def llm_beam_width(self, source: ModelSource, flavor: RepositoryFlavor) -> int | None:
        """--max-beam-width for a checkpoint served by the LLM API: model.yaml's max_beam_width, the
        beams EVERY request then runs (1.2.1's executor refuses other widths; docs/api.md: Beam search)."""
        if flavor.llm_api and source.backend == "python" and self.max_beam_width:
            return self.max_beam_width
        return None

    def without_build_options(self) -> RuntimeOptions:
        """These options with the --build-engine ones cleared (what packing the built engine takes)."""
        cleared: dict[str, Any] = dict.fromkeys(self.BUILD_OPTIONS)  # each an optional field
        return dataclasses.replace(self, **cleared)

    def guides(self, flavor: RepositoryFlavor) -> bool:
        """Whether the packed model is to guide answers (the LLM API always does)."""
        return flavor.llm_api or self.guided_decoding is not False

    @property
    def asked_flavor(self) -> RepositoryFlavor | None:
        """The flavour --flavor names (None: not given; validate() refuses an unknown name)."""
        return FLAVORS.get(self.flavor) if self.flavor is not None else None

    def flavor_for(self, source: ModelSource) -> RepositoryFlavor:
        """The repository flavour: as asked, else llmapi for every source the LLM API model serves.

        That is every Hugging Face checkpoint (--hf-model, --demo): NVIDIA's llmapi model at 1.2.1
        runs the PyTorch backend from one. Only a prebuilt TensorRT engine (--engine-dir, and what
        --build-engine builds) is the legacy ensemble's (pinned.ENSEMBLE_LEGACY_WARNING).
        """
        asked = self.asked_flavor
        if asked is not None:
            return asked
        return ENSEMBLE if source.mode == "engine" else LLMAPI

    def validate(self) -> None:
        """Raises PackError for a value out of range."""
        if self.flavor is not None and self.flavor not in FLAVORS:
            raise PackError(f"--flavor must be one of {', '.join(FLAVORS)}, got {self.flavor!r}")
        for option, value in (
            ("--tp-size", self.tp_size),
            ("--pp-size", self.pp_size),
            ("--max-num-tokens", self.max_num_tokens),
            ("--lora-cache-adapters", self.lora_cache_adapters),
            ("--max-lora-rank", self.max_lora_rank),
            ("--max-input-len", self.max_input_len),
            ("--max-beam-width", self.max_beam_width),
        ):
            if value is not None and value < 1:
                raise PackError(f"{option} must be >= 1, got {value}")
        self._validate_lora()
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise PackError(f"--max-seq-len must be >= 2, got {self.max_seq_len}")
        if self.dtype not in DTYPES:
            raise PackError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise PackError(f"--max-batch-size must be >= 1, got {self.max_batch_size}")
        fraction = self.kv_cache_free_gpu_mem_fraction
        if not 0.0 < fraction <= 1.0:
            raise PackError(f"--kv-cache-free-gpu-mem-fraction must be in (0, 1], got {fraction}")
        if self.max_tokens_in_paged_kv_cache is not None and self.max_tokens_in_paged_kv_cache < 1:
            raise PackError(
                f"--max-tokens-in-paged-kv-cache must be >= 1, got {self.max_tokens_in_paged_kv_cache}"
            )
        if self.batch_scheduler_policy not in SCHEDULER_POLICIES:
            raise PackError(
                f"--batch-scheduler-policy must be one of {', '.join(SCHEDULER_POLICIES)}, "
                f"got {self.batch_scheduler_policy!r}"
            )
        if self.max_queue_delay_microseconds < 0:
            raise PackError(
                f"--max-queue-delay-microseconds must be >= 0, got {self.max_queue_delay_microseconds}"
            )
        if self.max_queue_size < 0:
            raise PackError(f"--max-queue-size must be >= 0, got {self.max_queue_size}")
        if self.preprocessing_instances < 1:
            raise PackError(f"--preprocessing-instances must be >= 1, got {self.preprocessing_instances}")
        if self.engine is not None and self.engine not in LLMAPI_ENGINES:
            raise PackError(f"--engine must be one of {', '.join(LLMAPI_ENGINES)}, got {self.engine!r}")
        asked = self.asked_flavor
        if self.engine == LLMAPI.default_engine and asked is not None and not asked.llm_api:
            raise PackError(
                "--engine tensorrt_llm goes with --flavor llmapi (the ensemble's TensorRT-LLM is an engine "
                "built with trtllm-build: --engine-dir or --build-engine)"
            )
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise PackError(
                f"--reasoning-parser must be one of {', '.join(REASONING_PARSERS)}, got {self.reasoning_parser!r}"
            )
        if not 0.0 <= self.step_delay_ms <= 60_000.0:
            raise PackError(f"--step-delay-ms must be within [0, 60000], got {self.step_delay_ms}")
        if self.step_delay_ms and self.engine != "synthetic":
            raise PackError("--step-delay-ms goes with --engine synthetic only")
        if not 1 <= self.engine_instances <= 64:
            raise PackError(f"--engine-instances must be within [1, 64], got {self.engine_instances}")
        if self.engine_instances > 1 and (
            self.engine != "synthetic" or (asked is not None and asked.llm_api)
        ):
            raise PackError(
                "--engine-instances goes with --engine synthetic and the ensemble flavour only (an engine "
                "batches requests itself: one instance)"
            )

    def _validate_lora(self) -> None:
        """PackError for --lora-target-modules naming a module the engine has no LoRA for, or given
        without --max-lora-rank, and for either on the ensemble flavour (its engine's build decides)."""
        modules = self.lora_target_modules
        if modules is not None:
            unknown = [m for m in modules if m not in HF_TO_TRTLLM]
            if unknown or not modules:
                raise PackError(
                    f"--lora-target-modules takes Hugging Face module names from {', '.join(HF_TO_TRTLLM)}, "
                    f"got {','.join(modules) or 'none'!r}"
                )
            if self.max_lora_rank is None:
                raise PackError("--lora-target-modules goes with --max-lora-rank R")
        asked = self.asked_flavor
        if self.max_lora_rank is not None and asked is not None and not asked.llm_api:
            raise PackError(ENSEMBLE_LORA_RANK)

    def template_values(self, source: ModelSource) -> dict[str, str]:
        """The template values these options and the source's limits give (paths not included).

        Raises:
            PackError: An option exceeds what the engine was built for.
        """
        self.validate()
        flavor = self.flavor_for(source)
        if not flavor.llm_api:
            for option, value in (
                ("--max-num-tokens", self.max_num_tokens),
                ("--trust-remote-code", self.trust_remote_code or None),
                ("--dtype", None if self.dtype == "auto" else self.dtype),
            ):
                if value is not None:
                    raise PackError(f"{option} is an LLM API option: it goes with --flavor llmapi")
        if self.max_lora_rank is not None and not flavor.llm_api:
            raise PackError(ENSEMBLE_LORA_RANK)
        if source.backend != "python":
            if flavor.llm_api:
                raise PackError(
                    "--engine-dir is a prebuilt engine for the C++ backend: it goes with --flavor ensemble"
                )
            if self.engine not in (None, "reference"):
                raise PackError(
                    f"--engine {self.engine} replaces the engine: it goes with --hf-model or --demo, "
                    "not --engine-dir"
                )
        self._refuse_build_options(source, flavor)
        if self.engine_instances > 1 and flavor.llm_api:
            raise PackError(
                "--engine-instances is the ensemble flavour's (synthetic token sources side by side); "
                "the llmapi flavour, the default here, runs one LLM: add --flavor ensemble"
            )
        if self.guided_decoding is False and flavor.llm_api:
            raise PackError(
                "--no-guided-decoding goes with the ensemble flavour (the LLM API guides with xgrammar from "
                "the tokenizer it loads, and needs nothing packed for it)"
            )
        if source.max_seq_len and self.max_seq_len and self.max_seq_len > source.max_seq_len:
            raise PackError(
                f"--max-seq-len {self.max_seq_len} exceeds what the model was built or trained for "
                f"({source.max_seq_len})"
            )
        batch = self.max_batch_size
        if source.max_batch_size is not None and batch is not None and batch > source.max_batch_size:
            raise PackError(
                f"--max-batch-size {batch} exceeds the engine's build_config.max_batch_size "
                f"{source.max_batch_size}"
            )
        batch = batch or source.max_batch_size or int(DEFAULTS["triton_max_batch_size"])
        values = {
            "triton_max_batch_size": str(batch),
            "max_beam_width": str(self.llm_beam_width(source, flavor) or source.max_beam_width),
            "kv_cache_free_gpu_mem_fraction": repr(float(self.kv_cache_free_gpu_mem_fraction)),
            "batch_scheduler_policy": self.batch_scheduler_policy,
            "enable_kv_cache_reuse": _bool(self.enable_kv_cache_reuse),
            "enable_chunked_context": _bool(self.enable_chunked_context),
            "max_queue_delay_microseconds": str(self.max_queue_delay_microseconds),
            "max_queue_size": str(self.max_queue_size),
            "preprocessing_instance_count": str(self.preprocessing_instances),
            "exclude_input_in_output": _bool(self.exclude_input_in_output),
            "max_seq_len": str(self.max_seq_len or source.max_seq_len or 0),
            **flavor.engine_values(self.engine),
            "synthetic_step_delay_ms": repr(float(self.step_delay_ms)),
            "engine_instance_count": str(self.engine_instances),
            "tp_size": str(self.tp_size or source.tp_size),
            "pp_size": str(self.pp_size or source.pp_size),
            "llm_max_batch_size": str(self.max_batch_size) if self.max_batch_size else "null",
            "max_num_tokens": str(self.max_num_tokens) if self.max_num_tokens else "null",
            "llm_max_seq_len": str(self.max_seq_len) if self.max_seq_len else "null",
            "dtype": self.dtype,
            "trust_remote_code": _bool(self.trust_remote_code),
            "lora_weights_data_type": LORA_DTYPES.get(source.dtype, LORA_DTYPES["float16"]),
            "lora_cache_adapters": str(self.lora_cache_adapters),
            "logits_datatype": LOGITS_DTYPES.get(source.logits_dtype or "", DEFAULTS["logits_datatype"]),
        }
        if self.max_tokens_in_paged_kv_cache is not None:
            values["max_tokens_in_paged_kv_cache"] = str(self.max_tokens_in_paged_kv_cache)
        return values

    def _refuse_build_options(self, source: ModelSource, flavor: RepositoryFlavor = ENSEMBLE) -> None:
        """PackError for a --build-engine option given where no engine is built (--max-beam-width
        with a checkpoint for the LLM API is model.yaml's max_beam_width: llm_beam_width)."""
        for name, (flag, key) in self.BUILD_OPTIONS.items():
            value = getattr(self, name)
            if value is None or (name == "max_beam_width" and self.llm_beam_width(source, flavor)):
                continue
            given = flag if not isinstance(value, bool) or value else flag.replace("--", "--no-", 1)
            if source.backend != "python":
                built = getattr(source, name)
                raise PackError(
                    f"{given} is fixed when an engine is built: this engine has {key} = "
                    f"{_json_value(built)} (config.json build_config); rebuild it with trtllm-build"
                )
            raise PackError(
                f"{given} is an engine build option: it goes with --hf-model DIR --build-engine "
                "(the LLM API and the reference engine need no build)"
            )


def _json_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) else str(value)


def _bool(value: bool) -> str:
    return "true" if value else "false"


# --------------------------------------------------------------------------- the command line's groups


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """What serves the model: --engine and the synthetic engine's knobs."""
    defaults = RuntimeOptions()
    engine = parser.add_argument_group("engine (--hf-model, --demo)")
    engine.add_argument(
        "--engine",
        choices=LLMAPI_ENGINES,
        default=defaults.engine,
        help="what serves the model: tensorrt_llm (llmapi flavour only, its default: TensorRT-LLM's LLM API, "
        "falling back to reference where tensorrt_llm cannot be imported unless "
        "TRTLLM_REQUIRE_TENSORRT_LLM=1); reference runs the checkpoint with PyTorch (the ensemble "
        "flavour's default); synthetic emits tokens as fast as Triton relays them, no model (for load "
        "tests and benchmarks of everything around the engine)",
    )
    engine.add_argument(
        "--step-delay-ms",
        type=float,
        default=defaults.step_delay_ms,
        metavar="MS",
        help="--engine synthetic: time per decoding step (every active request gets one token per "
        "step), to stand in for an engine of that speed; 0 = as fast as possible (default %(default)s)",
    )
    engine.add_argument(
        "--engine-instances",
        type=int,
        default=defaults.engine_instances,
        metavar="N",
        help="--engine synthetic, ensemble flavour: N token sources side by side (Triton model instances, "
        "each its own process), for load tests that need more tokens per second than one Python "
        "process relays (default %(default)s)",
    )


def add_build_arguments(parser: argparse.ArgumentParser) -> None:
    """trtllm-build's limits (BUILD_OPTIONS): --build-engine only."""
    build = parser.add_argument_group(
        "engine build (--build-engine only)",
        "trtllm-build's limits, chosen for what the API offers. A prebuilt --engine-dir has its own (its "
        "config.json build_config), and --hf-model without --build-engine builds nothing: both refuse them.",
    )
    build.add_argument(
        "--max-input-len",
        type=int,
        metavar="N",
        help="longest prompt in tokens (trtllm-build --max_input_len). Default: the max sequence length "
        "minus 1 (--max-seq-len, else the checkpoint's max_position_embeddings), so any prompt that fits "
        "the context is accepted; trtllm-build's own default would refuse prompts over 1024 tokens. "
        "Without --enable-chunked-context, TensorRT-LLM takes prompts only up to --max-num-tokens "
        "(trtllm-build's default 8192), and so does the service",
    )
    build.add_argument(
        "--max-beam-width",
        type=int,
        metavar="N",
        help="most beams of beam search the engine can run (trtllm-build --max_beam_width; default 1: no "
        "beam search)",
    )
    build.add_argument(
        "--gather-generation-logits",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="build the engine to return generation logits (trtllm-build --gather_generation_logits), "
        "from which top_logprobs / completions logprobs > 0 are computed; default: on (off, such "
        "requests are refused with a 400)",
    )
    build.add_argument(
        "--gather-context-logits",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="build the engine to return the prompt's logits (trtllm-build --gather_context_logits), "
        "needed for prompt log probabilities (echo with logprobs); default: off (it costs GPU memory "
        "for every prompt token)",
    )


def add_llm_api_arguments(parser: argparse.ArgumentParser) -> None:
    """The LLM API's knobs, filled into model.yaml."""
    defaults = RuntimeOptions()
    llm = parser.add_argument_group("LLM API (filled into model.yaml; --hf-model, --demo)")
    llm.add_argument(
        "--tp-size",
        type=int,
        metavar="N",
        help="tensor parallel size: GPUs one model is split across (default 1)",
    )
    llm.add_argument("--pp-size", type=int, metavar="N", help="pipeline parallel size (default 1)")
    llm.add_argument(
        "--max-num-tokens",
        type=int,
        metavar="N",
        help="most tokens (prompt + generated) the engine schedules in one iteration (default: the LLM API's)",
    )
    llm.add_argument(
        "--max-seq-len",
        type=int,
        metavar="N",
        help="most tokens per sequence, prompt included (default: the checkpoint's max_position_embeddings)",
    )
    llm.add_argument(
        "--dtype",
        choices=DTYPES,
        default=defaults.dtype,
        help="weights and activations dtype (default %(default)s: the checkpoint's)",
    )
    llm.add_argument(
        "--trust-remote-code",
        action=argparse.BooleanOptionalAction,
        default=defaults.trust_remote_code,
        help="let the checkpoint run its own Python code (custom architectures); off by default",
    )


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    """The knobs filled into the Triton model configs."""
    defaults = RuntimeOptions()
    runtime = parser.add_argument_group("runtime (filled into the Triton model configs)")
    runtime.add_argument(
        "--max-batch-size",
        type=int,
        metavar="N",
        help="most requests in flight in one batch. Ensemble: Triton's max_batch_size, default the engine's "
        "build_config.max_batch_size (it cannot be exceeded), 8 for a checkpoint; llmapi: the LLM's "
        "max_batch_size (default: the LLM API's). The reference engine: its batch slots (default 8)",
    )
    runtime.add_argument(
        "--kv-cache-free-gpu-mem-fraction",
        type=float,
        default=defaults.kv_cache_free_gpu_mem_fraction,
        metavar="F",
        help="share of the GPU memory left free after loading the engine that the paged KV cache takes, "
        "in (0, 1]; lower it if something else shares the GPU (default %(default)s). TRT-LLM only",
    )
    runtime.add_argument(
        "--max-tokens-in-paged-kv-cache",
        type=int,
        metavar="N",
        help="hard cap on the tokens the KV cache holds; the smaller of this and the fraction wins "
        "(default: unset, the fraction alone decides). TRT-LLM engines only",
    )
    runtime.add_argument(
        "--batch-scheduler-policy",
        choices=SCHEDULER_POLICIES,
        default=defaults.batch_scheduler_policy,
        help="max_utilization: admit as many requests as fit now, pausing some if the KV cache runs out "
        "(best throughput); guaranteed_no_evict: admit a request only when its whole KV cache is "
        "guaranteed (steadier latency) (default %(default)s)",
    )
    runtime.add_argument(
        "--enable-kv-cache-reuse",
        action=argparse.BooleanOptionalAction,
        default=defaults.enable_kv_cache_reuse,
        help="reuse the KV cache of shared prompt prefixes (system prompts, chat history) across requests "
        "(llmapi: kv_cache_config.enable_block_reuse); an engine needs --use_paged_context_fmha enable "
        "(default: off)",
    )
    runtime.add_argument(
        "--enable-chunked-context",
        action=argparse.BooleanOptionalAction,
        default=defaults.enable_chunked_context,
        help="split long prompts into chunks scheduled alongside generation steps, so one long prompt "
        "does not stall other requests (llmapi: enable_chunked_prefill); an engine needs paged context "
        "FMHA (default: off)",
    )
    runtime.add_argument(
        "--max-queue-delay-microseconds",
        type=int,
        default=defaults.max_queue_delay_microseconds,
        metavar="US",
        help="how long Triton may hold a request to form a larger batch; 0 sends it on at once, "
        "in-flight batching does the rest (default %(default)s)",
    )
    runtime.add_argument(
        "--max-queue-size",
        type=int,
        default=defaults.max_queue_size,
        metavar="N",
        help="requests Triton queues for the engine before rejecting new ones; 0 = unbounded "
        "(default %(default)s)",
    )
    runtime.add_argument(
        "--preprocessing-instances",
        type=int,
        default=defaults.preprocessing_instances,
        metavar="N",
        help="parallel instances of the tokenizing preprocessing model (default %(default)s). There is no "
        "such option for postprocessing: it is one instance by design, because its incremental "
        "detokenizer keeps per-request state keyed by request id and must see each request's tokens in "
        "order",
    )
    runtime.add_argument(
        "--guided-decoding",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="structured output (response_format, guided_json/regex/choice/grammar, forced tool calls, "
        "generate's json_schema). Ensemble flavour: writes tokenizer/xgrammar_tokenizer_info.json (the "
        "vocabulary NVIDIA's C++ backend guides with, xgrammar) and sets guided_decoding_backend and "
        "xgrammar_tokenizer_info_path in config.pbtxt; it needs a fast tokenizer (tokenizer.json). "
        "--no-guided-decoding leaves them empty, and the service answers guided requests with a 400. "
        "The LLM API (llmapi) always guides, with xgrammar (model.yaml's guided_decoding_backend) (default: on)",
    )
    runtime.add_argument(
        "--exclude-input-in-output",
        action=argparse.BooleanOptionalAction,
        default=defaults.exclude_input_in_output,
        help="return only generated tokens, never echo the prompt (default: on)",
    )
