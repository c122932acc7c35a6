"""``POST /v1/chat/completions``: the request and the response objects (the messages and tools
they build on are ``openai.protocol``'s, the sampling fields the shared ``generation.protocol``'s)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, model_serializer, model_validator

from trtllm_service.api.generation.protocol import Rule, ToolUse, unset
from trtllm_service.api.openai.protocol import (
    MAX_TOOLS,
    NO_TOOLS,
    PARALLEL_TOOL_CALLS_DOC,
    TOOL_CHOICE_DOC,
    ChatMessage,
    CompletionChunkBase,
    CompletionResponseBase,
    FinishReason,
    NamedToolChoice,
    ReasoningEffort,
    RequestBase,
    ToolCall,
    ToolChoiceMode,
    ToolDefinition,
    new_id,
    plain_messages,
)
from trtllm_service.api.server.request_errors import request_error

MAX_TOP_LOGPROBS = 20  # chat's top_logprobs, as OpenAI
_CHAT_UNSUPPORTED: dict[str, Rule] = {
    "functions": (unset, NO_TOOLS),
    "function_call": (lambda v: v in (None, "none", "auto"), NO_TOOLS),
    "audio": (unset, "audio output is not supported"),
    "modalities": (lambda v: v in (None, ["text"]), "only the 'text' modality is supported"),
    "prediction": (unset, "predicted outputs are not supported"),
    "verbosity": (unset, "verbosity is not supported"),
    "web_search_options": (unset, "web search is not supported"),
}


class ChatCompletionRequest(ToolUse, RequestBase):
    """``POST /v1/chat/completions``."""

    _unsupported: ClassVar[dict[str, Rule]] = _CHAT_UNSUPPORTED

    messages: list[ChatMessage] = Field(min_length=1)
    reasoning_effort: ReasoningEffort | None = Field(
        None, description="Passed to a chat template that takes it (reasoning models); a 400 otherwise"
    )
    max_completion_tokens: int | None = Field(None, ge=1, description="Wins over max_tokens")
    tools: list[ToolDefinition] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoiceMode | NamedToolChoice | None = Field(None, description=TOOL_CHOICE_DOC)
    parallel_tool_calls: bool | None = Field(None, description=PARALLEL_TOOL_CALLS_DOC)
    logprobs: bool | None = Field(None, description="Return each output token's log probability")
    top_logprobs: int | None = Field(
        None, ge=0, le=MAX_TOP_LOGPROBS, description="With logprobs: the most likely tokens at each position"
    )

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs and not self.logprobs:
            raise request_error(
                "invalid_value", "'top_logprobs' needs 'logprobs' set to true.", "top_logprobs"
            )
        return self

    @property
    def logprob_count(self) -> int | None:
        """None: no log probs; N: each token's, with the N most likely."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @model_validator(mode="after")
    def _check_tools(self) -> ChatCompletionRequest:
        choice = self.tool_choice
        self._settle_tools(choice.function.name if isinstance(choice, NamedToolChoice) else None)
        return self

    def functions(self) -> list[dict[str, Any]]:
        """The offered functions as plain dicts (OpenAI's `function` objects), for the prompt."""
        return [tool.function.model_dump(exclude_none=True) for tool in self.tools or []]

    @property
    def max_new_tokens(self) -> int | None:
        """``max_completion_tokens`` if set (OpenAI's current name), else the deprecated ``max_tokens``."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def chat_messages(self) -> list[dict[str, Any]]:
        """Messages as plain dicts for ``PromptFormatter.render``."""
        return plain_messages(self.messages)


class ChatCompletionMessage(BaseModel):
    """The assistant's reply: text, or (finish reason `tool_calls`) calls and no text; a reasoning
    model's thinking (`pack_model.py --reasoning-parser`) in `reasoning_content` and, vLLM's newer
    name, `reasoning`."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None

    @model_serializer(mode="wrap")
    def _only_what_was_made(self, handler: Any) -> Any:
        data = handler(self)
        for key in ("tool_calls", "reasoning_content", "reasoning"):
            if data.get(key) is None:
                data.pop(key, None)  # as OpenAI: a text answer has no tool_calls key
        return data


class ChatCompletionChoice(BaseModel):
    """One of ``n`` non-streamed chat completions."""

    index: int
    message: ChatCompletionMessage
    finish_reason: FinishReason | None = None
    logprobs: dict[str, Any] | None = None


class ChatCompletionResponse(CompletionResponseBase[ChatCompletionChoice]):
    """Non-streamed ``chat.completion``."""

    id: str = Field(default_factory=lambda: new_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    """A streamed piece of tool call `index`: its id, type and name come in its first piece."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta | None = None


class DeltaMessage(BaseModel):
    """The new part of a streamed message: ``role`` in the first chunk, then ``content``,
    ``tool_calls`` or (a reasoning model thinking) ``reasoning_content`` and ``reasoning``."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None  # the same text as reasoning_content (vLLM's newer name)


class ChatCompletionChunkChoice(BaseModel):
    """One choice of a streamed chunk."""

    index: int
    delta: DeltaMessage
    finish_reason: FinishReason | None = None
    logprobs: dict[str, Any] | None = None


class ChatCompletionChunk(CompletionChunkBase[ChatCompletionChunkChoice]):
    """One ``chat.completion.chunk``. On the hot path ``sse.ChatChunkEncoder`` writes this shape directly."""

    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
