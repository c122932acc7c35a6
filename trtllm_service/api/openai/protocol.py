"""Pydantic models of the OpenAI API as this server speaks it: chat messages, tools and structured
output (`RequestBase`: what chat and text completions add to the shared `SamplingFields`), vLLM's
/tokenize and /detokenize requests, and the response objects.

The request policy and the sampling fields are the shared protocol's (``generation.protocol``). On
OpenAI's routes, parameters we cannot honour (``suffix``, audio, ...) are 400s naming them unless
"off" (``{"type": "text"}`` too); ``metadata``, ``store``, ``prompt_cache_key``,
``safety_identifier``, ``user``, and ``stream_options`` on a non-streaming request are accepted and
ignored; every other unknown parameter is a 400 (code ``unknown_parameter``), as OpenAI does: an
unknown field may be a sampling knob from another server (``min_p``), and silently ignoring it would
change the output without telling the caller.

vLLM's extensions are accepted under vLLM's names: ``top_k``, ``repetition_penalty``, ``min_tokens``,
``ignore_eos``, ``stop_token_ids``, ``guided_*``, and beam search (``use_beam_search``, ``best_of``,
``length_penalty``, ``early_stopping``) with vLLM's meaning: a search over ``best_of`` (else ``n``)
beams that returns the ``n`` best. ``best_of`` without beam search samples ``best_of`` answers per
prompt and returns the ``n`` with the highest cumulative log probability (not streamed).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Generic, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from trtllm_service.api.generation.protocol import (
    MaxTokens,
    SamplingFields,
    StrictModel,
    is_token_id,
    sent,
    unset,
)
from trtllm_service.api.server.request_errors import request_error
from trtllm_service.relay.guided import (
    Guide,
    GuideRequestError,
    choice_guide,
    json_schema_guide,
)

MAX_PROMPTS = 64

FinishReason = Literal["stop", "length", "tool_calls"]


NO_TOOLS = "the deprecated 'functions' API is not supported by this server: use 'tools'"


# Keys of a chat message that only matter with features we lack; accepted when "off".
_MESSAGE_OFF_KEYS = ("function_call", "refusal", "audio", "annotations")
# An assistant message's reasoning, as our answers carry it: accepted and left out of the prompt
# (reasoning models' templates drop earlier turns' thinking).
_MESSAGE_REASONING_KEYS = ("reasoning_content", "reasoning")
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high"]


def new_id(prefix: str) -> str:
    """A unique response id, e.g. ``chatcmpl-<32 hex>`` (unique across processes, unlike counters)."""
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


# Requests


class StreamOptions(BaseModel):
    """Streaming options. Unknown keys (e.g. ``include_obfuscation``) only shape the stream; ignored."""

    model_config = ConfigDict(extra="ignore", strict=True)

    include_usage: bool = False


class FunctionCall(StrictModel):
    """A call's function: its name and its arguments as JSON text (OpenAI's shape)."""

    name: str
    arguments: str


class ToolCall(StrictModel):
    """One tool call, in an assistant message (ours or one sent back in the conversation)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(StrictModel):
    """A function the model may call: its parameters are a JSON schema."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(StrictModel):
    """One entry of `tools`."""

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    """`tool_choice` naming the one function to call."""

    type: Literal["function"]
    function: NamedFunction


class ChatMessage(StrictModel):
    """One input message. ``developer`` is taken as ``system``; text parts are joined with newlines."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = Field(description="A string, or a list of {'type': 'text', 'text': ...} parts")
    name: str | None = None
    tool_calls: list[ToolCall] | None = Field(None, description="An assistant's earlier calls")
    tool_call_id: str | None = Field(None, description="role 'tool': the call this result answers")

    @model_validator(mode="before")
    @classmethod
    def _normalize(cls, body: Any) -> Any:
        if (data := sent(body)) is None:
            return body
        for key in _MESSAGE_OFF_KEYS:
            if key in data:
                if not unset(data[key]):
                    raise request_error("unsupported_parameter", f"'{key}' in messages: {NO_TOOLS}", key)
                del data[key]
        role = data.get("role")
        if role == "assistant":
            for key in _MESSAGE_REASONING_KEYS:
                data.pop(key, None)
        if role == "developer":
            data["role"] = role = "system"
        if role == "function":
            raise request_error("unsupported_value", f"Role 'function' is not supported: {NO_TOOLS}.", "role")
        if isinstance(role, str) and role not in ("system", "user", "assistant", "tool"):
            raise request_error(
                "invalid_value",
                f"Invalid value: '{role}'. Supported roles are 'system', 'developer', 'user', 'assistant' "
                "and 'tool'.",
                "role",
            )
        if role == "tool" and "tool_call_id" not in data:
            raise request_error(
                "missing_required_parameter",
                "A 'tool' message needs the 'tool_call_id' it answers.",
                "tool_call_id",
            )
        if data.get("tool_calls") and role != "assistant":
            raise request_error("invalid_value", "Only assistant messages carry 'tool_calls'.", "tool_calls")
        if "content" not in data and role == "assistant":
            data["content"] = ""  # OpenAI allows a null assistant content (with tool_calls, say)
        content = data.get("content")
        if isinstance(content, list):
            data["content"] = _join_text_parts(content)
        return data


def _join_text_parts(parts: list[Any]) -> str:
    texts: list[str] = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict):
            raise request_error("invalid_type", "A content part must be an object.", "content", j)
        kind = part.get("type")
        if kind != "text":
            raise request_error(
                "unsupported_value",
                f"Content part type {kind!r} is not supported: only 'text' parts are accepted.",
                "content",
                j,
                "type",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise request_error("invalid_type", "A text part needs a string 'text'.", "content", j, "text")
        texts.append(text)
    return "\n".join(texts)


class JSONSchemaFormat(StrictModel):
    """`response_format.json_schema`: the schema the answer must validate against."""

    name: str = Field(max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(StrictModel):
    """`response_format`: plain text, any JSON object, or JSON that validates against a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise request_error(
                "missing_required_parameter", "'json_schema' is required for this type.", "json_schema"
            )
        if self.type != "json_schema" and self.json_schema is not None:
            raise request_error(
                "invalid_value", f"'json_schema' needs type 'json_schema', not {self.type!r}.", "json_schema"
            )
        return self


_GUIDE_FIELDS = ("response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar")


class RequestBase(SamplingFields):
    """Fields and checks shared by chat and text completions: the token limit, streaming options and
    structured output."""

    max_tokens: MaxTokens | None = None
    stream_options: StreamOptions | None = None
    response_format: ResponseFormat | None = Field(
        None, description="{'type': 'json_object'} or {'type': 'json_schema', 'json_schema': {...}}"
    )
    guided_json: dict[str, Any] | str | None = Field(None, description="Extension (vLLM): a JSON schema")
    guided_regex: str | None = Field(None, description="Extension (vLLM): a regular expression")
    guided_choice: list[str] | None = Field(None, description="Extension (vLLM): one of these strings")
    guided_grammar: str | None = Field(
        None, description="Extension (vLLM): a GBNF grammar (root rule `root`)"
    )

    @model_validator(mode="after")
    def _check_guide(self) -> RequestBase:
        """At most one structured-output field, read as its guide (compiled later, off the event
        loop: `GenerationServing.params`)."""
        given = [
            name
            for name in _GUIDE_FIELDS
            if getattr(self, name) is not None
            and not (name == "response_format" and self.response_format.type == "text")  # type: ignore[union-attr]  # not None: checked before
        ]
        if len(given) > 1:
            raise request_error(
                "invalid_value",
                f"Only one of {', '.join(given)} may be set (they all shape the answer).",
                given[1],
            )
        if given:
            try:
                self.settle_guide(*self._requested_guide(given[0]))
            except GuideRequestError as exc:
                raise request_error("invalid_value", str(exc), *exc.param.split(".")) from None
        return self

    def _requested_guide(self, name: str) -> tuple[Guide, str]:
        """The guide the field `name` asks for, and the request path to blame for it."""
        if name == "response_format":
            fmt = self.response_format
            assert fmt is not None
            if fmt.type == "json_object":
                return ("json", ""), name
            assert fmt.json_schema is not None
            schema = fmt.json_schema.schema_ if fmt.json_schema.schema_ is not None else {}
            path = "response_format.json_schema.schema"
            return json_schema_guide(schema, path), path
        if name == "guided_json":
            return json_schema_guide(self.guided_json, name), name
        if name == "guided_regex":
            return ("regex", str(self.guided_regex)), name
        if name == "guided_choice":
            return choice_guide(self.guided_choice or [], name), name
        return ("ebnf_grammar", str(self.guided_grammar)), name

    @property
    def max_new_tokens(self) -> int | None:
        """The completion token limit the caller asked for (None: up to the context length)."""
        return self.max_tokens

    @property
    def include_usage(self) -> bool:
        """Whether a streaming response ends with a usage chunk."""
        return self.stream and self.stream_options is not None and self.stream_options.include_usage


# The tool fields of chat and responses (whose named choice and tools differ in shape only).
MAX_TOOLS = 128  # entries of `tools`
ToolChoiceMode = Literal["none", "auto", "required"]  # `tool_choice` as a string
TOOL_CHOICE_DOC = "Default 'auto' with tools; 'required' and a named function always call"
PARALLEL_TOOL_CALLS_DOC = "Whether an answer may hold several calls"


def plain_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as plain dicts for ``PromptFormatter.render`` (``name``, ``tool_calls`` and
    ``tool_call_id`` only when given)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        msg: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.name is not None:
            msg["name"] = m.name
        if m.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in m.tool_calls
            ]
        if m.tool_call_id is not None:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


TokenIds = list[int]


def check_token_ids(ids: list[Any], *where: int) -> None:
    """A 400 naming `prompt[...]` for an element that is not a token id (the vocabulary is checked
    where the model is known)."""
    for j, token in enumerate(ids):
        if not is_token_id(token):
            raise request_error(
                "invalid_value", "A token-id prompt holds integers from 0 (its token ids).", *where, j
            )


class TokenizeCompletionRequest(StrictModel):
    """``POST /tokenize`` of a prompt (vLLM's shape)."""

    model: str | None = Field(None, description="Model id; omitted means the served model")
    prompt: str
    add_special_tokens: bool = Field(
        True, description="Add the tokenizer's special tokens as the engine gets them (a BOS, once)"
    )
    return_token_strs: bool = Field(False, description="Also return each token's string")


class TokenizeChatRequest(StrictModel):
    """``POST /tokenize`` of chat messages, rendered with the chat template (vLLM's shape)."""

    model: str | None = Field(None, description="Model id; omitted means the served model")
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = Field(True, description="End with the assistant's turn opening")
    add_special_tokens: bool = Field(
        True, description="As the engine gets the prompt: a BOS unless the template wrote one (false: none)"
    )
    return_token_strs: bool = Field(False, description="Also return each token's string")
    tools: list[ToolDefinition] | None = Field(
        None, max_length=MAX_TOOLS, description="Rendered as chat renders them"
    )

    def chat_messages(self) -> list[dict[str, Any]]:
        return plain_messages(self.messages)

    def functions(self) -> list[dict[str, Any]]:
        return [tool.function.model_dump(exclude_none=True) for tool in self.tools or []]


class DetokenizeRequest(StrictModel):
    """``POST /detokenize`` (vLLM's shape): token ids -> their text."""

    model: str | None = Field(None, description="Model id; omitted means the served model")
    tokens: TokenIds = Field(description="Token ids of the model's vocabulary")

    @field_validator("tokens", mode="before")
    @classmethod
    def _check_tokens(cls, value: Any) -> Any:
        if not isinstance(value, list):
            raise request_error("invalid_type", "'tokens' must be a list of token ids.")
        check_token_ids(value)
        return value


class LoadLoRAAdapterRequest(StrictModel):
    """``POST /v1/load_lora_adapter`` (vLLM's shape)."""

    lora_name: str = Field(description="The name requests select it by (`model`)")
    lora_path: str = Field(
        description="A PEFT adapter directory under TRTLLM_LORA_ROOT (relative to it, or absolute), or a "
        "BentoML model tag"
    )
    load_inplace: bool = Field(False, description="Replace an adapter loaded under the same name (vLLM's)")


class UnloadLoRAAdapterRequest(StrictModel):
    """``POST /v1/unload_lora_adapter`` (vLLM's shape)."""

    lora_name: str = Field(description="The loaded adapter's name")
    lora_int_id: int | None = Field(None, description="vLLM's; accepted and not used (adapters go by name)")


# ---------------------------------------------------------------------------------------------------------
# Responses (built by us, so no strictness or extra-field policy is needed)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens the engine found in its KV cache


class UsageInfo(BaseModel):
    """Token counts of one request."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


_ChoiceT = TypeVar("_ChoiceT", bound=BaseModel)


class CompletionChunkBase(BaseModel, Generic[_ChoiceT]):
    """A streamed chunk of chat or text completions, in OpenAI's shape: the subclass names its
    `object` (a Literal) and its choices. ``usage`` only in the last chunk (``include_usage``)."""

    id: str
    object: str
    created: int
    model: str
    choices: list[_ChoiceT]
    usage: UsageInfo | None = None
    service_tier: str | None = "default"  # the tier the request was served in (generation.protocol)


class CompletionResponseBase(CompletionChunkBase[_ChoiceT]):
    """A non-streamed chat or text completion: a chunk's fields (the same order), made now, with its
    usage, and OpenAI's ``system_fingerprint`` (never set). The subclass names its `object` and
    the prefix of its `id` (`new_id`)."""

    created: int = Field(default_factory=now)
    usage: UsageInfo
    system_fingerprint: str | None = None


class ModelCard(BaseModel):
    """One entry of ``GET /v1/models``."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=now)
    owned_by: str = "trtllm-service"
    root: str | None = None  # as vLLM: the base model an adapter applies to
    parent: str | None = None  # a LoRA adapter's base model (None: this is the base)
    max_model_len: int | None = None
    engine: str | None = None  # ours: tensorrt_llm, reference or synthetic (the stand-ins)
    flavor: str | None = None  # ours: the Triton repository flavour, llmapi or ensemble


class ModelList(BaseModel):
    """``GET /v1/models``."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
