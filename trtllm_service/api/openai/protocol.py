"""Pydantic models of the OpenAI API as this server speaks it.

Request policy (what happens to each parameter a client sends):

* Supported parameters are validated (types strictly, ranges as OpenAI documents them) and reduced to
  ``SamplingParams`` by ``SamplingFields.sampling_params()``: the sampling fields are defined once, in
  ``SamplingFields``, which chat, completions and responses (``responses.py``) all extend.
* Parameters we cannot honour (``suffix``, audio, ...) are rejected with a 400 whose ``param`` names
  them and whose code is ``unsupported_parameter``. Their "off" values (``null``, ``false``, ``{}``,
  ``[]``, ``{"type": "text"}``, ...) are accepted, since clients often send defaults explicitly.
* A few parameters that do not change the generated text are accepted and ignored: ``metadata``,
  ``store``, ``service_tier``, ``prompt_cache_key``, ``safety_identifier``, ``user``, and
  ``stream_options`` on a non-streaming request.
* Every other unknown parameter is rejected (code ``unknown_parameter``), as OpenAI does: an unknown
  field may be a sampling knob from another server (``min_p``), and silently ignoring it would change
  the output without telling the caller.
* ``null`` means "not set" for every parameter.

vLLM's extensions are accepted under vLLM's names: ``top_k``, ``repetition_penalty``, ``min_tokens``,
``ignore_eos``, ``stop_token_ids``, ``guided_*``, and beam search (``use_beam_search``, ``best_of``,
``length_penalty``, ``early_stopping``) with vLLM's meaning: a search over ``best_of`` (else ``n``)
beams that returns the ``n`` best. ``best_of`` without beam search samples ``best_of`` answers per
prompt and returns the ``n`` with the highest cumulative log probability (not streamed).

All request errors surface as one pydantic ``ValidationError``; ``errors.from_validation_error`` turns it
into an OpenAI error body whose ``param`` is a path like ``messages[1].content[0].type``. ``parse_request``
does both steps for a raw body.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from typing import Annotated, Any, ClassVar, Generic, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tensorrtllm_backend.stop_strings import MAX_STOP_STRINGS, StopStringError, check_stop
from trtllm_service.api.server.request_errors import from_validation_error, request_error
from trtllm_service.chat import tool_calls
from trtllm_service.errors import APIError
from trtllm_service.relay.guided import (
    Guide,
    GuideRequestError,
    choice_guide,
    guide_field,
    json_schema_guide,
)
from trtllm_service.relay.request import SamplingParams

MAX_N = 8  # n and best_of: choices (or candidates, or beams) per prompt
MAX_PROMPTS = 64
MAX_LOGIT_BIAS = 300  # entries of logit_bias, as OpenAI
MAX_STOP_TOKEN_IDS = 256
_INT32_MAX = (1 << 31) - 1  # token ids travel as INT32
_UINT64_MASK = (1 << 64) - 1

FinishReason = Literal["stop", "length", "tool_calls"]

# The sampling fields' types and ranges, said once: `SamplingFields` (every /v1 route, Anthropic's
# messages) and /generate's signature (service.py) take them, so that a value one accepts the other
# does too; both read them strictly (`"10"` and `true` are not numbers).
MaxTokens = Annotated[int, Field(ge=1)]
Temperature = Annotated[float, Field(ge=0, le=2)]
TopP = Annotated[float, Field(gt=0, le=1)]
TopK = Annotated[int, Field(ge=-1, description="Extension: >= 1, or -1/0 for unset")]
RepetitionPenalty = Annotated[float, Field(gt=0, description="Extension: 1.0 is off")]
Penalty = Annotated[float, Field(ge=-2, le=2)]
Seed = Annotated[
    int, Field(ge=-(1 << 63), le=_UINT64_MASK, description="Any 64-bit integer; negative ones as unsigned")
]


def engine_top_k(top_k: int | None) -> int | None:
    """A request's top_k for the engine: -1 and 0 (and none) mean no top-k."""
    return None if top_k in (None, -1, 0) else top_k


def engine_seed(seed: int | None) -> int | None:
    """A request's seed for the engine, whose seed is unsigned 64-bit: a negative seed is its two's
    complement."""
    return None if seed is None else seed & _UINT64_MASK


_IGNORED_PARAMS = ("metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier")


def sent(data: Any) -> dict[str, Any] | None:
    """A request object's keys that carry a value (a JSON null is read as not sent, as OpenAI's and
    Anthropic's APIs read it), or None for a body that is not an object (its model names the type)."""
    if not isinstance(data, dict):
        return None
    return {k: v for k, v in data.items() if v is not None}


def unset(value: Any) -> bool:
    """The "off" value of an unsupported parameter: harmless to accept."""
    return value is None or value is False or value == {} or value == [] or value == ""


NO_TOOLS = "the deprecated 'functions' API is not supported by this server: use 'tools'"

# name -> (value is acceptable?, why we cannot honour it)
Rule = tuple[Callable[[Any], bool], str]


def drop_unsupported(data: dict[str, Any], rules: Mapping[str, Rule]) -> None:
    """Removes each parameter of `rules` from a request's `data` where it is "off" (its rule accepts
    the value); one that is not is a 400 naming it (``unsupported_parameter``). The policy of OpenAI's
    routes and Anthropic's."""
    for name, (acceptable, why) in rules.items():
        if name in data:
            if not acceptable(data[name]):
                raise request_error("unsupported_parameter", f"Unsupported parameter: '{name}': {why}.", name)
            del data[name]


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


# ---------------------------------------------------------------------------------------------------------
class StrictModel(BaseModel):
    """A request object as OpenAI's API reads it, and Anthropic's: an unknown key or a value of another
    type is a 400 naming it (no silent coercion, nothing ignored)."""

    model_config = ConfigDict(extra="forbid", strict=True)


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


def message_role(message: Mapping[str, Any], roles: Collection[str], which: str, *where: str | int) -> str:
    """The `role` of a conversation's message (a Responses input item, an Anthropic message) once it
    is one of `roles`; any other is a 400 naming `<where>.role` (`which` says what the roles are)."""
    role = message.get("role")
    if role not in roles:
        raise request_error("invalid_value", f"Invalid role {role!r}: {which}.", *where, "role")
    return role


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


class OpenAIRequest(StrictModel):
    """What every generation request shares: the model, streaming, and the parameter policy of the
    module docstring (unsupported parameters named in a 400, harmless ones dropped)."""

    _unsupported: ClassVar[dict[str, Rule]] = {}

    model: str | None = Field(None, description="Model id; omitted means the served model")
    stream: bool = False
    user: str | None = Field(None, description="Accepted and ignored")

    @model_validator(mode="before")
    @classmethod
    def _check_params(cls, body: Any) -> Any:
        if (data := sent(body)) is None:
            return body
        drop_unsupported(data, cls._unsupported)
        for name in _IGNORED_PARAMS:
            data.pop(name, None)
        return data


class SamplingFields(OpenAIRequest):
    """The sampling fields of chat, completions and responses, defined once, and their one
    reduction to `SamplingParams` (`sampling_params()`).

    Endpoints add their token limit (`max_new_tokens`), log probs (`logprob_count`,
    `prompt_logprob_count`) and structured output (`_guide`).
    """

    _guide: Guide | None = None  # what the answer must look like (set by the endpoint's checks)
    _guide_path: str | None = None  # the field it came from (what a 400 about it names)

    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    repetition_penalty: RepetitionPenalty | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Seed | None = None
    stop: str | list[str] | None = Field(None, description=f"Up to {MAX_STOP_STRINGS} non-empty stop strings")
    stop_token_ids: list[int] | None = Field(
        None,
        max_length=MAX_STOP_TOKEN_IDS,
        description="Extension (vLLM): token ids that end the answer (not part of it), besides the model's",
    )
    min_tokens: int | None = Field(None, ge=0, description="Extension")
    ignore_eos: bool = Field(False, description="Extension: generate past end-of-sequence")
    logit_bias: dict[str, float] | None = Field(
        None,
        description=f"Token id (a string) -> bias in [-100, 100] added to its logit; up to {MAX_LOGIT_BIAS}",
    )
    n: int = Field(1, ge=1, le=MAX_N, description="Choices per prompt")
    best_of: int | None = Field(
        None,
        ge=1,
        le=MAX_N,
        description="With beam search the beam width; without, candidates sampled per prompt, of which "
        "the n with the highest cumulative log probability are returned (not streamed)",
    )
    use_beam_search: bool = Field(
        False,
        description="Extension (vLLM): beam search over best_of (else n) beams; the n best are returned",
    )
    length_penalty: float | None = Field(
        None,
        ge=-1e6,
        le=1e6,
        description="Extension (vLLM), beam search: exponent of the length normalization",
    )
    early_stopping: bool | None = Field(
        None, description="Extension (vLLM), beam search: stop once best_of beams have finished"
    )

    @field_validator("stop", mode="before")
    @classmethod
    def _check_stop(cls, value: Any) -> Any:
        if not isinstance(value, (str, list)):
            raise request_error("invalid_type", "'stop' must be a string or a list of strings.")
        try:
            check_stop([value] if isinstance(value, str) else value)
        except StopStringError as exc:
            where = () if exc.index is None or isinstance(value, str) else (exc.index,)
            raise request_error(exc.code, str(exc), *where) from None
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_one_is_off(cls, value: int | None) -> int | None:
        return None if value == 1 else value  # clients send best_of 1 as a default, with any n

    @field_validator("stop_token_ids", mode="before")
    @classmethod
    def _check_stop_token_ids(cls, value: Any) -> Any:
        if not isinstance(value, list):
            raise request_error("invalid_type", "'stop_token_ids' must be a list of token ids.")
        for i, token in enumerate(value):
            if not is_token_id(token):
                raise request_error(
                    "invalid_value", f"stop_token_ids[{i}] must be a token id (an integer >= 0).", i
                )
        return value

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _check_logit_bias(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            raise request_error(
                "invalid_type", "'logit_bias' must be an object of token ids (strings) to biases."
            )
        if len(value) > MAX_LOGIT_BIAS:
            raise request_error(
                "invalid_value", f"'logit_bias' may set at most {MAX_LOGIT_BIAS} tokens (got {len(value)})."
            )
        out: dict[str, float] = {}
        for key, bias in value.items():
            if not (isinstance(key, str) and key.isascii() and key.isdigit() and int(key) <= _INT32_MAX):
                raise request_error(
                    "invalid_value",
                    f"Invalid 'logit_bias' key {str(key)[:40]!r}: keys are token ids, like \"1234\".",
                )
            if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
                raise request_error(
                    "invalid_value",
                    f"Invalid 'logit_bias' value for token {key}: a number from -100 to 100 (got {bias!r}).",
                )
            out[key] = float(bias)
        return out

    @model_validator(mode="after")
    def _check_sampling(self) -> SamplingFields:
        """Token limits, then the rules of best_of and beam search (vLLM's)."""
        limit = self.max_new_tokens
        if self.min_tokens is not None and limit is not None and self.min_tokens > limit:
            raise request_error(
                "invalid_value",
                f"min_tokens ({self.min_tokens}) must not exceed the token limit ({limit}).",
                "min_tokens",
            )
        if self.best_of is not None and self.best_of < self.n:
            raise request_error(
                "invalid_value", f"best_of ({self.best_of}) must not be less than n ({self.n}).", "best_of"
            )
        if self.use_beam_search:
            if (self.best_of or self.n) < 2:
                raise request_error(
                    "invalid_value",
                    "Beam search needs at least 2 beams: set best_of (the beam width) or n to 2 or more.",
                    "best_of",
                )
            for name, off in (("temperature", (0, 1)), ("top_p", (1,)), ("top_k", (-1, 0))):
                if getattr(self, name) not in (None, *off):
                    raise request_error(
                        "invalid_value",
                        f"'{name}' does not apply to beam search, which scores the model's own log "
                        f"probabilities (leave it unset{' or 0/1' if name == 'temperature' else ''}).",
                        name,
                    )
        else:
            for name, off in (("length_penalty", 1.0), ("early_stopping", False)):
                if getattr(self, name) not in (None, off):
                    raise request_error(
                        "invalid_value",
                        f"'{name}' applies to beam search only (use_beam_search: true).",
                        name,
                    )
            if self.ranks_best_of and self.stream:
                raise request_error(
                    "invalid_value",
                    f"best_of ({self.best_of}) > n ({self.n}) cannot be streamed: the best are known when "
                    "every candidate has finished. Send stream: false, or best_of equal to n.",
                    "stream",
                )
        return self

    @property
    def max_new_tokens(self) -> int | None:
        """The completion token limit the caller asked for (None: up to the context length)."""
        return None

    @property
    def guide_param(self) -> str:
        """The field that asked for the guide, for the 400 of a model that cannot guide."""
        return guide_field(self)

    @property
    def guide_path(self) -> str:
        """Where in the request the guide is (`response_format.json_schema.schema`), for the 400 of
        a guide the engine cannot use."""
        return self._guide_path or self.guide_param

    @property
    def logprob_count(self) -> int | None:
        """None: no log probs; N: each generated token's, with the N most likely."""
        return None

    @property
    def prompt_logprob_count(self) -> int | None:
        """None: no prompt log probs; N: each prompt token's, with the N most likely."""
        return None

    @property
    def beam_width(self) -> int | None:
        """Beam search's width: best_of, else n (None: no beam search)."""
        return (self.best_of or self.n) if self.use_beam_search else None

    @property
    def ranks_best_of(self) -> bool:
        """Whether best_of candidates are sampled per prompt and the n best returned (no beam search)."""
        return not self.use_beam_search and self.best_of is not None and self.best_of > self.n

    @property
    def samples_per_prompt(self) -> int:
        """The engine requests started per prompt: best_of candidates, else n (beam search: one
        request returns the n best beams)."""
        return self.best_of if self.ranks_best_of else self.n  # type: ignore[return-value]

    def stop_strings(self) -> tuple[str, ...]:
        """Stop strings as a tuple, duplicates removed, order kept."""
        if self.stop is None:
            return ()
        return check_stop([self.stop] if isinstance(self.stop, str) else self.stop)

    def sampling_params(self) -> SamplingParams:
        """The engine-neutral sampling parameters of this request: the one reduction.

        Beam search scores the model's own log probabilities (temperature unset), and ranking
        best_of candidates needs each token's log prob (asked for even when the caller did not:
        the response shows them only when asked).
        """
        beams = self.beam_width
        logprobs = self.logprob_count
        if logprobs is None and self.ranks_best_of:
            logprobs = 0
        return SamplingParams(
            max_tokens=self.max_new_tokens,
            temperature=None if beams else self.temperature,
            top_p=self.top_p,
            top_k=engine_top_k(self.top_k),
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=engine_seed(self.seed),
            min_tokens=self.min_tokens,
            stop=self.stop_strings(),
            ignore_eos=self.ignore_eos,
            guide=self._guide,
            logprobs=logprobs,
            logit_bias=tuple((int(token), bias) for token, bias in (self.logit_bias or {}).items()),
            stop_token_ids=tuple(dict.fromkeys(self.stop_token_ids or ())),
            prompt_logprobs=self.prompt_logprob_count,
            beam_width=beams,
            length_penalty=self.length_penalty if beams else None,
            early_stopping=self.early_stopping if beams else None,
        )


def is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _INT32_MAX


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
            and not (name == "response_format" and self.response_format.type == "text")  # type: ignore[union-attr]
        ]
        if len(given) > 1:
            raise request_error(
                "invalid_value",
                f"Only one of {', '.join(given)} may be set (they all shape the answer).",
                given[1],
            )
        self._guide = None
        if given:
            try:
                self._guide, self._guide_path = self._requested_guide(given[0])
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


_RequestT = TypeVar("_RequestT", bound=BaseModel)

# The tool fields of chat and responses (whose named choice and tools differ in shape only).
MAX_TOOLS = 128  # entries of `tools`
ToolChoiceMode = Literal["none", "auto", "required"]  # `tool_choice` as a string
TOOL_CHOICE_DOC = "Default 'auto' with tools; 'required' and a named function always call"
PARALLEL_TOOL_CALLS_DOC = "Whether an answer may hold several calls"


class ToolUse:
    """The rules of `tools` and `tool_choice`, shared by chat and responses (whose tools differ in
    shape only): a named function must be offered, `required` needs tools, and a forced call is
    guided decoding on the calls' schema. The request class provides `tools`, `tool_choice`,
    `parallel_tool_calls`, `functions()` and calls `_settle_tools` once its guide is known."""

    def functions(self) -> list[dict[str, Any]]:
        """The offered functions as OpenAI's `function` objects (name, description, parameters)."""
        raise NotImplementedError

    def _settle_tools(self, named: str | None) -> None:
        """Checks the tools against `tool_choice` (`named`: the function it names) and, for a forced
        call, sets the request's guide."""
        functions = self.functions()
        names = [function["name"] for function in functions]
        if len(set(names)) != len(names):
            raise request_error("invalid_value", "Function names in 'tools' must be unique.", "tools")
        if named is not None and named not in names:
            raise request_error(
                "invalid_value",
                f"tool_choice names function {named!r}, which is not in 'tools'.",
                "tool_choice",
            )
        if self.tool_choice == "required" and not names:  # type: ignore[attr-defined]
            raise request_error("invalid_value", "tool_choice 'required' needs 'tools'.", "tool_choice")
        if self.tool_mode == "forced":
            if self._guide is not None:  # type: ignore[attr-defined]
                raise request_error(
                    "invalid_value",
                    "A forced tool call cannot be combined with another output format.",
                    "tool_choice",
                )
            schema = tool_calls.call_schema(functions, named)
            self._guide = ("json_schema", json.dumps(schema))
            self._guide_path = "tools"  # type: ignore[attr-defined]

    @property
    def tool_mode(self) -> Literal["auto", "forced"] | None:
        """None: no tools in play; auto: the answer may be calls; forced: it is a call."""
        choice = self.tool_choice  # type: ignore[attr-defined]
        if not self.tools or choice == "none":  # type: ignore[attr-defined]
            return None
        return "auto" if choice in (None, "auto") else "forced"

    def calls_in(self, text: str) -> list[tuple[str, str]] | None:
        """The (name, arguments) calls an answer makes, when tools are in play and it is calls
        (one only with `parallel_tool_calls: false`); None for a text answer."""
        if not self.tool_mode:
            return None
        calls = tool_calls.parse_calls(text, self.functions())
        if calls and self.parallel_tool_calls is False:  # type: ignore[attr-defined]
            return calls[:1]
        return calls or None


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


def parse_request(model: type[_RequestT], body: bytes | str | Mapping[str, Any]) -> _RequestT:
    """Validate a raw request body (JSON bytes/str or a decoded mapping).

    Raises:
        APIError: 400 naming the offending parameter (``from_validation_error``).
    """
    try:
        if isinstance(body, (bytes, str)):
            return model.model_validate_json(body)
        return model.model_validate(body)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


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


class ErrorDetail(BaseModel):
    """The inside of an error body."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """``{"error": {...}}``: the body of every non-2xx answer (and of an in-stream error event)."""

    error: ErrorDetail

    @classmethod
    def of(cls, err: APIError) -> ErrorBody:
        """The body of an ``APIError``."""
        return cls.model_validate(err.body())
