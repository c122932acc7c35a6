"""``POST /v1/responses``: OpenAI's Responses API over the same serving machinery as chat.

A request is `instructions` (a system message) and `input` (a string, or a list of items: messages,
`function_call`s the model made earlier and the `function_call_output`s that answer them), reduced to
chat messages, rendered with the chat template and generated like one chat choice (its sampling
fields are `SamplingFields`, the ones chat and completions use). The answer is one output item: a
`message` with one `output_text` part, or (function tools in play and the answer is calls) one
`function_call` item per call. `max_output_tokens` reached: status `incomplete`, with
`incomplete_details.reason` `max_output_tokens`.

Streamed, the events are OpenAI's: `response.created`, `response.in_progress`,
`response.output_item.added`, `response.content_part.added`, `response.output_text.delta` (one per
write, as chat's chunks), `response.output_text.done`, `response.content_part.done`,
`response.output_item.done`, then `response.completed` (or `response.incomplete`) carrying the whole
response with its usage; calls come as `response.output_item.added`,
`response.function_call_arguments.delta` / `.done` and `response.output_item.done`. Each event is
`event: <type>` + `data: <json>` with a `sequence_number`; there is no `[DONE]`. A failure after the
stream started is an `error` event, then `response.failed`. The text deltas are written from
pre-encoded heads (no pydantic per chunk).

Nothing is stored: `store` is accepted and ignored (the response says `store: false`), and
`previous_response_id`, `conversation`, `item_reference` inputs and the like are 400s naming them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from trtllm_service.api.metrics import RequestMetrics
from trtllm_service.api.openai.errors import request_error
from trtllm_service.api.openai.protocol import SamplingFields, _Rule, _unset
from trtllm_service.api.openai.serving import (
    SSE_HEADERS,
    _api_error,
    _check_engine_features,
    _Choice,
    _collect_all,
    _plainly_text,
    _Result,
    error_response,
)
from trtllm_service.api.streaming import StreamBody
from trtllm_service.chat import tool_calls
from trtllm_service.errors import APIError
from trtllm_service.relay.guided import Guide, GuideRequestError, checked, json_schema_guide

if TYPE_CHECKING:
    from trtllm_service.api.openai.serving import OpenAIServing

RESPONSES_ROUTE = "/v1/responses"

_NOT_STORED = "responses are not stored by this server: send the whole conversation as 'input'"
_RESPONSES_UNSUPPORTED: dict[str, _Rule] = {
    "n": (lambda v: v in (None, 1), "a response has one output (use chat completions for n > 1)"),
    "previous_response_id": (_unset, _NOT_STORED),
    "conversation": (_unset, _NOT_STORED),
    "prompt": (_unset, "stored prompt templates are not supported: send 'instructions' and 'input'"),
    "background": (_unset, "background responses are not supported"),
    "reasoning": (
        lambda v: _unset(v) or (isinstance(v, dict) and all(x is None for x in v.values())),
        "reasoning is not supported",
    ),
    "include": (
        lambda v: isinstance(v, list) and "message.output_text.logprobs" not in v,
        "'message.output_text.logprobs' is not supported",
    ),
    "top_logprobs": (lambda v: v in (None, 0), "log probabilities are not supported on /v1/responses"),
    "truncation": (
        lambda v: v in (None, "disabled"),
        "only 'disabled' truncation is supported (a prompt too long is a 400)",
    ),
    "max_tool_calls": (_unset, "max_tool_calls is not supported"),
    "stream_options": (lambda v: isinstance(v, dict), "stream_options must be an object"),
    "prompt_cache_retention": (lambda v: True, ""),
}
"""What /v1/responses cannot honour (a 400 naming it unless "off"); stream_options
(include_obfuscation) and prompt_cache_retention only shape delivery and caching: accepted, ignored."""


# ---- the request -----------------------------------------------------------------------------------------


class FunctionTool(BaseModel):
    """A function the model may call (the Responses API's flat shape)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionToolChoice(BaseModel):
    """`tool_choice` naming the one function to call."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["function"]
    name: str


class TextFormat(BaseModel):
    """`text.format`: plain text, any JSON object, or JSON that validates against a schema."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = Field(None, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> TextFormat:
        if self.type == "json_schema" and (self.schema_ is None or self.name is None):
            missing = "schema" if self.schema_ is None else "name"
            raise request_error(
                "missing_required_parameter", f"'{missing}' is required for type 'json_schema'.", missing
            )
        return self


class TextConfig(BaseModel):
    """`text`: the answer's format."""

    model_config = ConfigDict(extra="forbid", strict=True)

    format: TextFormat | None = None
    verbosity: None = Field(None, description="Not supported (null only)")


class ResponsesRequest(SamplingFields):
    """``POST /v1/responses``."""

    _unsupported: ClassVar[dict[str, _Rule]] = _RESPONSES_UNSUPPORTED
    _messages: list[dict[str, Any]] = PrivateAttr(default_factory=list)  # instructions + input, as chat

    input: str | list[dict[str, Any]] = Field(
        description="A string (one user message) or a list of items: messages (text parts), "
        "function_call and function_call_output"
    )
    instructions: str | None = Field(None, description="A system message before the input")
    max_output_tokens: int | None = Field(None, ge=1)
    tools: list[FunctionTool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = Field(
        None, description="Default 'auto' with tools; 'required' and a named function always call"
    )
    parallel_tool_calls: bool | None = Field(None, description="Whether an answer may hold several calls")
    text: TextConfig | None = Field(None, description="{'format': {'type': 'json_schema', 'name', 'schema'}}")

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools_only(cls, value: Any) -> Any:
        for i, tool in enumerate(value if isinstance(value, list) else ()):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if isinstance(kind, str) and kind != "function":
                raise request_error(
                    "unsupported_value",
                    f"Tool type {kind!r} is not supported: only 'function' tools are.",
                    i,
                    "type",
                )
        return value

    @field_validator("input", mode="before")
    @classmethod
    def _check_input(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise request_error("invalid_value", "'input' must not be an empty list.")
        if isinstance(value, list):
            for i, item in enumerate(value):
                if not isinstance(item, dict):
                    raise request_error("invalid_type", "Each input item must be an object.", i)
        return value

    @model_validator(mode="after")
    def _reduce(self) -> ResponsesRequest:
        """The input as chat messages; tools and the answer's format as the one guide."""
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            messages.append({"role": "user", "content": self.input})
        else:
            for i, item in enumerate(self.input):
                _add_item(messages, item, i)
        self._messages = messages
        self._check_tools()
        return self

    def _check_tools(self) -> None:
        names = [tool.name for tool in self.tools or []]
        if len(set(names)) != len(names):
            raise request_error("invalid_value", "Function names in 'tools' must be unique.", "tools")
        choice = self.tool_choice
        if isinstance(choice, FunctionToolChoice) and choice.name not in names:
            raise request_error(
                "invalid_value",
                f"tool_choice names function {choice.name!r}, which is not in 'tools'.",
                "tool_choice",
            )
        if choice == "required" and not names:
            raise request_error("invalid_value", "tool_choice 'required' needs 'tools'.", "tool_choice")
        self._guide = None
        fmt = self.text.format if self.text is not None else None
        if fmt is not None and fmt.type != "text":
            self._guide = self._format_guide(fmt)
        if self.tool_mode == "forced":
            if self._guide is not None:
                raise request_error(
                    "invalid_value",
                    "A forced tool call cannot be combined with text.format.",
                    "tool_choice",
                )
            name = choice.name if isinstance(choice, FunctionToolChoice) else None
            schema = tool_calls.call_schema(self.functions(), name)
            try:
                self._guide = checked(("json_schema", json.dumps(schema)), "tools")
            except GuideRequestError as exc:
                raise request_error("invalid_value", str(exc), "tools") from None

    @staticmethod
    def _format_guide(fmt: TextFormat) -> Guide:
        try:
            if fmt.type == "json_object":
                return checked(("json", ""), "text.format")
            guide = json_schema_guide(fmt.schema_, "text.format.schema")
            return checked(guide, "text.format.schema")
        except GuideRequestError as exc:
            raise request_error("invalid_value", str(exc), *exc.param.split(".")) from None

    @property
    def tool_mode(self) -> Literal["auto", "forced"] | None:
        """None: no tools in play; auto: the answer may be calls; forced: it is a call."""
        if not self.tools or self.tool_choice == "none":
            return None
        return "auto" if self.tool_choice in (None, "auto") else "forced"

    @property
    def guide_param(self) -> str:
        """The field that asked for the guide (for a model that cannot guide)."""
        return "tool_choice" if self.tool_mode == "forced" else "text.format"

    def functions(self) -> list[dict[str, Any]]:
        """The offered functions as plain dicts (chat's `function` objects), for the prompt."""
        return [tool.model_dump(exclude_none=True, exclude={"type"}) for tool in self.tools or []]

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_output_tokens

    def chat_messages(self) -> list[dict[str, Any]]:
        """`instructions` and `input` as chat messages for ``PromptFormatter.render``."""
        return self._messages


_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "refusal", "text")
_MESSAGE_KEYS = frozenset({"type", "role", "content", "id", "status", "phase"})


def _add_item(messages: list[dict[str, Any]], item: dict[str, Any], i: int) -> None:
    """Appends input item `i` to the chat messages (400s name `input[i]...`)."""
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        _unknown_keys(item, _MESSAGE_KEYS, i)
        role = item.get("role")
        if role not in _MESSAGE_ROLES:
            raise request_error(
                "invalid_value",
                f"Invalid role {role!r}: input messages are 'user', 'system', 'developer' or 'assistant'.",
                "input",
                i,
                "role",
            )
        content = _item_text(item.get("content"), i, "content")
        messages.append({"role": "system" if role == "developer" else role, "content": content})
    elif kind == "function_call":
        _unknown_keys(item, frozenset({"type", "call_id", "name", "arguments", "id", "status"}), i)
        call = {key: _string(item, key, i) for key in ("call_id", "name", "arguments")}
        made = {"id": call["call_id"], "name": call["name"], "arguments": call["arguments"]}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(made)  # the calls of one turn: one message
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [made]})
    elif kind == "function_call_output":
        _unknown_keys(item, frozenset({"type", "call_id", "output", "id", "status"}), i)
        call_id = _string(item, "call_id", i)
        output = _item_text(item.get("output"), i, "output")
        messages.append({"role": "tool", "content": output, "tool_call_id": call_id})
    elif kind is None:
        raise request_error(
            "missing_required_parameter", "An input item needs a 'type' (or a 'role').", "input", i
        )
    else:
        why = (
            _NOT_STORED
            if kind == "item_reference"
            else "only message, function_call and function_call_output"
        )
        raise request_error(
            "unsupported_value", f"Input item type {kind!r} is not supported: {why}.", "input", i, "type"
        )


def _unknown_keys(item: dict[str, Any], known: frozenset[str], i: int) -> None:
    for key in item:
        if key not in known:
            raise request_error(
                "unknown_parameter", f"Unrecognized key {key!r} in input item {i}.", "input", i, key
            )


def _string(item: dict[str, Any], key: str, i: int) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise request_error(
            "invalid_type", f"'{key}' of a {item.get('type')} item must be a string.", "input", i, key
        )
    return value


def _item_text(content: Any, i: int, key: str) -> str:
    """A message's content or a call's output: a string, or text parts (joined with newlines); any
    other part (an image, a file, audio) is a 400 naming it."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise request_error(
            "invalid_type", f"'{key}' must be a string or a list of text parts.", "input", i, key
        )
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS:
            raise request_error(
                "unsupported_value",
                f"Content part type {kind!r} is not supported: only text parts (input_text, output_text) are.",
                "input",
                i,
                key,
                j,
                "type",
            )
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise request_error(
                "invalid_type", "A text part needs a string 'text'.", "input", i, key, j, "text"
            )
        texts.append(text)
    return "\n".join(texts)


# ---- the response ----------------------------------------------------------------------------------------


_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _hex_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    """The response object's parts: its constant fields (said once), output items, usage, events."""

    def __init__(self, request: ResponsesRequest, model: str) -> None:
        self.id = _hex_id("resp")
        self.created_at = int(time.time())
        self.message_id = _hex_id("msg")
        self.request = request
        self.model = model
        self.sequence = 0
        fmt = request.text.format if request.text is not None and request.text.format is not None else None
        choice = request.tool_choice
        self._fixed = {
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "max_tool_calls": None,
            "model": model,
            "parallel_tool_calls": request.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": request.temperature,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "tool_choice": choice.model_dump()
            if isinstance(choice, FunctionToolChoice)
            else (choice or "auto"),
            "tools": [tool.model_dump() for tool in request.tools or []],
            "top_p": request.top_p,
            "truncation": "disabled",
            "user": request.user,
            "metadata": {},
            "background": False,
        }

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The response object with this status, output and usage."""
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": incomplete,
            "output": output,
            "usage": usage,
            **self._fixed,
        }

    @staticmethod
    def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
        return {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens,
        }

    def message(self, text: str, status: str) -> dict[str, Any]:
        return {
            "id": self.message_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": [self.text_part(text)] if status != "in_progress" else [],
        }

    @staticmethod
    def text_part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    @staticmethod
    def function_call(name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
        return {
            "id": _hex_id("fc"),
            "type": "function_call",
            "status": status,
            "call_id": tool_calls.new_call_id(),
            "name": name,
            "arguments": arguments,
        }

    def output(
        self, result: _Result, functions: list[dict[str, Any]] | None
    ) -> tuple[list[dict[str, Any]], str]:
        """The output items of a finished answer, and the response's status."""
        status = "incomplete" if result.finish_reason == "length" else "completed"
        calls = tool_calls.parse_calls(result.text, functions) if functions else None
        if not calls:
            return [self.message(result.text, status)], status
        if self.request.parallel_tool_calls is False:
            calls = calls[:1]
        return [self.function_call(name, arguments) for name, arguments in calls], "completed"

    # ---- events

    def event(self, kind: str, **fields: Any) -> str:
        """One SSE event (not for the per-token path: `TextDeltas` writes those)."""
        self.sequence += 1
        data = _encode({"type": kind, **fields, "sequence_number": self.sequence - 1})
        return f"event: {kind}\ndata: {data}\n\n"

    def opening(self) -> str:
        """response.created and response.in_progress."""
        snapshot = self.response("in_progress", [])
        return self.event("response.created", response=snapshot) + self.event(
            "response.in_progress", response=snapshot
        )

    def text_opening(self) -> str:
        return self.event(
            "response.output_item.added", output_index=0, item=self.message("", "in_progress")
        ) + self.event(
            "response.content_part.added",
            item_id=self.message_id,
            output_index=0,
            content_index=0,
            part=self.text_part(""),
        )

    def delta(self, text: str) -> str:
        """A response.output_text.delta event: one string format per write."""
        self.sequence += 1
        return (
            'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","item_id":"'
            f'{self.message_id}","output_index":0,"content_index":0,"delta":{_encode(text)},'
            f'"logprobs":[],"sequence_number":{self.sequence - 1}}}\n\n'
        )

    def text_closing(self, text: str, status: str) -> str:
        where = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        return (
            self.event("response.output_text.done", **where, text=text, logprobs=[])
            + self.event("response.content_part.done", **where, part=self.text_part(text))
            + self.event("response.output_item.done", output_index=0, item=self.message(text, status))
        )

    def call_events(self, calls: list[dict[str, Any]]) -> str:
        frames = []
        for index, call in enumerate(calls):
            frames.append(
                self.event(
                    "response.output_item.added",
                    output_index=index,
                    item={**call, "arguments": "", "status": "in_progress"},
                )
            )
            where = {"item_id": call["id"], "output_index": index}
            frames.append(
                self.event("response.function_call_arguments.delta", **where, delta=call["arguments"])
            )
            frames.append(
                self.event(
                    "response.function_call_arguments.done",
                    **where,
                    arguments=call["arguments"],
                    name=call["name"],
                )
            )
            frames.append(self.event("response.output_item.done", output_index=index, item=call))
        return "".join(frames)

    def closing(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any]) -> str:
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return self.event(kind, response=self.response(status, output, usage))

    def failure(self, error: APIError, output: list[dict[str, Any]]) -> str:
        """An error event, then response.failed."""
        code = error.code or error.type
        return self.event("error", code=code, message=error.message, param=error.param) + self.event(
            "response.failed",
            response=self.response("failed", output, error={"code": code, "message": error.message}),
        )


# ---- serving ---------------------------------------------------------------------------------------------


class OpenAIResponses:
    """Serves ``/v1/responses`` with the chat machinery of an `OpenAIServing`."""

    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving
        self.runtime = serving.runtime

    async def create(self, request: ResponsesRequest, http_request: Request | None = None) -> Response:
        serving, runtime = self.serving, self.runtime
        served = serving._label(request.model)
        metrics = RequestMetrics(served, RESPONSES_ROUTE)
        offered = request.functions() or None  # shown to the model even with tool_choice "none"
        functions = offered if request.tool_mode else None  # what an answer may call
        try:
            params = replace(request.sampling_params(), lora=serving.check_model(request.model))
            _check_engine_features(runtime, params, request)
            if params.guide is not None:
                runtime.check_guide(request.guide_param)
            prepared = await runtime.prepare_chat(request.chat_messages(), params, tools=offered)
            choices = await serving._start([prepared], params, request.samples_per_prompt)
        except APIError as exc:
            metrics.done(exc.status)
            return error_response(exc)
        metrics.first_token()
        builder = ResponseBuilder(request, served)
        prompt_tokens = prepared.prompt_tokens
        if request.stream:
            if functions and not await _plainly_text(choices, request.tool_mode):
                frames = _whole_events(builder, choices, functions, metrics, prompt_tokens)
            else:
                frames = _text_events(builder, choices, metrics, prompt_tokens)
            return StreamBody(frames, "text/event-stream", SSE_HEADERS)  # type: ignore[return-value]
        try:
            results = await _collect_all(choices, http_request)
        except APIError as exc:
            metrics.done(exc.status)
            return error_response(exc)
        if results is None:
            metrics.done(499)
            return Response(status_code=499)  # the client is gone: nobody reads the answer
        tokens = sum(r.completion_tokens for r in results)
        metrics.done(200, results[0].finish_reason, prompt_tokens, tokens)
        if request.ranks_best_of:  # best_of candidates: the one with the highest cumulative log prob
            results = [max(results, key=lambda r: sum(e.logprob or 0.0 for e in r.logprobs))]
        output, status = builder.output(results[0], functions)
        usage = builder.usage(prompt_tokens, results[0].completion_tokens, _cached(choices))
        return JSONResponse(builder.response(status, output, usage))


def _cached(choices: list[_Choice]) -> int:
    """The prompt tokens the engine found in its KV cache (the most any candidate found)."""
    return max((int(getattr(c.stream, "cached_tokens", 0) or 0) for c in choices), default=0)


async def _text_events(
    builder: ResponseBuilder, choices: list[_Choice], metrics: RequestMetrics, prompt_tokens: int
) -> AsyncGenerator[bytes, None]:
    """A streamed text answer: the opening events with the first text, a delta per write, the end."""
    choice = choices[0]
    stream = choice.stream
    status_code, reason, parts = 499, None, [choice.first]
    try:
        head = builder.opening() + builder.text_opening()
        yield (head + builder.delta(choice.first) if choice.first else head).encode()
        while stream.finish_reason is None:
            text = await stream.read()
            if text:
                parts.append(text)
                yield builder.delta(text).encode()
        text = "".join(parts)
        status = "incomplete" if stream.finish_reason == "length" else "completed"
        usage = builder.usage(prompt_tokens, stream.completion_tokens, _cached(choices))
        output = [builder.message(text, status)]
        yield (builder.text_closing(text, status) + builder.closing(status, output, usage)).encode()
        status_code, reason = 200, stream.finish_reason
    except Exception as exc:  # the 200 status is sent already: report in the stream, then end it
        error = _api_error(exc)
        status_code = error.status
        yield builder.failure(error, []).encode()
    finally:
        stream.close()
        metrics.done(status_code, reason, prompt_tokens, stream.completion_tokens)


async def _whole_events(
    builder: ResponseBuilder,
    choices: list[_Choice],
    functions: list[dict[str, Any]],
    metrics: RequestMetrics,
    prompt_tokens: int,
) -> AsyncGenerator[bytes, None]:
    """An answer that may be calls, streamed when it is whole (only then is it known to be calls)."""
    status_code, reason, tokens = 499, None, 0
    try:
        yield builder.opening().encode()
        results = await _collect_all(choices, None)
        assert results is not None
        result = results[0]
        tokens, reason = result.completion_tokens, result.finish_reason
        output, status = builder.output(result, functions)
        if output[0]["type"] == "message":
            text = output[0]["content"][0]["text"]
            body = (
                builder.text_opening()
                + (builder.delta(text) if text else "")
                + builder.text_closing(text, status)
            )
        else:
            body = builder.call_events(output)
        usage = builder.usage(prompt_tokens, tokens, _cached(choices))
        yield (body + builder.closing(status, output, usage)).encode()
        status_code = 200
    except Exception as exc:  # the 200 status is sent already: report in the stream, then end it
        error = _api_error(exc)
        status_code = error.status
        yield builder.failure(error, []).encode()
    finally:
        for choice in choices:
            choice.stream.close()
        metrics.done(status_code, reason, prompt_tokens, tokens)
