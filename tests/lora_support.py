"""LoRA adapters made by our own code for the tests: random A/B (fixed seed) in Hugging Face PEFT
format, and the merged-weights model that `transformers` runs as the independent reference."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

TARGETS = ("q_proj", "v_proj", "o_proj", "down_proj")


def make_adapter(
    directory: Path, base_config: dict[str, Any], *, seed: int, rank: int = 4, alpha: float = 8.0
) -> Path:
    """Writes adapter_config.json + adapter_model.safetensors; returns the directory."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    hidden, inter = base_config["hidden_size"], base_config["intermediate_size"]
    heads, kv = base_config["num_attention_heads"], base_config["num_key_value_heads"]
    head_dim = base_config.get("head_dim") or hidden // heads
    dims = {
        "q_proj": (hidden, heads * head_dim),
        "v_proj": (hidden, kv * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "down_proj": (inter, hidden),
    }
    tensors = {}
    for layer in range(base_config["num_hidden_layers"]):
        for module in TARGETS:
            fan_in, fan_out = dims[module]
            part = "self_attn" if module != "down_proj" else "mlp"
            key = f"base_model.model.model.layers.{layer}.{part}.{module}"
            tensors[f"{key}.lora_A.weight"] = rng.normal(0, 0.2, (rank, fan_in)).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = rng.normal(0, 0.2, (fan_out, rank)).astype(np.float32)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": list(TARGETS),
        "base_model_name_or_path": "trtllm-demo",
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


def merge_into(model: Any, adapter_dir: Path) -> Any:
    """`model` (transformers, float32) with W += alpha / r * B @ A for every adapter tensor pair."""
    import torch
    from safetensors.torch import load_file

    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    scaling = config["lora_alpha"] / config["r"]
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    modules = dict(model.named_modules())
    with torch.no_grad():
        for key, a in tensors.items():
            if not key.endswith("lora_A.weight"):
                continue
            b = tensors[key.replace("lora_A", "lora_B")]
            name = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            modules[name].weight += scaling * (b @ a)
    return model
