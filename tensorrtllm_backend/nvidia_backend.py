"""NVIDIA's C++ TensorRT-LLM backend (the `tensorrt_llm` model of inflight_batcher_llm), written down once.

What its source at the pinned tag (pinned.py) declares and enforces: every input and output of
`triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt` with its type, dims and
requiredness, the parameters its model instance cannot load without, and the messages of the
refusals our stand-in must reproduce (triton_backend/inflight_batcher_llm/src/model_instance_state.cc,
utils.cc, utils.h). Our config.pbtxt is generated from these tables (`config_io`), the stand-in
parses requests with them (standin/contract.py) and the service names its tensors through `tensor()`, so
nothing else spells a tensor name.

Sources (NVIDIA/TensorRT-LLM; the v1.2.1 tag itself, 376f7e1b, is not in the index we can read,
so these are the stored versions on either side of it; the inputs, outputs and checks below are
identical in both):
  config.pbtxt               2a9abd95 (release/1.1 state) and 0c8de69a (after PR #10018, which
                             only uncomments the `enable_trt_overlap` parameter)
  model_instance_state.cc    c8c6df08 and 0c8de69a
  utils.cc                   c8c6df08; utils.h 89fd9b74
Against v0.19.0 (image 25.05): `min_length` is `min_tokens`, `random_seed` is `seed` (May 2025),
`return_num_input_tokens` / `return_num_output_tokens` and their outputs are new (PR #5445), the
logits outputs are `${logits_datatype}` (was TYPE_FP32).

Pure data and pure functions: imported by the service, by packing and, copied beside model.py, by
the stand-in in Triton's Python backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

TAG = "v1.2.1"


@dataclass(frozen=True, slots=True)
class Tensor:
    """One input or output of the `tensorrt_llm` model, as NVIDIA's config.pbtxt declares it.

    `datatype` is the config's (TYPE_INT32, ...), or a `${variable}` the template fills (TEMPLATED_TYPES).
    """

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = True
    reshape: bool = False  # reshape: { shape: [ ] }: a scalar [1] seen by the backend as []
    ragged: bool = False  # allow_ragged_batch: true

    @property
    def wire_type(self) -> str:
        """The datatype on the wire (gRPC/HTTP): INT32, FP32, BYTES, ... (templated: its default)."""
        config = TEMPLATED_TYPES.get(self.datatype.strip("${}"), self.datatype)
        return "BYTES" if config == "TYPE_STRING" else config.removeprefix("TYPE_")

    def config_line(self, output: bool = False) -> str:
        parts = [
            f'name: "{self.name}"',
            f"data_type: {self.datatype}",
            f"dims: [ {', '.join(map(str, self.dims))} ]",
        ]
        if self.reshape:
            parts.append("reshape: { shape: [ ] }")
        if self.optional and not output:
            parts.append("optional: true")
        if self.ragged:
            parts.append("allow_ragged_batch: true")
        return "{ " + " ".join(parts) + " }"


TEMPLATED_TYPES: dict[str, str] = {
    "logits_datatype": "TYPE_FP32",
    "encoder_input_features_data_type": "TYPE_FP16",
    "prompt_embedding_table_data_type": "TYPE_FP16",
}
"""Types the template leaves to fill, and the values NVIDIA's docs fill them with."""


def _scalar(name: str, datatype: str, *, optional: bool = True) -> Tensor:
    return Tensor(name, datatype, (1,), optional=optional, reshape=True)


def _ragged(name: str, datatype: str, dims: tuple[int, ...] = (-1,)) -> Tensor:
    return Tensor(name, datatype, dims, ragged=True)


INPUTS: tuple[Tensor, ...] = (
    _ragged("input_ids", "TYPE_INT32"),
    _ragged("encoder_input_features", "${encoder_input_features_data_type}", (-1, -1)),
    _scalar("encoder_output_lengths", "TYPE_INT32"),
    _scalar("input_lengths", "TYPE_INT32", optional=False),
    _scalar("request_output_len", "TYPE_INT32", optional=False),
    _scalar("num_return_sequences", "TYPE_INT32"),
    _ragged("draft_input_ids", "TYPE_INT32"),
    _ragged("decoder_input_ids", "TYPE_INT32"),
    _scalar("decoder_input_lengths", "TYPE_INT32"),
    _ragged("draft_logits", "${logits_datatype}", (-1, -1)),
    _scalar("draft_acceptance_threshold", "TYPE_FP32"),
    _scalar("end_id", "TYPE_INT32"),
    _scalar("pad_id", "TYPE_INT32"),
    _ragged("stop_words_list", "TYPE_INT32", (2, -1)),
    _ragged("bad_words_list", "TYPE_INT32", (2, -1)),
    _ragged("embedding_bias", "TYPE_FP32"),
    _scalar("beam_width", "TYPE_INT32"),
    _scalar("temperature", "TYPE_FP32"),
    _scalar("runtime_top_k", "TYPE_INT32"),
    _scalar("runtime_top_p", "TYPE_FP32"),
    _scalar("runtime_top_p_min", "TYPE_FP32"),
    _scalar("runtime_top_p_decay", "TYPE_FP32"),
    _scalar("runtime_top_p_reset_ids", "TYPE_INT32"),
    _scalar("len_penalty", "TYPE_FP32"),
    _scalar("early_stopping", "TYPE_BOOL"),
    _scalar("repetition_penalty", "TYPE_FP32"),
    _scalar("min_tokens", "TYPE_INT32"),
    _scalar("beam_search_diversity_rate", "TYPE_FP32"),
    _scalar("presence_penalty", "TYPE_FP32"),
    _scalar("frequency_penalty", "TYPE_FP32"),
    _scalar("seed", "TYPE_UINT64"),
    _scalar("return_log_probs", "TYPE_BOOL"),
    _scalar("return_context_logits", "TYPE_BOOL"),
    _scalar("return_generation_logits", "TYPE_BOOL"),
    _scalar("return_perf_metrics", "TYPE_BOOL"),
    _scalar("return_num_input_tokens", "TYPE_BOOL"),
    _scalar("return_num_output_tokens", "TYPE_BOOL"),
    _scalar("exclude_input_in_output", "TYPE_BOOL"),
    _scalar("stop", "TYPE_BOOL"),
    _scalar("streaming", "TYPE_BOOL"),
    _ragged("prompt_embedding_table", "${prompt_embedding_table_data_type}", (-1, -1)),
    _ragged("prompt_table_extra_ids", "TYPE_UINT64"),
    _scalar("prompt_vocab_size", "TYPE_INT32"),
    _ragged("cross_attention_mask", "TYPE_BOOL", (-1, -1)),
    Tensor("mrope_rotary_cos_sin", "TYPE_FP32", (-1,)),
    Tensor("mrope_position_deltas", "TYPE_INT64", (1,)),
    _scalar("lora_task_id", "TYPE_UINT64"),
    _ragged("lora_weights", "TYPE_FP16", (-1, -1)),
    _ragged("lora_config", "TYPE_INT32", (-1, 3)),
    _ragged("context_phase_params", "TYPE_UINT8"),
    _ragged("skip_cross_attn_blocks", "TYPE_BOOL", (1,)),
    _ragged("retention_token_range_starts", "TYPE_INT32"),
    _ragged("retention_token_range_ends", "TYPE_INT32"),
    _ragged("retention_token_range_priorities", "TYPE_INT32"),
    _ragged("retention_token_range_durations_ms", "TYPE_INT32"),
    _ragged("retention_decode_priority", "TYPE_INT32", (1,)),
    _ragged("retention_decode_duration_ms", "TYPE_INT32", (1,)),
    _ragged("guided_decoding_guide_type", "TYPE_STRING", (1,)),
    _ragged("guided_decoding_guide", "TYPE_STRING", (1,)),
    _ragged("lookahead_window_size", "TYPE_INT32", (1,)),
    _ragged("lookahead_ngram_size", "TYPE_INT32", (1,)),
    _ragged("lookahead_verification_set_size", "TYPE_INT32", (1,)),
)
"""config.pbtxt's inputs, in its order. Only input_lengths and request_output_len are required (by
Triton); input_ids is optional there and refused by the backend when absent."""

OUTPUTS: tuple[Tensor, ...] = (
    Tensor("output_ids", "TYPE_INT32", (-1, -1)),
    Tensor("sequence_length", "TYPE_INT32", (-1,)),
    Tensor("cum_log_probs", "TYPE_FP32", (-1,)),
    Tensor("output_log_probs", "TYPE_FP32", (-1, -1)),
    Tensor("context_logits", "${logits_datatype}", (-1, -1)),
    Tensor("generation_logits", "${logits_datatype}", (-1, -1, -1)),
    Tensor("batch_index", "TYPE_INT32", (1,)),
    Tensor("sequence_index", "TYPE_INT32", (1,)),
    Tensor("context_phase_params", "TYPE_UINT8", (-1,)),
    Tensor("kv_cache_alloc_new_blocks", "TYPE_INT32", (1,)),
    Tensor("kv_cache_reused_blocks", "TYPE_INT32", (1,)),
    Tensor("kv_cache_alloc_total_blocks", "TYPE_INT32", (1,)),
    Tensor("arrival_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("last_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("acceptance_rate", "TYPE_FP32", (1,)),
    Tensor("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("total_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("num_input_tokens", "TYPE_INT32", (1,)),
    Tensor("num_output_tokens", "TYPE_INT32", (1,)),
)
"""config.pbtxt's outputs. A response carries only those the request asked for (and enabled)."""

_INPUTS = {tensor.name: tensor for tensor in INPUTS}
_OUTPUTS = {tensor.name: tensor for tensor in OUTPUTS}

REQUIRED_OUTPUTS = ("output_ids", "sequence_length")
"""fillTritonResponse throws unless the request asked for both (it always fills them)."""

PERF_OUTPUTS = (
    "kv_cache_alloc_new_blocks",
    "kv_cache_reused_blocks",
    "kv_cache_alloc_total_blocks",
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
)
"""Sent with `return_perf_metrics`, whether asked for by name or not."""

IGNORED_INPUTS: dict[str, str] = {
    "runtime_top_p_min": "the backend looks for 'runtime_top_k_min' instead (utils.h topPMin), so this input "
    "is accepted and never read",
}
"""Inputs the config declares that the backend accepts and never honours."""

MISREAD_INPUTS: dict[str, str] = {
    "early_stopping": "config.pbtxt declares it TYPE_BOOL (one byte) and utils.cc reads it as int32_t, four "
    "bytes from a one-byte buffer: the value the executor gets is not the one sent",
}
"""Inputs the backend reads, but not as the config declares them: what arrives is not what was sent."""

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")
"""guided_decoding_guide_type values the backend maps; any other is ignored without a word."""

REQUIRED_PARAMETERS = (
    "gpt_model_type",
    "tokenizer_dir",
    "xgrammar_tokenizer_info_path",
    "guided_decoding_backend",
)
"""Parameters read without a fallback: the model fails to load when one is absent from config.pbtxt."""

GPT_MODEL_TYPES = ("V1", "v1", "inflight_batching", "inflight_fused_batching")
GUIDED_DECODING_BACKENDS = ("xgrammar",)

# The messages of its refusals (C++ source text; TLLM_THROW / TLLM_CHECK append " (file:line)" and a
# stack trace, so clients match on these as prefixes). Errors while a request is built or its
# response filled come back INTERNAL.
MISSING_PARAMETER = "Cannot find parameter with name: {name}"
BAD_MODEL_TYPE = "Invalid gpt_model_type. Must be v1/inflight_batching/inflight_fused_batching."
BAD_GUIDED_BACKEND = (
    "Guided decoding is currently supported with 'xgrammar' backend. Invalid guided_decoding_backend "
    "parameter provided."
)
STREAMING_NOT_DECOUPLED = "Streaming is only supported if model is deployed using decoupled mode."
BATCH_NOT_DECOUPLED = (
    "Batch size > 1 requires the tensorrt_llm backend to be using decoupled transaction policy"
)
NO_INPUT_IDS = "inputTokens or encoderInputFeatures tensor not provided"
NO_OUTPUT_LEN = "request_output_len is not present in the request"
BAD_SINGLETON = "Invalid size for tensor {name}"
STOP_WITHOUT_ID = "Trying to stop a request but request ID is not provided"
POPULATE_ERROR = "Error encountered while populating response: "
MISSING_OUTPUT = "{name} tensor must be present in list of output tensors"
EXECUTOR_ERROR = "Executor failed process requestId {id} due to the following error: "
FETCH_ERROR = "Encountered an error when fetching new request: "
ASSERTION = "[TensorRT-LLM][ERROR] Assertion failed: "
EMPTY_INPUT = ASSERTION + "!mInputTokenIds.empty()"
NO_NEW_TOKENS = ASSERTION + "mMaxNewTokens > 0"
BAD_TOP_K = ASSERTION + "topK.value() >= 0"
BAD_TOP_P = ASSERTION + "topP.value() <= 1.f"
BAD_BEAM_WIDTH = ASSERTION + "beamWidth > 0"
GUIDE_WITH_BEAMS = "Guided decoding does not support with beam search."
PROMPT_TOO_LONG = (
    "Prompt length ({length}) exceeds maximum input length ({limit}). Set log level to info and check "
    "TRTGptModel logs for how maximum input length is set"
)
END_ID_RANGE = ASSERTION + "EndId ({end_id}) is not within acceptable range [-1, {vocab})."
NO_GUIDED_DECODER = (
    ASSERTION + "Request is specified with GuidedDecodingParams, but GuidedDecoder is not setup. Please "
    "provide a valid GuidedDecodingConfig to setup GuidedDecoder."
)
NO_CONTEXT_LOGITS = ASSERTION + "Return context logit need to build engine with gather_context_logits"
NO_GENERATION_LOGITS = (
    ASSERTION + "To return generation logits, gather_generation_logits must be enabled in ExecutorConfig"
)
LORA_NOT_CACHED = "LoRA task {task} not found in cache. Please send LoRA weights with request"
"""Sent as EXECUTOR_ERROR + this (no FETCH_ERROR prefix: an expected LoRA exception)."""
SPARSE_LIST = "Sparse list must not have {problem}: "


def tensor(name: str) -> Tensor:
    """The input `name`; a name the backend does not declare is a KeyError saying so."""
    try:
        return _INPUTS[name]
    except KeyError:
        raise KeyError(f"{name!r} is not an input of NVIDIA's tensorrt_llm model at {TAG}") from None


def output(name: str) -> Tensor:
    """The output `name`; a name the backend does not declare is a KeyError saying so."""
    try:
        return _OUTPUTS[name]
    except KeyError:
        raise KeyError(f"{name!r} is not an output of NVIDIA's tensorrt_llm model at {TAG}") from None


TYPE_OVERRIDES: dict[str, str] = {"lora_weights": "${lora_weights_data_type}"}
"""Ours, not NVIDIA's: NVIDIA's file declares lora_weights TYPE_FP16, which a bfloat16 or float32
engine's adapter rows do not fit; upstream's docs have users edit the type, packing fills it."""


def config_io(extra_inputs: Sequence[str] = (), extra_outputs: Sequence[str] = ()) -> str:
    """The `input [...]` and `output [...]` blocks of config.pbtxt: NVIDIA's, with TYPE_OVERRIDES,
    and then `extra_*` (config lines of tensors that are not NVIDIA's: a stand-in's own)."""
    inputs = [replace(t, datatype=TYPE_OVERRIDES[t.name]) if t.name in TYPE_OVERRIDES else t for t in INPUTS]
    lines = ["input ["]
    lines += [f"  {line}," for line in [*(t.config_line() for t in inputs), *extra_inputs]]
    lines[-1] = lines[-1].rstrip(",")
    lines += ["]", "output ["]
    lines += [f"  {line}," for line in [*(t.config_line(output=True) for t in OUTPUTS), *extra_outputs]]
    lines[-1] = lines[-1].rstrip(",")
    lines.append("]")
    return "\n".join(lines)
