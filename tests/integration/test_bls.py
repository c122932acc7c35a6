"""`tensorrt_llm_bls`: the same pipeline as the ensemble, driven from one Python model."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from tests.support import StreamResult, TritonServer, check_cancellation, run_stream, tensor, text_inputs

pytestmark = pytest.mark.integration

BLS = "tensorrt_llm_bls"
PROMPTS = [
    "Hello",
    "中文是世界上使用人数最多的语言之一。",
    "Great job 👍🏽 thanks! The family 👨‍👩‍👧 went",
    "Viele Grüße aus München! Die Straße ist",
]


def rid() -> str:
    return uuid.uuid4().hex


def ok(result: StreamResult) -> StreamResult:
    assert result.error is None, result.error
    return result


def count(result: StreamResult, name: str) -> int:
    """num_input_tokens (each response carries it) or num_output_tokens (each response counts its own)."""
    return result.total(name) if name == "num_output_tokens" else int(result.last(name).reshape(-1)[0])


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 99}])
def test_bls_stream_equals_ensemble_text(triton: TritonServer, sampling: dict[str, float]) -> None:
    references = {}
    for prompt in PROMPTS:
        reference = ok(run_stream(triton.grpc_url, text_inputs(prompt, 48, **sampling), request_id=rid()))
        references[prompt] = reference.text
        streamed = ok(
            run_stream(
                triton.grpc_url, text_inputs(prompt, 48, stream=True, **sampling), model=BLS, request_id=rid()
            )
        )
        assert streamed.text == reference.text, prompt
        assert len(streamed.chunks) > 10, "the BLS did not stream"
        for chunk in streamed.chunks:
            chunk.decode("utf-8")
        assert count(streamed, "num_output_tokens") == count(reference, "num_output_tokens")
        assert count(streamed, "num_input_tokens") == count(reference, "num_input_tokens")

    # Without a request id of the client's own, too: the BLS keys the decoder itself.
    for prompt in PROMPTS[:2]:
        anonymous = ok(
            run_stream(triton.grpc_url, text_inputs(prompt, 48, stream=True, **sampling), model=BLS)
        )
        assert anonymous.text == references[prompt], prompt


def test_bls_non_streamed_equals_ensemble_text(triton: TritonServer) -> None:
    prompt = "Once upon a time, in a small village by the sea,"
    reference = ok(run_stream(triton.grpc_url, text_inputs(prompt, 30), request_id=rid()))
    whole = ok(run_stream(triton.grpc_url, text_inputs(prompt, 30), model=BLS, request_id=rid()))
    assert whole.text == reference.text


def test_bls_stop_words_and_errors(triton: TritonServer) -> None:
    bad = run_stream(triton.grpc_url, text_inputs("", 5, stream=True), model=BLS, request_id=rid())
    assert bad.error is not None and "text_input" in bad.error
    too_long = run_stream(triton.grpc_url, text_inputs("Hello", 2047), model=BLS, request_id=rid())
    assert too_long.error is not None and "max_seq_len" in too_long.error
    wrong_type = run_stream(
        triton.grpc_url,
        [tensor("text_input", ["Hello"]), tensor("max_tokens", 5.0, np.float32)],
        model=BLS,
        request_id=rid(),
    )
    assert wrong_type.error is not None and "INT32" in wrong_type.error
    good = ok(run_stream(triton.grpc_url, text_inputs("Hello", 4, stream=True), model=BLS, request_id=rid()))
    assert count(good, "num_output_tokens") == 4


def test_bls_closing_the_stream_cancels_the_engine_request(triton: TritonServer) -> None:
    # The BLS may end its engine request by cancelling it or with the engine's `stop` input.
    check_cancellation(triton, BLS, ("cancelled", "stopped"))
