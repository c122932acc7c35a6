"""Log probabilities through `bentoml serve`, with the official openai client, on both flavours.

The expected numbers come from an independent `transformers` forward pass over the same tokens
(tests/openai_support.Reference); the token ids behind the response's `bytes` come from the
tokenizer's vocabulary, mapped with transformers' own byte table.
"""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest

from tests.openai_support import Reference

MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]
TOL = 2e-3


def _ids(ref: Reference, content: list) -> list[int]:
    return [ref.ids_by_bytes[bytes(entry.bytes)] for entry in content]


def test_chat_logprobs_equal_an_independent_forward_pass(
    client: openai.OpenAI, model_name: str, ref: Reference
) -> None:
    prompt = ref.chat_ids(MESSAGES)
    expected_ids = ref.generated_ids(prompt, 24)
    out = client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=24, temperature=0, logprobs=True, top_logprobs=5
    )
    choice = out.choices[0]
    content = choice.logprobs.content
    assert _ids(ref, content) == expected_ids
    assert out.usage.completion_tokens == len(content)
    added = set(ref.tokenizer.added_tokens_decoder)  # special tokens: in logprobs, not in the text
    shown = b"".join(bytes(e.bytes) for e, i in zip(content, expected_ids, strict=True) if i not in added)
    assert shown.decode(errors="replace") == choice.message.content
    table = ref.log_softmax(prompt, expected_ids)
    for position, entry in enumerate(content):
        token = expected_ids[position]
        assert entry.logprob == pytest.approx(float(table[position, token]), abs=TOL)
        top = entry.top_logprobs
        assert len(top) == 5
        values = [t.logprob for t in top]
        assert values == sorted(values, reverse=True)
        best = table[position].topk(5)
        assert values == pytest.approx(best.values.tolist(), abs=TOL)
        # Greedy: the sampled token is the most likely one, so it leads the top list.
        assert top[0].token == entry.token and top[0].bytes == entry.bytes
        assert [ref.ids_by_bytes.get(bytes(t.bytes)) for t in top] == best.indices.tolist()


def test_logprobs_are_taken_before_temperature(
    client: openai.OpenAI, model_name: str, ref: Reference
) -> None:
    """Sampling at temperature 1.7: each token's logprob is still the model's raw log-softmax."""
    out = client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=16, temperature=1.7, seed=11, logprobs=True
    )
    content = out.choices[0].logprobs.content
    ids = _ids(ref, content)
    table = ref.log_softmax(ref.chat_ids(MESSAGES), ids)
    for position, entry in enumerate(content):
        assert entry.top_logprobs == []
        assert entry.logprob == pytest.approx(float(table[position, ids[position]]), abs=TOL)


@pytest.mark.box
def test_streamed_logprobs_equal_the_non_streamed(client: openai.OpenAI, model_name: str) -> None:
    kwargs = {"model": model_name, "messages": MESSAGES, "max_tokens": 20, "temperature": 0}
    whole = client.chat.completions.create(**kwargs, logprobs=True, top_logprobs=3)
    streamed, text = [], ""
    for chunk in client.chat.completions.create(**kwargs, logprobs=True, top_logprobs=3, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs is not None:
                streamed += choice.logprobs.content
    assert text == whole.choices[0].message.content
    expected = whole.choices[0].logprobs.content
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in expected]


def test_no_logprobs_unless_asked(client: openai.OpenAI, model_name: str) -> None:
    out = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=4)
    assert out.choices[0].logprobs is None


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_shapes(
    client: openai.OpenAI, model_name: str, ref: Reference, stream: bool
) -> None:
    prompt = "The sea is"
    kwargs = {"model": model_name, "prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 3}
    if stream:
        tokens, values, tops, offsets, text = [], [], [], [], ""
        for chunk in client.completions.create(**kwargs, echo=True, stream=True):
            for choice in chunk.choices:
                text += choice.text
                if choice.logprobs is not None:
                    tokens += choice.logprobs.tokens
                    values += choice.logprobs.token_logprobs
                    tops += choice.logprobs.top_logprobs
                    offsets += choice.logprobs.text_offset
    else:
        out = client.completions.create(**kwargs, echo=True)
        lp = out.choices[0].logprobs
        text, tokens, values, tops, offsets = (
            out.choices[0].text,
            lp.tokens,
            lp.token_logprobs,
            lp.top_logprobs,
            lp.text_offset,
        )
    prompt_ids = ref.prompt_ids(prompt)
    expected_ids = ref.generated_ids(prompt_ids, 12)
    table = ref.log_softmax(prompt_ids, expected_ids)
    # echo: the prompt's tokens first (BOS among them, as the engine got them; the first without a
    # log probability), then the answer's.
    n = len(tokens) - len(expected_ids)
    assert n == len(prompt_ids) and len(tokens) == len(values) == len(tops) == len(offsets)
    assert "".join(tokens[:n]).endswith(prompt) and values[0] is None and offsets[0] == 0
    assert all(isinstance(v, float) for v in values[1:n])
    tokens, values, tops, offsets = tokens[n:], values[n:], tops[n:], offsets[n:]
    assert text.startswith(prompt) and "".join(tokens) == text[len(prompt) :]
    assert offsets[0] == len(prompt)
    assert all(text[o:].startswith(t) for o, t in zip(offsets, tokens, strict=True))
    for position, (value, top) in enumerate(zip(values, tops, strict=True)):
        assert value == pytest.approx(float(table[position, expected_ids[position]]), abs=TOL)
        # Up to 3: tokens that show as the same text (stray bytes, U+FFFD) share one key.
        assert 1 <= len(top) <= 3
        assert list(top.values()) == pytest.approx(
            table[position].topk(3).values.tolist()[: len(top)], abs=TOL
        )
        assert tokens[position] in top  # greedy: the sampled token is the most likely


def test_logprob_limits_are_400s(service, model_name: str) -> None:
    cases = [
        (
            "/v1/chat/completions",
            {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21},
            "top_logprobs",
        ),
        ("/v1/chat/completions", {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": 3}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "logprobs": 6}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "logprobs": -1}, "logprobs"),
    ]
    for route, body, param in cases:
        response = httpx.post(f"{service.url}{route}", json={"model": model_name, **body}, timeout=30)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"]["param"] == param, response.text
    ok = httpx.post(
        f"{service.url}/v1/chat/completions",
        # Greedy: sampled, the second token may be the end of the answer (one entry, rightly).
        json={"model": model_name, "messages": MESSAGES, "max_tokens": 2, "logprobs": True, "temperature": 0},
        timeout=30,
    )
    assert ok.status_code == 200
    assert ok.json()["choices"][0]["finish_reason"] == "length", ok.text
    entries = ok.json()["choices"][0]["logprobs"]["content"]
    assert len(entries) == 2 and all(math.isfinite(e["logprob"]) and e["logprob"] <= 0 for e in entries)
    json.dumps(ok.json())
