"""Guided decoding on NVIDIA's C++ backend (the ensemble flavour): the xgrammar tokenizer info it guides with.

The LLM API guides with llguidance and needs nothing packed for it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trtllm_service.packed_model import PackError


def xgrammar_tokenizer_info(
    tokenizer: Any, stop_token_ids: Sequence[int], vocab_size: int | None = None
) -> dict[str, Any]:
    """The tokenizer info NVIDIA's C++ backend builds its xgrammar guided decoder from.

    The JSON object TensorRT-LLM's ``examples/generate_xgrammar_tokenizer_info.py`` writes (and
    ``model_instance_state.cc`` reads: all three keys are required):

    - ``encoded_vocab``: every token id's string as the vocabulary spells it (``Ġthe``, ``<0x0A>``),
      in id order. An id the vocabulary skips is ``""``, which xgrammar never allows, so later ids
      keep their places; tokens at or past the model's ``vocab_size`` are left out (the model cannot
      produce them), as xgrammar's own ``TokenizerInfo.from_huggingface`` does.
    - ``tokenizer_str``: the fast tokenizer's JSON (``tokenizer.json``), from which xgrammar detects
      how tokens decode (byte-level, byte-fallback or raw) and whether a prefix space is added.
    - ``stop_token_ids``: the tokens that may end a guided answer: every end id of the packed model
      (upstream writes only ``eos_token_id``, which would force Llama-3 Instruct to end on
      ``<|end_of_text|>`` rather than ``<|eot_id|>``).

    Raises:
        PackError: Not a fast tokenizer (no ``tokenizer.json``), or no end id within the vocabulary.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise PackError(
            f"guided decoding on NVIDIA's C++ backend (xgrammar) needs a fast tokenizer (tokenizer.json); "
            f"{type(tokenizer).__name__} is not one: pack a tokenizer with tokenizer.json, or pack with "
            "--no-guided-decoding"
        )
    vocab: dict[str, int] = tokenizer.get_vocab()
    size = max(vocab.values(), default=-1) + 1
    if vocab_size is not None:
        size = min(size, vocab_size)
    encoded = [""] * size
    for token, token_id in vocab.items():
        if 0 <= token_id < size:
            encoded[token_id] = token
    stops = [int(i) for i in dict.fromkeys(stop_token_ids) if 0 <= int(i) < size]
    if not stops:
        raise PackError(
            "guided decoding needs an end-of-sequence id within the vocabulary (the tokenizer and its "
            f"config declare {list(stop_token_ids) or 'none'}): fix the tokenizer, or pack with "
            "--no-guided-decoding"
        )
    return {"encoded_vocab": encoded, "tokenizer_str": backend.to_str(), "stop_token_ids": stops}


def write_xgrammar_tokenizer_info(path: Path, info: Mapping[str, Any]) -> None:
    """Writes ``info`` (xgrammar_tokenizer_info) as the JSON file the C++ backend parses."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info), encoding="utf-8")
