"""Lay out a filled Triton model repository from our templates.

Used by the tests, by pack_model.py and by the service. Each template is filled with the values it
declares; anything structural (batch size, decoupled mode, instance counts, queue settings) must be
filled or Triton cannot parse the config, so a placeholder left outside a parameter's
`string_value` is an error here rather than a crash at server start.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tensorrtllm_backend import LLMAPI_TEMPLATES_DIR, STANDIN_DIR, TEMPLATES_DIR
from tensorrtllm_backend.nvidia_backend import TEMPLATED_TYPES, config_io
from tensorrtllm_backend.pinned import ENSEMBLE_LEGACY_WARNING
from tensorrtllm_backend.tools.fill_template import fill_text, placeholders

MODELS = ("ensemble", "preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls")
LLMAPI_MODELS = ("tensorrt_llm",)
_HERE = Path(__file__).resolve().parent


def _modules(folder: Path, *names: str) -> tuple[Path, ...]:
    return tuple(folder / f"{name}.py" for name in names)


# What a model's code imports that lives elsewhere (one copy in this tree), copied beside its model.py
# (build_repository says which model gets what). Production modules, tensorrtllm_backend/*.py: both
# tensorrt_llm models stand on the Triton adapter and the contract rules they share (shared_contract
# reads guides with grammars); lora reads the stand-ins' adapters.
_ADAPTER = _modules(_HERE, "triton_adapter", "shared_contract", "engine_metrics", "grammars", "lora")
_PARAMS = _HERE / "config_params.py"
SHARED_MODULES: dict[str, tuple[Path, ...]] = {
    "preprocessing": (_PARAMS,),
    "postprocessing": (_HERE / "detokenizer.py", _PARAMS),
    "tensorrt_llm": (*_ADAPTER, _HERE / "nvidia_backend.py", _PARAMS),  # with the stand-in only
    "tensorrt_llm_bls": (_PARAMS,),
}
LLMAPI_SHARED_MODULES: dict[str, tuple[Path, ...]] = {
    "tensorrt_llm": (
        *_ADAPTER,
        *_modules(_HERE, "detokenizer", "stop_strings", "nvidia_backend", "nvidia_llmapi"),
    )
}
# The stand-ins (standin/), copied only into a model that a stand-in serves or may serve.
_CPP_STANDIN = _modules(
    STANDIN_DIR,
    "contract",
    "engine",
    "engine_stats",
    "ngram",
    "prefix_cache",
    "reference",
    "synthetic",
    "sources",
)
STANDIN_MODULES: dict[str, tuple[Path, ...]] = {"tensorrt_llm": _CPP_STANDIN}
LLMAPI_STANDIN_MODULES: dict[str, tuple[Path, ...]] = {
    "tensorrt_llm": (*_CPP_STANDIN, *_modules(STANDIN_DIR, "llm_standin", "text_engine"))
}
BACKENDS = ("python", "tensorrtllm")


@dataclass(frozen=True)
class RepositoryFlavor:
    """One repository flavour, as packing writes it: every pack-time difference between the two is
    an attribute here (the serving side has its own object, trtllm_service.relay.flavors).

    Attributes:
        llm_api: One LLM API model configured by model.yaml (a Hugging Face checkpoint, no engine
            build): it takes LLM arguments (--config / --set, --dtype, --max-num-tokens,
            --trust-remote-code, model.yaml's max_beam_width) and always guides (xgrammar from the
            tokenizer it loads, nothing packed for it). Else the classic ensemble, whose C++ backend guides with xgrammar and a
            tokenizer-info file packed beside the tokenizer, and whose slot takes a TensorRT engine.
        default_engine: What serves the model unless --engine says otherwise.
        engine_key: The template value that names what serves it.
        legacy_warning: What packing and the doctor say about the flavour itself (None: nothing).
        shared_modules: The production modules each model's code imports, copied beside its model.py.
        standin_modules: The stand-in modules a model's code imports where a stand-in serves it,
            copied beside its model.py only then (`standin_may_serve`).
    """

    name: str
    templates: Path
    models: tuple[str, ...]
    shared_modules: Mapping[str, tuple[Path, ...]]
    standin_modules: Mapping[str, tuple[Path, ...]]
    llm_api: bool
    default_engine: str
    engine_key: str
    legacy_warning: str | None = None

    def engine_values(self, engine: str | None) -> dict[str, str]:
        """Both flavours' engine template values: this one's as asked (else its default), the other's
        default (each template reads only its own)."""
        values = {flavor.engine_key: flavor.default_engine for flavor in FLAVORS.values()}
        values[self.engine_key] = engine or self.default_engine
        return values

    def standin_may_serve(self, model: str, values: Mapping[str, str]) -> bool:
        """Whether a stand-in serves `model`, or may (build_repository says when)."""
        if model not in self.standin_modules:
            return False
        return self.llm_api or values.get("triton_backend") == "python"

    def code(self, model: str, values: Mapping[str, str], templates: Path) -> list[Path] | None:
        """The Python files of `model`'s version dir (its template's, then the modules they import),
        or None where NVIDIA's C++ backend serves it (no Python at all)."""
        if not self.llm_api and model == "tensorrt_llm" and values.get("triton_backend") != "python":
            return None
        files = [*sorted((templates / model / "1").glob("*.py")), *self.shared_modules.get(model, ())]
        if self.standin_may_serve(model, values):
            files += self.standin_modules[model]
        return files


LLMAPI = RepositoryFlavor(
    "llmapi",
    LLMAPI_TEMPLATES_DIR,
    LLMAPI_MODELS,
    LLMAPI_SHARED_MODULES,
    LLMAPI_STANDIN_MODULES,
    llm_api=True,
    default_engine="tensorrt_llm",
    engine_key="llmapi_engine",
)
ENSEMBLE = RepositoryFlavor(
    "ensemble",
    TEMPLATES_DIR,
    MODELS,
    SHARED_MODULES,
    STANDIN_MODULES,
    llm_api=False,
    default_engine="reference",
    engine_key="python_engine",
    legacy_warning=ENSEMBLE_LEGACY_WARNING,
)
FLAVORS: dict[str, RepositoryFlavor] = {flavor.name: flavor for flavor in (LLMAPI, ENSEMBLE)}
"""Repository flavours: the LLM API's one model (a checkpoint, no engine build), or the classic
inflight_batcher_llm ensemble (C++ backend with a prebuilt engine, or a stand-in in its slot)."""


def flavor_named(name: str) -> RepositoryFlavor:
    """The flavour called `name`; RepositoryError naming the choices for any other."""
    try:
        return FLAVORS[name]
    except KeyError:
        raise RepositoryError(
            f"unknown repository flavor {name!r} (choose from {', '.join(FLAVORS)})"
        ) from None


DEFAULTS: dict[str, str] = {
    "triton_max_batch_size": "8",
    "decoupled_mode": "true",
    "max_queue_delay_microseconds": "0",
    "max_queue_size": "0",
    "preprocessing_instance_count": "1",
    "bls_instance_count": "1",
    "batching_strategy": "inflight_fused_batching",
    "max_beam_width": "1",
    "exclude_input_in_output": "true",
    "add_special_tokens": "true",
    "skip_special_tokens": "true",
    "accumulate_tokens": "false",
    "tensorrt_llm_model_name": "tensorrt_llm",
    "cancellation_check_period_ms": "100",
    "batch_scheduler_policy": "max_utilization",
    "python_engine": "reference",  # the ensemble's stand-in in the tensorrt_llm slot
    "llmapi_engine": "tensorrt_llm",  # the llmapi model's engine (model.yaml triton_config.engine)
    "synthetic_step_delay_ms": "0",
    "engine_instance_count": "1",  # NVIDIA's C++ backend: 1 (it batches inside); >1: synthetic only
    "lora_weights_data_type": "TYPE_FP16",  # the engine's dtype (pack_model.py fills it)
    "lora_cache_adapters": "8",  # adapters the engine holds at once (reference engines; LLM API max_loras)
    "loras_json": "{}",  # model.yaml: the packed adapters, name -> {id, path}
    "llm_lora_config": "null",  # model.yaml: the LLM API's LoraConfig
    # model.yaml (llmapi): the LLM arguments; null = the LLM API's default
    "tp_size": "1",
    "pp_size": "1",
    "llm_max_batch_size": "null",
    "max_num_tokens": "null",
    "llm_max_seq_len": "null",
    "llm_max_beam_width": "null",  # null: max_beam_width when > 1, else the LLM API's default (1)
    # beam search at 1.2 (NVIDIA's sampling docs, 1.2.0rc6): the overlap scheduler off and no CUDA
    # graphs; filled for a beam-packed model (llm_max_beam_width > 1), else the LLM API's defaults
    "llm_disable_overlap_scheduler": "null",
    "llm_cuda_graph_config": "{}",  # {}: CudaGraphConfig()'s defaults; null: CUDA graphs off
    "dtype": "auto",
    "trust_remote_code": "false",
    "kv_cache_free_gpu_mem_fraction": "0.9",
    "enable_kv_cache_reuse": "false",
    "enable_chunked_context": "false",
    # NVIDIA's C++ backend guides only with both filled (xgrammar + an existing tokenizer info JSON);
    # empty: no guided decoding. pack_model.py fills them for the ensemble flavour.
    "guided_decoding_backend": "",
    "xgrammar_tokenizer_info_path": "",
    # the C++ backend's templated tensor types (NVIDIA's docs fill these); the engine's logits
    # dtype is filled from its config.json by pack_model.py
    **{key.strip("${}"): value for key, value in TEMPLATED_TYPES.items()},
}

_LEFT_IN_PARAMETER = re.compile(r'string_value:\s*"\$\{[A-Za-z0-9_]+\}"')


class RepositoryError(ValueError):
    """The requested repository cannot be built; the message says why."""


def end_ids(tokenizer_dir: Path | str) -> list[int]:
    """Every end-of-sequence id the checkpoint declares, the tokenizer's own first.

    Llama-3 Instruct ends a turn with <|eot_id|> while its config names <|end_of_text|>: generation
    must stop on either. The first id is the engine's end id; the others are sent as stop tokens.
    Empty when the directory holds no loadable tokenizer.
    """
    directory = Path(tokenizer_dir)
    ids: list[int] = []
    if not any((directory / name).is_file() for name in ("tokenizer_config.json", "config.json")):
        return ids  # nothing names a tokenizer class (transformers 4.57 would guess one from the path)
    try:
        from transformers import AutoTokenizer

        eos = AutoTokenizer.from_pretrained(str(directory)).eos_token_id
    except (OSError, ValueError):
        return ids
    if eos is not None:
        ids.append(int(eos))
    for name in ("generation_config.json", "config.json"):
        path = directory / name
        if not path.is_file():
            continue
        declared = json.loads(path.read_text()).get("eos_token_id")
        for token_id in declared if isinstance(declared, list) else [declared]:
            if isinstance(token_id, int) and token_id not in ids:
                ids.append(token_id)
    return ids


def repository_values(
    *,
    engine_dir: Path | str,
    tokenizer_dir: Path | str,
    backend: str = "python",
    overrides: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The full set of template values: our defaults, the paths, then the caller's overrides."""
    if backend not in BACKENDS:
        raise RepositoryError(f"unknown triton_backend {backend!r} (choose from {', '.join(BACKENDS)})")
    values = dict(DEFAULTS)
    values.update(
        triton_backend=backend,
        # The Python backend reads this key too: the reference engine takes its inputs on the CPU.
        force_cpu_only_input_tensors="yes" if backend == "python" else "no",
        engine_dir=str(Path(engine_dir).resolve()),
        tokenizer_dir=str(Path(tokenizer_dir).resolve()),
    )
    values.update({key: str(value) for key, value in (overrides or {}).items()})
    if (
        values["llm_max_beam_width"] == "null"
        and values["max_beam_width"].isdigit()
        and int(values["max_beam_width"]) > 1
    ):
        values["llm_max_beam_width"] = values["max_beam_width"]
    if values["llm_max_beam_width"].isdigit() and int(values["llm_max_beam_width"]) > 1:
        for key, beams in (("llm_disable_overlap_scheduler", "true"), ("llm_cuda_graph_config", "null")):
            if key not in (overrides or {}):
                values[key] = beams
    if "end_ids" not in values:
        values["end_ids"] = ",".join(str(i) for i in end_ids(values["tokenizer_dir"]))
    return values


STAND_IN_PROBE_IO = (
    ('{ name: "probe" data_type: TYPE_BOOL dims: [ 1 ] optional: true }',),
    ('{ name: "probe_status" data_type: TYPE_STRING dims: [ -1 ] }',),
)
"""The ensemble's stand-in `tensorrt_llm` model answers the supervisor's probe (triton_adapter's
PROBE_INPUT, PROBE_OUTPUT), as the llmapi model does (its config.pbtxt declares them)."""


def fill_model_config(model: str, values: Mapping[str, str], templates: Path = TEMPLATES_DIR) -> str:
    """The filled config.pbtxt of one model; only the values it declares are applied."""
    source = templates / model / "config.pbtxt"
    text = source.read_text()
    if "engine_io" in placeholders(text):  # the tensors of NVIDIA's tensorrt_llm model, from its table
        # and, where our Python stand-in fills the slot, its probe (NVIDIA's C++ backend has none)
        ours = STAND_IN_PROBE_IO if values.get("triton_backend") == "python" else ((), ())
        text = fill_text(text, {"engine_io": config_io(*ours)}, source=str(source))
    wanted = placeholders(text)
    filled = fill_text(
        text, {key: value for key, value in values.items() if key in wanted}, source=str(source)
    )
    structural = _LEFT_IN_PARAMETER.sub("", filled)
    missing = sorted(placeholders(structural))
    if missing:
        raise RepositoryError(f"{model}/config.pbtxt: no value for {', '.join(missing)}")
    return filled


def _fill_version_file(path: Path, values: Mapping[str, str]) -> str:
    """A filled non-code file of a model's version dir (model.yaml): every placeholder needs a value."""
    text = path.read_text()
    missing = sorted(placeholders(text) - set(values))
    if missing:
        raise RepositoryError(f"{path.parent.parent.name}/1/{path.name}: no value for {', '.join(missing)}")
    return fill_text(text, {key: values[key] for key in placeholders(text)}, source=str(path))


LLM_OPTIONS_HEADER = (
    "# LLM API options from pack_model.py --config / --set, merged over the values above as\n"
    "# trtllm-serve 1.2.1 merges its --config YAML (update_llm_args_with_extra_dict): kv_cache_config\n"
    "# key by key, every other key replaced whole.\n"
)


def merge_llm_options(text: str, options: Mapping[str, object]) -> str:
    """A filled model.yaml with LLM API `options` merged in, as update_llm_args_with_extra_dict merges
    a YAML into the base at 1.2.1: kv_cache_config deep-merged (its keys over the base's), every other
    key replacing the base's. A replaced key's lines (and the comment right above it) leave their
    place; the merged keys are written in one block before triton_config. `options` must not hold
    triton_config (the packer refuses it)."""
    import yaml

    from tensorrtllm_backend import nvidia_llmapi as nv

    if not options:
        return text
    base = yaml.safe_load(text) or {}
    merged: dict[str, object] = {}
    for key, value in options.items():
        old = base.get(key)
        if (
            key == "kv_cache_config"
            and nv.KV_CACHE_DEEP_MERGE
            and isinstance(old, Mapping)
            and isinstance(value, Mapping)
        ):
            value = {**old, **value}
        merged[key] = value
    lines = text.split("\n")
    kept: list[str] = []
    skipping = False
    for line in lines:
        top = line[:1] not in ("", " ", "\t", "#")
        if top:
            skipping = line.split(":", 1)[0].strip() in merged
            if skipping:
                while kept and kept[-1].startswith("#"):
                    kept.pop()
        elif skipping and line.startswith("#"):
            skipping = False
        if not skipping:
            kept.append(line)
    at = next((i for i, line in enumerate(kept) if line.startswith("triton_config:")), len(kept))
    while at > 0 and kept[at - 1].startswith("#"):
        at -= 1
    block = LLM_OPTIONS_HEADER + yaml.safe_dump(merged, sort_keys=False, default_flow_style=False)
    kept[at:at] = [*block.rstrip("\n").split("\n"), ""]
    return "\n".join(kept)


def filled_model_yaml(values: Mapping[str, str], llm_options: Mapping[str, object] | None = None) -> str:
    """The llmapi flavour's model.yaml filled with `values`, `llm_options` merged in."""
    text = _fill_version_file(LLMAPI_TEMPLATES_DIR / "tensorrt_llm" / "1" / "model.yaml", values)
    return merge_llm_options(text, llm_options or {})


def build_repository(
    dest: Path | str,
    values: Mapping[str, str],
    templates: Path | None = None,
    *,
    flavor: str = "ensemble",
    llm_options: Mapping[str, object] | None = None,
) -> Path:
    """Writes every model of `flavor` (filled config + version dir with its code) under `dest`;
    `llm_options` (the llmapi flavour's only) are merged into model.yaml (merge_llm_options).

    A version dir holds its template's files (model.py, model.yaml filled) and the modules they import,
    kept once in this tree and copied beside them (RepositoryFlavor.code): the production modules
    (SHARED_MODULES, LLMAPI_SHARED_MODULES: tensorrtllm_backend/*.py) always, the stand-ins
    (STANDIN_MODULES, LLMAPI_STANDIN_MODULES: tensorrtllm_backend/standin/) only where a stand-in
    serves or may serve:
    - ensemble preprocessing, postprocessing, tensorrt_llm_bls: model.py and its production modules,
      never a stand-in (they run as they are beside NVIDIA's C++ backend).
    - ensemble tensorrt_llm, triton_backend `tensorrtllm`: nothing; NVIDIA's C++ backend serves it and
      its version dir stays empty.
    - ensemble tensorrt_llm, triton_backend `python` (`python_engine` reference or synthetic): our
      stand-in fills the slot: model.py (a thin adapter over standin/), the stand-in engines with the
      C++ backend's contract (contract, engine, engine_stats, ngram, prefix_cache, reference, synthetic,
      sources) and the production modules they stand on (triton_adapter, shared_contract,
      engine_metrics, grammars, lora, nvidia_backend, config_params).
    - llmapi tensorrt_llm, whatever model.yaml's `engine`: model.py, llm_engine.py, llmapi_contract.py,
      model.yaml and their production modules, and the stand-in LLM API with its engines (the
      ensemble's stand-ins, llm_standin, text_engine). With `engine: reference | synthetic` a stand-in
      serves. With `engine: tensorrt_llm` one may: model.py falls back to the reference engine where
      `tensorrt_llm` cannot be imported, which is known only where the model is served (one packed
      model serves in NVIDIA's image and on a machine without a GPU; TRTLLM_REQUIRE_TENSORRT_LLM, which
      makes the fallback a load error, is read at serve time too), and the image double's
      `tensorrt_llm` (tests/image_double) serves through llm_standin. model.py imports them only when
      a stand-in serves (its `_standin`), so in NVIDIA's image they sit beside it unused.
    """
    kind = flavor_named(flavor)
    if llm_options and not kind.llm_api:
        raise RepositoryError("LLM API options go into the llmapi flavour's model.yaml only")
    templates = templates or kind.templates
    models = kind.models
    dest = Path(dest)
    configs = {model: fill_model_config(model, values, templates) for model in models}
    extras = {
        model: {
            path.name: merge_llm_options(_fill_version_file(path, values), llm_options or {})
            if path.name == "model.yaml"
            else _fill_version_file(path, values)
            for path in sorted((templates / model / "1").iterdir())
            if path.is_file() and path.suffix in (".yaml", ".yml")
        }
        for model in models
    }
    dest.mkdir(parents=True, exist_ok=True)
    for model, config in configs.items():
        model_dir = dest / model
        if model_dir.exists():
            shutil.rmtree(model_dir)
        version_dir = model_dir / "1"
        version_dir.mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(config)
        code = kind.code(model, values, templates)
        if code is not None:  # a Python model: model.py, the modules beside it, the shared ones
            for path in code:
                shutil.copy2(path, version_dir / path.name)
            for name, text in extras[model].items():
                (version_dir / name).write_text(text)
    return dest
