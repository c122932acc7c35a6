"""Prompt building: chat messages or a plain prompt -> the settled engine request.

The text and its token ids come from the chat template (trtllm_service.chat.template); here they are
checked against the engine's limits and settled once (request.settle).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from trtllm_service.chat.template import PromptFormatter
from trtllm_service.errors import APIError
from trtllm_service.relay.request import EngineLimits, GenerationRequest, SamplingParams, settle


@dataclass(frozen=True)
class ChatPrompt:
    """A chat request's input to the chat template: its messages, the functions it offers (OpenAI's
    `function` objects), `reasoning_effort` for a template that takes it, and `param`, the request
    field the messages came from (what a 400 about them names: `prompt` for /generate)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    reasoning_effort: str | None = None
    param: str = "messages"

    @property
    def size(self) -> int:
        """How much content there is (what decides tokenizing off the event loop)."""
        return sum(len(m.get("content") or "") for m in self.messages)


class RequestPreparer:
    """Chat messages or raw prompts -> settled `GenerationRequest`s (400s for what cannot be served).

    Args:
        formatter: Templates and tokenizes exactly as the engine's preprocessing would.
        limits: The engine's context limits and end ids.
    """

    def __init__(self, formatter: PromptFormatter, limits: EngineLimits) -> None:
        self.formatter = formatter
        self.limits = limits

    def check_text(self, texts: Sequence[tuple[str, str]], *, param: str) -> None:
        """400s for (where, text) pairs that must not reach the tokenizer: a NUL character, or more
        text than the context can hold whatever its tokens (settled without tokenizing: a prompt of
        megabytes is refused in microseconds rather than after seconds of tokenizer time)."""
        chars = 0
        for where, text in texts:
            if "\x00" in text:
                raise APIError.bad_request(
                    f"'{where}' contains a NUL character (\\u0000), which is not allowed in text.",
                    param=param,
                )
            chars += len(text)
        if chars > self.limits.max_input_len:
            at_least = chars // self.formatter.max_token_chars
            if at_least > self.limits.max_input_len:
                raise APIError.prompt_too_long(self.limits.max_seq_len, at_least, chars, param=param)

    def chat(
        self,
        prompt: ChatPrompt,
        params: SamplingParams,
        default_max_tokens: int | None = None,
        *,
        budget_param: str | None = None,
    ) -> GenerationRequest:
        """`prompt.param` / `budget_param`: the request fields a context_length_exceeded error names."""
        self.check_token_ids(params.stop_token_ids, "stop_token_ids")
        return settle(
            self.chat_ids(prompt),
            params,
            self.limits,
            default_max_tokens=default_max_tokens,
            param=prompt.param,
            budget_param=budget_param,
        )

    def chat_ids(self, prompt: ChatPrompt) -> list[int]:
        """The prompt's token ids: the messages through the chat template, tokenized. What a chat
        request sends the engine and what Anthropic's count_tokens counts."""
        param = prompt.param
        self.check_text(list(_message_texts(prompt.messages, param)), param=param)
        try:
            return self.formatter.encode_chat(
                prompt.messages, tools=prompt.tools, reasoning_effort=prompt.reasoning_effort
            )
        except ValueError as exc:
            raise APIError.bad_request(str(exc), param=param) from None

    def prompts(
        self, prompts: Sequence[str | Sequence[int]], params: SamplingParams
    ) -> list[GenerationRequest]:
        """Raw prompts (no chat template), each settled: a text is tokenized (BOS added), a list of
        token ids is sent as it is (no BOS added; each id must be in the vocabulary)."""
        self.check_token_ids(params.stop_token_ids, "stop_token_ids")
        bos = self.formatter.bos_token
        prepared = []
        for i, prompt in enumerate(prompts):
            where = "prompt" if len(prompts) == 1 else f"prompt[{i}]"
            if not isinstance(prompt, str):
                self.check_token_ids(prompt, where)
                prepared.append(settle(list(prompt), params, self.limits, param="prompt"))
                continue
            self.check_text([(where, prompt)], param="prompt")
            if not prompt:
                # OpenAI completes an empty prompt from the start of a document; so do we, where the
                # tokenizer has a BOS token (the engine needs at least one token).
                if not bos:
                    raise APIError.bad_request("The prompt must not be empty.", param=where)
                prompt = bos
            prepared.append(settle(self.formatter.encode(prompt), params, self.limits, param="prompt"))
        return prepared

    def check_token_ids(self, ids: Sequence[int], param: str) -> None:
        """A 400 naming `param` (e.g. `prompt[1]`, `stop_token_ids`) for an id outside the model's
        vocabulary (ids the engine's embedding and logits do not have)."""
        size = self.limits.vocab_size
        for j, token in enumerate(ids):
            if size and not 0 <= token < size:
                raise APIError.bad_request(
                    f"Invalid '{param}': token id {token} (at {j}) is outside the vocabulary [0, {size}).",
                    param=param,
                    code="invalid_value",
                )


def _message_texts(messages: list[dict[str, Any]], param: str) -> Iterator[tuple[str, str]]:
    """Each message's text, with where it is (`messages[2].content`); content parts included."""
    for i, message in enumerate(messages):
        content = message.get("content")
        where = f"{param}[{i}].content" if param == "messages" else param
        if isinstance(content, str):
            yield where, content
        elif isinstance(content, list):
            for j, part in enumerate(content):
                text = part.get("text") if isinstance(part, dict) else None
                if isinstance(text, str):
                    yield f"{where}[{j}].text", text
