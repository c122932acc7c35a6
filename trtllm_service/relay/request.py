"""The request object, settled once, and THE table: each request field -> the Triton tensor it rides in.

Both HTTP APIs reduce a request to `SamplingParams` (what the caller asked for, `None` = not set).
`settle` then decides everything once, against the engine's limits: the token budget (an explicit
`max_tokens` that does not fit is an error; an unset one is what the context leaves, capped by a
default), OpenAI's sampling semantics in TensorRT-LLM's terms (temperature 0 = greedy = top_k 1;
sampling without top_k/top_p samples the whole distribution, top_p 1), the end ids. The result, a
`GenerationRequest`, is what the relay sends, field by field, through `ENGINE_INPUTS`: adding a
sampling parameter is one field here, one row in the table, the protocol field, and the Triton
configs. Stop strings are matched on text by the relay and never sent (a string has no unique
token sequence).
"""

from __future__ import annotations

import functools
import math
import struct
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from tensorrtllm_backend import nvidia_backend
from trtllm_service.errors import APIError
from trtllm_service.relay.protobuf_wire import length_field, varint

if TYPE_CHECKING:  # imported where used at run time
    import numpy as np

ServiceTier = Literal["priority", "default", "flex"]
"""The service's tiers, best first (OpenAI's names; Anthropic's tiers are all `default` here)."""
TIER_ORDER: Mapping[str, int] = {"priority": 0, "default": 1, "flex": 2}


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What a caller asked for, before any defaulting. `None` means "not set".

    Attributes:
        max_tokens: Most tokens to generate (None: what the context leaves, capped by a default).
        temperature: Softmax temperature; 0 means greedy. None: 1, as OpenAI.
        top_p: Nucleus sampling mass. top_k: Sample from the k most likely tokens.
        repetition_penalty: Multiplicative penalty on tokens seen (1.0 = off).
        presence_penalty, frequency_penalty: Additive penalties on generated tokens.
        seed: Random seed, for reproducible sampling.
        min_tokens: Fewest tokens to generate before an end token is allowed.
        stop: Stop strings, matched on the generated text.
        ignore_eos: Keep generating past end tokens (benchmarking).
        guide: What the answer must look like: (guided decoding type, its text), checked.
        logprobs: Return each token's log prob and its N most likely alternatives (None: off).
        lora: The LoRA adapter to apply (its name; None: the base model).
        logit_bias: Token id -> bias added to its logit at every step (OpenAI's logit_bias).
        stop_token_ids: Token ids that end the answer, besides the model's end ids (vLLM's).
        prompt_logprobs: Return each prompt token's log prob and its N most likely (None: off).
        beam_width: Beam search over this many beams (None or 1: no beam search).
        length_penalty, early_stopping: Beam search's length penalty and stopping rule.
        service_tier, priority: The request's place in the service's waiting queue: its tier, then
            its priority (vLLM's: lower first). No engine at 1.2.1 takes either (docs/api.md: Priority).
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    min_tokens: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    guide: tuple[str, str] | None = None
    logprobs: int | None = None
    lora: str | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    prompt_logprobs: int | None = None
    beam_width: int | None = None
    length_penalty: float | None = None
    early_stopping: bool | None = None
    service_tier: ServiceTier = "default"
    priority: int = 0

    @property
    def queue_rank(self) -> tuple[int, int]:
        """(tier, priority): lower waits less in the service's queue (then arrival decides)."""
        return TIER_ORDER[self.service_tier], self.priority


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What the packed engine accepts, and the ids that end a sequence."""

    max_seq_len: int
    max_input_len: int
    end_ids: tuple[int, ...] = ()  # the first is the engine's end id, the others are stop tokens
    vocab_size: int = 0  # the logits' width: what a logit bias is laid over (0: unknown)


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One engine request, settled: every field is what the engine gets (None = engine default)."""

    prompt_ids: Sequence[int]
    max_tokens: int
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_tokens: int | None = None
    seed: int | None = None
    end_id: int = -1
    stop_token_ids: tuple[int, ...] = ()
    guide_type: str | None = None
    guide: str | None = None
    logprobs: int | None = None  # N: each token's log prob and the N most likely (None: off)
    lora_name: str | None = None  # the LLM API flavour: the packed adapter, by name
    lora_id: int | None = None  # the LLM API flavour: a loaded adapter's id (the LLM caches it by it)
    lora_path: str | None = None  # and its PEFT files, which the LLM reads
    lora_task_id: int | None = None  # the C++ contract: the adapter's id in the engine's cache
    lora_weights: Any = None  # the adapter's weights and config: sent on its first use only
    lora_config: Any = None
    embedding_bias: Any = None  # logit_bias as the engine takes it: float32 [vocab_size] (numpy)
    prompt_logprobs: int | None = None  # N: each prompt token's log prob and the N most likely
    beam_width: int | None = None  # > 1: beam search (None: one sequence)
    num_return: int | None = None  # beam search: the best beams returned (the request's n)
    length_penalty: float | None = None  # beam search
    early_stopping: int | None = None  # beam search: 1 / 0 / 2 (true / false / "never")
    stop: tuple[str, ...] = field(default=(), compare=False)  # matched on text, not sent
    cut_token_ids: tuple[int, ...] = field(default=(), compare=False)  # the caller's stop tokens: not shown
    prompt_only: bool = field(default=False, compare=False)  # max_tokens 0: the generated token is dropped
    request_id: str | None = field(default=None, compare=False)  # Triton's id (None: the relay's choice)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def return_log_probs(self) -> bool | None:
        return True if self.logprobs is not None else None

    @property
    def return_generation_logits(self) -> bool | None:
        """The C++ contract's way to the top log probs: the logits of each generated token."""
        return True if self.logprobs else None

    @property
    def return_context_logits(self) -> bool | None:
        """The C++ contract's way to prompt log probs: the logits of every prompt position."""
        return True if self.prompt_logprobs is not None else None

    @property
    def use_beam_search(self) -> bool | None:
        """The LLM API's switch for beam search (its best_of is the beam width)."""
        return True if self.beam_width else None


def settle(
    prompt_ids: Sequence[int],
    params: SamplingParams,
    limits: EngineLimits,
    *,
    default_max_tokens: int | None = None,
    param: str = "messages",
    budget_param: str | None = None,
) -> GenerationRequest:
    """The engine request for a tokenized prompt; raises APIError (400) when it cannot fit.

    `param` names the request field the prompt came from, and `budget_param` (default: the same)
    the field to blame when the prompt fits but the asked-for completion does not; the
    context_length_exceeded error names them.
    """
    prompt_tokens = len(prompt_ids)
    room = limits.max_seq_len - prompt_tokens
    asked = params.max_tokens
    if prompt_tokens > limits.max_input_len or room < 1:
        raise APIError.context_length_exceeded(limits.max_seq_len, prompt_tokens, asked or 1, param=param)
    if asked is None:
        max_tokens = room if default_max_tokens is None else min(room, default_max_tokens)
    elif asked > room:
        raise APIError.context_length_exceeded(
            limits.max_seq_len, prompt_tokens, asked, param=budget_param or param
        )
    else:
        max_tokens = asked
    # max_tokens 0 (the prompt's log probs only): NVIDIA's executor refuses request_output_len 0
    # (mMaxNewTokens > 0), so the engine generates one token, which the relay drops.
    prompt_only = max_tokens == 0
    max_tokens = max(max_tokens, 1)
    temperature = 1.0 if params.temperature is None else params.temperature
    if temperature == 0.0:
        sampling: dict[str, object] = {"top_k": 1}
    else:
        top_k = params.top_k or None
        top_p = params.top_p if params.top_p is not None else (None if top_k else 1.0)
        sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": params.seed}
    end_ids = limits.end_ids
    model_stops = () if params.ignore_eos else tuple(end_ids[1:])
    cut = tuple(dict.fromkeys(i for i in params.stop_token_ids if i not in model_stops))
    beams = params.beam_width if params.beam_width and params.beam_width > 1 else None
    request = GenerationRequest(
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        repetition_penalty=params.repetition_penalty,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        min_tokens=params.min_tokens or None,
        end_id=-1 if params.ignore_eos or not end_ids else end_ids[0],
        stop_token_ids=model_stops + cut,
        cut_token_ids=cut,
        stop=params.stop,
        guide_type=params.guide[0] if params.guide else None,
        guide=params.guide[1] if params.guide else None,
        logprobs=params.logprobs,
        lora_name=params.lora,
        embedding_bias=_embedding_bias(params.logit_bias, limits.vocab_size),
        prompt_logprobs=params.prompt_logprobs,
        prompt_only=prompt_only,
        beam_width=beams,
        # beam search defaults to transformers' and vLLM's length penalty (the executor's is 0)
        length_penalty=(1.0 if params.length_penalty is None else params.length_penalty) if beams else None,
        early_stopping=_EARLY_STOPPING.get(str(params.early_stopping)) if beams else None,
        **sampling,  # type: ignore[arg-type]  # each value its field's type (a dict of mixed values)
    )
    _check_ranges(request)
    return request


_EARLY_STOPPING = {"True": 1, "False": 0, "never": 2}
"""early_stopping (transformers' and vLLM's true / false / "never") as TensorRT-LLM's integer."""


def _embedding_bias(logit_bias: Sequence[tuple[int, float]], vocab_size: int) -> Any:
    """OpenAI's logit_bias as the engines take it: a float32 vector over the vocabulary (None: none);
    a 400 naming `logit_bias` for an id outside the vocabulary or a bias that is not a finite number."""
    if not logit_bias:
        return None
    import numpy as np

    if vocab_size <= 0:
        raise APIError.bad_request(
            "logit_bias needs the model's vocabulary size, which is unknown", param="logit_bias"
        )
    bias = np.zeros(vocab_size, dtype=np.float32)
    for token, value in logit_bias:
        if not 0 <= token < vocab_size:
            raise APIError.bad_request(
                f"Invalid 'logit_bias': token id {token} is outside the vocabulary [0, {vocab_size})",
                param="logit_bias",
            )
        if not math.isfinite(value):
            raise APIError.bad_request(
                f"Invalid 'logit_bias': the bias of token {token} must be a finite number", param="logit_bias"
            )
        bias[token] = value
    return bias


def _check_ranges(request: GenerationRequest) -> None:
    """A 400 for a number the engine's tensor cannot carry (top_k 10**20, a penalty of 1e308),
    named by field; NaN never gets this far (the protocols' bounds refuse it)."""
    for (name, datatype, low, high), value in zip(_RANGED, _ranged_values(request), strict=True):
        if value is None or value.__class__ is bool or not isinstance(value, (int, float)):
            continue
        if not low <= value <= high:
            raise APIError.bad_request(
                f"Invalid '{name}': must be between {low:g} and {high:g} (got {value:g})"
                if datatype == "FP32"
                else f"Invalid '{name}': must be between {low} and {high} (got {value})",
                param=name,
            )


_FP32_MAX = 3.4028234663852886e38
_RANGES: dict[str, tuple[float, float]] = {
    "INT32": (-(1 << 31), (1 << 31) - 1),
    "UINT64": (0, (1 << 64) - 1),
    "FP32": (-_FP32_MAX, _FP32_MAX),
}


# ---- the wire ----------------------------------------------------------------------------------------
# The relay writes Triton's ModelInferRequest itself, field by field as protobuf would, in field
# order (tests/unit/relay/test_request.py checks the bytes against protobuf's own serializer): the
# message is the first-token path's largest piece of work, and protobuf's API makes eight calls per
# input where a number takes four here. The keys of grpc_service.proto's fields, all
# length-delimited (wire type 2), field numbers below 16:
_MODEL_NAME, _ID, _INPUTS, _OUTPUTS, _RAW_INPUT_CONTENTS = b"\x0a", b"\x1a", b"\x2a", b"\x32", b"\x3a"
_NAME, _DATATYPE, _SHAPE = b"\x0a", b"\x12", b"\x1a"  # InferInputTensor's (and the output's name)


def _named(name: str, datatype: str) -> bytes:
    """InferInputTensor's name and datatype."""
    return length_field(_NAME, name.encode()) + length_field(_DATATYPE, datatype.encode())


def _input_entry(named: bytes, shape: Sequence[int]) -> bytes:
    """An `inputs` entry: `_named`'s bytes, then the shape (packed int64; no dimension here is
    negative; proto3 leaves out an empty one)."""
    if shape:
        dims = bytes(shape) if max(shape) < 0x80 else b"".join(map(varint, shape))
        named += length_field(_SHAPE, dims)
    return length_field(_INPUTS, named)


# ---- the table -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A Triton input: its name and datatype, and how a value of the request becomes its bytes."""

    name: str
    datatype: str  # Triton's: INT32, FP32, UINT64, BOOL, BYTES
    batched: bool = True  # a leading batch dimension (models with max_batch_size > 0)
    # what `wire` reuses: the name and datatype's bytes; a number's whole entry and its contents' key
    # and packer
    _named: bytes = field(init=False, repr=False, compare=False)
    _scalar_entry: bytes = field(init=False, repr=False, compare=False)
    _scalar_key: bytes = field(init=False, repr=False, compare=False)
    _scalar_pack: Callable[[Any], bytes] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        named = _named(self.name, self.datatype)
        packer = _SCALAR_FORMATS.get(self.datatype)
        set_once = object.__setattr__  # frozen
        set_once(self, "_named", named)
        set_once(self, "_scalar_entry", _input_entry(named, [1, 1] if self.batched else [1]))
        set_once(self, "_scalar_key", _RAW_INPUT_CONTENTS + varint(packer.size if packer else 0))
        set_once(self, "_scalar_pack", packer.pack if packer else None)

    # `value`: the request's field, of the type the spec's subclass takes (here: str, bytes, a number
    # or a list of int)
    def datatype_of(self, value: Any) -> str:
        return self.datatype

    def encode(self, value: Any) -> tuple[list[int], bytes]:
        """(shape, raw little-endian contents) of `value`, with the leading batch dimension if batched."""
        kind = self.datatype
        lead = [1] if self.batched else []
        if kind == "BYTES":
            data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
            return [*lead, 1], struct.pack("<I", len(data)) + data
        if isinstance(value, (list, tuple, array)):
            return [*lead, len(value)], array("i", value).tobytes()
        return [*lead, 1], _SCALAR_FORMATS[kind].pack(value)

    def wire(self, value: Any) -> tuple[bytes, bytes]:
        """`value` as a serialized ModelInferRequest carries it: (its `inputs` entry, its
        `raw_input_contents` entry). A plain number takes the short way: its entry is the spec's
        own, its contents one `pack` (the first-token path sends several of them per request)."""
        pack = self._scalar_pack
        if pack is not None and value.__class__ in _NUMBERS:
            return self._scalar_entry, self._scalar_key + pack(value)
        shape, raw = self.encode(value)
        datatype = self.datatype_of(value)
        named = self._named if datatype == self.datatype else _named(self.name, datatype)
        return _input_entry(named, shape), length_field(_RAW_INPUT_CONTENTS, raw)


_SCALAR_FORMATS = {
    kind: struct.Struct(form)
    for kind, form in (("INT32", "<i"), ("FP32", "<f"), ("UINT64", "<Q"), ("BOOL", "<?"))
}
_NUMBERS = frozenset({int, float, bool})


def engine_input(name: str, kind: type[TensorSpec] = TensorSpec) -> TensorSpec:
    """An input of NVIDIA's `tensorrt_llm` model, typed as its contract declares it (KeyError for a
    name the backend does not have)."""
    return kind(name, nvidia_backend.tensor(name).wire_type)


class RawTensor(TensorSpec):
    """A whole array (numpy, already in its dtype and shape without the batch dimension)."""

    DATATYPES: ClassVar[dict[str, str]] = {
        "float32": "FP32",
        "float16": "FP16",
        "uint16": "BF16",
        "int32": "INT32",
    }

    def datatype_of(self, value: np.ndarray) -> str:
        return self.DATATYPES[str(value.dtype)]

    def encode(self, value: np.ndarray) -> tuple[list[int], bytes]:
        shape = list(value.shape)
        return [1, *shape] if self.batched else shape, value.tobytes()


class WordList(TensorSpec):
    """TRT-LLM's word-list layout [1, 2, N]: flat token ids, then cumulative end offsets (-1 padded)."""

    def encode(self, value: Sequence[int | Sequence[int]]) -> tuple[list[int], bytes]:
        words = [[token] if isinstance(token, int) else list(token) for token in value]
        flat = [token for word in words for token in word]
        offsets, end = [], 0
        for word in words:
            end += len(word)
            offsets.append(end)
        width = max(len(flat), 1)
        rows = (flat + [0] * (width - len(flat))) + (offsets + [-1] * (width - len(offsets)))
        return [1, 2, width], array("i", rows).tobytes()


ENGINE_INPUTS: Mapping[str, TensorSpec] = {
    "prompt_ids": engine_input("input_ids"),
    "max_tokens": engine_input("request_output_len"),
    "temperature": engine_input("temperature"),
    "top_k": engine_input("runtime_top_k"),
    "top_p": engine_input("runtime_top_p"),
    "repetition_penalty": engine_input("repetition_penalty"),
    "presence_penalty": engine_input("presence_penalty"),
    "frequency_penalty": engine_input("frequency_penalty"),
    "min_tokens": engine_input("min_tokens"),
    "seed": engine_input("seed"),
    "end_id": engine_input("end_id"),
    "stop_token_ids": engine_input("stop_words_list", WordList),
    "guide_type": engine_input("guided_decoding_guide_type"),
    "guide": engine_input("guided_decoding_guide"),
    "return_log_probs": engine_input("return_log_probs"),
    "return_generation_logits": engine_input("return_generation_logits"),
    "return_context_logits": engine_input("return_context_logits"),
    "embedding_bias": engine_input("embedding_bias", RawTensor),
    "beam_width": engine_input("beam_width"),
    "num_return": engine_input("num_return_sequences"),
    "length_penalty": engine_input("len_penalty"),
    # early_stopping is not sent: NVIDIA's backend misreads it (nvidia_backend.MISREAD_INPUTS);
    # the runtime refuses a request that sets it to anything but the executor's default.
    "lora_task_id": engine_input("lora_task_id"),
    "lora_weights": engine_input("lora_weights", RawTensor),  # FP32 / FP16 / BF16: as the array holds
    "lora_config": engine_input("lora_config", RawTensor),
}
"""GenerationRequest field -> input of the `tensorrt_llm` model (NVIDIA's C++ backend contract,
tensorrtllm_backend/nvidia_backend.py: names and types come from there)."""

_RANGED = tuple(
    (name, spec.datatype, *_RANGES[spec.datatype])
    for name, spec in ENGINE_INPUTS.items()
    if spec.datatype in _RANGES
)
"""(field, datatype, least, most) of each engine input whose datatype bounds its value (`_check_ranges`)."""
_ranged_values = attrgetter(*(name for name, *_ in _RANGED))

ENGINE_FIXED: Mapping[str, tuple[TensorSpec, object]] = {
    "streaming": (engine_input("streaming"), True),
    "exclude_input_in_output": (engine_input("exclude_input_in_output"), True),
    "return_perf_metrics": (engine_input("return_perf_metrics"), True),
}
"""Inputs every engine request carries: streamed (beam search excepted: see `unstreamed`), never the
prompt echoed back, and the perf metrics (the final response's kv_cache_reused_blocks: usage's
cached_tokens)."""

ENGINE_MODEL = "tensorrt_llm"
ENGINE_OUTPUT = "output_ids"
ENGINE_OUTPUTS = nvidia_backend.REQUIRED_OUTPUTS
"""What every engine request asks for: NVIDIA's backend fails a request that does not ask for both
output_ids and sequence_length."""
ENGINE_LOGPROB_OUTPUTS = ("output_log_probs",)
ENGINE_TOP_LOGPROB_OUTPUTS = ("generation_logits",)
ENGINE_PROMPT_LOGPROB_OUTPUTS = ("context_logits",)
ENGINE_CACHE_OUTPUT = "kv_cache_reused_blocks"
"""With return_perf_metrics, on the final response: KV cache blocks the prompt found cached."""
assert ENGINE_OUTPUT in ENGINE_OUTPUTS
assert all(
    nvidia_backend.output(name)
    for name in (*ENGINE_LOGPROB_OUTPUTS, *ENGINE_TOP_LOGPROB_OUTPUTS, *ENGINE_PROMPT_LOGPROB_OUTPUTS)
)
assert ENGINE_CACHE_OUTPUT in nvidia_backend.PERF_OUTPUTS


def _llmapi(name: str, datatype: str) -> TensorSpec:
    return TensorSpec(name, datatype, batched=False)  # the llmapi model has max_batch_size 0


LLMAPI_INPUTS: Mapping[str, TensorSpec] = {
    "prompt_ids": _llmapi("input_ids", "INT32"),
    "max_tokens": _llmapi("sampling_param_max_tokens", "INT32"),
    "temperature": _llmapi("sampling_param_temperature", "FP32"),
    "top_k": _llmapi("sampling_param_top_k", "INT32"),
    "top_p": _llmapi("sampling_param_top_p", "FP32"),
    "repetition_penalty": _llmapi("sampling_param_repetition_penalty", "FP32"),
    "presence_penalty": _llmapi("sampling_param_presence_penalty", "FP32"),
    "frequency_penalty": _llmapi("sampling_param_frequency_penalty", "FP32"),
    "min_tokens": _llmapi("sampling_param_min_tokens", "INT32"),
    "seed": _llmapi("sampling_param_seed", "UINT64"),
    "end_id": _llmapi("sampling_param_end_id", "INT32"),
    "stop_token_ids": _llmapi("sampling_param_stop_token_ids", "INT32"),
    "guide_type": _llmapi("guided_decoding_guide_type", "BYTES"),
    "guide": _llmapi("guided_decoding_guide", "BYTES"),
    "logprobs": _llmapi("sampling_param_logprobs", "INT32"),
    "lora_name": _llmapi("lora_name", "BYTES"),
    "lora_id": _llmapi("lora_id", "UINT64"),
    "lora_path": _llmapi("lora_path", "BYTES"),
    "embedding_bias": RawTensor("sampling_param_embedding_bias", "FP32", batched=False),
    "prompt_logprobs": _llmapi("sampling_param_prompt_logprobs", "INT32"),
    "use_beam_search": _llmapi("sampling_param_use_beam_search", "BOOL"),
    "beam_width": _llmapi("sampling_param_best_of", "INT32"),
    "num_return": _llmapi("sampling_param_n", "INT32"),
    "length_penalty": _llmapi("sampling_param_length_penalty", "FP32"),
    "early_stopping": _llmapi("sampling_param_early_stopping", "INT32"),
}
"""GenerationRequest field -> input of the LLM API flavour's `tensorrt_llm` model (upstream's
`sampling_param_*` names; input_ids, end_id, stop_token_ids, min_tokens, repetition_penalty,
embedding_bias, prompt_logprobs, use_beam_search, n, length_penalty, early_stopping are ours)."""

LLMAPI_FIXED: Mapping[str, tuple[TensorSpec, object]] = {
    "streaming": (_llmapi("streaming", "BOOL"), True),
    "return_num_output_tokens": (_llmapi("return_num_output_tokens", "BOOL"), True),
    "return_perf_metrics": (_llmapi("sampling_param_return_perf_metrics", "BOOL"), True),
}
"""Inputs every LLM API request carries: streamed (beam search excepted), with the running token
count (for usage) and the perf metrics (kv_cache_reused_block: usage's cached_tokens)."""

LLMAPI_TEXT_OUTPUT, LLMAPI_COUNT_OUTPUT = "text_output", "num_output_tokens"
"""The LLM API flavour's text delta (one BYTES element) and the tokens generated so far (INT32)."""
LLMAPI_OUTPUTS = (LLMAPI_TEXT_OUTPUT, LLMAPI_COUNT_OUTPUT, "kv_cache_reused_block")
LLMAPI_LOGPROB_OUTPUTS = ("output_ids", "output_log_probs")
LLMAPI_TOP_LOGPROB_OUTPUTS = ("top_log_prob_ids", "top_log_probs")
LLMAPI_PROMPT_LOGPROB_OUTPUTS = ("prompt_log_probs", "prompt_top_log_prob_ids", "prompt_top_log_probs")

_FIELDS = (
    *(f.name for f in fields(GenerationRequest)),
    "return_log_probs",
    "return_generation_logits",
    "return_context_logits",
    "use_beam_search",
)
assert set(ENGINE_INPUTS) <= set(_FIELDS)
assert set(LLMAPI_INPUTS) <= set(_FIELDS)


def _message(
    model: str,
    request_id: str,
    request: GenerationRequest,
    table: Mapping[str, TensorSpec],
    fixed: Mapping[str, tuple[TensorSpec, object]],
    outputs: Sequence[str],
    extra: Sequence[tuple[TensorSpec, object]] = (),
) -> bytes:
    """The serialized ModelInferRequest: `extra`, the table's fields that are set, the fixed inputs."""
    entries = [_request_head(model)]
    if request_id:
        entries.append(length_field(_ID, request_id.encode()))
    contents = []
    for spec, value in extra:
        entry, raw = spec.wire(value)
        entries.append(entry)
        contents.append(raw)
    values = _VALUES.get(id(table))
    if values is None:  # the tables are module constants
        values = _VALUES[id(table)] = attrgetter(*table)
    for (name, spec), value in zip(table.items(), values(request), strict=True):
        if value is None or (name in _OMIT_WHEN_EMPTY and not value):
            continue
        entry, raw = spec.wire(value)
        entries.append(entry)
        contents.append(raw)
    # beam search is never streamed: its beams come in one final response
    entries += contents
    entries.append(_tail(fixed, outputs, streamed=not request.beam_width))
    return b"".join(entries)


_VALUES: dict[int, attrgetter[Any]] = {}  # id(table) -> its fields' getter, all in one call
_TAILS: dict[tuple[int, tuple[str, ...], bool], bytes] = {}


def _tail(fixed: Mapping[str, tuple[TensorSpec, object]], outputs: Sequence[str], *, streamed: bool) -> bytes:
    """The fixed inputs and the outputs asked for, serialized once per table, outputs and streaming.

    Serialized protobuf messages concatenate into their merge, whose repeated fields are each
    message's in turn: the inputs and their raw contents after the request's own stay paired.
    """
    key = (id(fixed), tuple(outputs), streamed)  # the fixed tables are module constants
    tail = _TAILS.get(key)
    if tail is None:
        wired = [
            spec.wire(value if streamed or name != "streaming" else False)
            for name, (spec, value) in fixed.items()
        ]
        requested = [length_field(_OUTPUTS, length_field(_NAME, output.encode())) for output in outputs]
        tail = _TAILS[key] = b"".join(
            [*(entry for entry, _ in wired), *requested, *(raw for _, raw in wired)]
        )
    return tail


@functools.cache
def _request_head(model: str) -> bytes:
    return length_field(_MODEL_NAME, model.encode())


_OMIT_WHEN_EMPTY = frozenset({"stop_token_ids", "prompt_ids"})
"""Fields sent only when non-empty (an empty prompt_ids: the prompt travels as text)."""


_ENGINE_PLAIN_OUTPUTS = (*ENGINE_OUTPUTS, ENGINE_CACHE_OUTPUT)


def engine_outputs(request: GenerationRequest) -> tuple[str, ...]:
    """The outputs to ask the `tensorrt_llm` model for: token ids and their count, the reused KV
    cache blocks, and what log probs need."""
    if request.logprobs is None and request.prompt_logprobs is None:
        return _ENGINE_PLAIN_OUTPUTS
    return (
        *_ENGINE_PLAIN_OUTPUTS,
        *(ENGINE_LOGPROB_OUTPUTS if request.logprobs is not None else ()),
        *(ENGINE_TOP_LOGPROB_OUTPUTS if request.logprobs else ()),
        *(ENGINE_PROMPT_LOGPROB_OUTPUTS if request.prompt_logprobs is not None else ()),
    )


def llmapi_outputs(request: GenerationRequest) -> tuple[str, ...]:
    """The outputs to ask the LLM API flavour's model for."""
    if request.logprobs is None and request.prompt_logprobs is None:
        return LLMAPI_OUTPUTS
    return (
        *LLMAPI_OUTPUTS,
        *(LLMAPI_LOGPROB_OUTPUTS if request.logprobs is not None else ()),
        *(LLMAPI_TOP_LOGPROB_OUTPUTS if request.logprobs else ()),
        *(LLMAPI_PROMPT_LOGPROB_OUTPUTS if request.prompt_logprobs is not None else ()),
    )


_INPUT_LENGTHS = engine_input("input_lengths")


def engine_message(request: GenerationRequest, request_id: str) -> bytes:
    """The serialized ModelInferRequest of `request` for the `tensorrt_llm` model."""
    lengths = (_INPUT_LENGTHS, len(request.prompt_ids))
    return _message(
        ENGINE_MODEL, request_id, request, ENGINE_INPUTS, ENGINE_FIXED, engine_outputs(request), (lengths,)
    )


def llmapi_message(request: GenerationRequest, request_id: str, prompt: str | None = None) -> bytes:
    """The serialized ModelInferRequest for the LLM API flavour's `tensorrt_llm` model.

    The prompt goes as token ids, or as `text_input` when `prompt` is given (then `prompt_ids` is
    left empty), as upstream's clients send it.
    """
    extra = () if prompt is None else ((_llmapi("text_input", "BYTES"), prompt),)
    outputs = llmapi_outputs(request)
    return _message(ENGINE_MODEL, request_id, request, LLMAPI_INPUTS, LLMAPI_FIXED, outputs, extra)
