"""NVIDIA's LLM API at TensorRT-LLM 1.2.1 and its `llmapi` Triton model, written down once.

What the pinned tag (pinned.py) declares and enforces, for the LLM API flavour: the `tensorrt_llm.LLM`
arguments model.yaml may hold (`TorchLlmArgs`, strict pydantic models: an unknown key, top level or
nested, fails with "Extra inputs are not permitted"), how upstream's Triton model merges model.yaml
(`update_llm_args_with_extra_dict`), `SamplingParams` (a kw_only slots dataclass: an unknown keyword
is a TypeError) with its refusals, `GuidedDecodingParams`, the output objects (`CompletionOutput`,
`Logprob`), and the tensors of upstream's llmapi Triton model. Our config.pbtxt keeps every upstream
name and type (a unit test holds them together), the stand-in LLM API (standin/llm_standin.py) is built from
these tables and refuses with these messages, and packing's model.yaml is checked against them.

Sources (NVIDIA/TensorRT-LLM; no source file at the v1.2.1 tag, 376f7e1b, is in the index we can read,
so most facts come from stored versions on either side of it, and say so. The documentation NVIDIA
publishes for the tag is stored (gh-pages 58fb435e, 1.2.1/), and its _modules/ pages render the
tag's own source of tensorrt_llm/llmapi/llm_args.py, llm.py, sampling_params.py, executor/result.py
and executor/request.py: the first place to read a 1.2.1 fact):
  triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt   c8c6df08 (1.1/1.2 era; the 2026 version
      0a710573 adds image_url and lora_* inputs, after 1.2.1)
  triton_backend/all_models/llmapi/tensorrt_llm/1/model.py     b35ac1b6 (= 1.2.0rc2) and 044a90d2
      (main, 2026-02): the same model.yaml merge, MPI session and generate_async call in both
  tensorrt_llm/sampling_params.py                              b35ac1b6 (1.2.0rc2: the last stored
      version on the 1.2 line)
  tensorrt_llm/llmapi/llm_args.py                              6cbd8328 (main, 2025-10, before the
      release/1.2 split) and a main version of 2026-02/03 (stored as file 7019226376): a field in
      both is taken as 1.2.1's (`certain`); a field in one of them only is marked estimated.
      The tag itself, as NVIDIA's 1.2.1 documentation renders it (gh-pages 58fb435e,
      1.2.1/_modules/tensorrt_llm/llmapi/llm_args.html), for MoeConfig, AttentionDpConfig, the
      speculative configs (DecodingBaseConfig.from_dict's decoding types) and
      update_llm_args_with_extra_dict (kv_cache_config deep-merged, key by key, into the base)
  tensorrt_llm/lora_helper.py                                  LoraConfig: same fields in every version
  tensorrt_llm/executor/result.py                              CompletionOutput, Logprob (1.2.0rc era)

Differences from upstream's llmapi model, on purpose:
- Streaming: upstream 1.2.1 calls `generate_async(prompt, SamplingParams(...), streaming)`, which
  binds `streaming` to the third parameter, `lora_request` (fixed upstream by PR #14079, 2026-05,
  after 1.2.1): its engine never streams and a streamed request gets one final response. Ours passes
  `streaming=` by keyword, and the stand-in refuses anything but a LoRARequest in `lora_request`.
- `cumulative_logprob`: upstream declares it TYPE_FP32 and sends `str(value)` (BYTES; "None" when not
  computed). Ours sends FP32, NaN when the engine computed none.
- `text_output`: upstream sends the whole text so far on every streamed response; ours sends deltas
  that concatenate exactly to the whole text. Upstream's `exclude_input_from_output` defaults to
  false (the prompt is echoed); ours defaults to true and echoes the prompt text itself when asked.
- Unset `sampling_param_max_tokens` is what the context leaves (upstream: SamplingParams' 32);
  `sampling_param_stop` is decoded to strings (upstream passes the numpy array of bytes on).
- Log probs: the PyTorch backend computes them only for a truthy `logprobs`, so ours asks for at
  least 1 whenever log probs or cumulative_logprob are wanted and cuts the top list to what was asked.
- What upstream serves and ours does not (perf metric outputs, beam search / best_of > 1 on the
  stand-in engines) is refused with our INVALID_REQUEST marker, never ignored.
- model.yaml values `null` mean "the LLM API's default": those keys are left out before the merge
  (upstream would pass None, and `lora_config: null` would fail in `LoraConfig(**None)`).
- Multi-rank: NVIDIA's 2026 main (model.py 044a90d2, PR #11153, after the release/1.2 split) also
  deletes the inherited OMPI_*/PMIX_*/PMI_* job variables at import (OMPI_COMM_WORLD_*,
  OMPI_UNIVERSE_SIZE, PMIX_RANK/NAMESPACE/SERVER_*, PMI_RANK/SIZE/FD, OMPI_MCA_orte_*, ORTE_*) and
  defers the tensorrt_llm import (for multi-instance `gpu_device_ids`). No stored 1.2-line version
  has either (a cherry-pick into release/1.2.1 is unconfirmed but not seen), so neither do we: rank 0
  passes `MpiCommSession(comm=COMM_WORLD, n_workers=COMM_WORLD.Get_size())` as `_mpi_session`, the
  other ranks wait in `MPICommExecutor(COMM_WORLD)`.

Where TensorRT-LLM main (the 1.3 line, after 1.2.1) changes this model, so that moving to the first
image built on it is a small step (nothing here serves these today; the tensors above are 1.2.1's):
- New optional inputs (config.pbtxt 0a710573): `image_url` (TYPE_STRING [-1], one entry per image, an
  http(s) URL or a data: URI; NVIDIA/TensorRT-LLM#18381), read only when model.yaml's
  `triton_config.multimodal` is true (default false: images are ignored, text-only answers); and
  per-request LoRA by path: `lora_id` (TYPE_UINT64 [1]), `lora_name`, `lora_path`,
  `lora_ckpt_source` (TYPE_STRING [1]), the first three given together, the adapter read from
  `lora_path` on the server and cached by `lora_id`. Our `lora_name` extension (a packed adapter,
  alone) takes the same name with another meaning: on main the model must send `lora_id` and
  `lora_path` beside it (model.yaml's `triton_config.loras` holds both), or rename ours. Outputs
  are unchanged.
- model.py: the OMPI_*/PMIX_*/PMI_* clean-up and the deferred tensorrt_llm import (above), and
  `generate_async`'s `streaming` passed by keyword (PR #14079).
- The TensorRT-engine backend (the ensemble flavour, nvidia_backend.py) is gone from main (July
  2026): an image on the 1.3 line serves this model only (pinned.ENSEMBLE_LEGACY_WARNING).
Re-read llm_args.py and sampling_params.py at the new tag against the tables below: `certain` marks
the fields seen on both sides of 1.2.1, the others are the first to check.

Pure data and small functions: imported by the tests and, copied beside model.py, by the llmapi
model in Triton's Python backend.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TAG = "v1.2.1"

# ---- the llmapi Triton model's tensors (config.pbtxt c8c6df08) ------------------------------------------


@dataclass(frozen=True, slots=True)
class Tensor:
    """One input or output of upstream's llmapi `tensorrt_llm` model, as its config.pbtxt declares it."""

    name: str
    datatype: str  # config.pbtxt's: TYPE_STRING, TYPE_BOOL, ...
    dims: tuple[int, ...]
    optional: bool = True


INPUTS: tuple[Tensor, ...] = (
    Tensor("text_input", "TYPE_STRING", (-1,), optional=False),
    Tensor("streaming", "TYPE_BOOL", (1,)),
    Tensor("sampling_param_best_of", "TYPE_INT32", (1,)),
    Tensor("sampling_param_temperature", "TYPE_FP32", (1,)),
    Tensor("sampling_param_top_k", "TYPE_INT32", (1,)),
    Tensor("sampling_param_top_p", "TYPE_FP32", (1,)),
    Tensor("sampling_param_frequency_penalty", "TYPE_FP32", (1,)),
    Tensor("sampling_param_presence_penalty", "TYPE_FP32", (1,)),
    Tensor("sampling_param_max_tokens", "TYPE_INT32", (1,)),
    Tensor("sampling_param_stop", "TYPE_STRING", (-1,)),
    Tensor("sampling_param_seed", "TYPE_UINT64", (1,)),
    Tensor("sampling_param_exclude_input_from_output", "TYPE_BOOL", (1,)),
    Tensor("sampling_param_return_perf_metrics", "TYPE_BOOL", (1,)),
    Tensor("return_finish_reason", "TYPE_BOOL", (1,)),
    Tensor("return_stop_reason", "TYPE_BOOL", (1,)),
    Tensor("return_cumulative_logprob", "TYPE_BOOL", (1,)),
    Tensor("stop", "TYPE_BOOL", (1,)),
)
"""Upstream's inputs, in its order. `text_input` is required there; ours makes it optional (a prompt
may come as our `input_ids` instead)."""
# Inputs TensorRT-LLM main adds after 1.2.1 (config.pbtxt 0a710573; see the module docstring), in its
# order, all optional: image_url (TYPE_STRING [-1], after text_input; with triton_config.multimodal),
# then after `stop`: lora_id (TYPE_UINT64 [1]), lora_name, lora_path, lora_ckpt_source (TYPE_STRING [1]).
# Not served at 1.2.1: adding them here is the first step to the next image.

OUTPUTS: tuple[Tensor, ...] = (
    Tensor("text_output", "TYPE_STRING", (-1,)),
    Tensor("finish_reason", "TYPE_STRING", (-1,)),
    Tensor("stop_reason", "TYPE_STRING", (-1,)),
    Tensor("cumulative_logprob", "TYPE_FP32", (-1,)),
    Tensor("kv_cache_reused_block", "TYPE_INT32", (-1,)),
    Tensor("kv_cache_missed_block", "TYPE_INT32", (-1,)),
    Tensor("kv_cache_alloc_new_blocks", "TYPE_INT32", (-1,)),
    Tensor("kv_cache_alloc_total_blocks", "TYPE_INT32", (-1,)),
    Tensor("kv_cache_hit_rate", "TYPE_FP32", (-1,)),
    Tensor("arrival_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_scheduled_time_ns", "TYPE_INT64", (1,)),
    Tensor("first_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("last_token_time_ns", "TYPE_INT64", (1,)),
    Tensor("acceptance_rate", "TYPE_FP32", (1,)),
    Tensor("total_accepted_draft_tokens", "TYPE_INT32", (1,)),
    Tensor("total_draft_tokens", "TYPE_INT32", (1,)),
)
"""Upstream's outputs. It sends all but text_output as strings (np.object_) whatever their declared
type; the perf outputs only with `sampling_param_return_perf_metrics`, which our model refuses (it
has no perf metrics to return)."""

SAMPLING_INPUTS: dict[str, str] = {
    f"sampling_param_{name}": name
    for name in (
        "best_of",
        "temperature",
        "top_k",
        "top_p",
        "frequency_penalty",
        "presence_penalty",
        "max_tokens",
        "seed",
        "exclude_input_from_output",
        "return_perf_metrics",
    )
}
"""Upstream's helpers.py: input -> the SamplingParams keyword it fills (absent: left out), plus
`sampling_param_stop` -> `stop`."""

SAMPLING_INPUT_DEFAULTS: dict[str, object] = {
    "sampling_param_best_of": 1,
    "sampling_param_exclude_input_from_output": False,
    "sampling_param_return_perf_metrics": False,
}
"""What upstream's helpers send when these inputs are absent."""

OUTPUT_SWITCHES: dict[str, str] = {
    "return_finish_reason": "finish_reason",
    "return_stop_reason": "stop_reason",
    "return_cumulative_logprob": "cumulative_logprob",
}
"""Switch input -> the output it adds (text_output always comes)."""

# Messages of upstream's model (model.py / helpers.py); each error response carries
# GENERATE_ERROR + the exception's text (TritonError's default code), except the stop replies.
GENERATE_ERROR = "Error generating request: "
NOT_SCALAR = "Expected a scalar tensor for tensor {name}"
TEXT_INPUT_MISSING = "text_input is missing from the request"
TEXT_INPUT_NOT_1D = "The current implementation only supports text_input being a 1D tensor."
STREAMING_NOT_DECOUPLED = "Streaming is only supported in decoupled mode."
CANCELLED = "Request cancelled by client"  # TritonError.CANCELLED: a cancelled or stopped request
STOP_WITHOUT_ID = "A request id must be provided for request cancellation"
CANCELLATION_CHECK_PERIOD_MS = 100
"""triton_config.cancellation_check_period_ms when model.yaml leaves it out."""

# What the LLM API and the PyTorch executor raise at 1.2.1 (issue 34's reading of NVIDIA's source; the
# quotes come from stored versions near the tag, the variant named is the one more likely at 1.2.1).
# Upstream's model sends each as GENERATE_ERROR + the text, with TritonError's default code.
BEAM_WIDTH_NOT_MAX = "Request beam width {bw} is not equal to max_beam_width {mbw}. This is not supported!"
"""The executor's check of every request (`!=`: width-1 requests too when max_beam_width > 1): 1.2-era
ExecutorRequestQueue._validate_and_filter_requests asserts it (newer main: PyExecutor._validate_request
raises ValueError for that request only); the client sees a RequestError either way."""
BEAM_MULTIPLE_LOGPROBS = "Beam search does not support multiple logprobs"
"""TorchSampler._prepare_beam_search: beam search with SamplingParams.logprobs > 1 (newer main words it
"... returning multiple logprobs per request")."""
TOPK_OUT_OF_RANGE = "selected index k out of range"
"""torch.topk's RuntimeError when k exceeds the vocabulary: the only cap on `logprobs` /
`prompt_logprobs` in the PyTorch backend (TorchSampler and compute_logprobs take the top k of the
logits; no explicit limit in SamplingParams or LLM._check_arguments)."""
PROMPT_OVER_MAX_NUM_TOKENS = (
    "The sum of prompt length ({prompt_len}), query length ({query_len}) should not exceed "
    "max_num_tokens ({max_num_tokens})"
)
"""BaseLLM._check_arguments, PyTorch backend without enable_chunked_prefill (generate_async raises it
before submitting: ValueError in the 1.2-era llm.py, RequestError on newer main). The prompt length is
prompt_len / context_parallel_size, a float ("72417.0"); query length is 0 without query tokens."""
MAX_TOKENS_CLAMPED = (
    "User-specified `max_tokens` ({max_tokens}) is greater than deduced `default_max_tokens` "
    "({default_max_tokens}), using default_max_tokens instead."
)
"""BaseWorker._deduce_max_tokens: a warning, not an error. The PyTorch backend clamps max_tokens to
max_seq_len - prompt length (the TensorRT backend's max_seq_len refusal is not on this path)."""
NOTHING_SCHEDULABLE = "fail to schedule any pending request, probably run out of resource."
"""PyExecutor's assertion when requests wait and none fits the KV cache (nothing in flight): an
executor failure, not a request's. Requests that fit only later wait in the queue, with no error."""


def input_tensor(name: str) -> Tensor:
    """Upstream's input `name`; KeyError for a name it does not declare."""
    for tensor in INPUTS:
        if tensor.name == name:
            return tensor
    raise KeyError(f"{name!r} is not an input of NVIDIA's llmapi model at {TAG}")


# ---- tensorrt_llm.LLM arguments: TorchLlmArgs and the nested configs we fill ---------------------------


@dataclass(frozen=True, slots=True)
class Field:
    """One field of an LLM API pydantic model.

    `kind` is a small type vocabulary (see `_annotation`): int, float, bool, str, path, any, list[int],
    list[str], set[int], dict[str,str], dict[int,int], or `a|b|c` for a Literal; `optional` admits
    None; `nested` names the table of a nested strict model (NESTED; `speculative_config`'s is chosen
    by its decoding_type: SPECULATIVE_CONFIGS); `certain`: read at the tag itself or in both stored
    versions around it (else estimated); `aliases`: other names pydantic takes for it.
    """

    name: str
    kind: str
    default: Any = None
    optional: bool = True
    certain: bool = True
    nested: str | None = None
    ge: float | None = None
    le: float | None = None
    alias: str | None = None
    aliases: tuple[str, ...] = ()


def _f(name: str, kind: str, default: Any = None, **more: Any) -> Field:
    return Field(name, kind, default, **more)


KV_CACHE_CONFIG: tuple[Field, ...] = (
    _f("enable_block_reuse", "bool", True, optional=False),
    _f("max_tokens", "int"),
    _f("max_attention_window", "list[int]"),
    _f("sink_token_length", "int"),
    # 6cbd8328 checks 0..1 with its own message ("kv_cache_config.free_gpu_memory_fraction must be a
    # float between 0 and 1"), 2026 with ge/le; which wording 1.2.1 has is estimated.
    _f("free_gpu_memory_fraction", "float", 0.9, ge=0.0, le=1.0),
    _f("host_cache_size", "int"),
    _f("onboard_blocks", "bool", True, optional=False),
    _f("cross_kv_cache_fraction", "float"),
    _f("secondary_offload_min_priority", "int"),
    _f("event_buffer_max_size", "int", 0, optional=False),
    _f("attention_dp_events_gather_period_ms", "int", 5, optional=False),
    _f("enable_partial_reuse", "bool", True, optional=False),
    _f("copy_on_partial_reuse", "bool", True, optional=False),
    _f("use_uvm", "bool", False, optional=False),
    _f("max_gpu_total_bytes", "int", 0, optional=False, ge=0),
    _f("dtype", "str", "auto", optional=False),
    _f("mamba_ssm_cache_dtype", "auto|float16|bfloat16|float32", "auto", optional=False),
    _f("tokens_per_block", "int", 32, optional=False),
    _f("use_kv_cache_manager_v2", "bool", False, optional=False, certain=False),
    _f("max_util_for_resume", "float", 0.95, optional=False, certain=False),
)
"""KvCacheConfig (a StrictBaseModel: unknown keys refused)."""

LORA_CONFIG: tuple[Field, ...] = (
    _f("lora_dir", "list[str]", (), optional=False),
    _f("lora_ckpt_source", "hf|nemo", "hf", optional=False),
    _f("max_lora_rank", "int", 64, optional=False),
    _f("lora_target_modules", "list[str]", (), optional=False),
    _f("trtllm_modules_to_hf_modules", "dict[str,str]", (), optional=False),
    _f("max_loras", "int"),
    _f("max_cpu_loras", "int"),
    _f("swap_gate_up_proj_lora_b_weight", "bool", True, optional=False),
)
"""LoraConfig (tensorrt_llm.lora_helper). Its fields are the same in every stored version; its class
is not: a pydantic BaseModel (unknown keys IGNORED) in late 2025, a StrictBaseModel (refused) on 2026
main. Which one 1.2.1 ships is unconfirmed; we refuse unknown keys either way (a key that would be
ignored is a mistake in what we wrote)."""

CUDA_GRAPH_CONFIG: tuple[Field, ...] = (
    _f("batch_sizes", "list[int]"),
    _f("max_batch_size", "int", 0, optional=False, ge=0),
    _f("enable_padding", "bool", False, optional=False),
)
"""CudaGraphConfig (StrictBaseModel). Its validator derives max_batch_size from batch_sizes (they must
agree when both are given) or batch_sizes from max_batch_size (0: 128). `cuda_graph_config: null`
turns CUDA graphs off (NULL_IS_A_VALUE)."""

DYNAMIC_BATCH_CONFIG: tuple[Field, ...] = (
    # 2025-10 declares the three without defaults, 2026 with these: the defaults are estimated
    _f("enable_batch_size_tuning", "bool", True, optional=False),
    _f("enable_max_num_tokens_tuning", "bool", False, optional=False),
    _f("dynamic_batch_moving_average_window", "int", 128, optional=False),
)
"""DynamicBatchConfig (scheduler_config.dynamic_batch_config; the TensorRT backend's only, says 2026)."""

SCHEDULER_CONFIG: tuple[Field, ...] = (
    _f(
        "capacity_scheduler_policy",
        "MAX_UTILIZATION|GUARANTEED_NO_EVICT|STATIC_BATCH",
        "GUARANTEED_NO_EVICT",
        optional=False,
    ),
    _f("context_chunking_policy", "FIRST_COME_FIRST_SERVED|EQUAL_PROGRESS"),
    _f("dynamic_batch_config", "any", nested="dynamic_batch_config"),
    _f("waiting_queue_policy", "str", "FCFS", optional=False, certain=False),  # 2026 only
)
"""SchedulerConfig (StrictBaseModel mirroring the C++ class; the policies are StrEnums: their names)."""

ATTENTION_DP_CONFIG: tuple[Field, ...] = (
    _f("enable_balance", "bool", False, optional=False),
    _f("timeout_iters", "int", 50, optional=False),
    _f("batching_wait_iters", "int", 10, optional=False),
)
"""AttentionDpConfig (StrictBaseModel; read at the tag)."""

MOE_CONFIG: tuple[Field, ...] = (
    # 1.2.1's Literal, default CUTLASS (2026 main adds AUTO, its new default)
    _f("backend", "CUTLASS|CUTEDSL|WIDEEP|TRTLLM|DEEPGEMM|VANILLA|TRITON", "CUTLASS", optional=False),
    _f("max_num_tokens", "int"),
    _f("load_balancer", "any"),  # a MoeLoadBalancerConfig mapping or a YAML file's path
    _f("disable_finalize_fusion", "bool", False, optional=False),
    _f("use_low_precision_moe_combine", "bool", False, optional=False),
)
"""MoeConfig (StrictBaseModel; read at the tag)."""

# ---- speculative_config: DecodingBaseConfig.from_dict picks the class by decoding_type -------------------

SPECULATIVE = "speculative_config"

DECODING_BASE: tuple[Field, ...] = (
    _f("max_draft_len", "int"),
    _f("max_total_draft_tokens", "int"),
    # 1.2.1: speculative_model, validation_alias AliasChoices(speculative_model, speculative_model_dir)
    _f("speculative_model", "path", aliases=("speculative_model_dir",)),
    _f("max_concurrency", "int"),
    _f("draft_len_schedule", "dict[int,int]"),
    _f("load_format", "str"),
    _f("acceptance_window", "int", ge=0),
    _f("acceptance_length_threshold", "float", ge=0.0),
    _f("allow_advanced_sampling", "bool", False, optional=False),
)
"""DecodingBaseConfig's fields (StrictBaseModel), every decoding type's."""

NGRAM_DECODING_CONFIG: tuple[Field, ...] = (
    _f("max_matching_ngram_size", "int", 0, optional=False),
    _f("is_keep_all", "bool", True, optional=False),
    _f("is_use_oldest", "bool", True, optional=False),
    _f("is_public_pool", "bool", True, optional=False),
)
EAGLE_DECODING_CONFIG: tuple[Field, ...] = (
    _f("eagle_choices", "any"),  # list[list[int]], or its text ("[[0], [1]]")
    _f("greedy_sampling", "bool", True),
    _f("posterior_threshold", "float"),
    _f("use_dynamic_tree", "bool", False),
    _f("dynamic_tree_max_topK", "int"),
    _f("num_eagle_layers", "int"),
    _f("max_non_leaves_per_layer", "int"),
    _f("eagle3_one_model", "bool", True),
    _f("eagle3_layers_to_capture", "set[int]"),
    _f("eagle3_model_arch", "str", "llama3", optional=False),  # llama3 | mistral_large3
)
MTP_DECODING_CONFIG: tuple[Field, ...] = (
    _f("num_nextn_predict_layers", "int", 1, optional=False),
    _f("use_relaxed_acceptance_for_thinking", "bool", False, optional=False),
    _f("relaxed_topk", "int", 1, optional=False),
    _f("relaxed_delta", "float", 0.0, optional=False),
    _f("use_mtp_vanilla", "bool", False, optional=False),
    _f("mtp_eagle_one_model", "bool", True, optional=False),
    _f("num_nextn_predict_layers_from_model_config", "int", 1, optional=False),
    _f("begin_thinking_phase_token", "int", 128798, optional=False),
    _f("end_thinking_phase_token", "int", 128799, optional=False),
)

SPECULATIVE_CONFIGS: dict[str, tuple[str, tuple[Field, ...]]] = {
    "NGram": ("NGramDecodingConfig", NGRAM_DECODING_CONFIG),
    "Eagle": ("EagleDecodingConfig", EAGLE_DECODING_CONFIG),
    "MTP": ("MTPDecodingConfig", MTP_DECODING_CONFIG),
    "DraftTarget": ("DraftTargetDecodingConfig", ()),
    "AUTO": ("AutoDecodingConfig", ()),
}
"""speculative_config's `decoding_type` -> the class DecodingBaseConfig.from_dict builds (1.2.1's
spellings, read at the tag: `Eagle` serves EAGLE-3 drafts too, eagle3_one_model picks one or two
models; `Eagle3` and `Draft_Target` as decoding types are 2026 main's, after 1.2.1). from_dict pops
decoding_type and builds the class with the rest, so decoding_type is required ("Invalid decoding
type: None"). The instance keeps decoding_type as an attribute (upstream: a ClassVar)."""

SPECULATIVE_REFUSED: dict[str, str] = {
    "Medusa": "Medusa runs on the TensorRT engine backend only, not the PyTorch backend",
    "Lookahead": "Lookahead runs on the TensorRT engine backend only, not the PyTorch backend",
    "SaveState": "SaveState records hidden states for training drafters; it does not serve",
    "UserProvided": "UserProvided takes a Python drafter object, which a YAML file cannot hold",
}
"""1.2.1's other decoding types, which a packed llmapi model cannot use."""

SPECULATIVE_CHECKS: dict[str, str] = {
    "NGram": "max_draft_len > 0 and max_matching_ngram_size > 0 are required for NGram",
    "Eagle": "max_draft_len is required for Eagle",
    "DraftTarget": "max_draft_len > 0 is required for DraftTarget",
}
"""What 1.2.1 asserts of each decoding type (EagleDecodingConfig's validator: "max_draft_len is required
for Eagle"; TorchLlmArgs.validate_speculative_config asserts the NGram and DraftTarget conditions,
read in 2025-10's source); the draft model (speculative_model) is required for Eagle ("Draft model
must be provided for EAGLE") and DraftTarget ("Path to draft model must be specified.")."""

TORCH_LLM_ARGS: tuple[Field, ...] = (
    _f("model", "path", optional=False),
    _f("tokenizer", "any"),
    _f("tokenizer_mode", "auto|slow", "auto", optional=False),
    _f("custom_tokenizer", "str", certain=False),
    _f("skip_tokenizer_init", "bool", False, optional=False),
    _f("trust_remote_code", "bool", False, optional=False),
    _f("tensor_parallel_size", "int", 1, optional=False),
    _f("dtype", "str", "auto", optional=False),
    _f("revision", "str"),
    _f("tokenizer_revision", "str"),
    _f("model_kwargs", "any", certain=False),
    _f("pipeline_parallel_size", "int", 1, optional=False),
    _f("context_parallel_size", "int", 1, optional=False),
    _f("gpus_per_node", "int"),
    _f("moe_cluster_parallel_size", "int"),
    _f("moe_tensor_parallel_size", "int"),
    _f("moe_expert_parallel_size", "int"),
    _f("enable_attention_dp", "bool", False, optional=False),
    _f("enable_lm_head_tp_in_adp", "bool", False, optional=False),
    _f("pp_partition", "list[int]", certain=False),
    _f("cp_config", "any"),
    _f("load_format", "any", "auto", optional=False),
    _f("fail_fast_on_attention_window_too_large", "bool", False, optional=False, certain=False),
    _f("enable_lora", "bool", False, optional=False),
    _f("lora_config", "any", nested="lora_config"),
    _f("kv_cache_config", "any", optional=False, nested="kv_cache_config"),
    _f("enable_chunked_prefill", "bool", False, optional=False),
    _f("guided_decoding_backend", "xgrammar|llguidance"),
    _f("batched_logits_processor", "any"),
    _f("iter_stats_max_iterations", "int"),
    _f("request_stats_max_iterations", "int"),
    _f("peft_cache_config", "any"),
    _f("scheduler_config", "any", nested="scheduler_config"),
    _f("cache_transceiver_config", "any"),
    _f("sparse_attention_config", "any"),
    _f("speculative_config", "any", nested=SPECULATIVE),
    # 2025-10: None (BuildConfig then says 2048 / 1024 / 1); 2026: the numbers themselves.
    _f("max_batch_size", "int"),
    _f("max_input_len", "int"),
    _f("max_seq_len", "int"),
    _f("max_beam_width", "int"),
    _f("max_num_tokens", "int", 8192),
    _f("gather_generation_logits", "bool", False, optional=False),
    _f("num_postprocess_workers", "int", 0, optional=False),
    _f("postprocess_tokenizer_dir", "str"),
    _f("reasoning_parser", "str"),
    _f("decoding_config", "any"),
    _f("mpi_session", "any", alias="_mpi_session"),
    _f("otlp_traces_endpoint", "str", certain=False),
    # 2025-10: Optional[str], None -> "pytorch"; 2026: Literal["pytorch"]. Both take "pytorch".
    _f("backend", "str"),
    _f("return_perf_metrics", "bool", False, optional=False),
    _f("perf_metrics_max_requests", "int", 0, optional=False),
    _f("orchestrator_type", "rpc|ray"),
    _f("env_overrides", "dict[str,str]", certain=False),
    # TorchLlmArgs' own
    _f("garbage_collection_gen0_threshold", "int", 20000, optional=False),
    _f("cuda_graph_config", "any", nested="cuda_graph_config"),
    _f("attention_dp_config", "any", nested="attention_dp_config"),
    _f("disable_overlap_scheduler", "bool", False, optional=False),
    _f("moe_config", "any", nested="moe_config"),
    _f("nvfp4_gemm_config", "any", certain=False),
    _f("attn_backend", "str", "TRTLLM", optional=False),
    _f("sampler_type", "any", "auto", optional=False),
    _f("sampler_force_async_worker", "bool", False, optional=False, certain=False),
    _f("enable_iter_perf_stats", "bool", False, optional=False),
    _f("enable_iter_req_stats", "bool", False, optional=False),
    _f("print_iter_log", "bool", False, optional=False),
    _f("batch_wait_timeout_ms", "float", 0.0, optional=False),
    _f("batch_wait_timeout_iters", "int", 0, optional=False),
    _f("batch_wait_max_tokens_ratio", "float", 0.0, optional=False),
    _f("torch_compile_config", "any"),
    _f("enable_autotuner", "bool", True, optional=False),
    _f("enable_layerwise_nvtx_marker", "bool", False, optional=False),
    _f("enable_min_latency", "bool", False, optional=False),
    _f("stream_interval", "int", 1, optional=False),
    _f("force_dynamic_quantization", "bool", False, optional=False),
    _f("allreduce_strategy", "any", "AUTO"),
    _f("checkpoint_loader", "any"),
    _f("checkpoint_format", "str"),
    _f("kv_connector_config", "any"),
    _f("mm_encoder_only", "bool", False, optional=False),
    _f("ray_worker_extension_cls", "str"),
    _f("ray_placement_config", "any", certain=False),
    _f("enable_sleep", "bool", False, optional=False, certain=False),
    _f("use_cute_dsl_blockscaling_mm", "bool", False, optional=False, certain=False),
    _f("use_cute_dsl_blockscaling_bmm", "bool", False, optional=False, certain=False),
    _f("disable_flashinfer_sampling", "bool", False, optional=False, certain=False),
    _f("max_stats_len", "int", 1000, optional=False, certain=False),
    _f("layer_wise_benchmarks_config", "any", certain=False),
)
"""TorchLlmArgs = BaseLlmArgs + the PyTorch backend's fields (`tensorrt_llm.LLM`'s arguments). The
nested configs users set most (kv_cache_config, lora_config, cuda_graph_config, scheduler_config,
attention_dp_config, moe_config, speculative_config) have their fields written down (NESTED), so a
wrong key inside them fails here as it fails in TensorRT-LLM; the others (cache_transceiver_config,
sparse_attention_config, torch_compile_config, ...) are typed `any`: a wrong key inside them is not
caught before the real image."""

NESTED: dict[str, tuple[str, tuple[Field, ...]]] = {
    "kv_cache_config": ("KvCacheConfig", KV_CACHE_CONFIG),
    "lora_config": ("LoraConfig", LORA_CONFIG),
    "cuda_graph_config": ("CudaGraphConfig", CUDA_GRAPH_CONFIG),
    "scheduler_config": ("SchedulerConfig", SCHEDULER_CONFIG),
    "dynamic_batch_config": ("DynamicBatchConfig", DYNAMIC_BATCH_CONFIG),
    "attention_dp_config": ("AttentionDpConfig", ATTENTION_DP_CONFIG),
    "moe_config": ("MoeConfig", MOE_CONFIG),
}

REFUSED_LLM_ARGS: dict[str, str] = {
    "build_config": "build_config is specific to TensorRT backend and cannot be used with PyTorch backend",
}
"""Keys TorchLlmArgs refuses with a message of its own. build_config: a deprecated field in 2025-10,
gone in 2026; a report from an installed 1.2.1 quotes this refusal (wording estimated). Other keys
`update_llm_args_with_extra_dict` maps but TorchLlmArgs lacks (quant_config, calib_config, ...: a
property or TrtLlmArgs' fields) fail as extra inputs."""

EXTRA_DICT_CLASSES: dict[str, str] = {
    "quant_config": "QuantConfig",
    "calib_config": "CalibConfig",
    "build_config": "BuildConfig",
    "decoding_config": "DecodingConfig",
    "enable_build_cache": "BuildCacheConfig",
    "speculative_config": "DecodingBaseConfig",
    "lora_config": "LoraConfig",
    "moe_config": "MoeConfig",
    "nvfp4_gemm_config": "Nvfp4GemmConfig",
    "attention_dp_config": "AttentionDpConfig",
    "sparse_attention_config": "BaseSparseAttentionConfig",
    "kv_cache_config": "KvCacheConfig",
}
"""`update_llm_args_with_extra_dict`'s key -> class table at 1.2.1 (read at the tag): each value given
is built with `Cls(**value)` (speculative_config and sparse_attention_config with `from_dict`), so a
non-mapping fails there; the merged dict then goes to `LLM(**args)`. Before that, a kv_cache_config
given in both is deep-merged: the base's keys, the extra dict's over them (KV_CACHE_DEEP_MERGE); every
other key is replaced whole (`llm_args | llm_args_dict`). It checks no keys itself: pydantic does,
in LLM()."""

KV_CACHE_DEEP_MERGE = True
"""1.2.1 merges kv_cache_config key by key (PR #9262, 2025-11, read at the tag): a YAML that sets
kv_cache_config.dtype keeps the base's free_gpu_memory_fraction. Upstream's Triton model merges into
an empty base, so there it changes nothing; pack_model.py --config merges into the base its flags
filled, as trtllm-serve merges --config into the one its flags built."""

UPDATE_LLM_ARGS = (
    ("tensorrt_llm.llmapi.llm_utils", "update_llm_args_with_extra_dict"),  # upstream model.py's import
    ("tensorrt_llm.llmapi.llm_args", "update_llm_args_with_extra_dict"),  # where it is defined
)
MPI_SESSION = ("tensorrt_llm.llmapi", "MpiCommSession")
LORA_REQUEST = (("tensorrt_llm.executor.request", "LoRARequest"), ("tensorrt_llm.executor", "LoRARequest"))
GUIDED_DECODING_PARAMS = ("tensorrt_llm.sampling_params", "GuidedDecodingParams")

EXTRA_FORBIDDEN = "Extra inputs are not permitted"


def fields_of(table: tuple[Field, ...]) -> dict[str, Field]:
    """Field by every name a mapping may give it (its own or alias, and its other aliases)."""
    out = {f.alias or f.name: f for f in table}
    out.update({alias: f for f in table for alias in f.aliases})
    return out


NULL_IS_A_VALUE = frozenset({"cuda_graph_config"})
"""LLM arguments whose `null` means something other than the default, kept in model.yaml's merge:
`cuda_graph_config` defaults to CudaGraphConfig() (TorchLlmArgs' default_factory), and None turns CUDA
graphs off (what beam search wants at 1.2: NVIDIA's sampling docs, 1.2.0rc6)."""


def drop_nulls(config: Mapping[str, Any], *, top: bool = True) -> dict[str, Any]:
    """model.yaml with its `null` values left out, nested mappings too (null = the LLM API's default),
    except the top-level keys of NULL_IS_A_VALUE."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if value is None:
            if top and key in NULL_IS_A_VALUE:
                out[key] = None
            continue
        out[key] = drop_nulls(value, top=False) if isinstance(value, Mapping) else value
    return out


def _annotation(field: Field) -> Any:
    from pathlib import Path
    from typing import Literal, Optional, Union

    simple: dict[str, Any] = {
        "int": int,
        "float": float,
        "bool": bool,
        "str": str,
        "path": Union[str, Path],  # noqa: UP007 (pydantic's own spelling of a union)
        "any": Any,
        "list[int]": list[int],
        "list[str]": list[str],
        "set[int]": set[int],
        "dict[str,str]": dict[str, str],
        "dict[int,int]": dict[int, int],
    }
    literal = Literal[tuple(field.kind.split("|"))]  # type: ignore[valid-type]  # its values known at run time only
    kind = simple.get(field.kind, literal)
    return Optional[kind] if field.optional and kind is not Any else kind  # noqa: UP045


def _speculative_check(decoding_type: str) -> Any:
    """The after-validator of one decoding type's model: 1.2.1's assertions (SPECULATIVE_CHECKS)."""
    from pydantic import model_validator

    def check(self: Any) -> Any:
        draft = self.max_draft_len
        if decoding_type == "NGram" and not (draft and draft > 0 and self.max_matching_ngram_size > 0):
            raise ValueError(SPECULATIVE_CHECKS["NGram"])
        if decoding_type == "Eagle" and draft is None:
            raise ValueError(SPECULATIVE_CHECKS["Eagle"])
        if decoding_type == "DraftTarget" and not (draft and draft > 0):
            raise ValueError(SPECULATIVE_CHECKS["DraftTarget"])
        if decoding_type in ("Eagle", "DraftTarget") and self.speculative_model is None:
            raise ValueError(
                "Draft model must be provided for EAGLE"
                if decoding_type == "Eagle"
                else "Path to draft model must be specified."
            )
        return self

    return model_validator(mode="after")(check)


@functools.lru_cache(maxsize=1)
def llm_args_model() -> Any:
    """TorchLlmArgs as a strict pydantic model built from these tables (its errors are pydantic's).
    speculative_config is a union of the decoding types' models told apart by `decoding_type`."""
    from typing import Annotated, Literal, Union

    from pydantic import AliasChoices, ConfigDict, create_model
    from pydantic import Field as PydanticField

    strict = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    def field_default(field: Field) -> Any:
        if field.default == ():  # an empty list or dict, made per instance
            return PydanticField(default_factory=dict if field.kind.startswith("dict") else list)
        return PydanticField(
            default=... if field.name == "model" else field.default,
            alias=field.alias,
            validation_alias=AliasChoices(field.name, *field.aliases) if field.aliases else None,
            ge=field.ge,
            le=field.le,
        )

    def speculative() -> Any:
        models = []
        for decoding_type, (name, table) in SPECULATIVE_CONFIGS.items():
            extra: dict[str, Any] = {"decoding_type": (Literal[decoding_type], ...)}
            validators = {}
            if decoding_type in SPECULATIVE_CHECKS or decoding_type == "Eagle":
                validators["check_" + decoding_type.lower()] = _speculative_check(decoding_type)
            models.append(build(name, DECODING_BASE + table, extra, validators))
        return Annotated[Union[tuple(models)], PydanticField(discriminator="decoding_type")]  # noqa: UP007

    def build(
        name: str,
        table: tuple[Field, ...],
        extra: dict[str, Any] | None = None,
        validators: dict[str, Any] | None = None,
    ) -> Any:
        fields: dict[str, Any] = dict(extra or {})
        for field in table:
            annotation = _annotation(field)
            if field.nested == SPECULATIVE:
                fields[field.name] = (speculative() | None, None)
                continue
            if field.nested is not None:
                nested_name, nested_table = NESTED[field.nested]
                model = build(nested_name, nested_table)
                annotation = model | None if field.optional else model
                default: Any = None if field.optional else PydanticField(default_factory=model)
            else:
                default = field_default(field)
            fields[field.name] = (annotation, default)
        return create_model(name, __config__=strict, __validators__=validators or None, **fields)

    return build("TorchLlmArgs", TORCH_LLM_ARGS)


def validate_llm_args(args: Mapping[str, Any]) -> Any:
    """The LLM arguments as TorchLlmArgs would validate them: the model instance, or pydantic's
    ValidationError (unknown key: "Extra inputs are not permitted", naming the key), or ValueError
    for a key TorchLlmArgs does not take at all (REFUSED_LLM_ARGS). Nested configs come back as
    pydantic objects with attributes, as TensorRT-LLM's do: `speculative_config` is the object of its
    decoding type (`.decoding_type`, `.max_draft_len`, `.max_matching_ngram_size`, ...), or None."""
    for key, message in REFUSED_LLM_ARGS.items():
        if key in args:
            raise ValueError(message)
    return llm_args_model()(**args)


def _nested_table(field: Field, value: Any) -> tuple[str, dict[str, Field]] | None:
    """The fields a mapping given for `field` may hold (and the class's name), if it is a mapping and
    its table is written down (for speculative_config: of a known decoding_type)."""
    if field.nested is None or not isinstance(value, Mapping):
        return None
    if field.nested == SPECULATIVE:
        kind = SPECULATIVE_CONFIGS.get(str(value.get("decoding_type")))
        if kind is None:
            return None
        return kind[0], {"decoding_type": _f("decoding_type", "str"), **fields_of(DECODING_BASE + kind[1])}
    name, table = NESTED[field.nested]
    return name, fields_of(table)


def _walk(config: Mapping[str, Any], table: dict[str, Field], prefix: str = "") -> Any:
    """(dotted key, the field or None, its table) for every key of `config`, nested ones too."""
    for key, value in config.items():
        field = table.get(str(key))
        yield f"{prefix}{key}", field, table
        nested = _nested_table(field, value) if field is not None else None
        if nested is not None:
            yield from _walk(value, nested[1], f"{prefix}{key}.")


def unknown_keys(config: Mapping[str, Any]) -> list[str]:
    """Keys of a model.yaml LLM-argument block (triton_config stripped) that 1.2.1 does not take for
    certain, dotted for nested ones: what a packer must never write."""
    return [
        key
        for key, field, _ in _walk(config, fields_of(TORCH_LLM_ARGS))
        if field is None or not field.certain or key in REFUSED_LLM_ARGS
    ]


def estimated_keys(config: Mapping[str, Any]) -> list[str]:
    """Keys of `config` that exist in only one of the stored versions around 1.2.1 (estimated)."""
    return [
        key
        for key, field, _ in _walk(config, fields_of(TORCH_LLM_ARGS))
        if field is not None and not field.certain
    ]


def key_errors(config: Mapping[str, Any]) -> list[str]:
    """What 1.2.1 refuses in the keys of LLM arguments `config`, one line each, dotted keys at any
    depth, with the nearest valid key (difflib) where one is near: an unknown or misspelt key, a
    missing or unknown speculative decoding_type, a key TorchLlmArgs refuses outright. Values are
    pydantic's to check (validate_llm_args; describe_validation_error)."""
    import difflib

    problems = []
    for key, field, table in _walk(config, fields_of(TORCH_LLM_ARGS)):
        if key in REFUSED_LLM_ARGS:
            problems.append(f"{key}: {REFUSED_LLM_ARGS[key]}")
            continue
        if field is None:
            prefix, _, name = key.rpartition(".")
            near = difflib.get_close_matches(name, list(table), n=1, cutoff=0.6)
            hint = f"; did you mean {prefix + '.' if prefix else ''}{near[0]}?" if near else ""
            problems.append(f"{key} is not an LLM API argument at TensorRT-LLM {TAG[1:]}{hint}")
            continue
        if field.nested == SPECULATIVE:
            problems += _decoding_type_errors(key, config, field)
    return problems


def _decoding_type_errors(key: str, config: Mapping[str, Any], field: Field) -> list[str]:
    import difflib

    value: Any = config
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if not isinstance(value, Mapping):
        return []
    kind = value.get("decoding_type")
    known = ", ".join(SPECULATIVE_CONFIGS)
    if kind is None:
        return [f"{key}.decoding_type is missing (one of {known}: DecodingBaseConfig.from_dict needs it)"]
    if str(kind) in SPECULATIVE_REFUSED:
        return [f"{key}.decoding_type {kind}: {SPECULATIVE_REFUSED[str(kind)]}"]
    if str(kind) not in SPECULATIVE_CONFIGS:
        near = difflib.get_close_matches(str(kind), list(SPECULATIVE_CONFIGS), n=1, cutoff=0.5)
        hint = f"; did you mean {near[0]}?" if near else ""
        return [
            f"{key}.decoding_type {kind} is not a decoding type of TensorRT-LLM {TAG[1:]} ({known}){hint}"
        ]
    return []


def describe_validation_error(error: Any) -> str:
    """One line for pydantic's ValidationError of validate_llm_args: its first error, the dotted key
    (without the decoding type a union adds), pydantic's message and the value given."""
    first = error.errors()[0]
    loc = [str(part) for part in first.get("loc", ())]
    if len(loc) > 1 and loc[0] == SPECULATIVE and loc[1] in SPECULATIVE_CONFIGS:
        del loc[1]
    where = ".".join(loc) or "the LLM arguments"
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    given = first.get("input")
    shown = "" if isinstance(given, Mapping) or given is None else f" (got {given!r})"
    more = len(error.errors()) - 1
    return f"{where}: {message}{shown}" + (f"; and {more} more" if more else "")


# ---- SamplingParams, GuidedDecodingParams (sampling_params.py b35ac1b6) ----------------------------------

SAMPLING_PARAMS: tuple[tuple[str, Any], ...] = (
    ("end_id", None),
    ("pad_id", None),
    ("max_tokens", 32),
    ("bad", None),
    ("bad_token_ids", None),
    ("stop", None),
    ("stop_token_ids", None),
    ("include_stop_str_in_output", False),
    ("embedding_bias", None),
    ("logits_processor", None),
    ("apply_batched_logits_processor", False),
    ("n", 1),
    ("best_of", None),
    ("use_beam_search", False),
    ("top_k", None),
    ("top_p", None),
    ("top_p_min", None),
    ("top_p_reset_ids", None),
    ("top_p_decay", None),
    ("seed", None),
    ("temperature", None),
    ("min_tokens", None),
    ("beam_search_diversity_rate", None),
    ("repetition_penalty", None),
    ("presence_penalty", None),
    ("frequency_penalty", None),
    ("prompt_ignore_length", None),
    ("length_penalty", None),
    ("early_stopping", None),
    ("no_repeat_ngram_size", None),
    ("min_p", None),
    ("beam_width_array", None),
    ("logprobs", None),
    ("prompt_logprobs", None),
    ("return_context_logits", False),
    ("return_generation_logits", False),
    ("exclude_input_from_output", True),
    ("return_encoder_output", False),
    ("return_perf_metrics", False),
    ("additional_model_outputs", None),
    ("lookahead_config", None),
    ("guided_decoding", None),
    ("ignore_eos", False),
    ("detokenize", True),
    ("add_special_tokens", True),
    ("truncate_prompt_tokens", None),
    ("skip_special_tokens", True),
    ("spaces_between_special_tokens", True),
)
"""SamplingParams' public init fields and defaults, in order: `@dataclass(slots=True, kw_only=True)`,
so an unknown keyword is a TypeError (`__init__() got an unexpected keyword argument`) and a
positional one too. Estimated for 1.2.1: `logprobs_mode` (PR #9675, merged on main around the
release/1.2 split) may be there too, defaulting to raw log probs; the sampled token's entry and
logprobs=0 meaning "the sampled token only" are 2026 main's. At 1.2.0rc2 the PyTorch backend returns
log probs only when `bool(logprobs)`: logprobs=0 returns none."""

SAMPLING_DEFAULTS = dict(SAMPLING_PARAMS)

# SamplingParams._validate(), in its order (after __post_init__: pad_id = end_id, best_of = best_of or n)
BAD_TOP_P = "require 0 <= top_p <= 1, got top_p={value}"
BAD_TOP_K = "require top_k >= 0, got top_k={value}"
BAD_TEMPERATURE = "require temperature >= 0, got temperature={value}"
BEST_OF_BELOW_N = "best_of ({best_of}) cannot be less than n ({n})"
GREEDY_BEST_OF = (
    "Greedy decoding in the LLM API does not allow multiple returns. Please set to best_of=1, got "
    "best_of={best_of}. Please set to best_of=1 or set an environment variable "
    "TLLM_ALLOW_N_GREEDY_DECODING=1 to allow best_of > 1 under the greedy decoding."
)
ALLOW_N_GREEDY_ENV = "TLLM_ALLOW_N_GREEDY_DECODING"
BAD_TRUNCATE = "truncate_prompt_tokens must be >= 1, got {value}"


def greedy(temperature: float | None, top_p: float | None, top_k: int | None) -> bool:
    """SamplingParams.params_imply_greedy_decoding: how the LLM API tells greedy from sampling."""
    return (
        (temperature is None and top_p is None and top_k is None)
        or top_k == 1
        or top_p == 0.0
        or temperature == 0
    )


def sampling_errors(params: Any) -> str | None:
    """The first refusal of SamplingParams._validate() for `params` (any object with its fields)."""
    import os

    if params.top_p is not None and (params.top_p < 0 or params.top_p > 1):
        return BAD_TOP_P.format(value=params.top_p)
    if params.top_k is not None and params.top_k < 0:
        return BAD_TOP_K.format(value=params.top_k)
    if params.temperature is not None and params.temperature < 0:
        return BAD_TEMPERATURE.format(value=params.temperature)
    if params.best_of is not None and params.best_of < params.n:
        return BEST_OF_BELOW_N.format(best_of=params.best_of, n=params.n)
    if (
        params.best_of is not None
        and params.best_of > 1
        and not params.use_beam_search
        and greedy(params.temperature, params.top_p, params.top_k)
        and not os.environ.get(ALLOW_N_GREEDY_ENV)
    ):
        return GREEDY_BEST_OF.format(best_of=params.best_of)
    if params.truncate_prompt_tokens is not None and params.truncate_prompt_tokens < 1:
        return BAD_TRUNCATE.format(value=params.truncate_prompt_tokens)
    return None


GUIDED_DECODING_FIELDS: tuple[tuple[str, Any], ...] = (
    ("json", None),  # a JSON schema: str, dict or pydantic model
    ("regex", None),
    ("grammar", None),  # EBNF
    ("json_object", False),
    ("structural_tag", None),  # xgrammar only
)
"""GuidedDecodingParams (kw_only slots dataclass, unchanged since 0.21)."""
ONE_GUIDE = "Only one guide can be used for a request, but got {count}."

GUIDE_FIELDS: dict[str, str] = {
    "json": "json_object",
    "json_schema": "json",
    "regex": "regex",
    "ebnf_grammar": "grammar",
}
"""The C++ backend's guide types (our guided_decoding_guide_type input) -> the GuidedDecodingParams
field that carries the same guide (`json`: json_object=True, no text)."""

# ---- outputs (executor/result.py) ---------------------------------------------------------------------

COMPLETION_OUTPUT_FIELDS: tuple[str, ...] = (
    "index",
    "text",
    "token_ids",
    "cumulative_logprob",
    "logprobs",
    "prompt_logprobs",
    "finish_reason",
    "stop_reason",
    "generation_logits",
    "disaggregated_params",
    "request_perf_metrics",
)
"""CompletionOutput's fields we model (1.2 also has additional_context_outputs /
additional_generation_outputs). `text` and `token_ids` are cumulative; `logprobs` is
list[dict[token id, Logprob]], one dict per token of token_ids (streamed incrementally by the
PyTorch backend from 1.2); `cumulative_logprob` is None unless log probs were computed. Properties:
length, text_diff, token_ids_diff, logprobs_diff."""

LOGPROB_FIELDS = ("logprob", "rank")
"""Logprob(logprob: float, rank: Optional[int] = None), a slots dataclass; rank 1 = most likely."""

FINISH_REASONS = ("stop", "length", "timeout", "cancelled")
"""CompletionOutput.finish_reason when finished. END_ID -> "stop" with stop_reason None;
STOP_WORDS -> "stop" with stop_reason = the stop string or token id, whose tokens are cut from
token_ids (unless include_stop_str_in_output)."""

REQUEST_OUTPUT_FIELDS = ("request_id", "prompt", "prompt_token_ids", "outputs", "context_logits", "finished")
"""RequestOutput (what generate_async returns: an async iterable of itself, one step per response;
`abort()` cancels the request, whose last response then says finish_reason "cancelled")."""

GENERATE_ASYNC_PARAMETERS = (
    "inputs",
    "sampling_params",
    "lora_request",
    "prompt_adapter_request",
    "streaming",
    "kv_cache_retention_config",
    "disaggregated_params",
    "_postproc_params",
    "scheduling_params",
    "cache_salt",
)
"""LLM.generate_async's parameters in order (1.x llm.py): the third positional one is lora_request."""

LORA_REQUEST_FIELDS = ("lora_name", "lora_int_id", "lora_path", "lora_ckpt_source")
"""LoRARequest(lora_name, lora_int_id, lora_path="", lora_ckpt_source="hf") (executor/request.py)."""
