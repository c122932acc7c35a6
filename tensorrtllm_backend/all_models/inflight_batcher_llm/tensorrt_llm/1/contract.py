"""The `tensorrt_llm` model's tensor contract, as NVIDIA's C++ TensorRT-LLM backend defines it.

Pure logic, no Triton: `parse_request` turns a request's input tensors (looked up by name through a
callable) into a typed `EngineRequest`, and `response_arrays` builds the output tensors of one
response. `model.py` is the thin adapter between Triton's Python backend and this module, so the
rules here are unit-tested without a server.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
from grammars import GUIDE_TYPES

GetInput = Callable[[str], "np.ndarray | None"]

# Scalar inputs: name -> default when absent. Scalars arrive as [1] or [1, 1].
SCALAR_DEFAULTS: dict[str, object] = {
    "input_lengths": None,
    "request_output_len": 0,
    "end_id": -1,
    "pad_id": 0,
    "streaming": False,
    "beam_width": 1,
    "temperature": 1.0,
    "runtime_top_k": 0,
    "runtime_top_p": 0.0,
    "len_penalty": 1.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "min_length": 0,
    "random_seed": None,
    "return_log_probs": False,
    "return_context_logits": False,
    "return_generation_logits": False,
    "exclude_input_in_output": None,
    "return_num_input_tokens": False,
    "return_num_output_tokens": False,
    "stop": False,
}
ARRAY_INPUTS = (
    "input_ids",
    "stop_words_list",
    "bad_words_list",
    "embedding_bias",
    "lora_weights",
    "lora_config",
)
TEXT_INPUTS = ("guided_decoding_guide_type", "guided_decoding_guide")
OUTPUTS = (
    "output_ids",
    "sequence_length",
    "cum_log_probs",
    "output_log_probs",
    "context_logits",
    "generation_logits",
    "num_input_tokens",
    "num_output_tokens",
)


class RequestError(ValueError):
    """A request the engine refuses. Its message goes back to the client after INVALID_REQUEST."""


INVALID_REQUEST = "invalid request: "
"""Prefix of a refused request's error message: in-stream gRPC errors carry no status code, so this
marker is how clients (our service included) tell a bad request from a server fault."""


def scalar(get: GetInput, name: str) -> object:
    """A scalar input as a Python value, or its default (SCALAR_DEFAULTS) when absent or empty."""
    array = get(name)
    if array is None or array.size == 0:
        return SCALAR_DEFAULTS[name]
    return array.reshape(-1)[0].item()


def text(get: GetInput, name: str) -> str | None:
    """A string input (BYTES [1] or [1, 1]) as text, None when absent or empty."""
    array = get(name)
    if array is None or array.size == 0:
        return None
    value = array.reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def parse_guide(get: GetInput) -> tuple[str, str] | None:
    """The guided-decoding request (type, guide text), as the C++ backend takes it, or None."""
    guide_type = text(get, "guided_decoding_guide_type")
    guide = text(get, "guided_decoding_guide")
    if guide_type is None:
        if guide is not None:
            raise RequestError("guided_decoding_guide needs guided_decoding_guide_type")
        return None
    if guide_type not in GUIDE_TYPES:
        raise RequestError(
            f"guided_decoding_guide_type {guide_type!r} is not one of {', '.join(GUIDE_TYPES)}"
        )
    if guide is None and guide_type != "json":
        raise RequestError(f"guided_decoding_guide_type {guide_type!r} needs guided_decoding_guide")
    return guide_type, guide or ""


def parse_word_list(array: np.ndarray | None) -> list[list[int]]:
    """TRT-LLM word lists, [1, 2, N]: flat ids, then cumulative end offsets padded with -1."""
    if array is None or array.size == 0:
        return []
    rows = array.reshape(-1, 2, array.shape[-1])[0]
    words, start = [], 0
    for end in rows[1].tolist():
        if end < 0:
            break
        if end > start:
            words.append(rows[0, start:end].tolist())
        start = end
    return words


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What the served engine accepts."""

    vocab_size: int
    max_seq_len: int
    exclude_input_default: bool = True
    streaming_allowed: bool = True


@dataclass(slots=True)
class EngineRequest:
    """One generation request, validated. `top_k == 0` and `top_p == 0` mean "unset" (TRT-LLM)."""

    request_id: str
    input_ids: list[int]
    max_new: int
    end_id: int
    streaming: bool
    exclude_input: bool
    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    min_length: int
    seed: int | None
    stop_words: list[list[int]]
    bad_words: list[list[int]]
    embedding_bias: np.ndarray | None
    return_log_probs: bool
    return_context_logits: bool
    return_generation_logits: bool
    outputs: frozenset[str]
    guide: tuple[str, str] | None = None  # (guided_decoding_guide_type, guided_decoding_guide)
    top_logprobs: int = 0  # the LLM API flavour's `logprobs`: the N most likely tokens per step
    lora: Any = None  # the adapter to apply (reference engine: its A/B matrices and scaling)
    lora_task_id: int | None = None  # the adapter's id in the engine's LoRA cache
    lora_weights: np.ndarray | None = None  # its rows, sent on first use (TensorRT-LLM's layout)
    lora_config: np.ndarray | None = None


def is_stop_request(get: GetInput) -> bool:
    """TRT-LLM's early stop: a request with `stop` set ends the request that has the same id."""
    return bool(scalar(get, "stop"))


def parse_request(
    get: GetInput, request_id: str, limits: EngineLimits, requested: Collection[str] = ()
) -> EngineRequest:
    """Validates the inputs of one request; raises RequestError with a message for the client.

    `requested` names the outputs the caller asked for; empty means all of them.
    """
    ids = get("input_ids")
    if ids is None or ids.size == 0:
        raise RequestError("input_ids is empty")
    if ids.ndim > 1 and ids.shape[0] != 1:
        raise RequestError(f"the engine takes one sequence per request, got a batch of {ids.shape[0]}")
    length = scalar(get, "input_lengths")
    flat = ids.reshape(-1)
    input_ids = (flat if length is None else flat[: int(length)]).tolist()  # type: ignore[call-overload]
    if not input_ids:
        raise RequestError("input_lengths is 0")
    if min(input_ids) < 0 or max(input_ids) >= limits.vocab_size:
        raise RequestError(f"input_ids contains an id outside the vocabulary [0, {limits.vocab_size})")
    max_new = int(scalar(get, "request_output_len"))  # type: ignore[call-overload]
    if max_new <= 0:
        raise RequestError(f"request_output_len (max_tokens) must be positive, got {max_new}")
    if len(input_ids) + max_new > limits.max_seq_len:
        raise RequestError(
            f"prompt ({len(input_ids)} tokens) + max_tokens ({max_new}) exceeds the engine's "
            f"max_seq_len of {limits.max_seq_len} tokens"
        )
    beam_width = int(scalar(get, "beam_width"))  # type: ignore[call-overload]
    if beam_width != 1:
        raise RequestError(f"beam_width {beam_width} is not supported by this engine (only 1)")
    streaming = bool(scalar(get, "streaming"))
    if streaming and not limits.streaming_allowed:
        raise RequestError("streaming requires the model to use decoupled mode")

    temperature = float(scalar(get, "temperature"))  # type: ignore[arg-type]
    top_k = int(scalar(get, "runtime_top_k"))  # type: ignore[call-overload]
    top_p = float(scalar(get, "runtime_top_p"))  # type: ignore[arg-type]
    if temperature < 0 or top_k < 0 or top_p < 0 or top_p > 1:
        raise RequestError("temperature and top_k must be >= 0 and top_p within [0, 1]")
    seed = scalar(get, "random_seed")
    exclude = scalar(get, "exclude_input_in_output")

    bias = get("embedding_bias")
    embedding_bias = None
    if bias is not None and bias.size > 0:
        flat_bias = bias.reshape(-1)[: limits.vocab_size].astype(np.float32)
        embedding_bias = np.zeros(limits.vocab_size, dtype=np.float32)
        embedding_bias[: flat_bias.shape[0]] = flat_bias

    unknown = set(requested) - set(OUTPUTS)
    if unknown:
        raise RequestError(f"unknown output(s) requested: {', '.join(sorted(unknown))}")
    return_log_probs = bool(scalar(get, "return_log_probs"))
    return_context_logits = bool(scalar(get, "return_context_logits"))
    return_generation_logits = bool(scalar(get, "return_generation_logits"))
    # As the C++ backend: token ids always, the rest only when the request enabled it.
    enabled = {"output_ids", "sequence_length"}
    if return_log_probs:
        enabled |= {"cum_log_probs", "output_log_probs"}
    if return_context_logits:
        enabled.add("context_logits")
    if return_generation_logits:
        enabled.add("generation_logits")
    if scalar(get, "return_num_input_tokens"):
        enabled.add("num_input_tokens")
    if scalar(get, "return_num_output_tokens"):
        enabled.add("num_output_tokens")
    task = get("lora_task_id")
    lora_task_id = int(task.reshape(-1)[0]) if task is not None and task.size else None
    lora_weights, lora_config = get("lora_weights"), get("lora_config")
    has_weights = lora_weights is not None and lora_weights.size > 0
    if has_weights != (lora_config is not None and lora_config.size > 0):
        raise RequestError("lora_weights and lora_config go together")
    if has_weights and lora_task_id is None:
        raise RequestError("lora_weights need a lora_task_id (the id the engine caches them under)")
    return EngineRequest(
        request_id=request_id,
        input_ids=input_ids,
        max_new=max_new,
        end_id=int(scalar(get, "end_id")),  # type: ignore[call-overload]
        streaming=streaming,
        exclude_input=limits.exclude_input_default if exclude is None else bool(exclude),
        # TRT-LLM: top_k 0 and top_p 0 mean "unset"; with neither set it decodes greedily.
        greedy=temperature == 0.0 or top_k == 1 or (top_k == 0 and top_p == 0.0),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        repetition_penalty=float(scalar(get, "repetition_penalty")),  # type: ignore[arg-type]
        presence_penalty=float(scalar(get, "presence_penalty")),  # type: ignore[arg-type]
        frequency_penalty=float(scalar(get, "frequency_penalty")),  # type: ignore[arg-type]
        min_length=int(scalar(get, "min_length")),  # type: ignore[call-overload]
        seed=None if seed is None else int(seed),  # type: ignore[call-overload]
        stop_words=parse_word_list(get("stop_words_list")),
        bad_words=parse_word_list(get("bad_words_list")),
        embedding_bias=embedding_bias,
        return_log_probs=return_log_probs,
        return_context_logits=return_context_logits,
        return_generation_logits=return_generation_logits,
        outputs=frozenset(enabled & set(requested or OUTPUTS)),
        guide=parse_guide(get),
        lora_task_id=lora_task_id,
        lora_weights=lora_weights if has_weights else None,
        lora_config=lora_config if has_weights else None,
    )


def response_arrays(
    request: EngineRequest,
    ids: list[int],
    *,
    generated: int,
    cum_log_prob: float = 0.0,
    log_probs: list[float] | None = None,
    context_logits: np.ndarray | None = None,
    generation_logits: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The output tensors of one response (beam width 1): those the caller asked for and enabled.

    `ids` are the tokens this response carries (streaming: the new ones); `generated` is the number
    of tokens generated so far. As with the C++ backend, log probs, logits and token counts come
    only with the request's `return_*` flags set.
    """
    wanted = request.outputs
    count = len(ids)
    out: dict[str, np.ndarray] = {}
    if "output_ids" in wanted:
        out["output_ids"] = np.array(ids, dtype=np.int32).reshape(1, 1, count)
    if "sequence_length" in wanted:
        out["sequence_length"] = np.array([[count]], dtype=np.int32)
    if "cum_log_probs" in wanted:
        out["cum_log_probs"] = np.array([[cum_log_prob]], dtype=np.float32)
    if "output_log_probs" in wanted:
        values = log_probs or []
        padded = [0.0] * (count - len(values)) + list(values)
        out["output_log_probs"] = np.array(padded, dtype=np.float32).reshape(1, 1, count)
    if "context_logits" in wanted:
        context = context_logits[None] if context_logits is not None else np.zeros((1, 1, 1), np.float32)
        out["context_logits"] = context.astype(np.float32, copy=False)
    if "generation_logits" in wanted:
        generation = (
            generation_logits[None, None]
            if generation_logits is not None
            else np.zeros((1, 1, 1, 1), np.float32)
        )
        out["generation_logits"] = generation.astype(np.float32, copy=False)
    if "num_input_tokens" in wanted:
        out["num_input_tokens"] = np.array([[len(request.input_ids)]], dtype=np.int32)
    if "num_output_tokens" in wanted:
        out["num_output_tokens"] = np.array([[generated]], dtype=np.int32)
    return out
