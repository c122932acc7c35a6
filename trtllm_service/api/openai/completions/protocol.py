"""``POST /v1/completions``: the request and the response objects (no chat template; the sampling
fields are the shared ``generation.protocol``'s)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from trtllm_service.api.generation.protocol import Rule, unset
from trtllm_service.api.openai.protocol import (
    MAX_PROMPTS,
    CompletionChunkBase,
    CompletionResponseBase,
    FinishReason,
    RequestBase,
    TokenIds,
    check_token_ids,
    new_id,
)
from trtllm_service.api.server.request_errors import request_error

MAX_COMPLETION_LOGPROBS = 5  # completions' logprobs, as OpenAI
_COMPLETION_UNSUPPORTED: dict[str, Rule] = {
    "suffix": (unset, "suffix (insertion) is not supported"),
}

Prompt = str | TokenIds


class CompletionRequest(RequestBase):
    """``POST /v1/completions`` (text or token ids in, text out; no chat template)."""

    _unsupported: ClassVar[dict[str, Rule]] = _COMPLETION_UNSUPPORTED

    prompt: str | list[str] | TokenIds | list[TokenIds] = Field(
        description=f"A string, a list of token ids, or a list of up to {MAX_PROMPTS} of either; token "
        "ids are sent as they are (no BOS added)"
    )
    max_tokens: int | None = Field(None, ge=0, description="0 with echo: the prompt's log probs only")
    echo: bool = Field(False, description="Prepend the prompt to the completion")
    logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_COMPLETION_LOGPROBS,
        description="Return each token's log probability and this many most likely tokens (with echo, "
        "the prompt's tokens too)",
    )

    @property
    def logprob_count(self) -> int | None:
        return self.logprobs

    @property
    def prompt_logprob_count(self) -> int | None:
        """echo with logprobs: the prompt's tokens get their log probs too."""
        return self.logprobs if self.echo else None

    @model_validator(mode="after")
    def _check_zero_tokens(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise request_error(
                "invalid_value",
                "max_tokens 0 returns nothing without echo: set echo (with logprobs, the prompt's log "
                "probabilities), or max_tokens >= 1.",
                "max_tokens",
            )
        return self

    @field_validator("prompt", mode="before")
    @classmethod
    def _check_prompt(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value
        kinds = "'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids."
        if not isinstance(value, list):
            raise request_error("invalid_type", kinds)
        if not value:
            raise request_error("invalid_value", "'prompt' must not be an empty list.")
        if all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            check_token_ids(value)
            return value
        if len(value) > MAX_PROMPTS:
            raise request_error("invalid_value", f"At most {MAX_PROMPTS} prompts are allowed per request.")
        if isinstance(value[0], list):
            for i, ids in enumerate(value):
                if not isinstance(ids, list) or not ids:
                    raise request_error("invalid_value", "Each token-id prompt must be a non-empty list.", i)
                check_token_ids(ids, i)
            return value
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise request_error("invalid_type", kinds, i)
        return value

    def prompts(self) -> list[Prompt]:
        """The prompts as a list: each a string or a list of token ids (one prompt alone becomes a
        list of one)."""
        prompt = self.prompt
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            return [prompt]
        return list(prompt)  # type: ignore[arg-type]  # a list of prompts (mypy cannot narrow by the first item)


class CompletionChoice(BaseModel):
    """One non-streamed text completion."""

    index: int
    text: str
    finish_reason: FinishReason | None = None
    logprobs: dict[str, Any] | None = None


class CompletionResponse(CompletionResponseBase[CompletionChoice]):
    """Non-streamed ``text_completion``."""

    id: str = Field(default_factory=lambda: new_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"


class CompletionChunk(CompletionChunkBase[CompletionChoice]):
    """One streamed ``text_completion`` chunk (OpenAI uses the same object name as the full response)."""

    object: Literal["text_completion"] = "text_completion"
