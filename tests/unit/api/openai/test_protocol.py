"""OpenAI protocol models, error bodies and SSE chunk encoding."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from trtllm_service.api.generation.protocol import parse_request
from trtllm_service.api.openai.chat.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
)
from trtllm_service.api.openai.completions.protocol import (
    CompletionChunk,
    CompletionRequest,
    CompletionResponse,
)
from trtllm_service.api.openai.protocol import ModelCard, ModelList
from trtllm_service.api.openai.sse import (
    SSE_DONE,
    ChatChunkEncoder,
    CompletionChunkEncoder,
    error_frame,
    sse_frame,
)
from trtllm_service.api.server.error_shape import ErrorBody
from trtllm_service.api.server.request_errors import from_validation_error
from trtllm_service.errors import APIError
from trtllm_service.relay.request import SamplingParams

USER = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": USER, **fields}


def chat_error(body: dict[str, Any] | str) -> APIError:
    with pytest.raises(APIError) as info:
        parse_request(ChatCompletionRequest, body)
    assert info.value.status == 400
    assert info.value.type == "invalid_request_error"
    return info.value


def completion_error(body: dict[str, Any]) -> APIError:
    with pytest.raises(APIError) as info:
        parse_request(CompletionRequest, body)
    return info.value


# ----------------------------------------------------------------------------------------------- requests


def unseeded(params: SamplingParams) -> SamplingParams:
    """`params` without the random seed a sampled request without one draws (checked drawn)."""
    assert params.seed is not None and 0 <= params.seed < 2**63
    return replace(params, seed=None)


def test_minimal_chat_request_maps_to_engine_defaults() -> None:
    req = parse_request(ChatCompletionRequest, chat())
    assert unseeded(req.sampling_params()) == SamplingParams()
    assert req.n == 1 and not req.stream and not req.include_usage
    assert req.chat_messages() == USER


def test_sampling_params_mapping() -> None:
    req = parse_request(
        ChatCompletionRequest,
        chat(
            max_tokens=10,
            max_completion_tokens=20,
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            repetition_penalty=1.1,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            seed=7,
            min_tokens=2,
            stop=["a", "b", "a"],
            ignore_eos=True,
        ),
    )
    assert req.sampling_params() == SamplingParams(
        max_tokens=20,  # max_completion_tokens wins
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        seed=7,
        min_tokens=2,
        stop=("a", "b"),
        ignore_eos=True,
    )


def test_a_sampled_request_without_a_seed_draws_one_of_its_own() -> None:
    """Its choices sample with it + i (api/generation/choices.py); greedy and beam search need none."""
    seeds = {parse_request(ChatCompletionRequest, chat()).sampling_params().seed for _ in range(8)}
    assert None not in seeds and len(seeds) == 8
    assert parse_request(ChatCompletionRequest, chat(temperature=0)).sampling_params().seed is None
    beams = parse_request(ChatCompletionRequest, chat(use_beam_search=True, n=2)).sampling_params()
    assert beams.beam_width == 2 and beams.seed is None
    assert parse_request(ChatCompletionRequest, chat(temperature=1, seed=3)).sampling_params().seed == 3


def test_max_tokens_used_without_max_completion_tokens() -> None:
    assert parse_request(ChatCompletionRequest, chat(max_tokens=5)).sampling_params().max_tokens == 5


@pytest.mark.parametrize("top_k", [-1, 0])
def test_top_k_unset_values(top_k: int) -> None:
    assert parse_request(ChatCompletionRequest, chat(top_k=top_k)).sampling_params().top_k is None


def test_stop_string_normalized_to_tuple() -> None:
    assert parse_request(ChatCompletionRequest, chat(stop="END")).sampling_params().stop == ("END",)


def test_negative_seed_maps_to_uint64() -> None:
    assert parse_request(ChatCompletionRequest, chat(seed=-1)).sampling_params().seed == 2**64 - 1


def test_nulls_mean_unset() -> None:
    req = parse_request(
        ChatCompletionRequest, chat(n=None, stream=None, temperature=None, stop=None, tools=None)
    )
    assert req.n == 1 and req.stream is False and unseeded(req.sampling_params()) == SamplingParams()


def test_include_usage_only_when_streaming() -> None:
    assert parse_request(
        ChatCompletionRequest, chat(stream=True, stream_options={"include_usage": True})
    ).include_usage
    assert not parse_request(
        ChatCompletionRequest, chat(stream_options={"include_usage": True})
    ).include_usage


def test_json_body_accepted() -> None:
    req = parse_request(ChatCompletionRequest, json.dumps(chat(temperature=1)).encode())
    assert req.temperature == 1.0


def test_messages_roles_and_parts() -> None:
    req = parse_request(
        ChatCompletionRequest,
        chat(
            messages=[
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    "name": "u",
                },
                {"role": "assistant", "content": None, "tool_calls": [], "refusal": None},
                {"role": "user", "content": "next"},
            ]
        ),
    )
    assert req.chat_messages() == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a\nb", "name": "u"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "next"},
    ]


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"temperature": 2.5}, "temperature", "invalid_value"),
        ({"temperature": -0.1}, "temperature", "invalid_value"),
        ({"top_p": 0}, "top_p", "invalid_value"),
        ({"top_p": 1.5}, "top_p", "invalid_value"),
        ({"top_k": -2}, "top_k", "invalid_value"),
        ({"repetition_penalty": 0}, "repetition_penalty", "invalid_value"),
        ({"presence_penalty": 3}, "presence_penalty", "invalid_value"),
        ({"frequency_penalty": -3}, "frequency_penalty", "invalid_value"),
        ({"n": 0}, "n", "invalid_value"),
        ({"n": 9}, "n", "invalid_value"),
        ({"max_tokens": 0}, "max_tokens", "invalid_value"),
        ({"max_tokens": 1.5}, "max_tokens", "invalid_type"),
        ({"max_tokens": True}, "max_tokens", "invalid_type"),
        ({"max_completion_tokens": -1}, "max_completion_tokens", "invalid_value"),
        ({"min_tokens": -1}, "min_tokens", "invalid_value"),
        ({"min_tokens": 5, "max_tokens": 3}, "min_tokens", "invalid_value"),
        ({"seed": 2**64}, "seed", "invalid_value"),
        ({"stream": "yes"}, "stream", "invalid_type"),
        ({"stop": ["a", ""]}, "stop[1]", "invalid_value"),
        ({"stop": ""}, "stop", "invalid_value"),
        ({"stop": ["a", 3]}, "stop[1]", "invalid_type"),
        ({"stop": 5}, "stop", "invalid_type"),
        ({"stop": [str(i) for i in range(17)]}, "stop", "invalid_value"),
        ({"stream_options": {"include_usage": "x"}}, "stream_options.include_usage", "invalid_type"),
        ({"messages": []}, "messages", "invalid_value"),
        ({"messages": None}, "messages", "missing_required_parameter"),
        ({"min_p": 0.1}, "min_p", "unknown_parameter"),
    ],
)
def test_invalid_values_name_the_parameter(fields: dict[str, Any], param: str, code: str) -> None:
    err = chat_error(chat(**fields))
    assert (err.param, err.code) == (param, code)
    assert err.message


@pytest.mark.parametrize(
    ("message", "param", "code"),
    [
        ({"content": "x"}, "messages[0].role", "missing_required_parameter"),
        ({"role": "user"}, "messages[0].content", "missing_required_parameter"),
        ({"role": "wizard", "content": "x"}, "messages[0].role", "invalid_value"),
        ({"role": "function", "content": "x", "name": "f"}, "messages[0].role", "unsupported_value"),
        (
            {
                "role": "user",
                "content": "x",
                "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}}],
            },
            "messages[0].tool_calls",
            "invalid_value",
        ),
        ({"role": "user", "content": 5}, "messages[0].content", "invalid_type"),
        ({"role": "user", "content": [{"type": "text"}]}, "messages[0].content[0].text", "invalid_type"),
        ({"role": "user", "content": ["x"]}, "messages[0].content[0]", "invalid_type"),
        (
            {"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]},
            "messages[0].tool_calls[0].function",
            "missing_required_parameter",
        ),
        ({"role": "user", "content": "x", "weight": 1}, "messages[0].weight", "unknown_parameter"),
    ],
)
def test_invalid_messages_name_the_path(message: dict[str, Any], param: str, code: str) -> None:
    err = chat_error(chat(messages=[{"role": "system", "content": "s"}, message]))
    assert (err.param, err.code) == (param.replace("[0]", "[1]", 1), code)


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "http://x"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "file", "file": {"file_id": "f"}},
    ],
)
def test_non_text_content_part_named(part: dict[str, Any]) -> None:
    parts = [{"type": "text", "text": "look"}, part]
    err = chat_error(chat(messages=[{"role": "user", "content": parts}]))
    assert err.param == "messages[0].content[1].type"
    assert err.code == "unsupported_value"
    assert part["type"] in err.message


def test_reasoning_effort_is_validated_here_and_checked_against_the_template_when_served() -> None:
    assert parse_request(ChatCompletionRequest, chat(reasoning_effort="high")).reasoning_effort == "high"
    err = chat_error(chat(reasoning_effort="extreme"))
    assert err.param == "reasoning_effort"


def test_an_assistant_message_may_carry_our_reasoning_back() -> None:
    earlier = {"role": "assistant", "content": "4", "reasoning_content": "2+2", "reasoning": "2+2"}
    request = parse_request(
        ChatCompletionRequest, chat(messages=[{"role": "user", "content": "2+2?"}, earlier])
    )
    assert request.chat_messages()[1] == {"role": "assistant", "content": "4"}
    err = chat_error(chat(messages=[{"role": "user", "content": "x", "reasoning_content": "y"}]))
    assert (err.param, err.code) == ("messages[0].reasoning_content", "unknown_parameter")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("functions", [{"name": "f"}]),
        ("function_call", {"name": "f"}),
        ("audio", {"voice": "alloy"}),
        ("modalities", ["text", "audio"]),
        ("prediction", {"type": "content", "content": "x"}),
        ("web_search_options", {"search_context_size": "low"}),
    ],
)
def test_unsupported_chat_parameters_are_named(name: str, value: Any) -> None:
    err = chat_error(chat(**{name: value}))
    assert (err.param, err.code) == (name, "unsupported_parameter")
    assert name in err.message


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("logit_bias", {}),
        ("logprobs", False),
        ("top_logprobs", 0),
        ("tools", []),
        ("tool_choice", "none"),
        ("response_format", {"type": "text"}),
        ("modalities", ["text"]),
        ("metadata", {"k": "v"}),
        ("store", False),
        ("service_tier", "auto"),
        ("user", "alice"),
    ],
)
def test_off_values_and_harmless_params_accepted(name: str, value: Any) -> None:
    assert (
        unseeded(parse_request(ChatCompletionRequest, chat(**{name: value})).sampling_params())
        == SamplingParams()
    )


@pytest.mark.parametrize(
    ("fields", "guide"),
    [
        ({"response_format": {"type": "json_object"}}, ("json", "")),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "p", "schema": {"type": "integer"}},
                }
            },
            ("json_schema", '{"type": "integer"}'),
        ),
        ({"guided_json": '{"type": "string"}'}, ("json_schema", '{"type": "string"}')),
        ({"guided_regex": "[0-9]+"}, ("regex", "[0-9]+")),
        ({"guided_choice": ["a b", 'say "hi"', "a b"]}, ("ebnf_grammar", 'root ::= "a b" | "say \\"hi\\""')),
        ({"guided_grammar": 'root ::= "x"'}, ("ebnf_grammar", 'root ::= "x"')),
    ],
)
def test_structured_output_becomes_one_guide(fields: dict[str, Any], guide: tuple[str, str]) -> None:
    request = parse_request(ChatCompletionRequest, chat(**fields))
    assert request.sampling_params().guide == guide
    assert request.guide_path.split(".")[0] == next(iter(fields))
    completion = parse_request(CompletionRequest, {"prompt": "p", **fields})
    assert completion.sampling_params().guide == guide


def test_the_guide_is_the_requests_own_state_never_a_field_and_costs_an_unguided_request_nothing() -> None:
    """The settled guide lives in the request's own attributes, not in pydantic private attributes
    (set up for every request): dumps leave it out, copies keep it, and an unguided request has no
    private state at all."""
    guided = parse_request(ChatCompletionRequest, chat(guided_regex="[0-9]+"))
    plain = parse_request(ChatCompletionRequest, chat())
    assert guided.sampling_params().guide == ("regex", "[0-9]+") and guided.guide_path == "guided_regex"
    assert plain.sampling_params().guide is None and plain.__pydantic_private__ is None
    for request in (guided, plain):
        assert "_guide" not in request.model_dump() and "_guide" not in request.model_dump_json()
    assert guided.model_copy().sampling_params().guide == ("regex", "[0-9]+")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    forced = parse_request(
        ChatCompletionRequest, chat(tools=[tool], tool_choice={"type": "function", "function": {"name": "f"}})
    )
    assert forced.sampling_params().guide[0] == "json_schema" and forced.guide_path == "tools"


def test_unparseable_json() -> None:
    err = chat_error('{"model": ')
    assert err.param is None and "parse the JSON body" in err.message


def test_body_not_an_object() -> None:
    assert "JSON object" in chat_error("[1, 2]").message


@pytest.mark.parametrize(
    ("fields", "asked"),
    [
        ({"logprobs": True}, 0),
        ({"logprobs": True, "top_logprobs": 20}, 20),
        ({"logprobs": False, "top_logprobs": 0}, None),
        ({}, None),
    ],
)
def test_chat_logprobs_settle_to_one_count(fields: dict[str, Any], asked: int | None) -> None:
    assert parse_request(ChatCompletionRequest, chat(**fields)).sampling_params().logprobs == asked


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": False, "top_logprobs": 1}, "top_logprobs"),
        ({"logprobs": 1}, "logprobs"),
    ],
)
def test_bad_chat_logprobs_are_named(fields: dict[str, Any], param: str) -> None:
    err = chat_error(chat(**fields))
    assert (err.status, err.param) == (400, param)


def test_completion_logprobs() -> None:
    req = parse_request(CompletionRequest, {"prompt": "x", "logprobs": 5})
    assert req.sampling_params().logprobs == 5


def test_completion_request() -> None:
    req = parse_request(
        CompletionRequest, {"model": "m", "prompt": "once", "echo": True, "max_tokens": 4, "stop": "x"}
    )
    assert req.prompts() == ["once"] and req.echo
    assert unseeded(req.sampling_params()) == SamplingParams(max_tokens=4, stop=("x",))
    req = parse_request(
        CompletionRequest, {"prompt": ["a", "b"], "n": 2, "best_of": 1, "suffix": None, "logprobs": None}
    )
    assert req.prompts() == ["a", "b"] and req.model is None and req.n == 2


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"prompt": [1, -2, 3]}, "prompt[1]", "invalid_value"),
        ({"prompt": [[1, 2], []]}, "prompt[1]", "invalid_value"),
        ({"prompt": [[1, 2], [3, True]]}, "prompt[1][1]", "invalid_value"),
        ({"prompt": ["a", 3]}, "prompt[1]", "invalid_type"),
        ({"prompt": []}, "prompt", "invalid_value"),
        ({"prompt": 5}, "prompt", "invalid_type"),
        ({}, "prompt", "missing_required_parameter"),
        ({"prompt": "x", "n": 3, "best_of": 2}, "best_of", "invalid_value"),
        ({"prompt": "x", "suffix": "end"}, "suffix", "unsupported_parameter"),
        ({"prompt": "x", "logprobs": 6}, "logprobs", "invalid_value"),
        ({"prompt": "x", "logprobs": True}, "logprobs", "invalid_type"),
        ({"prompt": "x", "logit_bias": {"a": 1}}, "logit_bias", "invalid_value"),
        ({"prompt": "x", "messages": USER}, "messages", "unknown_parameter"),
        ({"prompt": "x", "temperature": 9}, "temperature", "invalid_value"),
    ],
)
def test_invalid_completion_requests(fields: dict[str, Any], param: str, code: str) -> None:
    err = completion_error(fields)
    assert (err.status, err.param, err.code) == (400, param, code)


def test_caller_dict_not_mutated() -> None:
    body = chat(messages=[{"role": "developer", "content": [{"type": "text", "text": "x"}]}], metadata={})
    snapshot = json.dumps(body, sort_keys=True)
    parse_request(ChatCompletionRequest, body)
    assert json.dumps(body, sort_keys=True) == snapshot


# ------------------------------------------------------------------------------------------------- errors


def test_error_body_shape() -> None:
    err = APIError.bad_request("nope", param="x")
    assert err.body() == {
        "error": {"message": "nope", "type": "invalid_request_error", "param": "x", "code": None}
    }
    assert ErrorBody.of(err).model_dump() == err.body()
    assert str(err) == "nope"


def test_context_length_exceeded_message() -> None:
    err = APIError.context_length_exceeded(4096, prompt_tokens=4000, completion_tokens=200)
    assert (err.status, err.code, err.param) == (400, "context_length_exceeded", "messages")
    assert err.message == (
        "This model's maximum context length is 4096 tokens. However, you requested 4200 tokens "
        "(4000 in the messages, 200 in the completion). Please reduce the length of the messages or completion."
    )
    assert "in the prompt" in APIError.context_length_exceeded(10, 9, 2, param="prompt").message


@pytest.mark.parametrize(
    ("err", "status", "type_", "code"),
    [
        (APIError.invalid_api_key(), 401, "invalid_request_error", "invalid_api_key"),
        (APIError.model_not_found("gpt-9"), 404, "invalid_request_error", "model_not_found"),
        (APIError.rate_limited(), 429, "requests", "rate_limit_exceeded"),
        (APIError.unavailable(), 503, "server_error", "service_unavailable"),
        (APIError.internal(), 500, "server_error", None),
        (APIError.unsupported_parameter("tools"), 400, "invalid_request_error", "unsupported_parameter"),
    ],
)
def test_error_constructors(err: APIError, status: int, type_: str, code: str | None) -> None:
    assert (err.status, err.type, err.code) == (status, type_, code)
    assert set(err.body()["error"]) == {"message", "type", "param", "code"}


def test_model_not_found_names_model() -> None:
    err = APIError.model_not_found("gpt-9")
    assert "gpt-9" in err.message and err.param == "model"


def test_retry_after_header() -> None:
    assert APIError.rate_limited(retry_after=2.4).headers() == {"Retry-After": "2"}
    assert APIError.unavailable().headers() == {}


def test_from_validation_error_accepts_fastapi_error_lists() -> None:
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate(chat(temperature=5))
    errors = [{**e, "loc": ("body", *e["loc"])} for e in info.value.errors()]
    assert from_validation_error(errors).param == "temperature"
    assert from_validation_error(info.value).param == "temperature"


def test_from_validation_error_lists_several_problems() -> None:
    err = chat_error(chat(temperature=5, top_p=2))
    assert err.param == "temperature"
    assert "temperature" in err.message and "top_p" in err.message


# ---------------------------------------------------------------------------------------------- responses


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
            "tool_choice",
            "'g'",
        ),
        ({"tools": [TOOL, TOOL]}, "tools", "unique"),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools[0].function.name",
            "pattern",
        ),
        (
            {"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "tool_choice",
            "cannot be combined",
        ),
    ],
)
def test_bad_tools_are_named(fields: dict[str, Any], param: str, says: str) -> None:
    err = chat_error(chat(**fields))
    assert err.param == param and says in err.message, err.body()


def test_a_forced_call_is_a_guide_on_the_calls_schema() -> None:
    named = parse_request(
        ChatCompletionRequest, chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f"}})
    )
    guide = named.sampling_params().guide
    assert guide is not None and guide[0] == "json_schema"
    assert named.guide_path == "tools"  # where a guide the engine refuses is blamed (relay/test_guided.py)
    assert json.loads(guide[1])["properties"]["name"] == {"const": "f"}
    assert named.tool_mode == "forced"
    assert parse_request(ChatCompletionRequest, chat(tools=[TOOL])).tool_mode == "auto"
    assert parse_request(ChatCompletionRequest, chat(tools=[TOOL], tool_choice="none")).tool_mode is None
    assert parse_request(ChatCompletionRequest, chat(tools=[TOOL])).sampling_params().guide is None


def test_chat_response_defaults() -> None:
    resp = ChatCompletionResponse(
        model="m",
        choices=[{"index": 0, "message": {"content": "hello"}, "finish_reason": "stop"}],
        usage={"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    )
    data = json.loads(resp.model_dump_json())
    assert data["object"] == "chat.completion" and data["id"].startswith("chatcmpl-")
    assert data["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": "hello"},
        "finish_reason": "stop",
        "logprobs": None,
    }
    assert isinstance(data["created"], int)


def test_completion_response_and_models() -> None:
    resp = CompletionResponse(
        model="m", choices=[{"index": 0, "text": "x", "finish_reason": "length"}], usage={"prompt_tokens": 1}
    )
    assert resp.object == "text_completion" and resp.id.startswith("cmpl-")
    listing = ModelList(data=[ModelCard(id="m", max_model_len=4096)]).model_dump()
    assert listing["object"] == "list"
    assert listing["data"][0]["object"] == "model" and listing["data"][0]["max_model_len"] == 4096


def test_finish_reason_is_restricted() -> None:
    with pytest.raises(ValidationError):
        CompletionResponse(model="m", choices=[{"index": 0, "text": "", "finish_reason": "eos"}], usage={})


# ---------------------------------------------------------------------------------------------------- SSE


def frame_json(frame: str) -> dict[str, Any]:
    assert frame.startswith("data: ") and frame.endswith("\n\n") and "\n" not in frame[:-2]
    return json.loads(frame[len("data: ") : -2])


def test_sse_basics() -> None:
    assert sse_frame('{"a":1}') == 'data: {"a":1}\n\n'
    assert SSE_DONE == "data: [DONE]\n\n"
    assert frame_json(error_frame(APIError.internal())) == APIError.internal().body()


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_chunks_have_the_model_shape(include_usage: bool) -> None:
    enc = ChatChunkEncoder("chatcmpl-1", "m", 123, include_usage=include_usage)
    frames = [
        enc.role(),
        enc.content('a "quoted"\nline ü 😀'),
        enc.content("x", index=1),
        enc.finish("length"),
    ]
    chunks = [ChatCompletionChunk.model_validate_json(json.dumps(frame_json(f))) for f in frames]
    assert [c.choices[0].delta.content for c in chunks] == ["", 'a "quoted"\nline ü 😀', "x", None]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[2].choices[0].index == 1
    assert chunks[3].choices[0].finish_reason == "length"
    assert all(
        (c.id, c.created, c.model, c.object) == ("chatcmpl-1", 123, "m", "chat.completion.chunk")
        for c in chunks
    )
    assert all(("usage" in frame_json(f)) == include_usage for f in frames)
    usage = frame_json(enc.usage(3, 4))
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 0},  # always an integer
    }


def test_chat_chunk_equals_model_dump() -> None:
    enc = ChatChunkEncoder("id", "m", 1)
    model = ChatCompletionChunk(
        id="id", created=1, model="m", choices=[{"index": 0, "delta": {"content": "hé"}}]
    )
    expected = model.model_dump(exclude_none=True)
    expected["choices"][0].update(logprobs=None, finish_reason=None)
    assert frame_json(enc.content("hé")) == expected


def test_completion_chunks_have_the_model_shape() -> None:
    enc = CompletionChunkEncoder("cmpl-1", "m", 5, include_usage=True)
    text = CompletionChunk.model_validate(frame_json(enc.text("tok")))
    assert (text.object, text.choices[0].text, text.choices[0].finish_reason) == (
        "text_completion",
        "tok",
        None,
    )
    end = CompletionChunk.model_validate(frame_json(enc.finish("stop", index=2)))
    assert (end.choices[0].index, end.choices[0].text, end.choices[0].finish_reason) == (2, "", "stop")
    assert CompletionChunk.model_validate(frame_json(enc.usage(1, 2))).usage.total_tokens == 3
