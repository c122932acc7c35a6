"""What a pack starts from: a TensorRT-LLM engine, a Hugging Face checkpoint, a tokenizer, a chat template.

Each is read and checked before the model store is touched; bad input raises ``PackError`` (one line).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtllm_service.packed_model import PackError, read_json_object

MODES = ("engine", "hf", "demo")
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


def existing_dir(path: Path | str, what: str) -> Path:
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
    directory = existing_dir(engine_dir, "--engine-dir")
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
    directory = existing_dir(model_dir, "--hf-model")
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
    directory = existing_dir(tokenizer_dir, option)
    present = tuple(name for name in TOKENIZER_FILES if (directory / name).is_file())
    if not any(name in present for name in TOKENIZER_VOCAB_FILES):
        raise PackError(
            f"{option} {str(directory)!r} holds no tokenizer (none of {', '.join(TOKENIZER_VOCAB_FILES)})"
        )
    return present


def load_tokenizer(directory: Path) -> Any:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from trtllm_service.tokenizer_loading import tokenizer_class

    try:
        return tokenizer_class().from_pretrained(str(directory), local_files_only=True)
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

    tokenizer = load_tokenizer(tokenizer_dir)
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
