"""`/generate`'s request: the fields of its signature (service.py's `generate`, which BentoML reads,
validates and documents), reduced to what the shared generation path takes.

BentoML has validated the body against the signature by the time a `GenerateRequest` exists: its
fields carry the shared sampling fields' types and ranges (`generation.protocol`), read strictly
(`server.bentoml_patches.read_strictly`). What is left is settled here, once: the stop strings, the
JSON schema as a guide, and the sampling fields' reduction to ``SamplingParams``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from tensorrtllm_backend.stop_strings import StopStringError, check_stop
from trtllm_service.api.generation.protocol import (
    MaxTokens,
    Penalty,
    Priority,
    RepetitionPenalty,
    Seed,
    Temperature,
    TopK,
    TopP,
    engine_seed,
    engine_top_k,
)
from trtllm_service.chat.template import PromptFormatter
from trtllm_service.errors import APIError
from trtllm_service.relay.guided import Guide, GuideRequestError, json_schema_guide
from trtllm_service.relay.request import SamplingParams

GENERATE_ROUTE = "/generate"
SCHEMA_PARAM = "json_schema"
"""The field that asks for structured output (what a 400 about the guide names)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateRequest:
    """A `/generate` request: service.py's `generate` arguments, one field each (a unit test holds
    the two lists equal)."""

    prompt: str
    system_prompt: str | None = None
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    repetition_penalty: RepetitionPenalty | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: Seed | None = None
    stop: list[str] | None = None
    ignore_eos: bool = False
    json_schema: dict[str, Any] | None = None
    lora: str | None = None
    priority: Priority | None = None

    stream: ClassVar[bool] = True
    """The answer always streams (as plain text)."""
    samples_per_prompt: ClassVar[int] = 1
    guide_param: ClassVar[str] = SCHEMA_PARAM
    guide_path: ClassVar[str] = SCHEMA_PARAM

    @classmethod
    def of(cls, arguments: dict[str, Any]) -> GenerateRequest:
        """The request of the route's arguments (`locals()` of service.py's `generate`)."""
        return cls(**{name: value for name, value in arguments.items() if name != "self"})

    def chat_messages(self) -> list[dict[str, str]]:
        """The system prompt and the prompt as a one-turn chat."""
        return PromptFormatter.messages_from_prompt(self.prompt, self.system_prompt)

    def stop_strings(self) -> tuple[str, ...]:
        """The stop strings (duplicates removed, order kept); a 400 naming `stop` otherwise."""
        try:
            return check_stop(self.stop or [])
        except StopStringError as exc:
            raise APIError.bad_request(str(exc), param="stop") from None

    def guide(self) -> Guide | None:
        """The guide `json_schema` asks for (None: none); a 400 naming it when it cannot be one."""
        if self.json_schema is None:
            return None
        try:
            return json_schema_guide(self.json_schema, SCHEMA_PARAM)
        except GuideRequestError as exc:
            raise APIError.bad_request(str(exc), param=exc.param) from None

    def sampling_params(self) -> SamplingParams:
        """The engine-neutral sampling parameters of this request (its LoRA adapter is the serving
        path's to name: `GenerationServing.params`). The stop strings are checked first."""
        stop = self.stop_strings()
        return SamplingParams(
            guide=self.guide(),
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=engine_top_k(self.top_k),
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=engine_seed(self.seed),
            stop=stop,
            ignore_eos=self.ignore_eos,
            priority=self.priority or 0,
        )
