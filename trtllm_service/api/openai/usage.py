"""The `usage` of an OpenAI chat or text completion: the body's `UsageInfo`, the stream's usage chunk."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from trtllm_service.api.generation.choices import Choice, Result, cached_tokens
from trtllm_service.api.openai.chat.protocol import ChatCompletionRequest
from trtllm_service.api.openai.completions.protocol import CompletionRequest
from trtllm_service.api.openai.protocol import PromptTokensDetails, UsageInfo
from trtllm_service.api.openai.sse import ChatChunkEncoder, CompletionChunkEncoder


def usage_frame(
    request: ChatCompletionRequest | CompletionRequest,
    encoder: ChatChunkEncoder | CompletionChunkEncoder,
    choices: list[Choice],
    prompt_tokens: int,
) -> Callable[[int], str] | None:
    """The usage chunk of a stream that asked for one (None: it did not)."""
    if not request.include_usage:
        return None
    return lambda tokens: encoder.usage(prompt_tokens, tokens, cached_tokens(choices, request.n))


def usage_info(prompt_tokens: int, results: Sequence[Result], cached_tokens: int) -> UsageInfo:
    completion_tokens = sum(r.completion_tokens for r in results)
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens),
    )
