"""LoRA adapters: Hugging Face PEFT files, TensorRT-LLM's per-request rows, and a bounded cache.

One module for every side (numpy only): pack_model.py validates a PEFT adapter against the base
model and converts it to the rows the C++ backend takes per request (`lora_weights`, one row per
layer and module: the adapter's A [r, in] then B [out, r], flattened, with the scaling alpha / r
folded into B, zero padded; `lora_config`, one [module id, layer, r] per row); the reference engine
reads those rows back, or the PEFT files directly (LLM API flavour), into the same factors:
(layer, module) -> (A, scaled B), whose product is what the adapter adds to the module's weight.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # mypy reads one name per run (pyproject.toml: [tool.mypy], nvidia_backend)
    import nvidia_backend as _nv
else:
    try:  # beside model.py in Triton's Python backend
        import nvidia_backend as _nv
    except ImportError:  # the service, packing
        from tensorrtllm_backend import nvidia_backend as _nv

HF_TO_TRTLLM = {
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_dense",
    "gate_proj": "mlp_h_to_4h",
    "up_proj": "mlp_gate",
    "down_proj": "mlp_4h_to_h",
}
"""Hugging Face module name -> TensorRT-LLM's LoRA module name (Llama family)."""

MODULE_IDS = {
    "attn_qkv": 0,
    "attn_q": 1,
    "attn_k": 2,
    "attn_v": 3,
    "attn_dense": 4,
    "mlp_h_to_4h": 5,
    "mlp_4h_to_h": 6,
    "mlp_gate": 7,
}
"""TensorRT-LLM's LoRA module ids (the first column of `lora_config`)."""

HF_BY_ID = {MODULE_IDS[trt]: hf for hf, trt in HF_TO_TRTLLM.items()}
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
ROWS_WEIGHTS = "model.lora_weights.npy"
ROWS_CONFIG = "model.lora_config.npy"
CACHE_MISS = "not found in cache"
"""In the engine's error for a task id it does not hold: the client resends the weights."""
NOT_CACHED = _nv.LORA_NOT_CACHED
"""The whole message, NVIDIA's."""

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""An adapter's name (clients send it as `model`): letters, digits, '.', '_' and '-', at most 64."""
ROW_DTYPES = ("float32", "float16", "bfloat16")
"""The dtypes `lora_weights` rows are sent in: the engine's (float16 for any other)."""

_KEY = re.compile(r"layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")

Factors = dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]


class LoraError(ValueError):
    """An adapter that cannot be used with this model; the message says why, in one line."""


def module_dims(config: Mapping[str, Any]) -> tuple[int, dict[str, tuple[int, int]]]:
    """(layers, module -> (in, out) features) of a Llama-style Hugging Face config."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    inter = int(config["intermediate_size"])
    dims = {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }
    return int(config["num_hidden_layers"]), dims


@dataclass(frozen=True)
class Adapter:
    """A PEFT adapter, checked against its base model."""

    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    factors: Factors  # (layer, module) -> (A [r, in], B [out, r] with the scaling folded in)

    def describe(self) -> dict[str, Any]:
        return {"rank": self.rank, "alpha": self.alpha, "target_modules": list(self.target_modules)}


def read_peft(directory: Path | str, base_config: Mapping[str, Any]) -> Adapter:
    """Reads and checks a PEFT LoRA adapter directory; raises LoraError naming what is wrong."""
    from safetensors.numpy import load_file

    where = Path(directory)
    if not (where / CONFIG_FILE).is_file() or not (where / WEIGHTS_FILE).is_file():
        raise LoraError(f"{str(where)!r} is not a PEFT adapter: it needs {CONFIG_FILE} and {WEIGHTS_FILE}")
    try:
        config = json.loads((where / CONFIG_FILE).read_text())
    except json.JSONDecodeError as exc:
        raise LoraError(f"{str(where / CONFIG_FILE)!r} is not valid JSON: {exc}") from None
    if not isinstance(config, dict) or str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise LoraError(
            f"{str(where)!r}: only LoRA adapters are supported (peft_type {config.get('peft_type')!r})"
        )
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise LoraError(f"{str(where)!r}: adapter rank r must be a positive integer, got {rank!r}")
    alpha = float(config.get("lora_alpha") or rank)
    targets = config.get("target_modules") or []
    if isinstance(targets, str):
        raise LoraError(f"{str(where)!r}: target_modules must be a list of module names, got a pattern")
    unsupported = sorted(set(targets) - set(HF_TO_TRTLLM))
    if unsupported or not targets:
        raise LoraError(
            f"{str(where)!r}: unsupported target module(s) {', '.join(unsupported) or '(none)'} "
            f"(supported: {', '.join(HF_TO_TRTLLM)})"
        )
    if config.get("modules_to_save") or config.get("fan_in_fan_out") or config.get("bias", "none") != "none":
        raise LoraError(f"{str(where)!r}: modules_to_save, fan_in_fan_out and LoRA biases are not supported")
    scaling = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    layers, dims = module_dims(base_config)
    pairs: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    for key, tensor in load_file(str(where / WEIGHTS_FILE)).items():
        match = _KEY.search(key)
        if match is None:
            raise LoraError(f"{str(where)!r}: unexpected tensor {key!r} in {WEIGHTS_FILE}")
        layer, module, part = int(match.group(1)), match.group(2), match.group(3)
        if module not in targets:
            raise LoraError(f"{str(where)!r}: tensor {key!r} is for {module}, not a target module")
        if layer >= layers:
            raise LoraError(
                f"{str(where)!r}: layer {layer} does not exist in the base model ({layers} layers)"
            )
        fan_in, fan_out = dims[module]
        expected = (rank, fan_in) if part == "A" else (fan_out, rank)
        if tuple(tensor.shape) != expected:
            raise LoraError(
                f"{str(where)!r}: {key} has shape {list(tensor.shape)}, the base model needs {list(expected)} "
                "(is it an adapter for another base model?)"
            )
        if tensor.dtype.kind != "f":
            raise LoraError(
                f"{str(where)!r}: {key} is {tensor.dtype}; LoRA weights must be float16, bfloat16 or float32"
            )
        pairs.setdefault((layer, module), {})[part] = tensor.astype(np.float32)
    if not pairs:
        raise LoraError(f"{str(where)!r}: {WEIGHTS_FILE} holds no LoRA weights")
    factors: Factors = {}
    for (layer, module), pair in sorted(pairs.items()):
        if set(pair) != {"A", "B"}:
            raise LoraError(
                f"{str(where)!r}: layer {layer} {module} lacks its lora_{'B' if 'A' in pair else 'A'}"
            )
        factors[(layer, module)] = (pair["A"], pair["B"] * np.float32(scaling))
    return Adapter(rank=rank, alpha=alpha, target_modules=tuple(targets), factors=factors)


def check_limits(adapter: Adapter, max_rank: int, modules: Collection[str]) -> None:
    """Refuses (LoraError) an adapter beyond what the engine was set up for: a rank above its
    `max_lora_rank` (0: no limit), a module it has no LoRA on (TensorRT-LLM's names; empty: any)."""
    if max_rank and adapter.rank > max_rank:
        raise LoraError(f"rank {adapter.rank} exceeds the engine's max_lora_rank {max_rank}")
    missing = {HF_TO_TRTLLM[m] for m in adapter.target_modules} - set(modules)
    if modules and missing:
        raise LoraError(f"the engine was built without LoRA on {', '.join(sorted(missing))}")


def rows_as(weights: np.ndarray, engine_dtype: str) -> np.ndarray:
    """`lora_weights` rows in the engine's dtype (ROW_DTYPES; bfloat16 kept as its bits in uint16,
    rounded to nearest even: numpy has no bfloat16)."""
    dtype = engine_dtype if engine_dtype in ROW_DTYPES else "float16"
    if dtype == "bfloat16":
        bits = weights.astype(np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return weights.astype(dtype)


def to_rows(factors: Factors, dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """TensorRT-LLM's (lora_weights [rows, width], lora_config [rows, 3]) of an adapter's factors."""
    flat = [np.concatenate([a.ravel(), b.ravel()]) for a, b in factors.values()]
    width = max(len(row) for row in flat)
    weights = np.zeros((len(flat), width), dtype=np.float32)
    for i, row in enumerate(flat):
        weights[i, : len(row)] = row
    config = np.array(
        [
            [MODULE_IDS[HF_TO_TRTLLM[module]], layer, a.shape[0]]
            for (layer, module), (a, _) in factors.items()
        ],
        dtype=np.int32,
    )
    return weights.astype(dtype), config


def write_adapter(adapter: Adapter, source: Path | str, target: Path, engine_dtype: str) -> None:
    """Fills the directory `target` (which exists) with the adapter read from `source`: its PEFT files
    as they were (the LLM API reads them) and its rows for the C++ backend, in `engine_dtype`'s type.
    Packing and runtime loading both write an adapter this way."""
    for file in (CONFIG_FILE, WEIGHTS_FILE):
        shutil.copyfile(Path(source) / file, target / file)
    weights, config = to_rows(adapter.factors)
    np.save(target / ROWS_WEIGHTS, rows_as(weights, engine_dtype))
    np.save(target / ROWS_CONFIG, config)


def from_rows(weights: np.ndarray, config: np.ndarray, base_config: Mapping[str, Any]) -> Factors:
    """The factors of TensorRT-LLM's rows (as a request carries them); raises LoraError."""
    layers, dims = module_dims(base_config)
    rows = weights.reshape(-1, weights.shape[-1]).astype(np.float32)
    entries = config.reshape(-1, 3)
    if len(rows) != len(entries):
        raise LoraError(f"lora_weights has {len(rows)} rows but lora_config {len(entries)}")
    factors: Factors = {}
    for row, (module_id, layer, rank) in zip(rows, entries.tolist(), strict=True):
        module = HF_BY_ID.get(int(module_id))
        if module is None or not 0 <= layer < layers or rank < 1:
            raise LoraError(f"lora_config row [{module_id}, {layer}, {rank}] is not a module of this model")
        fan_in, fan_out = dims[module]
        size = rank * fan_in + fan_out * rank
        if size > len(row):
            raise LoraError(
                f"lora_weights rows are {len(row)} wide, module {module} of rank {rank} needs {size}"
            )
        a = row[: rank * fan_in].reshape(rank, fan_in)
        b = row[rank * fan_in : size].reshape(fan_out, rank)
        factors[(int(layer), module)] = (a, b)
    return factors


class LoraCache:
    """The adapters an engine holds, least recently used evicted beyond `capacity`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._held: OrderedDict[Any, Any] = OrderedDict()
        self.loads = 0

    def get(self, key: Any, load: Callable[[], Any] | None = None) -> Any:
        """The adapter under `key`, loaded with `load` when it is not held (None: LoraError)."""
        if key in self._held:
            self._held.move_to_end(key)
            return self._held[key]
        if load is None:
            raise LoraError(NOT_CACHED.format(task=key))
        value = load()
        self.loads += 1
        self._held[key] = value
        while len(self._held) > self.capacity:
            self._held.popitem(last=False)
        return value

    def put(self, key: Any, value: Any) -> Any:
        self._held.pop(key, None)
        return self.get(key, lambda: value)
