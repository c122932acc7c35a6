"""Tool calling through `bentoml serve .` with the official `openai` client, on both flavours.

The demo model has random weights and its chat template renders no tools, so the tools reach it in
Llama-3.1's JSON format, and a forced call parses only because guided decoding allows nothing else.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Adds two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_calls(message: Any, names: set[str]) -> list[tuple[str, dict[str, Any]]]:
    assert message.content is None and message.tool_calls, message
    calls = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        calls.append((call.function.name, arguments))
    return calls


@pytest.mark.box
def test_required_and_named_tool_choice_always_call_with_valid_arguments(
    client: openai.OpenAI, model_name: str
) -> None:
    seen = set()
    for seed in range(6):
        answer = client.chat.completions.create(
            model=model_name,
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice="required",
            seed=seed,
            max_tokens=200,
        )
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls"
        seen |= {name for name, _ in check_calls(choice.message, set(SCHEMAS))}
    assert seen, "no call was made"

    named = {"type": "function", "function": {"name": "add"}}
    for seed in range(3):
        answer = client.chat.completions.create(
            model=model_name, messages=MESSAGES, tools=TOOLS, tool_choice=named, seed=seed, max_tokens=200
        )
        assert [name for name, _ in check_calls(answer.choices[0].message, {"add"})] == ["add"]


@pytest.mark.box
def test_streamed_calls_assemble_to_the_same_call(client: openai.OpenAI, model_name: str) -> None:
    params: dict[str, Any] = {
        "model": model_name,
        "messages": MESSAGES,
        "tools": TOOLS,
        "tool_choice": "required",
        "seed": 7,
        "max_tokens": 200,
    }
    whole = client.chat.completions.create(**params).choices[0]
    with client.chat.completions.stream(**params) as stream:  # the client's own assembling helper
        for _ in stream:
            pass
        assembled = stream.get_final_completion().choices[0]
    assert assembled.finish_reason == "tool_calls"
    got = [(c.function.name, c.function.arguments) for c in assembled.message.tool_calls or []]
    assert got == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]

    chunks = list(client.chat.completions.create(stream=True, **params))
    pieces = [d for c in chunks for ch in c.choices for d in (ch.delta.tool_calls or [])]
    assert pieces and pieces[0].id and pieces[0].function.name == got[0][0]


def test_a_two_turn_loop_call_result_answer(client: openai.OpenAI, model_name: str) -> None:
    first = client.chat.completions.create(
        model=model_name, messages=MESSAGES, tools=TOOLS, tool_choice="required", seed=1, max_tokens=200
    )
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]  # tool_choice required: a call
    conversation = [
        *MESSAGES,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21})},
    ]
    second = client.chat.completions.create(
        model=model_name, messages=conversation, tools=TOOLS, tool_choice="none", seed=1, max_tokens=20
    )
    choice = second.choices[0]
    assert choice.message.tool_calls is None and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert second.usage is not None and second.usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]  # usage is always sent


def test_auto_lets_the_model_answer_in_text(client: openai.OpenAI, model_name: str) -> None:
    """A random model does not write a call by itself: in auto mode its text comes back as text."""
    answer = client.chat.completions.create(
        model=model_name, messages=MESSAGES, tools=TOOLS, seed=2, max_tokens=30
    )
    choice = answer.choices[0]
    assert choice.message.tool_calls is None and choice.message.content
    assert choice.finish_reason in ("stop", "length")

    # Streamed, text that starts no JSON goes out as content deltas, the same text.
    stream = client.chat.completions.create(
        model=model_name, messages=MESSAGES, tools=TOOLS, seed=2, max_tokens=30, stream=True
    )
    chunks = list(stream)
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == choice.message.content
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "x"}}}],
                "tool_choice": "required",
            },
            "tools",
        ),
    ],
)
def test_bad_tool_requests_are_400s(
    client: openai.OpenAI, model_name: str, extra: dict[str, Any], param: str
) -> None:
    body = {"tools": TOOLS, **extra}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=5, **body)
    assert info.value.response.json()["error"]["param"] == param
