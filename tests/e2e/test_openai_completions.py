"""`/v1/completions` through the official `openai` client against `bentoml serve .`.

Raw prompts, no chat template: the reference tokenizes them with BOS added, as the engine does.
"""

from __future__ import annotations

import asyncio
from typing import Any

import openai

from tests.openai_support import Reference

PROMPT = "Once upon a time, in a small village by the sea,"
OTHER = "The quick brown fox"
MAX_TOKENS = 24


def texts_by_index(chunks: list[Any]) -> dict[int, str]:
    out: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            out[choice.index] = out.get(choice.index, "") + choice.text
    return out


def test_greedy_completion_equals_transformers(
    client: openai.OpenAI, ref: Reference, model_name: str
) -> None:
    expected = ref.greedy(ref.prompt_ids(PROMPT), MAX_TOKENS)
    response = client.completions.create(
        model=model_name, prompt=PROMPT, temperature=0, max_tokens=MAX_TOKENS
    )
    assert response.object == "text_completion"
    assert response.id.startswith("cmpl-")
    assert response.model == model_name
    [choice] = response.choices
    assert choice.index == 0
    assert choice.text == expected.text
    assert choice.finish_reason == expected.finish_reason == "length"
    assert response.usage is not None
    assert response.usage.prompt_tokens == expected.prompt_tokens == len(ref.prompt_ids(PROMPT))
    assert response.usage.completion_tokens == expected.completion_tokens
    assert response.usage.total_tokens == expected.prompt_tokens + expected.completion_tokens


def test_several_prompts_times_n_choices(client: openai.OpenAI, ref: Reference, model_name: str) -> None:
    """Choice index = prompt_index * n + i; the prompts count once each in usage."""
    first = ref.greedy(ref.prompt_ids(PROMPT), MAX_TOKENS)
    other = ref.greedy(ref.prompt_ids(OTHER), MAX_TOKENS)
    response = client.completions.create(
        model=model_name, prompt=[PROMPT, OTHER], n=2, temperature=0, max_tokens=MAX_TOKENS
    )
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    assert [c.text for c in response.choices] == [first.text, first.text, other.text, other.text]
    assert response.usage is not None
    assert response.usage.prompt_tokens == first.prompt_tokens + other.prompt_tokens
    assert response.usage.completion_tokens == 2 * (first.completion_tokens + other.completion_tokens)

    with client.completions.create(
        model=model_name,
        prompt=[PROMPT, OTHER],
        n=2,
        temperature=0,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    ) as stream:
        chunks = list(stream)
    assert texts_by_index(chunks) == {0: first.text, 1: first.text, 2: other.text, 3: other.text}
    assert chunks[-1].choices == [] and chunks[-1].usage == response.usage


def test_echo_prepends_the_prompt(client: openai.OpenAI, ref: Reference, model_name: str) -> None:
    expected = ref.greedy(ref.prompt_ids(PROMPT), MAX_TOKENS)
    params = {"model": model_name, "prompt": PROMPT, "temperature": 0, "max_tokens": MAX_TOKENS, "echo": True}
    response = client.completions.create(**params)
    assert response.choices[0].text == PROMPT + expected.text
    assert response.usage is not None and response.usage.completion_tokens == expected.completion_tokens

    with client.completions.create(stream=True, **params) as stream:
        chunks = list(stream)
    assert chunks[0].choices[0].text == PROMPT
    assert texts_by_index(chunks) == {0: PROMPT + expected.text}


def test_async_streamed_completion_equals_non_streamed(service: Any, ref: Reference, model_name: str) -> None:
    expected = ref.greedy(ref.prompt_ids(OTHER), MAX_TOKENS)

    async def run() -> tuple[list[Any], str]:
        async with openai.AsyncOpenAI(base_url=f"{service.url}/v1", api_key="x", max_retries=0) as aclient:
            params = {"model": model_name, "prompt": OTHER, "temperature": 0, "max_tokens": MAX_TOKENS}
            stream = await aclient.completions.create(
                stream=True, stream_options={"include_usage": True}, **params
            )
            chunks = [chunk async for chunk in stream]
            whole = await aclient.completions.create(**params)
            return chunks, whole.choices[0].text

    chunks, whole = asyncio.run(run())
    *body, last = chunks
    assert texts_by_index(body) == {0: whole} and whole == expected.text
    assert len(body) >= 2  # text (tokens that arrive together share a chunk), then the finish chunk
    assert [c.finish_reason for chunk in body for c in chunk.choices if c.finish_reason] == ["length"]
    assert all(chunk.object == "text_completion" and chunk.usage is None for chunk in body)
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (
        expected.prompt_tokens,
        expected.completion_tokens,
    )


def test_stop_string_ends_the_completion(client: openai.OpenAI, ref: Reference, model_name: str) -> None:
    expected = ref.greedy(ref.prompt_ids(PROMPT), MAX_TOKENS)
    text = expected.text
    start = len(text) // 2
    stop = text[start : start + 3]
    cut = text.index(stop)
    params = {"model": model_name, "prompt": PROMPT, "temperature": 0, "max_tokens": MAX_TOKENS, "stop": stop}
    response = client.completions.create(**params)
    assert response.choices[0].text == text[:cut]
    assert response.choices[0].finish_reason == "stop"
    with client.completions.create(stream=True, **params) as stream:
        chunks = list(stream)
    assert texts_by_index(chunks) == {0: text[:cut]}
    assert [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason] == ["stop"]


def test_empty_prompt_completes_from_the_start_of_a_document(
    client: openai.OpenAI, ref: Reference, model_name: str
) -> None:
    bos = ref.tokenizer.bos_token_id
    expected = ref.greedy([bos], 8)
    response = client.completions.create(model=model_name, prompt="", temperature=0, max_tokens=8)
    assert response.choices[0].text == expected.text
    assert response.usage is not None and response.usage.prompt_tokens == 1
