"""`/v1/chat/completions` through the official `openai` client against `bentoml serve .`.

Greedy answers are compared with `transformers` on the packed checkpoint (chat template applied by
the tokenizer itself); counts and finish reasons with what that reference generated.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import pytest

from tests.openai_support import (
    TOKENS_METRIC,
    Reference,
    ended_requests,
    straddling_stop,
    wait_idle,
)
from tests.support import prometheus_metric, sent_request, wait_for

MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Tell me a story about a dog."},
]
MAX_TOKENS = 40


def stream_chunks(client: openai.OpenAI, **kwargs: Any) -> list[Any]:
    with client.chat.completions.create(stream=True, **kwargs) as stream:
        return list(stream)


def text_of(chunks: list[Any], index: int = 0) -> str:
    return "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices if c.index == index)


def test_greedy_chat_equals_transformers(client: openai.OpenAI, ref: Reference, model_name: str) -> None:
    expected = ref.greedy(ref.chat_ids(MESSAGES), MAX_TOKENS)
    response = client.chat.completions.create(
        model=model_name, messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS
    )
    assert response.object == "chat.completion"
    assert response.id.startswith("chatcmpl-")
    assert response.model == model_name
    [choice] = response.choices
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.text
    assert choice.finish_reason == expected.finish_reason == "length"
    assert response.usage is not None
    assert response.usage.prompt_tokens == expected.prompt_tokens
    assert response.usage.completion_tokens == expected.completion_tokens == MAX_TOKENS
    assert response.usage.total_tokens == expected.prompt_tokens + expected.completion_tokens


@pytest.mark.box
def test_streamed_chat_equals_non_streamed_with_a_usage_chunk(client: openai.OpenAI, model_name: str) -> None:
    """The streamed answer against the same request not streamed, from the same engine (on the GPU
    box the tiny random model's greedy near-ties differ from a CPU reference's; the non-streamed
    answer is held to that reference in test_greedy_chat_equals_transformers)."""
    whole = client.chat.completions.create(
        model=model_name, messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS
    )
    assert whole.usage is not None and whole.choices[0].finish_reason == "length"
    expected_text, usage = whole.choices[0].message.content, whole.usage
    chunks = stream_chunks(
        client,
        model=model_name,
        messages=MESSAGES,
        temperature=0,
        max_completion_tokens=MAX_TOKENS,
        stream_options={"include_usage": True},
    )
    assert len({chunk.id for chunk in chunks}) == 1
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert text_of(chunks) == expected_text
    assert len(chunks) >= 4, "role, text, finish reason and usage chunks"
    reasons = [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason]
    assert reasons == ["length"]

    *body, last = chunks
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.prompt_tokens == usage.prompt_tokens
    assert last.usage.completion_tokens == usage.completion_tokens == MAX_TOKENS
    assert last.usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert all(chunk.usage is None for chunk in body)


def test_async_client_streams_the_same_text(service: Any, ref: Reference, model_name: str) -> None:
    expected = ref.greedy(ref.chat_ids(MESSAGES), MAX_TOKENS)

    async def run() -> tuple[str, list[Any], str]:
        async with openai.AsyncOpenAI(base_url=f"{service.url}/v1", api_key="x", max_retries=0) as aclient:
            stream = await aclient.chat.completions.create(
                model=model_name, messages=MESSAGES, temperature=0, max_tokens=MAX_TOKENS, stream=True
            )
            chunks = [chunk async for chunk in stream]
            whole = await aclient.chat.completions.create(
                messages=MESSAGES, model=model_name, temperature=0, max_tokens=MAX_TOKENS
            )
            return text_of(chunks), chunks, whole.choices[0].message.content or ""

    streamed, chunks, whole = asyncio.run(run())
    assert streamed == whole == expected.text
    assert all(chunk.usage is None for chunk in chunks), "no usage chunk unless asked for"


def test_unset_max_tokens_fills_what_is_left_of_the_context(
    client: openai.OpenAI, ref: Reference, model_name: str
) -> None:
    words = 1
    while len(ref.chat_ids([{"role": "user", "content": "go " * words}])) < 2040:
        words += 64
    while len(ref.chat_ids([{"role": "user", "content": "go " * words}])) > 2040:
        words -= 1
    messages = [{"role": "user", "content": "go " * words}]
    ids = ref.chat_ids(messages)
    left = 2048 - len(ids)
    expected = ref.greedy(ids, left)
    response = client.chat.completions.create(model=model_name, messages=messages, temperature=0)
    assert response.usage is not None
    assert response.usage.prompt_tokens == len(ids)
    assert response.usage.completion_tokens == expected.completion_tokens
    assert response.choices[0].message.content == expected.text
    assert response.choices[0].finish_reason == expected.finish_reason
    if expected.finish_reason == "length":
        assert response.usage.completion_tokens == left


def test_stop_string_spanning_two_tokens_never_leaks(
    client: openai.OpenAI, ref: Reference, model_name: str
) -> None:
    """A stop string split across two engine responses (two tokens) ends the text right before it."""
    base = {"model": model_name, "messages": MESSAGES, "temperature": 0, "max_tokens": MAX_TOKENS}
    pieces = ref.token_texts(ref.chat_ids(MESSAGES), MAX_TOKENS)
    text = "".join(pieces)
    stop, start = straddling_stop(pieces)
    assert all(stop not in piece for piece in pieces), "it spans a token boundary"
    assert text == ref.greedy(ref.chat_ids(MESSAGES), MAX_TOKENS).text

    response = client.chat.completions.create(stop=[stop, "never-seen-stop"], **base)
    assert response.choices[0].message.content == text[:start]
    assert response.choices[0].finish_reason == "stop"
    assert response.usage is not None and response.usage.completion_tokens < MAX_TOKENS

    chunks = stream_chunks(client, stop=stop, **base)
    streamed = [c.delta.content or "" for chunk in chunks for c in chunk.choices]
    assert "".join(streamed) == text[:start]
    assert [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason] == ["stop"]


@pytest.mark.box
def test_n_choices_with_a_seed_differ_and_reproduce(client: openai.OpenAI, model_name: str) -> None:
    params = {"model": model_name, "messages": MESSAGES, "temperature": 1.0, "max_tokens": 12, "seed": 1234}
    first = client.chat.completions.create(n=3, **params)
    second = client.chat.completions.create(n=3, **params)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in second.choices]
    assert len(set(texts)) > 1, texts
    assert first.usage is not None
    assert first.usage.completion_tokens == 3 * 12  # summed over the choices
    assert first.usage.prompt_tokens == second.usage.prompt_tokens  # the prompt counts once

    # choice i samples with seed + i
    single = client.chat.completions.create(n=1, **{**params, "seed": 1235})
    assert single.choices[0].message.content == texts[1]

    chunks = stream_chunks(client, n=3, stream_options={"include_usage": True}, **params)
    assert [text_of(chunks, i) for i in range(3)] == texts
    assert sorted(c.index for chunk in chunks for c in chunk.choices if c.delta.role) == [0, 1, 2]
    assert sorted(c.index for chunk in chunks for c in chunk.choices if c.finish_reason) == [0, 1, 2]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3 * 12

    unseeded = client.chat.completions.create(n=3, **{**params, "seed": None})
    assert len({c.message.content for c in unseeded.choices}) > 1


def test_client_disconnect_stops_the_engine_requests(service: Any, model_name: str) -> None:
    """Closing a stream (n=2) or abandoning a non-streamed request ends their engine requests."""
    long = {
        "model": model_name,
        "messages": MESSAGES,
        "max_tokens": 1500,
        "ignore_eos": True,
        "temperature": 0,
    }
    assert wait_idle(service.metrics_url)
    before = ended_requests(service.metrics_url)
    with httpx.Client(base_url=f"{service.url}/v1", timeout=30) as http:
        with http.stream("POST", "/chat/completions", json={**long, "n": 2, "stream": True}) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            for _ in range(8):
                next(lines)
        deadline = time.monotonic() + 5
        while ended_requests(service.metrics_url) < before + 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ended_requests(service.metrics_url) == before + 2

        # Abandoned once the engine is seen generating for it, however fast the engine is.
        tokens = prometheus_metric(service.metrics_url, TOKENS_METRIC)
        with sent_request(service.url, "/v1/chat/completions", long):
            assert wait_for(lambda: prometheus_metric(service.metrics_url, TOKENS_METRIC) > tokens, 10, 0.01)
        deadline = time.monotonic() + 5
        while ended_requests(service.metrics_url) < before + 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ended_requests(service.metrics_url) == before + 3

    tokens = prometheus_metric(service.metrics_url, TOKENS_METRIC)
    time.sleep(0.5)
    assert prometheus_metric(service.metrics_url, TOKENS_METRIC) == tokens, "the engine is still generating"


def test_a_long_answer_streams_as_it_is_generated(
    service: Any, client: openai.OpenAI, model_name: str
) -> None:
    """Text arrives while the engine generates, not at the end: when the first text is read, the
    engine has made a small part of the answer (a wall-clock bound would depend on the engine's
    speed). How many events it takes depends on the client: tokens that arrive while a slow
    client is still reading share the next event."""
    assert wait_idle(service.metrics_url)
    before = prometheus_metric(service.metrics_url, TOKENS_METRIC)
    made_at_first_text = None
    events = 0
    stream = client.chat.completions.create(
        model=model_name,
        messages=MESSAGES,
        temperature=0,
        max_tokens=1800,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            events += 1
            if made_at_first_text is None:
                made_at_first_text = prometheus_metric(service.metrics_url, TOKENS_METRIC) - before
    assert made_at_first_text is not None
    assert made_at_first_text < 1800 / 4, f"the first text came after {made_at_first_text} tokens"
    # The model counts in Python and hands the counts to Triton's metrics every 0.1 s (see
    # triton_adapter.Counters): the last tokens show a moment after the answer ended.
    assert wait_for(lambda: prometheus_metric(service.metrics_url, TOKENS_METRIC) - before == 1800, timeout=2)
    assert events >= 3, events
