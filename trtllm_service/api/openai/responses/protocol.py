"""``POST /v1/responses``: the Responses API's request, and its response object and events.

A request is `instructions` (a system message) and `input` (a string, or a list of items: messages,
`function_call`s the model made earlier, the `function_call_output`s that answer them, and earlier
`reasoning` items, which are left out of the prompt), reduced to chat messages and generated like
one chat choice: the sampling fields are `SamplingFields` and the tool rules `ToolUse`, the ones chat
uses (`serving.OpenAIServing.responses` serves it). The answer is a `reasoning` item when the model
reasons (`pack_model.py --reasoning-parser`), then a `message` with one `output_text` part, or
(function tools in play and the answer is calls) one `function_call` item per call.
`max_output_tokens` reached: status `incomplete`, `incomplete_details.reason` `max_output_tokens`.

Streamed, the events are OpenAI's: `response.created`, `response.in_progress`, then per item
`response.output_item.added`, `response.content_part.added`, `response.reasoning_text.delta` or
`response.output_text.delta` (one per write, from pre-encoded heads: no pydantic per chunk), their
`.done`, `response.content_part.done`, `response.output_item.done`, and last `response.completed`
(or `response.incomplete`) carrying the whole response with its usage. Calls come when the answer
is complete, as `response.output_item.added`, `response.function_call_arguments.delta` / `.done`
and `response.output_item.done`. Each event is `event: <type>` + `data: <json>` with a
`sequence_number`; there is no `[DONE]`. A failure after the stream started is an `error` event,
then `response.failed`.

Nothing is stored: `store: true`, `previous_response_id`, `conversation` and `item_reference`
inputs are 400s naming them, as are built-in tools and non-text inputs.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from trtllm_service.api.generation.protocol import (
    Rule,
    SamplingFields,
    StrictModel,
    ToolUse,
    message_role,
    unset,
)
from trtllm_service.api.openai.protocol import (
    MAX_TOOLS,
    PARALLEL_TOOL_CALLS_DOC,
    TOOL_CHOICE_DOC,
    FunctionDefinition,
    NamedFunction,
    ReasoningEffort,
    ToolChoiceMode,
)
from trtllm_service.api.server.request_errors import request_error
from trtllm_service.relay.guided import Guide, GuideRequestError, json_schema_guide

RESPONSES_ROUTE = "/v1/responses"

_NOT_STORED = "responses are not stored by this server: send the whole conversation as 'input'"
_RESPONSES_UNSUPPORTED: dict[str, Rule] = {
    "store": (lambda v: v in (None, False), _NOT_STORED),
    "n": (lambda v: v in (None, 1), "a response has one output (use chat completions for n > 1)"),
    "previous_response_id": (unset, _NOT_STORED),
    "conversation": (unset, _NOT_STORED),
    "prompt": (unset, "stored prompt templates are not supported: send 'instructions' and 'input'"),
    "background": (unset, "background responses are not supported"),
    "include": (
        lambda v: isinstance(v, list) and "message.output_text.logprobs" not in v,
        "'message.output_text.logprobs' is not supported",
    ),
    "top_logprobs": (lambda v: v in (None, 0), "log probabilities are not supported on /v1/responses"),
    "truncation": (
        lambda v: v in (None, "disabled"),
        "only 'disabled' truncation is supported (a prompt too long is a 400)",
    ),
    "max_tool_calls": (unset, "max_tool_calls is not supported"),
    "stream_options": (lambda v: isinstance(v, dict), "stream_options must be an object"),
    "prompt_cache_retention": (lambda v: True, ""),
}
"""What /v1/responses cannot honour (a 400 naming it unless "off"); stream_options
(include_obfuscation) and prompt_cache_retention only shape delivery and caching: accepted, ignored."""


# ---- the request -----------------------------------------------------------------------------------------


class FunctionTool(FunctionDefinition):
    """A function the model may call (the Responses API's flat shape: chat's definition plus `type`)."""

    type: Literal["function"]


class FunctionToolChoice(NamedFunction):
    """`tool_choice` naming the one function to call."""

    type: Literal["function"]


class TextFormat(StrictModel):
    """`text.format`: plain text, any JSON object, or JSON that validates against a schema."""

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


class TextConfig(StrictModel):
    """`text`: the answer's format."""

    format: TextFormat | None = None
    verbosity: None = Field(None, description="Not supported (null only)")


class ReasoningConfig(StrictModel):
    """`reasoning`: the effort goes to a chat template that takes `reasoning_effort`; the model's
    thinking is returned whole, so summaries are not offered."""

    effort: ReasoningEffort | None = None
    summary: None = Field(None, description="Not supported (null only): the reasoning comes whole")
    generate_summary: None = Field(None, description="Not supported (null only)")


class ResponsesRequest(ToolUse, SamplingFields):
    """``POST /v1/responses``."""

    _unsupported: ClassVar[dict[str, Rule]] = _RESPONSES_UNSUPPORTED
    _messages: list[dict[str, Any]] = PrivateAttr(default_factory=list)  # instructions + input, as chat

    input: str | list[dict[str, Any]] = Field(
        description="A string (one user message) or a list of items: messages (text parts), "
        "function_call, function_call_output and reasoning (left out of the prompt)"
    )
    instructions: str | None = Field(None, description="A system message before the input")
    max_output_tokens: int | None = Field(None, ge=1)
    tools: list[FunctionTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoiceMode | FunctionToolChoice | None = Field(None, description=TOOL_CHOICE_DOC)
    parallel_tool_calls: bool | None = Field(None, description=PARALLEL_TOOL_CALLS_DOC)
    text: TextConfig | None = Field(None, description="{'format': {'type': 'json_schema', 'name', 'schema'}}")
    reasoning: ReasoningConfig | None = Field(
        None, description="{'effort': ...} for a template that takes it"
    )

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools_only(cls, value: Any) -> Any:
        for i, tool in enumerate(value if isinstance(value, list) else ()):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if isinstance(kind, str) and kind != "function":
                raise request_error(
                    "unsupported_value",
                    f"Unsupported value: 'tools[{i}].type' {kind!r}: built-in tools are not supported, "
                    "only 'function' tools are.",
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
        if not messages:
            raise request_error("invalid_value", "'input' holds no message to answer.", "input")
        self._messages = messages
        fmt = self.text.format if self.text is not None else None
        if fmt is not None and fmt.type != "text":
            self.settle_guide(*_format_guide(fmt))
        choice = self.tool_choice
        self._settle_tools(choice.name if isinstance(choice, FunctionToolChoice) else None)
        return self

    @property
    def guide_param(self) -> str:
        """The field that asked for the guide (for a model that cannot guide)."""
        return "tool_choice" if self.tool_mode == "forced" else "text.format"

    @property
    def reasoning_effort(self) -> str | None:
        return self.reasoning.effort if self.reasoning is not None else None

    def functions(self) -> list[dict[str, Any]]:
        """The offered functions as plain dicts (chat's `function` objects), for the prompt."""
        return [tool.model_dump(exclude_none=True, exclude={"type"}) for tool in self.tools or []]

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_output_tokens

    def chat_messages(self) -> list[dict[str, Any]]:
        """`instructions` and `input` as chat messages for ``PromptFormatter.render``."""
        return self._messages


def _format_guide(fmt: TextFormat) -> tuple[Guide, str]:
    """The guide of `text.format`, and where it is."""
    if fmt.type == "json_object":
        return ("json", ""), "text.format"
    try:
        return json_schema_guide(fmt.schema_, "text.format.schema"), "text.format.schema"
    except GuideRequestError as exc:
        raise request_error("invalid_value", str(exc), *exc.param.split(".")) from None


_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "refusal", "text")
_ITEM_KEYS = {
    "message": frozenset({"type", "role", "content", "id", "status", "phase"}),
    "function_call": frozenset({"type", "call_id", "name", "arguments", "id", "status"}),
    "function_call_output": frozenset({"type", "call_id", "output", "id", "status"}),
}


def _add_item(messages: list[dict[str, Any]], item: dict[str, Any], i: int) -> None:
    """Appends input item `i` to the chat messages (400s name `input[i]...`)."""
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "reasoning":
        return  # an earlier answer's thinking: reasoning models' templates leave it out
    for key in item:
        if kind in _ITEM_KEYS and key not in _ITEM_KEYS[kind]:
            raise request_error(
                "unknown_parameter", f"Unrecognized key {key!r} in input item {i}.", "input", i, key
            )
    if kind == "message":
        which = "input messages are 'user', 'system', 'developer' or 'assistant'"
        role = message_role(item, _MESSAGE_ROLES, which, "input", i)
        content = _item_text(item.get("content"), i, "content")
        messages.append({"role": "system" if role == "developer" else role, "content": content})
    elif kind == "function_call":
        call = {key: _string(item, key, i) for key in ("call_id", "name", "arguments")}
        made = {"id": call["call_id"], "name": call["name"], "arguments": call["arguments"]}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(made)  # the calls of one turn: one message
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [made]})
    elif kind == "function_call_output":
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
            else "only message, function_call, function_call_output and reasoning items are"
        )
        raise request_error(
            "unsupported_value", f"Input item type {kind!r} is not supported: {why}.", "input", i, "type"
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
