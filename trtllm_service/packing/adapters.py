"""LoRA adapters packed with the model (--lora): checked against the base model, stored as their PEFT
files and TensorRT-LLM's rows, and listed in model.yaml."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tensorrtllm_backend.lora import (
    HF_TO_TRTLLM,
    NAME,
    Adapter,
    LoraError,
    check_limits,
    read_peft,
    write_adapter,
)
from trtllm_service.packed_model import LORA_DIR, PackError, lora_base_config, read_json_object
from trtllm_service.packing.sources import ModelSource, existing_dir

LORA_DTYPES: dict[str, str] = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16"}
"""The engine's dtype -> the Triton type of `lora_weights` (the rows: lora.rows_as)."""


def base_config(source: ModelSource) -> dict[str, Any]:
    """The base model's shape as a Hugging Face config (an engine's pretrained_config is mapped)."""
    config = read_json_object(source.directory / "config.json", "model config")
    return lora_base_config(config, source.backend == "python")


def read_loras(source: ModelSource, loras: Sequence[tuple[str, Path | str]]) -> dict[str, Adapter]:
    """Reads and checks each --lora NAME=DIR against the base model (and an engine's LoRA build)."""
    adapters: dict[str, Adapter] = {}
    for name, directory in loras:
        if not NAME.match(name):
            raise PackError(f"--lora name {name!r}: use letters, digits, '.', '_' and '-' (at most 64)")
        if name in adapters:
            raise PackError(f"--lora {name} is given twice")
        try:
            adapter = read_peft(existing_dir(directory, f"--lora {name}"), base_config(source))
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
        built = tuple(lora.get("lora_target_modules") or ())
        for name, adapter in adapters.items():
            try:
                check_limits(adapter, max_rank, built)
            except LoraError as exc:
                raise PackError(f"--lora {name}: {exc}") from None
    return adapters


def write_loras(
    staging: Path, adapters: Mapping[str, Adapter], sources: Mapping[str, Path | str], dtype: str
) -> None:
    """Copies each adapter's PEFT files and writes its TensorRT-LLM rows beside them."""
    for name, adapter in adapters.items():
        target = staging / LORA_DIR / name
        target.mkdir(parents=True)
        write_adapter(adapter, sources[name], target, dtype)


def lora_values(
    adapters: Mapping[str, Adapter],
    packed_root: Path,
    *,
    cache: int,
    max_rank: int | None = None,
    modules: Sequence[str] | None = None,
) -> dict[str, str]:
    """model.yaml's LoRA entries: the adapters by name (id, PEFT dir) and the LLM API's LoraConfig.

    Without `max_rank` (--max-lora-rank) the LoraConfig is the packed adapters' (their largest rank,
    their modules; none packed: no LoRA). With it, it is written even with no adapter packed, so that
    adapters can be loaded while serving: that rank, on `modules` (Hugging Face names; None: every
    module the engine supports), and a packed adapter beyond either is refused (PackError).
    """
    paths = {name: str(packed_root / LORA_DIR / name) for name in adapters}
    table = {name: {"id": i, "path": paths[name]} for i, name in enumerate(adapters, 1)}
    if max_rank is None:
        if not adapters:
            return {"loras_json": "{}", "llm_lora_config": "null"}
        rank = max(a.rank for a in adapters.values())
        targets = sorted({HF_TO_TRTLLM[m] for a in adapters.values() for m in a.target_modules})
    else:
        rank = max_rank
        targets = sorted(HF_TO_TRTLLM[m] for m in (modules or HF_TO_TRTLLM))
        for name, adapter in adapters.items():
            try:
                check_limits(adapter, rank, targets)
            except LoraError as exc:
                raise PackError(f"--lora {name}: {exc} (--max-lora-rank, --lora-target-modules)") from None
    llm = {
        "lora_dir": list(paths.values()),
        "max_lora_rank": rank,
        "lora_target_modules": targets,
        "max_loras": cache,
        "max_cpu_loras": max(cache, len(adapters)),
    }
    return {"loras_json": json.dumps(table), "llm_lora_config": json.dumps(llm)}
