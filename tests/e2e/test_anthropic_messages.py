"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) with the official
`anthropic` SDK, through `bentoml serve .` on both flavours.

The demo model has random weights: greedy answers are compared with the chat completion of the same
conversation (a message is a chat choice underneath), and a forced tool call parses only because
guided decoding allows nothing else. API keys, 429 and 529 are in test_openai_errors_auth.py's keyed
service; thinking blocks in test_reasoning_models.py.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.e2e.conftest import BentoService

SYSTEM = "You are a terse assistant."
QUESTION = "Tell me a story about a dog."
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 16}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
GREEDY = {"temperature": 0}  # the SDK (2.x) takes sampling fields through extra_body


@pytest.fixture(scope="module")
def claude(service: BentoService) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=service.url, api_key="unused", max_retries=0, timeout=120)


def _text(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


@pytest.mark.box
def test_a_message_is_the_chat_completion_streamed_or_not(
    claude: anthropic.Anthropic, client: openai.OpenAI, model_name: str
) -> None:
    chat = client.chat.completions.create(
        model=model_name,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        max_tokens=24,
        temperature=0,
    )
    params: dict[str, Any] = {
        "model": model_name,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": 24,
        "extra_body": GREEDY,
    }
    message = claude.messages.create(**params)
    assert message.type == "message" and message.role == "assistant" and message.model == model_name
    assert message.id.startswith("msg_") and message._request_id
    assert _text(message) == chat.choices[0].message.content
    assert chat.usage is not None
    usage = message.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == chat.usage.prompt_tokens
    assert usage.output_tokens == chat.usage.completion_tokens
    expected = "max_tokens" if chat.choices[0].finish_reason == "length" else "end_turn"
    assert message.stop_reason == expected and message.stop_sequence is None

    with claude.messages.stream(**params) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == _text(message)
    assert _text(final) == _text(message) and final.stop_reason == expected
    assert final.usage.output_tokens == usage.output_tokens

    # Token by token: 256 tokens, not 24, which the tiny model can make in one of the worker's
    # reads while the machine is busy (seen with two test processes): they then go out as one delta.
    long = {**params.pop("extra_body"), **params, "max_tokens": 256, "ignore_eos": True, "stream": True}
    raw = httpx.post(f"{str(claude.base_url).rstrip('/')}/v1/messages", json=long, timeout=60)
    kinds = [line.removeprefix("event: ") for line in raw.text.splitlines() if line.startswith("event: ")]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_delta") > 1, kinds
    assert raw.headers["content-type"].startswith("text/event-stream") and raw.headers["request-id"]


def test_stop_sequences_end_the_answer_and_say_which(claude: anthropic.Anthropic, model_name: str) -> None:
    params: dict[str, Any] = {
        "model": model_name,
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": 32,
        "extra_body": GREEDY,
    }
    whole = _text(claude.messages.create(**params))
    stop = whole[6:9]
    assert len(stop) == 3, whole
    cut = whole[: whole.index(stop)]
    never = "\x07never\x07"
    for stream in (False, True):
        sent = {**params, "stop_sequences": [never, stop]}
        if stream:
            with claude.messages.stream(**sent) as events:
                message = events.get_final_message()
        else:
            message = claude.messages.create(**sent)
        assert (_text(message), message.stop_reason, message.stop_sequence) == (cut, "stop_sequence", stop)


@pytest.mark.box
def test_a_tool_round_trip(claude: anthropic.Anthropic, model_name: str) -> None:
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced: dict[str, Any] = {
        "model": model_name,
        "max_tokens": 120,
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "extra_body": GREEDY,
    }
    message = claude.messages.create(messages=asked, **forced)  # type: ignore[arg-type]  # the options as a plain dict
    (call,) = message.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    assert message.stop_reason == "tool_use"
    jsonschema.validate(call.input, WEATHER["input_schema"])

    with claude.messages.stream(messages=asked, **forced) as stream:  # type: ignore[arg-type]  # the options as a plain dict
        events = list(stream)
        final = stream.get_final_message()
    assert any(e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events)
    (streamed,) = final.content
    assert streamed.type == "tool_use" and streamed.input == call.input and final.stop_reason == "tool_use"

    answered = [
        *asked,
        {"role": "assistant", "content": [block.model_dump() for block in message.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C."}],
        },
    ]
    reply = claude.messages.create(
        model=model_name,
        max_tokens=16,
        tools=[WEATHER],  # type: ignore[list-item]  # the tool as a plain dict
        tool_choice={"type": "none"},
        messages=answered,  # type: ignore[arg-type]  # messages as plain dicts
        extra_body=GREEDY,
    )
    assert (
        reply.content and reply.content[0].type == "text" and reply.stop_reason in ("end_turn", "max_tokens")
    )
    counted = claude.messages.count_tokens(
        model=model_name,
        tools=[WEATHER],  # type: ignore[list-item]  # the tool as a plain dict
        messages=answered,  # type: ignore[arg-type]  # messages as plain dicts
    )
    assert counted.input_tokens == reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0)
    plain = claude.messages.count_tokens(model=model_name, messages=asked)  # type: ignore[arg-type]  # messages as plain dicts
    assert 0 < plain.input_tokens < counted.input_tokens


def test_errors_in_anthropics_shape(claude: anthropic.Anthropic, model_name: str) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(
            model="claude-nope", max_tokens=4, messages=[{"role": "user", "content": "Hi"}]
        )
    body = missing.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "not_found_error" and "claude-nope" in body["error"]["message"]
    assert missing.value.request_id

    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(
            model=model_name,
            max_tokens=4,
            messages=[{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}],  # type: ignore[list-item]  # content the client's types refuse, on purpose
        )
    error = refused.value.body["error"]  # type: ignore[index]  # the error body is a dict
    assert error["type"] == "invalid_request_error" and "image" in error["message"]
    assert "messages[0].content[1]" in error["message"]

    url = f"{str(claude.base_url).rstrip('/')}/v1/messages"
    for body, named in (
        ({"model": model_name, "messages": [{"role": "user", "content": "Hi"}]}, "max_tokens"),
        ({"model": model_name, "max_tokens": 4, "messages": []}, "messages"),
        (
            {"model": model_name, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}], "n": 2},
            "n",
        ),
    ):
        answer = httpx.post(url, json=body, headers={"anthropic-version": "2023-06-01"}, timeout=30)
        assert answer.status_code == 400, body
        shaped = answer.json()
        assert set(shaped) >= {"type", "error"} and shaped["type"] == "error"
        assert shaped["error"]["type"] == "invalid_request_error" and named in shaped["error"]["message"]
    not_json = httpx.post(url, content=b"{", headers={"content-type": "application/json"}, timeout=30)
    assert not_json.status_code == 400 and not_json.json()["error"]["type"] == "invalid_request_error"
    wrong_method = httpx.get(url, timeout=30)
    assert wrong_method.status_code == 405 and wrong_method.json()["type"] == "error"
