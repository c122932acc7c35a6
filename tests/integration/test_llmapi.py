"""The LLM API flavour's `tensorrt_llm` model in a real tritonserver, called over gRPC as upstream's
clients call NVIDIA's llmapi model (`text_input`, `sampling_param_*`, `text_output`), and with our
extensions (input_ids, token counts). tensorrt_llm is not installed here, so the model falls back to
the reference engine and must say so.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from tests.support import (
    REQUESTS_METRIC,
    TOKENS_METRIC,
    Streamer,
    StreamResult,
    TritonServer,
    load_tokenizer,
    wait_engine_idle,
    wait_for,
)

MODEL = "tensorrt_llm"
OUTPUTS = ("text_output", "finish_reason", "stop_reason", "cumulative_logprob")
OUTPUTS += ("num_input_tokens", "num_output_tokens")
PROMPT = "The quick brown fox jumps over the lazy dog."

DTYPES: dict[str, Any] = {
    "streaming": np.bool_,
    "sampling_param_temperature": np.float32,
    "sampling_param_top_k": np.int32,
    "sampling_param_top_p": np.float32,
    "sampling_param_frequency_penalty": np.float32,
    "sampling_param_presence_penalty": np.float32,
    "sampling_param_repetition_penalty": np.float32,
    "sampling_param_max_tokens": np.int32,
    "sampling_param_min_tokens": np.int32,
    "sampling_param_seed": np.uint64,
    "sampling_param_end_id": np.int32,
    "sampling_param_best_of": np.int32,
    "sampling_param_exclude_input_from_output": np.bool_,
}


def _input(name: str, value: Any) -> grpcclient.InferInput:
    """As upstream's clients send them to a model with max_batch_size 0: scalars are shape [1]."""
    if name in ("text_input", "sampling_param_stop"):
        array = np.array([v.encode() for v in ([value] if isinstance(value, str) else value)], np.object_)
    elif name in ("input_ids", "sampling_param_stop_token_ids"):
        array = np.array(value, dtype=np.int32).reshape(-1)
    else:
        array = np.array([value], dtype=DTYPES.get(name, np.bool_))
    infer_input = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    infer_input.set_data_from_numpy(array)
    return infer_input


def run(server: TritonServer, prompt: str | list[int] | None = PROMPT, **params: Any) -> StreamResult:
    """One request; `prompt` goes in text_input (str) or input_ids (list); params by input name."""
    with Streamer(server.grpc_url) as streamer:
        send(streamer, prompt, **params)
        return streamer.collect()


def send(
    streamer: Streamer, prompt: str | list[int] | None = PROMPT, request_id: str = "", **params: Any
) -> None:
    inputs = []
    if isinstance(prompt, str):
        inputs.append(_input("text_input", prompt))
    elif prompt is not None:
        inputs.append(_input("input_ids", prompt))
    for name, value in params.items():
        inputs.append(_input(name, value))
    streamer.client.async_stream_infer(
        MODEL,
        inputs,
        outputs=[grpcclient.InferRequestedOutput(n) for n in OUTPUTS],
        request_id=request_id or uuid.uuid4().hex,
        enable_empty_final_response=True,
    )


def final(result: StreamResult, name: str) -> str | int:
    value = result.last(name).reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else int(value)


ALL = {
    "return_finish_reason": True,
    "return_stop_reason": True,
    "return_cumulative_logprob": True,
    "return_num_input_tokens": True,
    "return_num_output_tokens": True,
}
GREEDY = {"sampling_param_temperature": 0.0}


@pytest.fixture(scope="module")
def llmapi(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    server = TritonServer(
        tmp_path_factory.mktemp("llmapi"),
        engine_dir=demo_model_dir,
        tokenizer_dir=demo_model_dir,
        flavor="llmapi",
    )
    with server:
        yield server


def test_streamed_deltas_are_the_whole_text(llmapi: TritonServer, demo_model_dir: Path) -> None:
    whole = run(llmapi, sampling_param_max_tokens=64, sampling_param_end_id=-1, **GREEDY, **ALL)
    assert whole.error is None, whole.error
    assert len(whole.outputs) == 1  # not streamed: one response with everything
    streamed = run(
        llmapi, streaming=True, sampling_param_max_tokens=64, sampling_param_end_id=-1, **GREEDY, **ALL
    )
    assert streamed.error is None, streamed.error
    assert len(streamed.outputs) > 10
    assert streamed.text == whole.text and whole.text
    for result in (whole, streamed):
        assert final(result, "finish_reason") == "length"
        assert final(result, "num_output_tokens") == 64
        prompt_ids = load_tokenizer(str(demo_model_dir)).encode(PROMPT, add_special_tokens=True)
        assert final(result, "num_input_tokens") == len(prompt_ids)
    # Every response but the last says "None" for the finish reason, as upstream's str(None).
    assert {o["finish_reason"].reshape(-1)[0] for o in streamed.outputs[:-1]} == {b"None"}
    counts = [int(o["num_output_tokens"].reshape(-1)[0]) for o in streamed.outputs]
    assert counts == sorted(counts) and counts[-1] == 64
    assert float(final(whole, "cumulative_logprob")) < 0.0  # type: ignore[arg-type]


def test_text_and_token_prompts_agree(llmapi: TritonServer, demo_model_dir: Path) -> None:
    tokenizer = load_tokenizer(str(demo_model_dir))
    ids = tokenizer.encode(PROMPT, add_special_tokens=True)
    by_text = run(llmapi, PROMPT, sampling_param_max_tokens=24, **GREEDY, **ALL)
    by_ids = run(llmapi, ids, sampling_param_max_tokens=24, **GREEDY, **ALL)
    assert by_text.error is None and by_ids.error is None
    assert by_text.text == by_ids.text
    assert final(by_text, "num_input_tokens") == final(by_ids, "num_input_tokens") == len(ids)


@pytest.fixture(scope="module")
def greedy(demo_model_dir: Path) -> tuple[list[int], list[int]]:
    """(prompt ids, 32 greedy ids) from transformers, no end id."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(str(demo_model_dir))
    model = AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32).eval()
    ids = tokenizer.encode(PROMPT, add_special_tokens=True)
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return ids, out[0, len(ids) :].tolist()


def test_greedy_matches_transformers(llmapi: TritonServer, demo_model_dir: Path, greedy: Any) -> None:
    tokenizer = load_tokenizer(str(demo_model_dir))
    ids, generated = greedy
    expected = tokenizer.decode(generated, skip_special_tokens=True)
    result = run(
        llmapi, ids, streaming=True, sampling_param_max_tokens=32, sampling_param_end_id=-1, **GREEDY
    )
    assert result.error is None, result.error
    assert result.text == expected.rstrip("\ufffd")


def test_stop_string_ends_the_text_before_it(llmapi: TritonServer) -> None:
    base = run(llmapi, sampling_param_max_tokens=64, sampling_param_end_id=-1, **GREEDY)
    text = base.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert len(stop) == 3 and stop.strip(), text
    for streaming in (False, True):
        result = run(
            llmapi,
            streaming=streaming,
            sampling_param_max_tokens=64,
            sampling_param_end_id=-1,
            sampling_param_stop=[stop, "never appears in this text \u2603"],
            **GREEDY,
            **ALL,
        )
        assert result.error is None, result.error
        assert result.text == text[: text.index(stop)]
        assert (final(result, "finish_reason"), final(result, "stop_reason")) == ("stop", stop)
        assert final(result, "num_output_tokens") < 64


def test_stop_token_ids_end_before_the_token(llmapi: TritonServer, demo_model_dir: Path, greedy: Any) -> None:
    tokenizer = load_tokenizer(str(demo_model_dir))
    ids, generated = greedy
    at = next(i for i in range(4, len(generated)) if generated[i] not in generated[:i])
    result = run(
        llmapi,
        ids,
        sampling_param_max_tokens=32,
        sampling_param_end_id=-1,
        sampling_param_stop_token_ids=[generated[at]],
        **GREEDY,
        **ALL,
    )
    assert result.error is None, result.error
    assert result.text == tokenizer.decode(generated[:at], skip_special_tokens=True).rstrip("\ufffd")
    assert (final(result, "finish_reason"), final(result, "stop_reason")) == ("stop", str(generated[at]))
    assert final(result, "num_output_tokens") == at + 1


def test_seeded_sampling(llmapi: TritonServer) -> None:
    sampled = {
        "sampling_param_temperature": 1.0,
        "sampling_param_top_p": 1.0,
        "sampling_param_max_tokens": 24,
    }
    a = run(llmapi, sampling_param_seed=7, sampling_param_end_id=-1, **sampled)
    b = run(llmapi, sampling_param_seed=7, sampling_param_end_id=-1, **sampled)
    c = run(llmapi, sampling_param_seed=8, sampling_param_end_id=-1, **sampled)
    assert a.error is None and a.text == b.text
    assert c.text != a.text


def test_prompt_echo_when_asked(llmapi: TritonServer) -> None:
    plain = run(llmapi, sampling_param_max_tokens=8, **GREEDY)
    echoed = run(
        llmapi,
        streaming=True,
        sampling_param_max_tokens=8,
        sampling_param_exclude_input_from_output=False,
        **GREEDY,
    )
    assert echoed.text == PROMPT + plain.text


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ("", {}, "text_input is empty"),
        (None, {}, "text_input is empty"),
        (PROMPT, {"sampling_param_max_tokens": 0}, "max_tokens must be positive"),
        (PROMPT, {"sampling_param_max_tokens": 5000}, "exceeds the model's max_seq_len of 2048"),
        (PROMPT, {"sampling_param_best_of": 2}, "best_of 2 is not supported"),
        ([1, 2, 99999], {}, "outside the vocabulary"),
        (PROMPT, {"sampling_param_top_p": 1.5}, "top_p within [0, 1]"),
    ],
)
def test_bad_requests_are_refused_with_the_marker(
    llmapi: TritonServer, prompt: Any, params: dict[str, Any], message: str
) -> None:
    result = run(llmapi, prompt, **params)
    assert result.error is not None and "invalid request: " in result.error and message in result.error, (
        result.error
    )
    after = run(llmapi, sampling_param_max_tokens=2)  # and the model serves on
    assert after.error is None


def test_cancelled_request_is_aborted_in_the_engine(llmapi: TritonServer) -> None:
    assert wait_engine_idle(llmapi)
    before = llmapi.metric(REQUESTS_METRIC, outcome="cancelled")
    streamer = Streamer(llmapi.grpc_url)
    send(streamer, streaming=True, sampling_param_max_tokens=1900, sampling_param_end_id=-1, **GREEDY)
    partial = streamer.collect(max_responses=3, timeout=60)
    assert partial.error is None and len(partial.outputs) == 3
    streamer.client.stop_stream(cancel_requests=True)
    streamer.client.close()
    assert wait_for(lambda: llmapi.metric(REQUESTS_METRIC, outcome="cancelled") == before + 1, 3.0)
    tokens = llmapi.metric(TOKENS_METRIC)
    time.sleep(1.0)
    assert llmapi.metric(TOKENS_METRIC) == tokens, "the engine is still generating"


def test_says_it_fell_back_to_the_reference_engine(llmapi: TritonServer) -> None:
    assert llmapi.metric("trtllm_engine_info", engine="reference") == 1
    log = llmapi.log()
    assert log.count("tensorrt_llm cannot be imported") == 1, log[-3000:]


def test_required_tensorrt_llm_is_a_start_up_error(demo_model_dir: Path, tmp_path: Path) -> None:
    os.environ["TRTLLM_REQUIRE_TENSORRT_LLM"] = "1"
    try:
        server = TritonServer(
            tmp_path,
            engine_dir=demo_model_dir,
            tokenizer_dir=demo_model_dir,
            flavor="llmapi",
            startup_timeout=120,
        )
        with pytest.raises(RuntimeError, match="failed to load"):
            server.__enter__()
        assert "refusing to fall back to the reference engine" in server.log()
    finally:
        del os.environ["TRTLLM_REQUIRE_TENSORRT_LLM"]
        server.stop()
