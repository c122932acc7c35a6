"""Which HTTP error a client gets for an error response of Triton, fed as Triton's bytes
(tests.support.engine_response) to a real EngineStream."""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from tensorrtllm_backend.detokenizer import IncrementalDetokenizer
from tests.support import engine_response
from trtllm_service.errors import APIError
from trtllm_service.relay.client import EngineStream
from trtllm_service.relay.readers import TextReader, TokenIdReader
from trtllm_service.relay.request import GenerationRequest


def _error_of(tokenizer: Any, message: str) -> APIError:
    request = GenerationRequest(prompt_ids=array("i", [1]), max_tokens=10)
    stream = EngineStream(
        request, TokenIdReader(request, IncrementalDetokenizer(tokenizer)), "id", lambda _: None
    )
    stream.on_message(engine_response(error=message))
    with pytest.raises(APIError) as caught:
        stream.poll()
    return caught.value


@pytest.mark.parametrize(
    "message",
    [
        "Stub process 'tensorrt_llm_0_0' is not healthy.",  # Triton 2.51's Python backend, verbatim
        "in ensemble 'ensemble', Stub process 'preprocessing_0_0' is not healthy.",
    ],
)
def test_a_dead_python_stub_is_a_503_to_retry(tokenizer: Any, message: str) -> None:
    """The owner restarts Triton when a stub dies; until then its errors say: come back later."""
    error = _error_of(tokenizer, message)
    assert error.status == 503
    assert error.headers().get("Retry-After") == "10"
    assert message in error.body()["error"]["message"]


def test_a_refused_request_is_a_400_and_other_engine_errors_500s(tokenizer: Any) -> None:
    refused = _error_of(tokenizer, "invalid request: beam_width 5 exceeds the engine's max_beam_width 1")
    assert refused.status == 400
    assert refused.body()["error"]["message"] == "beam_width 5 exceeds the engine's max_beam_width 1"
    failed = _error_of(tokenizer, "CUDA error: an illegal memory access was encountered")
    assert failed.status == 500
    assert "is not healthy" not in failed.body()["error"]["message"]


# ---- the LLM API flavour: NVIDIA's errors as upstream's model sends them (issue 34, item 6) ----------


def _llmapi_error_of(message: str) -> APIError:
    request = GenerationRequest(prompt_ids=array("i", [1]), max_tokens=10)
    stream = EngineStream(request, TextReader(request), "id", lambda _: None)
    stream.on_message(engine_response(error=message))
    with pytest.raises(APIError) as caught:
        stream.poll()
    return caught.value


@pytest.mark.parametrize(
    ("said", "param", "code"),
    [
        (
            "The sum of prompt length (9.0), query length (0) should not exceed max_num_tokens (8)",
            None,
            "context_length_exceeded",
        ),
        (
            "Request beam width 1 is not equal to max_beam_width 4. This is not supported!",
            "use_beam_search",
            None,
        ),
        ("Beam search does not support multiple logprobs", "logprobs", None),
        ("selected index k out of range", "logprobs", None),
        ("require 0 <= top_p <= 1, got top_p=1.5", None, None),
    ],
)
def test_what_the_request_caused_is_a_400_with_nvidias_words(
    said: str, param: str | None, code: str | None
) -> None:
    error = _llmapi_error_of(f"Error generating request: {said}")
    assert error.status == 400 and (error.param, error.code) == (param, code)
    assert said in error.message and "Error generating request" not in error.message
    if code == "context_length_exceeded":
        assert "max_num_tokens" in error.message and "--enable-chunked-context" in error.message


@pytest.mark.parametrize(
    "said",
    [
        "fail to schedule any pending request, probably run out of resource.",
        "Can't allocate new blocks. No free blocks left.",
        "Executor loop failed: something internal",  # any other failure of the executor
    ],
)
def test_executor_trouble_is_a_503_with_retry_after(said: str) -> None:
    error = _llmapi_error_of(f"Error generating request: {said}")
    assert error.status == 503 and error.headers() == {"Retry-After": "5"}
    assert said in error.message and error.code == "service_unavailable"


def test_a_guide_the_engine_could_not_follow_is_a_brief_400() -> None:
    """What llguidance says mid-generation (the reference engine's words; the service checks a
    guide's first steps only) is the client's fault, not the engine's: a 400 that is not retried,
    without the parser's state and the grammar it quotes (645 KB for a 624 KB grammar)."""
    state = "\n<state>\nTokens: ⟦c⟧\n" + "root ::= " + " | ".join(f'"w{i}"' for i in range(50_000))
    said = "guided decoding: Parser Error: Current row has 2002 items; max is 2000" + state
    error = _llmapi_error_of(f"Error generating request: {said}")
    assert error.status == 400 and error.code == "invalid_value" and error.retry_after is None
    assert "max is 2000" in error.message and len(error.message) < 600, error.message


def test_every_engine_message_is_brief() -> None:
    error = _llmapi_error_of("Error generating request: something internal " + "x" * 100_000)
    assert error.status == 503 and len(error.message) < 600
