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
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorrtllm_backend.repository import (
    RepositoryError,
    build_repository,
    filled_model_yaml,
    repository_values,
)
from tensorrtllm_backend.repository import end_ids as repository_end_ids
from trtllm_service.packed_model import (
    ENGINE_DIR,
    PACK_FILE,
    REPOSITORY_DIR,
    TOKENIZER_DIR,
    XGRAMMAR_TOKENIZER_INFO,
    PackError,
    PackInfo,
    check_path_safe,
    read_json_object,
)
from trtllm_service.packing import phases
from trtllm_service.packing.adapters import lora_values, read_loras, write_loras
from trtllm_service.packing.copying import Progress, check_space, copy_files, directory_size, readable_size
from trtllm_service.packing.guided_decoding import write_xgrammar_tokenizer_info, xgrammar_tokenizer_info
from trtllm_service.packing.llm_options import LlmOptions, LlmOptionsError, check_model_yaml
from trtllm_service.packing.model_name import default_name, validate_name
from trtllm_service.packing.options import RuntimeOptions
from trtllm_service.packing.sources import (
    CHAT_TEMPLATE_FILES,
    ModelSource,
    check_tokenizer,
    existing_dir,
    load_tokenizer,
    tokenizer_files,
)
from trtllm_service.versions import service_version

PRODUCTION_TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
ENSEMBLE_REFUSAL = (
    "--config and --set are for the llmapi flavour (LLM API arguments in model.yaml); the ensemble's "
    "TensorRT engine is tuned with pack_model.py's flags and trtllm-build"
)


@dataclass(frozen=True)
class PackResult:
    """A saved model: its tag, store path, size in bytes and pack.json contents."""

    tag: str
    path: Path
    size: int
    info: PackInfo

    @property
    def human_size(self) -> str:
        return readable_size(self.size)


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
    llm_options: LlmOptions | None = None,
) -> PackResult:
    """Packs ``source`` and the tokenizer into one BentoML model; returns what was saved.

    ``llm_options`` (--config / --set, the llmapi flavour's) are merged into model.yaml over the
    values the options give; the ones packing also reads (tensor_parallel_size, max_batch_size, ...)
    replace the options' fields first (`LlmOptions.flag_values`).

    Everything is validated before the model store is touched. Bad input raises PackError and saves
    nothing; any other failure propagates, and ``bentoml.models.create`` saves nothing either.
    """
    import bentoml
    from bentoml._internal.configuration.containers import BentoMLContainer

    llm_options = llm_options or LlmOptions()
    flavor = options.flavor_for(source)
    if llm_options and not flavor.llm_api:
        raise LlmOptionsError(ENSEMBLE_REFUSAL)
    options = dataclasses.replace(options, **llm_options.flag_values())
    tokenizer_path = existing_dir(tokenizer_dir, tokenizer_option)
    tokenizer_names = tokenizer_files(tokenizer_path, option=tokenizer_option)
    try:
        values = options.template_values(source)
    except PackError as exc:  # a limit the options set: say which key set the flag the message names
        raise llm_options.flag_error(exc) or exc from exc
    source = apply_parallelism(source, options)
    name = validate_name(name) if name is not None else default_name(source)
    phases.say("loading the tokenizer and checking its chat template (transformers)")
    tokenizer = check_tokenizer(tokenizer_path, chat_template)
    adapters = read_loras(source, loras)
    if (name is not None and name in adapters) or (name is None and default_name(source) in adapters):
        raise PackError("--lora names must differ from the model's name (clients pick either by `model`)")

    tag = bentoml.Tag(name).make_new_version()  # type: ignore[call-arg]  # Tag's own __init__ defaults version (mypy's attrs plugin reads the generated one)
    assert tag.version is not None
    packed_root = Path(BentoMLContainer.model_store_dir.get()).expanduser().resolve() / tag.name / tag.version
    check_path_safe(packed_root)
    if chat_template is not None:
        tokenizer_names = tuple(n for n in tokenizer_names if n not in CHAT_TEMPLATE_FILES)
    copies = [(source.directory / n, Path(ENGINE_DIR) / n) for n in source.files]
    copies += [(tokenizer_path / n, Path(TOKENIZER_DIR) / n) for n in tokenizer_names]
    total = sum((src.stat().st_size for src, _ in copies), 0)
    check_space(total, packed_root.parent)

    end_id_list = repository_end_ids(tokenizer_path)  # of the tokenizer being packed (not copied yet)
    guided = options.guides(flavor)
    xgrammar_info = None
    if guided and not flavor.llm_api:  # NVIDIA's C++ backend guides with xgrammar and this file
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
                **lora_values(
                    adapters,
                    packed_root,
                    cache=options.lora_cache_adapters,
                    max_rank=options.max_lora_rank,
                    modules=options.lora_target_modules,
                ),
            },
        )
    except RepositoryError as exc:
        raise PackError(str(exc)) from exc
    extra_llm_options = llm_options.model_yaml_options()
    if llm_options:
        check_model_yaml(filled_model_yaml(values, extra_llm_options), llm_options)
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
        flavor=flavor.name,
        reasoning_parser=options.reasoning_parser,
        loras={
            name: {"id": i, **adapter.describe()} for i, (name, adapter) in enumerate(adapters.items(), 1)
        },
        llm_options=llm_options.recorded(),
        llm_options_from=llm_options.sources,
    )
    metadata = _metadata(source, options, versions)
    metadata["launch_command"] = info.launch_command
    if llm_options:
        metadata["llm_options"] = {"from": llm_options.sources, "options": llm_options.recorded()}

    staging: Path | None = None
    phases.say(f"writing {tag} into the model store ({total / 2**20:.0f} MiB, and its Triton repository)")
    bar = Progress(total, progress)
    try:
        with bentoml.models.create(
            tag, labels=_labels(source, info.max_batch_size), metadata=metadata
        ) as model:
            staging = Path(model.path)
            copy_files([(src, staging / rel) for src, rel in copies], bar)
            bar.close()
            if chat_template is not None:
                _apply_chat_template(staging / TOKENIZER_DIR, chat_template)
                packed = load_tokenizer(staging / TOKENIZER_DIR)
                if packed.chat_template != chat_template:
                    raise PackError("the packed tokenizer does not pick up --chat-template")
            try:
                build_repository(
                    staging / REPOSITORY_DIR,
                    values,
                    flavor=flavor.name,
                    llm_options=extra_llm_options or None,
                )
            except RepositoryError as exc:
                raise PackError(str(exc)) from exc
            write_loras(staging, adapters, dict(loras), source.dtype)
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
