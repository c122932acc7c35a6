"""The requests of Anthropic's Messages API as this server speaks it: ``POST /v1/messages``
(`MessagesRequest`) and ``POST /v1/messages/count_tokens`` (`CountTokensRequest`).

A request is a `system` prompt and `messages` (user and assistant turns of text, `tool_use` and
`tool_result` blocks), reduced to the plain chat messages our chat templates take
(`chat_messages()`): the system prompt first; an assistant's `tool_use` blocks become its
`tool_calls` (arguments as JSON text); each `tool_result` becomes a `tool` message, in order, and a
user message's text after its results one user message. Consecutive turns of one role are joined
into one turn, as Anthropic does. Earlier `thinking` and `redacted_thinking` blocks are accepted
and left out of the prompt (reasoning models' templates drop earlier turns' thinking; their
signatures are not checked). A `tool_result` with `is_error` is shown as ``Error: <content>``.

Generation is one chat choice: the sampling fields are `SamplingFields` (``temperature`` 0..1 as
Anthropic; ``top_p``, ``top_k``; ``stop_sequences`` are our stop strings) and the tool rules
`ToolUse`, as for ``/v1/responses``: ``tool_choice`` ``auto`` may call, ``any`` and ``tool`` always
call (guided decoding on the calls' schema), ``none`` calls nothing, and
``disable_parallel_tool_use`` keeps one call. ``output_config.format`` (a JSON schema) guides the
answer; ``output_config.effort`` goes to a chat template that takes ``reasoning_effort``
(``xhigh`` and ``max`` as ``high``). ``thinking`` is accepted (its budget is not enforced): thinking
blocks come whenever the model's reasoning parser finds reasoning, and ``display: "omitted"`` sends
them without their text. A final assistant message (prefill) is a 400: this server starts a new
assistant turn, it does not continue one.

Parameter policy, as for our OpenAI endpoints: unknown parameters are 400s; parameters we cannot
honour (containers, MCP servers, server tools, context management, ...) are 400s naming them unless
"off"; a few that do not change the text are accepted and ignored (``metadata``, ``service_tier``,
``cache_control``, ``diagnostics``, ``inference_geo``, ``speed``, ``user_profile_id``,
``workspace_id``, ``billing_policy``, ``fallback_credit_token``). ``null`` means "not set". Our
sampling extensions (``repetition_penalty``, ``presence_penalty``, ``frequency_penalty``, ``seed``,
``min_tokens``, ``ignore_eos``, ``stop_token_ids``, ``logit_bias``) are accepted (the SDK sends them
through ``extra_body``); what makes several answers (``n``, ``best_of``, beam search) is not.

Every 400 names its field (``param``, a path like ``messages[1].content[0].type``); `parse_request`
validates a raw body (`errors.error_body` writes the error in Anthropic's shape).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from tensorrtllm_backend.stop_strings import StopStringError, check_stop
from trtllm_service.api.generation.protocol import (
    Rule,
    SamplingFields,
    StrictModel,
    ToolUse,
    drop_unsupported,
    message_role,
    parse_request,
    sent,
    unset,
)
from trtllm_service.api.server.request_errors import request_error
from trtllm_service.relay.guided import GuideRequestError, json_schema_guide

__all__ = [
    "COUNT_TOKENS_ROUTE",
    "EFFORT_PARAM",
    "MESSAGES_ROUTE",
    "CountTokensRequest",
    "MessagesRequest",
    "parse_request",
]

MESSAGES_ROUTE = "/v1/messages"
COUNT_TOKENS_ROUTE = "/v1/messages/count_tokens"
EFFORT_PARAM = "output_config.effort"
"""The field that sets `reasoning_effort` (for the 400 of a template that takes none)."""
MIN_THINKING_BUDGET = 1024  # thinking.budget_tokens, as Anthropic
MAX_TOOLS = 512
TOOL_ERROR_PREFIX = "Error: "
"""Put before the content of a `tool_result` with `is_error` (chat templates have no error flag)."""


def _never(value: Any) -> bool:
    return False


_MULTIPLE = "a message has one answer"
_OFF_ONLY: dict[str, Rule] = {
    "container": (unset, "containers (code execution, skills) are not supported"),
    "mcp_servers": (unset, "MCP servers are not supported: offer their tools as client tools"),
    "context_management": (unset, "context management is not supported"),
    "compaction": (unset, "compaction is not supported"),
    "thread": (unset, "threads are not stored by this server: send the whole conversation"),
    "fallbacks": (unset, "fallback models are not supported"),
    "output_format": (_never, "use 'output_config.format'"),
}
_MESSAGES_OFF_ONLY: dict[str, Rule] = {
    **_OFF_ONLY,
    "stop": (_never, "the Messages API calls it 'stop_sequences'"),
    "user": (_never, "the Messages API takes it as 'metadata.user_id'"),
    "n": (lambda v: v == 1, _MULTIPLE),
    "best_of": (lambda v: v == 1, _MULTIPLE),
    "use_beam_search": (unset, f"beam search is not offered: {_MULTIPLE}"),
    "length_penalty": (unset, "it applies to beam search only"),
    "early_stopping": (unset, "it applies to beam search only"),
}
"""What /v1/messages cannot honour: a 400 naming it unless "off"."""
_IGNORED = (
    "metadata",
    "service_tier",
    "cache_control",
    "diagnostics",
    "inference_geo",
    "speed",
    "user_profile_id",
    "workspace_id",
    "billing_policy",
    "fallback_credit_token",
)
"""Accepted and ignored: they do not change the generated text."""
_OPENAI_ONLY = ("store", "prompt_cache_key", "safety_identifier")
"""OpenAI's harmless parameters, which OpenAI's policy drops silently: not Messages API ones."""
_SERVICE_TIERS = ("auto", "standard_only")


def _apply_policy(body: Any, off_only: dict[str, Rule]) -> Any:
    """The parameter policy of the module docstring, before the fields are validated."""
    if (data := sent(body)) is None:
        return body
    for name in _OPENAI_ONLY:
        if name in data:
            raise request_error("unknown_parameter", f"Unrecognized request argument supplied: {name}", name)
    drop_unsupported(data, off_only)
    _check_metadata(data.get("metadata"))
    tier = data.get("service_tier")
    if tier is not None and tier not in _SERVICE_TIERS:
        raise request_error(
            "invalid_value", f"Invalid 'service_tier' {tier!r}: 'auto' or 'standard_only'.", "service_tier"
        )
    for name in _IGNORED:
        data.pop(name, None)
    return data


def _check_metadata(metadata: Any) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise request_error("invalid_type", "'metadata' must be an object.", "metadata")
    for key, value in metadata.items():
        if key != "user_id":
            raise request_error(
                "unknown_parameter", f"Unrecognized key {key!r} in 'metadata'.", "metadata", key
            )
        if value is not None and not isinstance(value, str):
            raise request_error("invalid_type", "'metadata.user_id' must be a string.", "metadata", key)


# ---- tools, tool_choice, thinking, output_config -----------------------------------------------------


class Tool(StrictModel):
    """A client tool: a function the model may call, whose input is described by a JSON schema."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = Field(None, description="Accepted and ignored")
    strict: bool | None = Field(None, description="Accepted; a forced call always follows the schema")
    input_examples: list[dict[str, Any]] | None = Field(None, description="Accepted and ignored")
    eager_input_streaming: bool | None = Field(None, description="Accepted and ignored")
    defer_loading: bool | None = Field(None, description="Tool search is not supported: false only")
    allowed_callers: list[str] | None = Field(None, description="['direct'] only")

    @model_validator(mode="after")
    def _direct_only(self) -> Tool:
        if self.defer_loading:
            raise request_error(
                "unsupported_value",
                "Unsupported value: 'defer_loading' true: tool search is not supported by this server.",
                "defer_loading",
            )
        if self.allowed_callers not in (None, [], ["direct"]):
            raise request_error(
                "unsupported_value",
                "Unsupported value: 'allowed_callers': only 'direct' calls are supported (no code execution).",
                "allowed_callers",
            )
        return self


class ToolChoice(StrictModel):
    """`tool_choice`: ``auto`` (may call), ``any`` (calls one of the tools), ``tool`` (calls the one
    it names) or ``none``; ``disable_parallel_tool_use`` keeps at most one call."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name_with_tool(self) -> ToolChoice:
        if self.type == "tool" and self.name is None:
            raise request_error(
                "missing_required_parameter", "tool_choice type 'tool' needs the 'name' of a tool.", "name"
            )
        if self.type != "tool" and self.name is not None:
            raise request_error(
                "invalid_value", f"'name' goes with tool_choice type 'tool', not {self.type!r}.", "name"
            )
        return self


class ThinkingConfig(StrictModel):
    """`thinking`. Accepted: a reasoning model's thinking comes as thinking blocks whatever it says;
    its budget is not enforced (the whole answer is limited by max_tokens)."""

    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = Field(None, ge=MIN_THINKING_BUDGET)
    display: Literal["summarized", "omitted"] | None = Field(
        None, description="'omitted': thinking blocks come without their text"
    )

    @model_validator(mode="after")
    def _budget_when_enabled(self) -> ThinkingConfig:
        if self.type == "enabled" and self.budget_tokens is None:
            raise request_error(
                "missing_required_parameter",
                "thinking type 'enabled' needs 'budget_tokens'.",
                "budget_tokens",
            )
        if self.type != "enabled" and self.budget_tokens is not None:
            raise request_error(
                "invalid_value",
                f"'budget_tokens' goes with thinking type 'enabled', not {self.type!r}.",
                "budget_tokens",
            )
        if self.display is not None and self.type not in ("enabled", "adaptive"):
            raise request_error(
                "invalid_value", f"'display' does not apply to thinking type {self.type!r}.", "display"
            )
        return self


class OutputFormat(StrictModel):
    """`output_config.format`: the answer is JSON that validates against `schema`."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(StrictModel):
    """`output_config`: the effort (to a template that takes `reasoning_effort`) and the format."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
"""Anthropic's efforts as the `reasoning_effort` chat templates know."""


# ---- the conversation --------------------------------------------------------------------------------


class _Conversation(StrictModel):
    """What both endpoints read: the model, the system prompt, the messages and the tools, reduced
    once (at validation, so that every fault is a 400) to chat messages."""

    _messages: list[dict[str, Any]] = PrivateAttr(default_factory=list)

    model: str | None = Field(
        None,
        min_length=1,
        description="The model id: the served model or a LoRA adapter. Anthropic requires it; omitted "
        "here means the served model, as on the OpenAI routes (and the Swagger page's example)",
    )
    messages: list[dict[str, Any]] = Field(
        min_length=1,
        description="Turns of role 'user' or 'assistant' (or 'system'); content a string or a list of "
        "text, tool_use, tool_result, thinking and redacted_thinking blocks",
    )
    system: str | list[dict[str, Any]] | None = Field(
        None, description="A string or a list of text blocks, before the messages"
    )
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS, description="Client tools")
    tool_choice: ToolChoice | None = Field(None, description="Default 'auto' with tools")
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _client_tools_only(cls, value: Any) -> Any:
        for i, tool in enumerate(value if isinstance(value, list) else ()):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind is not None and kind != "custom":
                raise request_error(
                    "unsupported_value",
                    f"Unsupported value: 'tools[{i}].type' {kind!r}: server tools are not supported by "
                    "this server, only client tools (name, description, input_schema).",
                    i,
                    "type",
                )
        return value

    @model_validator(mode="after")
    def _reduce(self) -> _Conversation:
        self._messages = _conversation(self.system, self.messages)
        choice = self.tool_choice
        names = [tool.name for tool in self.tools or ()]
        if len(set(names)) != len(names):
            raise request_error("invalid_value", "Tool names in 'tools' must be unique.", "tools")
        if choice is not None and choice.type in ("any", "tool") and not names:
            raise request_error("invalid_value", f"tool_choice {choice.type!r} needs 'tools'.", "tool_choice")
        if choice is not None and choice.name is not None and choice.name not in names:
            raise request_error(
                "invalid_value",
                f"tool_choice names tool {choice.name!r}, which is not in 'tools'.",
                "tool_choice",
                "name",
            )
        return self

    def chat_messages(self) -> list[dict[str, Any]]:
        """The system prompt and messages as chat messages for ``PromptFormatter.render``."""
        return self._messages

    def functions(self) -> list[dict[str, Any]]:
        """The offered tools as OpenAI's `function` objects (name, description, parameters)."""
        out = []
        for tool in self.tools or ():
            function: dict[str, Any] = {"name": tool.name}
            if tool.description is not None:
                function["description"] = tool.description
            function["parameters"] = tool.input_schema
            out.append(function)
        return out

    @property
    def reasoning_effort(self) -> str | None:
        """`output_config.effort` as a chat template's `reasoning_effort` (None: not set)."""
        effort = self.output_config.effort if self.output_config is not None else None
        return None if effort is None else _EFFORTS[effort]

    @property
    def omits_thinking(self) -> bool:
        """Whether thinking blocks come without their text (`thinking.display: "omitted"`)."""
        return self.thinking is not None and self.thinking.display == "omitted"


class MessagesRequest(ToolUse, _Conversation, SamplingFields):
    """``POST /v1/messages``: one answer (n is 1; no log probs, no best_of)."""

    max_tokens: int = Field(ge=1, description="The most tokens to generate (required)")
    temperature: float | None = Field(None, ge=0, le=1)
    stop_sequences: list[str] | None = Field(
        None, description="Strings that end the answer (not part of it); stop_reason 'stop_sequence'"
    )

    @model_validator(mode="before")
    @classmethod
    def _policy(cls, data: Any) -> Any:
        return _apply_policy(data, _MESSAGES_OFF_ONLY)

    @field_validator("stop_sequences", mode="before")
    @classmethod
    def _check_stop_sequences(cls, value: Any) -> Any:
        if not isinstance(value, list):
            raise request_error("invalid_type", "'stop_sequences' must be a list of strings.")
        try:
            check_stop(value)
        except StopStringError as exc:
            raise request_error(exc.code, str(exc), *(() if exc.index is None else (exc.index,))) from None
        return value

    @model_validator(mode="after")
    def _settle(self) -> MessagesRequest:
        """The thinking budget within max_tokens, no prefill, and the one guide: the answer's format
        or a forced call."""
        budget = self.thinking.budget_tokens if self.thinking is not None else None
        if budget is not None and budget >= self.max_tokens:
            raise request_error(
                "invalid_value",
                f"thinking.budget_tokens ({budget}) must be less than max_tokens ({self.max_tokens}).",
                "thinking",
                "budget_tokens",
            )
        last = len(self.messages) - 1
        if self.messages[last].get("role") == "assistant":
            raise request_error(
                "invalid_value",
                "This server does not continue a final assistant message (prefill): end the "
                "conversation with a user message.",
                "messages",
                last,
                "role",
            )
        fmt = self.output_config.format if self.output_config is not None else None
        if fmt is not None:
            try:
                path = "output_config.format.schema"
                self.settle_guide(json_schema_guide(fmt.schema_, path), path)
            except GuideRequestError as exc:
                raise request_error("invalid_value", str(exc), *exc.param.split(".")) from None
        choice = self.tool_choice
        self._settle_tools(choice.name if choice is not None else None)
        return self

    def functions(self) -> list[dict[str, Any]]:
        """The offered tools as OpenAI's `function` objects (ToolUse's rules read them)."""
        return _Conversation.functions(self)

    @property
    def tool_mode(self) -> Literal["auto", "forced"] | None:
        """None: no tools in play (none offered, or tool_choice 'none'); auto: the answer may be
        calls; forced (tool_choice 'any' or 'tool'): it is a call."""
        choice = self.tool_choice
        if not self.tools or (choice is not None and choice.type == "none"):
            return None
        return "auto" if choice is None or choice.type == "auto" else "forced"

    @property
    def parallel_tool_calls(self) -> bool | None:
        """False with `disable_parallel_tool_use`: an answer makes one call at most."""
        choice = self.tool_choice
        return False if choice is not None and choice.disable_parallel_tool_use else None

    @property
    def guide_param(self) -> str:
        """The field that asked for the guide (for a model that cannot guide)."""
        return "tool_choice" if self.tool_mode == "forced" else "output_config.format"

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def include_usage(self) -> bool:
        """A stream always carries its usage (message_start and message_delta)."""
        return self.stream

    def stop_strings(self) -> tuple[str, ...]:
        """`stop_sequences` as our stop strings (duplicates removed, order kept)."""
        return check_stop(self.stop_sequences or ())


class CountTokensRequest(_Conversation):
    """``POST /v1/messages/count_tokens``: the prompt a `MessagesRequest` with these fields would
    render (no max_tokens, no sampling, no stream)."""

    @model_validator(mode="before")
    @classmethod
    def _policy(cls, data: Any) -> Any:
        return _apply_policy(data, _OFF_ONLY)


# ---- messages -> chat messages -----------------------------------------------------------------------

_BLOCK_KEYS = {
    "text": frozenset({"type", "text", "cache_control", "citations"}),
    "tool_use": frozenset({"type", "id", "name", "input", "cache_control", "caller", "toolset_name"}),
    "tool_result": frozenset({"type", "tool_use_id", "content", "is_error", "cache_control", "toolset_name"}),
    "thinking": frozenset({"type", "thinking", "signature"}),
    "redacted_thinking": frozenset({"type", "data"}),
}
_ROLE_BLOCKS = {
    "user": ("text", "tool_result"),
    "assistant": ("text", "tool_use", "thinking", "redacted_thinking"),
    "system": ("text",),
}
_MESSAGE_KEYS = frozenset({"role", "content"})
_Where = tuple[str | int, ...]


def _conversation(
    system: str | list[dict[str, Any]] | None, messages: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The system prompt and the messages as chat messages (400s name their path)."""
    out: list[dict[str, Any]] = []
    if system is not None:
        text = system if isinstance(system, str) else _texts(system, ("system",))
        if text:
            out.append({"role": "system", "content": text})
    for i, message in enumerate(messages):
        _add_message(out, message, ("messages", i))
    return out


def _add_message(out: list[dict[str, Any]], message: dict[str, Any], where: _Where) -> None:
    for key in message:
        if key not in _MESSAGE_KEYS:
            raise request_error("unknown_parameter", f"Unrecognized key {key!r} in a message.", *where, key)
    role = message_role(
        message, _ROLE_BLOCKS, "messages are 'user' and 'assistant' turns (or 'system')", *where
    )
    if "content" not in message:
        raise request_error("missing_required_parameter", "A message needs its 'content'.", *where, "content")
    content = message["content"]
    if isinstance(content, str):
        _append(out, role, content)
        return
    if not isinstance(content, list):
        raise request_error(
            "invalid_type", "'content' must be a string or a list of content blocks.", *where, "content"
        )
    texts: list[str] = []
    calls: list[dict[str, str]] = []
    results = 0
    for j, block in enumerate(content):
        at = (*where, "content", j)
        kind = _block_kind(block, role, at)
        if kind == "text":
            texts.append(_string(block, "text", at))
        elif kind == "tool_use":
            calls.append(_call(block, at))
        elif kind == "tool_result":
            if texts:  # text before a result: its own turn, in order
                _append(out, role, "\n".join(texts))
                texts = []
            out.append(_result(block, at))
            results += 1
        # thinking and redacted_thinking: left out of the prompt
    if texts or calls or not results:
        _append(out, role, "\n".join(texts), calls)


def _append(
    out: list[dict[str, Any]], role: str, content: str, calls: list[dict[str, str]] | None = None
) -> None:
    """Adds a turn, joined to the previous one when it has the same role (Anthropic combines
    consecutive user or assistant turns into one)."""
    last = out[-1] if out else None
    if last is not None and last["role"] == role and role in ("user", "assistant"):
        if content:
            last["content"] = f"{last['content']}\n{content}" if last["content"] else content
        if calls:
            last.setdefault("tool_calls", []).extend(calls)
        return
    turn: dict[str, Any] = {"role": role, "content": content}
    if calls:
        turn["tool_calls"] = calls
    out.append(turn)


def _block_kind(block: Any, role: str, at: _Where) -> str:
    """A content block's type, once it is one this role may hold, with no unknown keys."""
    if not isinstance(block, dict):
        raise request_error("invalid_type", "A content block must be an object.", *at)
    kind = block.get("type")
    if not isinstance(kind, str):
        raise request_error("missing_required_parameter", "A content block needs its 'type'.", *at, "type")
    if kind not in _BLOCK_KEYS:
        raise request_error(
            "unsupported_value",
            f"{kind} content blocks are not supported by this server: only text, tool_use, tool_result, "
            "thinking and redacted_thinking blocks are.",
            *at,
            "type",
        )
    if kind not in _ROLE_BLOCKS[role]:
        raise request_error("invalid_value", f"A {role} message cannot hold {kind} blocks.", *at, "type")
    for key in block:
        if key not in _BLOCK_KEYS[kind]:
            raise request_error("unknown_parameter", f"Unrecognized key {key!r} in a {kind} block.", *at, key)
    return kind


def _string(block: dict[str, Any], key: str, at: _Where) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise request_error("invalid_type", f"'{key}' of a {block['type']} block must be a string.", *at, key)
    return value


def _call(block: dict[str, Any], at: _Where) -> dict[str, str]:
    """An assistant's tool_use block as a chat message's tool call."""
    call_id, name = _string(block, "id", at), _string(block, "name", at)
    arguments = block.get("input")
    if not isinstance(arguments, dict):
        raise request_error("invalid_type", "'input' of a tool_use block must be an object.", *at, "input")
    caller = block.get("caller")
    if caller is not None and caller != {"type": "direct"}:
        raise request_error(
            "unsupported_value", "Only direct tool calls are supported (no code execution).", *at, "caller"
        )
    return {"id": call_id, "name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}


def _result(block: dict[str, Any], at: _Where) -> dict[str, Any]:
    """A user's tool_result block as a `tool` message."""
    call_id = _string(block, "tool_use_id", at)
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = _texts(content, (*at, "content"))
    else:
        raise request_error(
            "invalid_type", "'content' of a tool_result must be a string or text blocks.", *at, "content"
        )
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise request_error("invalid_type", "'is_error' must be a boolean.", *at, "is_error")
    if is_error:
        text = TOOL_ERROR_PREFIX + text
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _texts(blocks: list[Any], at: _Where) -> str:
    """Text blocks (a system prompt, a tool result) joined with newlines; any other block is a 400
    naming it."""
    texts = []
    for j, block in enumerate(blocks):
        where = (*at, j)
        if not isinstance(block, dict):
            raise request_error("invalid_type", "A content block must be an object.", *where)
        kind = block.get("type")
        if kind != "text":
            raise request_error(
                "unsupported_value",
                f"{kind} content blocks are not supported here by this server: only text blocks are.",
                *where,
                "type",
            )
        for key in block:
            if key not in _BLOCK_KEYS["text"]:
                raise request_error(
                    "unknown_parameter", f"Unrecognized key {key!r} in a text block.", *where, key
                )
        texts.append(_string(block, "text", where))
    return "\n".join(texts)
