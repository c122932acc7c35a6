"""NVIDIA's C++ backend contract at the pinned tag: what our configs declare, what the service sends,
and what our stand-in refuses, each as NVIDIA's source at v1.2.1 has it.

Each `test_finding_*` is one finding of the fidelity audit (issue 21): it fails on the code before it.
The expected names and messages here are transcribed from NVIDIA's source (see nvidia_backend.py for
paths and commits), not read from the module under test.
"""

from __future__ import annotations

from typing import Any

import contract as standin  # the stand-in's contract.py, as Triton imports it (pyproject's pythonpath)
import numpy as np
import pytest
import shared_contract
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2, service_pb2

from tensorrtllm_backend import nvidia_backend
from tensorrtllm_backend.repository import fill_model_config, repository_values
from trtllm_service.relay.request import ENGINE_INPUTS, GenerationRequest, engine_message

pytestmark = pytest.mark.unit


LIMITS = standin.EngineLimits(vocab_size=100, max_seq_len=64, guided_decoding=False)
BOTH = ("output_ids", "sequence_length")


def request(**inputs: Any) -> dict[str, np.ndarray]:
    """A request as the backend sees it: input_ids [1, N], scalars [1, 1]."""
    arrays = {"input_ids": np.array([[5, 6, 7]], np.int32), "input_lengths": np.array([[3]], np.int32)}
    arrays["request_output_len"] = np.array([[4]], np.int32)
    for name, value in inputs.items():
        arrays[name] = value if isinstance(value, np.ndarray) else np.array([[value]])
    if "input_lengths" not in inputs and "input_ids" in arrays:
        arrays["input_lengths"] = np.array([[arrays["input_ids"].shape[-1]]], np.int32)
    return arrays


def parse(arrays: dict[str, np.ndarray], requested: tuple[str, ...] = BOTH, limits: Any = LIMITS) -> Any:
    return standin.parse_request(arrays.get, "r1", limits, requested)


def refusal(arrays: dict[str, np.ndarray], requested: tuple[str, ...] = BOTH, limits: Any = LIMITS) -> str:
    with pytest.raises(standin.BackendError) as caught:
        parse(arrays, requested, limits)
    return caught.value.message(7)


def engine_config(**overrides: str) -> model_config_pb2.ModelConfig:
    values = repository_values(engine_dir="/tmp/e", tokenizer_dir="/tmp/t", overrides=overrides)
    return text_format.Parse(fill_model_config("tensorrt_llm", values), model_config_pb2.ModelConfig())


# ---- findings -------------------------------------------------------------------------------------------


def test_finding_nvidia_refuses_a_request_that_does_not_ask_for_sequence_length() -> None:
    """model_instance_state.cc fillTritonResponse: output_ids and sequence_length must both be asked for."""
    message = refusal(request(), requested=("output_ids",))
    assert message.startswith(
        "Error encountered while populating response: sequence_length tensor must be present in list of "
        "output tensors"
    )
    message = refusal(request(), requested=("sequence_length",))
    assert "output_ids tensor must be present in list of output tensors" in message
    assert parse(request()).outputs == frozenset(BOTH)


def test_finding_the_service_asks_for_output_ids_and_sequence_length() -> None:
    for logprobs in (None, 0, 3):
        sent = GenerationRequest(prompt_ids=[1, 2], max_tokens=3, logprobs=logprobs)
        message = service_pb2.ModelInferRequest.FromString(engine_message(sent, "x"))
        asked = [o.name for o in message.outputs]
        assert {"output_ids", "sequence_length"} <= set(asked), asked


def test_finding_min_tokens_and_seed_carry_their_v1_2_names() -> None:
    """min_length -> min_tokens, random_seed -> seed (NVIDIA renamed them in May 2025); the old names
    are not inputs of the model any more, so Triton refuses them."""
    assert (ENGINE_INPUTS["min_tokens"].name, ENGINE_INPUTS["min_tokens"].datatype) == ("min_tokens", "INT32")
    assert (ENGINE_INPUTS["seed"].name, ENGINE_INPUTS["seed"].datatype) == ("seed", "UINT64")
    declared = {i.name for i in engine_config().input}
    assert {"min_tokens", "seed"} <= declared and not {"min_length", "random_seed"} & declared
    parsed = parse(request(min_tokens=np.array([[3]], np.int32), seed=np.array([[9]], np.uint64)))
    assert (parsed.min_tokens, parsed.seed) == (3, 9)


def test_finding_logits_follow_the_engine_logits_datatype() -> None:
    for dtype in ("TYPE_FP16", "TYPE_FP32"):
        outputs = {o.name: o for o in engine_config(logits_datatype=dtype).output}
        for name in ("context_logits", "generation_logits"):
            assert model_config_pb2.DataType.Name(outputs[name].data_type) == dtype
    standin_request = parse(request(return_generation_logits=True), requested=())  # () : Triton asks all
    arrays = standin.response_arrays(
        standin_request, [1], generation_logits=np.ones((1, 5)), logits_dtype=np.float16
    )
    assert arrays["generation_logits"].dtype == np.float16 and arrays["generation_logits"].shape == (
        1,
        1,
        1,
        5,
    )


def test_finding_num_tokens_exist_and_count_this_response() -> None:
    """return_num_input_tokens / return_num_output_tokens (PR #5445): num_output_tokens counts the
    tokens of the response it comes with."""
    declared = {o.name for o in engine_config().output}
    assert {"num_input_tokens", "num_output_tokens", "kv_cache_reused_blocks"} <= declared
    parsed = parse(request(return_num_input_tokens=True, return_num_output_tokens=True), requested=())
    arrays = standin.response_arrays(parsed, [11, 12])
    assert (int(arrays["num_input_tokens"][0, 0]), int(arrays["num_output_tokens"][0, 0])) == (3, 2)


# ---- the configs ----------------------------------------------------------------------------------------


def test_the_engine_config_declares_nvidias_inputs_and_outputs() -> None:
    config = engine_config(triton_backend="tensorrtllm")  # NVIDIA's C++ backend: its tensors, no more
    inputs = {i.name: i for i in config.input}
    assert len(inputs) == 62 and len(config.output) == 21
    # Our Python stand-in in the slot adds only its probe (the supervisor's), optional.
    ours = engine_config()
    assert {i.name for i in ours.input} - set(inputs) == {"probe"} and ours.input[-1].optional
    assert {o.name for o in ours.output} - {o.name for o in config.output} == {"probe_status"}
    assert {name for name, i in inputs.items() if not i.optional} == {"input_lengths", "request_output_len"}
    for name, dtype in {
        "input_ids": "TYPE_INT32",
        "embedding_bias": "TYPE_FP32",
        "lora_task_id": "TYPE_UINT64",
        "guided_decoding_guide": "TYPE_STRING",
        "return_perf_metrics": "TYPE_BOOL",
        "num_return_sequences": "TYPE_INT32",
        "retention_decode_duration_ms": "TYPE_INT32",
        "mrope_position_deltas": "TYPE_INT64",
    }.items():
        assert model_config_pb2.DataType.Name(inputs[name].data_type) == dtype, name
    assert list(inputs["lora_config"].dims) == [-1, 3]
    assert list(inputs["stop_words_list"].dims) == [2, -1]


def test_every_request_tensor_of_the_service_is_an_nvidia_input() -> None:
    for spec in ENGINE_INPUTS.values():
        assert nvidia_backend.tensor(spec.name)
    with pytest.raises(KeyError, match="not an input of NVIDIA"):
        nvidia_backend.tensor("min_length")


# ---- the stand-in refuses what NVIDIA refuses, with NVIDIA's words ----------------------------------------


def test_streaming_needs_decoupled_mode() -> None:
    limits = standin.EngineLimits(vocab_size=100, max_seq_len=64, streaming_allowed=False)
    assert refusal(request(streaming=True), limits=limits) == (
        "Streaming is only supported if model is deployed using decoupled mode."
    )


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        (
            {"request_output_len": np.array([[0]], np.int32)},
            "[TensorRT-LLM][ERROR] Assertion failed: mMaxNewTokens > 0",
        ),
        (
            {"input_ids": np.zeros((1, 0), np.int32)},
            "[TensorRT-LLM][ERROR] Assertion failed: !mInputTokenIds.empty()",
        ),
        (
            {"runtime_top_k": np.array([[-1]], np.int32)},
            "[TensorRT-LLM][ERROR] Assertion failed: topK.value() >= 0",
        ),
        (
            {"runtime_top_p": np.array([[1.5]], np.float32)},
            "[TensorRT-LLM][ERROR] Assertion failed: topP.value() <= 1.f",
        ),
        ({"beam_width": np.array([[0]], np.int32)}, "[TensorRT-LLM][ERROR] Assertion failed: beamWidth > 0"),
        ({"seed": np.array([[1, 2]], np.uint64)}, "Invalid size for tensor seed"),
    ],
)
def test_request_refusals(inputs: dict[str, np.ndarray], expected: str) -> None:
    assert refusal(request(**inputs)) == expected


def test_no_input_ids_and_no_output_len() -> None:
    arrays = request()
    del arrays["input_ids"]
    assert refusal(arrays) == "inputTokens or encoderInputFeatures tensor not provided"


def test_executor_refusals_come_as_the_final_response_error() -> None:
    guided = request(
        guided_decoding_guide_type=np.array([[b"json"]], np.object_),
        guided_decoding_guide=np.array([[b""]], np.object_),
    )
    assert refusal(guided) == (
        "Executor failed process requestId 7 due to the following error: Encountered an error when "
        "fetching new request: [TensorRT-LLM][ERROR] Assertion failed: Request is specified with "
        "GuidedDecodingParams, but GuidedDecoder is not setup. Please provide a valid GuidedDecodingConfig "
        "to setup GuidedDecoder."
    )
    configured = standin.EngineLimits(vocab_size=100, max_seq_len=64, guided_decoding=True)
    assert parse(guided, limits=configured).guide == ("json", "")
    too_long = request(input_ids=np.ones((1, 64), np.int32))
    assert refusal(too_long).endswith(
        "Prompt length (64) exceeds maximum input length (63). Set log level to info and check TRTGptModel "
        "logs for how maximum input length is set"
    )
    assert "EndId (100) is not within acceptable range [-1, 100)." in refusal(
        request(end_id=np.array([[100]], np.int32))
    )


def test_a_guide_with_beams_and_bad_word_lists() -> None:
    configured = standin.EngineLimits(vocab_size=100, max_seq_len=64, guided_decoding=True)
    beams = request(
        beam_width=np.array([[2]], np.int32),
        guided_decoding_guide_type=np.array([[b"regex"]], np.object_),
        guided_decoding_guide=np.array([[b"a+"]], np.object_),
    )
    assert refusal(beams, limits=configured) == "Guided decoding does not support with beam search."
    decreasing = np.array([[[5, 6, 7], [2, 1, -1]]], np.int32)
    assert "Sparse list must not have non-increasing offsets: " in refusal(
        request(stop_words_list=decreasing)
    )
    beyond = np.array([[[5, 6, 7], [2, 9, -1]]], np.int32)
    assert "Sparse list must not have out-of-bound offsets: " in refusal(request(stop_words_list=beyond))


def test_lookahead_and_retention_checks() -> None:
    assert "lookahead decoding configuration" in refusal(
        request(lookahead_window_size=np.array([[4]], np.int32))
    )
    starts = np.array([[0, 5]], np.int32)
    assert refusal(request(retention_token_range_starts=starts)) == (
        "retention_token_range_ends must be provided, and have the same length as retention_token_range_starts"
    )


def test_what_nvidia_serves_and_the_stand_in_cannot_is_refused_as_ours() -> None:
    with pytest.raises(shared_contract.RequestError, match="draft_input_ids is served by NVIDIA"):
        parse(request(draft_input_ids=np.array([[1, 2]], np.int32)))
    with pytest.raises(shared_contract.RequestError, match="num_return_sequences"):
        parse(request(num_return_sequences=np.array([[2]], np.int32)))


# ---- what NVIDIA ignores: ignored, and refused loudly under the contract check ----------------------------


@pytest.fixture
def contract_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(shared_contract.CONTRACT_CHECK_ENV, "1")


def test_ignored_inputs_pass_silently_as_on_nvidias_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(shared_contract.CONTRACT_CHECK_ENV, raising=False)
    parse(request(runtime_top_p_min=np.array([[0.1]], np.float32)))
    unknown_guide = request(guided_decoding_guide_type=np.array([[b"yaml"]], np.object_))
    assert parse(unknown_guide).guide is None
    short = request(input_lengths=np.array([[2]], np.int32))
    assert parse(short).input_ids == [5, 6, 7]  # one sequence: the whole row, input_lengths unread
    assert parse(request(request_output_len=np.array([[100]], np.int32))).max_new == 61  # clamped


@pytest.mark.usefixtures("contract_check")
def test_ignored_inputs_are_refused_loudly_under_the_contract_check() -> None:
    with pytest.raises(shared_contract.RequestError, match="runtime_top_k_min"):
        parse(request(runtime_top_p_min=np.array([[0.1]], np.float32)))
    with pytest.raises(shared_contract.RequestError, match="ignored by NVIDIA's backend"):
        parse(request(guided_decoding_guide_type=np.array([[b"yaml"]], np.object_)))
    with pytest.raises(shared_contract.RequestError, match="ignores input_lengths"):
        parse(request(input_lengths=np.array([[2]], np.int32)))
    with pytest.raises(shared_contract.RequestError, match="cut request_output_len silently"):
        parse(request(request_output_len=np.array([[100]], np.int32)))


def test_lora_cache_miss_is_nvidias_message() -> None:
    from tensorrtllm_backend.lora import LoraCache, LoraError

    with pytest.raises(LoraError) as caught:
        LoraCache(2).get(12)
    assert str(caught.value) == "LoRA task 12 not found in cache. Please send LoRA weights with request"


def test_perf_metrics_come_with_the_final_response() -> None:
    parsed = parse(request(return_perf_metrics=True), requested=())
    perf = standin.PerfMetrics(arrival_time_ns=1, first_token_time_ns=2, kv_cache_alloc_new_blocks=1)
    arrays = standin.response_arrays(parsed, [1, 2], perf=perf)
    assert int(arrays["kv_cache_reused_blocks"][0, 0]) == 0 and arrays["arrival_time_ns"].dtype == np.int64
    assert "kv_cache_reused_blocks" not in standin.response_arrays(parsed, [1])


def test_beams_logit_bias_context_logits_and_perf_outputs_as_the_contract_takes_them() -> None:
    """Beam search up to the engine's max_beam_width (never streamed here), NVIDIA's refusal of
    context logits an engine does not gather, a vocabulary-sized embedding_bias, early_stopping
    refused under the contract check (NVIDIA reads the BOOL as int32), and the perf outputs sent
    with return_perf_metrics whether asked for by name or not (as fillTritonResponse does)."""
    wide = standin.EngineLimits(vocab_size=100, max_seq_len=64, max_beam_width=4)
    beams = parse(
        request(beam_width=np.array([[4]], np.int32), num_return_sequences=np.array([[2]], np.int32)),
        limits=wide,
    )
    assert (beams.beam_width, beams.num_return, beams.length_penalty, beams.early_stopping) == (4, 2, 0.0, 1)
    for inputs, message in (
        ({"beam_width": np.array([[5]], np.int32)}, "exceeds the engine's max_beam_width 4"),
        ({"beam_width": np.array([[2]], np.int32), "streaming": np.array([[True]])}, "streaming beam search"),
        (
            {"beam_width": np.array([[2]], np.int32), "num_return_sequences": np.array([[3]], np.int32)},
            "exceeds beam_width 2",
        ),
        ({"num_return_sequences": np.array([[2]], np.int32)}, "without beam search"),
        (
            {"beam_width": np.array([[2]], np.int32), "repetition_penalty": np.array([[1.2]], np.float32)},
            "repetition_penalty with beam search",
        ),
        ({"early_stopping": np.array([[False]])}, "early_stopping would not arrive as sent"),
        ({"embedding_bias": np.zeros((1, 99), np.float32)}, "has 99 values; the engine's vocabulary has 100"),
    ):
        with pytest.raises(shared_contract.RequestError, match=message):
            parse(request(**inputs), limits=wide)
    bias = parse(request(embedding_bias=np.arange(100, dtype=np.float32).reshape(1, 100)))
    assert bias.embedding_bias.shape == (100,) and bias.embedding_bias[7] == 7.0
    blind = standin.EngineLimits(vocab_size=100, max_seq_len=64, gather_context_logits=False)
    assert refusal(request(return_context_logits=np.array([[True]])), limits=blind).endswith(
        "Assertion failed: Return context logit need to build engine with gather_context_logits"
    )
    # Every perf output when the caller names none (Triton then passes all), else the named ones:
    # Triton would drop the others before the client, and pytriton's stub crashes on them under load.
    perf = parse(request(return_perf_metrics=np.array([[True]])), requested=())
    assert set(nvidia_backend.PERF_OUTPUTS) <= perf.outputs
    named = parse(
        request(return_perf_metrics=np.array([[True]])), requested=(*BOTH, "kv_cache_reused_blocks")
    )
    assert named.outputs & set(nvidia_backend.PERF_OUTPUTS) == {"kv_cache_reused_blocks"}
    arrays = standin.beam_arrays(beams, [([1, 2, 3], -1.5, [-0.5] * 3), ([4], -2.0, [-2.0])])
    assert arrays["output_ids"].tolist() == [[[1, 2, 3], [4, -1, -1]]]
    assert arrays["sequence_length"].tolist() == [[3, 1]]
