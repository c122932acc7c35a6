"""The `tensorrt_llm` model's tensor contract in the LLM API flavour (NVIDIA's `llmapi` model).

Pure logic, no Triton. Upstream's wire format: `text_input` (a prompt), `streaming`, the
`sampling_param_*` inputs of `tensorrt_llm.SamplingParams`, the `return_finish_reason`,
`return_stop_reason`, `return_cumulative_logprob` switches; out come `text_output` and, when asked
for, `finish_reason`, `stop_reason`, `cumulative_logprob` (as strings, like upstream). Our
extensions, all optional: `input_ids` (a tokenized prompt instead of text, as the service sends),
`sampling_param_{repetition_penalty,min_tokens,end_id,stop_token_ids}`,
`return_num_{input,output}_tokens` (INT32 `num_input_tokens` / `num_output_tokens`, for usage), and
the C++ backend's `guided_decoding_guide_type` / `guided_decoding_guide` (the LLM API's
`GuidedDecodingParams`), and `sampling_param_logprobs` (the LLM API's `logprobs`: N >= 0 returns each
new token's id and log prob as `output_ids` / `output_log_probs`, and with N > 0 the N most likely
tokens of each step as `top_log_prob_ids` / `top_log_probs` [tokens, N]).

Unlike upstream, streamed `text_output`s are deltas that concatenate exactly to the whole text, and
a request the engine refuses is an INVALID_ARG error whose message starts with INVALID_REQUEST.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from contract import EngineLimits, EngineRequest, RequestError, parse_guide

GetInput = Callable[[str], "np.ndarray | None"]

SCALARS: dict[str, object] = {
    "streaming": False,
    "sampling_param_temperature": None,
    "sampling_param_top_k": None,
    "sampling_param_top_p": None,
    "sampling_param_frequency_penalty": 0.0,
    "sampling_param_presence_penalty": 0.0,
    "sampling_param_repetition_penalty": 1.0,
    "sampling_param_max_tokens": None,
    "sampling_param_min_tokens": 0,
    "sampling_param_seed": None,
    "sampling_param_logprobs": None,
    "sampling_param_end_id": None,
    "sampling_param_best_of": 1,
    "sampling_param_exclude_input_from_output": True,
    "sampling_param_return_perf_metrics": False,
    "return_finish_reason": False,
    "return_stop_reason": False,
    "return_cumulative_logprob": False,
    "return_num_input_tokens": False,
    "return_num_output_tokens": False,
}
"""Scalar inputs and their defaults when absent (None: decided by the engine's limits)."""

OPTIONAL_OUTPUTS = {
    "return_finish_reason": "finish_reason",
    "return_stop_reason": "stop_reason",
    "return_cumulative_logprob": "cumulative_logprob",
    "return_num_input_tokens": "num_input_tokens",
    "return_num_output_tokens": "num_output_tokens",
}
"""Switch input -> the output it adds to every response (`text_output` is always there)."""

MAX_LOGPROBS = 20
"""The most top log probs a request may ask for per token (OpenAI's limit)."""
LOGPROB_OUTPUTS = ("output_ids", "output_log_probs")
TOP_LOGPROB_OUTPUTS = ("top_log_prob_ids", "top_log_probs")


@dataclass(frozen=True, slots=True)
class TextLimits:
    """What the served model accepts beyond the token contract: its default end ids."""

    engine: EngineLimits
    end_ids: tuple[int, ...] = ()  # the first is the end id; the others end a sequence too


@dataclass(slots=True)
class TextRequest:
    """One LLM API request, validated: the token-level request and the text-level rest."""

    engine: EngineRequest
    stop: tuple[str, ...]
    outputs: frozenset[str]
    echo_prompt: str | None  # the prompt's text when it is to be echoed (exclude_input_from_output false)
    lora_name: str | None = None  # the packed LoRA adapter to apply (ours: `lora_name`)
    lora: Any = None  # what the engine needs of it (LLM API: its LoRARequest arguments)


def scalar(get: GetInput, name: str) -> object:
    array = get(name)
    if array is None or array.size == 0:
        return SCALARS[name]
    value = array.reshape(-1)[0]
    return value.item() if hasattr(value, "item") else value


def _strings(array: np.ndarray | None, name: str) -> list[str]:
    if array is None:
        return []
    out = []
    for item in array.reshape(-1).tolist():
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError:
                raise RequestError(f"{name} is not valid UTF-8") from None
        out.append(str(item))
    return out


def parse_text_request(
    get: GetInput,
    request_id: str,
    limits: TextLimits,
    tokenize: Callable[[str], list[int]],
    detokenize: Callable[[list[int]], str],
) -> TextRequest:
    """Validates one request; raises RequestError with a message for the client."""
    ids = get("input_ids")
    texts = _strings(get("text_input"), "text_input")
    if ids is not None and ids.size > 0:
        if texts and any(texts):
            raise RequestError("send text_input or input_ids, not both")
        input_ids = [int(i) for i in ids.reshape(-1).tolist()]
    else:
        if len(texts) > 1:
            raise RequestError(f"the model takes one prompt per request, got {len(texts)}")
        if not texts or not texts[0]:
            raise RequestError("text_input is empty")
        input_ids = tokenize(texts[0])
        if not input_ids:
            raise RequestError("text_input tokenizes to no tokens")
    engine = limits.engine
    if min(input_ids) < 0 or max(input_ids) >= engine.vocab_size:
        raise RequestError(f"input_ids contains an id outside the vocabulary [0, {engine.vocab_size})")
    room = engine.max_seq_len - len(input_ids)
    if room < 1:
        raise RequestError(
            f"the prompt ({len(input_ids)} tokens) leaves no room within the model's max_seq_len of "
            f"{engine.max_seq_len} tokens"
        )
    asked = scalar(get, "sampling_param_max_tokens")
    max_new = room if asked is None else int(asked)  # type: ignore[call-overload]
    if max_new <= 0:
        raise RequestError(f"sampling_param_max_tokens must be positive, got {max_new}")
    if max_new > room:
        raise RequestError(
            f"prompt ({len(input_ids)} tokens) + max_tokens ({max_new}) exceeds the model's "
            f"max_seq_len of {engine.max_seq_len} tokens"
        )
    best_of = int(scalar(get, "sampling_param_best_of"))  # type: ignore[call-overload]
    if best_of != 1:
        raise RequestError(f"sampling_param_best_of {best_of} is not supported (only 1)")
    streaming = bool(scalar(get, "streaming"))
    if streaming and not engine.streaming_allowed:
        raise RequestError("streaming requires the model to use decoupled mode")

    temperature = scalar(get, "sampling_param_temperature")
    top_k = scalar(get, "sampling_param_top_k")
    top_p = scalar(get, "sampling_param_top_p")
    temperature = 1.0 if temperature is None else float(temperature)  # type: ignore[arg-type]
    top_k = 0 if top_k is None else int(top_k)  # type: ignore[call-overload]
    top_p = 0.0 if top_p is None else float(top_p)  # type: ignore[arg-type]
    if temperature < 0 or top_k < 0 or not 0.0 <= top_p <= 1.0:
        raise RequestError("temperature and top_k must be >= 0 and top_p within [0, 1]")
    repetition_penalty = float(scalar(get, "sampling_param_repetition_penalty"))  # type: ignore[arg-type]
    if repetition_penalty <= 0:
        raise RequestError("sampling_param_repetition_penalty must be > 0")
    seed = scalar(get, "sampling_param_seed")

    end_id = scalar(get, "sampling_param_end_id")
    stop_tokens = get("sampling_param_stop_token_ids")
    if end_id is None:  # the model's own end ids
        end = limits.end_ids[0] if limits.end_ids else -1
        stop_ids = list(limits.end_ids[1:])
    else:
        end = int(end_id)  # type: ignore[call-overload]
        stop_ids = []
    if stop_tokens is not None and stop_tokens.size:
        stop_ids += [int(i) for i in stop_tokens.reshape(-1).tolist() if int(i) not in stop_ids]
    stops = tuple(dict.fromkeys(s for s in _strings(get("sampling_param_stop"), "sampling_param_stop") if s))

    outputs = set(out for switch, out in OPTIONAL_OUTPUTS.items() if scalar(get, switch))
    logprobs = scalar(get, "sampling_param_logprobs")
    if logprobs is not None:
        logprobs = int(logprobs)  # type: ignore[call-overload]
        if not 0 <= logprobs <= MAX_LOGPROBS:
            raise RequestError(f"sampling_param_logprobs must be within [0, {MAX_LOGPROBS}], got {logprobs}")
        outputs.update(LOGPROB_OUTPUTS + (TOP_LOGPROB_OUTPUTS if logprobs else ()))
    echo = not bool(scalar(get, "sampling_param_exclude_input_from_output"))
    request = EngineRequest(
        request_id=request_id,
        input_ids=input_ids,
        max_new=max_new,
        end_id=end,
        streaming=streaming,
        exclude_input=True,
        greedy=temperature == 0.0 or top_k == 1 or (top_k == 0 and top_p == 0.0),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        repetition_penalty=repetition_penalty,
        presence_penalty=float(scalar(get, "sampling_param_presence_penalty")),  # type: ignore[arg-type]
        frequency_penalty=float(scalar(get, "sampling_param_frequency_penalty")),  # type: ignore[arg-type]
        min_tokens=int(scalar(get, "sampling_param_min_tokens")),  # type: ignore[call-overload]
        seed=None if seed is None else int(seed),  # type: ignore[call-overload]
        stop_words=[[token] for token in stop_ids],
        bad_words=[],
        embedding_bias=None,
        return_log_probs="cumulative_logprob" in outputs or logprobs is not None,
        return_context_logits=False,
        return_generation_logits=False,
        outputs=frozenset(),
        guide=parse_guide(get),
        top_logprobs=logprobs or 0,
    )
    return TextRequest(
        engine=request,
        stop=stops,
        outputs=frozenset(outputs),
        echo_prompt=(texts[0] if texts else detokenize(input_ids)) if echo else None,
        lora_name=next(iter(_strings(get("lora_name"), "lora_name")), None) or None,
    )


def text_arrays(
    request: TextRequest,
    text: str,
    *,
    generated: int,
    finish_reason: str | None = None,
    stop_reason: int | str | None = None,
    cumulative_logprob: float = 0.0,
    ids: list[int] | None = None,
    log_probs: list[float] | None = None,
    top: list[tuple[list[int], list[float]]] | None = None,
) -> dict[str, np.ndarray]:
    """The output tensors of one response: `text` (a delta when streaming) and what was asked for.

    Like upstream, the optional outputs are strings, "None" until the request has finished. `ids`,
    `log_probs` and `top` are the tokens this response adds, with their log probs and top log probs.
    """
    out = {"text_output": np.array([text.encode("utf-8")], dtype=np.object_)}
    wanted = request.outputs
    if "finish_reason" in wanted:
        out["finish_reason"] = np.array([str(finish_reason).encode()], dtype=np.object_)
    if "stop_reason" in wanted:
        out["stop_reason"] = np.array([str(stop_reason).encode()], dtype=np.object_)
    if "cumulative_logprob" in wanted:
        out["cumulative_logprob"] = np.array([repr(float(cumulative_logprob)).encode()], dtype=np.object_)
    if "num_input_tokens" in wanted:
        out["num_input_tokens"] = np.array([len(request.engine.input_ids)], dtype=np.int32)
    if "num_output_tokens" in wanted:
        out["num_output_tokens"] = np.array([generated], dtype=np.int32)
    if "output_ids" in wanted:
        out["output_ids"] = np.array(ids or [], dtype=np.int32)
        out["output_log_probs"] = np.array(log_probs or [], dtype=np.float32)
    if "top_log_probs" in wanted:
        width = request.engine.top_logprobs
        rows = top or []
        out["top_log_prob_ids"] = np.array([r[0] for r in rows], dtype=np.int32).reshape(len(rows), width)
        out["top_log_probs"] = np.array([r[1] for r in rows], dtype=np.float32).reshape(len(rows), width)
    return out
