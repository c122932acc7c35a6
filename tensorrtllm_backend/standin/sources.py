"""The stand-in token sources by name: what serves the `tensorrt_llm` slot where TensorRT-LLM does not.

`make_source` builds the reference engine (reference.py: a Hugging Face checkpoint run with PyTorch)
or the synthetic one (synthetic.py: tokens as fast as Triton relays them, no model) for the
ensemble's stand-in model.py and for the llmapi model's stand-in LLM API (llm_standin.StandIn).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ENGINES = ("reference", "synthetic")
"""Stand-in engines: what serves the `tensorrt_llm` slot where TensorRT-LLM is not used."""


def vocab_size(model_dir: str, fallback: int) -> int:
    """The checkpoint's vocab_size (config.json), else `fallback`."""
    config = Path(model_dir) / "config.json"
    if config.is_file():
        size = json.loads(config.read_text()).get("vocab_size")
        if isinstance(size, int) and size > 0:
            return size
    return fallback


def make_source(
    kind: str,
    model_dir: str,
    tokenizer_dir: str,
    *,
    device: str = "auto",
    dtype: str = "auto",
    slots: int = 0,
    max_seq_len: int = 0,
    block_reuse: bool = False,
    tokens_per_block: int = 0,
) -> tuple[Any, int, int]:
    """The stand-in token source `kind`, its vocabulary size and its sequence-length limit.

    `slots` (the reference engine's batch, 0 for its default) and `max_seq_len` (0: the model's
    own) size the reference engine's KV cache; `block_reuse` lets prompts reuse the KV blocks of
    earlier prompts' prefixes, in blocks of `tokens_per_block` (0: TensorRT-LLM's default)."""
    if kind not in ENGINES:
        import triton_python_backend_utils as pb_utils

        raise pb_utils.TritonModelException(
            f"tensorrt_llm: the stand-in engine must be one of {', '.join(ENGINES)}, got {kind!r}"
        )
    if kind == "reference":
        from prefix_cache import DEFAULT_TOKENS_PER_BLOCK
        from reference import DEFAULT_SLOTS, ReferenceSource

        source = ReferenceSource(
            model_dir,
            device,
            dtype,
            slots=slots or DEFAULT_SLOTS,
            max_len=max_seq_len,
            tokenizer_dir=tokenizer_dir,
            block_reuse=block_reuse,
            tokens_per_block=tokens_per_block or DEFAULT_TOKENS_PER_BLOCK,
        )
        return source, source.vocab_size, source.max_len
    from synthetic import SyntheticSource, printable_tokens

    words = printable_tokens(tokenizer_dir or model_dir)
    return SyntheticSource(words), vocab_size(model_dir, max(words) + 1), 1 << 20
