"""Anthropic's Messages API requests (`trtllm_service.api.anthropic.protocol`): what the official
`anthropic` SDK sends is accepted, the conversation becomes the chat messages our templates take,
the sampling and tool fields mean what `ResponsesRequest`'s do for the serving code, and every 400
names its field."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import pytest

from trtllm_service.api.anthropic.errors import error_body, error_message
from trtllm_service.api.anthropic.protocol import (
    EFFORT_PARAM,
    CountTokensRequest,
    MessagesRequest,
    parse_request,
)
from trtllm_service.errors import APIError

pytestmark = pytest.mark.unit

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME = {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}
BASE: dict[str, Any] = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
A_MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "content": [{"type": "text", "text": "ok"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 1, "output_tokens": 1},
}


def messages(**fields: Any) -> MessagesRequest:
    return parse_request(MessagesRequest, {**BASE, **fields})


def refusal(model: type, body: dict[str, Any]) -> APIError:
    with pytest.raises(APIError) as caught:
        parse_request(model, body)
    assert caught.value.status == 400
    return caught.value


def sdk_bodies(call: str, **kwargs: Any) -> list[dict[str, Any]]:
    """The JSON bodies the official SDK sends for `client.messages.<call>(**kwargs)`."""
    seen: list[dict[str, Any]] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(json.loads(request.content))
        body = {"input_tokens": 3} if call == "count_tokens" else A_MESSAGE
        return httpx2.Response(200, json=body)

    http = httpx2.Client(transport=httpx2.MockTransport(answer))
    client = anthropic.Anthropic(api_key="x", base_url="http://test", http_client=http, max_retries=0)
    getattr(client.messages, call)(**kwargs)
    return seen


# ---- what the SDK sends ----------------------------------------------------------------------------------

CONVERSATION: list[dict[str, Any]] = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Weather in Paris and Rome?", "cache_control": {"type": "ephemeral"}}
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Two cities: two calls.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 24 C"},
            {
                "type": "tool_result",
                "tool_use_id": "toolu_2",
                "content": [
                    {"type": "text", "text": "Service down"},
                    {"type": "text", "text": "retry later"},
                ],
                "is_error": True,
            },
            {"type": "text", "text": "Summarize, please."},
        ],
    },
]
CONVERSATION_AS_CHAT = [
    {"role": "system", "content": "You are terse.\nAnswer in English."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {"id": "toolu_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {"id": "toolu_2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        ],
    },
    {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 24 C"},
    {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: Service down\nretry later"},
    {"role": "user", "content": "Summarize, please."},
]
SYSTEM = [
    {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
    {"type": "text", "text": "Answer in English."},
]


def test_what_the_sdk_sends_is_accepted_and_becomes_chat_messages() -> None:
    (body,) = sdk_bodies(
        "create",
        model="m",
        max_tokens=2048,
        system=SYSTEM,
        messages=CONVERSATION,
        tools=[WEATHER, TIME],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        thinking={"type": "enabled", "budget_tokens": 1024},
        metadata={"user_id": "u-1"},
        stop_sequences=["END", "\n\nHuman:"],
        service_tier="auto",
        # anthropic 2.x has no temperature, top_p nor top_k arguments: they go as extra_body
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 40, "repetition_penalty": 1.1, "seed": 7},
    )
    request = parse_request(MessagesRequest, body)
    assert request.chat_messages() == CONVERSATION_AS_CHAT
    assert request.functions() == [
        {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": WEATHER["input_schema"],
        },
        {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
    ]
    params = request.sampling_params()
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (2048, 0.5, 0.9, 40)
    assert params.stop == ("END", "\n\nHuman:")
    assert (params.repetition_penalty, params.seed, params.guide) == (1.1, 7, None)
    assert request.tool_mode == "auto"
    assert request.calls_in(
        '[{"name": "get_time", "parameters": {}}, {"name": "get_time", "parameters": {}}]'
    ) == [("get_time", "{}")]  # disable_parallel_tool_use: one call at most
    assert request.reasoning_effort is None
    assert request.omits_thinking is False


def test_what_the_sdk_counts_is_accepted() -> None:
    (body,) = sdk_bodies(
        "count_tokens",
        model="m",
        system="Be brief.",
        messages=CONVERSATION,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        thinking={"type": "enabled", "budget_tokens": 4096},
    )
    request = parse_request(CountTokensRequest, body)
    assert request.chat_messages()[0] == {"role": "system", "content": "Be brief."}
    assert request.chat_messages()[1:] == CONVERSATION_AS_CHAT[1:]
    assert [f["name"] for f in request.functions()] == ["get_weather"]


@pytest.mark.parametrize("field", ["max_tokens", "stream", "temperature", "stop_sequences"])
def test_count_tokens_takes_no_generation_fields(field: str) -> None:
    value = {"max_tokens": 5, "stream": True, "temperature": 0.5, "stop_sequences": ["x"]}[field]
    error = refusal(CountTokensRequest, {"model": "m", "messages": BASE["messages"], field: value})
    assert error.param == field
    assert error.code == "unknown_parameter"


# ---- the conversation ------------------------------------------------------------------------------------


def test_a_string_conversation() -> None:
    request = messages(
        system="Be brief.",
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "How are you?"},
        ],
    )
    assert request.chat_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "How are you?"},
    ]


def test_an_empty_system_prompt_is_left_out() -> None:
    assert messages(system="").chat_messages() == [{"role": "user", "content": "hi"}]
    assert messages(system=[]).chat_messages() == [{"role": "user", "content": "hi"}]


def test_consecutive_turns_of_one_role_become_one() -> None:
    request = messages(
        messages=[
            {"role": "user", "content": "one"},
            {"role": "user", "content": [{"type": "text", "text": "two"}, {"type": "text", "text": "three"}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "get_time", "input": {}}],
            },
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "four"},
        ],
        tools=[TIME],
    )
    assert request.chat_messages() == [
        {"role": "user", "content": "one\ntwo\nthree"},
        {
            "role": "assistant",
            "content": "Done.",
            "tool_calls": [{"id": "t1", "name": "get_time", "arguments": "{}"}],
        },
        {"role": "user", "content": "four"},
    ]


def test_tool_results_and_text_keep_their_order() -> None:
    request = messages(
        messages=[
            {"role": "user", "content": "time?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "get_time", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "before"},
                    {"type": "tool_result", "tool_use_id": "t1"},
                    {"type": "text", "text": "after"},
                ],
            },
        ],
    )
    assert request.chat_messages()[2:] == [
        {"role": "user", "content": "before"},
        {"role": "tool", "tool_call_id": "t1", "content": ""},
        {"role": "user", "content": "after"},
    ]


def test_a_system_turn_among_the_messages() -> None:
    request = messages(
        messages=[
            {"role": "system", "content": [{"type": "text", "text": "Now in French."}]},
            {"role": "user", "content": "hi"},
        ]
    )
    assert request.chat_messages() == [
        {"role": "system", "content": "Now in French."},
        {"role": "user", "content": "hi"},
    ]


# ---- what the serving code reads -------------------------------------------------------------------------


def test_one_answer_no_log_probs() -> None:
    request = messages(stream=True)
    assert (request.samples_per_prompt, request.n, request.logprob_count, request.prompt_logprob_count) == (
        1,
        1,
        None,
        None,
    )
    assert not request.ranks_best_of
    assert request.beam_width is None
    assert request.max_new_tokens == 64
    assert request.include_usage is True
    assert messages().include_usage is False
    assert request.sampling_params().logprobs is None
    assert request.model == "m"


@pytest.mark.parametrize(
    ("choice", "mode", "named"),
    [
        (None, "auto", None),
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "forced", None),
        ({"type": "tool", "name": "get_time"}, "forced", "get_time"),
        ({"type": "none"}, None, None),
    ],
)
def test_tool_choice(choice: dict[str, Any] | None, mode: str | None, named: str | None) -> None:
    request = messages(tools=[WEATHER, TIME], tool_choice=choice)
    assert request.tool_mode == mode
    guide = request.sampling_params().guide
    if mode != "forced":
        assert guide is None
        return
    assert request.guide_param == "tool_choice"
    kind, schema = guide  # type: ignore[misc]  # a pair here, not None
    assert kind == "json_schema"
    names = {
        option["properties"]["name"]["const"]
        for option in json.loads(schema).get("anyOf", [json.loads(schema)])
    }
    assert names == ({named} if named else {"get_weather", "get_time"})


def test_tool_choice_none_shows_the_tools_but_reads_no_calls() -> None:
    request = messages(tools=[TIME], tool_choice={"type": "none"})
    assert request.functions() == [{"name": "get_time", "parameters": {"type": "object", "properties": {}}}]
    assert request.calls_in('{"name": "get_time", "parameters": {}}') is None


def test_calls_are_read_from_an_auto_answer() -> None:
    request = messages(tools=[WEATHER, TIME])
    answer = (
        '[{"name": "get_weather", "parameters": {"city": "Oslo"}}, {"name": "get_time", "parameters": {}}]'
    )
    assert request.calls_in(answer) == [("get_weather", '{"city": "Oslo"}'), ("get_time", "{}")]
    assert request.calls_in("It is sunny.") is None


def test_output_format_is_a_json_schema_guide() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    request = messages(output_config={"format": {"type": "json_schema", "schema": schema}})
    kind, text = request.sampling_params().guide  # type: ignore[misc]  # a pair here, not None
    assert kind == "json_schema"
    assert json.loads(text) == schema
    assert request.guide_param == "output_config.format"


@pytest.mark.parametrize(
    ("effort", "template_effort"), [("low", "low"), ("high", "high"), ("xhigh", "high"), ("max", "high")]
)
def test_effort_goes_to_the_template(effort: str, template_effort: str) -> None:
    assert messages(output_config={"effort": effort}).reasoning_effort == template_effort
    assert EFFORT_PARAM == "output_config.effort"


def test_thinking_is_accepted() -> None:
    for thinking in ({"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}, {"type": "adaptive"}):
        assert messages(max_tokens=2048, thinking=thinking).thinking is not None
    assert messages(thinking={"type": "adaptive", "display": "omitted"}).omits_thinking


@pytest.mark.parametrize(
    "fields",
    [
        {"metadata": {"user_id": "abc"}},
        {"metadata": {"user_id": None}},
        {"service_tier": "standard_only"},
        {"cache_control": {"type": "ephemeral"}},
        {"speed": "fast"},
        {"inference_geo": "us"},
        {"diagnostics": {"previous_message_id": None}},
        {"container": None},
        {"mcp_servers": []},
        {"n": 1},
        {"stream": False, "top_k": 0, "temperature": None},
        {"tools": [{**WEATHER, "type": "custom", "cache_control": {"type": "ephemeral"}, "strict": True}]},
    ],
)
def test_harmless_parameters_are_accepted(fields: dict[str, Any]) -> None:
    request = messages(**fields)
    assert request.chat_messages() == [{"role": "user", "content": "hi"}]


# ---- every 400 names its field ---------------------------------------------------------------------------

USER = {"role": "user", "content": "hi"}


def blocks(*content: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": list(content)}]}


BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"max_tokens": None}, "max_tokens", "missing_required_parameter"),
    ({"max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"max_tokens": "10"}, "max_tokens", "invalid_type"),
    ({"model": ""}, "model", "invalid_value"),
    ({"messages": []}, "messages", "invalid_value"),
    ({"messages": ["hi"]}, "messages[0]", "invalid_type"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "invalid_value"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "missing_required_parameter"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content", "invalid_type"),
    (
        {"messages": [{"role": "user", "content": "x", "name": "bob"}]},
        "messages[0].name",
        "unknown_parameter",
    ),
    (
        {"messages": [USER, {"role": "assistant", "content": "The answer is ("}]},
        "messages[1].role",
        "invalid_value",
    ),
    (
        blocks({"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}),
        "messages[0].content[0].type",
        "unsupported_value",
    ),
    (blocks({"type": "document", "source": {}}), "messages[0].content[0].type", "unsupported_value"),
    (blocks({"text": "no type"}), "messages[0].content[0].type", "missing_required_parameter"),
    (blocks({"type": "text"}), "messages[0].content[0].text", "invalid_type"),
    (blocks({"type": "text", "text": "x", "extra": 1}), "messages[0].content[0].extra", "unknown_parameter"),
    (
        blocks({"type": "tool_use", "id": "t", "name": "f", "input": {}}),
        "messages[0].content[0].type",
        "invalid_value",
    ),
    (
        blocks({"type": "thinking", "thinking": "x", "signature": "s"}),
        "messages[0].content[0].type",
        "invalid_value",
    ),
    (blocks({"type": "tool_result", "content": "x"}), "messages[0].content[0].tool_use_id", "invalid_type"),
    (
        blocks({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}),
        "messages[0].content[0].content[0].type",
        "unsupported_value",
    ),
    (
        blocks({"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}),
        "messages[0].content[0].is_error",
        "invalid_type",
    ),
    (
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}],
                },
                USER,
            ]
        },
        "messages[0].content[0].input",
        "invalid_type",
    ),
    ({"system": [{"type": "image", "source": {}}]}, "system[0].type", "unsupported_value"),
    ({"system": 5}, "system", "invalid_type"),
    ({"temperature": 1.5}, "temperature", "invalid_value"),
    ({"top_p": 0}, "top_p", "invalid_value"),
    ({"stop_sequences": "END"}, "stop_sequences", "invalid_type"),
    ({"stop_sequences": ["END", ""]}, "stop_sequences[1]", "invalid_value"),
    ({"stop": ["END"]}, "stop", "unsupported_parameter"),
    ({"user": "bob"}, "user", "unsupported_parameter"),
    ({"n": 2}, "n", "unsupported_parameter"),
    ({"use_beam_search": True}, "use_beam_search", "unsupported_parameter"),
    ({"logprobs": True}, "logprobs", "unknown_parameter"),
    ({"store": True}, "store", "unknown_parameter"),
    ({"container": "ctr_1"}, "container", "unsupported_parameter"),
    (
        {"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]},
        "mcp_servers",
        "unsupported_parameter",
    ),
    ({"output_format": {"type": "json_schema", "schema": {}}}, "output_format", "unsupported_parameter"),
    ({"metadata": {"user_id": 3}}, "metadata.user_id", "invalid_type"),
    ({"metadata": {"session": "x"}}, "metadata.session", "unknown_parameter"),
    ({"service_tier": "priority"}, "service_tier", "invalid_value"),
    (
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "tools[0].type",
        "unsupported_value",
    ),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema", "missing_required_parameter"),
    ({"tools": [{**TIME, "name": "bad name"}]}, "tools[0].name", "invalid_value"),
    ({"tools": [{**TIME, "defer_loading": True}]}, "tools[0].defer_loading", "unsupported_value"),
    ({"tools": [TIME, TIME]}, "tools", "invalid_value"),
    ({"tool_choice": {"type": "any"}}, "tool_choice", "invalid_value"),
    ({"tool_choice": {"type": "tool"}, "tools": [TIME]}, "tool_choice.name", "missing_required_parameter"),
    ({"tool_choice": {"type": "tool", "name": "nope"}, "tools": [TIME]}, "tool_choice.name", "invalid_value"),
    (
        {"tool_choice": {"type": "auto", "name": "get_time"}, "tools": [TIME]},
        "tool_choice.name",
        "invalid_value",
    ),
    ({"tool_choice": {"type": "required"}, "tools": [TIME]}, "tool_choice.type", "invalid_value"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens", "missing_required_parameter"),
    ({"thinking": {"type": "enabled", "budget_tokens": 512}}, "thinking.budget_tokens", "invalid_value"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking.budget_tokens", "invalid_value"),
    ({"thinking": {"type": "disabled", "budget_tokens": 2048}}, "thinking.budget_tokens", "invalid_value"),
    ({"output_config": {"effort": "extreme"}}, "output_config.effort", "invalid_value"),
    (
        {"output_config": {"format": {"type": "json_schema"}}},
        "output_config.format.schema",
        "missing_required_parameter",
    ),
    (
        {
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
            "tools": [TIME],
            "tool_choice": {"type": "any"},
        },
        "tool_choice",
        "invalid_value",
    ),
]


@pytest.mark.parametrize(("fields", "param", "code"), BAD, ids=[f"{i}-{bad[1]}" for i, bad in enumerate(BAD)])
def test_every_refusal_names_its_field(fields: dict[str, Any], param: str, code: str) -> None:
    body = {**BASE, **fields}
    body = {k: v for k, v in body.items() if not (v is None and k in ("max_tokens", "model"))}
    error = refusal(MessagesRequest, body)
    assert (error.param, error.code) == (param, code), error.message
    assert param in error_message(error)  # Anthropic's body has no param: its message names it
    assert error_body(error)["error"]["type"] == "invalid_request_error"


def test_an_image_is_refused_in_words() -> None:
    error = refusal(MessagesRequest, {**BASE, **blocks({"type": "image", "source": {}})})
    assert "image content blocks are not supported by this server" in error.message


def test_an_omitted_model_is_the_served_one() -> None:
    """Anthropic requires `model`; here, as on the OpenAI routes, omitting it means the served model."""
    body = {k: v for k, v in BASE.items() if k != "model"}
    assert parse_request(MessagesRequest, body).model is None
    assert parse_request(CountTokensRequest, {"messages": body["messages"]}).model is None
