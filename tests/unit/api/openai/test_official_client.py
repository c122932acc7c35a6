"""/v1/responses, reasoning models' think blocks and /tokenize, /detokenize over a scripted runtime
(no Triton, no model), read by the official `openai` client through an ASGI transport.

The scripted engine writes its text one piece per token, so a think block split across tokens
(`</th` + `ink>`) arrives split across stream chunks, as from a real model.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import openai
import pytest

from tests.serving_support import FakeRuntime, events, post
from trtllm_service.api import app
from trtllm_service.api.openai.chat.protocol import ChatCompletionChunk
from trtllm_service.chat.template import PromptFormatter

T = TypeVar("T")

THINKING = ["<th", "ink>", "Two and ", "two</th", "ink>", "Fo", "ur."]
"""A qwen3-style answer: its think block, split across tokens, then the answer."""
R1_THINKING = ["Two and ", "two</", "think>\n", "Four."]
"""deepseek-r1: the template opened <think>; the model closes it."""
CALL = ['{"name": "get_weather", ', '"parameters": {"city": "Paris"}}']
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def run(runtime: FakeRuntime, use: Callable[[openai.AsyncOpenAI], Awaitable[T]]) -> T:
    """`use` the official async client against the /v1 app serving `runtime`."""

    async def go() -> T:
        app.bind(runtime)  # type: ignore[arg-type]  # a FakeRuntime for the Runtime
        transport = httpx.ASGITransport(app=app.v1)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            client = openai.AsyncOpenAI(base_url="http://test", api_key="x", http_client=http, max_retries=0)
            return await use(client)

    return asyncio.run(go())


def test_a_text_response_non_streamed_and_streamed() -> None:
    runtime = FakeRuntime()
    params: dict[str, Any] = {
        "model": "fake-model",
        "instructions": "Be brief.",
        "input": "hi there",
        "max_output_tokens": 3,
        "temperature": 0,
    }
    whole = run(runtime, lambda client: client.responses.create(**params))
    assert whole.output_text == " w0 w1 w2"
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"  # type: ignore[union-attr]  # set when incomplete
    assert [item.type for item in whole.output] == ["message"]
    # "<system> Be brief. <user> hi there <assistant>": 7 word tokens
    assert whole.usage is not None and (whole.usage.input_tokens, whole.usage.output_tokens) == (7, 3)
    assert runtime.requests[0].max_tokens == 3 and runtime.requests[0].top_k == 1

    async def streamed(client: openai.AsyncOpenAI) -> list[Any]:
        return [event async for event in await client.responses.create(stream=True, **params)]

    seen = run(runtime, streamed)
    kinds = [event.type for event in seen]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    deltas = [event.delta for event in seen if event.type == "response.output_text.delta"]
    assert "".join(deltas) == " w0 w1 w2" and all(deltas)
    assert [event.sequence_number for event in seen] == list(range(len(seen)))
    final = seen[-1].response  # max_output_tokens reached: response.incomplete, as OpenAI's
    assert final.output_text == " w0 w1 w2" and final.usage.output_tokens == 3
    assert final.id == seen[0].response.id
    assert runtime.open == 0

    # an answer that ends: the client's own accumulating helper gets the final response
    runtime = FakeRuntime(script=["Hel", "lo", "!"])

    async def helper(client: openai.AsyncOpenAI) -> Any:
        async with client.responses.stream(model="fake-model", input="hi") as stream:
            return await stream.get_final_response()

    done = run(runtime, helper)
    assert done.status == "completed" and done.output_text == "Hello!"


def test_a_function_tool_call_non_streamed_and_streamed() -> None:
    runtime = FakeRuntime(script=CALL, context=512)
    params: dict[str, Any] = {"model": "fake-model", "input": "Weather in Paris?", "tools": [WEATHER]}
    whole = run(runtime, lambda client: client.responses.create(**params))
    assert whole.status == "completed"
    (call,) = whole.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_")
    # the functions reached the prompt (this template renders no tools: Llama-3.1's JSON format)
    assert '"name": "get_weather"' in runtime.tokenizer.encoded[-1]

    async def streamed(client: openai.AsyncOpenAI) -> tuple[list[str], Any]:
        async with client.responses.stream(**params) as stream:
            kinds = [event.type async for event in stream]
            return kinds, await stream.get_final_response()

    kinds, final = run(runtime, streamed)
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    assert [(item.type, item.name) for item in final.output] == [("function_call", "get_weather")]  # type: ignore[union-attr]  # function calls: asserted by the kinds

    # the call's result in the next turn's input
    turn = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"celsius": 21}'},
    ]
    answer = run(
        FakeRuntime(context=512),
        lambda client: client.responses.create(
            model="fake-model",
            input=turn,  # type: ignore[arg-type]  # the turn as plain dicts
            tools=[WEATHER],  # type: ignore[list-item]  # the tool as a plain dict
            max_output_tokens=2,
            temperature=0,
        ),
    )
    assert answer.output_text == " w0 w1"


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
        ({"store": True}, "store", "unsupported_parameter"),
        ({"background": True}, "background", "unsupported_parameter"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_value"),
        ({"reasoning": {"summary": "auto"}}, "reasoning.summary", "invalid_value"),
        ({"reasoning": {"effort": "low"}}, "reasoning.effort", "unsupported_parameter"),  # no such template
        ({"include": ["message.output_text.logprobs"]}, "include", "unsupported_parameter"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
            "input[0].content[0].type",
            "unsupported_value",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "unsupported_value"),
        (
            {"text": {"format": {"type": "json_schema", "schema": {}}}},
            "text.format.name",
            "missing_required_parameter",
        ),
    ],
)
def test_what_responses_cannot_serve_is_a_400_naming_it(extra: dict[str, Any], param: str, code: str) -> None:
    runtime = FakeRuntime()
    response = post(runtime, "/responses", {"model": "fake-model", "input": "hi", **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error
    assert runtime.requests == []


def test_stored_responses_are_refused_by_the_official_client_too() -> None:
    async def use(client: openai.AsyncOpenAI) -> None:
        await client.responses.create(model="fake-model", input="hi", previous_response_id="resp_1")

    with pytest.raises(openai.BadRequestError) as info:
        run(FakeRuntime(), use)
    assert info.value.param == "previous_response_id"
    assert "not stored" in info.value.message


# ---- reasoning models ------------------------------------------------------------------------------------


CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 20}


@pytest.mark.parametrize(("parser", "script"), [("qwen3", THINKING), ("deepseek-r1", R1_THINKING)])
def test_chat_splits_the_think_block_streamed_or_not(parser: str, script: list[str]) -> None:
    runtime = FakeRuntime(script=script, reasoning=parser, delay=0.01)  # a chunk per token
    message = post(runtime, "/chat/completions", CHAT).json()["choices"][0]["message"]
    answer = "Four." if parser == "qwen3" else "\nFour."
    assert message == {
        "role": "assistant",
        "content": answer,
        "reasoning_content": "Two and two",
        "reasoning": "Two and two",
    }

    streamed = post(runtime, "/chat/completions", {**CHAT, "stream": True})
    chunks = [ChatCompletionChunk.model_validate_json(c) for c in events(streamed)[:-1]]
    deltas = [chunk.choices[0].delta for chunk in chunks]
    thinking = [d.reasoning_content for d in deltas if d.reasoning_content]
    assert "".join(thinking) == "Two and two" and len(thinking) >= 2  # as it came
    assert all(d.reasoning == d.reasoning_content for d in deltas)
    assert "".join(d.content or "" for d in deltas) == answer
    assert not any("<" in (d.content or "") + (d.reasoning_content or "") for d in deltas)


def test_without_a_parser_the_think_block_is_content() -> None:
    runtime = FakeRuntime(script=THINKING)
    message = post(runtime, "/chat/completions", CHAT).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "".join(THINKING)}


def test_an_answer_cut_off_while_thinking_is_all_reasoning() -> None:
    runtime = FakeRuntime(script=THINKING[:4], reasoning="qwen3")
    choice = post(runtime, "/chat/completions", CHAT).json()["choices"][0]
    assert choice["message"]["content"] is None
    assert choice["message"]["reasoning_content"] == "Two and two</th"  # the tag never completed


def test_responses_carry_the_reasoning_as_an_item() -> None:
    runtime = FakeRuntime(script=THINKING, reasoning="qwen3", delay=0.01)
    params: dict[str, Any] = {"model": "fake-model", "input": "2+2?"}
    whole = run(runtime, lambda client: client.responses.create(**params))
    reasoning, message = whole.output
    assert message.type == "message"
    assert reasoning.type == "reasoning" and [c.text for c in reasoning.content or []] == ["Two and two"]  # type: ignore[union-attr]  # a reasoning item: asserted first
    assert whole.output_text == "Four."

    async def streamed(client: openai.AsyncOpenAI) -> tuple[list[Any], Any]:
        async with client.responses.stream(**params) as stream:
            seen = [event async for event in stream]
            return seen, await stream.get_final_response()

    seen, final = run(runtime, streamed)
    thinking = [e.delta for e in seen if e.type == "response.reasoning_text.delta"]
    assert "".join(thinking) == "Two and two"
    assert [(e.item.type, e.output_index) for e in seen if e.type == "response.output_item.added"] == [
        ("reasoning", 0),
        ("message", 1),
    ]
    assert final.output_text == "Four." and [item.type for item in final.output] == ["reasoning", "message"]


def test_reasoning_effort_reaches_a_template_that_takes_it_and_is_a_400_otherwise() -> None:
    runtime = FakeRuntime()
    response = post(runtime, "/chat/completions", {**CHAT, "reasoning_effort": "low"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("reasoning_effort", "unsupported_parameter")
    assert "chat template takes no reasoning_effort" in error["message"]

    runtime.formatter = runtime.preparer.formatter = PromptFormatter(
        runtime.tokenizer, chat_template="{{ messages | length }} message(s), effort: {{ reasoning_effort }}"
    )
    assert post(runtime, "/chat/completions", {**CHAT, "reasoning_effort": "low"}).status_code == 200
    assert post(runtime, "/responses", {"input": "x", "reasoning": {"effort": "high"}}).status_code == 200
    # the prompts the engine got, as the template rendered them
    assert runtime.tokenizer.encoded[-2:] == ["1 message(s), effort: low", "1 message(s), effort: high"]


# ---- /tokenize, /detokenize ------------------------------------------------------------------------------


def root(runtime: FakeRuntime, path: str, body: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        app.bind(runtime)  # type: ignore[arg-type]  # a FakeRuntime for the Runtime
        transport = httpx.ASGITransport(app=app.root)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            if isinstance(body, str):
                return await client.post(path, content=body, headers={"content-type": "application/json"})
            return await client.post(path, json=body)

    return asyncio.run(go())


def test_tokenize_and_detokenize_in_vllms_shapes() -> None:
    runtime = FakeRuntime()
    body = root(runtime, "/tokenize", {"prompt": "ab cde", "return_token_strs": True}).json()
    assert body == {"count": 2, "max_model_len": 64, "tokens": [2, 3], "token_strs": ["t2", "t3"]}
    assert runtime.tokenizer.encoded == ["ab cde"]

    chat = root(runtime, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] == len(chat["tokens"]) and "token_strs" not in chat
    assert runtime.tokenizer.encoded[-1] == "<user> hi <assistant>"
    root(
        runtime,
        "/tokenize",
        {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": False},
    )
    assert runtime.tokenizer.encoded[-1] == "<user> hi"

    assert root(runtime, "/detokenize", {"tokens": [1, 2]}).json() == {"prompt": "t1 t2"}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/tokenize", {"model": "other", "prompt": "x"}, 404, "model"),
        ("/tokenize", {"prompt": 3}, 400, "prompt"),
        ("/tokenize", {"prompt": "x", "messages": []}, 400, "messages"),
        ("/tokenize", "{not json", 400, None),
        ("/detokenize", {"tokens": [1, 100]}, 400, "tokens"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens[0]"),
        ("/detokenize", {"tokens": "1 2"}, 400, "tokens"),
        ("/detokenize", {"model": "other", "tokens": [1]}, 404, "model"),
    ],
)
def test_tokenize_errors_are_openai_shaped(path: str, body: Any, status: int, param: str | None) -> None:
    response = root(FakeRuntime(), path, body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param
