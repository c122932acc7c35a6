"""The `ensemble` model as clients use it: streaming, concurrency, cancellation, bad requests, wire compat."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import numpy as np
import pytest

from tests.support import (
    REQUESTS_METRIC,
    Streamer,
    StreamResult,
    TritonServer,
    check_cancellation,
    engine_inputs,
    output_ids,
    run_stream,
    tensor,
    text_inputs,
    upstream_client_text,
    wait_engine_idle,
    wait_for,
)

pytestmark = pytest.mark.integration

PROMPTS = [
    "Hello",
    "The quick brown fox jumps over",
    "Once upon a time, in a small village by the sea,",
    "中文是世界上使用人数最多的语言之一。",
    "日本語は面白いです。東京は",
    "Great job 👍🏽 thanks! The family 👨‍👩‍👧 went",
    "Le café était plein ; nous avons pris un thé",
    "def generate(model, prompt: str) -> list[int]:\n    ids =",
    "Q: What is the capital of France?\nA:",
    "Viele Grüße aus München! Die Straße ist",
]


def rid() -> str:
    return uuid.uuid4().hex


def ok(result: StreamResult) -> StreamResult:
    assert result.error is None, result.error
    return result


def count(result: StreamResult, name: str = "num_output_tokens") -> int:
    """num_input_tokens (each response carries it) or num_output_tokens (each response counts its own)."""
    return result.total(name) if name == "num_output_tokens" else int(result.last(name).reshape(-1)[0])


# ---- streaming text --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sampling",
    [{}, {"temperature": 1.0, "top_k": 0, "top_p": 1.0}],
    ids=["greedy", "sampled"],
)
def test_streamed_text_equals_non_streamed_text(triton: TritonServer, sampling: dict[str, float]) -> None:
    """The deltas of a stream concatenate, byte for byte, to the text of the same request unstreamed.

    The random demo model emits many byte-level tokens that split characters, so the decoder has to
    hold text back and release it correctly; sampled runs make that happen a lot.
    """
    held_back = 0
    for index, prompt in enumerate(PROMPTS):
        params = dict(sampling, seed=1000 + index) if sampling else {}
        whole = ok(run_stream(triton.grpc_url, text_inputs(prompt, 60, **params), request_id=rid()))
        streamed = ok(
            run_stream(triton.grpc_url, text_inputs(prompt, 60, stream=True, **params), request_id=rid())
        )
        assert streamed.text == whole.text, f"prompt {index}: {prompt!r}"
        assert count(streamed) == count(whole)
        # Every delta on the wire is valid UTF-8 on its own.
        for chunk in streamed.chunks:
            chunk.decode("utf-8")
        if not sampling:
            # Without a request id an unstreamed request is decoded whole: the same text again.
            anonymous = ok(run_stream(triton.grpc_url, text_inputs(prompt, 60)))
            assert anonymous.text == whole.text
        held_back += sum(1 for chunk in streamed.chunks[:-1] if not chunk)
    # The point of this test: tokens that end inside a character, so the decoder has to hold text back.
    assert held_back > 0


def test_long_stream_equals_non_streamed_text(triton: TritonServer) -> None:
    """Past 512 tokens the decoder trims its window: the text must not change there either."""
    params = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 4242, "end_id": -1}
    prompt = "Il était une fois"
    whole = ok(run_stream(triton.grpc_url, text_inputs(prompt, 600, **params), request_id=rid()))
    streamed = ok(
        run_stream(triton.grpc_url, text_inputs(prompt, 600, stream=True, **params), request_id=rid())
    )
    assert count(whole) == 600
    assert streamed.text == whole.text


# ---- exclude_input_in_output ----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_exclude_input_in_output(triton: TritonServer, stream: bool) -> None:
    prompt = "Où est la gare ? Là-bas, à côté de l'hôtel."
    default = ok(run_stream(triton.grpc_url, text_inputs(prompt, 20, stream=stream), request_id=rid()))
    excluded = ok(
        run_stream(
            triton.grpc_url,
            text_inputs(prompt, 20, stream=stream, exclude_input_in_output=True),
            request_id=rid(),
        )
    )
    echoed = ok(
        run_stream(
            triton.grpc_url,
            text_inputs(prompt, 20, stream=stream, exclude_input_in_output=False),
            request_id=rid(),
        )
    )
    assert default.text == excluded.text
    assert not default.text.startswith(prompt)
    assert echoed.text.startswith(prompt)
    assert echoed.text == prompt + default.text
    assert count(default) == 20
    # NVIDIA's num_output_tokens counts the tokens each response carries: the echoed prompt too
    assert count(echoed) == 20 + count(echoed, "num_input_tokens")


# ---- concurrency -------------------------------------------------------------------------------------


def test_concurrent_streams_each_get_their_own_text(triton: TritonServer) -> None:
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} (variant {i})" for i in range(16)]

    def inputs(i: int) -> list[Any]:
        return text_inputs(prompts[i], 40, stream=i % 2 == 0)

    alone = [ok(run_stream(triton.grpc_url, inputs(i), request_id=rid())).text for i in range(16)]
    assert len(set(alone)) > 1

    results: list[StreamResult | None] = [None] * 16
    errors: list[BaseException] = []
    barrier = threading.Barrier(16)

    def worker(i: int) -> None:
        try:
            with Streamer(triton.grpc_url) as streamer:
                barrier.wait(timeout=60)
                streamer.send(inputs(i), request_id=rid())
                results[i] = streamer.collect(timeout=120)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert not errors, errors
    for i, result in enumerate(results):
        assert result is not None, f"stream {i} got nothing"
        assert result.error is None, f"stream {i}: {result.error}"
        assert result.text == alone[i], f"stream {i} ({prompts[i]!r})"


# ---- cancellation -----------------------------------------------------------------------------------


def test_stop_request_ends_an_ensemble_stream_in_the_engine(triton: TritonServer) -> None:
    """Triton 2.51's ensemble does not reliably pass a cancelled stream on to a running engine
    step, so a client of the ensemble also sends TRT-LLM's `stop` request (our service does this
    on every disconnect); whichever arrives first ends the request in the engine."""
    check_cancellation(triton, "ensemble", ("cancelled", "stopped"), stop_request=True)


def test_direct_engine_stream_cancellation(triton: TritonServer, tokenizer: Any) -> None:
    """The engine itself notices a cancelled gRPC stream (the baseline the ensemble relies on)."""
    assert wait_engine_idle(triton)
    before = triton.metric(REQUESTS_METRIC, outcome="cancelled")
    streamer = Streamer(triton.grpc_url)
    try:
        streamer.send(
            engine_inputs(tokenizer.encode("Hello"), 1500, streaming=True),
            model="tensorrt_llm",
            request_id=rid(),
        )
        partial = streamer.collect(max_responses=3, timeout=60)
        assert partial.error is None, partial.error
        streamer.client.stop_stream(cancel_requests=True)
        assert wait_for(
            lambda: triton.metric(REQUESTS_METRIC, outcome="cancelled") == before + 1, timeout=3.0
        )
        assert wait_engine_idle(triton, quiet=1.0, timeout=3.0)
    finally:
        streamer.client.close()
        wait_engine_idle(triton)


# ---- bad requests -----------------------------------------------------------------------------------

BAD_REQUESTS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "empty_prompt": (lambda: text_inputs("", 5), ("text_input", "empty")),
    # NVIDIA's executor's words for request_output_len <= 0 (requestImpl validate)
    "max_tokens_0": (lambda: text_inputs("Hello", 0), ("max_tokens", "mMaxNewTokens > 0")),
    "max_tokens_negative": (lambda: text_inputs("Hello", -3), ("max_tokens", "mMaxNewTokens > 0")),
    "too_long": (lambda: text_inputs("Hello world " * 20, 2040), ("max_seq_len", "2048")),
    "max_tokens_fp32": (
        lambda: [tensor("text_input", ["Hello"]), tensor("max_tokens", 5.0, np.float32)],
        ("max_tokens", "FP32", "INT32"),
    ),
    "unknown_input": (
        lambda: [*text_inputs("Hello", 5), tensor("no_such_input", 1, np.int32)],
        ("unexpected inference input", "no_such_input"),
    ),
    "missing_max_tokens": (lambda: [tensor("text_input", ["Hello"])], ("max_tokens",)),
    "stop_word_not_utf8": (
        lambda: [*text_inputs("Hello", 5), tensor("stop_words", np.array([[b"\xff\xfe"]], dtype=np.object_))],
        ("utf-8",),
    ),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_request_gets_a_clear_error_and_the_server_serves_on(triton: TritonServer, case: str) -> None:
    make_inputs, phrases = BAD_REQUESTS[case]
    for stream in (False, True):
        inputs = make_inputs()
        if stream:
            inputs.append(tensor("stream", True, np.bool_))
        result = run_stream(triton.grpc_url, inputs, request_id=rid())
        assert result.error is not None, f"{case}: no error (text {result.text!r})"
        message = result.error.lower()
        assert any(phrase.lower() in message for phrase in phrases), f"{case}: unclear error {result.error!r}"
        assert not result.chunks, f"{case}: text came back with the error"

        good = ok(run_stream(triton.grpc_url, text_inputs("Hello", 3, stream=stream), request_id=rid()))
        assert count(good) == 3
        assert good.text


# ---- wire compatibility -----------------------------------------------------------------------------


def upstream_inputs(prompt: str, max_tokens: int, stream: bool) -> list[Any]:
    """Exactly what upstream's end_to_end_grpc_client.py builds for the basic case."""
    return [
        tensor("text_input", np.array([[prompt]], dtype=object)),
        tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32)),
        tensor("stream", np.array([[stream]], dtype=bool)),
        tensor("temperature", np.array([[1.0]], dtype=np.float32)),
    ]


@pytest.fixture(scope="module")
def upstream_case(triton: TritonServer, tokenizer: Any) -> tuple[str, int, str]:
    """A prompt, max_tokens and the expected text; the text ends in a whole character, so that no
    decoder has a reason to hold any of it back until the last response."""
    max_tokens = 24
    for prompt in ("Roses are red,", "SELECT name, count(*) FROM", "Hello world, this is a test of"):
        ids = output_ids(
            ok(
                run_stream(
                    triton.grpc_url, engine_inputs(tokenizer.encode(prompt), max_tokens), model="tensorrt_llm"
                )
            )
        )
        expected = tokenizer.decode(ids, skip_special_tokens=True)
        if len(ids) == max_tokens and not {1025, 1033} & set(ids) and not expected.endswith("\ufffd"):
            return prompt, max_tokens, expected
    pytest.fail("no prompt with a clean greedy ending")


@pytest.mark.parametrize("request_id", ["", "1"], ids=["no_request_id", "request_id"])
def test_upstream_client_non_streamed(
    triton: TritonServer, tokenizer: Any, upstream_case: tuple[str, int, str], request_id: str
) -> None:
    """An unmodified upstream client: no requested outputs, keeps the text of the last response.

    Upstream's C++ engine answers a non-streamed request with exactly one (final) response.
    """
    prompt, max_tokens, expected = upstream_case
    text, results = upstream_client_text(
        triton.grpc_url, upstream_inputs(prompt, max_tokens, False), request_id=request_id
    )
    last = results[-1]
    assert isinstance(last.as_numpy("text_output")[0], bytes)
    assert text == expected, f"{len(results)} responses: {[r.as_numpy('text_output')[0] for r in results]}"
    # As from the C++ backend, counts and log probs come only when the request asks for them.
    for name in ("num_input_tokens", "num_output_tokens", "cum_log_probs", "output_log_probs"):
        assert last.as_numpy(name) is None, name
    asked = [
        *upstream_inputs(prompt, max_tokens, False),
        tensor("return_num_input_tokens", np.array([[True]])),
    ]
    asked.append(tensor("return_num_output_tokens", np.array([[True]])))
    asked.append(tensor("return_log_probs", np.array([[True]])))
    _, counted = upstream_client_text(triton.grpc_url, asked, request_id=request_id)
    assert int(counted[-1].as_numpy("num_input_tokens").reshape(-1)[0]) == len(tokenizer.encode(prompt))
    assert int(counted[-1].as_numpy("num_output_tokens").reshape(-1)[0]) == max_tokens
    assert counted[-1].as_numpy("output_log_probs").size == max_tokens


def test_upstream_client_streamed(
    triton: TritonServer, tokenizer: Any, upstream_case: tuple[str, int, str]
) -> None:
    """Streamed, an upstream client appends `text_output[0]` of every response."""
    prompt, max_tokens, expected = upstream_case
    _, results = upstream_client_text(
        triton.grpc_url, upstream_inputs(prompt, max_tokens, True), request_id="7"
    )
    streamed = "".join(r.as_numpy("text_output")[0].decode("utf-8") for r in results)
    assert streamed == expected


def test_a_guide_passes_through_the_ensemble_and_the_bls(triton: TritonServer) -> None:
    """The C++ backend's guided-decoding inputs, sent to the ensemble and to the BLS, reach the
    engine: the random model answers only what the grammar allows."""
    guide = {"guided_decoding_guide_type": "ebnf_grammar", "guided_decoding_guide": 'root ::= "yes" | "no"'}
    for model in ("ensemble", "tensorrt_llm_bls"):
        for stream in (False, True):
            result = ok(
                run_stream(
                    triton.grpc_url,
                    text_inputs("Answer:", 30, stream=stream, **guide),
                    model=model,
                    request_id=rid(),
                )
            )
            assert result.text in ("yes", "no"), (model, stream, result.text)
