"""Pack a model for serving: engine + tokenizer + filled Triton model repository -> BentoML model store.

Build time only: serving reads packed models through packed_model.py.

One BentoML model holds exactly what serving needs, and nothing else::

    <model>/repository/   the filled Triton model repository (5 models)
    <model>/engine/       a TRT-LLM engine (config.json + rank*.engine), or the Hugging Face checkpoint
                          files the reference engine loads (config, generation config, weights)
    <model>/tokenizer/    tokenizer files only (+ config.json / generation_config.json for the eos ids;
                          ensemble: xgrammar_tokenizer_info.json, what the C++ backend guides with)
    <model>/pack.json     what was packed (PackInfo)

The repository is filled with absolute paths inside the model directory, so
``tritonserver --model-repository <model>/repository`` works right where the model lies. pack.json
records that root (``packed_root``); ``layout_runtime_repository`` copies the repository elsewhere with
the root replaced by the model's current path, so serving never depends on the working directory or on
where the store was when the model was packed.

All validation happens before anything is written: a bad input raises ``PackError`` (one line) and the
model store is left untouched. The model is built inside ``bentoml.models.create``, which saves it only
on a clean exit, so an unexpected failure midway leaves nothing behind either.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tensorrtllm_backend.lora import (
    CONFIG_FILE as LORA_CONFIG_FILE,
)
from tensorrtllm_backend.lora import (
    HF_TO_TRTLLM,
    ROWS_CONFIG,
    ROWS_WEIGHTS,
    Adapter,
    LoraError,
    read_peft,
    to_rows,
)
from tensorrtllm_backend.lora import (
    WEIGHTS_FILE as LORA_WEIGHTS_FILE,
)
from tensorrtllm_backend.repository import DEFAULTS, RepositoryError, build_repository, repository_values
from tensorrtllm_backend.repository import end_ids as repository_end_ids
from trtllm_service.chat.reasoning import REASONING_PARSERS
from trtllm_service.packed_model import (
    ENGINE_DIR,
    LORA_DIR,
    PACK_FILE,
    REPOSITORY_DIR,
    TOKENIZER_DIR,
    XGRAMMAR_TOKENIZER_INFO,
    PackError,
    PackInfo,
    check_path_safe,
    read_json_object,
)
from trtllm_service.versions import service_version

PRODUCTION_TRITONSERVER = "/opt/tritonserver/bin/tritonserver"

MODES = ("engine", "hf", "demo")
SCHEDULER_POLICIES = ("max_utilization", "guaranteed_no_evict")
STAND_IN_ENGINES = ("reference", "synthetic")
FLAVORS = ("llmapi", "ensemble")
LLMAPI_ENGINES = ("tensorrt_llm", *STAND_IN_ENGINES)
DTYPES = ("auto", "float16", "bfloat16", "float32")
LOGITS_DTYPES = {"float16": "TYPE_FP16", "float32": "TYPE_FP32"}
"""An engine's logits dtype (trtllm-build --logits_dtype) -> config.pbtxt's logits_datatype."""

# Files copied from a tokenizer directory (top level only), when present.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    # Not tokenizer files, but the preprocessing model reads the eos ids from them.
    "generation_config.json",
    "config.json",
)
# At least one of these must be present: the files a tokenizer's vocabulary is loaded from.
TOKENIZER_VOCAB_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
)
# Where transformers looks for a chat template before tokenizer_config.json's; dropped on override.
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")

_RANK_FILE = re.compile(r"^rank(\d+)\.engine$")
_TAG_NAME = re.compile(r"^[a-z0-9]([-._a-z0-9]*[a-z0-9])?$")
_TAG_MAX_LENGTH = 63
_COPY_CHUNK = 16 * 1024 * 1024


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class ModelSource:
    """What goes into ``<model>/engine``: the files to copy and what they describe.

    Attributes:
        mode: "engine" (prebuilt TRT-LLM engine), "hf" (Hugging Face checkpoint) or "demo".
        backend: The Triton backend of the ``tensorrt_llm`` model: "tensorrtllm" or "python".
        directory: The source directory.
        files: File names (relative to ``directory``) copied into ``<model>/engine``.
        architecture, dtype: As the engine or checkpoint config declares them.
        tp_size, pp_size, cp_size: Tensor, pipeline and context parallel sizes.
        max_batch_size: The engine's build limit (None for a checkpoint: no build limit).
        max_input_len, max_seq_len: Prompt and prompt + output token limits (None when unknown).
        max_num_tokens: The engine's per-iteration token budget (None for a checkpoint).
        max_beam_width: The engine's beam limit.
        gather_generation_logits, gather_context_logits: Whether the engine can return generation /
            context logits (an engine: as trtllm-build gathered them; a checkpoint: always).
        logits_dtype: The engine's logits dtype ("float16", "float32"; None: not stated, float32).
        vocab_size: The model's vocabulary size (None when the config does not say).
        trtllm_version: The TensorRT-LLM version that built the engine.
        demo: Which demo model a "demo" source is ("smollm2" or "tiny"; a model label, so that
            ./dev.sh serve can tell the tiny test model from the real one).
    """

    mode: str
    backend: str
    directory: Path
    files: tuple[str, ...]
    architecture: str
    dtype: str
    tp_size: int = 1
    pp_size: int = 1
    cp_size: int = 1
    max_batch_size: int | None = None
    max_input_len: int | None = None
    max_seq_len: int | None = None
    max_num_tokens: int | None = None
    max_beam_width: int = 1
    gather_generation_logits: bool = False
    gather_context_logits: bool = False
    logits_dtype: str | None = None
    vocab_size: int | None = None
    trtllm_version: str | None = None
    demo: str | None = None

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size * self.cp_size


def _existing_dir(path: Path | str, what: str) -> Path:
    directory = Path(path).expanduser()
    if not directory.exists():
        raise PackError(f"{what} {str(directory)!r} does not exist")
    if not directory.is_dir():
        raise PackError(f"{what} {str(directory)!r} is not a directory")
    return directory.absolute()


def _positive_int(section: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int | None:
    value = section.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PackError(f"{where}.{key} must be a positive integer, got {value!r}")
    return value


def _vocab_size(config: Mapping[str, Any]) -> int | None:
    value = config.get("vocab_size")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def read_engine_dir(engine_dir: Path | str) -> ModelSource:
    """Reads a TRT-LLM engine directory (``trtllm-build`` output) and checks it is complete.

    Raises:
        PackError: No such directory, no or not a TRT-LLM engine ``config.json``, or rank files that
            do not match the parallel mapping.
    """
    directory = _existing_dir(engine_dir, "--engine-dir")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise PackError(
            f"engine dir {str(directory)!r} has no config.json (is it trtllm-build's output dir?)"
        )
    config = read_json_object(config_path, "engine config")
    build = config.get("build_config")
    pretrained = config.get("pretrained_config")
    if not isinstance(build, dict) or not isinstance(pretrained, dict):
        if "architectures" in config:
            hint = "it is a Hugging Face config: pack the checkpoint with --hf-model"
        elif "mapping" in config and "architecture" in config:
            hint = (
                "it is a TRT-LLM checkpoint: pack the Hugging Face checkpoint it came from with --hf-model "
                "(the LLM API, no build), or build an engine from it with trtllm-build first (legacy)"
            )
        else:
            hint = "no build_config/pretrained_config objects (engines of TRT-LLM < 0.8 are not supported)"
        raise PackError(f"{str(config_path)!r} is not a TRT-LLM engine config: {hint}")

    where = "build_config"
    max_batch_size = _positive_int(build, "max_batch_size", where)
    max_input_len = _positive_int(build, "max_input_len", where)
    max_seq_len = _positive_int(build, "max_seq_len", where)
    max_num_tokens = _positive_int(build, "max_num_tokens", where)
    max_beam_width = _positive_int(build, "max_beam_width", where, default=1)
    if max_batch_size is None or max_seq_len is None:
        raise PackError(f"{str(config_path)!r}: build_config lacks max_batch_size or max_seq_len")

    mapping = pretrained.get("mapping", {})
    if not isinstance(mapping, dict):
        raise PackError(f"{str(config_path)!r}: pretrained_config.mapping is not an object")
    where = "pretrained_config.mapping"
    tp_size = _positive_int(mapping, "tp_size", where, default=1) or 1
    pp_size = _positive_int(mapping, "pp_size", where, default=1) or 1
    cp_size = _positive_int(mapping, "cp_size", where, default=1) or 1
    world_size = tp_size * pp_size * cp_size
    declared = _positive_int(mapping, "world_size", where)
    if declared is not None and declared != world_size:
        raise PackError(
            f"{str(config_path)!r}: mapping.world_size {declared} != tp_size {tp_size} x pp_size {pp_size}"
            + (f" x cp_size {cp_size}" if cp_size != 1 else "")
        )

    ranks: dict[int, str] = {}
    for entry in directory.iterdir():
        match = _RANK_FILE.match(entry.name)
        if match:
            ranks[int(match.group(1))] = entry.name
    expected = [f"rank{rank}.engine" for rank in range(world_size)]
    missing = [name for name in expected if name not in ranks.values()]
    if missing:
        raise PackError(
            f"engine dir {str(directory)!r}: world_size {world_size} (tp {tp_size} x pp {pp_size}) needs "
            f"{', '.join(expected)}; missing {', '.join(missing)}"
        )
    extra = sorted(name for rank, name in ranks.items() if rank >= world_size)
    if extra:
        raise PackError(
            f"engine dir {str(directory)!r}: {', '.join(extra)} beyond world_size {world_size} "
            f"(tp {tp_size} x pp {pp_size}): the config does not match the engine files"
        )
    for name in expected:
        if not (directory / name).is_file():
            raise PackError(f"engine dir {str(directory)!r}: {name} is not a regular file (or a broken link)")

    gather_all = build.get("gather_all_token_logits") is True
    # trtllm-build stores --logits_dtype in the pretrained config; look in build_config too
    logits_dtype = pretrained.get("logits_dtype") or build.get("logits_dtype")
    if logits_dtype is not None and logits_dtype not in LOGITS_DTYPES:
        raise PackError(
            f"{str(config_path)!r}: logits_dtype {logits_dtype!r} is not one of {', '.join(LOGITS_DTYPES)}"
        )
    version = config.get("version")
    return ModelSource(
        mode="engine",
        backend="tensorrtllm",
        directory=directory,
        files=("config.json", *expected),
        architecture=str(pretrained.get("architecture") or "unknown"),
        dtype=str(pretrained.get("dtype") or "unknown"),
        tp_size=tp_size,
        pp_size=pp_size,
        cp_size=cp_size,
        max_batch_size=max_batch_size,
        max_input_len=max_input_len,
        max_seq_len=max_seq_len,
        max_num_tokens=max_num_tokens,
        max_beam_width=max_beam_width or 1,
        gather_generation_logits=gather_all or build.get("gather_generation_logits") is True,
        gather_context_logits=gather_all or build.get("gather_context_logits") is True,
        logits_dtype=logits_dtype,
        vocab_size=_vocab_size(pretrained),
        trtllm_version=str(version) if version is not None else None,
    )


def _indexed_weights(directory: Path, index_name: str) -> tuple[str, ...]:
    index = read_json_object(directory / index_name, "weight index")
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise PackError(f"{str(directory / index_name)!r} has no weight_map")
    shards = sorted({str(name) for name in weight_map.values()})
    for shard in shards:
        if "/" in shard or not (directory / shard).is_file():
            raise PackError(f"{str(directory)!r}: shard {shard!r} listed in {index_name} is missing")
    return (index_name, *shards)


def _checkpoint_weights(directory: Path) -> tuple[str, ...]:
    """The weight files ``from_pretrained`` loads, in its order of preference: safetensors first."""
    for index_name, single in (
        ("model.safetensors.index.json", "model.safetensors"),
        ("pytorch_model.bin.index.json", "pytorch_model.bin"),
    ):
        if (directory / index_name).is_file():
            return _indexed_weights(directory, index_name)
        if (directory / single).is_file():
            return (single,)
    raise PackError(
        f"--hf-model {str(directory)!r} has no weights "
        "(model.safetensors, model.safetensors.index.json, pytorch_model.bin or its index)"
    )


def read_hf_checkpoint(model_dir: Path | str, *, mode: str = "hf") -> ModelSource:
    """Reads a local Hugging Face checkpoint for the reference engine (python backend).

    Raises:
        PackError: No such directory, no ``config.json``, a TRT-LLM engine dir, or no weights.
    """
    directory = _existing_dir(model_dir, "--hf-model")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise PackError(f"--hf-model {str(directory)!r} has no config.json")
    config = read_json_object(config_path, "model config")
    if "build_config" in config:
        raise PackError(f"{str(directory)!r} is a TRT-LLM engine dir: pack it with --engine-dir")
    weights = _checkpoint_weights(directory)
    architectures = config.get("architectures")
    architecture = architectures[0] if isinstance(architectures, list) and architectures else "unknown"
    dtype = config.get("dtype") or config.get("torch_dtype") or "unknown"
    max_seq_len: int | None = None
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            max_seq_len = value
            break
    files = ["config.json"]
    if (directory / "generation_config.json").is_file():
        files.append("generation_config.json")
    return ModelSource(
        mode=mode,
        backend="python",
        directory=directory,
        files=(*files, *weights),
        architecture=str(architecture),
        dtype=str(dtype),
        max_input_len=max_seq_len - 1 if max_seq_len else None,
        max_seq_len=max_seq_len,
        # the engines that serve a checkpoint (reference, LLM API) compute logits on request
        gather_generation_logits=True,
        gather_context_logits=True,
        vocab_size=_vocab_size(config),
    )


def tokenizer_files(tokenizer_dir: Path | str, *, option: str = "--tokenizer") -> tuple[str, ...]:
    """The tokenizer files of a directory (see TOKENIZER_FILES), checked to hold a vocabulary.

    Raises:
        PackError: No such directory, or no tokenizer vocabulary in it.
    """
    directory = _existing_dir(tokenizer_dir, option)
    present = tuple(name for name in TOKENIZER_FILES if (directory / name).is_file())
    if not any(name in present for name in TOKENIZER_VOCAB_FILES):
        raise PackError(
            f"{option} {str(directory)!r} holds no tokenizer (none of {', '.join(TOKENIZER_VOCAB_FILES)})"
        )
    return present


def _load_tokenizer(directory: Path) -> Any:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except Exception as exc:  # transformers raises many types for a broken tokenizer
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise PackError(f"the tokenizer in {str(directory)!r} does not load: {message}") from exc


def check_tokenizer(tokenizer_dir: Path, chat_template: str | None = None) -> Any:
    """Loads the tokenizer as the Triton models will, and renders a two-message conversation.

    The chat template checked is ``chat_template`` when given, else the tokenizer's own (if any).
    Returns the tokenizer.

    Raises:
        PackError: The tokenizer does not load, or the template does not parse or render.
    """
    from trtllm_service.chat.template import PromptFormatter

    tokenizer = _load_tokenizer(tokenizer_dir)
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        return tokenizer
    which = "--chat-template" if chat_template is not None else f"the chat template of {str(tokenizer_dir)!r}"
    try:
        formatter = PromptFormatter(tokenizer, chat_template=chat_template)
        text = formatter.render(
            [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": "Hi, how can I help?"}],
            add_generation_prompt=False,
        )
    except Exception as exc:  # a user's template can fail in any way: report it, not a traceback
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise PackError(f"{which} does not render a two-message conversation: {message}") from exc
    if not text.strip():
        raise PackError(f"{which} renders a two-message conversation as empty text")
    return tokenizer


# --------------------------------------------------------------------------- guided decoding (C++ backend)


def xgrammar_tokenizer_info(
    tokenizer: Any, stop_token_ids: Sequence[int], vocab_size: int | None = None
) -> dict[str, Any]:
    """The tokenizer info NVIDIA's C++ backend builds its xgrammar guided decoder from.

    The JSON object TensorRT-LLM's ``examples/generate_xgrammar_tokenizer_info.py`` writes (and
    ``model_instance_state.cc`` reads: all three keys are required):

    - ``encoded_vocab``: every token id's string as the vocabulary spells it (``Ġthe``, ``<0x0A>``),
      in id order. An id the vocabulary skips is ``""``, which xgrammar never allows, so later ids
      keep their places; tokens at or past the model's ``vocab_size`` are left out (the model cannot
      produce them), as xgrammar's own ``TokenizerInfo.from_huggingface`` does.
    - ``tokenizer_str``: the fast tokenizer's JSON (``tokenizer.json``), from which xgrammar detects
      how tokens decode (byte-level, byte-fallback or raw) and whether a prefix space is added.
    - ``stop_token_ids``: the tokens that may end a guided answer: every end id of the packed model
      (upstream writes only ``eos_token_id``, which would force Llama-3 Instruct to end on
      ``<|end_of_text|>`` rather than ``<|eot_id|>``).

    Raises:
        PackError: Not a fast tokenizer (no ``tokenizer.json``), or no end id within the vocabulary.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise PackError(
            f"guided decoding on NVIDIA's C++ backend (xgrammar) needs a fast tokenizer (tokenizer.json); "
            f"{type(tokenizer).__name__} is not one: pack a tokenizer with tokenizer.json, or pack with "
            "--no-guided-decoding"
        )
    vocab: dict[str, int] = tokenizer.get_vocab()
    size = max(vocab.values(), default=-1) + 1
    if vocab_size is not None:
        size = min(size, vocab_size)
    encoded = [""] * size
    for token, token_id in vocab.items():
        if 0 <= token_id < size:
            encoded[token_id] = token
    stops = [int(i) for i in dict.fromkeys(stop_token_ids) if 0 <= int(i) < size]
    if not stops:
        raise PackError(
            "guided decoding needs an end-of-sequence id within the vocabulary (the tokenizer and its "
            f"config declare {list(stop_token_ids) or 'none'}): fix the tokenizer, or pack with "
            "--no-guided-decoding"
        )
    return {"encoded_vocab": encoded, "tokenizer_str": backend.to_str(), "stop_token_ids": stops}


def write_xgrammar_tokenizer_info(path: Path, info: Mapping[str, Any]) -> None:
    """Writes ``info`` (xgrammar_tokenizer_info) as the JSON file the C++ backend parses."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info), encoding="utf-8")


def read_chat_template(path: Path | str) -> str:
    """The text of a ``--chat-template`` file, checked to be Jinja that parses."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    file = Path(path).expanduser()
    if not file.is_file():
        raise PackError(f"--chat-template {str(file)!r} is not a file")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PackError(f"cannot read --chat-template {str(file)!r}: {exc}") from exc
    if not text.strip():
        raise PackError(f"--chat-template {str(file)!r} is empty")
    try:
        ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise PackError(f"--chat-template {str(file)!r} line {exc.lineno}: {exc.message}") from exc
    return text


# --------------------------------------------------------------------------- options


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

    def llm_beam_width(self, source: ModelSource, flavor: str) -> int | None:
        """--max-beam-width for a checkpoint served by the LLM API: model.yaml's max_beam_width, the
        beams EVERY request then runs (1.2.1's executor refuses other widths; README: beam search)."""
        if flavor == "llmapi" and source.backend == "python" and self.max_beam_width:
            return self.max_beam_width
        return None

    def without_build_options(self) -> RuntimeOptions:
        """These options with the --build-engine ones cleared (what packing the built engine takes)."""
        return dataclasses.replace(self, **dict.fromkeys(self.BUILD_OPTIONS))

    def guides(self, flavor: str) -> bool:
        """Whether the packed model is to guide answers (the LLM API always does)."""
        return flavor == "llmapi" or self.guided_decoding is not False

    def flavor_for(self, source: ModelSource) -> str:
        """The repository flavour: as asked, else llmapi for every source the LLM API model serves.

        That is every Hugging Face checkpoint (--hf-model, --demo): NVIDIA's llmapi model at 1.2.1
        runs the PyTorch backend from one. Only a prebuilt TensorRT engine (--engine-dir, and what
        --build-engine builds) is the legacy ensemble's (pinned.ENSEMBLE_LEGACY_WARNING).
        """
        if self.flavor is not None:
            return self.flavor
        return "ensemble" if source.mode == "engine" else "llmapi"

    def engine_for(self, flavor: str) -> str:
        """What serves the model: as asked, else tensorrt_llm (llmapi) or reference (ensemble)."""
        return self.engine or ("tensorrt_llm" if flavor == "llmapi" else "reference")

    def validate(self) -> None:
        """Raises PackError for a value out of range."""
        if self.flavor is not None and self.flavor not in FLAVORS:
            raise PackError(f"--flavor must be one of {', '.join(FLAVORS)}, got {self.flavor!r}")
        for option, value in (
            ("--tp-size", self.tp_size),
            ("--pp-size", self.pp_size),
            ("--max-num-tokens", self.max_num_tokens),
            ("--lora-cache-adapters", self.lora_cache_adapters),
            ("--max-input-len", self.max_input_len),
            ("--max-beam-width", self.max_beam_width),
        ):
            if value is not None and value < 1:
                raise PackError(f"{option} must be >= 1, got {value}")
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
        if self.engine == "tensorrt_llm" and self.flavor == "ensemble":
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
        if self.engine_instances > 1 and (self.engine != "synthetic" or self.flavor == "llmapi"):
            raise PackError(
                "--engine-instances goes with --engine synthetic and the ensemble flavour only (an engine "
                "batches requests itself: one instance)"
            )

    def template_values(self, source: ModelSource) -> dict[str, str]:
        """The template values these options and the source's limits give (paths not included).

        Raises:
            PackError: An option exceeds what the engine was built for.
        """
        self.validate()
        flavor = self.flavor_for(source)
        if flavor == "ensemble":
            for option, value in (
                ("--max-num-tokens", self.max_num_tokens),
                ("--trust-remote-code", self.trust_remote_code or None),
                ("--dtype", None if self.dtype == "auto" else self.dtype),
            ):
                if value is not None:
                    raise PackError(f"{option} is an LLM API option: it goes with --flavor llmapi")
        if source.backend != "python":
            if flavor == "llmapi":
                raise PackError(
                    "--engine-dir is a prebuilt engine for the C++ backend: it goes with --flavor ensemble"
                )
            if self.engine not in (None, "reference"):
                raise PackError(
                    f"--engine {self.engine} replaces the engine: it goes with --hf-model or --demo, "
                    "not --engine-dir"
                )
        self._refuse_build_options(source, flavor)
        if self.engine_instances > 1 and flavor == "llmapi":
            raise PackError(
                "--engine-instances is the ensemble flavour's (synthetic token sources side by side); "
                "the llmapi flavour, the default here, runs one LLM: add --flavor ensemble"
            )
        if self.guided_decoding is False and flavor == "llmapi":
            raise PackError(
                "--no-guided-decoding goes with the ensemble flavour (the LLM API guides with llguidance "
                "and needs nothing packed for it)"
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
            "python_engine": self.engine_for("ensemble") if flavor == "ensemble" else "reference",
            "llmapi_engine": self.engine_for("llmapi") if flavor == "llmapi" else "tensorrt_llm",
            "synthetic_step_delay_ms": repr(float(self.step_delay_ms)),
            "engine_instance_count": str(self.engine_instances),
            "tp_size": str(self.tp_size or source.tp_size),
            "pp_size": str(self.pp_size or source.pp_size),
            "llm_max_batch_size": str(self.max_batch_size) if self.max_batch_size else "null",
            "max_num_tokens": str(self.max_num_tokens) if self.max_num_tokens else "null",
            "llm_max_seq_len": str(self.max_seq_len) if self.max_seq_len else "null",
            "dtype": self.dtype,
            "trust_remote_code": _bool(self.trust_remote_code),
            "lora_weights_data_type": LORA_DTYPES.get(source.dtype, LORA_DTYPES["float16"])[0],
            "lora_cache_adapters": str(self.lora_cache_adapters),
            "logits_datatype": LOGITS_DTYPES.get(source.logits_dtype or "", DEFAULTS["logits_datatype"]),
        }
        if self.max_tokens_in_paged_kv_cache is not None:
            values["max_tokens_in_paged_kv_cache"] = str(self.max_tokens_in_paged_kv_cache)
        return values

    def _refuse_build_options(self, source: ModelSource, flavor: str = "ensemble") -> None:
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


# --------------------------------------------------------------------------- names


def validate_name(name: str) -> str:
    """Returns ``name`` if it is a valid BentoML model name (no version), else raises PackError."""
    if len(name) > _TAG_MAX_LENGTH or not _TAG_NAME.match(name):
        raise PackError(
            f"--name {name!r} is not a valid BentoML model name: use at most {_TAG_MAX_LENGTH} lowercase "
            "letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        )
    return name


def default_name(source: ModelSource) -> str:
    """``trtllm-demo``, or ``trtllm-<source dir name>`` made into a valid model name."""
    if source.mode == "demo":
        return "trtllm-demo"
    stem = re.sub(r"[^a-z0-9._-]+", "-", source.directory.name.lower())
    name = f"trtllm-{stem}"[:_TAG_MAX_LENGTH]
    name = re.sub(r"[^a-z0-9]+$", "", name)
    return name if _TAG_NAME.match(name) else "trtllm-model"


# --------------------------------------------------------------------------- copying


class _Progress:
    """A byte progress bar on stderr (tqdm); silent when disabled or stderr is not a terminal."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._bar: Any = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="packing", file=sys.stderr
            )

    def update(self, count: int) -> None:
        if self._bar is not None:
            self._bar.update(count)

    def describe(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _copy_one(source: Path, target: Path, progress: _Progress) -> None:
    """Chunked copy (so the progress bar moves within multi-GB engine files)."""
    progress.describe(source.name)
    with open(source, "rb") as reader, open(target, "wb") as writer:
        while chunk := reader.read(_COPY_CHUNK):
            writer.write(chunk)
            progress.update(len(chunk))


def _copy_files(copies: Sequence[tuple[Path, Path]], progress: _Progress) -> None:
    for source, target in copies:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            _copy_one(source, target, progress)
        except OSError as exc:
            raise PackError(f"copying {str(source)!r}: {exc.strerror or exc}") from exc


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_space(total: int, store_dir: Path) -> None:
    """BentoML writes the model to a temp dir, then copies it into the store: both need room."""
    tmp = Path(tempfile.gettempdir())
    store = _nearest_existing(store_dir)
    need = {tmp: total, store: total}
    if tmp.stat().st_dev == store.stat().st_dev:
        need = {store: 2 * total}
    for path, size in need.items():
        free = shutil.disk_usage(path).free
        if free < size:
            raise PackError(
                f"not enough disk space on {str(path)!r}: {_human(size)} needed, {_human(free)} free "
                "(BentoML stages the model in $TMPDIR, then copies it into $BENTOML_HOME)"
            )


def _human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.1f} TiB"


def directory_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --------------------------------------------------------------------------- packing


@dataclass(frozen=True)
class PackResult:
    """A saved model: its tag, store path, size in bytes and pack.json contents."""

    tag: str
    path: Path
    size: int
    info: PackInfo

    @property
    def human_size(self) -> str:
        return _human(self.size)


def tool_versions(source: ModelSource) -> dict[str, str]:
    versions = {"trtllm-service": service_version(), "python": sys.version.split()[0]}
    if source.trtllm_version:
        versions["tensorrt_llm"] = source.trtllm_version
    packages = ["bentoml", "transformers", "tokenizers"] + (["torch"] if source.backend == "python" else [])
    for package in packages:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def launch_command(repository: Path, world_size: int, unique: str) -> str:
    """The production command line (tritonserver, or mpirun for world_size > 1), shell-quoted."""
    from tensorrtllm_backend.launcher import TritonInstall, build_command, build_parser

    args = build_parser().parse_args(
        [
            "--world_size",
            str(world_size),
            "--model_repo",
            str(repository),
            "--tritonserver",
            PRODUCTION_TRITONSERVER,
        ]
    )
    install = TritonInstall(binary=PRODUCTION_TRITONSERVER, source="assumed")
    return shlex.join(build_command(args, install, unique=unique, mpirun="mpirun", python="python3"))


def _labels(source: ModelSource, max_batch_size: int) -> dict[str, str]:
    labels = {
        "packed_by": "pack_model",
        "mode": source.mode,
        "backend": source.backend,
        "architecture": source.architecture,
        "dtype": source.dtype,
        "world_size": str(source.world_size),
        "tp_size": str(source.tp_size),
        "pp_size": str(source.pp_size),
        "max_batch_size": str(max_batch_size),
    }
    if source.demo is not None:
        labels["demo"] = source.demo
    if source.max_input_len is not None:
        labels["max_input_len"] = str(source.max_input_len)
    if source.max_seq_len is not None:
        labels["max_seq_len"] = str(source.max_seq_len)
    return labels


def _metadata(source: ModelSource, options: RuntimeOptions, versions: Mapping[str, str]) -> dict[str, Any]:
    engine: dict[str, Any] = {
        "architecture": source.architecture,
        "dtype": source.dtype,
        "world_size": source.world_size,
        "tp_size": source.tp_size,
        "pp_size": source.pp_size,
        "cp_size": source.cp_size,
        "max_beam_width": source.max_beam_width,
        "gather_generation_logits": source.gather_generation_logits,
        "gather_context_logits": source.gather_context_logits,
    }
    for key in ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens"):
        value = getattr(source, key)
        if value is not None:
            engine[key] = value
    runtime = {key: value for key, value in dataclasses.asdict(options).items() if value is not None}
    return {
        "source": str(source.directory) if source.mode != "demo" else f"demo {source.demo or 'tiny'}",
        "engine": engine,
        "runtime": runtime,
        "versions": dict(versions),
    }


def _apply_chat_template(tokenizer_dir: Path, template: str) -> None:
    """Stores ``template`` as tokenizer_config.json's chat_template (of the packed copy only)."""
    config_path = tokenizer_dir / "tokenizer_config.json"
    config = read_json_object(config_path, "tokenizer config") if config_path.is_file() else {}
    config["chat_template"] = template
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def served_max_input_len(source: ModelSource, options: RuntimeOptions) -> int | None:
    """The longest prompt the engine takes. A C++ engine's max_input_len, capped by its max_num_tokens
    unless chunked context is on: TensorRT-LLM's runtime takes min(max_seq_len - 1, max_num_tokens)
    ("TRTGptModel maxInputLen: ... since context FMHA and usePackedInput are enabled")."""
    limit = source.max_input_len
    if source.backend == "python" or options.enable_chunked_context or source.max_num_tokens is None:
        return limit
    return source.max_num_tokens if limit is None else min(limit, source.max_num_tokens)


def apply_parallelism(source: ModelSource, options: RuntimeOptions) -> ModelSource:
    """The source as it will be served: --tp-size / --pp-size / --max-seq-len of a checkpoint applied.

    An engine's mapping and limits were fixed when it was built; asking for others is an error.
    """
    if options.tp_size is None and options.pp_size is None and options.max_seq_len is None:
        return source
    if source.backend != "python":
        raise PackError(
            "--tp-size, --pp-size and --max-seq-len go with a checkpoint (--hf-model, --demo); "
            "an engine's were fixed by trtllm-build"
        )
    max_seq_len = options.max_seq_len or source.max_seq_len
    return dataclasses.replace(
        source,
        tp_size=options.tp_size or source.tp_size,
        pp_size=options.pp_size or source.pp_size,
        max_seq_len=max_seq_len,
        max_input_len=max_seq_len - 1 if max_seq_len else None,
    )


_LORA_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
LORA_DTYPES: dict[str, tuple[str, Any]] = {
    "float32": ("TYPE_FP32", np.float32),
    "float16": ("TYPE_FP16", np.float16),
    "bfloat16": ("TYPE_BF16", "bfloat16"),  # stored as the bits of bfloat16, in uint16
}
"""The engine's dtype -> the Triton type of `lora_weights` and how the packed rows are stored."""


def _bfloat16_bits(values: np.ndarray) -> np.ndarray:
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even


def base_config(source: ModelSource) -> dict[str, Any]:
    """The base model's shape as a Hugging Face config (an engine's pretrained_config is mapped)."""
    config = read_json_object(source.directory / "config.json", "model config")
    if source.backend == "python":
        return config
    pretrained = config.get("pretrained_config") or {}
    return {
        "hidden_size": pretrained.get("hidden_size"),
        "num_attention_heads": pretrained.get("num_attention_heads"),
        "num_key_value_heads": pretrained.get("num_key_value_heads"),
        "head_dim": pretrained.get("head_size"),
        "intermediate_size": pretrained.get("intermediate_size"),
        "num_hidden_layers": pretrained.get("num_hidden_layers"),
    }


def read_loras(source: ModelSource, loras: Sequence[tuple[str, Path | str]]) -> dict[str, Adapter]:
    """Reads and checks each --lora NAME=DIR against the base model (and an engine's LoRA build)."""
    adapters: dict[str, Adapter] = {}
    for name, directory in loras:
        if not _LORA_NAME.match(name):
            raise PackError(f"--lora name {name!r}: use letters, digits, '.', '_' and '-' (at most 64)")
        if name in adapters:
            raise PackError(f"--lora {name} is given twice")
        try:
            adapter = read_peft(_existing_dir(directory, f"--lora {name}"), base_config(source))
        except LoraError as exc:
            raise PackError(f"--lora {name}: {exc}") from None
        adapters[name] = adapter
    if adapters and source.backend != "python":
        build = read_json_object(source.directory / "config.json", "engine config").get("build_config") or {}
        lora = build.get("lora_config") or {}
        plugin = (build.get("plugin_config") or {}).get("lora_plugin")
        if not plugin:
            raise PackError(
                "--lora: this engine was built without LoRA support; rebuild it with "
                "`trtllm-build --lora_plugin auto --max_lora_rank R --lora_target_modules ...`"
            )
        max_rank = int(lora.get("max_lora_rank") or 0)
        for name, adapter in adapters.items():
            if max_rank and adapter.rank > max_rank:
                raise PackError(
                    f"--lora {name}: rank {adapter.rank} exceeds the engine's max_lora_rank {max_rank}"
                )
            built = set(lora.get("lora_target_modules") or [])
            missing = {HF_TO_TRTLLM[m] for m in adapter.target_modules} - built
            if built and missing:
                raise PackError(
                    f"--lora {name}: the engine was built without LoRA on {', '.join(sorted(missing))}"
                )
    return adapters


def _write_loras(
    staging: Path, adapters: Mapping[str, Adapter], sources: Mapping[str, Path], dtype: str
) -> None:
    """Copies each adapter's PEFT files and writes its TensorRT-LLM rows beside them."""
    _, stored = LORA_DTYPES.get(dtype, LORA_DTYPES["float16"])
    for name, adapter in adapters.items():
        target = staging / LORA_DIR / name
        target.mkdir(parents=True)
        for file in (LORA_CONFIG_FILE, LORA_WEIGHTS_FILE):
            shutil.copyfile(Path(sources[name]) / file, target / file)
        weights, config = to_rows(adapter.factors)
        weights = _bfloat16_bits(weights) if stored == "bfloat16" else weights.astype(stored)
        np.save(target / ROWS_WEIGHTS, weights)
        np.save(target / ROWS_CONFIG, config)


def _lora_values(
    adapters: Mapping[str, Adapter], packed_root: Path, values: Mapping[str, str]
) -> dict[str, str]:
    """model.yaml's LoRA entries: the adapters by name (id, PEFT dir) and the LLM API's LoraConfig."""
    if not adapters:
        return {"loras_json": "{}", "llm_lora_config": "null"}
    paths = {name: str(packed_root / LORA_DIR / name) for name in adapters}
    table = {name: {"id": i, "path": paths[name]} for i, name in enumerate(adapters, 1)}
    modules = sorted({HF_TO_TRTLLM[m] for a in adapters.values() for m in a.target_modules})
    cache = int(values.get("lora_cache_adapters", "8"))
    llm = {
        "lora_dir": list(paths.values()),
        "max_lora_rank": max(a.rank for a in adapters.values()),
        "lora_target_modules": modules,
        "max_loras": cache,
        "max_cpu_loras": max(cache, len(adapters)),
    }
    return {"loras_json": json.dumps(table), "llm_lora_config": json.dumps(llm)}


def pack(
    source: ModelSource,
    tokenizer_dir: Path | str,
    options: RuntimeOptions,
    *,
    name: str | None = None,
    chat_template: str | None = None,
    progress: bool = True,
    tokenizer_option: str = "--tokenizer",
    loras: Sequence[tuple[str, Path | str]] = (),
) -> PackResult:
    """Packs ``source`` and the tokenizer into one BentoML model; returns what was saved.

    Everything is validated before the model store is touched. Bad input raises PackError and saves
    nothing; any other failure propagates, and ``bentoml.models.create`` saves nothing either.
    """
    import bentoml
    from bentoml._internal.configuration.containers import BentoMLContainer

    tokenizer_path = _existing_dir(tokenizer_dir, tokenizer_option)
    tokenizer_names = tokenizer_files(tokenizer_path, option=tokenizer_option)
    values = options.template_values(source)
    flavor = options.flavor_for(source)
    source = apply_parallelism(source, options)
    name = validate_name(name) if name is not None else default_name(source)
    tokenizer = check_tokenizer(tokenizer_path, chat_template)
    adapters = read_loras(source, loras)
    if (name is not None and name in adapters) or (name is None and default_name(source) in adapters):
        raise PackError("--lora names must differ from the model's name (clients pick either by `model`)")

    tag = bentoml.Tag(name).make_new_version()
    assert tag.version is not None
    packed_root = Path(BentoMLContainer.model_store_dir.get()).expanduser().resolve() / tag.name / tag.version
    check_path_safe(packed_root)
    if chat_template is not None:
        tokenizer_names = tuple(n for n in tokenizer_names if n not in CHAT_TEMPLATE_FILES)
    copies = [(source.directory / n, Path(ENGINE_DIR) / n) for n in source.files]
    copies += [(tokenizer_path / n, Path(TOKENIZER_DIR) / n) for n in tokenizer_names]
    total = sum((src.stat().st_size for src, _ in copies), 0)
    _check_space(total, packed_root.parent)

    end_id_list = repository_end_ids(tokenizer_path)  # of the tokenizer being packed (not copied yet)
    guided = options.guides(flavor)
    xgrammar_info = None
    if guided and flavor == "ensemble":  # NVIDIA's C++ backend guides with xgrammar and this file
        xgrammar_info = xgrammar_tokenizer_info(tokenizer, end_id_list, source.vocab_size)
        values["guided_decoding_backend"] = "xgrammar"
        values["xgrammar_tokenizer_info_path"] = str(packed_root / TOKENIZER_DIR / XGRAMMAR_TOKENIZER_INFO)
    try:
        values = repository_values(
            engine_dir=packed_root / ENGINE_DIR,
            tokenizer_dir=packed_root / TOKENIZER_DIR,
            backend=source.backend,
            overrides={
                "end_ids": ",".join(map(str, end_id_list)),
                **values,
                **_lora_values(adapters, packed_root, values),
            },
        )
    except RepositoryError as exc:
        raise PackError(str(exc)) from exc
    versions = tool_versions(source)
    info = PackInfo(
        tag=str(tag),
        mode=source.mode,
        backend=source.backend,
        packed_root=str(packed_root),
        world_size=source.world_size,
        tp_size=source.tp_size,
        pp_size=source.pp_size,
        architecture=source.architecture,
        dtype=source.dtype,
        max_batch_size=int(values["triton_max_batch_size"]),
        max_input_len=served_max_input_len(source, options),
        max_seq_len=source.max_seq_len,
        max_beam_width=source.max_beam_width,
        gather_generation_logits=source.gather_generation_logits,
        gather_context_logits=source.gather_context_logits,
        guided_decoding=guided,
        template_values=values,
        versions=versions,
        launch_command=launch_command(packed_root / REPOSITORY_DIR, source.world_size, unique=tag.version),
        chat_template_overridden=chat_template is not None,
        flavor=flavor,
        reasoning_parser=options.reasoning_parser,
        loras={
            name: {"id": i, **adapter.describe()} for i, (name, adapter) in enumerate(adapters.items(), 1)
        },
    )
    metadata = _metadata(source, options, versions)
    metadata["launch_command"] = info.launch_command

    staging: Path | None = None
    bar = _Progress(total, progress)
    try:
        with bentoml.models.create(
            tag, labels=_labels(source, info.max_batch_size), metadata=metadata
        ) as model:
            staging = Path(model.path)
            _copy_files([(src, staging / rel) for src, rel in copies], bar)
            bar.close()
            if chat_template is not None:
                _apply_chat_template(staging / TOKENIZER_DIR, chat_template)
                packed = _load_tokenizer(staging / TOKENIZER_DIR)
                if packed.chat_template != chat_template:
                    raise PackError("the packed tokenizer does not pick up --chat-template")
            try:
                build_repository(staging / REPOSITORY_DIR, values, flavor=flavor)
            except RepositoryError as exc:
                raise PackError(str(exc)) from exc
            _write_loras(staging, adapters, dict(loras), source.dtype)
            if xgrammar_info is not None:
                write_xgrammar_tokenizer_info(
                    staging / TOKENIZER_DIR / XGRAMMAR_TOKENIZER_INFO, xgrammar_info
                )
            (staging / PACK_FILE).write_text(info.to_json())
    finally:
        bar.close()
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    saved = Path(bentoml.models.get(tag).path)
    return PackResult(tag=str(tag), path=saved, size=directory_size(saved), info=info)


__all__ = [
    "PACK_FILE",
    "ModelSource",
    "PackError",
    "PackInfo",
    "PackResult",
    "RuntimeOptions",
    "check_tokenizer",
    "default_name",
    "pack",
    "read_chat_template",
    "read_engine_dir",
    "read_hf_checkpoint",
    "tokenizer_files",
    "validate_name",
    "write_xgrammar_tokenizer_info",
    "xgrammar_tokenizer_info",
]
