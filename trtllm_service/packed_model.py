"""What serving reads from a packed model: pack.json, and the Triton repository laid out where it runs.

A model packed by pack_model.py holds ``repository/`` (the filled Triton model repository),
``engine/``, ``tokenizer/`` and ``pack.json``. The repository's configs name absolute paths inside
the model directory as it was when packed (``packed_root``); ``layout_runtime_repository`` copies the
repository with those paths pointing at where the model is now. Build-time code is in packing/.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PACK_FORMAT = 1
PACK_FILE = "pack.json"
REPOSITORY_DIR = "repository"
ENGINE_DIR = "engine"
LORA_DIR = "loras"  # loras/<name>/: an adapter's PEFT files and its TensorRT-LLM rows
TOKENIZER_DIR = "tokenizer"
XGRAMMAR_TOKENIZER_INFO = "xgrammar_tokenizer_info.json"
"""In ``tokenizer/`` of an ensemble model that guides: what NVIDIA's C++ backend builds its xgrammar
guided decoder from (config.pbtxt's ``xgrammar_tokenizer_info_path``)."""

# Characters a path must not contain to be written into a config.pbtxt string value.
_UNSAFE_PATH_CHARS = re.compile(r'["\\\x00-\x1f]')


class PackError(ValueError):
    """A model cannot be packed, or a packed model cannot be served; the message (one line) says why."""


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise PackError(f"cannot read {what} {str(path)!r}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise PackError(f"{what} {str(path)!r} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise PackError(f"{what} {str(path)!r} is not a JSON object")
    return data


@dataclass(frozen=True)
class PackInfo:
    """The contents of ``<model>/pack.json``: what was packed, and how to serve it.

    Attributes:
        tag: The BentoML tag the model was saved under.
        mode: "engine", "hf" or "demo".
        backend: Triton backend of the ``tensorrt_llm`` model: "tensorrtllm" or "python".
        packed_root: The model directory the repository's paths point into (where it was saved).
        world_size, tp_size, pp_size: Ranks, tensor and pipeline parallel sizes.
        architecture, dtype: As the engine or checkpoint declares them.
        max_batch_size: The filled ``triton_max_batch_size``.
        max_input_len, max_seq_len: Token limits (None when the source does not say).
        max_beam_width: The engine's beam limit.
        gather_generation_logits, gather_context_logits: Whether the engine can return generation
            logits (top log probs) and context logits (prompt log probs): a C++ engine only when
            trtllm-build gathered them; the Python engines (reference, LLM API) compute them on request.
        guided_decoding: Whether the model guides (response_format, guided_*, forced tool calls): the
            ensemble flavour only when packed with the xgrammar tokenizer info for NVIDIA's C++
            backend (not with ``--no-guided-decoding``); the LLM API always does (xgrammar, from model.yaml).
        template_values: Every value the Triton templates were filled with.
        versions: Tool versions (tensorrt_llm, bentoml, transformers, trtllm-service, ...).
        launch_command: The production command line (shell-quoted) that serves ``<model>/repository``.
        chat_template_overridden: Whether ``--chat-template`` replaced the tokenizer's template.
        flavor: The repository flavour: "llmapi" (one LLM API model, model.yaml) or "ensemble".
        loras: The packed LoRA adapters (``loras/<name>/``): name -> stable id (the engine's task
            id), rank, alpha and target modules.
        reasoning_parser: How the model writes its thinking (``--reasoning-parser``: deepseek-r1 or
            qwen3; `trtllm_service.chat.reasoning`); None: it does not reason.
        llm_options: The LLM API options given with ``--config FILE`` / ``--set KEY=VALUE`` (llmapi
            flavour), as merged over the flags into model.yaml (`trtllm_service.packing.llm_options`).
        llm_options_from: How they were given: ``--config FILE``, then each ``--set KEY=VALUE``.
        format: Layout version of pack.json.
    """

    tag: str
    mode: str
    backend: str
    packed_root: str
    world_size: int
    tp_size: int
    pp_size: int
    architecture: str
    dtype: str
    max_batch_size: int
    max_input_len: int | None
    max_seq_len: int | None
    max_beam_width: int
    gather_generation_logits: bool = False
    gather_context_logits: bool = False
    guided_decoding: bool = False
    template_values: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    launch_command: str = ""
    chat_template_overridden: bool = False
    flavor: str = "ensemble"
    loras: dict[str, dict[str, Any]] = field(default_factory=dict)  # adapter -> id, rank, alpha, modules
    reasoning_parser: str | None = None
    llm_options: dict[str, Any] = field(default_factory=dict)
    llm_options_from: list[str] = field(default_factory=list)
    format: int = PACK_FORMAT

    @property
    def batch_slots(self) -> int | None:
        """The requests the engine batches at once: `max_batch_size` per instance of its Triton model
        (NVIDIA's C++ backend and the LLM API model run one instance that batches inside; only the
        synthetic stand-in runs several, `--engine-instances`). None where the packed model leaves
        the batch size to the LLM API (the llmapi flavour packed without `--max-batch-size`): the
        LLM API then picks its own, which nothing packed here records."""
        if self.template_values.get("llm_max_batch_size") in ("null", ""):
            return None
        instances = int(self.template_values.get("engine_instance_count") or 1)
        return max(1, int(self.max_batch_size)) * max(1, instances)

    @property
    def launch_argv(self) -> list[str]:
        return shlex.split(self.launch_command)

    def llm_options_line(self) -> str | None:
        """One line for logs and the doctor: "LLM API options from --config x.yaml: a.b=1, ..."
        (None: the model was packed without any)."""
        if not self.llm_options:
            return None
        given = " and ".join(self.llm_options_from) or "--config"
        return f"LLM API options from {given}: {', '.join(flatten_options(self.llm_options))}"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PackInfo:
        names = {f.name for f in dataclasses.fields(cls)}
        missing = sorted(f.name for f in dataclasses.fields(cls) if f.name not in data and _required(f))
        if missing:
            raise PackError(f"pack.json lacks {', '.join(missing)}")
        return cls(**{**_capabilities_of_older(data), **{k: v for k, v in data.items() if k in names}})


def _capabilities_of_older(data: Mapping[str, Any]) -> dict[str, bool]:
    """What a pack.json written before the capability fields existed says by other means.

    The Python engines always returned logits; the C++ engine's gathering is read from its
    config.json where it matters (top_logprobs_unsupported). Guided decoding: the LLM API always
    guided; an ensemble only where its config names the xgrammar tokenizer info (older packs did not).
    """
    from tensorrtllm_backend.repository import ENSEMBLE, FLAVORS

    values = data.get("template_values") or {}
    python = data.get("backend") == "python"
    return {
        "gather_generation_logits": python,
        "gather_context_logits": python,
        "guided_decoding": FLAVORS[data.get("flavor", ENSEMBLE.name)].llm_api
        or (
            values.get("guided_decoding_backend") == "xgrammar"
            and bool(values.get("xgrammar_tokenizer_info_path"))
        ),
    }


def flatten_options(options: Mapping[str, Any], prefix: str = "") -> list[str]:
    """`dotted.key=value` for every leaf of nested `options`, keys sorted (as pack.json keeps them),
    values as JSON writes them, strings bare."""
    out = []
    for key, value in sorted(options.items(), key=lambda item: str(item[0])):
        if isinstance(value, Mapping) and value:
            out += flatten_options(value, f"{prefix}{key}.")
        else:
            shown = value if isinstance(value, str) else json.dumps(value, default=str)
            out.append(f"{prefix}{key}={shown}")
    return out


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def read_pack_info(model_path: Path | str) -> PackInfo:
    """Reads ``<model_path>/pack.json``.

    Raises:
        PackError: No pack.json (not a model packed by pack_model.py), or it is unreadable.
    """
    path = Path(model_path) / PACK_FILE
    if not path.is_file():
        raise PackError(f"{str(model_path)!r} has no {PACK_FILE}: it was not packed by pack_model.py")
    data = read_json_object(path, PACK_FILE)
    if data.get("format") != PACK_FORMAT:
        raise PackError(f"{str(path)!r} has format {data.get('format')!r}, this code reads {PACK_FORMAT}")
    return PackInfo.from_dict(data)


def check_path_safe(path: Path) -> None:
    if _UNSAFE_PATH_CHARS.search(str(path)):
        raise PackError(f"path {str(path)!r} contains a quote, backslash or control character")


def layout_runtime_repository(model_path: Path | str, dest: Path | str) -> Path:
    """Copies ``<model_path>/repository`` to ``dest`` with its paths pointing at ``model_path``.

    Every config.pbtxt (and the llmapi flavour's model.yaml) has the recorded ``packed_root`` replaced by ``model_path``'s absolute path, so
    the result is right wherever the model store is now. ``dest`` is created if needed; model
    directories already in it are replaced. Returns ``dest``.

    Raises:
        PackError: ``model_path`` is not a packed model, or lacks its engine or tokenizer.
    """
    model = Path(model_path).resolve()
    info = read_pack_info(model)
    for part in (REPOSITORY_DIR, ENGINE_DIR, TOKENIZER_DIR):
        if not (model / part).is_dir():
            raise PackError(f"packed model {str(model)!r} lacks {part}/")
    check_path_safe(model)
    old_root = re.compile(re.escape(info.packed_root.rstrip("/")) + r'(?=[/"])')
    new_root = str(model)
    out = Path(dest)
    out.mkdir(parents=True, exist_ok=True)
    for source in sorted((model / REPOSITORY_DIR).iterdir()):
        if not source.is_dir():
            continue
        target = out / source.name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target)
        for config in (target / "config.pbtxt", *target.glob("*/model.yaml")):
            if config.is_file():
                config.write_text(old_root.sub(lambda _m: new_root, config.read_text()))
    return out


def end_ids(info: PackInfo) -> tuple[int, ...]:
    """The ids that end a sequence, as the repository was filled (the first is the engine's end id)."""
    raw = info.template_values.get("end_ids", "")
    return tuple(int(part) for part in raw.split(",") if part.strip())


def top_logprobs_unsupported(model_path: Path | str, info: PackInfo) -> str | None:
    """Why the packed engine cannot return top log probs (None: it can).

    The C++ backend returns the logits they are computed from only where the engine was built to
    gather them; the Python engines (reference, LLM API) always can.
    """
    if info.backend != "tensorrtllm" or info.gather_generation_logits:
        return None
    config_path = Path(model_path) / ENGINE_DIR / "config.json"
    try:
        build = read_json_object(config_path, "engine config").get("build_config") or {}
    except PackError:
        build = {}
    if build.get("gather_generation_logits") or build.get("gather_all_token_logits"):
        return None
    return (
        "top log probs need the generation logits, and this engine was built without them: rebuild it "
        "with `trtllm-build --gather_generation_logits ...` (`pack_model.py --build-engine` does by "
        "default), or pack a Hugging Face checkpoint for the LLM API flavour, which returns them as it "
        "is; logprobs without top_logprobs works as it is"
    )


def guided_decoding_unsupported(info: PackInfo) -> str | None:
    """Why the packed model cannot guide its answers (None: it can).

    NVIDIA's C++ backend guides only with config.pbtxt's ``guided_decoding_backend: xgrammar`` and
    ``xgrammar_tokenizer_info_path`` filled (pack_model.py does, unless ``--no-guided-decoding``);
    otherwise every guided request would fail inside the engine.
    """
    if info.guided_decoding:
        return None
    return (
        "needs guided decoding, and this model was packed without it (pack_model.py --no-guided-decoding, "
        "or packed before guided decoding was set up for the ensemble flavour): pack it again without "
        "--no-guided-decoding"
    )


def engine_config(model_path: Path | str) -> dict[str, Any]:
    """A TensorRT-LLM engine's (or a checkpoint's) config.json, {} when absent or unreadable."""
    try:
        return read_json_object(Path(model_path) / ENGINE_DIR / "config.json", "engine config")
    except PackError:
        return {}


def lora_base_config(config: Mapping[str, Any], python_backend: bool) -> dict[str, Any]:
    """The base model's shape as a Hugging Face config, which LoRA adapters are checked against:
    `config` itself for a checkpoint (the Python engines), an engine's pretrained_config mapped."""
    if python_backend:
        return dict(config)
    pretrained = config.get("pretrained_config") or {}
    return {
        "hidden_size": pretrained.get("hidden_size"),
        "num_attention_heads": pretrained.get("num_attention_heads"),
        "num_key_value_heads": pretrained.get("num_key_value_heads"),
        "head_dim": pretrained.get("head_size"),
        "intermediate_size": pretrained.get("intermediate_size"),
        "num_hidden_layers": pretrained.get("num_hidden_layers"),
    }


def llm_args(model_path: Path | str) -> dict[str, Any]:
    """The llmapi flavour's model.yaml (the LLM's arguments), {} when absent or unreadable."""
    import yaml

    try:
        data = yaml.safe_load(
            (Path(model_path) / REPOSITORY_DIR / "tensorrt_llm" / "1" / "model.yaml").read_text()
        )
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def vocab_size(model_path: Path | str) -> int:
    """The width of the engine's logits (a TensorRT-LLM engine's pretrained_config, a checkpoint's
    config.json); 0 when it does not say."""
    config = engine_config(model_path)
    size = (config.get("pretrained_config") or {}).get("vocab_size") or config.get("vocab_size")
    return int(size) if isinstance(size, int) and size > 0 else 0


DEFAULT_TOKENS_PER_BLOCK = 32
"""TensorRT-LLM's default KV cache block (trtllm-build's plugin_config, the LLM API's KvCacheConfig)."""


def engine_tokens_per_block(model_path: Path | str, info: PackInfo) -> int | None:
    """A C++ engine's KV cache block (build_config.plugin_config.tokens_per_block); None for the
    Python engines, or when the build does not say."""
    if info.backend != "tensorrtllm":
        return None
    plugin = (engine_config(model_path).get("build_config") or {}).get("plugin_config") or {}
    value = plugin.get("tokens_per_block")
    return int(value) if isinstance(value, int) and value > 0 else None


def context_logits_unsupported(info: PackInfo) -> str | None:
    """Why the packed engine cannot return prompt log probs (None: it can): a C++ engine returns the
    context logits they come from only when trtllm-build gathered them."""
    if info.backend != "tensorrtllm" or info.gather_context_logits:
        return None
    return (
        "prompt log probs (echo with logprobs) need the context logits, and this engine was built "
        "without them: rebuild it with `trtllm-build --gather_context_logits ...` (`pack_model.py "
        "--build-engine --gather-context-logits`), or pack a Hugging Face checkpoint for the LLM API "
        "flavour, which returns them as it is"
    )
