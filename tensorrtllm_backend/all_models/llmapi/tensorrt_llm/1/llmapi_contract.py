"""The `tensorrt_llm` model's tensor contract in the LLM API flavour (NVIDIA's `llmapi` model).

Pure logic, no Triton. Upstream's wire format (nvidia_llmapi.py): `text_input` (a prompt),
`streaming`, the `sampling_param_*` inputs, each the `tensorrt_llm.SamplingParams` keyword of the same
name (left out when absent, as upstream's helpers do), the `return_finish_reason`,
`return_stop_reason`, `return_cumulative_logprob` switches and `stop` (end the requests with this
request id); out come `text_output` and, when asked for, `finish_reason`, `stop_reason` (strings,
"None" until the request finished) and `cumulative_logprob` (FP32 as declared; upstream sends a
string). Our extensions, all optional: `input_ids` (a tokenized prompt instead of text, as the service
sends), `sampling_param_{repetition_penalty,min_tokens,end_id,stop_token_ids}`,
`return_num_{input,output}_tokens` (INT32 `num_input_tokens` / `num_output_tokens`, for usage), the C++
backend's `guided_decoding_guide_type` / `guided_decoding_guide` (the LLM API's
`GuidedDecodingParams`), `lora_name` (a packed adapter) and `sampling_param_logprobs` (N >= 0 returns
each new token's id and log prob as `output_ids` / `output_log_probs`, and with N > 0 the N most
likely tokens of each step as `top_log_prob_ids` / `top_log_probs` [tokens, N]); SamplingParams
fields of the same name: `sampling_param_embedding_bias` (FP32, vocabulary-sized: the logit bias),
`sampling_param_{use_beam_search,n,length_penalty,early_stopping}` (beam search, with upstream's
`sampling_param_best_of` as the beam width: one response, every output a row of `text_output`,
`finish_reason`, `cumulative_logprob` and `num_output_tokens`) and `sampling_param_prompt_logprobs`
(N >= 0: each prompt token's log prob as `prompt_log_probs`, NaN for the first, and with N > 0 the N
most likely of each position as `prompt_top_log_prob_ids` / `prompt_top_log_probs` [prompt, N], on
the first response). Upstream's `sampling_param_return_perf_metrics` adds its perf outputs
(`kv_cache_reused_block`, ...) to the final response, typed as declared (upstream sends strings).

A request upstream's model refuses is refused here with its message (`LlmApiError`, sent after
nv.GENERATE_ERROR as upstream does); SamplingParams' own refusals come from SamplingParams itself.
What upstream serves and our model does not (several prompts) is refused as ours
(`RequestError`, INVALID_ARG after INVALID_REQUEST). Upstream ignores extra `text_input` elements
silently; so does this, unless CONTRACT_CHECK_ENV is set (the tests), then it refuses them.

This is 1.2.1's contract (image 26.07). TensorRT-LLM main, the 1.3 line, adds optional inputs
(nvidia_llmapi.py's docstring names them): `image_url` (images, behind model.yaml's
`triton_config.multimodal`), which this model neither declares nor reads, and `lora_id` / `lora_name`
/ `lora_path` / `lora_ckpt_source`, where main's `lora_name` must come with `lora_id` and `lora_path`
while ours names a packed adapter alone: the one input whose meaning differs on the next image.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import nvidia_llmapi as nv
from shared_contract import RequestError, contract_check, parse_guide

GetInput = Callable[[str], "np.ndarray | None"]

OURS: dict[str, str] = {
    "sampling_param_repetition_penalty": "repetition_penalty",
    "sampling_param_min_tokens": "min_tokens",
    "sampling_param_use_beam_search": "use_beam_search",
    "sampling_param_n": "n",
    "sampling_param_length_penalty": "length_penalty",
    "sampling_param_early_stopping": "early_stopping",
}
"""Our sampling inputs that are SamplingParams keywords of the same meaning."""

DEFAULTS: dict[str, object] = {**nv.SAMPLING_INPUT_DEFAULTS, "sampling_param_exclude_input_from_output": True}
"""What an absent sampling input means: upstream's defaults, except that ours echoes no prompt
unless asked (upstream's helpers send exclude_input_from_output=False)."""

OPTIONAL_OUTPUTS = {
    **nv.OUTPUT_SWITCHES,
    "return_num_input_tokens": "num_input_tokens",
    "return_num_output_tokens": "num_output_tokens",
}
"""Switch input -> the output it adds to every response (`text_output` is always there)."""

MAX_LOGPROBS = 20
"""The most top log probs a request may ask for per token (OpenAI's limit)."""
LOGPROB_OUTPUTS = ("output_ids", "output_log_probs")
TOP_LOGPROB_OUTPUTS = ("top_log_prob_ids", "top_log_probs")
PROMPT_LOGPROB_OUTPUTS = ("prompt_log_probs",)
PROMPT_TOP_LOGPROB_OUTPUTS = ("prompt_top_log_prob_ids", "prompt_top_log_probs")
PERF_OUTPUTS: dict[str, tuple[str, Any]] = {
    "kv_cache_reused_block": ("kv_cache_metrics.num_reused_blocks", np.int32),
    "kv_cache_missed_block": ("kv_cache_metrics.num_missed_blocks", np.int32),
    "kv_cache_alloc_new_blocks": ("kv_cache_metrics.num_new_allocated_blocks", np.int32),
    "kv_cache_alloc_total_blocks": ("kv_cache_metrics.num_total_allocated_blocks", np.int32),
    "kv_cache_hit_rate": ("kv_cache_metrics.kv_cache_hit_rate", np.float32),
    "arrival_time_ns": ("timing_metrics.arrival_time", np.int64),
    "first_scheduled_time_ns": ("timing_metrics.first_scheduled_time", np.int64),
    "first_token_time_ns": ("timing_metrics.first_token_time", np.int64),
    "last_token_time_ns": ("timing_metrics.last_token_time", np.int64),
    "acceptance_rate": ("speculative_decoding.acceptance_rate", np.float32),
    "total_accepted_draft_tokens": ("speculative_decoding.total_accepted_draft_tokens", np.int32),
    "total_draft_tokens": ("speculative_decoding.total_draft_tokens", np.int32),
}
"""Upstream's perf outputs: where upstream's model reads each in CompletionOutput.request_perf_metrics
(times are timedeltas: sent in ns), and the type its config.pbtxt declares."""


class LlmApiError(ValueError):
    """A request upstream's llmapi model refuses: its message, sent after nv.GENERATE_ERROR."""


@dataclass(frozen=True, slots=True)
class TextLimits:
    """What the served model accepts: its vocabulary, context, mode and default end ids."""

    vocab_size: int
    max_seq_len: int
    streaming_allowed: bool = True
    end_ids: tuple[int, ...] = ()  # the first is the end id; the others end a sequence too


@dataclass(slots=True)
class TextRequest:
    """One LLM API request, validated: the prompt, the SamplingParams keywords, what to return."""

    request_id: str
    input_ids: list[int]
    sampling: dict[str, Any]  # tensorrt_llm.SamplingParams keywords (guided decoding: see `guide`)
    streaming: bool
    outputs: frozenset[str]  # the outputs its responses carry: enabled, and asked for (see `sent_outputs`)
    echo_prompt: str | None  # the prompt's text when it is to be echoed (exclude_input_from_output false)
    guide: tuple[str, str] | None = None  # (guided_decoding_guide_type, guide)
    top_logprobs: int = 0  # N of sampling_param_logprobs: the most likely tokens per step to return
    prompt_logprobs: int | None = None  # N of sampling_param_prompt_logprobs (None: not asked)
    lora_name: str | None = None  # the LoRA adapter to apply (ours: `lora_name`, a packed one alone)
    lora_id: int | None = None  # with lora_path (main's inputs): an adapter by path, cached by this id
    lora_path: str | None = None
    lora: Any = None  # its LoRARequest arguments (name, id, path), set by model.py


def scalar(get: GetInput, name: str) -> Any:
    """A scalar input as a Python value, None when absent or empty; as upstream's
    get_input_scalar_by_name, a tensor of more than one element is refused."""
    array = get(name)
    if array is None or array.size == 0:
        return None
    if array.size != 1:
        raise LlmApiError(nv.NOT_SCALAR.format(name=name))
    return array.reshape(-1)[0].item()


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


def is_stop_request(get: GetInput) -> bool:
    """Upstream's `stop` input: end every request in flight with this request's id."""
    return bool(scalar(get, "stop"))


def _prompt(get: GetInput, tokenize: Callable[[str], list[int]]) -> tuple[list[int], str | None]:
    ids = get("input_ids")
    text_input = get("text_input")
    if ids is not None and ids.size > 0:
        if text_input is not None and any(_strings(text_input, "text_input")):
            raise RequestError("send text_input or input_ids, not both")
        return [int(i) for i in ids.reshape(-1).tolist()], None
    if text_input is None:
        raise LlmApiError(nv.TEXT_INPUT_MISSING)
    if text_input.ndim > 1:
        raise LlmApiError(nv.TEXT_INPUT_NOT_1D)
    texts = _strings(text_input, "text_input")
    if len(texts) > 1 and contract_check():  # upstream takes the first and drops the rest unsaid
        raise RequestError(f"the model takes one prompt per request, got {len(texts)}")
    if not texts or not texts[0]:
        raise RequestError("text_input is empty")
    input_ids = tokenize(texts[0])
    if not input_ids:
        raise RequestError("text_input tokenizes to no tokens")
    return input_ids, texts[0]


def sent_outputs(enabled: set[str], requested: Collection[str]) -> frozenset[str]:
    """The outputs a request's responses carry: `text_output` and what its switches enable, less
    what the caller did not ask for (Triton passes every output when the caller names none).

    Never more: Triton's Python backend drops an unrequested output inside `send`, without the GIL,
    and freeing its array there crashes the stub under Python 3.12 (pytriton 0.7's stub, Triton 2.51:
    InferResponse::PruneOutputTensors -> ~PbTensor -> PyObject_Free with no thread state)."""
    wanted = {"text_output", *enabled}
    return frozenset(wanted & set(requested)) if requested else frozenset(wanted)


def parse_text_request(
    get: GetInput,
    request_id: str,
    limits: TextLimits,
    tokenize: Callable[[str], list[int]],
    detokenize: Callable[[list[int]], str],
    requested: Collection[str] = (),
) -> TextRequest:
    """Validates one request; raises LlmApiError (upstream's refusal) or RequestError (ours).

    `requested` names the outputs the caller asked for (`request.requested_output_names()`)."""
    input_ids, text = _prompt(get, tokenize)
    if min(input_ids) < 0 or max(input_ids) >= limits.vocab_size:
        raise RequestError(f"input_ids contains an id outside the vocabulary [0, {limits.vocab_size})")
    room = limits.max_seq_len - len(input_ids)
    if room < 1:
        raise RequestError(
            f"the prompt ({len(input_ids)} tokens) leaves no room within the model's max_seq_len of "
            f"{limits.max_seq_len} tokens"
        )
    streaming = bool(scalar(get, "streaming") or False)
    if streaming and not limits.streaming_allowed:
        raise LlmApiError(nv.STREAMING_NOT_DECOUPLED)

    # The SamplingParams keywords, as upstream's helpers build them: what the request sets.
    sampling: dict[str, Any] = {}
    for name, keyword in {**nv.SAMPLING_INPUTS, **OURS}.items():
        value = scalar(get, name)
        if value is None:
            value = DEFAULTS.get(name)
        if value is not None:
            sampling[keyword] = value
    # Ours: unset max_tokens is what the context leaves (upstream: SamplingParams' 32).
    max_new = sampling.setdefault("max_tokens", room)
    if max_new <= 0:
        raise RequestError(f"sampling_param_max_tokens must be positive, got {max_new}")
    # More than the context leaves is the LLM's to settle: the PyTorch backend clamps it to
    # max_seq_len - prompt with a warning (BaseWorker._deduce_max_tokens), no error.
    if sampling.get("return_perf_metrics") is False:
        del sampling["return_perf_metrics"]  # upstream's default, sent by its helpers: the LLM API's too
    if sampling.get("use_beam_search"):
        if streaming:
            raise RequestError("streaming beam search is not served by this model: send streaming false")
    elif sampling.get("use_beam_search") is False:
        del sampling["use_beam_search"]
    bias = get("sampling_param_embedding_bias")
    if bias is not None and bias.size:
        if bias.size != limits.vocab_size:
            raise RequestError(
                f"sampling_param_embedding_bias has {bias.size} values; the vocabulary has {limits.vocab_size}"
            )
        if not np.isfinite(bias).all():
            raise RequestError("sampling_param_embedding_bias must hold finite numbers")
        sampling["embedding_bias"] = bias.reshape(-1).astype(np.float32)
    # Ours: the prompt is echoed as text by the model (see nvidia_llmapi), not by the engine.
    echo = not sampling.pop("exclude_input_from_output", True)
    for name in ("temperature", "top_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
        if name in sampling and not math.isfinite(sampling[name]):
            raise RequestError(f"sampling_param_{name} must be a finite number")
    if sampling.get("repetition_penalty", 1.0) <= 0:
        raise RequestError("sampling_param_repetition_penalty must be > 0")

    end_id = scalar(get, "sampling_param_end_id")
    stop_ids: list[int] = []
    if end_id is None:  # the model's own end ids
        if limits.end_ids:
            sampling["end_id"] = limits.end_ids[0]
            stop_ids = list(limits.end_ids[1:])
    elif end_id == -1:
        sampling["ignore_eos"] = True
    else:
        sampling["end_id"] = int(end_id)
    stop_tokens = get("sampling_param_stop_token_ids")
    if stop_tokens is not None and stop_tokens.size:
        stop_ids += [int(i) for i in stop_tokens.reshape(-1).tolist() if int(i) not in stop_ids]
    if stop_ids:
        sampling["stop_token_ids"] = stop_ids
    stops = list(dict.fromkeys(s for s in _strings(get("sampling_param_stop"), "sampling_param_stop") if s))
    if stops:
        sampling["stop"] = stops

    outputs = set(out for switch, out in OPTIONAL_OUTPUTS.items() if scalar(get, switch))
    top = 0
    logprobs = scalar(get, "sampling_param_logprobs")
    if logprobs is not None:
        top = int(logprobs)
        if not 0 <= top <= MAX_LOGPROBS:
            raise RequestError(f"sampling_param_logprobs must be within [0, {MAX_LOGPROBS}], got {top}")
        outputs.update(LOGPROB_OUTPUTS + (TOP_LOGPROB_OUTPUTS if top else ()))
    if logprobs is not None or "cumulative_logprob" in outputs:
        # The PyTorch backend computes log probs only for bool(logprobs): ask for at least one.
        sampling["logprobs"] = max(top, 1)
    prompt_top = scalar(get, "sampling_param_prompt_logprobs")
    if prompt_top is not None:
        prompt_top = int(prompt_top)
        if not 0 <= prompt_top <= MAX_LOGPROBS:
            raise RequestError(
                f"sampling_param_prompt_logprobs must be within [0, {MAX_LOGPROBS}], got {prompt_top}"
            )
        if sampling.get("use_beam_search"):
            raise RequestError("sampling_param_prompt_logprobs with beam search is not served by this model")
        # At 1.2 the LLM API's prompt_logprobs are the top N of each position only (result.py
        # compute_logprobs, without the prompt's tokens): each prompt token's own log prob comes from
        # the context logits, which are asked for too (the PyTorch backend returns them per request).
        sampling["prompt_logprobs"] = max(prompt_top, 1)
        sampling["return_context_logits"] = True
        outputs.update(PROMPT_LOGPROB_OUTPUTS + (PROMPT_TOP_LOGPROB_OUTPUTS if prompt_top else ()))
    if sampling.get("return_perf_metrics"):
        outputs.update(PERF_OUTPUTS)
    return TextRequest(
        request_id=request_id,
        input_ids=input_ids,
        sampling=sampling,
        streaming=streaming,
        outputs=sent_outputs(outputs, requested),
        echo_prompt=(text if text is not None else detokenize(input_ids)) if echo else None,
        guide=parse_guide(get),
        top_logprobs=top,
        prompt_logprobs=prompt_top,
        lora_name=next(iter(_strings(get("lora_name"), "lora_name")), None) or None,
        lora_id=None if scalar(get, "lora_id") is None else int(scalar(get, "lora_id")),
        lora_path=next(iter(_strings(get("lora_path"), "lora_path")), None) or None,
    )


def text_arrays(
    request: TextRequest,
    text: str,
    *,
    generated: int,
    finish_reason: str | None = None,
    stop_reason: int | str | None = None,
    cumulative_logprob: float | None = None,
    ids: list[int] | None = None,
    log_probs: list[float] | None = None,
    top: list[tuple[list[int], list[float]]] | None = None,
    prompt: tuple[list[float], list[tuple[list[int], list[float]]]] | None = None,
    perf: Any = None,
) -> dict[str, np.ndarray]:
    """The output tensors of one response: `text` (a delta when streaming) and what was asked for.

    finish_reason / stop_reason are strings, "None" until the request has finished (upstream's
    str()); cumulative_logprob is FP32, NaN when none was computed. `ids`, `log_probs` and `top` are
    the tokens this response adds, with their log probs and top log probs (rows of equal width).
    """
    wanted = request.outputs
    out: dict[str, np.ndarray] = {}
    if "text_output" in wanted:
        out["text_output"] = np.array([text.encode("utf-8")], dtype=np.object_)
    if "finish_reason" in wanted:
        out["finish_reason"] = np.array([str(finish_reason).encode()], dtype=np.object_)
    if "stop_reason" in wanted:
        out["stop_reason"] = np.array([str(stop_reason).encode()], dtype=np.object_)
    if "cumulative_logprob" in wanted:
        value = math.nan if cumulative_logprob is None else cumulative_logprob
        out["cumulative_logprob"] = np.array([value], dtype=np.float32)
    if "num_input_tokens" in wanted:
        out["num_input_tokens"] = np.array([len(request.input_ids)], dtype=np.int32)
    if "num_output_tokens" in wanted:
        out["num_output_tokens"] = np.array([generated], dtype=np.int32)
    if "output_ids" in wanted:
        out["output_ids"] = np.array(ids or [], dtype=np.int32)
    if "output_log_probs" in wanted:
        out["output_log_probs"] = np.array(log_probs or [], dtype=np.float32)
    if "top_log_prob_ids" in wanted or "top_log_probs" in wanted:
        rows = top or []
        width = len(rows[0][0]) if rows else request.top_logprobs
        if "top_log_prob_ids" in wanted:
            out["top_log_prob_ids"] = np.array([r[0] for r in rows], dtype=np.int32).reshape(len(rows), width)
        if "top_log_probs" in wanted:
            out["top_log_probs"] = np.array([r[1] for r in rows], dtype=np.float32).reshape(len(rows), width)
    if prompt is not None:  # the first response of a request with sampling_param_prompt_logprobs
        values, tops = prompt
        if "prompt_log_probs" in wanted:
            out["prompt_log_probs"] = np.array(values, dtype=np.float32)
        width = min((len(row[0]) for row in tops), default=0)
        if "prompt_top_log_prob_ids" in wanted:
            out["prompt_top_log_prob_ids"] = np.array(
                [row[0][:width] for row in tops], dtype=np.int32
            ).reshape(len(tops), width)
        if "prompt_top_log_probs" in wanted:
            out["prompt_top_log_probs"] = np.array(
                [row[1][:width] for row in tops], dtype=np.float32
            ).reshape(len(tops), width)
    if perf is not None:  # the final response of a request with sampling_param_return_perf_metrics
        out.update(perf_arrays(perf, wanted))
    return out


def perf_arrays(metrics: Any, wanted: Collection[str]) -> dict[str, np.ndarray]:
    """Upstream's perf outputs of a CompletionOutput.request_perf_metrics that are `wanted`, typed as
    declared."""
    out = {}
    for name, (path, dtype) in PERF_OUTPUTS.items():
        if name not in wanted:
            continue
        value: Any = metrics
        for part in path.split("."):
            value = getattr(value, part, None)
        if value is None:
            value = 0
        elif hasattr(value, "total_seconds"):  # a timedelta since the epoch (upstream: pd.Timedelta)
            value = round(value.total_seconds() * 1e9)
        out[name] = np.array([value], dtype=dtype)
    return out


def beam_arrays(request: TextRequest, outputs: list[Any], *, perf: Any = None) -> dict[str, np.ndarray]:
    """The one response of a beam search: each returned beam a row (text, finish reason, stop reason,
    cumulative log prob, token count), best first, as upstream sends `[o.text for o in outputs]`."""
    wanted = request.outputs
    out = {}
    if "text_output" in wanted:
        out["text_output"] = np.array([o.text.encode("utf-8") for o in outputs], dtype=np.object_)
    if "finish_reason" in wanted:
        out["finish_reason"] = np.array([str(o.finish_reason).encode() for o in outputs], dtype=np.object_)
    if "stop_reason" in wanted:
        out["stop_reason"] = np.array([str(o.stop_reason).encode() for o in outputs], dtype=np.object_)
    if "cumulative_logprob" in wanted:
        out["cumulative_logprob"] = np.array(
            [math.nan if o.cumulative_logprob is None else o.cumulative_logprob for o in outputs],
            dtype=np.float32,
        )
    if "num_input_tokens" in wanted:
        out["num_input_tokens"] = np.array([len(request.input_ids)], dtype=np.int32)
    if "num_output_tokens" in wanted:
        out["num_output_tokens"] = np.array([len(o.token_ids) for o in outputs], dtype=np.int32)
    if perf is not None:
        out.update(perf_arrays(perf, wanted))
    return out
