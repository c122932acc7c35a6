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
from pathlib import Path

from tensorrtllm_backend import TEMPLATES_DIR
from tensorrtllm_backend.tools.fill_template import fill_text, placeholders

MODELS = ("ensemble", "preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls")
# Modules of this package that a model's code imports: copied beside its model.py.
SHARED_MODULES = {"postprocessing": (Path(__file__).resolve().parent / "detokenizer.py",)}
BACKENDS = ("python", "tensorrtllm")

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
    "python_engine": "reference",
    "synthetic_step_delay_ms": "0",
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
    if "end_ids" not in values:
        values["end_ids"] = ",".join(str(i) for i in end_ids(values["tokenizer_dir"]))
    return values


def fill_model_config(model: str, values: Mapping[str, str], templates: Path = TEMPLATES_DIR) -> str:
    """The filled config.pbtxt of one model; only the values it declares are applied."""
    source = templates / model / "config.pbtxt"
    text = source.read_text()
    wanted = placeholders(text)
    filled = fill_text(
        text, {key: value for key, value in values.items() if key in wanted}, source=str(source)
    )
    structural = _LEFT_IN_PARAMETER.sub("", filled)
    missing = sorted(placeholders(structural))
    if missing:
        raise RepositoryError(f"{model}/config.pbtxt: no value for {', '.join(missing)}")
    return filled


def build_repository(dest: Path | str, values: Mapping[str, str], templates: Path = TEMPLATES_DIR) -> Path:
    """Writes every model (filled config + version dir with its model.py) under `dest`."""
    dest = Path(dest)
    configs = {model: fill_model_config(model, values, templates) for model in MODELS}
    dest.mkdir(parents=True, exist_ok=True)
    for model, config in configs.items():
        model_dir = dest / model
        if model_dir.exists():
            shutil.rmtree(model_dir)
        version_dir = model_dir / "1"
        version_dir.mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(config)
        native_engine = model == "tensorrt_llm" and values.get("triton_backend") != "python"
        if not native_engine:  # a Python model: model.py, the modules beside it, the shared ones
            for code in [*sorted((templates / model / "1").glob("*.py")), *SHARED_MODULES.get(model, ())]:
                shutil.copy2(code, version_dir / code.name)
    return dest
