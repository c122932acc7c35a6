"""THE table (request field -> Triton tensor), the settled request, and what the engine reads back.

`engine_message` builds the protobuf the relay sends; these tests parse it back with the engine's own
contract module (the code that runs inside Triton), so the two sides are checked against each other
without a server. The table is also checked against the model configs that declare the inputs.
"""

from __future__ import annotations

import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import contract  # the models' own contracts, as Triton imports them (pyproject's pythonpath)
import llmapi_contract
import numpy as np
import pytest
import shared_contract
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2, service_pb2

from tensorrtllm_backend import LLMAPI_TEMPLATES_DIR
from tensorrtllm_backend.repository import fill_model_config, repository_values
from trtllm_service.errors import APIError
from trtllm_service.relay.request import (
    ENGINE_FIXED,
    ENGINE_INPUTS,
    LLMAPI_FIXED,
    LLMAPI_INPUTS,
    LLMAPI_OUTPUTS,
    EngineLimits,
    GenerationRequest,
    SamplingParams,
    engine_message,
    llmapi_message,
    settle,
)

LIMITS = EngineLimits(max_seq_len=100, max_input_len=90, end_ids=(7, 8))
DTYPES = {"INT32": np.int32, "FP32": np.float32, "UINT64": np.uint64, "BOOL": np.bool_}


def _declared(model: str, tmp_path: Path) -> dict[str, str]:
    values = repository_values(engine_dir=tmp_path, tokenizer_dir=tmp_path, overrides={"end_ids": "7"})
    config = text_format.Parse(fill_model_config(model, values), model_config_pb2.ModelConfig())
    return {i.name: model_config_pb2.DataType.Name(i.data_type).removeprefix("TYPE_") for i in config.input}


def test_every_table_row_is_an_input_the_model_declares(tmp_path: Path) -> None:
    declared = _declared("tensorrt_llm", tmp_path)
    for spec in [*ENGINE_INPUTS.values(), *(spec for spec, _ in ENGINE_FIXED.values())]:
        triton_type = "STRING" if spec.datatype == "BYTES" else spec.datatype
        assert declared.get(spec.name) == triton_type, (
            f"tensorrt_llm declares {spec.name} as {declared.get(spec.name)}"
        )


EVERY_FIELD = GenerationRequest(
    prompt_ids=[3, 4, 5, 6],
    max_tokens=12,
    temperature=0.5,
    top_k=40,
    top_p=0.9,
    repetition_penalty=1.1,
    presence_penalty=0.25,
    frequency_penalty=-0.5,
    min_tokens=2,
    seed=(1 << 64) - 1,
    end_id=7,
    stop_token_ids=(8, 9),
    guide_type="json_schema",
    guide='{"type": "integer"}',
)
"""A request with every field of the table set."""


def _read_back(message: bytes) -> tuple[service_pb2.ModelInferRequest, dict[str, np.ndarray]]:
    request = service_pb2.ModelInferRequest.FromString(message)
    arrays = {}
    for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True):
        if tensor.datatype == "BYTES":  # Triton's layout: each element a 4-byte length, then its bytes
            items, offset = [], 0
            while offset < len(raw):
                (size,) = struct.unpack_from("<I", raw, offset)
                items.append(raw[offset + 4 : offset + 4 + size])
                offset += 4 + size
            arrays[tensor.name] = np.array(items, dtype=np.object_).reshape(list(tensor.shape))
            continue
        arrays[tensor.name] = np.frombuffer(raw, DTYPES[tensor.datatype]).reshape(list(tensor.shape))
    return request, arrays


def test_the_engine_reads_back_every_field_the_relay_sends() -> None:
    request = EVERY_FIELD
    message, arrays = _read_back(engine_message(request, "req-1"))
    assert (message.model_name, message.id, [o.name for o in message.outputs]) == (
        "tensorrt_llm",
        "req-1",
        ["output_ids", "sequence_length", "kv_cache_reused_blocks"],
    )
    assert arrays["input_ids"].shape == (1, 4) and arrays["stop_words_list"].shape == (1, 2, 2)
    assert all(
        arrays[name].shape == (1, 1) for name in arrays if name not in ("input_ids", "stop_words_list")
    )
    limits = contract.EngineLimits(vocab_size=100, max_seq_len=100)
    parsed = contract.parse_request(arrays.get, "req-1", limits, [o.name for o in message.outputs])
    assert parsed.input_ids == [3, 4, 5, 6] and parsed.max_new == 12
    assert (parsed.temperature, parsed.top_k, parsed.repetition_penalty) == (0.5, 40, pytest.approx(1.1))
    assert parsed.top_p == pytest.approx(0.9) and parsed.presence_penalty == 0.25
    assert (parsed.frequency_penalty, parsed.min_tokens, parsed.seed) == (-0.5, 2, (1 << 64) - 1)
    assert (parsed.end_id, parsed.stop_words, parsed.streaming, parsed.exclude_input) == (
        7,
        [[8], [9]],
        True,
        True,
    )
    # return_perf_metrics (every request: usage's cached_tokens) makes the perf outputs the relay names
    assert parsed.outputs == frozenset({"output_ids", "sequence_length", "kv_cache_reused_blocks"})
    assert parsed.return_perf_metrics
    assert parsed.guide == ("json_schema", '{"type": "integer"}')


def test_unset_fields_are_not_sent_so_the_engine_keeps_its_defaults() -> None:
    _, arrays = _read_back(engine_message(GenerationRequest(prompt_ids=[1], max_tokens=3), "r"))
    assert set(arrays) == {
        "input_ids",
        "input_lengths",
        "request_output_len",
        "end_id",
        "streaming",
        "exclude_input_in_output",
        "return_perf_metrics",
    }
    assert int(arrays["end_id"][0, 0]) == -1


def test_logit_bias_prompt_logprobs_and_beams_reach_both_engines_as_they_read_them() -> None:
    """logit_bias -> a vocabulary-sized embedding bias; prompt log probs -> context logits (C++) or
    prompt_logprobs (LLM API); beam search -> one unstreamed request for n beams; max_tokens 0 -> 1."""
    limits = EngineLimits(max_seq_len=100, max_input_len=90, end_ids=(7, 8), vocab_size=50)
    params = SamplingParams(
        temperature=0.0, logit_bias=((3, 5.0), (9, -100.0)), stop_token_ids=(11, 8), prompt_logprobs=2
    )
    request = settle([1, 2, 3], params, limits)
    assert request.embedding_bias.shape == (50,) and request.embedding_bias[3] == 5.0
    assert request.stop_token_ids == (8, 11) and request.cut_token_ids == (11,)
    _, arrays = _read_back(engine_message(request, "r"))
    cpp = contract.parse_request(arrays.get, "r", contract.EngineLimits(vocab_size=50, max_seq_len=100))
    assert cpp.embedding_bias[9] == -100.0 and cpp.stop_words == [[8], [11]]
    assert cpp.return_context_logits and "context_logits" in cpp.outputs
    text = _parse_llmapi(
        _read_back_llmapi_any(llmapi_message(request, "r")),
        llmapi_contract.TextLimits(50, 100, end_ids=(7, 8)),
    )
    assert text.sampling["embedding_bias"][3] == 5.0 and text.sampling["stop_token_ids"] == [8, 11]
    assert text.sampling["prompt_logprobs"] == 2 and text.sampling["return_context_logits"]
    assert text.prompt_logprobs == 2 and {"prompt_log_probs", "prompt_top_log_probs"} <= text.outputs
    with pytest.raises(APIError, match="outside the vocabulary"):
        settle([1], SamplingParams(logit_bias=((50, 1.0),)), limits)
    only_prompt = settle([1, 2], SamplingParams(max_tokens=0), limits)
    assert only_prompt.max_tokens == 1 and only_prompt.prompt_only

    beams = replace(
        settle([1, 2, 3], SamplingParams(beam_width=4, early_stopping=False), limits), num_return=2
    )
    assert (beams.beam_width, beams.length_penalty, beams.early_stopping) == (4, 1.0, 0)
    _, arrays = _read_back(engine_message(beams, "b"))
    assert bool(arrays["streaming"][0, 0]) is False and "early_stopping" not in arrays  # misread: not sent
    cpp = contract.parse_request(
        arrays.get, "b", contract.EngineLimits(vocab_size=50, max_seq_len=100, max_beam_width=4)
    )
    assert (cpp.beam_width, cpp.num_return, cpp.length_penalty, cpp.streaming) == (4, 2, 1.0, False)
    with pytest.raises(shared_contract.RequestError, match="exceeds the engine's max_beam_width 2"):
        contract.parse_request(
            arrays.get, "b", contract.EngineLimits(vocab_size=50, max_seq_len=100, max_beam_width=2)
        )
    text = _parse_llmapi(
        _read_back_llmapi_any(llmapi_message(beams, "b")), llmapi_contract.TextLimits(50, 100)
    )
    assert not text.streaming
    assert {
        k: text.sampling[k] for k in ("use_beam_search", "best_of", "n", "length_penalty", "early_stopping")
    } == {
        "use_beam_search": True,
        "best_of": 4,
        "n": 2,
        "length_penalty": 1.0,
        "early_stopping": 0,
    }


def _read_back_llmapi_any(message: bytes) -> dict[str, np.ndarray]:
    return _read_back(message)[1]


def test_settle_openai_sampling_in_trtllm_terms() -> None:
    greedy = settle([1, 2], SamplingParams(temperature=0.0, top_p=0.5, seed=3), LIMITS)
    assert (greedy.top_k, greedy.temperature, greedy.top_p, greedy.seed) == (1, None, None, None)
    default = settle([1, 2], SamplingParams(), LIMITS)
    # TRT-LLM decodes greedily when neither top_k nor top_p is set: sampling sends top_p 1.
    assert (default.temperature, default.top_k, default.top_p) == (1.0, None, 1.0)
    top_k = settle([1, 2], SamplingParams(temperature=0.7, top_k=5, seed=9), LIMITS)
    assert (top_k.temperature, top_k.top_k, top_k.top_p, top_k.seed) == (0.7, 5, None, 9)
    assert (default.end_id, default.stop_token_ids) == (7, (8,))
    ignore = settle([1, 2], SamplingParams(ignore_eos=True), LIMITS)
    assert (ignore.end_id, ignore.stop_token_ids) == (-1, ())


def test_settle_the_token_budget_once() -> None:
    assert settle([1] * 10, SamplingParams(), LIMITS).max_tokens == 90
    assert settle([1] * 10, SamplingParams(), LIMITS, default_max_tokens=16).max_tokens == 16
    assert settle([1] * 10, SamplingParams(max_tokens=90), LIMITS).max_tokens == 90
    with pytest.raises(APIError) as too_many:
        settle([1] * 10, SamplingParams(max_tokens=91), LIMITS, param="prompt")
    error = too_many.value
    assert (error.status, error.code, error.param) == (400, "context_length_exceeded", "prompt")
    assert "100 tokens" in error.message and "(10 in the prompt, 91 in the completion)" in error.message
    with pytest.raises(APIError, match="maximum context length"):
        settle([1] * 91, SamplingParams(max_tokens=1), LIMITS)  # beyond max_input_len


# ---- the LLM API flavour -------------------------------------------------------------------------------


def _llmapi_declared(tmp_path: Path) -> tuple[dict[str, tuple[str, list[int]]], set[str]]:
    values = repository_values(engine_dir=tmp_path, tokenizer_dir=tmp_path, overrides={"end_ids": "7"})
    text = fill_model_config("tensorrt_llm", values, LLMAPI_TEMPLATES_DIR)
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert config.max_batch_size == 0
    inputs = {
        i.name: (model_config_pb2.DataType.Name(i.data_type).removeprefix("TYPE_"), list(i.dims))
        for i in config.input
    }
    return inputs, {o.name for o in config.output}


def test_llmapi_table_rows_are_inputs_the_model_declares(tmp_path: Path) -> None:
    declared, outputs = _llmapi_declared(tmp_path)
    for spec in [*LLMAPI_INPUTS.values(), *(spec for spec, _ in LLMAPI_FIXED.values())]:
        assert not spec.batched  # max_batch_size 0: no batch dimension
        triton_type = "STRING" if spec.datatype == "BYTES" else spec.datatype
        assert declared.get(spec.name, ("?",))[0] == triton_type, spec.name
    assert set(LLMAPI_OUTPUTS) <= outputs
    # Every input the contract reads is declared (upstream's all are: tests/unit/backend/standin/test_nvidia_llmapi.py).
    read = {*llmapi_contract.DEFAULTS, *llmapi_contract.OURS, *llmapi_contract.OPTIONAL_OUTPUTS}
    assert read <= set(declared)


def _read_back_llmapi(message: bytes) -> dict[str, np.ndarray]:
    request, arrays = _read_back(message)
    assert request.model_name == "tensorrt_llm"
    assert [o.name for o in request.outputs] == list(LLMAPI_OUTPUTS)
    return arrays


def _parse_llmapi(
    arrays: dict[str, np.ndarray], limits: Any, tokenize: Any = lambda _: [], requested: Any = ()
) -> Any:
    return llmapi_contract.parse_text_request(arrays.get, "req-1", limits, tokenize, lambda _: "", requested)


def test_the_llmapi_model_reads_back_every_field_the_relay_sends() -> None:
    request = EVERY_FIELD
    arrays = _read_back_llmapi(llmapi_message(request, "req-1"))
    limits = llmapi_contract.TextLimits(vocab_size=100, max_seq_len=100, end_ids=(1, 2))
    parsed = _parse_llmapi(arrays, limits, requested=LLMAPI_OUTPUTS)
    assert parsed.input_ids == [3, 4, 5, 6] and parsed.streaming
    sampling = parsed.sampling
    assert sampling.pop("temperature") == pytest.approx(0.5)
    assert sampling.pop("top_p") == pytest.approx(0.9)
    assert sampling.pop("repetition_penalty") == pytest.approx(1.1)
    assert sampling.pop("frequency_penalty") == pytest.approx(-0.5)
    # The rest exactly: the SamplingParams keywords, as TensorRT-LLM names them.
    assert sampling == {
        "max_tokens": 12,
        "top_k": 40,
        "presence_penalty": 0.25,
        "seed": (1 << 64) - 1,
        "min_tokens": 2,
        "best_of": 1,
        "end_id": 7,
        "stop_token_ids": [8, 9],  # the request's end ids replace the model's (1, 2)
        "return_perf_metrics": True,  # every request: usage's cached_tokens
    }
    assert parsed.guide == ("json_schema", '{"type": "integer"}')
    # Only what the relay asked for: return_perf_metrics enables every perf output, but the model
    # must not send those it was not asked for (Triton's stub drops them without the GIL, which
    # crashes Python 3.12), nor anything else.
    assert (
        parsed.outputs == set(LLMAPI_OUTPUTS) == {"text_output", "num_output_tokens", "kv_cache_reused_block"}
    )
    assert parsed.echo_prompt is None


def test_llmapi_defaults_are_the_models_end_ids_and_the_context_left() -> None:
    limits = llmapi_contract.TextLimits(vocab_size=100, max_seq_len=50, end_ids=(1, 2))
    text = {"text_input": np.array([b"hello"], dtype=np.object_)}
    parsed = _parse_llmapi(text, limits, lambda s: [5] * len(s))
    assert parsed.input_ids == [5] * 5
    # What the context leaves; no temperature/top_k/top_p: left out, so TensorRT-LLM decodes greedily.
    assert parsed.sampling == {"max_tokens": 45, "best_of": 1, "end_id": 1, "stop_token_ids": [2]}
    assert not parsed.streaming and parsed.echo_prompt is None  # ours: no echo unless asked
    ignore_eos = _parse_llmapi(
        {**text, "sampling_param_end_id": np.array([-1], np.int32)}, limits, lambda s: [5]
    )
    assert ignore_eos.sampling.get("ignore_eos") is True and "end_id" not in ignore_eos.sampling
    # More than the context leaves goes to the LLM, which clamps it (the PyTorch backend: a warning).
    over = _parse_llmapi(
        {**text, "sampling_param_max_tokens": np.array([46], np.int32)}, limits, lambda s: [5] * 5
    )
    assert over.sampling["max_tokens"] == 46
    for bad, message in (
        ({"sampling_param_max_tokens": np.array([0], np.int32)}, "must be positive"),
        ({"input_ids": np.array([1, 2], np.int32)}, "not both"),
        ({"text_input": np.array([b"\xff"], dtype=np.object_)}, "not valid UTF-8"),
        ({"sampling_param_embedding_bias": np.zeros(3, np.float32)}, "has 3 values; the vocabulary has 100"),
    ):
        with pytest.raises(shared_contract.RequestError, match=message):
            _parse_llmapi({**text, **bad}, limits, lambda s: [5] * len(s))


def test_llmapi_refusals_are_upstreams_where_upstream_refuses() -> None:
    limits = llmapi_contract.TextLimits(vocab_size=100, max_seq_len=50, streaming_allowed=False)
    text = {"text_input": np.array([b"hello"], dtype=np.object_)}
    for arrays, message in (
        ({}, "text_input is missing from the request"),
        ({"text_input": np.array([[b"a"]], dtype=np.object_)}, "only supports text_input being a 1D tensor"),
        ({**text, "streaming": np.array([True])}, "Streaming is only supported in decoupled mode."),
        ({**text, "sampling_param_top_k": np.array([1, 2], np.int32)}, "Expected a scalar tensor for tensor"),
    ):
        with pytest.raises(llmapi_contract.LlmApiError, match=message):
            _parse_llmapi(arrays, limits, lambda s: [5] * len(s))


def test_the_fixed_inputs_go_with_each_request_as_its_own_kind_needs() -> None:
    """The fixed inputs and outputs are serialized once per kind of request and appended to each
    message: a beam request between streamed ones is unstreamed, one with log probs asks for them,
    and every input still reads back its own values."""
    plain = GenerationRequest(prompt_ids=[1, 2], max_tokens=3, top_k=1, end_id=7)
    beams = replace(plain, prompt_ids=[4, 5, 6], beam_width=2, num_return=1)
    logprobs = replace(plain, prompt_ids=[9], logprobs=0)
    for request, streamed in ((plain, True), (beams, False), (logprobs, True), (plain, True), (beams, False)):
        message, arrays = _read_back(engine_message(request, "m"))
        assert arrays["input_ids"].tolist() == [list(request.prompt_ids)]
        assert arrays["input_lengths"].tolist() == [[len(request.prompt_ids)]]
        assert arrays["request_output_len"].tolist() == [[3]] and arrays["end_id"].tolist() == [[7]]
        assert bool(arrays["streaming"][0, 0]) is streamed
        assert bool(arrays["exclude_input_in_output"][0, 0]) and bool(arrays["return_perf_metrics"][0, 0])
        outputs = [o.name for o in message.outputs]
        assert outputs[:3] == ["output_ids", "sequence_length", "kv_cache_reused_blocks"]
        assert ("output_log_probs" in outputs) is (request is logprobs)
        llmapi = _read_back_llmapi_any(llmapi_message(request, "m"))
        assert bool(llmapi["streaming"][0]) is streamed


def _protobuf_serialized(
    model: str, request_id: str, inputs: list[tuple[Any, object]], outputs: tuple[str, ...] = ()
) -> bytes:
    """What protobuf's own serializer makes of these inputs: the reference the hand-written wire
    must match byte for byte."""
    message = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for spec, value in inputs:
        shape, raw = spec.encode(value)
        tensor = message.inputs.add()
        tensor.name, tensor.datatype = spec.name, spec.datatype_of(value)
        tensor.shape.extend(shape)
        message.raw_input_contents.append(raw)
    for output in outputs:
        message.outputs.add().name = output
    return message.SerializeToString()


def test_the_wire_is_protobufs_own_serialization_byte_for_byte() -> None:
    """The relay writes ModelInferRequest by hand: for requests of every shape (numbers, a prompt of
    more than 127 tokens and ids past one varint byte, text, word lists, float16 and float32 arrays,
    beams, log probs, an empty request id), both flavours' messages are exactly what protobuf writes
    for the request's own inputs, followed by what it writes for the fixed inputs and the outputs."""
    from trtllm_service.relay import request as wire

    long_prompt = list(range(100, 400))
    lora = np.arange(12, dtype=np.float16).reshape(2, 6)
    requests = [
        (EVERY_FIELD, "req-1", None),
        (GenerationRequest(prompt_ids=[1], max_tokens=3), "", None),
        (
            replace(
                EVERY_FIELD, prompt_ids=long_prompt, seed=0, temperature=1e-30, logprobs=3, prompt_logprobs=1
            ),
            "a" * 200,
            "a prompt of text, é",
        ),
        (
            replace(
                EVERY_FIELD,
                embedding_bias=np.linspace(-1, 1, 300, dtype=np.float32),
                lora_task_id=9,
                lora_weights=lora,
                lora_config=np.ones((2, 3), np.int32),
                lora_name="adapter",
                lora_id=(1 << 63) + 5,
                lora_path="/tmp/x",
            ),
            "lora",
            None,
        ),
        (replace(EVERY_FIELD, beam_width=3, num_return=2, length_penalty=0.5, early_stopping=2), "b", None),
    ]
    for request, request_id, prompt in requests:
        for table, fixed, build, outputs, extra in (
            (
                ENGINE_INPUTS,
                ENGINE_FIXED,
                lambda r, i, p: engine_message(r, i),
                wire.engine_outputs,
                lambda r, p: [(wire._INPUT_LENGTHS, len(r.prompt_ids))],
            ),
            (
                LLMAPI_INPUTS,
                LLMAPI_FIXED,
                llmapi_message,
                wire.llmapi_outputs,
                lambda r, p: [] if p is None else [(wire._llmapi("text_input", "BYTES"), p)],
            ),
        ):
            sent = (
                replace(request, prompt_ids=[]) if prompt is not None and table is LLMAPI_INPUTS else request
            )
            own = [*extra(sent, prompt)] + [
                (spec, getattr(sent, name))
                for name, spec in table.items()
                if getattr(sent, name) is not None
                and not (name in ("stop_token_ids", "prompt_ids") and not getattr(sent, name))
            ]
            streamed = not sent.beam_width
            fixed_inputs = [
                (spec, value if streamed or name != "streaming" else False)
                for name, (spec, value) in fixed.items()
            ]
            expected = _protobuf_serialized("tensorrt_llm", request_id, own) + _protobuf_serialized(
                "", "", fixed_inputs, outputs(sent)
            )
            assert build(sent, request_id, prompt) == expected, (table is ENGINE_INPUTS, request_id)
    assert len(long_prompt) > 127 and max(long_prompt) > 127  # a shape and contents past one varint byte
