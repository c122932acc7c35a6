"""Server-sent-event framing for the streamed OpenAI responses.

Per-token cost matters, so chunks are not built as pydantic models: each encoder JSON-encodes the
constant part of a chunk (id, object, created, model) once per stream and per token only encodes the
text delta. The output has exactly the shape of ``protocol.ChatCompletionChunk`` / ``CompletionChunk``
(the tests check this by validating it with those models).
"""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel

from trtllm_service.errors import APIError

SSE_DONE = "data: [DONE]\n\n"
"""The last event of every OpenAI stream."""

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def sse_frame(data: str) -> str:
    """One SSE event carrying ``data`` (a JSON document on one line)."""
    return f"data: {data}\n\n"


def model_frame(model: BaseModel) -> str:
    """An SSE event of a pydantic model, for the rare non-hot-path events."""
    return sse_frame(model.model_dump_json())


def error_frame(err: APIError) -> str:
    """An SSE event carrying an error body, for a failure after the 200 status was already sent."""
    return sse_frame(_encode(err.body()))


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> str:
    return (
        f'{{"prompt_tokens":{int(prompt_tokens)},"completion_tokens":{int(completion_tokens)},'
        f'"total_tokens":{int(prompt_tokens) + int(completion_tokens)},'
        f'"prompt_tokens_details":{{"cached_tokens":{int(cached_tokens)}}}}}'
    )


class _ChunkEncoder:
    """The shared part: a pre-encoded chunk head and the usage chunk."""

    _object: str

    def __init__(
        self,
        id: str,
        model: str,
        created: int | None = None,
        *,
        include_usage: bool = False,
        service_tier: str = "default",
    ) -> None:
        head = _encode(
            {
                "id": id,
                "object": self._object,
                "created": int(time.time()) if created is None else created,
                "model": model,
                "service_tier": service_tier,
            }
        )
        self._head = "data: " + head[:-1]  # without the closing brace, so fields can follow
        self._choice = self._head + ',"choices":[{"index":'
        # OpenAI: with include_usage, every chunk but the last carries "usage": null.
        self._end = "}]" + (',"usage":null' if include_usage else "") + "}\n\n"

    def usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> str:
        """The final usage chunk (empty ``choices``), sent when ``stream_options.include_usage`` is set;
        ``prompt_tokens_details.cached_tokens``: the prompt tokens the engine found in its KV cache."""
        return f'{self._head},"choices":[],"usage":{_usage(prompt_tokens, completion_tokens, cached_tokens)}}}\n\n'


class ChatChunkEncoder(_ChunkEncoder):
    """SSE events of one ``chat.completion.chunk`` stream.

    Args:
        id: The completion id (the same in every chunk).
        model: The model name echoed to the client.
        created: Unix time of the request; now when omitted.
        include_usage: Add ``"usage": null`` to every choice chunk, as OpenAI does when a usage chunk follows.
    """

    _object = "chat.completion.chunk"

    def role(self, index: int = 0) -> str:
        """The first chunk of a choice: the assistant role and empty content."""
        return f'{self._choice}{index},"delta":{{"role":"assistant","content":""}},"logprobs":null,"finish_reason":null{self._end}'

    def content(self, text: str, index: int = 0) -> str:
        """A chunk with new text."""
        return f'{self._choice}{index},"delta":{{"content":{_encode(text)}}},"logprobs":null,"finish_reason":null{self._end}'

    def content_logprobs(self, text: str, index: int, logprobs: dict[str, Any]) -> str:
        """A chunk with new text and the log probs of its tokens."""
        return f'{self._choice}{index},"delta":{{"content":{_encode(text)}}},"logprobs":{_encode(logprobs)},"finish_reason":null{self._end}'

    def parts(
        self, content: str, reasoning: str, index: int = 0, logprobs: dict[str, Any] | None = None
    ) -> str:
        """A chunk of a reasoning model's answer: new thinking (as ``reasoning_content`` and, vLLM's
        newer name, ``reasoning``) and/or content; "" when there is neither (text held back)."""
        if not content and not reasoning and logprobs is None:
            return ""
        delta = ""
        if reasoning:
            thought = _encode(reasoning)
            delta = f'"reasoning_content":{thought},"reasoning":{thought}'
        if content or not reasoning:
            delta += ("," if delta else "") + f'"content":{_encode(content)}'
        encoded = "null" if logprobs is None else _encode(logprobs)
        return (
            f'{self._choice}{index},"delta":{{{delta}}},"logprobs":{encoded},"finish_reason":null{self._end}'
        )

    def tool_call(self, position: int, call_id: str, name: str, arguments: str, index: int = 0) -> str:
        """A chunk with the whole of tool call `position` of a choice (id, name, arguments)."""
        call = _encode(
            {
                "index": position,
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
        return f'{self._choice}{index},"delta":{{"tool_calls":[{call}]}},"logprobs":null,"finish_reason":null{self._end}'

    def finish(self, reason: str, index: int = 0) -> str:
        """The last chunk of a choice: an empty delta and the finish reason (``stop``, ``length``
        or ``tool_calls``)."""
        return (
            f'{self._choice}{index},"delta":{{}},"logprobs":null,"finish_reason":{_encode(reason)}{self._end}'
        )


class CompletionChunkEncoder(_ChunkEncoder):
    """SSE events of one streamed ``text_completion`` (same arguments as ``ChatChunkEncoder``)."""

    _object = "text_completion"

    def text(self, text: str, index: int = 0) -> str:
        """A chunk with new text."""
        return f'{self._choice}{index},"text":{_encode(text)},"logprobs":null,"finish_reason":null{self._end}'

    def text_logprobs(self, text: str, index: int, logprobs: dict[str, Any]) -> str:
        """A chunk with new text and the log probs of its tokens."""
        return f'{self._choice}{index},"text":{_encode(text)},"logprobs":{_encode(logprobs)},"finish_reason":null{self._end}'

    def finish(self, reason: str, index: int = 0) -> str:
        """The last chunk of a choice: empty text and the finish reason."""
        return f'{self._choice}{index},"text":"","logprobs":null,"finish_reason":{_encode(reason)}{self._end}'
