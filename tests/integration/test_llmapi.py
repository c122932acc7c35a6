"""The LLM API flavour's `tensorrt_llm` model in a real tritonserver, called over gRPC as upstream's
clients call NVIDIA's llmapi model (`text_input`, `sampling_param_*`, `text_output`), and with our
extensions (input_ids, token counts, log probs). tensorrt_llm is not installed here, so the model
falls back to the reference engine and must say so; it still serves through llm_engine.py, the
production path, over the stand-in LLM API (llm_standin.py). Tests named test_finding_* hold the
findings of issue 21 (NVIDIA's LLM API contract at 1.2.1, tensorrtllm_backend/nvidia_llmapi.py).
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.llmapi_support import (
    GREEDY,
    MODEL,
    OUTPUTS,
    PROMPT,
    final,
    llmapi_input,
    run,
    send,
)
from tests.support import (
    REQUESTS_METRIC,
    TOKENS_METRIC,
    Streamer,
    TritonServer,
    finish_deferred_stops,
    kernel_log,
    load_tokenizer,
    new_stub_crashes,
    stopped_soon,
    wait_engine_idle,
    wait_for,
)

ALL = {
    "return_finish_reason": True,
    "return_stop_reason": True,
    "return_cumulative_logprob": True,
    "return_num_input_tokens": True,
    "return_num_output_tokens": True,
}


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
    assert float(final(whole, "cumulative_logprob")) < 0.0


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
    assert final(result, "num_output_tokens") == at  # the LLM API cuts the stop token from token_ids


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
        (PROMPT, {"sampling_param_max_tokens": 0}, "max_tokens must be positive"),
        (
            PROMPT,
            {"sampling_param_best_of": 2, "sampling_param_temperature": 1.0},
            "best_of 2, n 1: the stand-in",
        ),
        ([1, 2, 99999], {}, "outside the vocabulary"),
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


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        (None, {}, "text_input is missing from the request"),
        (PROMPT, {"sampling_param_top_p": 1.5}, "require 0 <= top_p <= 1, got top_p=1.5"),
        (PROMPT, {"sampling_param_top_k": -1}, "require top_k >= 0, got top_k=-1"),
        (PROMPT, {"sampling_param_best_of": 2}, "Greedy decoding in the LLM API does not allow multiple"),
    ],
)
def test_finding_nvidias_refusals_are_nvidias_words(
    llmapi: TritonServer, prompt: Any, params: dict[str, Any], message: str
) -> None:
    """What upstream's model or SamplingParams refuses comes back as upstream sends it."""
    result = run(llmapi, prompt, **params)
    assert result.error is not None and "Error generating request: " in result.error, result.error
    assert message in result.error and "invalid request: " not in result.error


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
    time.sleep(0.3)  # a step under way when the cancel landed may still count its token
    tokens = llmapi.metric(TOKENS_METRIC)
    time.sleep(1.0)
    assert llmapi.metric(TOKENS_METRIC) == tokens, "the engine is still generating"
    # The engine itself dropped it (RequestOutput.abort() reached the engine loop), not only the relay.
    assert wait_for(lambda: "cancelled after" in llmapi.log(), 3.0), llmapi.log()[-3000:]


def test_says_it_fell_back_to_the_reference_engine(llmapi: TritonServer) -> None:
    assert llmapi.metric("trtllm_engine_info", engine="reference") == 1
    log = llmapi.log()
    assert log.count("tensorrt_llm cannot be imported") == 1, log[-3000:]


def test_finding_llm_engine_runs_in_ci(llmapi: TritonServer) -> None:
    """The production path (llm_engine.LLMEngine: SamplingParams, generate_async, deltas) serves here,
    over the stand-in LLM API and the reference engine."""
    assert "LLM API stand-in over the reference engine" in llmapi.log(), llmapi.log()[-3000:]
    streamed = run(llmapi, streaming=True, sampling_param_max_tokens=16, sampling_param_end_id=-1, **GREEDY)
    whole = run(llmapi, sampling_param_max_tokens=16, sampling_param_end_id=-1, **GREEDY)
    assert streamed.error is None and whole.error is None
    assert len(streamed.outputs) > 1 and len(whole.outputs) == 1  # streaming reached the engine
    assert streamed.text == whole.text


def test_finding_cumulative_logprob_is_fp32(llmapi: TritonServer) -> None:
    """Declared TYPE_FP32 as upstream declares it, and sent as FP32 (upstream sends str(value))."""
    result = run(llmapi, sampling_param_max_tokens=8, **GREEDY, **ALL)
    assert result.error is None
    values = [out["cumulative_logprob"] for out in result.outputs]
    assert all(v.dtype == np.float32 for v in values)
    assert math.isfinite(final(result, "cumulative_logprob")) and final(result, "cumulative_logprob") < 0


def test_finding_logprobs_are_logprob_objects(llmapi: TritonServer) -> None:
    """The LLM API's per-token dict[token, Logprob(logprob, rank)], streamed incrementally, reaches
    the client as each new token's log prob and its top N ranked by the engine."""
    outputs = (*OUTPUTS, "output_ids", "output_log_probs", "top_log_prob_ids", "top_log_probs")
    params = {"sampling_param_max_tokens": 12, "sampling_param_end_id": -1, "sampling_param_logprobs": 3}
    streamed = run(llmapi, outputs=outputs, streaming=True, **params, **GREEDY, **ALL)
    whole = run(llmapi, outputs=outputs, **params, **GREEDY, **ALL)
    assert streamed.error is None and whole.error is None
    ids = np.concatenate([out["output_ids"] for out in streamed.outputs])
    assert ids.tolist() == whole.last("output_ids").tolist() and len(ids) == 12
    assert len(streamed.outputs) > 1  # incrementally: each response carries only its new tokens
    values = np.concatenate([out["output_log_probs"] for out in streamed.outputs])
    np.testing.assert_allclose(values, whole.last("output_log_probs"), atol=1e-5)
    top_ids = np.concatenate([out["top_log_prob_ids"] for out in streamed.outputs])
    top = np.concatenate([out["top_log_probs"] for out in streamed.outputs])
    assert top.shape == (12, 3) and (np.diff(top, axis=1) <= 0).all()  # rank 1 first
    assert (top_ids[:, 0] == ids).all()  # greedy: the sampled token is rank 1
    np.testing.assert_allclose(top[:, 0], values, atol=1e-6)
    assert final(whole, "cumulative_logprob") == pytest.approx(float(values.sum()), abs=1e-3)


def test_finding_stop_request_ends_the_request(llmapi: TritonServer) -> None:
    """Upstream's `stop` input: the requests with its request id end; the stop itself is answered
    "Request cancelled by client"."""
    before = llmapi.metric(REQUESTS_METRIC, outcome="stopped")
    request_id = uuid.uuid4().hex
    with Streamer(llmapi.grpc_url) as streamer:
        send(
            streamer,
            request_id=request_id,
            streaming=True,
            sampling_param_max_tokens=1900,
            sampling_param_end_id=-1,
            **GREEDY,
            **ALL,
        )
        first = streamer.collect(max_responses=2, timeout=60)
        assert first.error is None and len(first.outputs) == 2
        with Streamer(llmapi.grpc_url) as stopper:
            send(stopper, None, request_id=request_id, stop=True)
            answer = stopper.collect(timeout=30)
        assert answer.error is not None and "Request cancelled by client" in answer.error
        rest = streamer.collect(timeout=30)
    assert rest.error is None and final(rest, "finish_reason") == "cancelled"
    assert final(rest, "num_output_tokens") < 1900
    assert wait_for(lambda: llmapi.metric(REQUESTS_METRIC, outcome="stopped") == before + 1, 3.0)
    with Streamer(llmapi.grpc_url) as stopper:  # a stop needs a request id
        stopper.client.async_stream_infer(
            MODEL, [llmapi_input("stop", True)], enable_empty_final_response=True
        )
        anonymous = stopper.collect(timeout=30)
    assert anonymous.error is not None and "A request id must be provided" in anonymous.error


def test_finding_model_yaml_unknown_key_fails_like_llm_args(demo_model_dir: Path, tmp_path: Path) -> None:
    """A model.yaml key TensorRT-LLM 1.2.1's TorchLlmArgs does not know fails the load here too, with
    pydantic's words naming the key, as it would on NVIDIA's image."""
    server = TritonServer(
        tmp_path,
        engine_dir=demo_model_dir,
        tokenizer_dir=demo_model_dir,
        flavor="llmapi",
        startup_timeout=120,
    )
    model_yaml = server.repo / "tensorrt_llm" / "1" / "model.yaml"
    text = model_yaml.read_text().replace("kv_cache_config:\n", "kv_cache_config:\n  free_gpu_memory: 0.5\n")
    model_yaml.write_text(text + "\n")
    finish_deferred_stops()  # any stub's crash from here on is this server's
    before = kernel_log()
    try:
        with pytest.raises(RuntimeError, match="failed to load"):
            server.__enter__()
        log = server.log()
        assert "kv_cache_config.free_gpu_memory" in log and "Extra inputs are not permitted" in log, log[
            -3000:
        ]
    finally:
        server.stop()
    # A failed load is never finalized: its metric families, freed at the stub's exit, crashed it.
    assert not new_stub_crashes(before)


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


@pytest.fixture(scope="module")
def beam_packed(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A model packed with --max-beam-width 2, max_num_tokens 16 and max_seq_len 64."""
    server = TritonServer(
        tmp_path_factory.mktemp("llmapi-beams"),
        engine_dir=demo_model_dir,
        tokenizer_dir=demo_model_dir,
        flavor="llmapi",
        overrides={"max_beam_width": "2", "max_num_tokens": "16", "llm_max_seq_len": "64"},
    )
    with stopped_soon(server):
        yield server


BEAMS = {"sampling_param_use_beam_search": True, "sampling_param_best_of": 2}


def test_executor_errors_are_nvidias_words(beam_packed: TritonServer) -> None:
    """Issue 34: what 1.2.1's PyTorch executor and LLM API refuse, as upstream's model sends it: every
    request whose beam width is not max_beam_width (a width-1 request too), beam search with several
    log probs, a prompt over max_num_tokens without chunked prefill."""
    for prompt, params, message in (
        ("Hello", {"sampling_param_max_tokens": 4}, nv_beam_width(1, 2)),
        ("Hello", {**BEAMS, "sampling_param_logprobs": 2}, "Beam search does not support multiple logprobs"),
        (
            PROMPT + " " + PROMPT,
            {**BEAMS, "sampling_param_max_tokens": 4},
            "should not exceed max_num_tokens (16)",
        ),
    ):
        result = run(beam_packed, prompt, **params)
        assert result.error is not None and "Error generating request: " in result.error, result.error
        assert message in result.error and "invalid request: " not in result.error, result.error
    served = run(beam_packed, "Hello", **BEAMS, sampling_param_max_tokens=4)
    assert served.error is None and served.text


def nv_beam_width(bw: int, mbw: int) -> str:
    return f"Request beam width {bw} is not equal to max_beam_width {mbw}. This is not supported!"


def test_max_tokens_beyond_max_seq_len_is_clamped_not_refused(beam_packed: TritonServer) -> None:
    """The PyTorch backend clamps max_tokens to what max_seq_len leaves (a warning in the log)."""
    result = run(
        beam_packed,
        "Hello",
        **BEAMS,
        sampling_param_max_tokens=5000,
        sampling_param_end_id=-1,
        return_num_output_tokens=True,
    )
    assert result.error is None, result.error
    assert 0 < int(final(result, "num_output_tokens")) <= 64
    assert "is greater than deduced `default_max_tokens`" in beam_packed.log()
