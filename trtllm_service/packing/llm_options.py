"""`pack_model.py --config FILE.yaml` and `--set KEY=VALUE`: a trtllm-serve YAML brought unchanged.

trtllm-serve users tune TensorRT-LLM with one YAML of `tensorrt_llm.LLM` arguments (`trtllm-serve
--config`, alias `--extra_llm_api_options`). Packing reads it, applies each `--set dotted.key=value`
over it (the value parsed as YAML: a scalar, or a flow mapping or list), checks the result as strictly
as TensorRT-LLM 1.2.1's TorchLlmArgs does, and merges it into the llmapi flavour's model.yaml as
trtllm-serve merges it into the arguments its flags built (`update_llm_args_with_extra_dict`:
kv_cache_config key by key, every other key replaced). So the precedence is: pack_model.py's flags,
then the file, then --set.

The keys the service owns:
- `model`, `tokenizer`, `skip_tokenizer_init`, `_mpi_session`: the packed checkpoint and tokenizer,
  the Triton model's own session; refused.
- `backend`: the llmapi flavour serves TensorRT-LLM's PyTorch backend; anything but `pytorch` refused.
- `guided_decoding_backend`: xgrammar (packed) or llguidance; `null` (no guides) refused, as the
  service offers guided output for every llmapi model.
- `lora_config`, `enable_lora`: adapters are packed with --lora NAME=DIR (--lora-cache-adapters is
  max_loras, --max-lora-rank max_lora_rank); refused.
- `triton_config`: Triton's settings and ours in model.yaml, set by pack_model.py's flags; refused.
- `tensor_parallel_size`, `pipeline_parallel_size`, `max_batch_size`, `max_seq_len`,
  `max_beam_width`: also decide the ranks launched, Triton's batch, the prompt limit and beam search;
  the file's value replaces the flag's (--tp-size, --pp-size, ...) and is checked as the flag is.
- `kv_cache_free_gpu_memory_fraction` at the top level: not an LLM argument but trtllm-serve's option,
  which NVIDIA's 1.2.1 deployment-guide YAMLs write there; taken as
  kv_cache_config.free_gpu_memory_fraction (unless the file sets that too), as the flag sets it.

Errors are one line naming where the key came from (`--config FILE` or `--set ARG`) and exit 2
(LlmOptionsError); nothing is written to the model store.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensorrtllm_backend import nvidia_llmapi as nv
from trtllm_service.packed_model import PackError

OPTION_FLAGS = ("--config", "--extra_llm_api_options", "--extra-llm-api-options")

OWNED: dict[str, str] = {
    "model": "model is the packed checkpoint (--hf-model DIR or --demo), not a setting",
    "tokenizer": "tokenizer is the packed one (--tokenizer DIR), not a setting",
    "skip_tokenizer_init": "skip_tokenizer_init cannot be set: NVIDIA's llmapi Triton model sends text, "
    "so the LLM must tokenize",
    "_mpi_session": "_mpi_session is made by the Triton model for a multi-rank run, not a setting",
    "lora_config": "lora_config is the packed adapters': pack them with --lora NAME=DIR "
    "(--lora-cache-adapters sets max_loras, --max-lora-rank R max_lora_rank)",
    "enable_lora": "enable_lora is the packed adapters': pack them with --lora NAME=DIR",
    "triton_config": "triton_config is not an LLM API argument: it is Triton's and the service's part of "
    "model.yaml, which pack_model.py's flags set",
}
"""LLM arguments the packed model owns: a --config or --set that sets one is refused with this reason."""

FLAG_FIELDS: dict[str, tuple[str, str]] = {
    "tensor_parallel_size": ("tp_size", "--tp-size"),
    "pipeline_parallel_size": ("pp_size", "--pp-size"),
    "max_batch_size": ("max_batch_size", "--max-batch-size"),
    "max_seq_len": ("max_seq_len", "--max-seq-len"),
    "max_beam_width": ("max_beam_width", "--max-beam-width"),
}
"""LLM arguments that packing also reads (ranks, Triton's batch, limits, beams): taken from the options
into RuntimeOptions (field, its flag), so that the packed model agrees with its model.yaml."""

TRTLLM_SERVE_NAMES: dict[str, tuple[str, str]] = {
    "kv_cache_free_gpu_memory_fraction": ("kv_cache_config", "free_gpu_memory_fraction"),
}
"""trtllm-serve's option names that NVIDIA's 1.2.1 YAMLs write at the top level -> the LLM argument
its flag fills. How trtllm-serve 1.2.1 applies them from a file is not read at the tag (estimated)."""


class LlmOptionsError(PackError):
    """A --config / --set that cannot be packed (one line; pack_model.py exits 2)."""


@dataclass(frozen=True)
class LlmOptions:
    """The LLM API options a pack was given: the merged mapping and where each part came from."""

    options: dict[str, Any] = field(default_factory=dict)
    config_file: str | None = None
    sets: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.options) or self.config_file is not None

    @property
    def sources(self) -> list[str]:
        """How they were given: `--config FILE`, then each `--set ARG`."""
        return ([f"--config {self.config_file}"] if self.config_file else []) + [
            f"--set {s}" for s in self.sets
        ]

    def origin(self, dotted: str) -> str:
        """Who set `dotted` (or a mapping above it): the last --set that did, else the file."""
        for arg in reversed(self.sets):
            path = arg.partition("=")[0].strip()
            if dotted == path or dotted.startswith(path + ".") or path.startswith(dotted + "."):
                return f"--set {arg}"
        return f"--config {self.config_file}" if self.config_file else "--set"

    def fail(self, dotted: str, message: str) -> LlmOptionsError:
        return LlmOptionsError(f"{self.origin(dotted)}: {message}")

    def recorded(self) -> dict[str, Any]:
        """The options as pack.json and the model's metadata record them (JSON: keys as strings)."""
        import json

        return json.loads(json.dumps(self.options, default=str))

    def flag_values(self) -> dict[str, Any]:
        """RuntimeOptions fields the options set (FLAG_FIELDS)."""
        return {FLAG_FIELDS[k][0]: v for k, v in self.options.items() if k in FLAG_FIELDS and v is not None}

    def flag_error(self, error: PackError) -> LlmOptionsError | None:
        """`error` (a refusal of the flags' values) told as the key that set the flag it names, if one
        did (None: the flags were the command line's)."""
        for key, (_, flag) in FLAG_FIELDS.items():
            if key in self.options and flag in str(error):
                return self.fail(key, f"{key} (the value --config / --set gives {flag}): {error}")
        return None

    def model_yaml_options(self) -> dict[str, Any]:
        """What goes into model.yaml beside the template's values (FLAG_FIELDS fill the template)."""
        return {k: v for k, v in self.options.items() if k not in FLAG_FIELDS or self.options[k] is None}


def read_config_file(path: Path | str) -> dict[str, Any]:
    """The mapping a --config YAML holds (an empty file: none)."""
    import yaml

    where = f"--config {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LlmOptionsError(f"{where}: cannot read it: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise LlmOptionsError(f"{where}: not valid YAML: {' '.join(str(exc).split())}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise LlmOptionsError(f"{where}: holds a {type(data).__name__}, not a mapping of LLM API arguments")
    return data


def parse_set(arg: str) -> tuple[list[str], Any]:
    """`dotted.key=value` -> (the key's parts, the value parsed as YAML)."""
    import yaml

    path, sep, raw = arg.partition("=")
    parts = [part.strip() for part in path.split(".")]
    if not sep or not all(parts):
        raise LlmOptionsError(f"--set takes KEY=VALUE (KEY dotted: kv_cache_config.dtype=fp8), got {arg!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise LlmOptionsError(
            f"--set {arg}: the value is not valid YAML: {' '.join(str(exc).split())}"
        ) from exc
    return parts, value


def apply_set(options: dict[str, Any], parts: Sequence[str], value: Any, arg: str) -> None:
    """Sets `options[parts[0]][parts[1]]... = value`, making the mappings on the way."""
    node = options
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            above = ".".join(parts[: i + 1])
            raise LlmOptionsError(f"--set {arg}: {above} is {child!r}, not a mapping")
        node = child
    node[parts[-1]] = value


def _map_trtllm_serve_names(options: dict[str, Any]) -> None:
    for name, (section, key) in TRTLLM_SERVE_NAMES.items():
        if name not in options:
            continue
        value = options.pop(name)
        nested = options.get(section)
        if nested is None:
            nested = options[section] = {}
        if isinstance(nested, dict):
            nested.setdefault(key, value)


def load_llm_options(config_file: Path | str | None, sets: Sequence[str] = ()) -> LlmOptions:
    """The --config file with each --set applied in order, checked: refused keys (OWNED), unknown or
    misspelt keys at any depth (nvidia_llmapi.key_errors), the first as one line (LlmOptionsError).
    Values are checked when merged into model.yaml (check_model_yaml)."""
    options = read_config_file(config_file) if config_file is not None else {}
    for arg in sets:
        parts, value = parse_set(arg)
        apply_set(options, parts, value, arg)
    _map_trtllm_serve_names(options)
    loaded = LlmOptions(copy.deepcopy(options), str(config_file) if config_file else None, tuple(sets))
    for key, reason in OWNED.items():
        if key in options:
            raise loaded.fail(key, reason)
    if "guided_decoding_backend" in options and options["guided_decoding_backend"] is None:
        raise loaded.fail(
            "guided_decoding_backend",
            "guided_decoding_backend null turns grammar-guided decoding off, which a packed llmapi model "
            "always serves (response_format, tools): use llguidance or xgrammar",
        )
    backend = options.get("backend")
    if backend is not None and backend != "pytorch":
        raise loaded.fail(
            "backend", f"backend {backend!r}: the llmapi flavour serves the PyTorch backend (pytorch)"
        )
    problems = nv.key_errors(options)
    if problems:
        dotted = problems[0].split(" ", 1)[0].rstrip(":")
        raise loaded.fail(dotted, problems[0])
    check_llm_args({"model": "model", **options}, loaded)
    return loaded


def estimated(options: LlmOptions) -> list[str]:
    """Warnings, one line each: keys that exist in only one stored version around 1.2.1."""
    return [
        f"{options.origin(key)}: {key} is in only one of the TensorRT-LLM versions read around "
        f"{nv.TAG[1:]} (estimated): the real image may refuse it"
        for key in nv.estimated_keys(options.options)
    ]


def check_model_yaml(text: str, options: LlmOptions) -> None:
    """Validates a merged model.yaml's LLM arguments as TorchLlmArgs does; LlmOptionsError with
    pydantic's first error condensed."""
    import yaml

    data = yaml.safe_load(text) or {}
    data.pop("triton_config", None)
    check_llm_args(data, options)


def check_llm_args(args: dict[str, Any], options: LlmOptions) -> None:
    """validate_llm_args of `args` (nulls left out as the Triton model leaves them), its refusal as one
    line naming where the key came from."""
    from pydantic import ValidationError

    try:
        nv.validate_llm_args(nv.drop_nulls(args))
    except ValidationError as exc:
        line = nv.describe_validation_error(exc)
        raise options.fail(line.split(":", 1)[0], line) from exc
    except ValueError as exc:
        raise options.fail("", " ".join(str(exc).split())) from exc
