"""The answers of /v1/messages (`trtllm_service.api.anthropic.events`, `.errors`), read by the official
`anthropic` SDK itself: a non-streamed body as `anthropic.types.Message`, a stream through the SDK's
own SSE decoder and `MessageStream` accumulator, errors as the SDK's exception classes. A streamed
answer accumulates to the message the non-streamed body of the same answer is."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.types import Message

from tensorrtllm_backend.stop_strings import StopStringMatcher
from trtllm_service.api.anthropic.errors import error_event, error_response, request_id_headers
from trtllm_service.api.anthropic.events import (
    MessageBuilder,
    count_tokens_body,
    stop_reason,
    stop_sequence_of,
)
from trtllm_service.api.anthropic.protocol import MessagesRequest, parse_request
from trtllm_service.errors import APIError
from trtllm_service.request_ids import REQUEST_ID

pytestmark = pytest.mark.unit

TIME = {"name": "get_time", "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}
PROMPT_TOKENS = 17


def request(**fields: Any) -> MessagesRequest:
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_request(MessagesRequest, body)


def client(
    status: int, body: str | bytes, content_type: str, headers: dict[str, str] | None = None
) -> anthropic.Anthropic:
    """The official client, answered `body` with `status` whatever it asks."""

    def answer(_: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(
            status, content=body, headers={"content-type": content_type, **(headers or {})}
        )

    http = httpx2.Client(transport=httpx2.MockTransport(answer))
    return anthropic.Anthropic(api_key="x", base_url="http://test", http_client=http, max_retries=0)


ASK: dict[str, Any] = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


def sdk_message(body: dict[str, Any]) -> Message:
    """A non-streamed body as the SDK returns it (and as its model validates it)."""
    Message.model_validate(body)
    return client(200, json.dumps(body), "application/json").messages.create(**ASK)


def sdk_stream(sse: str) -> tuple[list[str], Message]:
    """A stream as the SDK reads it: the event types, in order, and the message it accumulates."""
    with client(200, sse.encode(), "text/event-stream").messages.stream(**ASK) as stream:
        kinds = [event.type for event in stream]
        return kinds, stream.get_final_message()


def comparable(message: Message) -> dict[str, Any]:
    """A message without its ids (made fresh for each answer)."""
    data = message.model_dump(exclude_none=True)
    data.pop("id")
    for block in data["content"]:
        block.pop("id", None)
    return data


def raw_events(sse: str) -> list[tuple[str, dict[str, Any]]]:
    """(event, data) of each SSE event, as the wire carries them."""
    out = []
    for frame in sse.split("\n\n"):
        if not frame:
            continue
        event_line, data_line = frame.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: "), frame
        data = json.loads(data_line.removeprefix("data: "))
        assert data["type"] == event_line.removeprefix("event: ")
        out.append((data["type"], data))
    return out


# ---- a text answer ---------------------------------------------------------------------------------------


def test_a_streamed_text_answer_is_the_non_streamed_one() -> None:
    builder = MessageBuilder(request(stream=True), "served-model", PROMPT_TOKENS)
    sse = builder.opening()
    sse += builder.write("", "Hel")
    sse += builder.write("", 'lo, "world"')
    sse += builder.write("", "")
    sse += builder.write("", " \u00e9\n")
    sse += builder.finish("stop", 5, cached_tokens=4)
    kinds, streamed = sdk_stream(sse)
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "text",
        "content_block_delta",
        "text",
        "content_block_delta",
        "text",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]  # the SDK's events (a `text` event after each text delta); the ping is read and dropped
    assert [block.type for block in streamed.content] == ["text"]
    assert streamed.content[0].text == 'Hello, "world" \u00e9\n'  # type: ignore[union-attr]  # a text block: asserted above
    assert (streamed.stop_reason, streamed.stop_sequence, streamed.model) == (
        "end_turn",
        None,
        "served-model",
    )
    usage = streamed.usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == (13, 4, 5)

    whole = MessageBuilder(request(), "served-model", PROMPT_TOKENS).message(
        None, 'Hello, "world" \u00e9\n', None, "stop", 5, cached_tokens=4
    )
    assert comparable(sdk_message(whole)) == comparable(streamed)


def test_the_wire_order_of_a_stream() -> None:
    builder = MessageBuilder(request(stream=True), "m", PROMPT_TOKENS)
    sse = builder.opening() + builder.write("Hmm.", "") + builder.write(" Yes.", "A") + builder.write("", "B")
    sse += builder.finish("length", 9)
    events = raw_events(sse)
    assert [kind for kind, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",  # the signature, before the thinking block's stop
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["role"] == "assistant"
    assert start["usage"]["input_tokens"] == PROMPT_TOKENS and start["usage"]["output_tokens"] == 0
    assert [data.get("index") for kind, data in events if kind.startswith("content_block")] == [0] * 5 + [
        1
    ] * 4
    assert [data["delta"]["type"] for kind, data in events if kind == "content_block_delta"] == [
        "thinking_delta",
        "thinking_delta",
        "signature_delta",
        "text_delta",
        "text_delta",
    ]
    assert events[2][1]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert events[7][1]["content_block"] == {"type": "text", "text": ""}
    assert events[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert events[-2][1]["usage"]["output_tokens"] == 9


def test_a_streamed_thinking_answer_is_the_non_streamed_one() -> None:
    builder = MessageBuilder(request(stream=True), "m", PROMPT_TOKENS)
    sse = (
        builder.opening()
        + builder.write("Two and ", "")
        + builder.write("two.", "Fo")
        + builder.write("", "ur.")
    )
    sse += builder.finish("stop", 8)
    _, streamed = sdk_stream(sse)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in streamed.content] == [
        ("thinking", "Two and two."),
        ("text", "Four."),
    ]
    whole = MessageBuilder(request(), "m", PROMPT_TOKENS).message("Two and two.", "Four.", None, "stop", 8)
    assert comparable(sdk_message(whole)) == comparable(streamed)
    assert whole["content"][0] == {"type": "thinking", "thinking": "Two and two.", "signature": ""}


def test_omitted_thinking_comes_without_its_text() -> None:
    asked = request(stream=True, thinking={"type": "adaptive", "display": "omitted"})
    builder = MessageBuilder(asked, "m", PROMPT_TOKENS)
    sse = (
        builder.opening()
        + builder.write("secret", "")
        + builder.write("more", "Answer.")
        + builder.finish("stop", 4)
    )
    _, streamed = sdk_stream(sse)
    assert [(b.type, getattr(b, "thinking", None)) for b in streamed.content] == [
        ("thinking", ""),
        ("text", None),
    ]
    assert "secret" not in sse
    whole = MessageBuilder(asked, "m", PROMPT_TOKENS).message("secret", "Answer.", None, "stop", 4)
    assert comparable(sdk_message(whole)) == comparable(streamed)


def test_an_empty_answer_has_no_blocks() -> None:
    builder = MessageBuilder(request(stream=True), "m", PROMPT_TOKENS)
    _, streamed = sdk_stream(builder.opening() + builder.finish("stop", 1))
    assert streamed.content == []
    whole = MessageBuilder(request(), "m", PROMPT_TOKENS).message(None, "", None, "stop", 1)
    assert whole["content"] == []
    assert comparable(sdk_message(whole)) == comparable(streamed)


def test_a_stop_sequence_is_named() -> None:
    builder = MessageBuilder(request(stream=True, stop_sequences=["END"]), "m", PROMPT_TOKENS)
    sse = builder.opening() + builder.write("", "done ") + builder.finish("stop", 3, stop_sequence="END")
    _, streamed = sdk_stream(sse)
    assert (streamed.stop_reason, streamed.stop_sequence) == ("stop_sequence", "END")
    whole = MessageBuilder(request(), "m", PROMPT_TOKENS).message(
        None, "done ", None, "stop", 3, stop_sequence="END"
    )
    assert (whole["stop_reason"], whole["stop_sequence"]) == ("stop_sequence", "END")


# ---- calls -----------------------------------------------------------------------------------------------


def test_streamed_calls_are_the_non_streamed_ones() -> None:
    calls = [("get_time", '{"zone": "Europe/Paris"}'), ("get_time", '{"zone": "UTC \\u00e9"}')]
    asked = request(stream=True, tools=[TIME])
    builder = MessageBuilder(asked, "m", PROMPT_TOKENS)
    sse = builder.opening() + builder.whole(
        builder.message("Two zones.", None, calls, "stop", 30, cached_tokens=16)
    )
    kinds, streamed = sdk_stream(sse)
    assert "input_json" in kinds
    assert [(b.type, getattr(b, "name", None), getattr(b, "input", None)) for b in streamed.content] == [
        ("thinking", None, None),
        ("tool_use", "get_time", {"zone": "Europe/Paris"}),
        ("tool_use", "get_time", {"zone": "UTC \u00e9"}),
    ]
    ids = [b.id for b in streamed.content if b.type == "tool_use"]
    assert len(set(ids)) == 2 and all(i.startswith("toolu_") for i in ids)
    assert streamed.stop_reason == "tool_use"
    assert (streamed.usage.input_tokens, streamed.usage.cache_read_input_tokens) == (1, 16)

    whole = MessageBuilder(request(tools=[TIME]), "m", PROMPT_TOKENS).message(
        "Two zones.", None, calls, "stop", 30, cached_tokens=16
    )
    assert comparable(sdk_message(whole)) == comparable(streamed)


def test_calls_win_over_a_spent_max_tokens() -> None:
    assert stop_reason("length", calls=True) == ("tool_use", None)


def test_a_whole_text_answer_streams_as_the_non_streamed_one() -> None:
    builder = MessageBuilder(request(stream=True, tools=[TIME]), "m", PROMPT_TOKENS)
    _, streamed = sdk_stream(
        builder.opening() + builder.whole(builder.message(None, "No call needed.", None, "length", 64))
    )
    whole = MessageBuilder(request(tools=[TIME]), "m", PROMPT_TOKENS).message(
        None, "No call needed.", None, "length", 64
    )
    assert comparable(sdk_message(whole)) == comparable(streamed)
    assert streamed.stop_reason == "max_tokens"


# ---- stop reasons ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("finish", "calls", "matched", "expected"),
    [
        ("stop", False, None, ("end_turn", None)),
        ("length", False, None, ("max_tokens", None)),
        ("stop", False, "###", ("stop_sequence", "###")),
        ("stop", True, None, ("tool_use", None)),
    ],
)
def test_stop_reason(finish: str, calls: bool, matched: str | None, expected: tuple[str, str | None]) -> None:
    assert stop_reason(finish, calls, matched) == expected


def test_the_matched_stop_string_is_read_from_the_relay() -> None:
    class Stream:  # the relay's engine stream keeps its matcher as `_matcher`
        def __init__(self, stops: list[str]) -> None:
            self._matcher = StopStringMatcher(stops) if stops else None

    stream = Stream(["\n\nUser:", "END"])
    shown, stopped = stream._matcher.push("The answer.EN")  # type: ignore[union-attr]  # set: stops were given
    assert (shown, stopped, stop_sequence_of(stream)) == ("The answer.", False, None)
    assert stream._matcher.push("D and more")[1]  # type: ignore[union-attr]  # set: stops were given
    assert stop_sequence_of(stream) == "END"
    assert stop_sequence_of(Stream([])) is None


def test_count_tokens_body() -> None:
    assert count_tokens_body(42) == {"input_tokens": 42}
    assert anthropic.types.MessageTokensCount.model_validate(count_tokens_body(42)).input_tokens == 42


# ---- errors ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "kind", "exception"),
    [
        (
            APIError.bad_request("Bad.", param="messages[0].content"),
            400,
            "invalid_request_error",
            anthropic.BadRequestError,
        ),
        (APIError.invalid_api_key(), 401, "authentication_error", anthropic.AuthenticationError),
        (APIError.model_not_found("claude-x"), 404, "not_found_error", anthropic.NotFoundError),
        (APIError(413, "Too large."), 413, "request_too_large", anthropic.APIStatusError),
        (APIError.rate_limited(retry_after=2), 429, "rate_limit_error", anthropic.RateLimitError),
        (APIError.internal(), 500, "api_error", anthropic.InternalServerError),
        (APIError.unavailable(retry_after=5), 529, "overloaded_error", anthropic.OverloadedError),
        (APIError.timeout(), 504, "timeout_error", anthropic.InternalServerError),
    ],
)
def test_errors_as_the_sdk_reads_them(error: APIError, status: int, kind: str, exception: type) -> None:
    token = REQUEST_ID.set("req_abc123")
    try:
        answer = error_response(error)
    finally:
        REQUEST_ID.reset(token)
    assert answer.status_code == status
    headers = {k: v for k, v in answer.headers.items() if k.lower() not in ("content-length", "content-type")}
    assert headers["request-id"] == "req_abc123"
    if error.retry_after is not None:
        assert headers["retry-after"] == str(round(error.retry_after))
    with pytest.raises(exception) as caught:
        client(answer.status_code, bytes(answer.body), "application/json", headers).messages.create(**ASK)
    assert caught.value.status_code == status
    assert caught.value.type == kind
    assert caught.value.request_id == "req_abc123"
    assert caught.value.api_message is not None and error.message in caught.value.api_message
    body = json.loads(bytes(answer.body))
    assert body["type"] == "error" and body["request_id"] == "req_abc123"


def test_a_param_leads_the_message() -> None:
    answer = error_response(APIError.bad_request("Must be a string.", param="system[0].text"))
    assert json.loads(bytes(answer.body))["error"]["message"] == "system[0].text: Must be a string."


def test_request_id_header_outside_a_request() -> None:
    assert request_id_headers() == {}
    assert request_id_headers("req_1") == {"request-id": "req_1"}


def test_an_error_after_the_start_is_an_error_event() -> None:
    builder = MessageBuilder(request(stream=True), "m", PROMPT_TOKENS)
    failure = builder.failure(APIError.unavailable())
    assert failure == error_event(APIError.unavailable())
    ((kind, data),) = raw_events(failure)
    assert kind == "error" and data["error"]["type"] == "overloaded_error"
    sse = builder.opening() + builder.write("", "par") + failure
    with pytest.raises(anthropic.APIStatusError) as caught:
        sdk_stream(sse)
    assert caught.value.type == "overloaded_error"
