"""How our stand-in engines read a request of the `tensorrt_llm` model: NVIDIA's C++ backend rules.

Pure logic, no Triton: `parse_request` turns a request's input tensors (looked up by name through a
callable) into a typed `EngineRequest`, and `response_arrays` builds the output tensors of one
response. `model.py` is the thin adapter between Triton's Python backend and this module, so the
rules here are unit-tested without a server.

The tensors and messages are NVIDIA's (nvidia_backend.py, the backend's source at the pinned tag).
A request NVIDIA's backend refuses is refused here with its message (`BackendError`, sent as
INTERNAL like the backend's); what NVIDIA serves and our engines cannot (speculative decoding, encoder
inputs, prompt tables, several sequences per request) is refused as ours (`RequestError`, marked
with INVALID_REQUEST). Inputs NVIDIA accepts and silently ignores are ignored here too, unless
CONTRACT_CHECK_ENV is set (the tests set it): then such a request is refused loudly, so nothing the
service sends can rely on an input that does nothing in production. Those three, and the guided-
decoding inputs, are the llmapi model's too: they live in shared_contract.py, which this imports.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import nvidia_backend as nv
from shared_contract import GetInput, RequestError, contract_check, parse_guide

# Scalar inputs we honour: name -> default when absent. Scalars arrive as [1] or [1, 1].
SCALAR_DEFAULTS: dict[str, object] = {
    "request_output_len": None,
    "end_id": None,
    "pad_id": None,
    "streaming": False,
    "beam_width": 1,
    "num_return_sequences": 1,
    "temperature": 1.0,
    "runtime_top_k": 0,
    "runtime_top_p": 0.0,
    "len_penalty": 0.0,  # the executor's default (SamplingConfig lengthPenalty 0.f)
    "early_stopping": 1,
    "beam_search_diversity_rate": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "min_tokens": 0,
    "seed": None,
    "return_log_probs": False,
    "return_context_logits": False,
    "return_generation_logits": False,
    "return_perf_metrics": False,
    "exclude_input_in_output": None,
    "return_num_input_tokens": False,
    "return_num_output_tokens": False,
    "stop": False,
}
assert all(nv.tensor(name) for name in SCALAR_DEFAULTS)

ARRAY_INPUTS = (
    "input_ids",
    "input_lengths",
    "stop_words_list",
    "bad_words_list",
    "embedding_bias",
    "lora_task_id",
    "lora_weights",
    "lora_config",
    "guided_decoding_guide_type",
    "guided_decoding_guide",
)
"""Inputs we honour that are not plain scalars."""

KEPT_HINTS = (
    "retention_token_range_starts",
    "retention_token_range_ends",
    "retention_token_range_priorities",
    "retention_token_range_durations_ms",
    "retention_decode_priority",
    "retention_decode_duration_ms",
)
"""KV cache retention hints: advice to NVIDIA's block manager; an engine without a paged cache may
take them and do nothing (their consistency is still checked, as NVIDIA's backend does)."""

NOT_IMPLEMENTED = tuple(
    t.name
    for t in nv.INPUTS
    if t.name not in SCALAR_DEFAULTS
    and t.name not in ARRAY_INPUTS
    and t.name not in KEPT_HINTS
    and t.name not in nv.IGNORED_INPUTS
    and not t.name.startswith("lookahead_")
)
"""What NVIDIA's backend serves and our stand-ins cannot: encoder-decoder and multimodal inputs,
speculative decoding, prompt tables, disaggregated serving."""

OUTPUTS = tuple(t.name for t in nv.OUTPUTS)


class BackendError(ValueError):
    """A request NVIDIA's backend refuses: the message is NVIDIA's, sent as INTERNAL like the backend's.

    `executor`: the refusal comes from the executor when it takes the request, so the message is sent
    after nv.EXECUTOR_ERROR (and nv.FETCH_ERROR), as the backend reports it."""

    def __init__(self, message: str, *, executor: bool = False) -> None:
        super().__init__(message)
        self.executor = executor

    def message(self, executor_id: int) -> str:
        """The error text of the backend's response to this request."""
        if not self.executor:
            return str(self)
        return nv.EXECUTOR_ERROR.format(id=executor_id) + nv.FETCH_ERROR + str(self)


def scalar(get: GetInput, name: str) -> Any:
    """A scalar input as a Python value, or its default (SCALAR_DEFAULTS) when absent or empty.

    As the backend's extractSingleton: a present tensor must hold exactly one element."""
    array = get(name)
    if array is None or array.size == 0:
        return SCALAR_DEFAULTS[name]
    if array.size != 1:
        raise BackendError(nv.BAD_SINGLETON.format(name=name))
    return array.reshape(-1)[0].item()


def parse_word_list(array: np.ndarray | None) -> list[list[int]]:
    """TRT-LLM word lists, [1, 2, N]: flat ids, then cumulative end offsets padded with -1."""
    if array is None or array.size == 0:
        return []
    rows = array.reshape(-1, 2, array.shape[-1])[0]
    offsets = rows[1].tolist()
    first_pad = offsets.index(-1) if -1 in offsets else len(offsets)
    used = offsets[:first_pad]
    shown = " ".join(str(v) for v in rows.reshape(-1).tolist())
    if any(end != -1 for end in offsets[first_pad:]) or any(end < 0 for end in used):
        raise BackendError(nv.ASSERTION + nv.SPARSE_LIST.format(problem="additional -1s") + shown)
    if any(end > rows.shape[1] for end in used):
        raise BackendError(nv.ASSERTION + nv.SPARSE_LIST.format(problem="out-of-bound offsets") + shown)
    if any(b <= a for a, b in itertools.pairwise(used)):
        raise BackendError(nv.ASSERTION + nv.SPARSE_LIST.format(problem="non-increasing offsets") + shown)
    words, start = [], 0
    for end in used:
        if end > start:
            words.append(rows[0, start:end].tolist())
        start = end
    return words


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What the served engine accepts, and how its model is configured."""

    vocab_size: int
    max_seq_len: int
    exclude_input_default: bool = True
    streaming_allowed: bool = True
    max_input_len: int = 0  # 0: max_seq_len - 1
    guided_decoding: bool = True  # config.pbtxt sets up NVIDIA's guided decoder (backend + tokenizer info)
    max_beam_width: int = 1  # config.pbtxt's max_beam_width: the engine's most beams
    gather_context_logits: bool = True  # whether the engine returns context logits (trtllm-build's flag)

    @property
    def input_limit(self) -> int:
        return self.max_input_len or self.max_seq_len - 1


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
    min_tokens: int
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
    return_perf_metrics: bool = False
    beam_width: int = 1  # > 1: beam search over this many beams
    num_return: int = 1  # the best beams to return (num_return_sequences; <= beam_width)
    length_penalty: float = 0.0  # beam search: scores are cum_log_prob / length**length_penalty
    early_stopping: int = 1  # beam search: 1 stop at beam_width finished; 0 heuristic; other: never


def is_stop_request(get: GetInput) -> bool:
    """TRT-LLM's early stop: a request with `stop` set ends the request that has the same id."""
    return bool(scalar(get, "stop"))


def _check_retention(get: GetInput) -> None:
    """NVIDIA's consistency checks of the KV cache retention hints (utils.cc)."""
    starts = get("retention_token_range_starts")
    if starts is None:
        return
    for name, required in (
        ("retention_token_range_ends", True),
        ("retention_token_range_priorities", True),
        ("retention_token_range_durations_ms", False),
    ):
        other = get(name)
        if (other is None and required) or (other is not None and other.size != starts.size):
            raise BackendError(
                f"{name} must be provided, and have the same length as retention_token_range_starts"
                if required
                else f"{name} must have the same length as retention_token_range_starts"
            )


def _refuse_unsupported(get: GetInput) -> None:
    """Inputs NVIDIA's backend takes that our engines cannot honour, or that it ignores."""
    for name in NOT_IMPLEMENTED:
        value = get(name)
        if value is not None and value.size:
            raise RequestError(f"{name} is served by NVIDIA's TensorRT-LLM backend, not by this engine")
    if any(get(name) is not None for name in ("lookahead_window_size", "lookahead_ngram_size")):
        raise BackendError(
            nv.ASSERTION + "Cannot set the request lookahead decoding configuration when model instance "
            "lookahead parameters are not set."
        )
    for name, why in nv.IGNORED_INPUTS.items():
        if contract_check() and get(name) is not None:
            raise RequestError(f"{name} would do nothing in production: {why}")


def parse_request(
    get: GetInput, request_id: str, limits: EngineLimits, requested: Collection[str] = ()
) -> EngineRequest:
    """Validates the inputs of one request, in NVIDIA's order; raises BackendError (NVIDIA's
    refusal) or RequestError (ours).

    `requested` names the outputs the caller asked for (Triton passes all of them when the caller
    named none).
    """
    ids = get("input_ids")
    if ids is None:
        raise BackendError(nv.NO_INPUT_IDS)
    streaming = bool(scalar(get, "streaming"))
    if streaming and not limits.streaming_allowed:
        raise BackendError(nv.STREAMING_NOT_DECOUPLED)
    max_new = scalar(get, "request_output_len")
    if max_new is None:
        raise BackendError(nv.NO_OUTPUT_LEN)
    _check_retention(get)
    _refuse_unsupported(get)
    stop_words = parse_word_list(get("stop_words_list"))
    bad_words = parse_word_list(get("bad_words_list"))
    if ids.ndim > 1 and ids.shape[0] != 1:
        raise RequestError(f"this engine takes one sequence per request, got a batch of {ids.shape[0]}")
    # With one sequence per request NVIDIA's backend takes the whole input_ids row: input_lengths
    # is required by Triton and never read.
    input_ids = ids.reshape(-1).tolist()
    length = get("input_lengths")
    if (
        contract_check()
        and length is not None
        and length.size
        and int(length.reshape(-1)[0]) != len(input_ids)
    ):
        raise RequestError(
            f"input_lengths {int(length.reshape(-1)[0])} != the {len(input_ids)} input_ids: NVIDIA's backend "
            "ignores input_lengths for one sequence and would take all of them"
        )
    if not input_ids:
        raise BackendError(nv.EMPTY_INPUT)
    if int(max_new) <= 0:
        raise BackendError(nv.NO_NEW_TOKENS)
    max_new = int(max_new)
    beam_width = int(scalar(get, "beam_width"))
    if beam_width <= 0:
        raise BackendError(nv.BAD_BEAM_WIDTH)
    guide = parse_guide(get)
    if guide is not None and beam_width > 1:
        raise BackendError(nv.GUIDE_WITH_BEAMS)
    num_return = int(scalar(get, "num_return_sequences"))
    if num_return < 1:
        raise RequestError(f"num_return_sequences must be >= 1, got {num_return}")
    if beam_width > 1:
        # Ours: NVIDIA's backend does not compare beam_width with max_beam_width (its executor holds
        # a request of another width in its queue); the stand-in refuses what the engine lacks.
        if beam_width > limits.max_beam_width:
            raise RequestError(
                f"beam_width {beam_width} exceeds the engine's max_beam_width {limits.max_beam_width}"
            )
        if streaming:
            raise RequestError("streaming beam search is not served by this engine: send streaming false")
        if num_return > beam_width:
            raise RequestError(f"num_return_sequences {num_return} exceeds beam_width {beam_width}")
    elif num_return != 1:
        raise RequestError("num_return_sequences > 1 without beam search: this engine samples one sequence")
    early = get("early_stopping")
    if early is not None and early.size and contract_check():
        raise RequestError(f"early_stopping would not arrive as sent: {nv.MISREAD_INPUTS['early_stopping']}")
    temperature = float(scalar(get, "temperature"))
    top_k = int(scalar(get, "runtime_top_k"))
    top_p = float(scalar(get, "runtime_top_p"))
    if top_k < 0:
        raise BackendError(nv.BAD_TOP_K)
    if top_p > 1:
        raise BackendError(nv.BAD_TOP_P)
    top_p = max(top_p, 0.0)  # as the backend: top_p <= 0 is unset
    if temperature < 0:
        raise RequestError(f"temperature must be >= 0, got {temperature}")

    # What the executor checks when it takes the request (its errors come as the final response).
    if len(input_ids) > limits.input_limit:
        raise BackendError(
            nv.PROMPT_TOO_LONG.format(length=len(input_ids), limit=limits.input_limit), executor=True
        )
    end_id = scalar(get, "end_id")
    end_id = -1 if end_id is None else int(end_id)
    if not -1 <= end_id < limits.vocab_size:
        raise BackendError(nv.END_ID_RANGE.format(end_id=end_id, vocab=limits.vocab_size), executor=True)
    if guide is not None and not limits.guided_decoding:
        raise BackendError(nv.NO_GUIDED_DECODER, executor=True)
    if len(input_ids) + max_new > limits.max_seq_len:
        if contract_check():  # NVIDIA's executor warns and shortens the answer, without a word to the client
            raise RequestError(
                f"prompt ({len(input_ids)} tokens) + request_output_len ({max_new}) exceeds max_seq_len "
                f"{limits.max_seq_len}: NVIDIA's executor would cut request_output_len silently"
            )
        max_new = limits.max_seq_len - len(input_ids)
    if min(input_ids) < 0 or max(input_ids) >= limits.vocab_size:
        raise RequestError(f"input_ids contains an id outside the vocabulary [0, {limits.vocab_size})")

    seed = scalar(get, "seed")
    exclude = scalar(get, "exclude_input_in_output")
    bias = get("embedding_bias")
    embedding_bias = None
    if bias is not None and bias.size > 0:  # NVIDIA squeezes it to 1-D; an empty one is no bias
        if bias.size != limits.vocab_size:  # ours: NVIDIA's executor takes it as [vocab_size]
            raise RequestError(
                f"embedding_bias has {bias.size} values; the engine's vocabulary has {limits.vocab_size}"
            )
        embedding_bias = bias.reshape(-1).astype(np.float32)
        if not np.isfinite(embedding_bias).all():
            raise RequestError("embedding_bias must hold finite numbers")

    return_log_probs = bool(scalar(get, "return_log_probs"))
    return_context_logits = bool(scalar(get, "return_context_logits"))
    return_generation_logits = bool(scalar(get, "return_generation_logits"))
    return_perf_metrics = bool(scalar(get, "return_perf_metrics"))
    if return_context_logits and not limits.gather_context_logits:
        raise BackendError(nv.NO_CONTEXT_LOGITS, executor=True)
    asked = set(requested or OUTPUTS)
    for name in nv.REQUIRED_OUTPUTS:  # NVIDIA fails the request's first response without them
        if name not in asked:
            raise BackendError(nv.POPULATE_ERROR + nv.MISSING_OUTPUT.format(name=name))
    # As the C++ backend: token ids always, the rest only when the request enabled it.
    enabled = set(nv.REQUIRED_OUTPUTS)
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
    # NVIDIA's backend sends the perf outputs whether named or not; Triton hands a client only those
    # it asked for, so the stand-in makes only those: under load, pytriton's Python backend stub
    # (Triton 2.51) crashes on decoupled responses carrying outputs that were not requested.
    perf = frozenset(nv.PERF_OUTPUTS if return_perf_metrics else ()) & asked
    lora_task_id = scalar_lora_task(get)
    lora_weights, lora_config = get("lora_weights"), get("lora_config")
    has_weights = lora_weights is not None and lora_weights.size > 0
    if has_weights != (lora_config is not None and lora_config.size > 0):
        raise RequestError("lora_weights and lora_config go together")
    if has_weights and lora_task_id is None:
        raise RequestError("lora_weights need a lora_task_id (the id the engine caches them under)")
    request = EngineRequest(
        request_id=request_id,
        input_ids=input_ids,
        max_new=max_new,
        end_id=end_id,
        streaming=streaming,
        exclude_input=limits.exclude_input_default if exclude is None else bool(exclude),
        # TRT-LLM: top_k 0 and top_p 0 mean "unset"; with neither set it decodes greedily.
        greedy=temperature == 0.0 or top_k == 1 or (top_k == 0 and top_p == 0.0),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        repetition_penalty=float(scalar(get, "repetition_penalty")),
        presence_penalty=float(scalar(get, "presence_penalty")),
        frequency_penalty=float(scalar(get, "frequency_penalty")),
        min_tokens=int(scalar(get, "min_tokens")),
        seed=None if seed is None else int(seed),
        stop_words=stop_words,
        bad_words=bad_words,
        embedding_bias=embedding_bias,
        return_log_probs=return_log_probs,
        return_context_logits=return_context_logits,
        return_generation_logits=return_generation_logits,
        outputs=frozenset(enabled & asked) | perf,
        guide=guide,
        lora_task_id=lora_task_id,
        lora_weights=lora_weights if has_weights else None,
        lora_config=lora_config if has_weights else None,
        return_perf_metrics=return_perf_metrics,
        beam_width=beam_width,
        num_return=num_return if beam_width > 1 else 1,
        length_penalty=float(scalar(get, "len_penalty")),
        early_stopping=int(bool(early.reshape(-1)[0])) if early is not None and early.size else 1,
    )
    if beam_width > 1:
        _check_beam_request(request)
    return request


BEAM_UNSUPPORTED = (
    ("repetition_penalty", lambda r: r.repetition_penalty != 1.0),
    ("presence_penalty", lambda r: r.presence_penalty != 0.0),
    ("frequency_penalty", lambda r: r.frequency_penalty != 0.0),
    ("min_tokens", lambda r: r.min_tokens > 0),
    ("bad_words_list", lambda r: bool(r.bad_words)),
    ("return_generation_logits", lambda r: r.return_generation_logits),
)
"""What our engines do not combine with beam search (NVIDIA's does): refused, never ignored."""


def _check_beam_request(request: EngineRequest) -> None:
    for name, used in BEAM_UNSUPPORTED:
        if used(request):
            raise RequestError(f"{name} with beam search is not served by this engine")


def scalar_lora_task(get: GetInput) -> int | None:
    """lora_task_id, which must be one value when present (extractSingleton)."""
    task = get("lora_task_id")
    if task is None or task.size == 0:
        return None
    if task.size != 1:
        raise BackendError(nv.BAD_SINGLETON.format(name="lora_task_id"))
    return int(task.reshape(-1)[0])


@dataclass(slots=True)
class PerfMetrics:
    """What `return_perf_metrics` reports of one request (NVIDIA's names; times are ns since the epoch)."""

    arrival_time_ns: int = 0
    first_scheduled_time_ns: int = 0
    first_token_time_ns: int = 0
    last_token_time_ns: int = 0
    kv_cache_alloc_new_blocks: int = 0
    kv_cache_reused_blocks: int = 0
    kv_cache_alloc_total_blocks: int = 0
    # speculative decoding (the engine drafts with NGram): draft tokens proposed, of them accepted
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0
    acceptance_rate: float = 0.0  # accepted / proposed (0 when nothing was proposed)


_PERF_TYPES = {
    "arrival_time_ns": np.int64,
    "first_scheduled_time_ns": np.int64,
    "first_token_time_ns": np.int64,
    "last_token_time_ns": np.int64,
    "acceptance_rate": np.float32,
}


def beam_arrays(
    request: EngineRequest,
    beams: list[tuple[list[int], float, list[float]]],
    *,
    perf: PerfMetrics | None = None,
) -> dict[str, np.ndarray]:
    """The output tensors of a beam search's one (final) response: `beams` are (token ids, cumulative
    log prob, each token's log prob), best first. As NVIDIA's backend: output_ids [1, beams, longest]
    padded with -1, sequence_length [1, beams], cum_log_probs [1, beams], output_log_probs [1, beams,
    longest]."""
    wanted = request.outputs
    count = len(beams)
    longest = max((len(ids) for ids, _, _ in beams), default=0)
    out: dict[str, np.ndarray] = {}
    if "output_ids" in wanted:
        ids = np.full((1, count, longest), -1, dtype=np.int32)
        for i, (tokens, _, _) in enumerate(beams):
            ids[0, i, : len(tokens)] = tokens
        out["output_ids"] = ids
    if "sequence_length" in wanted:
        out["sequence_length"] = np.array([[len(tokens) for tokens, _, _ in beams]], dtype=np.int32)
    if "cum_log_probs" in wanted:
        out["cum_log_probs"] = np.array([[cum for _, cum, _ in beams]], dtype=np.float32)
    if "output_log_probs" in wanted:
        values = np.zeros((1, count, longest), dtype=np.float32)
        for i, (tokens, _, log_probs) in enumerate(beams):
            tail = log_probs[-len(tokens) :] if tokens else []
            values[0, i, len(tokens) - len(tail) : len(tokens)] = tail
        out["output_log_probs"] = values
    if "num_input_tokens" in wanted:
        out["num_input_tokens"] = np.array([[len(request.input_ids)]], dtype=np.int32)
    if "num_output_tokens" in wanted:
        out["num_output_tokens"] = np.array([[sum(len(tokens) for tokens, _, _ in beams)]], dtype=np.int32)
    _perf_arrays(request, perf, out)
    return out


def _perf_arrays(request: EngineRequest, perf: PerfMetrics | None, out: dict[str, np.ndarray]) -> None:
    if perf is not None and request.return_perf_metrics:
        values = {name: getattr(perf, name) for name in PerfMetrics.__slots__}
        for name in nv.PERF_OUTPUTS:
            if name in request.outputs:
                out[name] = np.array([[values[name]]], dtype=_PERF_TYPES.get(name, np.int32))


def response_arrays(
    request: EngineRequest,
    ids: list[int],
    *,
    cum_log_prob: float = 0.0,
    log_probs: list[float] | None = None,
    context_logits: np.ndarray | None = None,
    generation_logits: np.ndarray | None = None,
    logits_dtype: Any = np.float32,
    perf: PerfMetrics | None = None,
) -> dict[str, np.ndarray]:
    """The output tensors of one response (beam width 1): those the caller asked for and enabled.

    `ids` are the tokens this response carries (streaming: the new ones). As with the C++ backend,
    log probs, logits and token counts come only with the request's `return_*` flags set;
    `num_output_tokens` counts the tokens of this response (the prompt too when it is echoed), and
    the perf metrics come with the final response.
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
        out["context_logits"] = context.astype(logits_dtype, copy=False)
    if "generation_logits" in wanted:
        generation = (
            generation_logits[None, None]
            if generation_logits is not None
            else np.zeros((1, 1, 1, 1), np.float32)
        )
        out["generation_logits"] = generation.astype(logits_dtype, copy=False)
    if "num_input_tokens" in wanted:
        out["num_input_tokens"] = np.array([[len(request.input_ids)]], dtype=np.int32)
    if "num_output_tokens" in wanted:
        out["num_output_tokens"] = np.array([[count]], dtype=np.int32)
    _perf_arrays(request, perf, out)
    return out
