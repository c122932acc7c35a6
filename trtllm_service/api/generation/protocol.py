"""The protocol every generation endpoint shares: what OpenAI's routes (chat, completions, responses),
Anthropic's messages and /generate read the same way.

* The sampling fields' types and ranges (`MaxTokens`, `Temperature`, ...), said once: `SamplingFields`
  and /generate's signature (service.py) take them, and their reduction for the engine
  (`engine_top_k`, `engine_seed`).
* `SamplingFields`: the sampling fields of every /v1 request, their rules (stop strings, stop token
  ids, logit bias, best_of and beam search) and their one reduction to ``SamplingParams``
  (`sampling_params()`); chat, completions, responses and Anthropic's messages all extend it.
* The parameter policy (`StrictModel`, `BaseRequest`, `drop_unsupported`, `sent`, `unset`): an
  unknown key or a value of another type is a 400 naming it; a parameter we cannot honour is a 400
  (code ``unsupported_parameter``) unless it is "off" (``null``, ``false``, ``{}``, ``[]``, ...); a
  few that do not change the text are accepted and ignored; ``null`` means "not set".
* The rules of `tools` and `tool_choice` (`ToolUse`), shared by chat, responses and messages.

All request errors surface as one pydantic ``ValidationError``; ``request_errors.from_validation_error``
turns it into a 400 whose ``param`` is a path like ``messages[1].content[0].type``. ``parse_request``
does both steps for a raw body.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Protocol, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tensorrtllm_backend.stop_strings import MAX_STOP_STRINGS, StopStringError, check_stop
from trtllm_service.api.server.request_errors import from_validation_error, request_error
from trtllm_service.chat import tool_calls
from trtllm_service.relay.guided import Guide, guide_field
from trtllm_service.relay.request import SamplingParams, ServiceTier

MAX_N = 8  # n and best_of: choices (or candidates, or beams) per prompt


MAX_LOGIT_BIAS = 300  # entries of logit_bias, as OpenAI


MAX_STOP_TOKEN_IDS = 256


_INT32_MAX = (1 << 31) - 1  # token ids travel as INT32


_UINT64_MASK = (1 << 64) - 1


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


Priority = Annotated[
    int,
    Field(
        ge=-(1 << 63),
        le=(1 << 63) - 1,
        description="Extension (vLLM): the request's place in the service's queue, lower first (default 0)",
    ),
]


OpenAIServiceTier = Literal["auto", "default", "flex", "priority", "scale"]
"""OpenAI's `service_tier` values."""


def openai_tier(tier: str | None) -> ServiceTier:
    """The service's tier of an OpenAI `service_tier`: `priority` and `flex` are themselves, the
    others (`auto`, `default`, `scale`, none) are `default`."""
    if tier == "priority":
        return "priority"
    return "flex" if tier == "flex" else "default"


def engine_top_k(top_k: int | None) -> int | None:
    """A request's top_k for the engine: -1 and 0 (and none) mean no top-k."""
    return None if top_k in (None, -1, 0) else top_k


def engine_seed(seed: int | None) -> int | None:
    """A request's seed for the engine, whose seed is unsigned 64-bit: a negative seed is its two's
    complement."""
    return None if seed is None else seed & _UINT64_MASK


_IGNORED_PARAMS = ("metadata", "store", "prompt_cache_key", "safety_identifier")


def sent(data: Any) -> dict[str, Any] | None:
    """A request object's keys that carry a value (a JSON null is read as not sent, as OpenAI's and
    Anthropic's APIs read it), or None for a body that is not an object (its model names the type)."""
    if not isinstance(data, dict):
        return None
    return {k: v for k, v in data.items() if v is not None}


def unset(value: Any) -> bool:
    """The "off" value of an unsupported parameter: harmless to accept."""
    return value is None or value is False or value == {} or value == [] or value == ""


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


# ---------------------------------------------------------------------------------------------------------
class StrictModel(BaseModel):
    """A request object as OpenAI's API reads it, and Anthropic's: an unknown key or a value of another
    type is a 400 naming it (no silent coercion, nothing ignored)."""

    model_config = ConfigDict(extra="forbid", strict=True)


def message_role(message: Mapping[str, Any], roles: Collection[str], which: str, *where: str | int) -> str:
    """The `role` of a conversation's message (a Responses input item, an Anthropic message) once it
    is one of `roles`; any other is a 400 naming `<where>.role` (`which` says what the roles are)."""
    role = message.get("role")
    if role not in roles:
        raise request_error("invalid_value", f"Invalid role {role!r}: {which}.", *where, "role")
    return cast(str, role)  # one of `roles`


class BaseRequest(StrictModel):
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


class SamplingFields(BaseRequest):
    """The sampling fields of every /v1 request (chat, completions, responses, Anthropic's messages),
    defined once, and their one reduction to `SamplingParams` (`sampling_params()`).

    Endpoints add their token limit (`max_new_tokens`), log probs (`logprob_count`,
    `prompt_logprob_count`) and structured output (`settle_guide`).
    """

    def settle_guide(self, guide: Guide, path: str) -> None:
        """What the answer must look like, as the endpoint's checks settled it, and the field it
        came from (what a 400 about it names). Kept in the instance's own attributes rather than as
        pydantic private attributes, whose set-up costs every request about 25 Python and C calls
        on the way to its first token while most requests have no guide; pydantic's dumps, copies'
        fields and schemas leave them out."""
        self.__dict__["_guide"], self.__dict__["_guide_path"] = guide, path

    @property
    def settled_guide(self) -> Guide | None:
        return self.__dict__.get("_guide")

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
    priority: Priority | None = None
    service_tier: OpenAIServiceTier | None = Field(
        None,
        description="OpenAI's: the request's tier in the service's queue, `priority` first, `flex` last, "
        "the others (`auto`, `default`, `scale`) between; echoed in the answer",
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
            for name, neutral in (("length_penalty", 1.0), ("early_stopping", False)):
                if getattr(self, name) not in (None, neutral):
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
        return self.__dict__.get("_guide_path") or self.guide_param

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
        return self.best_of if self.ranks_best_of else self.n  # type: ignore[return-value]  # ranks_best_of: best_of is set

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
        seed = engine_seed(self.seed)
        if seed is None and not beams and self.temperature != 0:
            seed = secrets.randbits(63)  # sampled: a seed of its own (choices.py, on seeds)
        return SamplingParams(
            max_tokens=self.max_new_tokens,
            temperature=None if beams else self.temperature,
            top_p=self.top_p,
            top_k=engine_top_k(self.top_k),
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=seed,
            min_tokens=self.min_tokens,
            stop=self.stop_strings(),
            ignore_eos=self.ignore_eos,
            guide=self.settled_guide,
            logprobs=logprobs,
            logit_bias=tuple((int(token), bias) for token, bias in (self.logit_bias or {}).items()),
            stop_token_ids=tuple(dict.fromkeys(self.stop_token_ids or ())),
            prompt_logprobs=self.prompt_logprob_count,
            beam_width=beams,
            length_penalty=self.length_penalty if beams else None,
            early_stopping=self.early_stopping if beams else None,
            service_tier=self.queue_tier,
            priority=self.priority or 0,
        )

    @property
    def answered_tier(self) -> str:
        """The `service_tier` OpenAI's answers echo: `default` for `auto` and unset, else the tier asked."""
        tier = self.service_tier
        return "default" if tier is None or tier == "auto" else tier

    @property
    def queue_tier(self) -> ServiceTier:
        """The service's tier of this request (OpenAI's `service_tier`; Anthropic's is dropped
        before: its tiers are all `default` here)."""
        return openai_tier(self.service_tier)


def is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _INT32_MAX


_RequestT = TypeVar("_RequestT", bound=BaseModel)


if TYPE_CHECKING:

    class ToolRequest(Protocol):
        """What ToolUse's methods read of the request class it is mixed into (SamplingFields: the guide)."""

        @property
        def settled_guide(self) -> Guide | None: ...
        def settle_guide(self, guide: Guide, path: str) -> None: ...

        @property
        def tools(self) -> Sequence[Any] | None: ...
        @property
        def tool_choice(self) -> object: ...
        @property
        def parallel_tool_calls(self) -> bool | None: ...
        @property
        def tool_mode(self) -> Literal["auto", "forced"] | None: ...
        def functions(self) -> list[dict[str, Any]]: ...


class ToolUse:
    """The rules of `tools` and `tool_choice`, shared by chat and responses (whose tools differ in
    shape only): a named function must be offered, `required` needs tools, and a forced call is
    guided decoding on the calls' schema. The request class provides `tools`, `tool_choice`,
    `parallel_tool_calls`, `functions()` and calls `_settle_tools` once its guide is known."""

    def functions(self) -> list[dict[str, Any]]:
        """The offered functions as OpenAI's `function` objects (name, description, parameters)."""
        raise NotImplementedError

    def _settle_tools(self: ToolRequest, named: str | None) -> None:
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
        if self.tool_choice == "required" and not names:
            raise request_error("invalid_value", "tool_choice 'required' needs 'tools'.", "tool_choice")
        if self.tool_mode == "forced":
            if self.settled_guide is not None:
                raise request_error(
                    "invalid_value",
                    "A forced tool call cannot be combined with another output format.",
                    "tool_choice",
                )
            schema = tool_calls.call_schema(functions, named)
            self.settle_guide(("json_schema", json.dumps(schema)), "tools")

    @property
    def tool_mode(self: ToolRequest) -> Literal["auto", "forced"] | None:
        """None: no tools in play; auto: the answer may be calls; forced: it is a call."""
        choice = self.tool_choice
        if not self.tools or choice == "none":
            return None
        return "auto" if choice in (None, "auto") else "forced"

    def calls_in(self: ToolRequest, text: str) -> list[tuple[str, str]] | None:
        """The (name, arguments) calls an answer makes, when tools are in play and it is calls
        (one only with `parallel_tool_calls: false`); None for a text answer."""
        if not self.tool_mode:
            return None
        calls = tool_calls.parse_calls(text, self.functions())
        if calls and self.parallel_tool_calls is False:
            return calls[:1]
        return calls or None


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
